//! CPU time of a deployment: the processes named on the command line and everything they
//! started, read from /proc (utime + stime, summed over threads), sampled while it runs,
//! idle periods included.
//!
//! Processes are looked up afresh at every sample, so restarted instances count; CPU of a
//! process that exited between two samples is lost (never seen here: deployments keep their
//! processes for the whole run).

use zerohop_test_support::{children, cpu_ticks};

/// Clock ticks per second in /proc/PID/stat (USER_HZ; 100 on every Linux architecture
/// that matters here).
pub const TICKS_PER_SECOND: f64 = 100.0;

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
        let mut all = Vec::new();
        let mut todo = self.roots.clone();
        while let Some(p) = todo.pop() {
            if all.contains(&p) {
                continue;
            }
            all.push(p);
            todo.extend(children(p));
        }
        all
    }

    /// CPU used so far by the live processes of the trees, in seconds.
    pub fn cpu_seconds(&self) -> f64 {
        let ticks: u64 = self.pids().into_iter().filter_map(cpu_ticks).sum();
        ticks as f64 / TICKS_PER_SECOND
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
