//! The small system call wrappers, each one call (or one question about this process):
//! `SCHED_BATCH`, Landlock's ABI and scope ruleset, whether instances get IPC namespaces,
//! removing SysV IPC objects, owning a received descriptor, `_exit`, registering a
//! descriptor with the runtime, and pidfds.

#![allow(unsafe_code)]

use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use nix::errno::Errno;
use nix::sys::signal::Signal;

/// Puts the calling thread (in a fresh child: the process) under `SCHED_BATCH`: like
/// `SCHED_OTHER`, but a woken batch task does not preempt the one running. On a core shared
/// by the gateway and the instances of a chain, a woken instance then waits until its waker
/// blocks, and each process takes a whole burst of descriptors per turn instead of one per
/// context switch. Any process may choose it for itself (no privilege).
pub(crate) fn sched_batch() -> std::io::Result<()> {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: a plain system call on the calling thread with a valid parameter;
    // async-signal-safe.
    let rc = unsafe { libc::sched_setscheduler(0, libc::SCHED_BATCH, &param) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Landlock's `LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET` and `LANDLOCK_SCOPE_SIGNAL` (ABI 6,
/// Linux 6.12).
const LANDLOCK_SCOPES: u64 = 1 | 2;
/// The first Landlock ABI with scopes.
pub(crate) const LANDLOCK_SCOPE_ABI: i64 = 6;

/// `struct landlock_ruleset_attr` (ABI 6): no access rights handled, only scopes.
#[repr(C)]
struct LandlockRulesetAttr {
    handled_access_fs: u64,
    handled_access_net: u64,
    scoped: u64,
}

/// `CAP_SYS_ADMIN`, as bit 21 of a `CapEff:` line of `/proc/self/status`.
const CAP_SYS_ADMIN: u32 = 21;

/// Whether an effective capability set, as `/proc/PID/status` shows it, holds
/// `CAP_SYS_ADMIN` (what `unshare(CLONE_NEWIPC)` needs).
fn has_sys_admin(status: &str) -> bool {
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << CAP_SYS_ADMIN) != 0)
}

/// Whether this process may give each instance an IPC namespace of its own: as root with
/// `CAP_SYS_ADMIN`. A container that grants only what the DaemonSet adds (no
/// `CAP_SYS_ADMIN`) may not; its instances then share the agent's IPC namespace. Asked once.
pub(crate) fn ipc_namespaces() -> bool {
    static ANSWER: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ANSWER.get_or_init(|| {
        std::fs::read_to_string("/proc/self/status").is_ok_and(|s| has_sys_admin(&s))
    })
}

/// The kernel's Landlock ABI version, or why there is none (`ENOSYS`: not built in;
/// `EOPNOTSUPP`: not enabled at boot).
pub(crate) fn landlock_abi() -> Result<i64, Errno> {
    // SAFETY: the version query passes no memory (NULL, size 0, LANDLOCK_CREATE_RULESET_VERSION).
    let rc = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<LandlockRulesetAttr>(),
            0usize,
            1 as libc::c_uint,
        )
    };
    if rc < 0 {
        Err(Errno::last())
    } else {
        Ok(rc)
    }
}

/// A Landlock ruleset that handles no access right and scopes signals and abstract Unix
/// sockets: each process that enforces it gets a domain of its own (one per call, so two
/// instances enforcing the same ruleset are in sibling domains and cannot reach each other).
/// Close-on-exec, as the kernel makes every ruleset descriptor.
pub(crate) fn scope_ruleset() -> Result<OwnedFd, Errno> {
    let attr = LandlockRulesetAttr {
        handled_access_fs: 0,
        handled_access_net: 0,
        scoped: LANDLOCK_SCOPES,
    };
    // SAFETY: `attr` is a live, initialised struct of the size passed; the kernel reads it
    // once.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            &attr as *const LandlockRulesetAttr,
            std::mem::size_of::<LandlockRulesetAttr>(),
            0 as libc::c_uint,
        )
    };
    if rc < 0 {
        return Err(Errno::last());
    }
    // SAFETY: a descriptor the kernel just returned, owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(rc as RawFd) })
}

/// A kind of SysV IPC object.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Ipc {
    Shm,
    Msg,
    Sem,
}

/// Removes SysV IPC object `id` of kind `kind` (`IPC_RMID`).
pub(crate) fn ipc_rmid(kind: Ipc, id: i32) -> std::io::Result<()> {
    // SAFETY: IPC_RMID with a null buffer (shmctl, msgctl) or no fourth argument (semctl)
    // reads and writes no memory.
    let rc = unsafe {
        match kind {
            Ipc::Shm => libc::shmctl(id, libc::IPC_RMID, std::ptr::null_mut()),
            Ipc::Msg => libc::msgctl(id, libc::IPC_RMID, std::ptr::null_mut()),
            Ipc::Sem => libc::semctl(id, 0, libc::IPC_RMID),
        }
    };
    if rc < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Takes ownership of a descriptor the kernel just installed (received with `SCM_RIGHTS`).
pub(crate) fn own_received(fd: RawFd) -> OwnedFd {
    // SAFETY: a freshly received descriptor belongs to nothing else in this process.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

/// Ends the spawner at once.
pub(crate) fn exit_now(code: i32) -> ! {
    // SAFETY: _exit skips the atexit handlers inherited from the agent.
    unsafe { libc::_exit(code) }
}

/// Registers `fd` with the runtime's reactor, for readability.
pub fn async_fd(fd: OwnedFd) -> std::io::Result<tokio::io::unix::AsyncFd<OwnedFd>> {
    // SAFETY: an OwnedFd keeps its descriptor open, and returns the same number, until it
    // is dropped, which the AsyncFd does only when it is dropped itself.
    Ok(unsafe {
        tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE)
    }?)
}

/// A pidfd of `pid`, a child of this process.
pub(crate) fn pidfd_open(pid: u32) -> std::io::Result<OwnedFd> {
    // SAFETY: plain system call; the result is a new descriptor owned by nobody else.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: as above.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Sends `sig` to the process of `pidfd` (which cannot have been reused).
pub(crate) fn pidfd_kill(pidfd: BorrowedFd<'_>, sig: Signal) -> std::io::Result<()> {
    // SAFETY: plain system call on a valid descriptor, no siginfo.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            sig as libc::c_int,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sys_admin_is_read_from_the_effective_set_only() {
        let root = "Name:\tx\nCapInh:\t0000000000000000\nCapPrm:\t000001ffffffffff\n\
                    CapEff:\t000001ffffffffff\n";
        assert!(has_sys_admin(root));
        // The DaemonSet's set: SETUID, SETGID, KILL, NET_ADMIN, PERFMON, BPF.
        let daemonset = "CapPrm:\t000001ffffffffff\nCapEff:\t000000c0000010e0\n";
        assert!(!has_sys_admin(daemonset));
        assert!(!has_sys_admin("CapEff:\tnonsense\n"));
        assert!(!has_sys_admin(""));
    }
}
