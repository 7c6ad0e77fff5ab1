//! Every raw system call of the floors, and the one place they use `unsafe`: CPU affinity,
//! futex, eventfd, socketpair, the parent-death signal, inherited descriptors, and atomics
//! viewed inside a shared mapping.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use zerohop_pool::region::Region;

/// First descriptor a peer inherits (0-2 are stdio).
pub(super) const FIRST_INHERITED_FD: RawFd = 3;

fn check(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// CPUs online (at least 1).
pub(super) fn online_cpus() -> usize {
    // SAFETY: sysconf takes a constant and touches no caller memory.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    n.max(1) as usize
}

/// Lets the calling thread (not the whole process) run only on `cpus`.
pub(super) fn set_affinity(cpus: &[usize]) -> io::Result<()> {
    // SAFETY: cpu_set_t is plain data; all-zero bytes are the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &cpu in cpus {
        if cpu >= libc::CPU_SETSIZE as usize {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("CPU {cpu} is beyond CPU_SETSIZE"),
            ));
        }
        // SAFETY: cpu < CPU_SETSIZE (checked above), so CPU_SET writes inside `set`.
        unsafe { libc::CPU_SET(cpu, &mut set) };
    }
    // SAFETY: pid 0 is the calling thread; the kernel reads size_of::<cpu_set_t>() bytes from
    // `set`, which is that large and lives across the call.
    check(unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) })?;
    Ok(())
}

/// `FUTEX_WAIT` (shared, not `FUTEX_PRIVATE`: the word lives in a mapping of two processes)
/// while `word == expected`, for at most `timeout`. Returns on wake, timeout, signal or a
/// changed word alike: callers re-check the word.
pub(super) fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `word` is a live, 4-byte aligned u32 for the duration of the call, `ts` a valid
    // timespec on the stack; FUTEX_WAIT ignores the last two arguments.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
            std::ptr::null::<u32>(),
            0u32,
        )
    };
}

/// `FUTEX_WAKE` of every waiter on `word` (shared).
pub(super) fn futex_wake(word: &AtomicU32) {
    // SAFETY: `word` is a live, aligned u32; FUTEX_WAKE only uses its address as a key and
    // ignores the timeout and second-word arguments.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE,
            i32::MAX,
            std::ptr::null::<libc::timespec>(),
            std::ptr::null::<u32>(),
            0u32,
        )
    };
}

/// A blocking eventfd (counter 0, close-on-exec).
pub(super) fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: no pointers are involved.
    let fd = check(unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) })?;
    // SAFETY: `fd` was just returned by eventfd and belongs to nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A blocking unix `SOCK_SEQPACKET` socketpair (close-on-exec).
pub(super) fn seqpacket_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: socketpair writes exactly two ints into `fds`, which holds two.
    check(unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    })?;
    // SAFETY: both descriptors were just created by socketpair and belong to nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Makes the kernel SIGKILL this process when the thread that started it exits, and fails
/// when that already happened (this process was re-parented before the call).
pub(super) fn die_with_parent(parent: u32) -> io::Result<()> {
    // SAFETY: PR_SET_PDEATHSIG takes a signal number; no memory is passed.
    check(unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) })?;
    if std::os::unix::process::parent_id() != parent {
        return Err(io::Error::other(format!(
            "parent {parent} is gone before the peer started"
        )));
    }
    Ok(())
}

/// Takes ownership of the `n` descriptors mapped to 3, 4, ... by the parent
/// (`peer::Peer::spawn`). Fails when called twice or when one is not open.
pub(super) fn take_inherited_fds(n: usize) -> io::Result<Vec<OwnedFd>> {
    static TAKEN: AtomicBool = AtomicBool::new(false);
    if TAKEN.swap(true, Ordering::SeqCst) {
        return Err(io::Error::other("inherited descriptors were already taken"));
    }
    (0..n)
        .map(|i| {
            let raw = FIRST_INHERITED_FD + i as RawFd;
            // SAFETY: F_GETFD only queries the descriptor's flags; no memory is passed.
            check(unsafe { libc::fcntl(raw, libc::F_GETFD) }).map_err(|e| {
                io::Error::other(format!("descriptor {raw} was not inherited: {e}"))
            })?;
            // SAFETY: the parent mapped this open descriptor here for this process to own
            // (checked open above); TAKEN makes sure ownership is taken once, and nothing
            // else in a peer process claims descriptors it did not open.
            Ok(unsafe { OwnedFd::from_raw_fd(raw) })
        })
        .collect()
}

/// The `u64` at `offset` of a shared mapping, as an atomic.
pub(super) fn atomic_u64_at(region: &Region, offset: usize) -> &AtomicU64 {
    assert!(
        offset.is_multiple_of(8) && offset + 8 <= region.len(),
        "u64 at {offset}"
    );
    // SAFETY: the mapping is page aligned and `offset` is 8-aligned and in bounds (asserted),
    // so the pointer is valid and aligned for an AtomicU64; it stays mapped while `region`
    // is borrowed; every process touches these bytes through atomics only.
    unsafe { AtomicU64::from_ptr(region.base().add(offset).cast()) }
}

/// The `u32` at `offset` of a shared mapping, as an atomic (a futex word).
pub(super) fn atomic_u32_at(region: &Region, offset: usize) -> &AtomicU32 {
    assert!(
        offset.is_multiple_of(4) && offset + 4 <= region.len(),
        "u32 at {offset}"
    );
    // SAFETY: as in `atomic_u64_at`, with 4-byte alignment.
    unsafe { AtomicU32::from_ptr(region.base().add(offset).cast()) }
}
