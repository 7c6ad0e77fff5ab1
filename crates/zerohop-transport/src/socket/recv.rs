//! Receiving on the socket backend: non-blocking `recv` first (no extra syscall when busy),
//! `poll` on the socket and a stop eventfd when empty.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use zerohop_pool::Descriptor;

use crate::{sys, Raw, Receiver, Stop, TransportError};

/// The socket receiver of one party.
pub struct SocketReceiver {
    rx: Arc<OwnedFd>,
    /// A message was peeked and is still queued.
    peeked: bool,
    stop: Arc<SocketStop>,
}

/// Stops a [`SocketReceiver`].
pub struct SocketStop {
    efd: OwnedFd,
    stopped: AtomicBool,
}

impl Stop for SocketStop {
    fn stop(&self) {
        // SYNC POINT: pairs with the SeqCst load in `peek`; a receiver that missed the flag
        // is already in (or about to enter) poll, which the eventfd write below ends.
        self.stopped.store(true, Ordering::SeqCst);
        sys::eventfd_signal(self.efd.as_fd());
    }
}

impl SocketReceiver {
    pub(crate) fn new(rx: Arc<OwnedFd>) -> Result<Self, TransportError> {
        Ok(Self {
            rx,
            peeked: false,
            stop: Arc::new(SocketStop {
                efd: sys::eventfd()?,
                stopped: AtomicBool::new(false),
            }),
        })
    }
}

impl Receiver for SocketReceiver {
    fn consume(&mut self) {
        if std::mem::take(&mut self.peeked) {
            // Only this thread reads the socket, so the message removed is the one peeked.
            let _ = sys::recv16_nonblocking(self.rx.as_fd(), false);
        }
    }

    fn peek(&mut self) -> Option<Raw> {
        loop {
            if self.stop.stopped.load(Ordering::SeqCst) {
                return None;
            }
            let got = sys::recv16_nonblocking(self.rx.as_fd(), true);
            self.peeked = matches!(got, Ok(Some(_)));
            match got {
                // A message of the wrong size is not a descriptor; it is skipped. The
                // endpoint cannot count it (it never sees it), so it is surfaced as a
                // descriptor addressed nowhere, which the endpoint drops and counts.
                Ok(Some((b, 16))) => {
                    return Some(Raw {
                        from: None,
                        desc: Descriptor::from_bytes(b),
                    })
                }
                // A zero-length read is either an empty message (invalid, below) or the
                // end of the stream: once every send end is closed or shut down, recv
                // returns 0 at once, forever, and poll never blocks again.
                Ok(Some((_, 0))) if sys::hung_up(self.rx.as_fd()) => return None,
                Ok(Some(_)) => {
                    return Some(Raw {
                        from: None,
                        desc: Descriptor {
                            next: Descriptor::GATEWAY ^ 0x80,
                            flags: 0xFF,
                            ..Descriptor::default()
                        },
                    })
                }
                Ok(None) => sys::poll_readable(&[self.rx.as_fd(), self.stop.efd.as_fd()]),
                // The socket is unusable: nothing will ever arrive.
                Err(_) => return None,
            }
        }
    }

    fn stopper(&self) -> Arc<dyn Stop> {
        self.stop.clone()
    }
}
