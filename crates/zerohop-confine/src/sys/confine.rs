//! What an instance's child does between `fork` and `execve`, where only async-signal-safe
//! calls are allowed: the plan the parent prepares for it ([`ChildPlan`]), each step of its
//! confinement ([`in_child`]), and how a failed step travels back inside the errno
//! ([`Step`], [`decode`]).

#![allow(unsafe_code)]

use std::ffi::CStr;
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::sync::Arc;

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sys::signal::Signal;
use nix::unistd::{Gid, Pid, Uid};

use super::wrappers::sched_batch;
use crate::seccomp::Filters;

/// The ids a child takes on.
#[derive(Clone, Debug)]
pub(crate) enum ChildIds {
    /// Root: real gid [`REAL_GID`](crate::identity::REAL_GID), effective and saved gid and
    /// every uid the chain's; no supplementary groups. `ipc_ns`: an IPC namespace of its
    /// own (the agent has `CAP_SYS_ADMIN`, see
    /// [`ipc_namespaces`](super::wrappers::ipc_namespaces)).
    Uid {
        uid: u32,
        gid: u32,
        real_gid: u32,
        ipc_ns: bool,
    },
    /// Not root: a new user namespace with these maps (setgroups denied first).
    UserNs { uid_map: Vec<u8>, gid_map: Vec<u8> },
}

/// Everything the child does between `fork` and `execve`, prepared by the parent.
pub(crate) struct ChildPlan {
    /// Descriptors (in the child) of the instance's groups' `cgroup.procs`, one per
    /// hierarchy it is limited or measured in; the child joins every one.
    pub cgroup_procs: Vec<RawFd>,
    pub ids: ChildIds,
    /// The agent's pid: the child checks it is still its parent once the parent-death
    /// signal is armed.
    pub agent_pid: i32,
    /// Descriptors from here up are closed at `execve` (0..=2 and the hand-over set below
    /// stay open).
    pub first_private_fd: u32,
    pub filters: Arc<Filters>,
}

/// Which step of the child's set-up failed; travels to the parent inside the errno of the
/// spawn error (`step * STEP + errno`), since a child after `fork` cannot allocate a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(i32)]
pub(crate) enum Step {
    CgroupJoin = 1,
    Setgroups,
    Setresgid,
    Setresuid,
    Unshare,
    SetgroupsDeny,
    UidMap,
    GidMap,
    Pdeathsig,
    AgentGone,
    NoNewPrivs,
    Dumpable,
    CloseRange,
    Seccomp,
    IpcNamespace,
    Landlock,
}

/// Most cgroups an instance joins: one per hierarchy (the v1 `cpu`, `cpuacct`, `memory`,
/// `pids` and the one it is killed through, or the unified one), with room to spare.
pub(crate) const MAX_CGROUPS: usize = 8;

/// Multiplier of [`Step`] in an encoded errno.
pub(crate) const STEP: i32 = 100_000;

const STEPS: [(Step, &str); 16] = [
    (Step::CgroupJoin, "joining the instance's cgroups"),
    (Step::Setgroups, "dropping supplementary groups"),
    (Step::Setresgid, "setresgid to the chain's gid"),
    (Step::Setresuid, "setresuid to the chain's uid"),
    (Step::Unshare, "unshare(CLONE_NEWUSER)"),
    (Step::SetgroupsDeny, "writing /proc/self/setgroups"),
    (Step::UidMap, "writing /proc/self/uid_map"),
    (Step::GidMap, "writing /proc/self/gid_map"),
    (Step::Pdeathsig, "prctl(PR_SET_PDEATHSIG)"),
    (Step::AgentGone, "checking the agent is still the parent"),
    (Step::NoNewPrivs, "prctl(PR_SET_NO_NEW_PRIVS)"),
    (Step::Dumpable, "prctl(PR_SET_DUMPABLE)"),
    (Step::CloseRange, "close_range(CLOSE_RANGE_CLOEXEC)"),
    (Step::Seccomp, "installing the seccomp filter"),
    (Step::IpcNamespace, "unshare(CLONE_NEWIPC)"),
    (
        Step::Landlock,
        "landlock_restrict_self (scoping signals to the instance)",
    ),
];

/// Splits an encoded spawn errno into the failed step and the OS error.
pub(crate) fn decode(code: i32) -> Option<(Step, &'static str, std::io::Error)> {
    let (step, errno) = (code / STEP, code % STEP);
    STEPS
        .iter()
        .find(|(s, _)| *s as i32 == step)
        .map(|&(s, what)| (s, what, std::io::Error::from_raw_os_error(errno)))
}

fn fail(step: Step, e: Errno) -> std::io::Error {
    std::io::Error::from_raw_os_error(step as i32 * STEP + e as i32)
}

fn write_file(path: &CStr, data: &[u8], step: Step) -> std::io::Result<()> {
    let fd = nix::fcntl::open(
        path,
        OFlag::O_WRONLY | OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .map_err(|e| fail(step, e))?;
    match nix::unistd::write(&fd, data) {
        Ok(n) if n == data.len() => Ok(()),
        Ok(_) => Err(fail(step, Errno::EIO)),
        Err(e) => Err(fail(step, e)),
    }
}

/// Runs in the child after `fork`, after the hand-over descriptors are in place, as the
/// last thing before `execve`. Async-signal-safe: system calls on data the parent prepared,
/// no allocation, no locks.
pub(super) fn in_child(plan: &ChildPlan, scope: Option<BorrowedFd<'_>>) -> std::io::Result<()> {
    // Every group before anything else: limits hold from here on, and what the child does
    // next (and its program, and everything that forks) is accounted to them.
    for &fd in &plan.cgroup_procs {
        // SAFETY: the parent mapped each group's `cgroup.procs` to these numbers for the
        // child (they stay open until execve); borrowed for this one write only.
        let fd = unsafe { BorrowedFd::borrow_raw(fd) };
        nix::unistd::write(fd, b"0").map_err(|e| fail(Step::CgroupJoin, e))?;
    }
    match &plan.ids {
        ChildIds::Uid {
            uid,
            gid,
            real_gid,
            ipc_ns,
        } => {
            nix::unistd::setgroups(&[]).map_err(|e| fail(Step::Setgroups, e))?;
            let (g, rg) = (Gid::from_raw(*gid), Gid::from_raw(*real_gid));
            nix::unistd::setresgid(rg, g, g).map_err(|e| fail(Step::Setresgid, e))?;
            // SysV shared memory, semaphores and message queues, and POSIX message
            // queues, of this instance alone (while it still has CAP_SYS_ADMIN): nothing
            // it makes there outlives it or reaches the next chain given this uid.
            if *ipc_ns {
                nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWIPC)
                    .map_err(|e| fail(Step::IpcNamespace, e))?;
            }
            let u = Uid::from_raw(*uid);
            nix::unistd::setresuid(u, u, u).map_err(|e| fail(Step::Setresuid, e))?;
        }
        ChildIds::UserNs { uid_map, gid_map } => {
            // The IPC namespace belongs to the new user namespace (which grants the right
            // to make it), as above.
            nix::sched::unshare(
                nix::sched::CloneFlags::CLONE_NEWUSER | nix::sched::CloneFlags::CLONE_NEWIPC,
            )
            .map_err(|e| fail(Step::Unshare, e))?;
            // The agent is not dumpable in this mode, and neither is its fork: /proc/self
            // then belongs to root and the maps cannot be written. Dumpable only for the
            // three writes (the one moment another process of the agent's uid could open
            // this child's memory).
            nix::sys::prctl::set_dumpable(true).map_err(|e| fail(Step::Dumpable, e))?;
            let maps = write_file(c"/proc/self/setgroups", b"deny", Step::SetgroupsDeny)
                .and_then(|()| write_file(c"/proc/self/uid_map", uid_map, Step::UidMap))
                .and_then(|()| write_file(c"/proc/self/gid_map", gid_map, Step::GidMap));
            nix::sys::prctl::set_dumpable(false).map_err(|e| fail(Step::Dumpable, e))?;
            maps?;
        }
    }
    // After the last credential change, which would clear it.
    nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(|e| fail(Step::Pdeathsig, e))?;
    if nix::unistd::getppid() != Pid::from_raw(plan.agent_pid) {
        return Err(fail(Step::AgentGone, Errno::ESRCH));
    }
    nix::sys::prctl::set_no_new_privs().map_err(|e| fail(Step::NoNewPrivs, e))?;
    nix::sys::prctl::set_dumpable(false).map_err(|e| fail(Step::Dumpable, e))?;
    if let Some(ruleset) = scope {
        // A Landlock domain of its own (no_new_privs is set, as the kernel requires): from
        // here on this process and what it forks can signal, and connect to abstract
        // sockets of, only themselves; every other instance of the chain (and the agent)
        // is out of reach although it runs under the same uid.
        // SAFETY: a plain system call on a descriptor the spawner owns; no memory passed.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_landlock_restrict_self,
                ruleset.as_raw_fd(),
                0 as libc::c_uint,
            )
        };
        if rc != 0 {
            return Err(fail(Step::Landlock, Errno::last()));
        }
    }
    cloexec_from(plan.first_private_fd)?;
    // Best effort (a host may refuse it; the instance then runs as SCHED_OTHER).
    let _ = sched_batch();
    for program in &plan.filters.programs {
        seccompiler::apply_filter(program).map_err(|_| fail(Step::Seccomp, Errno::last()))?;
    }
    Ok(())
}

/// Marks every descriptor from `first` up close-on-exec.
fn cloexec_from(first: u32) -> std::io::Result<()> {
    // SAFETY: close_range only changes flags of this process's descriptors; no memory is
    // passed.
    let rc = unsafe { libc::close_range(first, u32::MAX, libc::CLOSE_RANGE_CLOEXEC as i32) };
    if rc == 0 {
        return Ok(());
    }
    let err = Errno::last();
    if err != Errno::ENOSYS && err != Errno::EINVAL {
        return Err(fail(Step::CloseRange, err));
    }
    // Kernel < 5.11: one descriptor at a time, up to the limit.
    let (_, max) = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .map_err(|e| fail(Step::CloseRange, e))?;
    for fd in first as i64..(max.min(1 << 20) as i64) {
        // SAFETY: F_SETFD on a number that may or may not be open; EBADF is ignored.
        unsafe { libc::fcntl(fd as i32, libc::F_SETFD, libc::FD_CLOEXEC) };
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    /// Installs the program in a forked child and checks what the kernel answers: the seccomp
    /// module's tests prove the program's logic, this that the kernel takes it.
    #[test]
    fn the_kernel_takes_the_program_and_enforces_it() {
        let filters = crate::seccomp::build(&[]).unwrap();
        // SAFETY: the test harness is multi-threaded, so the child only makes
        // async-signal-safe calls: `apply_filter` is prctl and seccomp on a program built
        // before the fork (no allocation), then getpid, unshare, clone3, clone and _exit.
        match unsafe { nix::unistd::fork() }.unwrap() {
            nix::unistd::ForkResult::Child => {
                let code = (|| {
                    seccompiler::apply_filter(&filters.programs[0]).map_err(|_| 10)?;
                    // SAFETY: plain system calls without memory arguments.
                    unsafe {
                        if libc::getpid() <= 0 {
                            return Err(11);
                        }
                        if libc::syscall(libc::SYS_unshare, libc::CLONE_NEWNS) != -1
                            || *libc::__errno_location() != libc::EPERM
                        {
                            return Err(12);
                        }
                        if libc::syscall(libc::SYS_clone3, 0usize, 0usize) != -1
                            || *libc::__errno_location() != libc::ENOSYS
                        {
                            return Err(13);
                        }
                        let flags = (libc::CLONE_NEWUSER | libc::SIGCHLD) as usize;
                        if libc::syscall(libc::SYS_clone, flags, 0usize, 0usize, 0usize, 0usize)
                            != -1
                            || *libc::__errno_location() != libc::EPERM
                        {
                            return Err(14);
                        }
                    }
                    Ok(())
                })();
                // SAFETY: _exit skips the test harness's atexit handlers.
                unsafe { libc::_exit(code.err().unwrap_or(0)) }
            }
            nix::unistd::ForkResult::Parent { child } => {
                let status = nix::sys::wait::waitpid(child, None).unwrap();
                assert_eq!(status, nix::sys::wait::WaitStatus::Exited(child, 0));
            }
        }
    }
}
