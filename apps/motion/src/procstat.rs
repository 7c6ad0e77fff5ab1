//! CPU time of a deployment: the processes named on the command line and everything they
//! started, read from /proc (utime + stime, summed over threads), sampled while it runs,
//! idle periods included.
//!
//! Processes are looked up afresh at every sample, so restarted instances count; CPU of a
//! process that exited between two samples is lost (never seen here: deployments keep their
//! processes for the whole run).

use zerohop_test_support::{cpu_ticks, descendants, ticks_per_second};

/// The process trees whose CPU is measured.
#[derive(Clone, Debug, Default)]
pub struct ProcessTrees {
    roots: Vec<u32>,
}

impl ProcessTrees {
    /// The trees under `roots` (each root and its descendants).
    pub fn new(roots: Vec<u32>) -> Self {
        Self { roots }
    }

    /// Whether there is anything to measure.
    pub fn is_empty(&self) -> bool {
        self.roots.is_empty()
    }

    /// Every live process of the trees.
    pub fn pids(&self) -> Vec<u32> {
        descendants(&self.roots)
    }

    /// CPU used so far by the live processes of the trees, in seconds.
    pub fn cpu_seconds(&self) -> f64 {
        let ticks: u64 = self.pids().into_iter().filter_map(cpu_ticks).sum();
        ticks as f64 / ticks_per_second()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_uses_some_cpu() {
        let trees = ProcessTrees::new(vec![std::process::id()]);
        assert!(trees.pids().contains(&std::process::id()));
        let start = trees.cpu_seconds();
        crate::work::burn(std::time::Duration::from_millis(30), 0);
        assert!(trees.cpu_seconds() > start);
    }
}
