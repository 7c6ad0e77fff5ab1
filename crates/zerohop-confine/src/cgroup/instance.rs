//! An instance's groups (one per hierarchy it is killed, limited or measured in): killing
//! and removing them, and reading its usage from them ([`UsageProbe`]). They are made by
//! the chain ([`ChainCgroup::instance`](super::ChainCgroup::instance)).

use std::fs::File;
use std::path::PathBuf;
use std::time::Duration;

use super::folder::{procs, remove};
use super::version::kill_v1;
use crate::limits::{Source, Usage, Version};

/// One instance's group in one hierarchy.
#[derive(Debug)]
pub(super) struct InstanceGroup {
    pub(super) version: Version,
    pub(super) dir: PathBuf,
}

/// One instance's groups (the first is the one it is killed through). Killed and removed on
/// drop.
#[derive(Debug)]
pub struct InstanceCgroup {
    pub(super) groups: Vec<InstanceGroup>,
    /// `cgroup.procs` of each group.
    pub(super) procs: Vec<File>,
    pub(super) usage: UsageProbe,
}

/// Reads an instance's [`Usage`] from its groups; cheap to clone, and valid as long as the
/// instance's groups exist (afterwards every figure is `None`).
#[derive(Clone, Debug, Default)]
pub struct UsageProbe {
    pub(super) files: Vec<(Source, PathBuf)>,
}

impl UsageProbe {
    /// The instance's usage now.
    pub fn read(&self) -> Usage {
        let get = |want: &[Source]| {
            self.files
                .iter()
                .filter(|(s, _)| want.contains(s))
                .find_map(|(s, f)| s.parse(&std::fs::read_to_string(f).ok()?))
        };
        Usage {
            cpu_ns: get(&[Source::V1CpuacctUsage, Source::V2CpuStat]),
            memory_bytes: get(&[Source::V1MemoryUsage, Source::V2MemoryCurrent]),
            nr_throttled: get(&[Source::CpuStatThrottled]),
        }
    }
}

impl InstanceCgroup {
    /// The `cgroup.procs` of each group; the child writes `0` into each before `execve`.
    pub fn procs_fds(&self) -> &[File] {
        &self.procs
    }

    /// A handle that reads the instance's resource usage, without holding its groups.
    pub fn usage_probe(&self) -> UsageProbe {
        self.usage.clone()
    }

    /// The group folders, the one it is killed through first.
    #[cfg(test)]
    pub fn dirs(&self) -> impl Iterator<Item = &std::path::Path> {
        self.groups.iter().map(|g| g.dir.as_path())
    }

    /// Kills every process in the group; true when it is empty afterwards.
    pub fn kill(&self) -> bool {
        let Some(g) = self.groups.first() else {
            return true;
        };
        match g.version {
            Version::V2 => {
                let _ = std::fs::write(g.dir.join("cgroup.kill"), "1");
                for _ in 0..200 {
                    if procs(&g.dir).is_empty() {
                        return true;
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
                false
            }
            Version::V1 => kill_v1(&g.dir),
        }
    }
}

impl Drop for InstanceCgroup {
    fn drop(&mut self) {
        self.kill();
        for g in self.groups.iter().rev() {
            remove(&g.dir);
        }
    }
}
