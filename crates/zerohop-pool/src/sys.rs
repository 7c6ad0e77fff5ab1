//! Raw syscalls of the pool (memfd, seals, mmap), each failure naming its call.

use std::ffi::CString;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use crate::PoolError;

fn last(call: &'static str) -> PoolError {
    PoolError::Syscall {
        call,
        source: std::io::Error::last_os_error(),
    }
}

/// `memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING [| MFD_HUGETLB])`.
pub(crate) fn memfd_create(name: &str, hugetlb: bool) -> Result<OwnedFd, PoolError> {
    let cname = CString::new(name).map_err(|_| PoolError::BadName(name.to_owned()))?;
    let mut flags = libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING;
    if hugetlb {
        flags |= libc::MFD_HUGETLB;
    }
    // SAFETY: cname is a valid NUL-terminated string for the duration of the call.
    let fd = unsafe { libc::memfd_create(cname.as_ptr(), flags) };
    if fd < 0 {
        return Err(last("memfd_create"));
    }
    // SAFETY: fd was just returned by memfd_create and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `ftruncate(fd, len)`.
pub(crate) fn ftruncate(fd: BorrowedFd<'_>, len: usize) -> Result<(), PoolError> {
    // SAFETY: plain syscall on a valid fd.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } < 0 {
        return Err(last("ftruncate"));
    }
    Ok(())
}

/// Seals the memfd so that no party can shrink it under another's mapping (SIGBUS).
pub(crate) fn seal(fd: BorrowedFd<'_>) -> Result<(), PoolError> {
    let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
    // SAFETY: plain fcntl on a valid fd.
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) } < 0 {
        return Err(last("fcntl(F_ADD_SEALS)"));
    }
    Ok(())
}

/// Seals currently on `fd`.
pub(crate) fn seals(fd: BorrowedFd<'_>) -> Result<i32, PoolError> {
    // SAFETY: plain fcntl on a valid fd.
    let s = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
    if s < 0 {
        return Err(last("fcntl(F_GET_SEALS)"));
    }
    Ok(s)
}

/// Size of the file behind `fd`.
pub(crate) fn file_len(fd: BorrowedFd<'_>) -> Result<usize, PoolError> {
    // SAFETY: stat is plain data; fstat fills it on success.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid fd and a valid out pointer.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } < 0 {
        return Err(last("fstat"));
    }
    Ok(st.st_size as usize)
}

/// `fchmod(fd, mode)`.
pub(crate) fn fchmod(fd: BorrowedFd<'_>, mode: libc::mode_t) -> Result<(), PoolError> {
    // SAFETY: plain syscall on a valid fd.
    if unsafe { libc::fchmod(fd.as_raw_fd(), mode) } < 0 {
        return Err(last("fchmod"));
    }
    Ok(())
}

/// A new, read-only open file description of the file behind `fd` (through
/// `/proc/self/fd`), close-on-exec. A process given only this one cannot map the file
/// writable, and cannot reopen it for writing either while the file's mode forbids it.
pub(crate) fn reopen_readonly(fd: BorrowedFd<'_>) -> Result<OwnedFd, PoolError> {
    let path = CString::new(format!("/proc/self/fd/{}", fd.as_raw_fd())).expect("no NUL");
    // SAFETY: path is a valid NUL-terminated string for the duration of the call.
    let r = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if r < 0 {
        return Err(last("open(/proc/self/fd, O_RDONLY)"));
    }
    // SAFETY: r was just returned by open and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(r) })
}

/// Whether `fd` was opened for writing.
pub(crate) fn writable(fd: BorrowedFd<'_>) -> Result<bool, PoolError> {
    // SAFETY: plain fcntl on a valid fd.
    let fl = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) };
    if fl < 0 {
        return Err(last("fcntl(F_GETFL)"));
    }
    Ok(fl & libc::O_ACCMODE != libc::O_RDONLY)
}

/// `mmap(NULL, len, PROT_READ[|PROT_WRITE], MAP_SHARED [| MAP_POPULATE], fd, 0)`.
pub(crate) fn mmap_shared(
    fd: BorrowedFd<'_>,
    len: usize,
    populate: bool,
    write: bool,
) -> Result<*mut u8, PoolError> {
    let mut flags = libc::MAP_SHARED;
    if populate {
        flags |= libc::MAP_POPULATE;
    }
    let prot = if write {
        libc::PROT_READ | libc::PROT_WRITE
    } else {
        libc::PROT_READ
    };
    // SAFETY: a fresh mapping chosen by the kernel; it aliases no Rust object.
    let p = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, flags, fd.as_raw_fd(), 0) };
    if p == libc::MAP_FAILED {
        return Err(last("mmap"));
    }
    Ok(p.cast())
}

/// Unmaps a region returned by [`mmap_shared`].
///
/// # Safety
/// `(p, len)` must be exactly a mapping from [`mmap_shared`] and no reference into it may be
/// used afterwards.
pub(crate) unsafe fn munmap(p: *mut u8, len: usize) {
    // SAFETY: guaranteed by the caller.
    unsafe { libc::munmap(p.cast(), len) };
}

/// Free 2 MiB huge pages on the host, from /proc/meminfo.
pub(crate) fn free_hugepages() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    info.lines()
        .find_map(|l| l.strip_prefix("HugePages_Free:"))
        .and_then(|v| v.trim().parse().ok())
}

/// `CLOCK_MONOTONIC` in milliseconds.
pub(crate) fn monotonic_ms() -> u64 {
    monotonic_ns() / 1_000_000
}

/// `CLOCK_MONOTONIC` in nanoseconds.
pub(crate) fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into the local it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// `futex(word, FUTEX_WAIT, expected, timeout)` on a word in shared memory (not private:
/// waiters and wakers are different processes). Returns when woken, when the word no longer
/// holds `expected`, on a signal, or after `timeout`.
pub(crate) fn futex_wait(
    word: &std::sync::atomic::AtomicU32,
    expected: u32,
    timeout: std::time::Duration,
) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `word` is a live, aligned 32-bit atomic; the kernel only reads it and the
    // timespec, which lives on this stack frame for the call.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
        )
    };
}

/// `futex(word, FUTEX_WAKE, all)`.
pub(crate) fn futex_wake_all(word: &std::sync::atomic::AtomicU32) {
    // SAFETY: `word` is a live, aligned 32-bit atomic; FUTEX_WAKE only uses its address.
    unsafe { libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX) };
}

/// Whether a process with this pid exists (`kill(pid, 0)` is not `ESRCH`). A pid of 0 or
/// beyond `i32::MAX` names no process.
pub(crate) fn pid_alive(pid: u32) -> bool {
    if pid == 0 || pid > i32::MAX as u32 {
        return false;
    }
    // SAFETY: signal 0 only checks that the process exists and may be signalled.
    let r = unsafe { libc::kill(pid as libc::pid_t, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

/// `madvise(p, len, MADV_REMOVE)`: gives the pages of `[p, p+len)` of a shared memfd mapping
/// back to the kernel (a hole punched in the file: every mapping of it reads zeros there
/// after, and the memory is free).
///
/// # Safety
/// `(p, len)` must lie inside a writable shared mapping of this process, page aligned, and
/// the caller must own those bytes in the protocol's sense (no one else may rely on them:
/// they read as zeros afterwards).
pub(crate) unsafe fn madvise_remove(p: *mut u8, len: usize) -> Result<(), PoolError> {
    // SAFETY: guaranteed by the caller; MADV_REMOVE changes only the file's contents, never
    // the mapping, so no Rust reference is invalidated (bytes only become zero).
    if unsafe { libc::madvise(p.cast(), len, libc::MADV_REMOVE) } < 0 {
        return Err(last("madvise(MADV_REMOVE)"));
    }
    Ok(())
}

/// Pages of `[p, p+len)` resident in memory (`mincore`), for tests that check a release.
#[cfg(test)]
pub(crate) fn resident_pages(p: *mut u8, len: usize) -> usize {
    let pages = len.div_ceil(4096);
    let mut vec = vec![0u8; pages];
    // SAFETY: `vec` holds one byte per page of the range, as mincore writes; the range is a
    // mapping of the caller's (mincore only reads the page tables).
    let r = unsafe { libc::mincore(p.cast(), len, vec.as_mut_ptr().cast()) };
    assert_eq!(r, 0, "mincore: {}", std::io::Error::last_os_error());
    vec.iter().filter(|&&b| b & 1 != 0).count()
}
