//! `zerohop-transport`: how descriptors move between the parties of a chain and wake the
//! receiver.
//!
//! One trait pair, [`Sender`] and [`Receiver`], and one factory, [`Transport`], with three
//! backends today:
//!
//! * [`Backend::Ring`] (default): bounded single-producer queues in shared memory, one per
//!   allowed edge (sender, receiver), so a sender that dies mid-send wedges nobody else; a
//!   queue's tail and entries are in its producer's memfd, its head in its consumer's, and
//!   every other party maps them read-only or not at all. The receiver spins briefly, then
//!   sleeps on all its queues' tails at once; a sender makes the wake syscall only when the
//!   receiver has said it sleeps.
//! * [`Backend::Socket`]: one `SOCK_SEQPACKET` socketpair per allowed edge, the reference
//!   and fallback. Each party inherits only the ends of its own edges.
//! * [`Backend::Poll`]: the ring, with function instances' receivers that never sleep
//!   (SPRIGHT's D-mode): for comparison, a core per polling thread even when idle.
//! * [`Backend::Sockmap`]: SPRIGHT's S-mode, one TCP loopback socket per party in a BPF
//!   sockmap; an eBPF program in the kernel redirects each descriptor to the next
//!   function's socket, enforces the chain's declared edges and counts per function (see
//!   [`sockmap`]). Needs root (CAP_BPF, CAP_NET_ADMIN).
//!
//! A transport never sees payloads. What it delivers is checked by an [`Endpoint`] against
//! the pool (slot in range, length within the slot, generation, current owner) and against
//! the chain's [`Policy`] (the sender may reach this function); refused descriptors are
//! dropped and counted.
//!
//! The sockmap backend's eBPF program is written in C (`bpf/`, with `bpf/zerohop.h` the one
//! definition of what C and Rust share), compiled by clang from `build.rs`, and loaded with
//! aya rather than libbpf-rs: aya is pure Rust and well kept, so neither the agent nor any
//! function's runtime links libbpf, libelf or zlib, and it reads the BTF map definitions
//! clang emits.
//!
//! `unsafe` is used for the futex, socket and eventfd syscalls (module `sys`) and to view the
//! ring region as atomics. Minimum kernel: 3.17 (memfd); 5.10 for `sockmap`.

#![deny(missing_docs)]

#[cfg(not(loom))]
pub mod blame;
#[cfg(not(loom))]
mod endpoint;
#[cfg(not(loom))]
mod pick;
mod plan;
mod policy;
pub mod ring;
#[cfg(not(loom))]
pub mod socket;
#[cfg(not(loom))]
pub mod sockmap;
#[cfg(not(loom))]
mod sys;

use std::os::fd::{BorrowedFd, OwnedFd};

#[cfg(not(loom))]
pub use blame::{Blame, Fault};
#[cfg(not(loom))]
pub use endpoint::{Delivery, Endpoint, EndpointStats, RECV_BUDGET};
#[cfg(not(loom))]
pub use pick::Picker;
pub use plan::{
    handover, Domain, FunctionPlan, Hop, JoinPolicy, Plan, PlanExt, PoolPlan, RequestIds,
    RoutePlan, StatePlan,
};
pub use policy::{Policy, PolicyError, GATEWAY_FN};
#[cfg(not(loom))]
pub use sockmap::KernelCounters;
use zerohop_pool::Descriptor;

pub use zerohop_spec::{Backend, PartyId};

/// Errors of setting up or using a transport.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// A system call failed.
    #[error("{call} failed: {source}")]
    Syscall {
        /// Which call.
        call: &'static str,
        /// OS error.
        #[source]
        source: std::io::Error,
    },
    /// The shared region could not be made or mapped.
    #[error(transparent)]
    Region(#[from] zerohop_pool::PoolError),
    /// The region or fds handed over do not fit the expected layout.
    #[error("transport layout mismatch: {0}")]
    Layout(String),
    /// The backend cannot run on this machine or with these privileges; says what is
    /// missing.
    #[error("the sockmap transport cannot run here: {0}; use `transport: ring`")]
    Unsupported(String),
    /// Party index out of range.
    #[error("party {party} is out of range (the chain has {parties})")]
    NoSuchParty {
        /// Asked for.
        party: PartyId,
        /// Parties in the chain.
        parties: u16,
    },
}

/// Why a send failed. The descriptor was not delivered; its slot is still the sender's.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// The receiver's queue stayed full for the whole send timeout.
    #[error("receiver {0}'s queue is full")]
    Full(PartyId),
    /// The chain's policy allows no edge from this party to the receiver.
    #[error("the chain's routes allow no edge to party {0}")]
    NotAllowed(PartyId),
    /// No such receiver.
    #[error("party {0} does not exist")]
    NoSuchParty(PartyId),
    /// The OS refused.
    #[error("{call} failed: {source}")]
    Syscall {
        /// Which call.
        call: &'static str,
        /// OS error.
        #[source]
        source: std::io::Error,
    },
}

/// The sending side of one party. Shared by all threads of that party.
pub trait Sender: Send + Sync {
    /// Delivers `desc` to party `to`, waking it if it sleeps. Never blocks for long: a full
    /// queue is retried for a bounded time, then reported.
    fn send(&self, to: PartyId, desc: Descriptor) -> Result<(), SendError>;
    /// Like [`Sender::send`], but never waits: a full queue is [`SendError::Full`] at once.
    fn try_send(&self, to: PartyId, desc: Descriptor) -> Result<(), SendError>;
    /// Descriptors this party sent to `to` that `to` has not taken yet, as far as this side
    /// can tell cheaply (0 where the backend cannot tell): what instance picking counts
    /// beside the handlers' load ([`Picker`]).
    fn backlog(&self, to: PartyId) -> u32 {
        let _ = to;
        0
    }
}

/// A descriptor as it came off the transport, not yet validated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Raw {
    /// Sender: the queue (ring) or socket (socket) it came in on, one per allowed edge.
    pub from: PartyId,
    /// The descriptor.
    pub desc: Descriptor,
    /// The kernel refused to carry it along an edge the chain does not declare (from
    /// `from`'s function to `desc.next`) and returned it to the gateway ([`Backend::Sockmap`]
    /// only).
    pub refused: bool,
}

/// The receiving side of one party (exactly one thread receives).
///
/// Receiving is two steps so that a receiver that dies at any instruction loses nothing:
/// [`peek`](Receiver::peek) shows the next descriptor while it stays queued, the caller takes
/// the slot over in the pool, and only then [`consume`](Receiver::consume) removes it. A
/// receiver killed before the take leaves the descriptor queued for its restarted instance;
/// killed after it, the slot is the dead party's and reclaim frees it (the re-delivered
/// descriptor then fails the ownership check).
pub trait Receiver: Send {
    /// Blocks until a descriptor is queued and returns it without removing it; returns the
    /// same one until [`consume`](Receiver::consume). `None` once [`Stop::stop`] was called
    /// or when nothing can ever arrive.
    fn peek(&mut self) -> Option<Raw>;
    /// Removes the descriptor the last [`peek`](Receiver::peek) returned (no-op without one).
    fn consume(&mut self);
    /// [`peek`](Receiver::peek) and [`consume`](Receiver::consume) in one.
    fn recv(&mut self) -> Option<Raw> {
        let raw = self.peek()?;
        self.consume();
        Some(raw)
    }
    /// A handle another thread can use to make `peek` return `None`.
    fn stopper(&self) -> std::sync::Arc<dyn Stop>;

    /// One look without waiting: the next descriptor, left queued as by
    /// [`peek`](Receiver::peek), or `None` if nothing is queued now.
    fn try_peek(&mut self) -> Option<Raw>;

    /// For receiving from an event loop instead of a blocked thread: a descriptor that turns
    /// readable when a sender may have queued something after [`arm`](Receiver::arm). `None`
    /// when this receiver can only be waited on by a thread blocked in `peek`.
    fn event_fd(&mut self) -> Option<BorrowedFd<'_>> {
        None
    }

    /// Says the caller is about to wait on [`event_fd`](Receiver::event_fd); `false` if
    /// something is queued already (take it first, then arm again).
    fn arm(&mut self) -> bool {
        true
    }

    /// After [`event_fd`](Receiver::event_fd) turned readable: takes the wake-up in and says
    /// the caller is awake (senders need not wake it until the next `arm`).
    fn disarm(&mut self) {}
}

/// Stops a blocked receiver from another thread.
pub trait Stop: Send + Sync {
    /// Makes the receiver's `recv` return `None` now and from then on.
    fn stop(&self);
}

/// The transport of one chain, as created by the agent or attached by a party.
pub trait Transport: Send + Sync {
    /// Which backend.
    fn backend(&self) -> Backend;
    /// Number of parties.
    fn parties(&self) -> u16;
    /// The file descriptors a party's process must inherit, in order (new descriptors,
    /// owned by the caller).
    fn fds_for(&self, party: PartyId) -> Result<Vec<OwnedFd>, TransportError>;
    /// Agent side, before any sender or receiver is made: this process acts only as
    /// `parties` from now on, so everything only other parties use may stop taking room
    /// here (the ring unmaps those regions and keeps just their descriptors, which makes
    /// every instance's `fork` cheaper). `sender` and `receiver` then work for `parties`
    /// only; `fds_for` still works for every party.
    fn act_only_as(&mut self, parties: &[PartyId]) -> Result<(), TransportError> {
        let _ = parties;
        Ok(())
    }
    /// Agent side: descriptors waiting now in the queues into `party` (sent, not yet
    /// taken), over all its senders; what the scaler reads as queue depth, and how it finds
    /// a party with no process that something was sent to. A snapshot, read as input (a
    /// party can scribble on its own queue indices). 0 for a party that does not exist.
    fn queued(&self, party: PartyId) -> usize {
        let _ = party;
        0
    }
    /// Agent side: what `sender` published on each of its queues since it was last asked,
    /// as `(receiver, descriptor)` pairs appended to `out`, for judging a sender by what it
    /// alone wrote (see [`blame::fault_of_sent`]). `seen` is the caller's memory of the
    /// queues' tails: empty (a new instance) it is only filled with the tails now, so what a
    /// predecessor left is never read. At most the queue's capacity less one per queue (the
    /// ring keeps no more; an entry the sender may be overwriting is left out). `false`
    /// where the backend keeps no copy of what was sent (sockets) or `sender` does not exist.
    fn published(
        &self,
        sender: PartyId,
        seen: &mut Vec<u32>,
        out: &mut Vec<(PartyId, Descriptor)>,
    ) -> bool {
        let _ = (sender, seen, out);
        false
    }
    /// Agent side: the counters the transport keeps in the kernel ([`Backend::Sockmap`]);
    /// `None` for the other backends.
    #[cfg(not(loom))]
    fn kernel_counters(&self) -> Option<KernelCounters> {
        None
    }
    /// The sender of party `me`.
    fn sender(&self, me: PartyId) -> Result<Box<dyn Sender>, TransportError>;
    /// The receiver of party `me`.
    fn receiver(&self, me: PartyId) -> Result<Box<dyn Receiver>, TransportError>;
}

/// Tunables shared by the backends.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// Descriptors each per-sender queue holds (ring; rounded up to a power of two).
    pub queue_capacity: u32,
    /// How long a receiver spins on empty queues before it sleeps, in microseconds.
    pub spin_us: u32,
    /// How long a sender retries a full queue before it gives up, in milliseconds.
    pub send_timeout_ms: u32,
    /// Ring receivers of function instances never sleep ([`Backend::Poll`]); set by
    /// [`create`] and [`attach`] from the backend.
    pub poll: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            queue_capacity: 1024,
            spin_us: 20,
            send_timeout_ms: 1000,
            poll: false,
        }
    }
}

/// Creates the transport of a chain for the parties and edges of `policy` (agent side).
#[cfg(not(loom))]
pub fn create(
    backend: Backend,
    name: &str,
    policy: &Policy,
    opts: Options,
) -> Result<Box<dyn Transport>, TransportError> {
    Ok(match backend {
        Backend::Ring => Box::new(ring::RingTransport::create(name, policy, opts)?),
        Backend::Poll => Box::new(ring::RingTransport::create(
            name,
            policy,
            Options { poll: true, ..opts },
        )?),
        Backend::Socket => Box::new(socket::SocketTransport::create(policy, opts)?),
        Backend::Sockmap => Box::new(sockmap::SockmapTransport::create(policy, opts)?),
    })
}

/// Attaches to a chain's transport from the fds a party inherited (party side), in the
/// order [`Transport::fds_for`] gave them.
#[cfg(not(loom))]
pub fn attach(
    backend: Backend,
    policy: &Policy,
    me: PartyId,
    fds: Vec<OwnedFd>,
    opts: Options,
) -> Result<Box<dyn Transport>, TransportError> {
    Ok(match backend {
        Backend::Ring => Box::new(ring::RingTransport::attach(policy, me, fds, opts)?),
        Backend::Poll => Box::new(ring::RingTransport::attach(
            policy,
            me,
            fds,
            Options { poll: true, ..opts },
        )?),
        Backend::Socket => Box::new(socket::SocketTransport::attach(policy, me, fds, opts)?),
        Backend::Sockmap => Box::new(sockmap::SockmapTransport::attach(policy, me, fds, opts)?),
    })
}
