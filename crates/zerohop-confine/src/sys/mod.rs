//! The only unsafe code of the agent: what runs in a forked child before `execve` (the
//! instance's confinement, and the reaper), where only async-signal-safe calls are
//! allowed. Everything these functions use is allocated by the parent before the fork;
//! the child only makes system calls on it.
//!
//! Each file allows `unsafe` for itself, and says why at each block. The files, each one
//! job, in the order they use each other (a file uses only those above it): `wrappers`
//! (small system call wrappers the rest of the crate uses: scheduling, Landlock, SysV IPC,
//! pidfds, descriptors), `confine` (what an instance's child does between `fork` and
//! `execve`, and how a failed step travels back in the errno), `spawn` (the spawner's fork,
//! and its fork/exec of each instance), `reaper` (the reaper's process).

mod confine;
mod reaper;
mod spawn;
mod wrappers;

pub(crate) use confine::{decode, ChildIds, ChildPlan, Step, MAX_CGROUPS};
// Only the crate's tests encode a step's errno themselves.
#[cfg(test)]
pub(crate) use confine::STEP;
pub(crate) use reaper::{spawn_reaper, ReaperCgroup, ReaperGroup};
pub(crate) use spawn::{fork_instance, fork_spawner, Forked, Launch};
pub use wrappers::async_fd;
pub(crate) use wrappers::{
    exit_now, ipc_namespaces, ipc_rmid, landlock_abi, own_received, pidfd_kill, pidfd_open,
    sched_batch, scope_ruleset, Ipc, LANDLOCK_SCOPE_ABI,
};
