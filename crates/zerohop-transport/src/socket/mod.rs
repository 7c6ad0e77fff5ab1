//! The `socket` backend: one unix `SOCK_SEQPACKET` socketpair per receiving party. The agent
//! keeps both ends of every pair, so a restarted party inherits the very same socket (with
//! whatever was queued in it); every party inherits all send ends and its own receive end.
//!
//! ```text
//!  fds handed to party p:  [ rx(p), tx(0), tx(1), ..., tx(P-1) ]
//! ```
//!
//! Messages are exactly 16 bytes; `SOCK_SEQPACKET` keeps them whole even with many writers
//! on one send end. The sender is not known from the socket; the endpoint learns it from
//! the slot's owner record.

mod recv;
mod send;

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

pub use self::recv::SocketReceiver;
pub use self::send::SocketSender;
use crate::{sys, Backend, Options, PartyId, Receiver, Sender, Transport, TransportError};

/// The socket transport of one chain (all ends, agent side; or one party's ends).
pub struct SocketTransport {
    parties: u16,
    /// Receive end per party (`None` for other parties in a party's process).
    rx: Vec<Option<Arc<OwnedFd>>>,
    /// Send end per party.
    tx: Arc<Vec<OwnedFd>>,
    opts: Options,
}

impl SocketTransport {
    /// Creates one socketpair per party.
    pub fn create(parties: u16, opts: Options) -> Result<Self, TransportError> {
        if parties == 0 {
            return Err(TransportError::Layout(
                "a chain needs at least one party".into(),
            ));
        }
        let mut rx = Vec::new();
        let mut tx = Vec::new();
        for _ in 0..parties {
            let (r, t) = sys::seqpacket_pair()?;
            sys::set_send_timeout(t.as_fd(), opts.send_timeout_ms)?;
            rx.push(Some(Arc::new(r)));
            tx.push(t);
        }
        Ok(Self {
            parties,
            rx,
            tx: Arc::new(tx),
            opts,
        })
    }

    /// Takes the fds of party `me`, in the order of [`Transport::fds_for`].
    pub fn attach(
        parties: u16,
        me: PartyId,
        fds: Vec<OwnedFd>,
        opts: Options,
    ) -> Result<Self, TransportError> {
        if fds.len() != parties as usize + 1 || me >= parties {
            return Err(TransportError::Layout(format!(
                "socket transport of {parties} parties expects {} fds, got {}",
                parties as usize + 1,
                fds.len()
            )));
        }
        let mut fds = fds.into_iter();
        let own_rx = fds.next().expect("checked length");
        let mut rx: Vec<Option<Arc<OwnedFd>>> = (0..parties).map(|_| None).collect();
        rx[me as usize] = Some(Arc::new(own_rx));
        Ok(Self {
            parties,
            rx,
            tx: Arc::new(fds.collect()),
            opts,
        })
    }

    fn check(&self, p: PartyId) -> Result<(), TransportError> {
        if p >= self.parties {
            return Err(TransportError::NoSuchParty {
                party: p,
                parties: self.parties,
            });
        }
        Ok(())
    }
}

impl Transport for SocketTransport {
    fn backend(&self) -> Backend {
        Backend::Socket
    }

    fn parties(&self) -> u16 {
        self.parties
    }

    fn fds_for(&self, party: PartyId) -> Result<Vec<BorrowedFd<'_>>, TransportError> {
        self.check(party)?;
        let own = self.rx[party as usize].as_ref().ok_or_else(|| {
            TransportError::Layout(format!("this process does not hold party {party}'s socket"))
        })?;
        let mut v = vec![own.as_fd()];
        v.extend(self.tx.iter().map(|t| t.as_fd()));
        Ok(v)
    }

    fn sender(&self, me: PartyId) -> Result<Box<dyn Sender>, TransportError> {
        self.check(me)?;
        let _ = self.opts;
        Ok(Box::new(SocketSender::new(self.tx.clone())))
    }

    fn receiver(&self, me: PartyId) -> Result<Box<dyn Receiver>, TransportError> {
        self.check(me)?;
        let rx = self.rx[me as usize].clone().ok_or_else(|| {
            TransportError::Layout(format!("this process does not hold party {me}'s socket"))
        })?;
        Ok(Box::new(SocketReceiver::new(rx)?))
    }
}
