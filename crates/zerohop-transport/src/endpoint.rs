//! The validating receive side: what the transport delivered is checked against the pool
//! and the policy before anyone trusts it.

use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use zerohop_pool::{
    Descriptor, OwnedSlot, Owner, OwnershipError, Pools, Rejected, SlotHeader, TakeError,
};

use crate::blame::{fault_of_take, Blame, Fault};
use crate::{PartyId, Policy, Raw, Receiver, Stop};

/// Counters of one endpoint, readable from other threads.
#[derive(Debug, Default)]
pub struct EndpointStats {
    /// Descriptors accepted.
    pub accepted: AtomicU64,
    /// Addressed to another function.
    pub dropped_wrong_function: AtomicU64,
    /// Slot out of range (or in a pool of a domain we are not part of), stale generation, or
    /// held by a party not allowed to reach us.
    pub dropped_ownership: AtomicU64,
    /// Length beyond the slot (or not a descriptor at all).
    pub dropped_malformed: AtomicU64,
    /// Per sending party (index = party): descriptors dropped for that sender's own fault
    /// (see [`crate::blame`]); counted on the drop path only.
    pub faults_from: Box<[AtomicU64]>,
}

impl EndpointStats {
    /// All drops together.
    pub fn dropped(&self) -> u64 {
        self.dropped_wrong_function.load(Ordering::Relaxed)
            + self.dropped_ownership.load(Ordering::Relaxed)
            + self.dropped_malformed.load(Ordering::Relaxed)
    }

    /// Descriptors dropped for `sender`'s own fault (0 for a party that does not exist).
    pub fn faults_from(&self, sender: PartyId) -> u64 {
        self.faults_from
            .get(usize::from(sender))
            .map_or(0, |c| c.load(Ordering::Relaxed))
    }
}

/// A validated descriptor: the slot is now owned by this party.
pub struct Delivery {
    /// The party that sent it (the queue or socket it came in on, which the slot's owner
    /// record named too).
    pub from: PartyId,
    /// The descriptor as received.
    pub desc: Descriptor,
    /// The slot, owned by us; freed when dropped.
    pub slot: OwnedSlot,
    /// The slot's header, read once when the slot was taken, with `meta_len + desc.len`
    /// within the slot. Use this copy, never the shared header: the sender may still write.
    pub header: SlotHeader,
    /// The kernel refused the edge from `from`'s function to `desc.next` and returned the
    /// descriptor to this gateway party instead (see [`Raw::refused`](crate::Raw)); the
    /// request must be answered with an error.
    pub refused: bool,
}

/// Receiver + validation for one party.
pub struct Endpoint {
    pools: Pools,
    policy: Arc<Policy>,
    me: PartyId,
    my_function: u8,
    rx: Box<dyn Receiver>,
    stats: Arc<EndpointStats>,
    /// Told of every descriptor dropped for its sender's fault (see [`crate::blame`]).
    blame: Option<Arc<dyn Blame>>,
}

/// Most descriptors a receive call looks at, valid or not, before it returns or yields
/// (see [`Endpoint::try_recv`]).
pub const RECV_BUDGET: usize = 64;

impl Endpoint {
    /// Wraps the receiver of party `me`, which maps `pools` (a descriptor naming a slot of
    /// any other pool is dropped as out of range).
    pub fn new(
        pools: impl Into<Pools>,
        policy: Arc<Policy>,
        me: PartyId,
        rx: Box<dyn Receiver>,
    ) -> Self {
        let my_function = policy.function_of(me).unwrap_or(Descriptor::GATEWAY);
        Self {
            pools: pools.into(),
            me,
            my_function,
            stats: Arc::new(EndpointStats {
                faults_from: (0..policy.parties()).map(|_| AtomicU64::new(0)).collect(),
                ..EndpointStats::default()
            }),
            policy,
            rx,
            blame: None,
        }
    }

    /// Reports every descriptor dropped for its sender's fault to `blame`, with the sender
    /// (the queue or socket it came in on): how the agent learns which party sends garbage.
    /// Only the drop path calls it; a valid descriptor costs nothing more.
    pub fn with_blame(mut self, blame: Arc<dyn Blame>) -> Self {
        self.blame = Some(blame);
        self
    }

    /// The counters.
    pub fn stats(&self) -> Arc<EndpointStats> {
        self.stats.clone()
    }

    /// Handle to stop a blocked [`Endpoint::recv`] from another thread.
    pub fn stopper(&self) -> Arc<dyn Stop> {
        self.rx.stopper()
    }

    /// Blocks until a valid descriptor arrives (invalid ones are dropped and counted);
    /// `None` once stopped. The thread yields its CPU after every [`RECV_BUDGET`] invalid
    /// descriptors in a row: a sender that keeps its queue full of garbage gets no more than
    /// its turn (the transports take queues round-robin).
    pub fn recv(&mut self) -> Option<Delivery> {
        let mut invalid = 0;
        loop {
            let raw = self.rx.peek()?;
            if let Some(d) = self.accept(raw) {
                return Some(d);
            }
            invalid += 1;
            if invalid % RECV_BUDGET == 0 {
                std::thread::yield_now();
            }
        }
    }

    /// Like [`Endpoint::recv`] without waiting: the next valid descriptor queued now, if any
    /// (invalid ones are dropped and counted on the way). Looks at no more than
    /// [`RECV_BUDGET`] descriptors: `None` when nothing is queued or when that many were
    /// invalid, so a caller on an event loop does bounded work per call however much
    /// garbage a sender queues (it yields, then calls again: [`Endpoint::arm`] says whether
    /// more is queued).
    pub fn try_recv(&mut self) -> Option<Delivery> {
        for _ in 0..RECV_BUDGET {
            let raw = self.rx.try_peek()?;
            if let Some(d) = self.accept(raw) {
                return Some(d);
            }
        }
        None
    }

    /// Takes the slot of a peeked descriptor over while the descriptor is still queued, then
    /// consumes it (see `Receiver`): a valid one is counted and delivered.
    fn accept(&mut self, raw: Raw) -> Option<Delivery> {
        let delivery = self.validate(raw);
        self.rx.consume();
        if delivery.is_some() {
            self.stats.accepted.fetch_add(1, Ordering::Relaxed);
        }
        delivery
    }

    /// For receiving on a tokio runtime: the transport's wait descriptor (see
    /// [`Receiver::event_fd`]) registered with the runtime's reactor, `None` where the
    /// transport can only be waited on by a blocked thread. Must be called on a runtime.
    pub fn poller(&mut self) -> Option<std::io::Result<tokio::io::unix::AsyncFd<OwnedFd>>> {
        let fd = match self.rx.event_fd()?.try_clone_to_owned() {
            Ok(fd) => fd,
            Err(e) => return Some(Err(e)),
        };
        // SAFETY: the AsyncFd owns `fd` (a duplicate of the transport's descriptor) for its
        // whole life, so it stays open and names the same file description until dropped.
        let registered = unsafe {
            tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE)
        };
        Some(registered.map_err(|e| e.into_parts().1))
    }

    /// See [`Receiver::arm`].
    pub fn arm(&mut self) -> bool {
        self.rx.arm()
    }

    /// See [`Receiver::disarm`].
    pub fn disarm(&mut self) {
        self.rx.disarm()
    }

    /// Counts a dropped descriptor here and in this party's record (first pool), where the
    /// agent's metrics read it; one its sender alone made invalid (`fault`) is reported to
    /// the blame sink too.
    fn reject(&self, why: Rejected, from: PartyId, fault: Option<Fault>) {
        if let Some(fault) = fault {
            if let Some(c) = self.stats.faults_from.get(usize::from(from)) {
                c.fetch_add(1, Ordering::Relaxed);
            }
            if let Some(blame) = &self.blame {
                blame.blame(from, fault);
            }
        }
        let counter = match why {
            Rejected::WrongFunction => &self.stats.dropped_wrong_function,
            Rejected::Ownership => &self.stats.dropped_ownership,
            Rejected::Malformed => &self.stats.dropped_malformed,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        if let Some(r) = self.pools.records(self.me).next() {
            r.count_rejected(why);
        }
    }

    fn validate(&self, raw: Raw) -> Option<Delivery> {
        let desc = raw.desc;
        if raw.refused {
            // Only the kernel marks a descriptor refused, and only towards a gateway party;
            // it still names a slot its sender must hold.
            if self.my_function != Descriptor::GATEWAY {
                // Not the sender's fault: only the kernel sets the mark.
                self.reject(Rejected::Malformed, raw.from, None);
                return None;
            }
        } else if desc.next != self.my_function {
            // The 16 bytes are the sender's alone (its queue, its socket).
            self.reject(
                Rejected::WrongFunction,
                raw.from,
                Some(Fault::WrongFunction),
            );
            return None;
        } else {
            // `raw.from` is the sender of the queue (ring) or socket it came in on, or the
            // party the kernel stamped (sockmap), and the transports deliver only along the
            // policy's edges into this party: no lookup per descriptor.
            debug_assert!(self
                .policy
                .function_of(raw.from)
                .is_some_and(|f| self.policy.allows(f, self.my_function)));
        }
        let allowed = |o: Owner| o.as_party() == Some(raw.from);
        match self.pools.take(&desc, Owner::party(self.me), allowed) {
            Ok((from, slot, header)) => Some(Delivery {
                from: from.as_party().expect("allowed owners are parties"),
                desc,
                slot,
                header,
                refused: raw.refused,
            }),
            Err(err) => {
                let why = match err {
                    TakeError::Ownership(
                        OwnershipError::OutOfRange(_)
                        | OwnershipError::StaleGeneration { .. }
                        | OwnershipError::WrongOwner { .. },
                    ) => Rejected::Ownership,
                    TakeError::Length { .. } => Rejected::Malformed,
                };
                self.reject(why, raw.from, fault_of_take(&desc, &err));
                None
            }
        }
    }
}
