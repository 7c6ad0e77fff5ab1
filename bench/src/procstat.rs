//! CPU time and memory of processes, read from `/proc`.
//!
//! CPU is `utime + stime` of `/proc/PID/stat` (all threads, living and exited), in clock
//! ticks ([`ticks_per_second`], 100 on usual kernels, so 10 ms): runs are long enough
//! (seconds at thousands of requests per second) for that resolution. The load generator is
//! this process, read the same way.

use std::collections::BTreeMap;

use crate::Component;

pub use zerohop_test_support::{cpu_ticks, stat, ticks_per_second};
use zerohop_test_support::{descendants, thread_stats};

/// CPU ticks of `pid` and every process below it now (a deployment, a benchmark with all it
/// started).
pub fn tree_ticks(pid: u32) -> u64 {
    descendants(&[pid]).into_iter().filter_map(cpu_ticks).sum()
}

/// Resident memory of `pid`: `(VmRSS, RssShmem)` in KiB.
pub fn rss_kib(pid: u32) -> Option<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
    };
    Some((field("VmRSS:")?, field("RssShmem:").unwrap_or(0)))
}

/// A snapshot of the CPU ticks of every component plus this process.
#[derive(Clone, Debug, Default)]
pub struct CpuSnapshot {
    ticks: BTreeMap<String, u64>,
    own: u64,
}

/// Name under which the load generator (this process) is reported.
pub const LOADGEN: &str = "loadgen";

impl CpuSnapshot {
    /// Reads the ticks of `components` and of this process now.
    pub fn take(components: &[Component]) -> Self {
        let mut ticks = BTreeMap::new();
        for c in components {
            *ticks.entry(c.name.clone()).or_insert(0) += cpu_ticks(c.pid).unwrap_or(0);
        }
        Self {
            ticks,
            own: cpu_ticks(std::process::id()).unwrap_or(0),
        }
    }

    /// CPU seconds used per component between `earlier` and `self`, the load generator
    /// under [`LOADGEN`].
    pub fn since(&self, earlier: &CpuSnapshot) -> BTreeMap<String, f64> {
        let hz = ticks_per_second();
        let mut out: BTreeMap<String, f64> = self
            .ticks
            .iter()
            .map(|(name, &t)| {
                let before = earlier.ticks.get(name).copied().unwrap_or(0);
                (name.clone(), t.saturating_sub(before) as f64 / hz)
            })
            .collect();
        out.insert(
            LOADGEN.into(),
            self.own.saturating_sub(earlier.own) as f64 / hz,
        );
        out
    }
}

/// Pins the calling thread to `cpu` (best effort; false when the CPU does not exist).
pub fn pin_current_thread(cpu: usize) -> bool {
    // SAFETY: cpu_set_t is plain data, zero is a valid empty set; CPU_SET writes inside it
    // for cpu < CPU_SETSIZE, checked first.
    unsafe {
        if cpu >= libc::CPU_SETSIZE as usize {
            return false;
        }
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0
    }
}

/// Number of CPUs online (whatever this thread's affinity).
pub fn online_cpus() -> usize {
    // SAFETY: sysconf only reads a system value.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    usize::try_from(n).unwrap_or(1).max(1)
}

/// A pid plus its start time (field 22 of /proc/PID/stat), so a recycled pid is never
/// mistaken for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcessId {
    /// The pid.
    pub pid: u32,
    /// Start time in clock ticks after boot.
    pub start: u64,
}

impl ProcessId {
    /// Process `pid` as it is now (`None` when it is gone).
    pub fn of(pid: u32) -> Option<Self> {
        Some(Self {
            pid,
            start: stat(pid)?.starttime,
        })
    }

    /// Whether this very process still runs (not a zombie, not a recycled pid).
    pub fn alive(self) -> bool {
        stat(self.pid).is_some_and(|s| s.starttime == self.start && s.state != 'Z')
    }
}

/// CPU ticks of the gateway threads of zerohop process `pid`, by name: its main thread
/// (which runs gateway thread 0) as `gateway-0`, the others as they name themselves
/// (`gateway-1`, ...). Other threads are left out.
pub fn gateway_thread_ticks(pid: u32) -> BTreeMap<String, u64> {
    thread_stats(pid)
        .into_iter()
        .filter_map(|t| {
            let name = if u32::try_from(t.pid) == Ok(pid) {
                "gateway-0".to_owned()
            } else if t.comm.starts_with("gateway-") {
                t.comm
            } else {
                return None;
            };
            Some((name, t.utime + t.stime))
        })
        .collect()
}

/// The numbers of the `Name:   N kB` lines `names` of a /proc file (status, smaps_rollup,
/// meminfo), in KiB, 0 for a name absent; `None` when the file cannot be read.
pub fn kib_fields(path: &str, names: &[&str]) -> Option<Vec<u64>> {
    let text = std::fs::read_to_string(path).ok()?;
    let mut out = vec![0; names.len()];
    for line in text.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        if let Some(i) = names.iter().position(|n| *n == key) {
            out[i] = value
                .split_whitespace()
                .next()
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_process() {
        let me = std::process::id();
        // Burn a little CPU so the counter moves.
        let before = CpuSnapshot::take(&[Component {
            name: "me".into(),
            pid: me,
        }]);
        let t = std::time::Instant::now();
        let mut x = 0u64;
        while t.elapsed() < std::time::Duration::from_millis(300) {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        }
        std::hint::black_box(x);
        let after = CpuSnapshot::take(&[Component {
            name: "me".into(),
            pid: me,
        }]);
        let used = after.since(&before);
        assert!(used["me"] >= 0.1, "{used:?}");
        assert!(used[LOADGEN] >= 0.1, "{used:?}");
        let (rss, _) = rss_kib(me).unwrap();
        assert!(rss > 100, "rss {rss} KiB");
        assert_eq!(cpu_ticks(u32::MAX), None);
    }
}
