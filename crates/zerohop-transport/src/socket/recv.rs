//! Receiving on the socket backend: non-blocking `recv` on each edge first (no extra syscall
//! when busy), `poll` on the edges and a stop eventfd when all are empty.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use zerohop_pool::Descriptor;

use crate::{sys, PartyId, Raw, Receiver, Stop, TransportError};

/// One edge into this receiver.
struct Lane {
    from: PartyId,
    rx: Arc<OwnedFd>,
    /// The sender shut its end down (or the socket failed): nothing can arrive any more.
    closed: bool,
}

/// The socket receiver of one party.
pub struct SocketReceiver {
    lanes: Vec<Lane>,
    next_lane: usize,
    /// The lane whose message was peeked and is still queued.
    peeked: Option<usize>,
    stop: Arc<SocketStop>,
    /// For an event loop, once asked for: an epoll of the open lanes.
    epoll: LazyEpoll,
}

/// Stops a [`SocketReceiver`] (or a sockmap receiver): a flag and an eventfd its `poll`
/// watches.
pub struct SocketStop {
    pub(crate) efd: OwnedFd,
    stopped: AtomicBool,
}

impl SocketStop {
    pub(crate) fn new() -> Result<Self, TransportError> {
        Ok(Self {
            efd: sys::eventfd()?,
            stopped: AtomicBool::new(false),
        })
    }

    /// Whether [`Stop::stop`] was called.
    pub(crate) fn stopped(&self) -> bool {
        // SYNC POINT: pairs with the SeqCst store in `stop`.
        self.stopped.load(Ordering::SeqCst)
    }
}

impl Stop for SocketStop {
    fn stop(&self) {
        // SYNC POINT: pairs with the SeqCst load in `peek`; a receiver that missed the flag
        // is already in (or about to enter) poll, which the eventfd write below ends.
        self.stopped.store(true, Ordering::SeqCst);
        sys::eventfd_signal(self.efd.as_fd());
    }
}

/// A level-triggered epoll of a receiver's sockets, made when an event loop first asks for
/// it (shared by the socket and sockmap receivers).
#[derive(Default)]
pub(crate) struct LazyEpoll(Option<Result<OwnedFd, ()>>);

impl LazyEpoll {
    /// The epoll, watching `fds` when made now; `None` if it could not be made.
    pub(crate) fn get<'a>(
        &mut self,
        fds: impl IntoIterator<Item = BorrowedFd<'a>>,
    ) -> Option<BorrowedFd<'_>> {
        let made = self.0.get_or_insert_with(|| {
            sys::epoll()
                .and_then(|ep| {
                    for fd in fds {
                        sys::epoll_watch(ep.as_fd(), fd, true)?;
                    }
                    Ok(ep)
                })
                .map_err(|_| ())
        });
        made.as_ref().ok().map(|ep| ep.as_fd())
    }

    /// Stops watching `fd` (a hung-up socket would be readable forever).
    pub(crate) fn unwatch(&self, fd: BorrowedFd<'_>) {
        if let Some(Ok(ep)) = &self.0 {
            let _ = sys::epoll_watch(ep.as_fd(), fd, false);
        }
    }
}

/// What a message that is not a descriptor is surfaced as: a length no slot holds, so the
/// endpoint drops and counts it.
pub(crate) const NOT_A_DESCRIPTOR: Descriptor = Descriptor {
    slot: 0,
    next: 0,
    len: u32::MAX,
    request: 0,
    generation: 0,
};

impl SocketReceiver {
    pub(crate) fn new(lanes: Vec<(PartyId, Arc<OwnedFd>)>) -> Result<Self, TransportError> {
        Ok(Self {
            lanes: lanes
                .into_iter()
                .map(|(from, rx)| Lane {
                    from,
                    rx,
                    closed: false,
                })
                .collect(),
            next_lane: 0,
            peeked: None,
            stop: Arc::new(SocketStop::new()?),
            epoll: LazyEpoll::default(),
        })
    }

    /// Marks lane `i` closed; an event loop stops watching it (a hung-up socket would be
    /// readable forever).
    fn close_lane(&mut self, i: usize) {
        self.lanes[i].closed = true;
        self.epoll.unwatch(self.lanes[i].rx.as_fd());
    }

    /// One pass over the lanes, starting at the one peeked last (or the next in turn).
    fn poll_once(&mut self) -> Option<Raw> {
        let n = self.lanes.len();
        let first = self.peeked.unwrap_or(self.next_lane);
        for k in 0..n {
            let i = (first + k) % n;
            if let Some(raw) = self.try_lane(i) {
                self.peeked = Some(i);
                return Some(raw);
            }
        }
        None
    }

    /// Looks at lane `i` without blocking.
    fn try_lane(&mut self, i: usize) -> Option<Raw> {
        let lane = &self.lanes[i];
        if lane.closed {
            return None;
        }
        let raw = |desc| Raw {
            from: lane.from,
            desc,
            refused: false,
        };
        match sys::recv_msg_nonblocking::<16>(lane.rx.as_fd(), true) {
            Ok(Some((b, 16))) => Some(raw(Descriptor::from_bytes(b))),
            // A zero-length read is either an empty message (invalid, below) or the end of
            // the stream: once the sender shut its end down, recv returns 0 at once, forever.
            Ok(Some((_, 0))) if sys::hung_up(lane.rx.as_fd()) => {
                self.close_lane(i);
                None
            }
            Ok(Some(_)) => Some(raw(NOT_A_DESCRIPTOR)),
            Ok(None) => None,
            Err(_) => {
                self.close_lane(i);
                None
            }
        }
    }
}

impl Receiver for SocketReceiver {
    fn consume(&mut self) {
        if let Some(i) = self.peeked.take() {
            // Only this thread reads the socket, so the message removed is the one peeked.
            let _ = sys::recv_msg_nonblocking::<16>(self.lanes[i].rx.as_fd(), false);
            self.next_lane = (i + 1) % self.lanes.len();
        }
    }

    fn peek(&mut self) -> Option<Raw> {
        loop {
            if self.stop.stopped() {
                return None;
            }
            if let Some(raw) = self.poll_once() {
                return Some(raw);
            }
            let mut fds: Vec<_> = self
                .lanes
                .iter()
                .filter(|l| !l.closed)
                .map(|l| l.rx.as_fd())
                .collect();
            fds.push(self.stop.efd.as_fd());
            sys::poll_readable(&fds);
        }
    }

    fn stopper(&self) -> Arc<dyn Stop> {
        self.stop.clone()
    }

    fn try_peek(&mut self) -> Option<Raw> {
        self.poll_once()
    }

    fn event_fd(&mut self) -> Option<BorrowedFd<'_>> {
        let open = self
            .lanes
            .iter()
            .filter(|l| !l.closed)
            .map(|l| l.rx.as_fd());
        self.epoll.get(open)
    }

    // `arm` and `disarm` keep their defaults: the epoll is level-triggered on the sockets
    // themselves, so a message that arrives at any time leaves it readable.
}
