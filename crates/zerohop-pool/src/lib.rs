//! `zerohop-pool`: a chain's shared-memory pool.
//!
//! Owns the memfd region that every party of one chain maps (the gateway and each function
//! instance), the cross-process slot allocator with its per-slot owner records, the party
//! table the agent uses to track instances, and the 16-byte [`Descriptor`].
//!
//! The region is handed out only as a file descriptor (no path another chain could open),
//! sealed against shrinking so no party can make another fault on its mapping.
//!
//! ```text
//!  offset 0        64          128                parties_off      owners_off        slots_off
//!  +--------------+-----------+------------------+----------------+-----------------+----------
//!  | PoolHeader   | reserved  | (pad)            | PartyRecord x P| u64 owner x N   | slot 0 ...
//!  | magic,version|           |                  | 256 B each     | gen:32|owner:32 | N x slot_size
//!  | geometry     |           |                  |                |                 | page aligned
//!  +--------------+-----------+------------------+----------------+-----------------+----------
//!
//!  one slot:  +------------+--------------------+----------------------+---------+
//!             | SlotHeader | metadata (meta_len)| payload (desc.len)   | unused  |
//!             | 32 B       | "name: value\n"... |                      |         |
//!             +------------+--------------------+----------------------+---------+
//! ```
//!
//! `unsafe` is used for the syscalls (in `sys`), for viewing the mapped region as the typed
//! header, atomics and slot bytes, and for the shared-memory aliasing rule: a party reads or
//! writes a slot's bytes only while the owner table names it as the owner.
//!
//! Minimum kernel: 3.17 (memfd, seals); `MFD_HUGETLB` needs 4.14.

#![deny(missing_docs)]

mod descriptor;
mod owner;
#[cfg(not(loom))]
mod pool;
#[cfg(not(loom))]
mod pools;
#[cfg(not(loom))]
pub mod progress;
#[cfg(not(loom))]
pub mod region;
#[cfg(not(loom))]
mod release;
#[cfg(not(loom))]
pub mod state;
pub mod sync;
#[cfg(not(loom))]
mod sys;

pub use descriptor::Descriptor;
pub use owner::{Owner, OwnerTable, OwnerWord, OwnershipError};
#[cfg(not(loom))]
pub use pool::{
    latency_bucket, latency_bucket_bound_us, monotonic_ms, monotonic_ns, OwnedSlot, PartyRecord,
    PartyState, PartyStats, Pool, PoolGeometry, Rejected, SlotHeader, TakeError, HEADER_MAGIC,
    LATENCY_BUCKETS, PARTY_RECORD_LEN, PROTOCOL_VERSION,
};
#[cfg(not(loom))]
pub use pools::Pools;
#[cfg(not(loom))]
pub use progress::Progress;
#[cfg(not(loom))]
pub use state::{State, StateConfig, StateError};

/// Bytes of [`SlotHeader`] at the start of every slot. (Here, not in `pool`: the spec's
/// geometry needs it in a `loom` build too, where the mapped pool is left out.)
pub const SLOT_HEADER_LEN: usize = 32;
/// Bytes of a slot the gateway keeps for a request's metadata (the headers the chain's
/// functions ask for), after the slot header: a request body gets what is left.
pub const META_RESERVE: usize = 1024;

/// Errors from creating or attaching a pool.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    /// A system call failed.
    #[error("{call} failed: {source}")]
    Syscall {
        /// Which call.
        call: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The memfd name contained a NUL byte.
    #[error("pool name {0:?} contains a NUL byte")]
    BadName(String),
    /// Geometry out of range.
    #[error("invalid pool geometry: {0}")]
    Geometry(String),
    /// Huge pages were asked for and the host has too few.
    #[error(
        "hugepages: the pool needs {needed} free 2 MiB huge pages but the host has {free}; \
         reserve them with `echo {needed} > /proc/sys/vm/nr_hugepages` (as root) or set \
         `hugepages: false`"
    )]
    NoHugePages {
        /// Pages the pool needs.
        needed: u64,
        /// Pages free on the host.
        free: u64,
    },
    /// The region does not start with the pool magic.
    #[error("this file descriptor is not a zerohop pool (bad magic)")]
    BadMagic,
    /// The region speaks another protocol version.
    #[error("pool protocol version {found} is not supported (this build speaks {supported})")]
    Version {
        /// Version in the region.
        found: u32,
        /// Version of this build.
        supported: u32,
    },
}
