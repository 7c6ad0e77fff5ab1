//! Core-affine pipelines (a chain's `cpus`): the agent's side. Gateway thread `g` runs on
//! its lane's core and its listening socket asks the kernel for the connections whose
//! packets arrive on that core (`SO_INCOMING_CPU`, honoured within an `SO_REUSEPORT` group
//! since Linux 6.1); instances pin themselves as they attach (`zerohop-runtime`), and every
//! sender picks the instance of its own lane first (`zerohop_transport::pick`).
//!
//! Party 0 serves on the chain's own thread, which is pinned with it: threads the chain
//! starts later for supervision float again ([`float`]), so that supervision never competes
//! with lane 0 for its core.

use std::sync::OnceLock;

use nix::sched::{sched_getaffinity, sched_setaffinity, CpuSet};
use nix::unistd::Pid;

/// The calling thread's affinity before the first pin: where floating threads go.
static BEFORE: OnceLock<CpuSet> = OnceLock::new();

/// Pins the calling thread to `cpu` (remembering, the first time, where it could run).
pub(super) fn pin(cpu: u16) -> nix::Result<()> {
    let here = Pid::from_raw(0);
    if BEFORE.get().is_none() {
        let _ = BEFORE.set(sched_getaffinity(here)?);
    }
    let mut set = CpuSet::new();
    set.set(usize::from(cpu))?;
    sched_setaffinity(here, &set)
}

/// Lets the calling thread run wherever the process could before anything was pinned (a
/// no-op when nothing was).
pub(super) fn float() {
    if let Some(set) = BEFORE.get() {
        if let Err(e) = sched_setaffinity(Pid::from_raw(0), set) {
            tracing::debug!("cannot unpin a supervision thread: {e}");
        }
    }
}

/// Pins the calling thread to `cpu` when there is one, logging (not failing) when the
/// kernel refuses: the chain still serves, only without the pipeline on that core.
pub(super) fn pin_or_warn(cpu: Option<u16>, what: &str) {
    if let Some(cpu) = cpu {
        if let Err(e) = pin(cpu) {
            tracing::warn!("cannot pin {what} to CPU {cpu}: {e}; it runs unpinned");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pinned_thread_runs_on_its_cpu_and_a_floating_one_where_it_could_before() {
        std::thread::spawn(|| {
            let before = sched_getaffinity(Pid::from_raw(0)).unwrap();
            let first = (0..CpuSet::count())
                .find(|&c| before.is_set(c).unwrap())
                .unwrap();
            pin(first as u16).unwrap();
            let now = sched_getaffinity(Pid::from_raw(0)).unwrap();
            let on: Vec<usize> = (0..CpuSet::count())
                .filter(|&c| now.is_set(c).unwrap())
                .collect();
            assert_eq!(on, [first]);
            assert_eq!(nix::sched::sched_getcpu().unwrap(), first);
            float();
            assert_eq!(sched_getaffinity(Pid::from_raw(0)).unwrap(), before);
        })
        .join()
        .unwrap();
    }
}
