//! Sending on the socket backend: one `send` of 16 bytes on the receiver's send end.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

use zerohop_pool::Descriptor;

use crate::{sys, PartyId, SendError, Sender};

/// The socket sender of one party.
pub struct SocketSender {
    tx: Arc<Vec<OwnedFd>>,
}

impl SocketSender {
    pub(crate) fn new(tx: Arc<Vec<OwnedFd>>) -> Self {
        Self { tx }
    }
}

impl Sender for SocketSender {
    fn send(&self, to: PartyId, desc: Descriptor) -> Result<(), SendError> {
        let fd = self.tx.get(to as usize).ok_or(SendError::NoSuchParty(to))?;
        // The send end has SO_SNDTIMEO set, so a full receiver costs at most that long.
        sys::send16(fd.as_fd(), &desc.to_bytes()).map_err(|e| sys::send_error(to, e))
    }
}
