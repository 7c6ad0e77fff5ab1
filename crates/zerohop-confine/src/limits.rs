//! What a function's `resources` become in cgroup files, for either cgroup version, and
//! how an instance's usage is read back. Pure: no file is touched here (`cgroup` writes and
//! reads them), so both versions are tested on any host.
//!
//! | limit | v2 (unified) | v1 (one hierarchy per controller) |
//! |---|---|---|
//! | `cpu` (thousandths of a core) | `cpu.max` = `QUOTA 100000` | `cpu.cfs_period_us` = `100000`, then `cpu.cfs_quota_us` = `QUOTA` |
//! | `memory` (bytes) | `memory.max` | `memory.limit_in_bytes` |
//! | `pids` | `pids.max` | `pids.max` |
//!
//! `QUOTA` is microseconds of CPU time per 100 ms period: `cpu_millis * 100` (`200m` ->
//! `20000`). The spec keeps `cpu` at 10m or more, so the quota is never below the kernel's
//! 1 ms minimum.

use zerohop_spec::ResourceSpec;

/// The CFS period every quota is given in, microseconds.
pub(crate) const CPU_PERIOD_US: u64 = 100_000;

/// A cgroup controller an instance is limited or measured by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Controller {
    Cpu,
    Memory,
    Pids,
    /// v1 only: CPU usage (`cpuacct.usage`); v2 reports usage in every group's `cpu.stat`.
    Cpuacct,
}

impl Controller {
    /// Every controller, in the order groups are set up.
    pub const ALL: [Controller; 4] = [
        Controller::Cpu,
        Controller::Memory,
        Controller::Pids,
        Controller::Cpuacct,
    ];

    /// The kernel's name of it (`/proc/self/cgroup`, `cgroup.controllers`).
    pub fn name(self) -> &'static str {
        match self {
            Controller::Cpu => "cpu",
            Controller::Memory => "memory",
            Controller::Pids => "pids",
            Controller::Cpuacct => "cpuacct",
        }
    }

    /// Index into per-controller arrays.
    pub fn index(self) -> usize {
        self as usize
    }
}

/// One limit as a file write: in the group of `controller`'s hierarchy, write `value` to
/// `file`. Writes of one controller are in the order the kernel needs them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct LimitFile {
    pub controller: Controller,
    pub file: &'static str,
    pub value: String,
    /// The limit as the spec says it, for messages (`resources.cpu 200m`).
    pub limit: String,
}

/// The controllers `r` needs.
pub(crate) fn needed(r: &ResourceSpec) -> Vec<Controller> {
    let mut out = Vec::new();
    if r.cpu_millis.is_some() {
        out.push(Controller::Cpu);
    }
    if r.memory.is_some() {
        out.push(Controller::Memory);
    }
    if r.pids.is_some() {
        out.push(Controller::Pids);
    }
    out
}

/// `resources.cpu 200m`, `resources.memory 64MiB`, `resources.pids 16`: how a message names
/// the limit `c` of `r`.
pub(crate) fn describe(r: &ResourceSpec, c: Controller) -> String {
    match c {
        Controller::Cpu => format!("resources.cpu {}m", r.cpu_millis.unwrap_or(0)),
        Controller::Memory => format!("resources.memory {}", size(r.memory.unwrap_or(0))),
        Controller::Pids => format!("resources.pids {}", r.pids.unwrap_or(0)),
        Controller::Cpuacct => "CPU usage".into(),
    }
}

/// Bytes in the largest binary unit that divides them.
fn size(b: u64) -> String {
    for (shift, unit) in [(30, "GiB"), (20, "MiB"), (10, "KiB")] {
        if b != 0 && b.is_multiple_of(1 << shift) {
            return format!("{}{unit}", b >> shift);
        }
    }
    format!("{b} bytes")
}

/// The CPU quota of `millis` thousandths of a core, in microseconds per [`CPU_PERIOD_US`].
pub(crate) fn cpu_quota_us(millis: u32) -> u64 {
    u64::from(millis) * CPU_PERIOD_US / 1000
}

/// The version of a group's hierarchy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Version {
    /// The unified hierarchy: `cgroup.kill`, `cpu.max`, `memory.max`.
    V2,
    /// A v1 hierarchy: signal every pid in `cgroup.procs`; `cpu.cfs_quota_us`, ...
    V1,
}

/// The files `version` needs written for `r`, in order.
pub(crate) fn files(version: Version, r: &ResourceSpec) -> Vec<LimitFile> {
    let mut out = Vec::new();
    let mut add = |controller, file, value: String| {
        out.push(LimitFile {
            controller,
            file,
            value,
            limit: describe(r, controller),
        })
    };
    if let Some(m) = r.cpu_millis {
        let quota = cpu_quota_us(m);
        match version {
            Version::V2 => add(
                Controller::Cpu,
                "cpu.max",
                format!("{quota} {CPU_PERIOD_US}"),
            ),
            Version::V1 => {
                // The period first: a quota is checked against the period in force.
                add(
                    Controller::Cpu,
                    "cpu.cfs_period_us",
                    CPU_PERIOD_US.to_string(),
                );
                add(Controller::Cpu, "cpu.cfs_quota_us", quota.to_string());
            }
        }
    }
    if let Some(b) = r.memory {
        let file = match version {
            Version::V2 => "memory.max",
            Version::V1 => "memory.limit_in_bytes",
        };
        add(Controller::Memory, file, b.to_string());
    }
    if let Some(p) = r.pids {
        add(Controller::Pids, "pids.max", p.to_string());
    }
    out
}

/// An instance's resource usage, from its cgroups; `None` where the host cannot tell (no
/// group in that controller's hierarchy, or the file is missing).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// CPU time used by every process of the instance so far, nanoseconds.
    pub cpu_ns: Option<u64>,
    /// Memory charged to the instance now, bytes.
    pub memory_bytes: Option<u64>,
    /// CFS periods in which the instance was throttled by its CPU limit (only with a
    /// `cpu` limit).
    pub nr_throttled: Option<u64>,
}

/// Where each figure of [`Usage`] is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Source {
    /// v2 `cpu.stat`, `usage_usec` (in every v2 group, with or without the cpu controller).
    V2CpuStat,
    /// v1 `cpuacct.usage`, nanoseconds.
    V1CpuacctUsage,
    /// v2 `memory.current`.
    V2MemoryCurrent,
    /// v1 `memory.usage_in_bytes`.
    V1MemoryUsage,
    /// `cpu.stat` `nr_throttled` (same key in v1 and v2).
    CpuStatThrottled,
}

impl Source {
    /// Where `c`'s figure is read in a group of `version` (`None`: that controller gives
    /// no figure of [`Usage`]).
    pub fn of(c: Controller, version: Version) -> Option<Source> {
        match (c, version) {
            (Controller::Cpuacct, Version::V2) => Some(Source::V2CpuStat),
            (Controller::Cpuacct, Version::V1) => Some(Source::V1CpuacctUsage),
            (Controller::Memory, Version::V2) => Some(Source::V2MemoryCurrent),
            (Controller::Memory, Version::V1) => Some(Source::V1MemoryUsage),
            (Controller::Cpu, _) => Some(Source::CpuStatThrottled),
            (Controller::Pids, _) => None,
        }
    }

    /// The file it is in.
    pub fn file(self) -> &'static str {
        match self {
            Source::V2CpuStat | Source::CpuStatThrottled => "cpu.stat",
            Source::V1CpuacctUsage => "cpuacct.usage",
            Source::V2MemoryCurrent => "memory.current",
            Source::V1MemoryUsage => "memory.usage_in_bytes",
        }
    }

    /// The figure in `text` (the file's content), converted to the unit of [`Usage`].
    pub fn parse(self, text: &str) -> Option<u64> {
        match self {
            Source::V2CpuStat => stat_key(text, "usage_usec")?.checked_mul(1000),
            Source::CpuStatThrottled => stat_key(text, "nr_throttled"),
            Source::V1CpuacctUsage | Source::V2MemoryCurrent | Source::V1MemoryUsage => {
                text.trim().parse().ok()
            }
        }
    }
}

/// The value of `key` in a flat-keyed file (`key value` lines, as `cpu.stat`).
fn stat_key(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(cpu: Option<u32>, memory: Option<u64>, pids: Option<u32>) -> ResourceSpec {
        ResourceSpec {
            cpu_millis: cpu,
            memory,
            pids,
        }
    }

    fn pairs(v: &[LimitFile]) -> Vec<(&str, &str)> {
        v.iter().map(|f| (f.file, f.value.as_str())).collect()
    }

    #[test]
    fn v2_files() {
        let r = spec(Some(200), Some(64 << 20), Some(16));
        assert_eq!(
            pairs(&files(Version::V2, &r)),
            [
                ("cpu.max", "20000 100000"),
                ("memory.max", "67108864"),
                ("pids.max", "16"),
            ]
        );
        assert_eq!(
            pairs(&files(Version::V2, &spec(Some(1500), None, None))),
            [("cpu.max", "150000 100000")]
        );
    }

    #[test]
    fn v1_files() {
        let r = spec(Some(200), Some(64 << 20), Some(16));
        let f = files(Version::V1, &r);
        assert_eq!(
            pairs(&f),
            [
                ("cpu.cfs_period_us", "100000"),
                ("cpu.cfs_quota_us", "20000"),
                ("memory.limit_in_bytes", "67108864"),
                ("pids.max", "16"),
            ]
        );
        let ctl: Vec<_> = f.iter().map(|f| f.controller).collect();
        assert_eq!(
            ctl,
            [
                Controller::Cpu,
                Controller::Cpu,
                Controller::Memory,
                Controller::Pids
            ]
        );
        assert_eq!(f[0].limit, "resources.cpu 200m");
        assert_eq!(f[2].limit, "resources.memory 64MiB");
        assert_eq!(f[3].limit, "resources.pids 16");
    }

    #[test]
    fn no_limits_no_files() {
        let r = ResourceSpec::default();
        assert!(files(Version::V1, &r).is_empty());
        assert!(files(Version::V2, &r).is_empty());
        assert!(needed(&r).is_empty());
        assert_eq!(
            needed(&spec(None, Some(4 << 20), Some(1))),
            [Controller::Memory, Controller::Pids]
        );
    }

    #[test]
    fn smallest_cpu_is_the_kernels_minimum_quota() {
        // The spec's floor (10m) is the kernel's 1 ms quota floor.
        assert_eq!(cpu_quota_us(10), 1000);
        assert_eq!(cpu_quota_us(1024 * 1000), 102_400_000);
    }

    #[test]
    fn sizes_read_as_written() {
        assert_eq!(size(64 << 20), "64MiB");
        assert_eq!(size(3 << 30), "3GiB");
        assert_eq!(size((4 << 20) + 1), "4194305 bytes");
    }

    #[test]
    fn usage_is_parsed_in_nanoseconds_and_bytes() {
        let v2 = "usage_usec 1500\nuser_usec 1000\nsystem_usec 500\nnr_periods 9\n\
                  nr_throttled 4\nthrottled_usec 77\n";
        assert_eq!(Source::V2CpuStat.parse(v2), Some(1_500_000));
        assert_eq!(Source::CpuStatThrottled.parse(v2), Some(4));
        let v1 = "nr_periods 12\nnr_throttled 3\nthrottled_time 123\n";
        assert_eq!(Source::CpuStatThrottled.parse(v1), Some(3));
        assert_eq!(
            Source::V1CpuacctUsage.parse("123456789\n"),
            Some(123_456_789)
        );
        assert_eq!(Source::V1MemoryUsage.parse("4096\n"), Some(4096));
        assert_eq!(Source::V2MemoryCurrent.parse("max\n"), None);
        // A v2 group without the cpu controller has no throttling figures.
        assert_eq!(
            Source::CpuStatThrottled.parse("usage_usec 1\nuser_usec 1\nsystem_usec 0\n"),
            None
        );
        assert_eq!(
            Source::of(Controller::Cpuacct, Version::V2),
            Some(Source::V2CpuStat)
        );
        assert_eq!(Source::of(Controller::Pids, Version::V1), None);
    }
}
