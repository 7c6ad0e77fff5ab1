//! A cgroup per instance, where the host lets us make one, and the function's resource
//! limits in it.
//!
//! Groups are only ever created beneath the cgroup the agent itself is in, in each
//! hierarchy (from `/proc/self/cgroup` and `/proc/self/mountinfo`, read with `procfs`):
//! `<own>/zerohop-<agent pid>-<chain>/<function>-<party>-<n>`. Only folders created here
//! are ever written to, removed, or have controllers enabled; no process is moved but the
//! instance, which joins its groups itself before `execve` (writing `0` to each
//! `cgroup.procs` the agent opened), so nothing it forks can start outside them, and its
//! limits are in force before its program runs.
//!
//! Two jobs, each detected once per chain at run time:
//!
//! * **Killing** an instance as a whole, through the chain's first group: cgroup v2 (the
//!   unified hierarchy, also the `unified` mount of a hybrid host) with `cgroup.kill`,
//!   atomic; else a v1 hierarchy (`pids`, else `freezer`, else `cpu`), by signalling
//!   everything in `cgroup.procs` until it is empty (bounded).
//! * **Limits and usage**, per controller (`cpu`, `memory`, `pids`, and `cpuacct` for CPU
//!   usage in v1): in the unified hierarchy when the controller is available there
//!   (listed in the chain group's `cgroup.controllers`, which this then enables in the
//!   chain group's own `cgroup.subtree_control`), else in the v1 hierarchy that has the
//!   controller mounted (`CgroupMode::Auto` only; `V2` and `V1` keep to their version). A
//!   hybrid host thus kills through v2 and limits through v1. What each limit writes is in
//!   [`limits`](super::limits).
//!
//! When nothing works (not root and nothing delegated), an instance without limits relies
//! on its process group alone (logged at debug level); an instance with limits is not
//! started, and the error names the limit, the controller, and why it is not available.
//!
//! The files, each one job, in the order they use each other (a file uses only those above
//! it): `folder` (a group folder on disk: its child groups, its members, removing it),
//! `error` (why a group could not be made), `version` (what tells v1 from v2: the mode,
//! passing a controller down, killing without `cgroup.kill`), `layout` (where the agent
//! sits in each mounted hierarchy), `instance` (an instance's groups: killing them, reading
//! its usage), `chain` (the chain's groups, and making an instance's groups beneath them);
//! `tests` checks them together.

mod chain;
mod error;
mod folder;
mod instance;
mod layout;
mod version;

#[cfg(test)]
mod tests;

pub(crate) use chain::ChainCgroup;
pub(crate) use error::CgroupError;
pub use instance::{InstanceCgroup, UsageProbe};
pub use version::CgroupMode;
