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

/// Pins every thread of this process to `cpu` (threads started later inherit it). A thread
/// that starts while the list is read may be missed: the runtime calls this before it
/// starts its own.
pub(crate) fn pin_process(cpu: u16) -> std::io::Result<()> {
    let cpu = usize::from(cpu);
    if cpu >= 8 * std::mem::size_of::<libc::cpu_set_t>() {
        return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
    }
    // SAFETY: cpu_set_t is plain bits; all zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `cpu` is below the set's size in bits (checked above).
    unsafe { libc::CPU_SET(cpu, &mut set) };
    for task in std::fs::read_dir("/proc/self/task")? {
        let Some(tid) = task?
            .file_name()
            .to_str()
            .and_then(|t| t.parse::<i32>().ok())
        else {
            continue;
        };
        // SAFETY: `set` is a valid cpu_set_t of the size passed; the kernel only reads it.
        let r = unsafe { libc::sched_setaffinity(tid, std::mem::size_of_val(&set), &set) };
        if r != 0 {
            let e = std::io::Error::last_os_error();
            // A thread that ended since the list was read.
            if e.raw_os_error() != Some(libc::ESRCH) {
                return Err(e);
            }
        }
    }
    Ok(())
}
