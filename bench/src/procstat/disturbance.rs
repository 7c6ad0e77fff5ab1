//! What else used the machine while a benchmark ran: the CPU of every user-space process
//! outside it, and the time the hypervisor gave to others while this VM wanted it (steal).
//! On a quiet machine both stay near zero; when they do not, the numbers of the run are not
//! to be trusted, and the report says so.

use std::collections::BTreeMap;
use std::time::Instant;

use zerohop_test_support::{all_stats, descendants};

use super::{ticks_per_second, tree_ticks};

/// The fields of `/proc/stat`'s first line (`cpu user nice system idle iowait irq softirq
/// steal ...`), after its name; `None` when it is not the `cpu` line.
fn cpu_fields(proc_stat: &str) -> Option<Vec<&str>> {
    let mut fields = proc_stat.lines().next()?.split_whitespace();
    (fields.next() == Some("cpu")).then(|| fields.collect())
}

/// Steal time of all CPUs together in clock ticks, from the text of `/proc/stat`; `None`
/// when the line or the field is missing.
fn parse_steal(proc_stat: &str) -> Option<u64> {
    cpu_fields(proc_stat)?.get(7)?.parse().ok()
}

/// Ticks all CPUs together spent running anything (user, nice, system, irq, softirq: the
/// first line's fields 1, 2, 3, 6 and 7; not idle, iowait or steal), from the text of
/// `/proc/stat`; `None` when the line or a field is missing.
fn parse_busy(proc_stat: &str) -> Option<u64> {
    let f = cpu_fields(proc_stat)?;
    let n: Vec<u64> = f
        .get(..7)?
        .iter()
        .map(|v| v.parse())
        .collect::<Result<_, _>>()
        .ok()?;
    Some(n[0] + n[1] + n[2] + n[5] + n[6])
}

/// Steal ticks (0 when unreadable) and busy ticks (`None` when unreadable) of all CPUs,
/// from one read of `/proc/stat`.
fn stat_ticks() -> (u64, Option<u64>) {
    let text = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    (parse_steal(&text).unwrap_or(0), parse_busy(&text))
}

/// The others' ticks over a window: what their processes say (`per_process`), but never
/// more than the machine ran in all (`busy`) less this benchmark's `own`. A process that
/// reaps a child in the window is charged the child's whole life (`cutime`), which may have
/// been spent long before it: without this bound, a build finishing in the window showed
/// as tens of cores busy on a 2-core machine.
fn others_within(per_process: u64, busy: Option<u64>, own: u64) -> u64 {
    match busy {
        Some(b) => per_process.min(b.saturating_sub(own)),
        None => per_process,
    }
}

/// CPU ticks of every user-space process outside this benchmark (this process and all below
/// it), by (pid, start time), with what their reaped children used (`cutime`, `cstime`: a
/// build's short-lived compilers are counted through the build tool that waited for them).
fn others_ticks() -> BTreeMap<(i32, u64), u64> {
    let own = descendants(&[std::process::id()]);
    all_stats()
        .into_iter()
        // Kernel threads (kthreadd, pid 2, and its children) do the kernel's share of this
        // benchmark's own work too (softirqs of its loopback traffic, writeback).
        .filter(|s| s.pid != 2 && s.ppid != 2)
        .filter(|s| u32::try_from(s.pid).is_ok_and(|p| !own.contains(&p)))
        .map(|s| {
            let children = u64::try_from(s.cutime + s.cstime).unwrap_or(0);
            ((s.pid, s.starttime), s.utime + s.stime + children)
        })
        .collect()
}

/// What a [`Disturbance`] is the difference of: the machine's CPU counters at one moment.
pub struct MachineTicks {
    at: Instant,
    /// [`others_ticks`].
    others: BTreeMap<(i32, u64), u64>,
    /// Steal ticks ([`stat_ticks`]).
    steal: u64,
    /// This process and every process below it.
    own: u64,
    /// Busy ticks ([`stat_ticks`]).
    busy: Option<u64>,
}

impl MachineTicks {
    /// The counters now.
    pub fn now() -> Self {
        let (steal, busy) = stat_ticks();
        Self {
            at: Instant::now(),
            others: others_ticks(),
            steal,
            own: tree_ticks(std::process::id()),
            busy,
        }
    }

    /// When these counters were read.
    pub fn at(&self) -> Instant {
        self.at
    }

    /// What was used from `self` until now (a process new since `self` counts whole).
    pub fn since(&self) -> Disturbance {
        let after = Self::now();
        let seconds = self.at.elapsed().as_secs_f64();
        let per_process = after
            .others
            .iter()
            .map(|(k, &t)| t.saturating_sub(self.others.get(k).copied().unwrap_or(0)))
            .sum();
        let own = after.own.saturating_sub(self.own);
        let busy = after.busy.zip(self.busy).map(|(a, b)| a.saturating_sub(b));
        Disturbance::from_ticks(
            seconds,
            ticks_per_second(),
            own,
            others_within(per_process, busy, own),
            after.steal.saturating_sub(self.steal),
        )
    }
}

/// What else used the machine while the points ran.
#[derive(serde::Serialize, Debug, Default, Clone, PartialEq)]
pub struct Disturbance {
    /// Length of the window.
    pub seconds: f64,
    /// CPU of this benchmark's processes (load generator, chains, instances), in cores.
    pub own_cores: f64,
    /// CPU of every user-space process outside this benchmark, in cores (0.5: half of one
    /// core).
    pub other_cores: f64,
    /// CPU time the hypervisor gave to others while this VM wanted it, in cores.
    pub steal_cores: f64,
}

impl Disturbance {
    /// Ticks used over `seconds` (at `hz` ticks per second), in cores.
    fn from_ticks(seconds: f64, hz: f64, own: u64, others: u64, steal: u64) -> Self {
        let in_cores = |t: u64| t as f64 / hz / seconds;
        Self {
            seconds,
            own_cores: in_cores(own),
            other_cores: in_cores(others),
            steal_cores: in_cores(steal),
        }
    }

    /// Whether others (processes and the host) took more than `cores` while it ran.
    pub fn exceeds(&self, cores: f64) -> bool {
        self.other_cores + self.steal_cores > cores
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steal_is_the_eighth_number_of_the_cpu_line() {
        let stat = "cpu  10132153 290696 3084719 46828483 16683 0 25195 175628 0 0\n\
                    cpu0 1393280 32966 572056 13343292 6130 0 17875 1234 0 0\n\
                    intr 199292 0 9 0\n";
        assert_eq!(parse_steal(stat), Some(175628));
        // A kernel too old to count steal: the field is missing.
        assert_eq!(parse_steal("cpu  1 2 3 4 5 6 7\n"), None);
        assert_eq!(parse_steal("intr 1 2 3 4 5 6 7 8 9\n"), None);
        assert_eq!(parse_steal(""), None);
    }

    #[test]
    fn busy_is_user_nice_system_irq_and_softirq() {
        let stat = "cpu  10132153 290696 3084719 46828483 16683 7 25195 175628 0 0\n";
        assert_eq!(
            parse_busy(stat),
            Some(10132153 + 290696 + 3084719 + 7 + 25195)
        );
        assert_eq!(parse_busy("cpu  1 2 3 4 5 6\n"), None, "a field missing");
        assert_eq!(parse_busy("cpu  1 2 x 4 5 6 7\n"), None, "not a number");
        assert_eq!(parse_busy("intr 1 2 3 4 5 6 7 8\n"), None);
    }

    #[test]
    fn a_child_reaped_in_the_window_counts_no_more_than_the_machine_ran() {
        // A build tool reaped a compiler that ran 1,000 s before: its cutime jumps by 100,000
        // ticks in a 1 s window of 2 busy cores (200 ticks), 50 of them this benchmark's.
        assert_eq!(others_within(100_000, Some(200), 50), 150);
        // What the processes say, when it is less.
        assert_eq!(others_within(30, Some(200), 50), 30);
        // Own ticks above the machine's (counted at slightly different moments): none left.
        assert_eq!(others_within(30, Some(40), 50), 0);
        // No /proc/stat: the processes' word.
        assert_eq!(others_within(30, None, 50), 30);
    }

    #[test]
    fn ticks_become_cores_over_the_window() {
        let d = Disturbance::from_ticks(2.0, 100.0, 100, 20, 0);
        assert_eq!(
            d,
            Disturbance {
                seconds: 2.0,
                own_cores: 0.5,
                other_cores: 0.1,
                steal_cores: 0.0,
            }
        );
        assert!(!d.exceeds(0.1));
        assert!(Disturbance::from_ticks(2.0, 100.0, 0, 20, 1).exceeds(0.1));
    }

    #[test]
    fn this_benchmark_is_counted_as_its_own() {
        let before = MachineTicks::now();
        let t = Instant::now();
        let mut x = 0u64;
        while t.elapsed() < std::time::Duration::from_millis(300) {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        }
        std::hint::black_box(x);
        let d = before.since();
        assert!(d.seconds >= 0.3 && d.own_cores > 0.0, "{d:?}");
    }
}
