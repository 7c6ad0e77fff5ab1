//! The spawner's fork/exec path: forking the spawner itself ([`fork_spawner`]), and in it,
//! starting each instance ([`fork_instance`]): a clone, its descriptors placed, a session
//! of its own, default signals, its confinement, then `execve`, which [`Forked::outcome`]
//! learns of.

#![allow(unsafe_code)]

use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sys::signal::{SigHandler, Signal};
use nix::unistd::Pid;

use super::confine::{in_child, ChildPlan};

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

/// A child [`fork_instance`] started that had not yet called `execve` (or failed) when it
/// returned.
pub(crate) struct Forked {
    pub pid: u32,
    /// The read end of a close-on-exec pipe whose only write end is the child's: end of file
    /// once its `execve` succeeded, or the encoded error of the step that failed.
    pipe: OwnedFd,
}

impl Forked {
    /// Turns readable once the child called `execve` or failed.
    pub fn pipe(&self) -> BorrowedFd<'_> {
        self.pipe.as_fd()
    }

    /// Waits until the child called `execve` (its pid) or failed (its pid and the encoded
    /// error: the child is then exiting, and its parent must reap it).
    pub fn outcome(self) -> Result<u32, (u32, i32)> {
        let pid = self.pid;
        let mut buf = [0u8; 4];
        let mut have = 0;
        // End of file: the child's `execve` closed the pipe (close-on-exec), so it succeeded.
        while have < 4 {
            match nix::unistd::read(&self.pipe, &mut buf[have..]) {
                Ok(0) => break,
                Ok(n) => have += n,
                Err(Errno::EINTR) => continue,
                Err(e) => return Err((pid, e as i32)),
            }
        }
        if have == 4 {
            return Err((pid, i32::from_ne_bytes(buf)));
        }
        Ok(pid)
    }
}

/// Starts `l` as a child of the spawner's parent (the agent: `CLONE_PARENT`), in a process
/// group of its own, confined by `l.plan`, and returns without waiting for its `execve`
/// ([`Forked::outcome`] does). Once this returns the child holds copies of `l`'s
/// descriptors, and the caller may close its own: the next child forked never sees them.
pub(crate) fn fork_instance(
    l: &Launch,
    devnull: BorrowedFd<'_>,
    scope: Option<BorrowedFd<'_>>,
) -> Result<Forked, (u32, i32)> {
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
    // The child's copy is the only write end left: the pipe ends when the child execs or
    // exits, whatever the spawner forks next.
    drop(err_tx);
    Ok(Forked {
        pid: pid as u32,
        pipe: err_rx,
    })
}

/// The child's side of [`fork_instance`]; returns only on failure.
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
