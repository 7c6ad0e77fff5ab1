//! Sending on the sockmap backend: one `send` of the descriptor and a trailer naming the
//! chosen instance, on the party's own socket; the kernel's verdict program does the rest.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

use zerohop_pool::Descriptor;

use super::abi::{Trailer, DESC_LEN, MSG_LEN};
use crate::{sys, PartyId, Policy, SendError, Sender};

/// The sockmap sender of one party.
pub struct SockmapSender {
    sock: Arc<OwnedFd>,
    policy: Arc<Policy>,
    /// By function index: whether this party's function may send to it (looked up once
    /// here, not in the policy's edge set on every send).
    allowed: [bool; 256],
}

impl SockmapSender {
    pub(crate) fn new(sock: Arc<OwnedFd>, policy: Arc<Policy>, me: PartyId) -> Self {
        let mine = policy.function_of(me).unwrap_or(crate::GATEWAY_FN);
        let allowed = std::array::from_fn(|g| policy.allows(mine, g as u8));
        Self {
            sock,
            policy,
            allowed,
        }
    }

    /// The message for `desc` to party `to`. The kernel checks the edge again; this check
    /// only saves an honest sender the round trip.
    fn message(&self, to: PartyId, desc: Descriptor) -> Result<[u8; MSG_LEN], SendError> {
        let f = self
            .policy
            .function_of(to)
            .ok_or(SendError::NoSuchParty(to))?;
        if !self.allowed[usize::from(f)] {
            return Err(SendError::NotAllowed(to));
        }
        let mut m = [0u8; MSG_LEN];
        m[..DESC_LEN].copy_from_slice(&desc.to_bytes());
        m[DESC_LEN..].copy_from_slice(
            &Trailer {
                party: to,
                ..Trailer::default()
            }
            .to_bytes(),
        );
        Ok(m)
    }

    fn send_with(&self, to: PartyId, desc: Descriptor, nonblocking: bool) -> Result<(), SendError> {
        let m = self.message(to, desc)?;
        sys::send_msg(self.sock.as_fd(), &m, nonblocking).map_err(|e| {
            if e.raw_os_error() == Some(libc::EACCES) {
                // The verdict program dropped it (see the drop counters).
                SendError::Syscall {
                    call: "send (dropped by the sockmap verdict program)",
                    source: e,
                }
            } else {
                sys::send_error(to, e)
            }
        })
    }
}

impl Sender for SockmapSender {
    fn send(&self, to: PartyId, desc: Descriptor) -> Result<(), SendError> {
        self.send_with(to, desc, false)
    }

    fn try_send(&self, to: PartyId, desc: Descriptor) -> Result<(), SendError> {
        self.send_with(to, desc, true)
    }
}
