//! The reaper's process (the agent's side of it is [`crate::reaper`]): forking it detached,
//! and what it runs: read process groups from its pipe until end of file, then kill them,
//! kill the chain's v2 cgroup, and remove the chain's cgroup folders.

#![allow(unsafe_code)]

use std::ffi::CStr;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};

use nix::errno::Errno;
use nix::sys::signal::{SigHandler, Signal};
use nix::unistd::Pid;

use super::confine::MAX_CGROUPS;

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
