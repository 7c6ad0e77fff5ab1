//! The mapped pool region: header, party table, owner words and slots.

use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::Arc;

use crate::owner::{Owner, OwnerTable, OwnershipError};
use crate::region::Region;
use crate::sync::{AtomicU32, AtomicU64, Ordering};
use crate::{sys, Descriptor, PoolError, SLOT_HEADER_LEN};

/// First 8 bytes of every pool region.
pub const HEADER_MAGIC: [u8; 8] = *b"ZHPOOL\0\0";
/// Version of the shared-memory protocol (`docs/protocol.md`).
pub const PROTOCOL_VERSION: u32 = 6;

const PAGE: usize = 4096;
const HUGE_PAGE: usize = 2 << 20;
const PARTIES_OFFSET: usize = 128;

/// The fixed header at offset 0 (64 bytes, written once by the creator).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct PoolHeader {
    magic: [u8; 8],
    version: u32,
    slot_count: u32,
    slot_size: u32,
    max_parties: u32,
    flags: u32,
    first_slot: u32,
    parties_offset: u64,
    owners_offset: u64,
    slots_offset: u64,
    total_len: u64,
}
const _: () = assert!(core::mem::size_of::<PoolHeader>() == 64);
const FLAG_HUGETLB: u32 = 1;
/// Header flag: a releasing pool (a large pool): a freed slot's pages go back to the kernel.
const FLAG_RELEASE: u32 = 2;

/// Lifecycle of a party slot in the party table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum PartyState {
    /// Never started.
    Empty = 0,
    /// Process started, not attached yet.
    Starting = 1,
    /// Attached and receiving.
    Ready = 2,
    /// Died; its slots are being or have been reclaimed.
    Dead = 3,
    /// Process started to wait parked, not attached yet (the agent's choice).
    Parking = 4,
    /// Attached and waiting, taking nothing from its queue, until the agent sets it
    /// `Ready` (activation: one store and a futex wake on the state word).
    Parked = 5,
    /// No process, by the agent's choice (scaled in or to zero): what is sent to it stays
    /// queued until the agent starts it again.
    Stopped = 6,
    /// Running, finishing what it has; senders pick it only when nothing else is left.
    Draining = 7,
}

impl PartyState {
    fn from_word(w: u32) -> Self {
        match w {
            1 => PartyState::Starting,
            2 => PartyState::Ready,
            3 => PartyState::Dead,
            4 => PartyState::Parking,
            5 => PartyState::Parked,
            6 => PartyState::Stopped,
            7 => PartyState::Draining,
            _ => PartyState::Empty,
        }
    }
}

/// Bytes of one [`PartyRecord`].
pub const PARTY_RECORD_LEN: usize = 256;
/// Buckets of a party's handler-latency histogram: bucket `k < 23` counts handler runs of
/// less than `2^k` microseconds (and at least `2^(k-1)`), the last one every longer run.
pub const LATENCY_BUCKETS: usize = 24;

/// Upper bound in microseconds of latency bucket `k` (`None` for the last, unbounded one).
pub fn latency_bucket_bound_us(k: usize) -> Option<u64> {
    (k + 1 < LATENCY_BUCKETS).then(|| 1u64 << k)
}

/// The bucket a handler run of `us` microseconds falls in.
pub fn latency_bucket(us: u64) -> usize {
    // Smallest k with us < 2^k, i.e. the bit length of `us`.
    ((u64::BITS - us.leading_zeros()) as usize).min(LATENCY_BUCKETS - 1)
}

/// One entry of the party table (256 bytes). Its state, pid and restarts are written by the
/// agent (the party sets itself `Ready`); its counters by the party itself, and read by the
/// agent for metrics and scaling. A hostile party can lie in its own counters only: readers
/// treat every value as input.
///
/// ```text
///  0 state u32     4 pid u32      8 restarts u32   12 busy u32
/// 16 handled u64  24 failed u64  32 latency_us_sum u64
/// 40 rejected_function u64  48 rejected_ownership u64  56 rejected_malformed u64
/// 64 latency buckets: 24 x u64 (non-cumulative)
/// ```
#[repr(C, align(64))]
pub struct PartyRecord {
    state: AtomicU32,
    pid: AtomicU32,
    restarts: AtomicU32,
    busy: AtomicU32,
    handled: AtomicU64,
    failed: AtomicU64,
    latency_us_sum: AtomicU64,
    rejected: [AtomicU64; 3],
    buckets: [AtomicU64; LATENCY_BUCKETS],
}
const _: () = assert!(core::mem::size_of::<PartyRecord>() == PARTY_RECORD_LEN);

/// Why an endpoint dropped a descriptor (the counters of [`PartyRecord::count_rejected`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rejected {
    /// It named another function than the receiver's.
    WrongFunction = 0,
    /// Its slot was not the sender's to hand over (owner or generation mismatch).
    Ownership = 1,
    /// Slot out of range, length or header inconsistent.
    Malformed = 2,
}

/// A party's counters at one instant (copied out of shared memory; input, not truth).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PartyStats {
    /// Requests in its handler now.
    pub busy: u32,
    /// Requests its handler finished.
    pub handled: u64,
    /// Of those, how many ended in an error (an error returned, or a panic).
    pub failed: u64,
    /// Sum of the handler times, microseconds.
    pub latency_us_sum: u64,
    /// Descriptors dropped: wrong function, ownership, malformed.
    pub rejected: [u64; 3],
    /// Handler-time histogram, non-cumulative (see [`latency_bucket`]).
    pub buckets: [u64; LATENCY_BUCKETS],
}

impl PartyRecord {
    /// Current state.
    pub fn state(&self) -> PartyState {
        // SYNC POINT: Acquire pairs with the Release in `set_state` by the agent or party.
        PartyState::from_word(self.state.load(Ordering::Acquire))
    }
    /// Sets the state to `to` if it is `from`; the state it found otherwise.
    pub fn compare_set_state(&self, from: PartyState, to: PartyState) -> Result<(), PartyState> {
        // SYNC POINT: AcqRel/Acquire as in `set_state`/`state`: one transition of the
        // agent-party handshake (Parking -> Parked by the party, Parked -> Ready by the agent).
        self.state
            .compare_exchange(from as u32, to as u32, Ordering::AcqRel, Ordering::Acquire)
            .map(|_| ())
            .map_err(PartyState::from_word)
    }
    /// The party, at attach: `Starting` becomes `Ready`; `Parking` becomes `Parked`, and then
    /// it waits (asleep in the kernel) until the state is no longer `Parked`. Returns the
    /// state it goes on with: `Ready` to serve, anything else to stop (the agent stops a
    /// parked instance it no longer wants with a signal; a state it did not expect is
    /// returned as is).
    #[cfg(not(loom))]
    pub fn attach_or_park(&self) -> PartyState {
        match self.compare_set_state(PartyState::Starting, PartyState::Ready) {
            Ok(()) => return PartyState::Ready,
            Err(PartyState::Parking) => {}
            Err(other) => return other,
        }
        if let Err(other) = self.compare_set_state(PartyState::Parking, PartyState::Parked) {
            // Activated between the two looks (Parking -> Starting by the agent).
            return match other {
                PartyState::Starting => self.attach_or_park(),
                s => s,
            };
        }
        loop {
            let s = self.state();
            if s != PartyState::Parked {
                return s;
            }
            // Woken by `activate`, or a second later to look again (a lost wake-up costs
            // at most that; the agent's wake comes after its store).
            sys::futex_wait(
                &self.state,
                PartyState::Parked as u32,
                std::time::Duration::from_secs(1),
            );
        }
    }
    /// The agent: activates a parked party (`Parked` -> `Ready`, then wakes it) or one that
    /// will park (`Parking` -> `Starting`, so it serves as soon as it attaches). Returns
    /// whether it did either.
    #[cfg(not(loom))]
    pub fn activate(&self) -> bool {
        if self
            .compare_set_state(PartyState::Parked, PartyState::Ready)
            .is_ok()
        {
            sys::futex_wake_all(&self.state);
            return true;
        }
        self.compare_set_state(PartyState::Parking, PartyState::Starting)
            .is_ok()
    }
    /// Sets the state.
    pub fn set_state(&self, s: PartyState) {
        // SYNC POINT: Release pairs with the Acquire in `state` (senders choosing an instance,
        // the agent waiting for readiness).
        self.state.store(s as u32, Ordering::Release);
    }
    /// Pid of the process, 0 if none.
    pub fn pid(&self) -> u32 {
        self.pid.load(Ordering::Relaxed)
    }
    /// Records the pid.
    pub fn set_pid(&self, pid: u32) {
        self.pid.store(pid, Ordering::Relaxed);
    }
    /// Times this party was restarted.
    pub fn restarts(&self) -> u32 {
        self.restarts.load(Ordering::Relaxed)
    }
    /// Counts a restart.
    pub fn count_restart(&self) {
        self.restarts.fetch_add(1, Ordering::Relaxed);
    }

    // The counters below are statistics: Relaxed, no ordering with anything else.

    /// A request entered the handler.
    pub fn handler_started(&self) {
        self.busy.fetch_add(1, Ordering::Relaxed);
    }
    /// A request left the handler after `us` microseconds, `ok` or not.
    pub fn handler_finished(&self, us: u64, ok: bool) {
        self.busy.fetch_sub(1, Ordering::Relaxed);
        self.handled.fetch_add(1, Ordering::Relaxed);
        if !ok {
            self.failed.fetch_add(1, Ordering::Relaxed);
        }
        self.latency_us_sum.fetch_add(us, Ordering::Relaxed);
        self.buckets[latency_bucket(us)].fetch_add(1, Ordering::Relaxed);
    }
    /// An endpoint dropped a descriptor.
    pub fn count_rejected(&self, why: Rejected) {
        self.rejected[why as usize].fetch_add(1, Ordering::Relaxed);
    }
    /// Requests in its handlers now (what the scaler reads; [`stats`](Self::stats) copies
    /// every counter).
    pub fn busy(&self) -> u32 {
        self.busy.load(Ordering::Relaxed)
    }
    /// Forgets requests a dead instance left in its handler (the agent, before it restarts
    /// the party: they were answered by the gateway).
    pub fn clear_busy(&self) {
        self.busy.store(0, Ordering::Relaxed);
    }
    /// The counters now.
    pub fn stats(&self) -> PartyStats {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        PartyStats {
            busy: self.busy.load(Ordering::Relaxed),
            handled: load(&self.handled),
            failed: load(&self.failed),
            latency_us_sum: load(&self.latency_us_sum),
            rejected: [
                load(&self.rejected[0]),
                load(&self.rejected[1]),
                load(&self.rejected[2]),
            ],
            buckets: core::array::from_fn(|k| load(&self.buckets[k])),
        }
    }
}

/// The 32-byte header at the start of each slot, written by the slot's owner.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SlotHeader {
    /// Request id (same as in the descriptor; kept here so reclaim can find the request).
    pub request: u32,
    /// Index of the route the request entered by.
    pub route: u16,
    /// Position in the route's sequence of the function now handling it.
    pub hop: u8,
    /// Bit 0: the request left its sequence by dynamic routing; bit 1: this slot is a
    /// call (its answer goes back to `caller`); bit 2: this slot is the answer to call
    /// `call`.
    pub flags: u8,
    /// Status for the gateway, or of a call's answer (0 = 200 OK).
    pub status: u16,
    /// Bytes of metadata after the header, before the payload.
    pub meta_len: u16,
    /// The caller's number for this call (with [`FLAG_CALL`](Self::FLAG_CALL) or
    /// [`FLAG_ANSWER`](Self::FLAG_ANSWER)), 0 otherwise.
    pub call: u32,
    /// The party that made the call and waits for its answer (with
    /// [`FLAG_CALL`](Self::FLAG_CALL)), 0 otherwise.
    pub caller: u16,
    /// Reserved, zero.
    pub reserved: [u8; 6],
    /// When the gateway gives up on the request: `CLOCK_MONOTONIC` milliseconds (0: not
    /// set). Calls made for the request give up a little earlier, so their caller can still
    /// answer.
    pub deadline_ms: u64,
}
const _: () = assert!(core::mem::size_of::<SlotHeader>() == SLOT_HEADER_LEN);

/// `CLOCK_MONOTONIC` in milliseconds: the clock of [`SlotHeader::deadline_ms`], the same
/// for every process of the machine.
pub fn monotonic_ms() -> u64 {
    crate::sys::monotonic_ms()
}

/// `CLOCK_MONOTONIC` in nanoseconds: one clock for every process of the machine (the
/// agent's activation decisions and an instance's first request can be compared).
pub fn monotonic_ns() -> u64 {
    crate::sys::monotonic_ns()
}

impl SlotHeader {
    /// Flag bit: the request was forwarded out of its route's sequence.
    pub const FLAG_DYNAMIC: u8 = 1;
    /// Flag bit: a call from party `caller`; the callee's output goes back to it.
    pub const FLAG_CALL: u8 = 2;
    /// Flag bit: the answer to the caller's call number `call`.
    pub const FLAG_ANSWER: u8 = 4;
}

/// The shape of a pool, which fixes where everything in it lies: what its creator chose, and
/// what a party that maps it is told by the agent (the plan), never what the pool's own
/// header says. Every party of the domain can write that header; [`Pool::attach`] only
/// compares it with this.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolGeometry {
    /// Number of slots.
    pub slots: u32,
    /// Chain-wide number of this pool's slot 0: a chain with several pools (one per security
    /// domain, see [`Pools`](crate::Pools)) numbers their slots in disjoint ranges, so a descriptor's slot
    /// names its pool too. 0 for a chain with one pool.
    pub first_slot: u32,
    /// Bytes per slot, including the slot header.
    pub slot_size: u32,
    /// Entries in the party table.
    pub max_parties: u16,
    /// Backed by 2 MiB huge pages.
    pub hugepages: bool,
    /// A releasing pool (header flags bit 1; a security domain's large pool, for bodies
    /// bigger than its small slots): whoever frees a slot first gives its pages back to the
    /// kernel, so an idle pool holds no memory ([`Pool::releases`]). Never with huge pages;
    /// `slot_size` a multiple of 4096.
    pub release: bool,
}

impl PoolGeometry {
    /// The header a pool of this shape has: every offset computed here, with checked
    /// arithmetic, from nothing but the geometry; or why the geometry is out of range.
    fn header(&self) -> Result<PoolHeader, PoolError> {
        if self.slots == 0
            || self.slots > Descriptor::MAX_SLOT + 1 - self.first_slot.min(Descriptor::MAX_SLOT + 1)
        {
            return Err(PoolError::Geometry(format!(
                "slots {}..{} do not fit the descriptor's 24-bit slot numbers (at most 16777216 \
                 slots per chain, all pools together)",
                self.first_slot,
                u64::from(self.first_slot) + u64::from(self.slots)
            )));
        }
        if (self.slot_size as usize) < SLOT_HEADER_LEN + 64 || !self.slot_size.is_multiple_of(64) {
            return Err(PoolError::Geometry(format!(
                "slot_size must be a multiple of 64 and at least {}, got {}",
                SLOT_HEADER_LEN + 64,
                self.slot_size
            )));
        }
        if self.release && (self.hugepages || !(self.slot_size as usize).is_multiple_of(PAGE)) {
            return Err(PoolError::Geometry(format!(
                "a releasing pool needs slot_size a multiple of {PAGE} and no huge pages, got \
                 {} bytes{}",
                self.slot_size,
                if self.hugepages { " on huge pages" } else { "" }
            )));
        }
        if self.max_parties == 0 || self.max_parties == u16::MAX {
            return Err(PoolError::Geometry("max_parties must be 1..65535".into()));
        }
        // With slots < 2^24, slot_size < 2^32 and max_parties < 2^16 nothing below overflows
        // 64 bits but the slot area; it is checked all the same.
        let overflow = || PoolError::Geometry("pool size overflows".into());
        let parties_offset = PARTIES_OFFSET;
        let owners_offset = (self.max_parties as usize)
            .checked_mul(core::mem::size_of::<PartyRecord>())
            .and_then(|n| n.checked_add(parties_offset))
            .and_then(|n| n.checked_next_multiple_of(64))
            .ok_or_else(overflow)?;
        let align = if self.hugepages { HUGE_PAGE } else { PAGE };
        let slots_offset = (self.slots as usize)
            .checked_mul(8)
            .and_then(|n| n.checked_add(owners_offset))
            .and_then(|n| n.checked_next_multiple_of(align))
            .ok_or_else(overflow)?;
        let total = (self.slots as usize)
            .checked_mul(self.slot_size as usize)
            .and_then(|s| s.checked_add(slots_offset))
            .and_then(|t| t.checked_next_multiple_of(align))
            .ok_or_else(overflow)?;
        Ok(PoolHeader {
            magic: HEADER_MAGIC,
            version: PROTOCOL_VERSION,
            slot_count: self.slots,
            slot_size: self.slot_size,
            max_parties: self.max_parties as u32,
            flags: if self.hugepages { FLAG_HUGETLB } else { 0 }
                | if self.release { FLAG_RELEASE } else { 0 },
            first_slot: self.first_slot,
            parties_offset: parties_offset as u64,
            owners_offset: owners_offset as u64,
            slots_offset: slots_offset as u64,
            total_len: total as u64,
        })
    }
}

/// The first field where the header found in a pool differs from the one expected: its
/// name, the value found and the value expected.
fn header_mismatch(found: &PoolHeader, expected: &PoolHeader) -> Option<(&'static str, u64, u64)> {
    [
        (
            "slot_count",
            u64::from(found.slot_count),
            u64::from(expected.slot_count),
        ),
        (
            "slot_size",
            u64::from(found.slot_size),
            u64::from(expected.slot_size),
        ),
        (
            "max_parties",
            u64::from(found.max_parties),
            u64::from(expected.max_parties),
        ),
        ("flags", u64::from(found.flags), u64::from(expected.flags)),
        (
            "first_slot",
            u64::from(found.first_slot),
            u64::from(expected.first_slot),
        ),
        (
            "parties_offset",
            found.parties_offset,
            expected.parties_offset,
        ),
        ("owners_offset", found.owners_offset, expected.owners_offset),
        ("slots_offset", found.slots_offset, expected.slots_offset),
        ("total_len", found.total_len, expected.total_len),
    ]
    .into_iter()
    .find(|(_, has, wants)| has != wants)
}

/// A mapped pool. Cheap to share behind an `Arc`; unmapped on drop.
pub struct Pool {
    region: Region,
    base: *mut u8,
    /// What the geometry says the header is (computed, never read back from the pool).
    header: PoolHeader,
}

// SAFETY: the mapping is process-wide and stays valid until drop; all shared state in it is
// accessed through atomics, and slot bytes only by the slot's owner (see crate docs).
unsafe impl Send for Pool {}
// SAFETY: as above.
unsafe impl Sync for Pool {}

impl Pool {
    /// Creates, sizes, seals and maps a new pool of the shape `geometry`, named `name` (shown
    /// in /proc/PID/fd as `memfd:zerohop-pool:NAME`).
    pub fn create(name: &str, geometry: &PoolGeometry) -> Result<Self, PoolError> {
        let header = geometry.header()?;
        let total = header.total_len as usize;
        if geometry.hugepages {
            let needed = (total / HUGE_PAGE) as u64;
            let free = sys::free_hugepages().unwrap_or(0);
            if free < needed {
                return Err(PoolError::NoHugePages { needed, free });
            }
        }
        let region = Region::create(&format!("zerohop-pool:{name}"), total, geometry.hugepages)?;
        let base = region.base();
        // SAFETY: base is a fresh, writable, page-aligned mapping of `total` >= 64 bytes that
        // no other process has seen yet (the fd has not been shared). A fresh memfd is zeroed,
        // which is the initial state of every atomic (free slots, empty parties).
        unsafe { base.cast::<PoolHeader>().write(header) };
        Ok(Self {
            region,
            base,
            header,
        })
    }

    /// Maps a pool received as a file descriptor, whose shape the agent told this party
    /// (`geometry`, from the plan). The pool's own header is only compared with it: any
    /// party of the domain can rewrite that header, so a mismatch is a refusal that names
    /// the field, and everything this party computes uses `geometry` alone.
    pub fn attach(fd: OwnedFd, geometry: &PoolGeometry) -> Result<Self, PoolError> {
        let expected = geometry.header()?;
        let region = Region::attach(fd)?;
        if !region.writable() {
            return Err(PoolError::Geometry(
                "the pool descriptor is read-only; every party maps the pool read-write".into(),
            ));
        }
        let (base, len) = (region.base(), region.len());
        if len < PAGE {
            return Err(PoolError::BadMagic);
        }
        // SAFETY: the mapping is at least one page, so the 64-byte header is in bounds. Other
        // parties may write it at any time: this is one copy, used only for the comparison
        // below (its fields are plain integers, any bit pattern is a value).
        let found = unsafe { base.cast::<PoolHeader>().read_volatile() };
        if found.magic != HEADER_MAGIC {
            return Err(PoolError::BadMagic);
        }
        if found.version != PROTOCOL_VERSION {
            return Err(PoolError::Version {
                found: found.version,
                supported: PROTOCOL_VERSION,
            });
        }
        if let Some((field, has, wants)) = header_mismatch(&found, &expected) {
            return Err(PoolError::Geometry(format!(
                "the pool's header says {field} {has}, the plan says {wants}: refusing a pool \
                 that is not the one the agent made (or whose header another party rewrote)"
            )));
        }
        if len as u64 != expected.total_len {
            return Err(PoolError::Geometry(format!(
                "the pool is {len} bytes, the plan's geometry needs {}",
                expected.total_len
            )));
        }
        Ok(Self {
            region,
            base,
            header: expected,
        })
    }

    /// This pool's shape: what a party that maps it must be told.
    pub fn geometry(&self) -> PoolGeometry {
        PoolGeometry {
            slots: self.header.slot_count,
            first_slot: self.header.first_slot,
            slot_size: self.header.slot_size,
            max_parties: self.header.max_parties as u16,
            hugepages: self.header.flags & FLAG_HUGETLB != 0,
            release: self.releases(),
        }
    }

    /// Writes the header this pool's geometry says over whatever is there: the agent does it
    /// before it hands the pool to an instance it starts, so a header another party of the
    /// domain rewrote costs that instance nothing. Parties read the header only at attach.
    pub fn restore_header(&self) {
        // SAFETY: the header's 64 bytes are at the start of the mapping. Other processes may
        // read or write them at any time; they are plain integers, and a party reads them
        // once at attach and only compares them with its plan.
        unsafe { self.base.cast::<PoolHeader>().write_volatile(self.header) };
    }

    /// The memfd, to hand to a new party.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.region.fd()
    }

    /// Number of slots.
    pub fn slot_count(&self) -> u32 {
        self.header.slot_count
    }

    /// Chain-wide number of this pool's first slot.
    pub fn first_slot(&self) -> u32 {
        self.header.first_slot
    }

    /// Whether chain-wide slot number `slot` is one of this pool's.
    pub fn contains(&self, slot: u32) -> bool {
        self.local(slot).is_some()
    }

    /// This pool's index of chain-wide slot number `slot`.
    fn local(&self, slot: u32) -> Option<u32> {
        slot.checked_sub(self.header.first_slot)
            .filter(|&l| l < self.header.slot_count)
    }

    /// Bytes per slot including its header.
    pub fn slot_size(&self) -> u32 {
        self.header.slot_size
    }

    /// Bytes per slot available for metadata + payload.
    pub fn slot_capacity(&self) -> usize {
        self.header.slot_size as usize - SLOT_HEADER_LEN
    }

    /// Entries in the party table.
    pub fn max_parties(&self) -> u16 {
        self.header.max_parties as u16
    }

    /// Whether the pool is backed by huge pages.
    pub fn hugepages(&self) -> bool {
        self.header.flags & FLAG_HUGETLB != 0
    }

    /// Whether this is a releasing pool (a large pool): a slot's pages go back to the kernel
    /// when its owner frees it ([`OwnedSlot`]'s drop) and in [`Pool::release_free`].
    pub fn releases(&self) -> bool {
        self.header.flags & FLAG_RELEASE != 0
    }

    /// Total mapped bytes.
    pub fn mapped_len(&self) -> usize {
        self.header.total_len as usize
    }

    /// The owner table. Its indices are this pool's own (0..slot_count); the chain-wide
    /// number of index `i` is `first_slot() + i`.
    pub fn owners(&self) -> OwnerTable<'_> {
        // SAFETY: the owner words lie inside the mapping (checked in attach, built so in
        // create), are 8-aligned (the offset is a multiple of 64 in a page-aligned mapping),
        // and std atomics have the layout of the plain integer. They live as long as `self`.
        unsafe {
            let words = std::slice::from_raw_parts(
                self.base
                    .add(self.header.owners_offset as usize)
                    .cast::<AtomicU64>(),
                self.header.slot_count as usize,
            );
            OwnerTable::new(words)
        }
    }

    /// The pool's wake word (at offset 64): a sender that sent to a party which is not
    /// `Ready` bumps it and wakes whoever waits on it ([`Pool::want_instance`]), so the
    /// agent activates that party at once. Input like everything shared: any party may bump it.
    #[cfg(not(loom))]
    fn wake_word(&self) -> &AtomicU32 {
        // SAFETY: offset 64 is inside the header area every pool maps (PARTIES_OFFSET is 128),
        // 4-aligned; an atomic u32 is valid for any bit pattern.
        unsafe { &*self.base.add(64).cast::<AtomicU32>() }
    }

    /// A sender: something was sent to a party with no ready instance; wakes the agent.
    #[cfg(not(loom))]
    pub fn want_instance(&self) {
        // SYNC POINT: Release pairs with the Acquire load in `wait_wanted`; the descriptor
        // was queued before.
        self.wake_word()
            .fetch_add(1, std::sync::atomic::Ordering::Release);
        sys::futex_wake_all(self.wake_word());
    }

    /// The agent: waits until the wake word differs from `seen` or `timeout` passes (or a
    /// spurious wake); returns its value now.
    #[cfg(not(loom))]
    pub fn wait_wanted(&self, seen: u32, timeout: std::time::Duration) -> u32 {
        let w = self.wake_word();
        // SYNC POINT: Acquire pairs with the Release in `want_instance`.
        if w.load(Ordering::Acquire) == seen {
            sys::futex_wait(w, seen, timeout);
        }
        // SYNC POINT: as above.
        w.load(Ordering::Acquire)
    }

    /// The party table entry of `party`.
    pub fn party(&self, party: u16) -> Option<&PartyRecord> {
        if party >= self.max_parties() {
            return None;
        }
        // SAFETY: in bounds (checked above and at attach), 64-aligned, and PartyRecord is all
        // atomics, valid for any bit pattern.
        Some(unsafe {
            &*self
                .base
                .add(self.header.parties_offset as usize + party as usize * PARTY_RECORD_LEN)
                .cast::<PartyRecord>()
        })
    }

    /// Address of local slot `local` (< slot_count).
    pub(crate) fn slot_ptr(&self, local: u32) -> *mut u8 {
        debug_assert!(local < self.header.slot_count);
        // SAFETY: local < slot_count, so the offset is inside the mapping.
        unsafe {
            self.base.add(
                self.header.slots_offset as usize + local as usize * self.header.slot_size as usize,
            )
        }
    }

    /// Allocates a slot for `me`; `None` when the pool is exhausted.
    pub fn alloc(self: &Arc<Self>, me: Owner) -> Option<OwnedSlot> {
        let (local, generation) = self.owners().alloc(me)?;
        let mut slot = OwnedSlot {
            pool: self.clone(),
            local,
            generation,
            owner: me,
            free_on_drop: true,
        };
        slot.set_header(&SlotHeader::default());
        Some(slot)
    }

    /// Takes over the slot named by `desc` for `me`, if it is currently held by an owner that
    /// `allowed` accepts and the descriptor's length fits the slot. Returns the previous
    /// owner, the slot, and a copy of its header read once and validated (metadata and
    /// payload fit the slot): callers use that copy, never the shared bytes again, since the
    /// previous owner may still scribble on them.
    pub fn take(
        self: &Arc<Self>,
        desc: &Descriptor,
        me: Owner,
        allowed: impl Fn(Owner) -> bool,
    ) -> Result<(Owner, OwnedSlot, SlotHeader), TakeError> {
        let Some(local) = self.local(desc.slot) else {
            return Err(TakeError::Ownership(OwnershipError::OutOfRange(desc.slot)));
        };
        if desc.len as usize > self.slot_capacity() {
            return Err(TakeError::Length {
                len: desc.len,
                capacity: self.slot_capacity(),
            });
        }
        let from = self
            .owners()
            .take(local, desc.generation, me, allowed)
            .map_err(TakeError::Ownership)?;
        let slot = OwnedSlot {
            pool: self.clone(),
            local,
            generation: desc.generation,
            owner: me,
            free_on_drop: true,
        };
        let header = slot.header();
        let meta_len = header.meta_len as usize;
        if meta_len + desc.len as usize > self.slot_capacity() {
            // The slot is ours now; dropping it frees it.
            return Err(TakeError::Length {
                len: desc.len + meta_len as u32,
                capacity: self.slot_capacity(),
            });
        }
        Ok((from, slot, header))
    }

    /// Reads the header of chain-wide slot `slot` held by a dead party (for reclaim, by the
    /// agent).
    pub fn peek_header(&self, slot: u32) -> Option<SlotHeader> {
        let local = self.local(slot)?;
        // SAFETY: in bounds; the header is plain data valid for any bit pattern, read
        // volatile because a party that is not dead after all may still write it.
        Some(unsafe { self.slot_ptr(local).cast::<SlotHeader>().read_volatile() })
    }

    /// Takes chain-wide slot `slot` back from the receiver that never took it: frees it if
    /// its owner word is still exactly (`generation`, `owner`). See [`OwnerTable::revoke`].
    pub fn revoke(&self, slot: u32, generation: u32, owner: Owner) -> bool {
        self.local(slot)
            .is_some_and(|l| self.owners().revoke(l, generation, owner))
    }

    /// The (chain-wide slot, generation) of every slot `owner` holds.
    pub fn held_by(&self, owner: Owner) -> Vec<(u32, u32)> {
        let owners = self.owners();
        owners
            .owned_by(owner)
            .into_iter()
            .filter_map(|l| owners.get(l).map(|w| (self.first_slot() + l, w.generation)))
            .collect()
    }

    /// Frees chain-wide slot `slot` if `owner` holds it (the agent, for a dead party).
    pub fn free_held(&self, slot: u32, owner: Owner) -> bool {
        self.local(slot)
            .is_some_and(|l| self.owners().free(l, owner).is_ok())
    }

    /// Rewrites the header of `slot` whoever owns it, as a hostile party of the chain can:
    /// for tests that check the other parties survive it. Not part of the protocol.
    #[doc(hidden)]
    pub fn scribble_header(&self, slot: u32, f: impl FnOnce(&mut SlotHeader)) {
        let Some(local) = self.local(slot) else {
            return;
        };
        let p = self.slot_ptr(local).cast::<SlotHeader>();
        // SAFETY: in bounds and aligned; volatile, because another party may be using the
        // bytes right now (which is the point: the readers must cope).
        unsafe {
            let mut h = p.read_volatile();
            f(&mut h);
            p.write_volatile(h);
        }
    }

    /// Frees every slot `dead` holds; returns their chain-wide numbers and the headers they
    /// carried.
    pub fn reclaim(&self, dead: Owner) -> Vec<(u32, SlotHeader)> {
        let owners = self.owners();
        let mut out = Vec::new();
        for local in owners.owned_by(dead) {
            let slot = self.first_slot() + local;
            let header = self.peek_header(slot).unwrap_or_default();
            if owners.free(local, dead).is_ok() {
                out.push((slot, header));
            }
        }
        out
    }
}

/// Why a received descriptor was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TakeError {
    /// Owner table refused the hand-over.
    #[error(transparent)]
    Ownership(OwnershipError),
    /// Length beyond the slot.
    #[error("length {len} exceeds the slot capacity {capacity}")]
    Length {
        /// Claimed bytes.
        len: u32,
        /// Capacity of a slot.
        capacity: usize,
    },
}

/// A slot this process owns. Freed on drop unless sent on with [`OwnedSlot::into_sent`].
pub struct OwnedSlot {
    pool: Arc<Pool>,
    /// Index within `pool` (the chain-wide number is `pool.first_slot() + local`).
    local: u32,
    generation: u32,
    owner: Owner,
    /// False once the descriptor was sent: the slot then belongs to the receiver (or to
    /// reclaim), and dropping this handle only releases the pool reference.
    free_on_drop: bool,
}

impl OwnedSlot {
    /// Chain-wide slot number (what a descriptor carries).
    pub fn index(&self) -> u32 {
        self.pool.first_slot() + self.local
    }

    /// Full generation.
    pub fn generation(&self) -> u32 {
        self.generation
    }

    /// The pool.
    pub fn pool(&self) -> &Arc<Pool> {
        &self.pool
    }

    /// The party holding it (this process).
    pub fn owner(&self) -> Owner {
        self.owner
    }

    /// Reads the slot header.
    pub fn header(&self) -> SlotHeader {
        // SAFETY: we own the slot (owner table), so nobody else writes it; in bounds.
        unsafe { self.pool.slot_ptr(self.local).cast::<SlotHeader>().read() }
    }

    /// Writes the slot header.
    pub fn set_header(&mut self, h: &SlotHeader) {
        // SAFETY: as in `header`, and we hold &mut self.
        unsafe {
            self.pool
                .slot_ptr(self.local)
                .cast::<SlotHeader>()
                .write(*h)
        }
    }

    /// Metadata and payload area (everything after the header).
    pub fn data(&self) -> &[u8] {
        // SAFETY: we own the slot; the area is in bounds and lives as long as the Arc<Pool>
        // we hold, which outlives the borrow of self.
        unsafe {
            std::slice::from_raw_parts(
                self.pool.slot_ptr(self.local).add(SLOT_HEADER_LEN),
                self.pool.slot_capacity(),
            )
        }
    }

    /// Mutable metadata and payload area.
    pub fn data_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `data`, and &mut self makes the view unique in this process.
        unsafe {
            std::slice::from_raw_parts_mut(
                self.pool.slot_ptr(self.local).add(SLOT_HEADER_LEN),
                self.pool.slot_capacity(),
            )
        }
    }

    /// The descriptor that hands this slot to function `next` (or the gateway).
    pub fn descriptor(&self, request: u32, len: u32, next: u8) -> Descriptor {
        Descriptor {
            slot: self.index(),
            next,
            len,
            request,
            generation: self.generation,
        }
    }

    /// Gives up this handle without freeing the slot: its descriptor has been sent and the
    /// receiver takes it over (or reclaim frees it if we die first).
    pub fn into_sent(mut self) {
        self.free_on_drop = false;
    }
}

impl Drop for OwnedSlot {
    fn drop(&mut self) {
        if self.free_on_drop {
            // Punched while still ours: after the free, the bytes may be a new owner's.
            self.pool.release_owned(self.local);
            let _ = self.pool.owners().free(self.local, self.owner);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_header_layout_is_the_documented_one() {
        use core::mem::offset_of;
        // docs/protocol.md, "Slot".
        assert_eq!(offset_of!(SlotHeader, request), 0);
        assert_eq!(offset_of!(SlotHeader, route), 4);
        assert_eq!(offset_of!(SlotHeader, hop), 6);
        assert_eq!(offset_of!(SlotHeader, flags), 7);
        assert_eq!(offset_of!(SlotHeader, status), 8);
        assert_eq!(offset_of!(SlotHeader, meta_len), 10);
        assert_eq!(offset_of!(SlotHeader, call), 12);
        assert_eq!(offset_of!(SlotHeader, caller), 16);
        assert_eq!(offset_of!(SlotHeader, reserved), 18);
        assert_eq!(offset_of!(SlotHeader, deadline_ms), 24);
        assert_eq!(
            (
                SlotHeader::FLAG_DYNAMIC,
                SlotHeader::FLAG_CALL,
                SlotHeader::FLAG_ANSWER
            ),
            (1, 2, 4)
        );
        let before = monotonic_ms();
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(monotonic_ms() >= before + 20);
    }

    fn small() -> Arc<Pool> {
        Arc::new(
            Pool::create(
                "test",
                &PoolGeometry {
                    slots: 16,
                    first_slot: 0,
                    slot_size: 4096,
                    max_parties: 4,
                    hugepages: false,
                    release: false,
                },
            )
            .unwrap(),
        )
    }

    #[test]
    fn attach_sees_the_same_memory() {
        let a = small();
        let fd = a.fd().try_clone_to_owned().unwrap();
        let b = Arc::new(Pool::attach(fd, &a.geometry()).unwrap());
        assert_eq!(b.slot_count(), 16);
        let mut s = a.alloc(Owner::party(0)).unwrap();
        s.data_mut()[..5].copy_from_slice(b"hello");
        let d = s.descriptor(7, 5, 0);
        s.into_sent();
        let (from, got, _) = b
            .take(&d, Owner::party(1), |o| o == Owner::party(0))
            .unwrap();
        assert_eq!(from, Owner::party(0));
        assert_eq!(&got.data()[..5], b"hello");
        assert_eq!(a.owners().in_use(), 1);
        drop(got);
        assert_eq!(a.owners().in_use(), 0);
        // Sent and freed slots hold no reference to the pool: the mapping goes with the
        // last handle.
        assert_eq!(Arc::strong_count(&a), 1);
        assert_eq!(Arc::strong_count(&b), 1);
    }

    #[test]
    fn take_refuses_bad_descriptors() {
        let p = small();
        let s = p.alloc(Owner::party(0)).unwrap();
        let good = s.descriptor(1, 10, 0);
        s.into_sent();
        let me = Owner::party(1);
        let any = |_: Owner| true;
        let too_long = Descriptor { len: 5000, ..good };
        assert!(matches!(
            p.take(&too_long, me, any),
            Err(TakeError::Length { .. })
        ));
        let out_of_range = Descriptor { slot: 99, ..good };
        assert!(p.take(&out_of_range, me, any).is_err());
        // A generation 2^16 on (what a 16-bit compare would have let through).
        let wrapped = Descriptor {
            generation: good.generation + (1 << 16),
            ..good
        };
        assert!(p.take(&wrapped, me, any).is_err());
        let stale = Descriptor {
            generation: 9,
            ..good
        };
        assert!(p.take(&stale, me, any).is_err());
        assert!(p.take(&good, me, any).is_ok());
    }

    #[test]
    fn attach_rejects_foreign_fds() {
        use std::os::fd::AsFd;
        let fd = sys::memfd_create("not-a-pool", false).unwrap();
        sys::ftruncate(fd.as_fd(), 8192).unwrap();
        sys::seal(fd.as_fd()).unwrap();
        let geometry = small().geometry();
        assert!(matches!(
            Pool::attach(fd, &geometry),
            Err(PoolError::BadMagic)
        ));
    }

    /// Writes `value` over the header word at `offset` of `pool`, as a hostile party of its
    /// domain can.
    fn scribble(pool: &Pool, offset: usize, value: &[u8]) {
        assert!(offset + value.len() <= 64);
        // SAFETY: the header's 64 bytes are inside the mapping; no one reads them
        // concurrently in this test.
        unsafe {
            std::ptr::copy_nonoverlapping(value.as_ptr(), pool.base.add(offset), value.len())
        };
    }

    #[test]
    fn attach_takes_the_geometry_from_the_plan_and_refuses_a_rewritten_header() {
        let a = small();
        let geometry = a.geometry();
        // Each field a hostile party could rewrite (offsets as in docs/protocol.md), with a
        // value that would put a later party's slots outside its mapping.
        let cases: [(&str, usize, Vec<u8>); 9] = [
            ("slot_count", 12, 1_000_000u32.to_ne_bytes().to_vec()),
            ("slot_size", 16, (1u32 << 31).to_ne_bytes().to_vec()),
            ("max_parties", 20, 60_000u32.to_ne_bytes().to_vec()),
            ("flags", 24, FLAG_HUGETLB.to_ne_bytes().to_vec()),
            ("first_slot", 28, 7u32.to_ne_bytes().to_vec()),
            ("parties_offset", 32, 0u64.to_ne_bytes().to_vec()),
            ("owners_offset", 40, (u64::MAX - 63).to_ne_bytes().to_vec()),
            ("slots_offset", 48, (u64::MAX - 4095).to_ne_bytes().to_vec()),
            ("total_len", 56, (1u64 << 40).to_ne_bytes().to_vec()),
        ];
        for (field, offset, value) in cases {
            let saved: Vec<u8> =
                // SAFETY: as in `scribble`: inside the header, no concurrent access.
                unsafe { std::slice::from_raw_parts(a.base.add(offset), value.len()) }.to_vec();
            scribble(&a, offset, &value);
            let fd = a.fd().try_clone_to_owned().unwrap();
            match Pool::attach(fd, &geometry) {
                Err(PoolError::Geometry(m)) => {
                    assert!(m.contains(field), "{field}: {m}")
                }
                Err(e) => panic!("{field}: refused for another reason: {e}"),
                Ok(_) => panic!("{field}: a rewritten header was accepted"),
            }
            scribble(&a, offset, &saved);
        }
        // Restored, it attaches again; what the party uses is the plan's geometry.
        let b = Pool::attach(a.fd().try_clone_to_owned().unwrap(), &geometry).unwrap();
        assert_eq!(b.geometry(), geometry);
        // A plan that disagrees with the pool is refused the same way.
        let wrong = PoolGeometry {
            slots: 32,
            ..geometry
        };
        let err = Pool::attach(a.fd().try_clone_to_owned().unwrap(), &wrong)
            .err()
            .expect("a pool of another shape is refused");
        assert!(err.to_string().contains("slot_count"), "{err}");
        // A version or magic another party rewrote: the same refusals as for a stranger.
        scribble(&a, 8, &99u32.to_ne_bytes());
        let fd = a.fd().try_clone_to_owned().unwrap();
        assert!(matches!(
            Pool::attach(fd, &geometry),
            Err(PoolError::Version { found: 99, .. })
        ));
        scribble(&a, 0, b"garbage!");
        let fd = a.fd().try_clone_to_owned().unwrap();
        assert!(matches!(
            Pool::attach(fd, &geometry),
            Err(PoolError::BadMagic)
        ));
    }

    #[test]
    fn geometry_out_of_range_is_refused_before_mapping() {
        let fd = small().fd().try_clone_to_owned().unwrap();
        for g in [
            PoolGeometry {
                slots: 0,
                first_slot: 0,
                slot_size: 4096,
                max_parties: 4,
                hugepages: false,
                release: false,
            },
            PoolGeometry {
                slots: 16,
                first_slot: Descriptor::MAX_SLOT,
                slot_size: 4096,
                max_parties: 4,
                hugepages: false,
                release: false,
            },
            PoolGeometry {
                slots: 16,
                first_slot: 0,
                slot_size: 100,
                max_parties: 4,
                hugepages: false,
                release: false,
            },
        ] {
            let fd = fd.try_clone().unwrap();
            assert!(
                matches!(Pool::attach(fd, &g), Err(PoolError::Geometry(_))),
                "{g:?}"
            );
        }
    }

    #[test]
    fn reclaim_frees_and_reports_headers() {
        let p = small();
        let dead = Owner::party(2);
        let mut s = p.alloc(dead).unwrap();
        s.set_header(&SlotHeader {
            request: 42,
            ..Default::default()
        });
        s.into_sent();
        let got = p.reclaim(dead);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].1.request, 42);
        assert_eq!(p.owners().in_use(), 0);
    }

    #[test]
    fn hugepages_shortage_is_explained() {
        let r = Pool::create(
            "huge",
            &PoolGeometry {
                slots: 1 << 20,
                first_slot: 0,
                slot_size: 1 << 16,
                max_parties: 4,
                hugepages: true,
                release: false,
            },
        );
        match r {
            Err(PoolError::NoHugePages { needed, .. }) => assert!(needed > 1000),
            Err(e) => panic!("unexpected error {e}"),
            Ok(_) => panic!("64 GiB of huge pages cannot be free on this host"),
        }
    }
}

#[cfg(test)]
mod party_record_tests {
    use super::*;

    #[test]
    fn latency_buckets_are_powers_of_two_microseconds() {
        assert_eq!(latency_bucket(0), 0);
        assert_eq!(latency_bucket(1), 1, "1 us is not below 2^0");
        assert_eq!(latency_bucket(3), 2);
        assert_eq!(latency_bucket(4), 3);
        assert_eq!(latency_bucket(1 << 22), 23);
        assert_eq!(latency_bucket(u64::MAX), LATENCY_BUCKETS - 1);
        for us in [0u64, 1, 2, 5, 100, 1000, 65_000, (1 << 22) - 1] {
            let k = latency_bucket(us);
            let bound = latency_bucket_bound_us(k).expect("bounded");
            assert!(us < bound, "{us} < {bound}");
            assert!(k == 0 || us >= bound / 2, "{us} >= {}", bound / 2);
        }
        assert_eq!(latency_bucket_bound_us(LATENCY_BUCKETS - 1), None);
    }

    #[test]
    fn records_count_handler_runs_in_shared_memory() {
        let pool = Pool::create(
            "record",
            &PoolGeometry {
                slots: 1,
                first_slot: 0,
                slot_size: 4096,
                max_parties: 3,
                hugepages: false,
                release: false,
            },
        )
        .unwrap();
        // Another process would attach the same memfd: a second mapping of it stands in.
        let other =
            Pool::attach(pool.fd().try_clone_to_owned().unwrap(), &pool.geometry()).unwrap();
        let r = other.party(2).unwrap();
        r.handler_started();
        r.handler_started();
        assert_eq!(pool.party(2).unwrap().stats().busy, 2);
        r.handler_finished(3, true);
        r.handler_finished(1500, false);
        r.count_rejected(Rejected::Ownership);
        let s = pool.party(2).unwrap().stats();
        assert_eq!(
            (s.busy, s.handled, s.failed, s.latency_us_sum),
            (0, 2, 1, 1503)
        );
        assert_eq!(s.rejected, [0, 1, 0]);
        assert_eq!(s.buckets[2], 1);
        assert_eq!(s.buckets[11], 1);
        assert_eq!(s.buckets.iter().sum::<u64>(), 2);
        assert_eq!(pool.party(0).unwrap().stats(), PartyStats::default());
        // Records do not overlap: party 1 saw nothing of party 2's counts.
        assert_eq!(pool.party(1).unwrap().stats(), PartyStats::default());
    }
}
