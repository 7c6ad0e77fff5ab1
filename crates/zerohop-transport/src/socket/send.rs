//! Sending on the socket backend: one `send` of 16 bytes on the edge's send end.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

use zerohop_pool::Descriptor;

use crate::{sys, Options, PartyId, SendError, Sender};

/// The socket sender of one party.
pub struct SocketSender {
    /// Send end per receiver party; `None` where the policy allows no edge.
    tx: Vec<Option<Arc<OwnedFd>>>,
}

impl SocketSender {
    pub(crate) fn new(tx: Vec<Option<Arc<OwnedFd>>>, _opts: Options) -> Self {
        Self { tx }
    }

    fn fd(&self, to: PartyId) -> Result<&Arc<OwnedFd>, SendError> {
        match self.tx.get(to as usize) {
            None => Err(SendError::NoSuchParty(to)),
            Some(None) => Err(SendError::NotAllowed(to)),
            Some(Some(fd)) => Ok(fd),
        }
    }
}

impl Sender for SocketSender {
    fn send(&self, to: PartyId, desc: Descriptor) -> Result<(), SendError> {
        // The send end has SO_SNDTIMEO set, so a full receiver costs at most that long.
        sys::send_msg(self.fd(to)?.as_fd(), &desc.to_bytes(), false)
            .map_err(|e| sys::send_error(to, e))
    }

    fn try_send(&self, to: PartyId, desc: Descriptor) -> Result<(), SendError> {
        sys::send_msg(self.fd(to)?.as_fd(), &desc.to_bytes(), true)
            .map_err(|e| sys::send_error(to, e))
    }
}
