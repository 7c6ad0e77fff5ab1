//! Creating and attaching the ring region.

use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::Arc;

use zerohop_pool::region::Region;
use zerohop_pool::sync::{AtomicU32, AtomicU64};

use super::{RingReceiver, RingSender, Spsc};
use crate::{Backend, Options, PartyId, Receiver, Sender, Transport, TransportError};

const MAGIC: [u8; 8] = *b"ZHRING\0\0";
const VERSION: u32 = 1;
const HEADER: usize = 64;
const CONTROL: usize = 64;

#[repr(C)]
#[derive(Clone, Copy)]
struct RingHeader {
    magic: [u8; 8],
    version: u32,
    parties: u32,
    capacity: u32,
    _pad: [u8; 44],
}
const _: () = assert!(core::mem::size_of::<RingHeader>() == HEADER);

/// The mapped region plus its geometry; shared by the sender and receiver handles.
pub(crate) struct RingShared {
    region: Region,
    pub(crate) parties: u16,
    capacity: u32,
    pub(crate) opts: Options,
}

impl RingShared {
    fn queue_stride(capacity: u32) -> usize {
        128 + capacity as usize * 16
    }
    fn inbox_stride(parties: u16, capacity: u32) -> usize {
        CONTROL + parties as usize * Self::queue_stride(capacity)
    }
    fn inbox_offset(&self, receiver: PartyId) -> usize {
        HEADER + receiver as usize * Self::inbox_stride(self.parties, self.capacity)
    }

    fn word32(&self, offset: usize) -> &AtomicU32 {
        debug_assert!(offset + 4 <= self.region.len() && offset % 4 == 0);
        // SAFETY: offsets come from the geometry checked at create/attach, so they are inside
        // the mapping and 4-aligned; AtomicU32 has the layout of u32 and any bit pattern is
        // valid; the region lives as long as &self.
        unsafe { &*self.region.base().add(offset).cast::<AtomicU32>() }
    }

    /// The futex sequence word of `receiver`'s inbox.
    pub(crate) fn seq(&self, receiver: PartyId) -> &AtomicU32 {
        self.word32(self.inbox_offset(receiver))
    }

    /// The "I am going to sleep" flag of `receiver`'s inbox.
    pub(crate) fn sleeping(&self, receiver: PartyId) -> &AtomicU32 {
        self.word32(self.inbox_offset(receiver) + 4)
    }

    /// The queue from `sender` into `receiver`.
    pub(crate) fn queue(&self, receiver: PartyId, sender: PartyId) -> Spsc<'_> {
        let q = self.inbox_offset(receiver)
            + CONTROL
            + sender as usize * Self::queue_stride(self.capacity);
        let n = self.capacity as usize * 2;
        // SAFETY: as in word32; the entry array starts 64-aligned at q + 128 and spans
        // capacity*16 bytes, inside the inbox.
        let entries = unsafe {
            std::slice::from_raw_parts(self.region.base().add(q + 128).cast::<AtomicU64>(), n)
        };
        Spsc::new(self.word32(q), self.word32(q + 64), entries)
    }
}

/// The ring transport of one chain.
pub struct RingTransport {
    shared: Arc<RingShared>,
}

impl RingTransport {
    /// Creates the region for `parties` parties.
    pub fn create(name: &str, parties: u16, opts: Options) -> Result<Self, TransportError> {
        if parties == 0 {
            return Err(TransportError::Layout(
                "a chain needs at least one party".into(),
            ));
        }
        let capacity = opts.queue_capacity.clamp(2, 1 << 16).next_power_of_two();
        let len = HEADER + parties as usize * RingShared::inbox_stride(parties, capacity);
        let region = Region::create(&format!("zerohop-ring:{name}"), len, false)?;
        let header = RingHeader {
            magic: MAGIC,
            version: VERSION,
            parties: parties as u32,
            capacity,
            _pad: [0; 44],
        };
        // SAFETY: fresh mapping of at least HEADER bytes, not yet shared; the rest is zero,
        // which is the empty state of every queue and inbox.
        unsafe { region.base().cast::<RingHeader>().write(header) };
        Ok(Self {
            shared: Arc::new(RingShared {
                region,
                parties,
                capacity,
                opts,
            }),
        })
    }

    /// Maps the region from the single fd [`Transport::fds_for`] hands out.
    pub fn attach(parties: u16, fds: Vec<OwnedFd>, opts: Options) -> Result<Self, TransportError> {
        let [fd]: [OwnedFd; 1] = fds.try_into().map_err(|v: Vec<OwnedFd>| {
            TransportError::Layout(format!("ring expects 1 fd, got {}", v.len()))
        })?;
        let region = Region::attach(fd)?;
        if region.len() < HEADER {
            return Err(TransportError::Layout("ring region too small".into()));
        }
        // SAFETY: at least HEADER bytes are mapped; plain data written before sharing.
        let header = unsafe { region.base().cast::<RingHeader>().read() };
        if header.magic != MAGIC || header.version != VERSION {
            return Err(TransportError::Layout(
                "not a zerohop ring region of protocol version 1".into(),
            ));
        }
        let capacity = header.capacity;
        let want = HEADER + parties as usize * RingShared::inbox_stride(parties, capacity);
        if header.parties != parties as u32 || !capacity.is_power_of_two() || region.len() != want {
            return Err(TransportError::Layout(format!(
                "ring region holds {} parties x capacity {capacity} in {} bytes, expected {parties} parties",
                header.parties,
                region.len()
            )));
        }
        Ok(Self {
            shared: Arc::new(RingShared {
                region,
                parties,
                capacity,
                opts,
            }),
        })
    }

    fn check(&self, p: PartyId) -> Result<(), TransportError> {
        if p >= self.shared.parties {
            return Err(TransportError::NoSuchParty {
                party: p,
                parties: self.shared.parties,
            });
        }
        Ok(())
    }
}

impl Transport for RingTransport {
    fn backend(&self) -> Backend {
        Backend::Ring
    }

    fn parties(&self) -> u16 {
        self.shared.parties
    }

    fn fds_for(&self, party: PartyId) -> Result<Vec<BorrowedFd<'_>>, TransportError> {
        self.check(party)?;
        Ok(vec![self.shared.region.fd()])
    }

    fn sender(&self, me: PartyId) -> Result<Box<dyn Sender>, TransportError> {
        self.check(me)?;
        Ok(Box::new(RingSender::new(self.shared.clone(), me)))
    }

    fn receiver(&self, me: PartyId) -> Result<Box<dyn Receiver>, TransportError> {
        self.check(me)?;
        Ok(Box::new(RingReceiver::new(self.shared.clone(), me)))
    }
}
