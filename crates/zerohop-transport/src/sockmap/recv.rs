//! Receiving on the sockmap backend: non-blocking `recv` on the party's socket first, `poll`
//! on it and a stop eventfd when it is empty. The sender comes from the trailer the kernel
//! wrote.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

use zerohop_pool::Descriptor;

use super::abi::{Trailer, DESC_LEN, MSG_LEN, VERDICT_DELIVERED, VERDICT_REFUSED_EDGE};
use crate::socket::recv::{LazyEpoll, SocketStop, NOT_A_DESCRIPTOR};
use crate::{sys, Raw, Receiver, Stop, TransportError};

/// The sockmap receiver of one party.
pub struct SockmapReceiver {
    sock: Arc<OwnedFd>,
    /// The socket failed or its connection ended: nothing can arrive any more.
    closed: bool,
    /// A message was peeked and is still queued.
    peeked: bool,
    stop: Arc<SocketStop>,
    /// For an event loop, once asked for: an epoll of the socket.
    epoll: LazyEpoll,
}

impl SockmapReceiver {
    pub(crate) fn new(sock: Arc<OwnedFd>) -> Result<Self, TransportError> {
        Ok(Self {
            sock,
            closed: false,
            peeked: false,
            stop: Arc::new(SocketStop::new()?),
            epoll: LazyEpoll::default(),
        })
    }

    fn close(&mut self) {
        self.closed = true;
        self.epoll.unwatch(self.sock.as_fd());
    }

    /// Looks at the socket without blocking.
    fn poll_once(&mut self) -> Option<Raw> {
        if self.closed {
            return None;
        }
        match sys::recv_msg_nonblocking::<MSG_LEN>(self.sock.as_fd(), true) {
            Ok(Some((m, MSG_LEN))) => {
                self.peeked = true;
                Some(parse(m))
            }
            // The connection ended (recv returns 0 at once, forever) or a short read, which
            // the verdict program never lets through: nothing sensible can follow.
            Ok(Some(_)) | Err(_) => {
                self.close();
                None
            }
            Ok(None) => None,
        }
    }
}

/// A message as the kernel delivered it: the sender from the trailer.
fn parse(m: [u8; MSG_LEN]) -> Raw {
    let desc = Descriptor::from_bytes(m[..DESC_LEN].try_into().expect("16 bytes"));
    let t = Trailer::from_bytes(m[DESC_LEN..].try_into().expect("4 bytes"));
    let (desc, refused) = match t.verdict {
        VERDICT_DELIVERED => (desc, false),
        VERDICT_REFUSED_EDGE => (desc, true),
        _ => (NOT_A_DESCRIPTOR, false),
    };
    Raw {
        from: t.party,
        desc,
        refused,
    }
}

impl Receiver for SockmapReceiver {
    fn consume(&mut self) {
        if std::mem::take(&mut self.peeked) {
            // Only this thread reads the socket, so the message removed is the one peeked.
            let _ = sys::recv_msg_nonblocking::<MSG_LEN>(self.sock.as_fd(), false);
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
            if self.closed {
                sys::poll_readable(&[self.stop.efd.as_fd()]);
            } else {
                sys::poll_readable(&[self.sock.as_fd(), self.stop.efd.as_fd()]);
            }
        }
    }

    fn stopper(&self) -> Arc<dyn Stop> {
        self.stop.clone()
    }

    fn try_peek(&mut self) -> Option<Raw> {
        self.poll_once()
    }

    fn event_fd(&mut self) -> Option<BorrowedFd<'_>> {
        let open = (!self.closed).then(|| self.sock.as_fd());
        self.epoll.get(open)
    }

    // `arm` and `disarm` keep their defaults: the epoll is level-triggered on the socket, so
    // a message that arrives at any time leaves it readable.
}
