//! The only unsafe code of the agent: what runs in a forked child before `execve` (the
//! instance's confinement, and the reaper), where only async-signal-safe calls are
//! allowed. Everything these functions use is allocated by the parent before the fork;
//! the child only makes system calls on it.

#![allow(unsafe_code)]

use std::ffi::{CStr, CString};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
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
    /// every uid the chain's; no supplementary groups. `ipc_ns`: an IPC namespace of its
    /// own (the agent has `CAP_SYS_ADMIN`, see [`ipc_namespaces`]).
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
fn in_child(plan: &ChildPlan, scope: Option<BorrowedFd<'_>>) -> std::io::Result<()> {
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

/// One instance to start, as the spawner holds it: everything decoded and allocated
/// before the fork, so the child only makes system calls.
pub(crate) struct Launch {
    /// What to `execve` (a path, or `/proc/self/fd/N` of a descriptor in `fds`).
    pub program: CString,
    pub argv: Vec<CString>,
    pub env: Vec<CString>,
    /// Placed at `FIRST_FD`, `FIRST_FD + 1`, ... in the child, in this order.
    pub fds: Vec<OwnedFd>,
    /// Placed at 1 and 2 (standard output and error) in the child; `None`: the spawner's
    /// own (the agent's) are inherited.
    pub stdio: Option<[OwnedFd; 2]>,
    pub plan: ChildPlan,
}

/// Forks the spawner: a child of the calling process that keeps `sock` (moved to
/// descriptor 3, every other descriptor but 0-2 closed) and runs `main` on it, never
/// returning. Returns the spawner's pid.
///
/// The caller may have other threads. The spawner only allocates (glibc's `fork` leaves
/// `malloc` usable in the child) and makes system calls: it takes no lock another thread
/// could have held at the fork (no stdout, no environment, no logging).
pub(crate) fn fork_spawner(sock: OwnedFd, main: fn(OwnedFd) -> !) -> std::io::Result<Pid> {
    let raw = sock.as_raw_fd();
    let parent = std::process::id() as i32;
    // SAFETY: see above: the child runs only system calls and allocations before `main`,
    // and `main` keeps to the same rule.
    match unsafe { nix::unistd::fork() }.map_err(std::io::Error::from)? {
        nix::unistd::ForkResult::Parent { child } => {
            drop(sock);
            Ok(child)
        }
        nix::unistd::ForkResult::Child => {
            // SAFETY: descriptor moves on this process's own table: the socket goes to 3
            // (dup2 clears its close-on-exec, restored below), everything above is closed.
            unsafe {
                if raw != SPAWNER_SOCK {
                    libc::dup2(raw, SPAWNER_SOCK);
                }
                libc::fcntl(SPAWNER_SOCK, libc::F_SETFD, libc::FD_CLOEXEC);
                libc::close_range(SPAWNER_SOCK as u32 + 1, u32::MAX, 0);
            }
            let _ = nix::sys::prctl::set_pdeathsig(Signal::SIGKILL);
            if nix::unistd::getppid().as_raw() != parent {
                // SAFETY: _exit skips the parent's atexit handlers.
                unsafe { libc::_exit(0) }
            }
            // Ctrl-C reaches the whole foreground group; the agent decides when the spawner
            // goes (by closing the socket). Instances get default dispositions back.
            for sig in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
                // SAFETY: SIG_IGN installs no handler code.
                let _ = unsafe { nix::sys::signal::signal(sig, SigHandler::SigIgn) };
            }
            let _ = nix::sys::prctl::set_name(c"zerohop-spawner");
            // SAFETY: SPAWNER_SOCK was just placed and is owned by nothing else here.
            main(unsafe { OwnedFd::from_raw_fd(SPAWNER_SOCK) })
        }
    }
}

/// The spawner's socket to the agent.
const SPAWNER_SOCK: RawFd = 3;

/// Starts `l` as a child of the spawner's parent (the agent: `CLONE_PARENT`), in a process
/// group of its own, confined by `l.plan`. Returns its pid once it has called `execve`, or
/// the encoded error of the step that failed (the child is then exiting, and its parent
/// must reap it: the pid comes with the error).
pub(crate) fn launch(
    l: &Launch,
    devnull: BorrowedFd<'_>,
    scope: Option<BorrowedFd<'_>>,
) -> Result<u32, (u32, i32)> {
    let argv: Vec<*const libc::c_char> = l
        .argv
        .iter()
        .map(|a| a.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect();
    let envp: Vec<*const libc::c_char> = l
        .env
        .iter()
        .map(|a| a.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect();
    let raw: Vec<RawFd> = l.fds.iter().map(AsRawFd::as_raw_fd).collect();
    let mut high = vec![0 as RawFd; raw.len()];
    let stdio = l
        .stdio
        .as_ref()
        .map(|s| s.each_ref().map(AsRawFd::as_raw_fd));
    let (err_rx, err_tx) = match nix::unistd::pipe2(OFlag::O_CLOEXEC) {
        Ok(p) => p,
        Err(e) => return Err((0, e as i32)),
    };
    // SAFETY: a raw clone without a new stack is a fork (the spawner is single-threaded, so
    // the child is a complete copy); CLONE_PARENT makes the agent its parent.
    let pid = unsafe {
        libc::syscall(
            libc::SYS_clone,
            (libc::CLONE_PARENT | libc::SIGCHLD) as libc::c_ulong,
            0usize,
            0usize,
            0usize,
            0usize,
        )
    };
    if pid < 0 {
        return Err((0, Errno::last() as i32));
    }
    if pid == 0 {
        drop(err_rx);
        let mut fd = err_tx.as_raw_fd();
        let code = match launch_child(
            l, &raw, &mut high, stdio, &mut fd, devnull, scope, &argv, &envp,
        ) {
            Err(e) => e.raw_os_error().unwrap_or(libc::EIO),
            Ok(never) => match never {},
        };
        // SAFETY: write of a local to the pipe; _exit skips every atexit handler.
        unsafe {
            libc::write(fd, (&code as *const i32).cast(), 4);
            libc::_exit(127)
        }
    }
    drop(err_tx);
    let mut buf = [0u8; 4];
    let mut have = 0;
    // End of file: the child's `execve` closed the pipe (close-on-exec), so it succeeded.
    while have < 4 {
        match nix::unistd::read(&err_rx, &mut buf[have..]) {
            Ok(0) => break,
            Ok(n) => have += n,
            Err(Errno::EINTR) => continue,
            Err(e) => return Err((pid as u32, e as i32)),
        }
    }
    if have == 4 {
        return Err((pid as u32, i32::from_ne_bytes(buf)));
    }
    Ok(pid as u32)
}

/// The child's side of [`launch`]; returns only on failure.
#[allow(clippy::too_many_arguments)]
fn launch_child(
    l: &Launch,
    raw: &[RawFd],
    high: &mut [RawFd],
    stdio: Option<[RawFd; 2]>,
    err: &mut RawFd,
    devnull: BorrowedFd<'_>,
    scope: Option<BorrowedFd<'_>>,
    argv: &[*const libc::c_char],
    envp: &[*const libc::c_char],
) -> std::io::Result<std::convert::Infallible> {
    let first = zerohop_spec::handover::FIRST_FD;
    let above = first + raw.len() as RawFd;
    let mut scope_high: RawFd = -1;
    // SAFETY: descriptor moves on this child's own table. The error pipe, the Landlock
    // ruleset and every source (the output pipes too) are first copied above the target range, so placing one can
    // never overwrite another not yet placed (or the pipe); /dev/null goes to 0 before
    // anything is placed on 1 or 2, where it could be if the agent started without them.
    // dup2 clears close-on-exec on the placed copies only; the received originals keep it.
    unsafe {
        let e = libc::fcntl(*err, libc::F_DUPFD_CLOEXEC, above);
        if e < 0 {
            return Err(std::io::Error::last_os_error());
        }
        *err = e;
        if let Some(r) = scope {
            let h = libc::fcntl(r.as_raw_fd(), libc::F_DUPFD_CLOEXEC, above);
            if h < 0 {
                return Err(std::io::Error::last_os_error());
            }
            scope_high = h;
        }
        let mut stdio_high = [-1 as RawFd; 2];
        if let Some(out) = stdio {
            for (h, fd) in stdio_high.iter_mut().zip(out) {
                *h = libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, above);
                if *h < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
        }
        for (h, &fd) in high.iter_mut().zip(raw) {
            *h = libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, above);
            if *h < 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        if libc::dup2(devnull.as_raw_fd(), 0) < 0 {
            return Err(std::io::Error::last_os_error());
        }
        if stdio.is_some() {
            for (target, h) in [1, 2].into_iter().zip(stdio_high) {
                if libc::dup2(h, target) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
        }
        for (i, &h) in high.iter().enumerate() {
            if libc::dup2(h, first + i as RawFd) < 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
    }
    // A session of its own (which makes it the leader of a process group of its own too,
    // pgid = pid): no controlling terminal, so under a foreground `zerohop up` it cannot open
    // `/dev/tty` to read the operator's keystrokes or push input into the shell.
    nix::unistd::setsid()?;
    // Default dispositions (ignored signals would stay ignored across execve) and an empty
    // mask, as any freshly started program expects.
    for sig in Signal::iterator() {
        if sig != Signal::SIGKILL && sig != Signal::SIGSTOP {
            // SAFETY: SIG_DFL installs no handler code.
            let _ = unsafe { nix::sys::signal::signal(sig, SigHandler::SigDfl) };
        }
    }
    nix::sys::signal::sigprocmask(
        nix::sys::signal::SigmaskHow::SIG_SETMASK,
        Some(&nix::sys::signal::SigSet::empty()),
        None,
    )?;
    // SAFETY: `scope_high` is the copy made above (open until execve closes it), or -1.
    let scope = (scope_high >= 0).then(|| unsafe { BorrowedFd::borrow_raw(scope_high) });
    in_child(&l.plan, scope)?;
    // SAFETY: program, argv and envp are NUL-terminated strings and NULL-terminated arrays
    // of them, alive until execve (which only returns on failure).
    unsafe { libc::execve(l.program.as_ptr(), argv.as_ptr(), envp.as_ptr()) };
    Err(std::io::Error::last_os_error())
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

/// One of the chain's cgroup folders, for the reaper to remove.
pub(crate) struct ReaperGroup {
    /// The folder (`O_DIRECTORY`).
    pub dir: OwnedFd,
    /// Its parent folder, and the folder's name in it.
    pub parent: OwnedFd,
    pub name: std::ffi::CString,
}

/// What the reaper cleans up besides process groups: the chain's cgroup folders.
pub(crate) struct ReaperCgroup {
    /// The chain's v2 `cgroup.kill` (v1 has none).
    pub kill: Option<OwnedFd>,
    /// The chain's folders, one per hierarchy (the first [`MAX_CGROUPS`] are removed).
    pub groups: Vec<ReaperGroup>,
}

/// Starts the reaper: a process, detached from the agent (double fork, so it is nobody's
/// child), that reads `i32` process group ids from `rx` (positive: an instance's group,
/// negative: that group is gone) and, once `rx` reports end of file because the agent is
/// gone, SIGKILLs every group still listed, kills the chain's v2 cgroup, and removes the
/// chain's cgroup folders. Returns once the intermediate child is reaped.
pub(crate) fn spawn_reaper(rx: OwnedFd, cgroup: Option<ReaperCgroup>) -> std::io::Result<()> {
    let rx_raw = rx.as_raw_fd();
    let kill = cgroup
        .as_ref()
        .and_then(|c| c.kill.as_ref().map(AsRawFd::as_raw_fd));
    let cgroups: Vec<RawGroup<'_>> = cgroup
        .iter()
        .flat_map(|c| &c.groups)
        .take(MAX_CGROUPS)
        .map(|g| (g.dir.as_raw_fd(), g.parent.as_raw_fd(), g.name.as_c_str()))
        .collect();
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
                reaper_main(rx_raw, kill, &cgroups);
            }
            // SAFETY: _exit is async-signal-safe and skips the parent's atexit handlers.
            unsafe { libc::_exit(0) }
        }
    }
}

/// Descriptor numbers in the reaper.
const R_PIPE: RawFd = 0;
const R_KILL: RawFd = 1;
/// Group `i`'s folder is at `R_GROUPS + 2 * i`, its parent right above.
const R_GROUPS: RawFd = 3;

fn r_dir(i: usize) -> RawFd {
    R_GROUPS + 2 * i as RawFd
}

fn r_parent(i: usize) -> RawFd {
    r_dir(i) + 1
}

/// A chain cgroup folder, its parent folder, and its name in the parent.
type RawGroup<'a> = (RawFd, RawFd, &'a CStr);

/// `cgroups` holds at most [`MAX_CGROUPS`]; it and the names it points to were made before
/// the fork, so nothing here allocates.
fn reaper_main(rx: RawFd, kill: Option<RawFd>, cgroups: &[RawGroup<'_>]) -> ! {
    // SAFETY: fcntl, dup2, close and close_range on this process's own descriptor table.
    // Every source is first copied above 100 (the R_* numbers of MAX_CGROUPS groups end
    // far below), so moving them down to the R_* numbers can never overwrite a source not
    // yet moved; afterwards only the R_* numbers stay open.
    unsafe {
        let high = |fd: RawFd| libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 100);
        let rx = high(rx);
        let kill = kill.map(high);
        let mut moved = [(-1 as RawFd, -1 as RawFd); MAX_CGROUPS];
        for (m, &(dir, parent, _)) in moved.iter_mut().zip(cgroups) {
            *m = (high(dir), high(parent));
        }
        libc::dup2(rx, R_PIPE);
        let mut keep_until = R_PIPE;
        libc::close(1);
        libc::close(2);
        if let Some(k) = kill {
            libc::dup2(k, R_KILL);
            keep_until = R_KILL;
        }
        for (i, &(dir, parent)) in moved.iter().take(cgroups.len()).enumerate() {
            libc::dup2(dir, r_dir(i));
            libc::dup2(parent, r_parent(i));
            keep_until = r_parent(i);
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
    if kill.is_some() {
        // SAFETY: R_KILL is the cgroup.kill file, open for this process's lifetime.
        let out = unsafe { BorrowedFd::borrow_raw(R_KILL) };
        let _ = nix::unistd::write(out, b"1");
    }
    for (i, &(_, _, name)) in cgroups.iter().enumerate() {
        remove_cgroups(r_dir(i), r_parent(i), name);
    }
    // SAFETY: see above.
    unsafe { libc::_exit(0) }
}

/// Removes every folder in `dir`, then `dir` itself (`name` in `parent`), retrying for
/// about two seconds while killed members finish exiting.
fn remove_cgroups(dir: RawFd, parent: RawFd, name: &CStr) {
    let mut buf = [0u8; 4096];
    for _ in 0..100 {
        // SAFETY: lseek, getdents64 into a local buffer of the given length, unlinkat of
        // names inside that buffer (NUL-terminated by the kernel), nanosleep of a local.
        unsafe {
            libc::lseek(dir, 0, libc::SEEK_SET);
            loop {
                let n = libc::syscall(libc::SYS_getdents64, dir, buf.as_mut_ptr(), buf.len());
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
                        libc::unlinkat(dir, name_ptr, libc::AT_REMOVEDIR);
                    }
                    if reclen == 0 {
                        break;
                    }
                    at += reclen;
                }
            }
            if libc::unlinkat(parent, name.as_ptr(), libc::AT_REMOVEDIR) == 0
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
