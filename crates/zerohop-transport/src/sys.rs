//! Raw syscalls of the transports: futex on shared memory, seqpacket sockets, eventfd, poll.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use zerohop_pool::sync::AtomicU32;

use crate::{SendError, TransportError};

fn err(call: &'static str) -> TransportError {
    TransportError::Syscall {
        call,
        source: io::Error::last_os_error(),
    }
}

/// One entry of a `futex_waitv` call (`struct futex_waitv` of the kernel ABI).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct FutexWaiter {
    pub(crate) val: u64,
    pub(crate) uaddr: u64,
    pub(crate) flags: u32,
    reserved: u32,
}

/// `FUTEX2_SIZE_U32`: the word is 32 bits.
const FUTEX2_SIZE_U32: u32 = 0x02;
/// `FUTEX2_PRIVATE`: the word is in this process's own memory (a cheaper key than a shared
/// word's, which needs a page lookup).
const FUTEX2_PRIVATE: u32 = 128;
/// Most waiters one `futex_waitv` call takes (`FUTEX_WAITV_MAX`).
pub(crate) const FUTEX_WAITV_MAX: usize = 128;

impl FutexWaiter {
    /// Wait while `*word == expected`, `word` in a shared mapping.
    pub(crate) fn new(word: &AtomicU32, expected: u32) -> Self {
        Self {
            val: u64::from(expected),
            uaddr: word.as_ptr() as u64,
            flags: FUTEX2_SIZE_U32,
            reserved: 0,
        }
    }

    /// Wait while `*word == expected`, `word` in this process's own memory.
    pub(crate) fn private(word: &AtomicU32, expected: u32) -> Self {
        Self {
            flags: FUTEX2_SIZE_U32 | FUTEX2_PRIVATE,
            ..Self::new(word, expected)
        }
    }
}

/// Waits until one of `waiters`' words differs from its expected value or is woken (or a
/// signal arrives). The last waiter must be the caller's own stop word. With more waiters
/// than the kernel takes at once, waits on the first ones and the stop word only, for at
/// most 10 ms, so the queues beyond are still looked at (documented in `docs/protocol.md`).
pub(crate) fn futex_waitv(waiters: &[FutexWaiter]) {
    let mut timeout = None;
    let mut buf;
    let list: &[FutexWaiter] = if waiters.len() <= FUTEX_WAITV_MAX {
        waiters
    } else {
        buf = waiters[..FUTEX_WAITV_MAX - 1].to_vec();
        buf.push(*waiters.last().expect("non-empty"));
        let mut now = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: now is a valid out pointer.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
        now.tv_nsec += 10_000_000;
        if now.tv_nsec >= 1_000_000_000 {
            now.tv_sec += 1;
            now.tv_nsec -= 1_000_000_000;
        }
        timeout = Some(now);
        &buf
    };
    let tp = timeout
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: `list` is a valid array of `list.len()` (<= 128) futex_waitv structs whose
    // addresses point to live, 4-aligned u32 words in shared mappings held by the caller;
    // the timeout, when given, is a valid absolute CLOCK_MONOTONIC time. Errors (EAGAIN: a
    // word changed; EINTR; ETIMEDOUT) all mean "look again".
    unsafe {
        libc::syscall(
            libc::SYS_futex_waitv,
            list.as_ptr(),
            list.len() as libc::c_uint,
            0 as libc::c_uint,
            tp,
            libc::CLOCK_MONOTONIC,
        );
    }
}

/// `FUTEX_WAKE` one waiter on `word`.
pub(crate) fn futex_wake(word: &AtomicU32) {
    // SAFETY: word points to a live, 4-aligned u32 in a shared mapping; waking has no memory
    // effects.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, 1);
    }
}

/// `FUTEX_WAIT` (shared) on the one word of `w` while it holds the expected value; returns
/// on a wake, a value change or a signal.
pub(crate) fn futex_wait(w: FutexWaiter) {
    // SAFETY: the waiter names a live, 4-aligned u32 in a shared mapping (see FutexWaiter::new);
    // a null timeout waits without deadline. Errors (EAGAIN, EINTR) mean "look again".
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            w.uaddr as *const u32,
            libc::FUTEX_WAIT,
            w.val as u32,
            std::ptr::null::<libc::timespec>(),
        );
    }
}

/// `FUTEX_WAKE` (shared) every waiter on the word at `addr`. Waking has no memory effects
/// and needs no write access to the word.
pub(crate) fn futex_wake_addr(addr: usize) {
    // SAFETY: the kernel only looks the address up; an unmapped one is EFAULT, nothing more.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            addr as *const u32,
            libc::FUTEX_WAKE,
            i32::MAX,
        );
    }
}

/// `FUTEX_WAKE_PRIVATE` one waiter on a word of this process's own memory.
pub(crate) fn futex_wake_private(word: &AtomicU32) {
    // SAFETY: word points to a live, 4-aligned u32; waking has no memory effects.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
            1,
        );
    }
}

/// A `SOCK_SEQPACKET` socketpair, close-on-exec.
pub(crate) fn seqpacket_pair() -> Result<(OwnedFd, OwnedFd), TransportError> {
    let mut fds = [0; 2];
    // SAFETY: fds is a valid out array of two ints.
    let r = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    };
    if r < 0 {
        return Err(err("socketpair"));
    }
    // SAFETY: both fds were just created and are owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Sets `SO_SNDTIMEO`, bounding a blocking send on a full socket. A timeout of 0 ms is
/// raised to 1 ms: to the kernel a zero `SO_SNDTIMEO` means "block forever", the opposite of
/// what `Options::send_timeout_ms == 0` asks for (give up at once, as the ring does).
pub(crate) fn set_send_timeout(fd: BorrowedFd<'_>, ms: u32) -> Result<(), TransportError> {
    let ms = ms.max(1);
    let tv = libc::timeval {
        tv_sec: (ms / 1000) as libc::time_t,
        tv_usec: ((ms % 1000) * 1000) as libc::suseconds_t,
    };
    // SAFETY: tv is a valid timeval for the duration of the call.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_SNDTIMEO,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    if r < 0 {
        return Err(err("setsockopt(SO_SNDTIMEO)"));
    }
    Ok(())
}

/// Sends one N-byte message, blocking up to the socket's send timeout unless `nonblocking`.
pub(crate) fn send_msg<const N: usize>(
    fd: BorrowedFd<'_>,
    b: &[u8; N],
    nonblocking: bool,
) -> Result<(), io::Error> {
    let flags = libc::MSG_NOSIGNAL | if nonblocking { libc::MSG_DONTWAIT } else { 0 };
    loop {
        // SAFETY: b is a valid N-byte buffer.
        let r = unsafe { libc::send(fd.as_raw_fd(), b.as_ptr().cast(), N, flags) };
        if r == N as isize {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if r < 0 && e.kind() == io::ErrorKind::Interrupted {
            continue;
        }
        return Err(e);
    }
}

/// Receives one message without blocking, or with `peek` looks at it and leaves it queued.
/// `Ok(None)` when nothing is queued.
pub(crate) fn recv_msg_nonblocking<const N: usize>(
    fd: BorrowedFd<'_>,
    peek: bool,
) -> Result<Option<([u8; N], usize)>, io::Error> {
    let flags = libc::MSG_DONTWAIT | libc::MSG_TRUNC | if peek { libc::MSG_PEEK } else { 0 };
    let mut b = [0u8; N];
    loop {
        // SAFETY: b is a valid N-byte buffer; on a datagram socket MSG_TRUNC makes the
        // kernel report the real message length so oversize messages are recognised.
        let r = unsafe { libc::recv(fd.as_raw_fd(), b.as_mut_ptr().cast(), N, flags) };
        if r >= 0 {
            return Ok(Some((b, r as usize)));
        }
        let e = io::Error::last_os_error();
        match e.kind() {
            io::ErrorKind::Interrupted => continue,
            io::ErrorKind::WouldBlock => return Ok(None),
            _ => return Err(e),
        }
    }
}

/// A non-blocking eventfd, close-on-exec.
pub(crate) fn eventfd() -> Result<OwnedFd, TransportError> {
    // SAFETY: plain syscall.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if fd < 0 {
        return Err(err("eventfd"));
    }
    // SAFETY: fd was just created and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A new epoll instance (close-on-exec).
pub(crate) fn epoll() -> io::Result<OwnedFd> {
    // SAFETY: plain syscall.
    let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd was just created and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Adds `fd` to `epoll` (level-triggered, readable), or removes it.
pub(crate) fn epoll_watch(
    epoll: BorrowedFd<'_>,
    fd: BorrowedFd<'_>,
    watch: bool,
) -> io::Result<()> {
    let mut ev = libc::epoll_event {
        events: libc::EPOLLIN as u32,
        u64: fd.as_raw_fd() as u64,
    };
    let op = if watch {
        libc::EPOLL_CTL_ADD
    } else {
        libc::EPOLL_CTL_DEL
    };
    // SAFETY: both descriptors are open for the call; `ev` is a valid event.
    let rc = unsafe { libc::epoll_ctl(epoll.as_raw_fd(), op, fd.as_raw_fd(), &mut ev) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Adds one to an eventfd.
pub(crate) fn eventfd_signal(fd: BorrowedFd<'_>) {
    let one: u64 = 1;
    // SAFETY: writes 8 bytes from a valid u64.
    unsafe { libc::write(fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
}

/// Whether no message can ever arrive on `fd` any more: every send end of the socketpair
/// was closed (`POLLHUP`) or shut down for writing (`POLLRDHUP`). Does not block.
pub(crate) fn hung_up(fd: BorrowedFd<'_>) -> bool {
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLRDHUP,
        revents: 0,
    };
    // SAFETY: p is one valid pollfd; a zero timeout makes poll return at once.
    let r = unsafe { libc::poll(&mut p, 1, 0) };
    r > 0 && p.revents & (libc::POLLHUP | libc::POLLRDHUP) != 0
}

/// Bytes queued to be read on socket `fd` (`SIOCINQ`; for a unix `SOCK_SEQPACKET` socket
/// the sum over every queued message); 0 if it cannot be asked.
pub(crate) fn queued_bytes(fd: BorrowedFd<'_>) -> usize {
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD (= SIOCINQ) writes one c_int into `n`, which outlives the call.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), libc::FIONREAD, &mut n) };
    if r < 0 {
        0
    } else {
        n.max(0) as usize
    }
}

/// Blocks until one of `fds` is readable (or a signal arrives).
pub(crate) fn poll_readable(fds: &[BorrowedFd<'_>]) {
    let mut pfds: Vec<libc::pollfd> = fds
        .iter()
        .map(|f| libc::pollfd {
            fd: f.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    // SAFETY: pfds is a valid array of pfds.len() pollfd structs; -1 waits without deadline.
    unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, -1) };
}

/// Maps an io error of a send to the transport's error.
pub(crate) fn send_error(to: u16, e: io::Error) -> SendError {
    if e.kind() == io::ErrorKind::WouldBlock {
        SendError::Full(to)
    } else {
        SendError::Syscall {
            call: "send",
            source: e,
        }
    }
}

/// Number of CPUs the calling thread may run on (1 when it cannot be read).
pub(crate) fn allowed_cpus() -> usize {
    // SAFETY: cpu_set_t is plain data and zero is a valid (empty) set; sched_getaffinity
    // writes at most size_of::<cpu_set_t>() bytes into it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return 1;
        }
        libc::CPU_COUNT(&set).max(1) as usize
    }
}

/// How often the calling thread was preempted so far (involuntary context switches); 0 when
/// it cannot be read.
pub(crate) fn involuntary_switches() -> u64 {
    // SAFETY: rusage is plain data and zero is a valid value; getrusage writes one rusage
    // into the pointer it is given.
    unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        if libc::getrusage(libc::RUSAGE_THREAD, &mut usage) != 0 {
            return 0;
        }
        usage.ru_nivcsw as u64
    }
}
