//! The only unsafe code of the agent: what runs in a forked child before `execve` (the
//! instance's confinement, and the reaper), where only async-signal-safe calls are
//! allowed. Everything these functions use is allocated by the parent before the fork;
//! the child only makes system calls on it.

#![allow(unsafe_code)]

use std::ffi::CStr;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::Arc;

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sys::signal::{SigHandler, Signal};
use nix::unistd::{Gid, Pid, Uid};

use super::seccomp::Filters;

/// The ids a child takes on.
#[derive(Clone, Debug)]
pub(crate) enum ChildIds {
    /// Root: real gid [`REAL_GID`](super::identity::REAL_GID), effective and saved gid and
    /// every uid the chain's; no supplementary groups.
    Uid { uid: u32, gid: u32, real_gid: u32 },
    /// Not root: a new user namespace with these maps (setgroups denied first).
    UserNs { uid_map: Vec<u8>, gid_map: Vec<u8> },
}

/// Everything the child does between `fork` and `execve`, prepared by the parent.
pub(crate) struct ChildPlan {
    /// Descriptor (in the child) of the instance cgroup's `cgroup.procs`.
    pub cgroup_procs: Option<RawFd>,
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
}

/// Multiplier of [`Step`] in an encoded errno.
pub(crate) const STEP: i32 = 100_000;

const STEPS: [(Step, &str); 14] = [
    (Step::CgroupJoin, "joining the instance's cgroup"),
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
fn in_child(plan: &ChildPlan) -> std::io::Result<()> {
    if let Some(fd) = plan.cgroup_procs {
        // SAFETY: the parent mapped the cgroup's `cgroup.procs` to this number for the
        // child (it stays open until execve); borrowed for this one write only.
        let fd = unsafe { BorrowedFd::borrow_raw(fd) };
        nix::unistd::write(fd, b"0").map_err(|e| fail(Step::CgroupJoin, e))?;
    }
    match &plan.ids {
        ChildIds::Uid { uid, gid, real_gid } => {
            nix::unistd::setgroups(&[]).map_err(|e| fail(Step::Setgroups, e))?;
            let (g, rg) = (Gid::from_raw(*gid), Gid::from_raw(*real_gid));
            nix::unistd::setresgid(rg, g, g).map_err(|e| fail(Step::Setresgid, e))?;
            let u = Uid::from_raw(*uid);
            nix::unistd::setresuid(u, u, u).map_err(|e| fail(Step::Setresuid, e))?;
        }
        ChildIds::UserNs { uid_map, gid_map } => {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWUSER)
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
    cloexec_from(plan.first_private_fd)?;
    // Best effort (a host may refuse it; the instance then runs as SCHED_OTHER).
    let _ = sched_batch();
    for program in &plan.filters.programs {
        seccompiler::apply_filter(program).map_err(|_| fail(Step::Seccomp, Errno::last()))?;
    }
    Ok(())
}

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

/// Arms `cmd` to run [`in_child`] with `plan` just before `execve`. Call it after every
/// other `pre_exec` user (the descriptor mappings), so the seccomp filter comes last.
pub(crate) fn confine(cmd: &mut tokio::process::Command, plan: ChildPlan) {
    // SAFETY: the closure is async-signal-safe (see `in_child`): it only reads `plan`,
    // built before the fork, and makes system calls.
    unsafe {
        cmd.pre_exec(move || in_child(&plan));
    }
}

/// What the reaper cleans up besides process groups: the chain's cgroup folder.
pub(crate) struct ReaperCgroup {
    /// The chain's v2 `cgroup.kill` (v1 has none).
    pub kill: Option<OwnedFd>,
    /// The chain's cgroup folder (`O_DIRECTORY`).
    pub dir: OwnedFd,
    /// Its parent folder, and the chain folder's name in it.
    pub parent: OwnedFd,
    pub name: std::ffi::CString,
}

/// Starts the reaper: a process, detached from the agent (double fork, so it is nobody's
/// child), that reads `i32` process group ids from `rx` (positive: an instance's group,
/// negative: that group is gone) and, once `rx` reports end of file because the agent is
/// gone, SIGKILLs every group still listed, kills the chain's v2 cgroup, and removes the
/// chain's cgroup folders. Returns once the intermediate child is reaped.
pub(crate) fn spawn_reaper(rx: OwnedFd, cgroup: Option<ReaperCgroup>) -> std::io::Result<()> {
    let rx_raw = rx.as_raw_fd();
    let raw = cgroup.as_ref().map(|c| {
        (
            c.kill.as_ref().map(AsRawFd::as_raw_fd),
            c.dir.as_raw_fd(),
            c.parent.as_raw_fd(),
            c.name.as_c_str(),
        )
    });
    // SAFETY: the child only makes async-signal-safe system calls (fork, dup2, close_range,
    // sigaction, prctl, read, kill, write, getdents64, unlinkat, nanosleep, _exit) on values
    // computed before the fork.
    match unsafe { nix::unistd::fork() }.map_err(std::io::Error::from)? {
        nix::unistd::ForkResult::Parent { child } => {
            drop(rx);
            drop(cgroup);
            nix::sys::wait::waitpid(child, None).map_err(std::io::Error::from)?;
            Ok(())
        }
        nix::unistd::ForkResult::Child => {
            // SAFETY: as above.
            if let Ok(nix::unistd::ForkResult::Child) = unsafe { nix::unistd::fork() } {
                reaper_main(rx_raw, raw);
            }
            // SAFETY: _exit is async-signal-safe and skips the parent's atexit handlers.
            unsafe { libc::_exit(0) }
        }
    }
}

/// Descriptor numbers in the reaper.
const R_PIPE: RawFd = 0;
const R_KILL: RawFd = 1;
const R_DIR: RawFd = 3;
const R_PARENT: RawFd = 4;

type RawCgroup<'a> = (Option<RawFd>, RawFd, RawFd, &'a CStr);

fn reaper_main(rx: RawFd, cgroup: Option<RawCgroup<'_>>) -> ! {
    // SAFETY: fcntl, dup2, close and close_range on this process's own descriptor table.
    // Every source is first copied above 100, so moving them down to the R_* numbers can
    // never overwrite a source not yet moved; afterwards only the R_* numbers stay open.
    unsafe {
        let high = |fd: RawFd| libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 100);
        let rx = high(rx);
        let cgroup = cgroup.map(|(kill, dir, parent, _)| (kill.map(high), high(dir), high(parent)));
        libc::dup2(rx, R_PIPE);
        let mut keep_until = R_PIPE;
        libc::close(1);
        libc::close(2);
        if let Some((kill, dir, parent)) = cgroup {
            if let Some(k) = kill {
                libc::dup2(k, R_KILL);
            }
            libc::dup2(dir, R_DIR);
            libc::dup2(parent, R_PARENT);
            keep_until = R_PARENT;
        }
        libc::close_range(keep_until as u32 + 1, u32::MAX, 0);
    }
    // Ctrl-C reaches the whole foreground group; the reaper leaves only at end of file.
    for sig in [
        Signal::SIGINT,
        Signal::SIGTERM,
        Signal::SIGHUP,
        Signal::SIGPIPE,
    ] {
        // SAFETY: SIG_IGN installs no handler code.
        let _ = unsafe { nix::sys::signal::signal(sig, SigHandler::SigIgn) };
    }
    let _ = nix::sys::prctl::set_name(c"zerohop-reaper");
    let mut groups = [0i32; 4096];
    // SAFETY: R_PIPE is the pipe, open for this process's lifetime.
    let input = unsafe { BorrowedFd::borrow_raw(R_PIPE) };
    let mut buf = [0u8; 4];
    let mut have = 0;
    loop {
        match nix::unistd::read(input, &mut buf[have..]) {
            Ok(0) => break,
            Ok(n) => have += n,
            Err(Errno::EINTR) => continue,
            Err(_) => break,
        }
        if have < 4 {
            continue;
        }
        have = 0;
        let v = i32::from_ne_bytes(buf);
        if v > 0 {
            if let Some(free) = groups.iter_mut().find(|g| **g == 0) {
                *free = v;
            }
        } else if let Some(g) = groups.iter_mut().find(|g| **g == -v) {
            *g = 0;
        }
    }
    for &g in groups.iter().filter(|&&g| g > 0) {
        let _ = nix::sys::signal::killpg(Pid::from_raw(g), Signal::SIGKILL);
    }
    if let Some((kill, _, _, name)) = cgroup {
        if kill.is_some() {
            // SAFETY: R_KILL is the cgroup.kill file, open for this process's lifetime.
            let out = unsafe { BorrowedFd::borrow_raw(R_KILL) };
            let _ = nix::unistd::write(out, b"1");
        }
        remove_cgroups(name);
    }
    // SAFETY: see above.
    unsafe { libc::_exit(0) }
}

/// Removes every folder in R_DIR, then R_DIR itself (`name` in R_PARENT), retrying for
/// about two seconds while killed members finish exiting.
fn remove_cgroups(name: &CStr) {
    let mut buf = [0u8; 4096];
    for _ in 0..100 {
        // SAFETY: lseek, getdents64 into a local buffer of the given length, unlinkat of
        // names inside that buffer (NUL-terminated by the kernel), nanosleep of a local.
        unsafe {
            libc::lseek(R_DIR, 0, libc::SEEK_SET);
            loop {
                let n = libc::syscall(libc::SYS_getdents64, R_DIR, buf.as_mut_ptr(), buf.len());
                if n <= 0 {
                    break;
                }
                let mut at = 0usize;
                while at + 19 < n as usize {
                    // struct linux_dirent64 { u64 ino; i64 off; u16 reclen; u8 type; char name[]; }
                    let reclen = u16::from_ne_bytes([buf[at + 16], buf[at + 17]]) as usize;
                    let kind = buf[at + 18];
                    let name_ptr = buf.as_ptr().add(at + 19).cast::<libc::c_char>();
                    let entry = CStr::from_ptr(name_ptr).to_bytes();
                    if kind == libc::DT_DIR && entry != b"." && entry != b".." {
                        libc::unlinkat(R_DIR, name_ptr, libc::AT_REMOVEDIR);
                    }
                    if reclen == 0 {
                        break;
                    }
                    at += reclen;
                }
            }
            if libc::unlinkat(R_PARENT, name.as_ptr(), libc::AT_REMOVEDIR) == 0
                || Errno::last() == Errno::ENOENT
            {
                return;
            }
            let pause = libc::timespec {
                tv_sec: 0,
                tv_nsec: 20_000_000,
            };
            libc::nanosleep(&pause, std::ptr::null_mut());
        }
    }
}
