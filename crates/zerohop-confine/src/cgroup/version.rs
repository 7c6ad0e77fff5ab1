//! What tells the two cgroup versions apart: which the agent may use ([`CgroupMode`]),
//! passing a controller down to the chain's group (v2 only, [`enable`]), and killing a
//! group without `cgroup.kill` (v1, [`kill_v1`]).

use std::path::Path;
use std::time::Duration;

use super::error::Attempt;
use super::folder::procs;
use crate::limits::Controller;

/// Which cgroup version to use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CgroupMode {
    /// v2 where it works, else v1 (per controller for limits), else none.
    #[default]
    Auto,
    /// Only the unified hierarchy.
    V2,
    /// Only v1 hierarchies.
    V1,
    /// No cgroups: the process group alone (functions with `resources` cannot start).
    Off,
}

impl CgroupMode {
    pub(super) fn v2(self) -> bool {
        matches!(self, CgroupMode::Auto | CgroupMode::V2)
    }

    pub(super) fn v1(self) -> bool {
        matches!(self, CgroupMode::Auto | CgroupMode::V1)
    }
}

/// Enables `c` for the children of `dir`, a group this agent created.
pub(super) fn enable(dir: &Path, c: Controller) -> Result<(), Attempt> {
    let listed = dir.join("cgroup.controllers");
    let available = std::fs::read_to_string(&listed).unwrap_or_default();
    if !available.split_whitespace().any(|a| a == c.name()) {
        let parent = dir.parent().unwrap_or(dir).to_owned();
        return Err(Attempt::NotPassedDown {
            controller: c.name(),
            listed,
            available,
            parent,
        });
    }
    let file = dir.join("cgroup.subtree_control");
    std::fs::write(&file, format!("+{}", c.name())).map_err(|source| Attempt::Enable {
        controller: c.name(),
        file,
        source,
    })
}

/// v1 has no `cgroup.kill`: SIGKILL every member until none is left (a member may fork
/// between the read and the kill, hence the loop), at most ~2 s.
pub(super) fn kill_v1(dir: &Path) -> bool {
    for _ in 0..200 {
        let pids = procs(dir);
        if pids.is_empty() {
            return true;
        }
        for p in pids {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(p),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}
