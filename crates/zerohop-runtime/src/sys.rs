//! The few syscalls of the runtime.

use std::os::fd::{FromRawFd, OwnedFd};

/// Asks the kernel to SIGKILL this process when its parent (the agent) dies, then checks the
/// parent is still the agent (closing the race of a parent that died before the prctl).
pub(crate) fn die_with_parent(agent_pid: u32) -> bool {
    // SAFETY: prctl with integer arguments only.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) };
    // SAFETY: getppid has no preconditions.
    let ppid = unsafe { libc::getppid() };
    ppid as u32 == agent_pid
}

/// Takes ownership of inherited descriptor `raw`, if it is open.
pub(crate) fn take_inherited(raw: i32) -> Option<OwnedFd> {
    // SAFETY: F_GETFD only inspects the descriptor table.
    if unsafe { libc::fcntl(raw, libc::F_GETFD) } < 0 {
        return None;
    }
    // SAFETY: the agent mapped this descriptor into our process for us to own; it is taken
    // exactly once, at start-up, before anything else could claim the number.
    Some(unsafe { OwnedFd::from_raw_fd(raw) })
}
