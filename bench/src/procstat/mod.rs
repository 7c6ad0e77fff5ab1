//! CPU time and memory of processes, read from `/proc`: the one sampler every bench binary
//! uses.
//!
//! CPU is `utime + stime` of `/proc/PID/stat` (all threads, living and exited), in clock
//! ticks ([`ticks_per_second`], 100 on usual kernels, so 10 ms): runs are long enough
//! (seconds at thousands of requests per second) for that resolution. The load generator is
//! this process, read the same way. `/proc/PID/stat` itself is parsed by `procfs` (through
//! `zerohop-test-support`, which the tests read it with too); what `procfs` does not cover
//! (schedstat, smaps, the memory lines of status) is parsed here, by pure functions over the
//! file's text so that odd lines are unit-tested.
//!
//! * this module: processes ([`ProcessId`], trees, groups, environment) and their CPU
//!   ([`TickSample`], [`SchedStat`], [`CpuSnapshot`]);
//! * [`memory`]: resident memory (`status`, `smaps_rollup`, `smaps`, the memfds a process
//!   holds, `meminfo`);
//! * [`disturbance`]: what other processes and the host took from the machine meanwhile.
//!
//! A process that is gone reads as `None` (or counts 0 in a sum): the callers check
//! [`ProcessId::alive`] where a death matters.

pub mod disturbance;
pub mod memory;

use std::collections::BTreeMap;

use crate::Component;

use zerohop_test_support::{all_stats, descendants, thread_stats};
pub use zerohop_test_support::{cpu_ticks, stat, ticks_per_second};

/// `ticks` of CPU time in seconds.
pub fn ticks_to_seconds(ticks: u64) -> f64 {
    ticks as f64 / ticks_per_second()
}

/// CPU ticks of `pid` and every process below it now (a deployment, a benchmark with all it
/// started).
pub fn tree_ticks(pid: u32) -> u64 {
    descendants(&[pid]).into_iter().filter_map(cpu_ticks).sum()
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

    /// `(utime, stime)` of this very process in clock ticks, all its threads (a zombie's
    /// last counts); `None` when it is gone or its pid was recycled.
    pub fn cpu_split(self) -> Option<(u64, u64)> {
        stat(self.pid)
            .filter(|s| s.starttime == self.start)
            .map(|s| (s.utime, s.stime))
    }

    /// `utime + stime` of this very process in clock ticks ([`ProcessId::cpu_split`]).
    pub fn cpu_ticks(self) -> Option<u64> {
        self.cpu_split().map(|(user, system)| user + system)
    }
}

/// Live processes whose process group is `pgid`.
pub fn process_group(pgid: u32) -> Vec<ProcessId> {
    all_stats()
        .into_iter()
        .filter(|s| u32::try_from(s.pgrp) == Ok(pgid))
        .filter_map(|s| ProcessId::of(u32::try_from(s.pid).ok()?))
        .filter(|p| p.alive())
        .collect()
}

/// The value of `key` in the environment `pid` started with (`/proc/PID/environ`); `None`
/// when it is not set or the file cannot be read (another user's process, gone).
pub fn environ_var(pid: u32, key: &str) -> Option<String> {
    let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    find_environ_var(&environ, key)
}

/// `key`'s value in `environ`, the NUL-separated `KEY=value` entries of
/// `/proc/PID/environ` (the first one wins, as for `getenv`).
fn find_environ_var(environ: &[u8], key: &str) -> Option<String> {
    let prefix = format!("{key}=");
    environ
        .split(|&b| b == 0)
        .find_map(|v| v.strip_prefix(prefix.as_bytes()))
        .map(|v| String::from_utf8_lossy(v).into_owned())
}

/// The program `pid` runs (`/proc/PID/exe`, without the ` (deleted)` of a replaced binary);
/// empty when unreadable.
pub fn exe_path(pid: u32) -> String {
    std::fs::read_link(format!("/proc/{pid}/exe"))
        .map(|p| {
            p.to_string_lossy()
                .trim_end_matches(" (deleted)")
                .to_owned()
        })
        .unwrap_or_default()
}

/// CPU ticks of each process of a list at one moment, in the list's order (0 for one that
/// is gone): the two ends of a measured window.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TickSample(Vec<u64>);

impl TickSample {
    /// Reads the ticks of `pids` now.
    pub fn take(pids: &[ProcessId]) -> Self {
        Self(pids.iter().map(|p| p.cpu_ticks().unwrap_or(0)).collect())
    }

    /// The ticks each process used from `earlier` (taken of the same list) to `self`; a
    /// process gone meanwhile counts 0.
    pub fn used_since(&self, earlier: &TickSample) -> Vec<u64> {
        self.0
            .iter()
            .zip(&earlier.0)
            .map(|(after, before)| after.saturating_sub(*before))
            .collect()
    }

    /// The ticks all of them used from `earlier` to `self`.
    pub fn total_since(&self, earlier: &TickSample) -> u64 {
        self.used_since(earlier).iter().sum()
    }
}

/// What the scheduler counted for threads (`/proc/PID/task/TID/schedstat`): time on a CPU
/// in nanoseconds, finer than the ticks of `stat`, and how often they were switched in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SchedStat {
    /// On-CPU nanoseconds.
    pub run_ns: u64,
    /// Times switched in (timeslices run).
    pub switches: u64,
}

impl SchedStat {
    /// Parses a schedstat line, `run_ns wait_ns timeslices`; `None` when a field is missing
    /// or any is not a number.
    pub fn parse(line: &str) -> Option<Self> {
        let v: Vec<u64> = line
            .split_whitespace()
            .map(str::parse)
            .collect::<Result<_, _>>()
            .ok()?;
        Some(Self {
            run_ns: *v.first()?,
            switches: *v.get(2)?,
        })
    }

    /// The living threads of `pids` together (a thread or process gone counts 0).
    pub fn threads_of(pids: &[ProcessId]) -> Self {
        pids.iter()
            .filter_map(|p| std::fs::read_dir(format!("/proc/{}/task", p.pid)).ok())
            .flatten()
            .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("schedstat")).ok())
            .filter_map(|line| Self::parse(&line))
            .fold(Self::default(), |sum, s| Self {
                run_ns: sum.run_ns + s.run_ns,
                switches: sum.switches + s.switches,
            })
    }

    /// What was counted from `earlier` to `self`.
    pub fn since(self, earlier: SchedStat) -> SchedStat {
        SchedStat {
            run_ns: self.run_ns.saturating_sub(earlier.run_ns),
            switches: self.switches.saturating_sub(earlier.switches),
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Burns about `ms` of CPU on this thread, so the counters move.
    fn burn(ms: u64) {
        let t = std::time::Instant::now();
        let mut x = 0u64;
        while t.elapsed() < std::time::Duration::from_millis(ms) {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        }
        std::hint::black_box(x);
    }

    #[test]
    fn reads_this_process() {
        let me = std::process::id();
        let component = [Component {
            name: "me".into(),
            pid: me,
        }];
        let before = CpuSnapshot::take(&component);
        burn(300);
        let after = CpuSnapshot::take(&component);
        let used = after.since(&before);
        assert!(used["me"] >= 0.1, "{used:?}");
        assert!(used[LOADGEN] >= 0.1, "{used:?}");
        assert_eq!(cpu_ticks(u32::MAX), None);
    }

    #[test]
    fn a_tick_sample_counts_each_process_of_its_list() {
        let me = ProcessId::of(std::process::id()).expect("this process");
        let gone = ProcessId {
            pid: u32::MAX,
            start: 0,
        };
        let before = TickSample::take(&[me, gone]);
        burn(300);
        let after = TickSample::take(&[me, gone]);
        let used = after.used_since(&before);
        assert!(used[0] >= 10, "{used:?} ticks");
        assert_eq!(used[1], 0, "a process that is not there counts 0");
        assert_eq!(after.total_since(&before), used[0]);
        // The other way round (a counter that went back) counts 0, not a wrap-around.
        assert_eq!(before.total_since(&after), 0);
    }

    #[test]
    fn a_recycled_pid_is_not_read_as_the_process_it_was() {
        let me = ProcessId::of(std::process::id()).expect("this process");
        assert!(me.alive());
        assert!(me.cpu_ticks().is_some());
        let earlier = ProcessId {
            start: me.start.wrapping_sub(1),
            ..me
        };
        assert!(!earlier.alive());
        assert_eq!(earlier.cpu_split(), None);
        assert_eq!(earlier.cpu_ticks(), None);
    }

    #[test]
    fn schedstat_lines_parse_or_say_none() {
        assert_eq!(
            SchedStat::parse("123456789 2000 42\n"),
            Some(SchedStat {
                run_ns: 123456789,
                switches: 42
            })
        );
        // Missing the timeslices field.
        assert_eq!(SchedStat::parse("123456789 2000\n"), None);
        assert_eq!(SchedStat::parse(""), None);
        assert_eq!(SchedStat::parse("12 x 3"), None);
        let a = SchedStat {
            run_ns: 10,
            switches: 5,
        };
        let b = SchedStat {
            run_ns: 4,
            switches: 7,
        };
        assert_eq!(
            a.since(b),
            SchedStat {
                run_ns: 6,
                switches: 0
            }
        );
    }

    #[test]
    fn schedstat_of_this_process_counts_its_threads() {
        let me = ProcessId::of(std::process::id()).expect("this process");
        burn(50);
        let s = SchedStat::threads_of(&[me]);
        assert!(s.run_ns > 0 && s.switches > 0, "{s:?}");
    }

    /// `/proc/PID/stat` is parsed by procfs (through `zerohop-test-support`): a thread's name
    /// is whatever it set, in parentheses that are not escaped, so only the last `)` ends it.
    /// A real line with such a name, read the way the sampler reads them: every field after
    /// the name in its place, and the gateway threads found by name.
    #[test]
    fn threads_named_with_spaces_and_parentheses_are_read_whole() {
        // 15 bytes, the most a thread name keeps.
        let name = "gateway-9) (x y";
        let (ready_tx, ready) = std::sync::mpsc::channel();
        let (stop, stop_rx) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                burn(30);
                ready_tx.send(()).expect("ready");
                let _ = stop_rx.recv();
            })
            .expect("thread");
        ready.recv().expect("the thread ran");
        let me = std::process::id();
        let process = stat(me).expect("this process");
        let threads = thread_stats(me);
        let t = threads
            .iter()
            .find(|t| t.comm == name)
            .unwrap_or_else(|| panic!("no thread {name:?} in {threads:?}"));
        assert_eq!(
            (t.ppid, t.pgrp, t.session),
            (process.ppid, process.pgrp, process.session)
        );
        assert!(matches!(t.state, 'R' | 'S'), "state {:?}", t.state);
        assert!(t.starttime >= process.starttime, "{t:?}");
        assert!(t.num_threads >= 2, "{t:?}");
        assert!(gateway_thread_ticks(me).contains_key(name));
        drop(stop);
        thread.join().expect("joined");
    }

    #[test]
    fn environ_values_are_found_by_whole_key() {
        let env = b"BENCH_FUNCTION_X=no\0PATH=/bin\0BENCH_FUNCTION=p3\0BENCH_FUNCTION=p4\0";
        assert_eq!(
            find_environ_var(env, "BENCH_FUNCTION").as_deref(),
            Some("p3")
        );
        assert_eq!(find_environ_var(env, "PATH").as_deref(), Some("/bin"));
        assert_eq!(find_environ_var(env, "HOME"), None);
        assert_eq!(find_environ_var(b"", "PATH"), None);
        assert_eq!(find_environ_var(b"EMPTY=\0", "EMPTY").as_deref(), Some(""));
    }

    #[test]
    fn this_process_has_its_exe_and_group() {
        let me = std::process::id();
        let exe = std::env::current_exe().expect("current_exe");
        assert_eq!(exe_path(me), exe.to_string_lossy());
        let pgid = u32::try_from(stat(me).expect("stat").pgrp).expect("pgid");
        let group = process_group(pgid);
        assert!(group.iter().any(|p| p.pid == me), "{group:?}");
    }
}
