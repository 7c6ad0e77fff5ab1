//! The `socket` backend: one unix `SOCK_SEQPACKET` socketpair per allowed edge (sender,
//! receiver). The agent keeps both ends of every pair, so a restarted party inherits the
//! very same sockets (with whatever was queued in them); each party inherits the receive
//! ends of the edges into it and the send ends of the edges out of it, nothing else.
//!
//! ```text
//!  fds handed to party p:  [ rx(s, p) for s in senders(p) ] ++ [ tx(p, t) for t in targets(p) ]
//! ```
//!
//! Messages are exactly 16 bytes; `SOCK_SEQPACKET` keeps them whole. The receiver knows the
//! sender from the socket a message came in on, and a sender that shuts its end down only
//! closes its own edge.

pub(crate) mod recv;
mod send;

use std::collections::BTreeMap;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

pub use self::recv::SocketReceiver;
pub use self::send::SocketSender;
use crate::{sys, Backend, Options, PartyId, Policy, Receiver, Sender, Transport, TransportError};

/// The two ends of one edge; a party's process holds only its own end.
#[derive(Default)]
struct Edge {
    rx: Option<Arc<OwnedFd>>,
    tx: Option<Arc<OwnedFd>>,
}

/// The socket transport of one chain (all ends, agent side; or one party's ends).
pub struct SocketTransport {
    policy: Policy,
    edges: BTreeMap<(PartyId, PartyId), Edge>,
    opts: Options,
}

impl SocketTransport {
    /// Creates one socketpair per allowed edge of `policy`.
    pub fn create(policy: &Policy, opts: Options) -> Result<Self, TransportError> {
        if policy.parties() == 0 {
            return Err(TransportError::Layout(
                "a chain needs at least one party".into(),
            ));
        }
        let mut edges = BTreeMap::new();
        for s in 0..policy.parties() {
            for r in policy.targets(s) {
                let (rx, tx) = sys::seqpacket_pair()?;
                sys::set_send_timeout(tx.as_fd(), opts.send_timeout_ms)?;
                edges.insert(
                    (s, r),
                    Edge {
                        rx: Some(Arc::new(rx)),
                        tx: Some(Arc::new(tx)),
                    },
                );
            }
        }
        Ok(Self {
            policy: policy.clone(),
            edges,
            opts,
        })
    }

    /// Takes the fds of party `me`, in the order of [`Transport::fds_for`].
    pub fn attach(
        policy: &Policy,
        me: PartyId,
        fds: Vec<OwnedFd>,
        opts: Options,
    ) -> Result<Self, TransportError> {
        let (senders, targets) = (policy.senders(me), policy.targets(me));
        if me >= policy.parties() || fds.len() != senders.len() + targets.len() {
            return Err(TransportError::Layout(format!(
                "socket transport: party {me} expects {} fds, got {}",
                senders.len() + targets.len(),
                fds.len()
            )));
        }
        let mut fds = fds.into_iter();
        let mut edges: BTreeMap<(PartyId, PartyId), Edge> = BTreeMap::new();
        for s in senders {
            edges.entry((s, me)).or_default().rx = Some(Arc::new(fds.next().expect("counted")));
        }
        for t in targets {
            edges.entry((me, t)).or_default().tx = Some(Arc::new(fds.next().expect("counted")));
        }
        Ok(Self {
            policy: policy.clone(),
            edges,
            opts,
        })
    }

    fn check(&self, p: PartyId) -> Result<(), TransportError> {
        if p >= self.policy.parties() {
            return Err(TransportError::NoSuchParty {
                party: p,
                parties: self.policy.parties(),
            });
        }
        Ok(())
    }

    fn end(
        &self,
        edge: (PartyId, PartyId),
        pick: impl Fn(&Edge) -> Option<&Arc<OwnedFd>>,
    ) -> Result<&Arc<OwnedFd>, TransportError> {
        self.edges.get(&edge).and_then(pick).ok_or_else(|| {
            TransportError::Layout(format!(
                "this process does not hold the socket of edge {} -> {}",
                edge.0, edge.1
            ))
        })
    }
}

impl Transport for SocketTransport {
    fn backend(&self) -> Backend {
        Backend::Socket
    }

    fn parties(&self) -> u16 {
        self.policy.parties()
    }

    fn fds_for(&self, party: PartyId) -> Result<Vec<OwnedFd>, TransportError> {
        self.check(party)?;
        let dup = |fd: &Arc<OwnedFd>| {
            fd.try_clone().map_err(|source| TransportError::Syscall {
                call: "dup",
                source,
            })
        };
        let mut v = Vec::new();
        for s in self.policy.senders(party) {
            v.push(dup(self.end((s, party), |e| e.rx.as_ref())?)?);
        }
        for t in self.policy.targets(party) {
            v.push(dup(self.end((party, t), |e| e.tx.as_ref())?)?);
        }
        Ok(v)
    }

    fn queued(&self, party: PartyId) -> usize {
        if self.check(party).is_err() {
            return 0;
        }
        // Every message is one 16-byte descriptor; a socket's byte count says how many.
        self.policy
            .senders(party)
            .into_iter()
            .filter_map(|s| self.edges.get(&(s, party))?.rx.as_ref())
            .map(|rx| sys::queued_bytes(rx.as_fd()) / 16)
            .sum()
    }

    fn sender(&self, me: PartyId) -> Result<Box<dyn Sender>, TransportError> {
        self.check(me)?;
        let mut tx = vec![None; self.policy.parties() as usize];
        for t in self.policy.targets(me) {
            tx[t as usize] = Some(self.end((me, t), |e| e.tx.as_ref())?.clone());
        }
        Ok(Box::new(SocketSender::new(tx, self.opts)))
    }

    fn receiver(&self, me: PartyId) -> Result<Box<dyn Receiver>, TransportError> {
        self.check(me)?;
        let mut lanes = Vec::new();
        for s in self.policy.senders(me) {
            lanes.push((s, self.end((s, me), |e| e.rx.as_ref())?.clone()));
        }
        Ok(Box::new(SocketReceiver::new(lanes)?))
    }
}
