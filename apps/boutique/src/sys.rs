//! The two system calls the HTTP deployment needs that std has no safe API for: asking for
//! a signal when the parent dies, and sending SIGTERM.

#![allow(unsafe_code)]

/// Asks for SIGKILL when the parent process dies, then checks that the parent is still
/// `parent` (it may have died before the request took effect). `false`: it is gone, exit.
pub fn die_with_parent(parent: u32) -> bool {
    // SAFETY: PR_SET_PDEATHSIG takes a signal number in an integer argument; no memory is
    // passed and the call cannot affect memory safety.
    let r = unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) };
    r == 0 && std::os::unix::process::parent_id() == parent
}

/// Sends SIGTERM to `pid` (a child not yet reaped, so the pid is still its own); a process
/// already gone is no error.
pub fn terminate(pid: u32) {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return;
    };
    // SAFETY: kill takes a pid and a signal number; no memory is passed.
    unsafe { libc::kill(pid, libc::SIGTERM) };
}
