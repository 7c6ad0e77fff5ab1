//! Waiting for the ring's queues from an event loop: the same `futex_waitv` on the queues'
//! tails as a blocked receiver uses, submitted to an io_uring instead (kernel 6.7+), whose
//! descriptor turns readable when a wait ends. The event loop polls that descriptor beside
//! its sockets, so no thread has to block in the kernel for the ring.

use std::os::fd::{AsRawFd, BorrowedFd};

use io_uring::{opcode, types, IoUring, Probe};

use crate::sys::{FutexWaiter, FUTEX_WAITV_MAX};

/// Pending `futex_waitv` operations, one per chunk of at most 128 tails.
pub(crate) struct UringWait {
    ring: IoUring,
    /// Per chunk: whether its wait is still queued in the kernel. A queued wait stays a
    /// valid waiter on its words (a sender's `FUTEX_WAKE` ends it whatever value it expected),
    /// so it is never submitted twice.
    pending: Vec<bool>,
    /// The arrays of the queued waits (the kernel reads them at submission; kept until their
    /// completion all the same).
    vecs: Vec<Vec<types::FutexWaitV>>,
}

impl UringWait {
    /// An io_uring able to wait on `futex_waitv`, or `None` where the kernel (or a seccomp
    /// policy around this process) does not offer one.
    pub(crate) fn new(chunks: usize) -> Option<Self> {
        let ring = IoUring::builder().build(8.max(chunks as u32 * 2)).ok()?;
        let mut probe = Probe::new();
        ring.submitter().register_probe(&mut probe).ok()?;
        if !probe.is_supported(opcode::FutexWaitV::CODE) {
            return None;
        }
        Some(Self {
            ring,
            pending: vec![false; chunks],
            vecs: vec![Vec::new(); chunks],
        })
    }

    /// The descriptor that turns readable when a wait ended.
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the ring owns its descriptor and keeps it open until dropped; the borrow
        // cannot outlive `self`.
        unsafe { BorrowedFd::borrow_raw(self.ring.as_raw_fd()) }
    }

    /// Queues a wait for each chunk of `waiters` (in chunks of 128) that has none queued.
    pub(crate) fn arm(&mut self, waiters: &[FutexWaiter]) -> std::io::Result<()> {
        let mut pushed = false;
        for (chunk, ws) in waiters.chunks(FUTEX_WAITV_MAX).enumerate() {
            if self.pending[chunk] {
                continue;
            }
            self.vecs[chunk] = ws
                .iter()
                .map(|w| {
                    types::FutexWaitV::new()
                        .val(w.val)
                        .uaddr(w.uaddr)
                        .flags(w.flags)
                })
                .collect();
            let entry = opcode::FutexWaitV::new(self.vecs[chunk].as_ptr(), ws.len() as u32)
                .build()
                .user_data(chunk as u64);
            // SAFETY: the array the entry points to lives in `self.vecs[chunk]` until the
            // operation completed (it is replaced only when `pending` is false again), and
            // the words it names are tails in regions mapped for as long as the receiver,
            // which owns this ring, exists.
            unsafe { self.ring.submission().push(&entry) }
                .map_err(|_| std::io::Error::other("io_uring submission queue full"))?;
            self.pending[chunk] = true;
            pushed = true;
        }
        if pushed {
            self.ring.submit()?;
        }
        Ok(())
    }

    /// Takes in every finished wait.
    pub(crate) fn reap(&mut self) {
        for cqe in self.ring.completion() {
            if let Some(p) = self.pending.get_mut(cqe.user_data() as usize) {
                *p = false;
            }
        }
    }
}
