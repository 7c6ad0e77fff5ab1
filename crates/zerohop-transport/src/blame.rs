//! Which dropped descriptors are their sender's fault, and where an [`Endpoint`] reports
//! them (see [`Endpoint::with_blame`]).
//!
//! A party that sends invalid descriptors is hostile (or broken past use): the agent kills it
//! with its process group after a bounded number and restarts it. That is only fair if
//! nothing another party does can make a sender's descriptors invalid, so only what the
//! sender alone wrote counts:
//!
//! | dropped because | the sender's fault? | why |
//! |---|---|---|
//! | `next` is not the receiver's function | yes | the 16 bytes come from a queue only the sender writes (ring: its outbox; socket: its end of the edge's socketpair; sockmap: the kernel delivered it from the sender's socket and stamped the sender) |
//! | the slot is in no pool the receiver maps | yes | the slot number is in the same 16 bytes; a correct runtime sends a slot only to an instance of its own domain |
//! | `len` beyond a slot | yes | the same 16 bytes; the slot size comes from the plan, not from shared memory |
//! | not 16 bytes at all (socket) | yes | a message on the sender's own socket |
//! | stale generation, owner not the sender | **no** | owner words are shared memory every party of the domain can write: a third party can free or re-own the sender's slot between its send and our take, and the agent's reclaim and a sender's revoke race with a receiver legitimately |
//! | metadata plus payload beyond the slot | **no** | `meta_len` is in the slot header, which every party of the domain can write |
//! | refused by the kernel, but not sent to a gateway party | **no** | only the kernel marks a descriptor refused |
//!
//! [`Endpoint`]: crate::Endpoint
//! [`Endpoint::with_blame`]: crate::Endpoint::with_blame

use zerohop_pool::{Descriptor, OwnershipError, Pools, TakeError};

use crate::PartyId;

/// What a sender alone got wrong in a descriptor (see the module's table).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Fault {
    /// Addressed to another function than the receiver's (a message that is not a
    /// descriptor at all is surfaced as one of these or [`Fault::TooLong`]).
    WrongFunction,
    /// Names a slot in no pool the receiver maps.
    OutOfRange,
    /// Claims more bytes than a slot holds.
    TooLong,
}

impl Fault {
    /// Every fault, in the order of [`Fault::index`].
    pub const ALL: [Fault; 3] = [Fault::WrongFunction, Fault::OutOfRange, Fault::TooLong];

    /// Position in [`Fault::ALL`], for per-fault counters.
    pub fn index(self) -> usize {
        self as usize
    }

    /// In a log line: "wrong function", "slot out of range", "longer than a slot".
    pub fn describe(self) -> &'static str {
        match self {
            Fault::WrongFunction => "wrong function",
            Fault::OutOfRange => "slot out of range",
            Fault::TooLong => "longer than a slot",
        }
    }
}

/// Where an endpoint reports each descriptor it dropped for its sender's fault. Called on
/// the drop path only (never for a valid descriptor), on the receiving thread: keep it
/// short and never block.
pub trait Blame: Send + Sync {
    /// `sender` sent a descriptor it alone made invalid.
    fn blame(&self, sender: PartyId, fault: Fault);
}

/// The decision: whether a descriptor the pool refused to hand over is its sender's fault.
pub fn fault_of_take(desc: &Descriptor, err: &TakeError) -> Option<Fault> {
    match err {
        TakeError::Ownership(OwnershipError::OutOfRange(_)) => Some(Fault::OutOfRange),
        // Both forgeable by any party of the domain (owner words), or a legitimate race with
        // reclaim or revoke.
        TakeError::Ownership(
            OwnershipError::StaleGeneration { .. } | OwnershipError::WrongOwner { .. },
        ) => None,
        // The descriptor's own length does not fit: the sender's. It fits, but with the
        // header's `meta_len` it does not: the header is anybody's in the domain.
        TakeError::Length { capacity, .. } => {
            (desc.len as usize > *capacity).then_some(Fault::TooLong)
        }
    }
}

/// The decision for a descriptor read from its sender's own queue (ring: its outbox, which
/// no other party writes; see [`Transport::published`](crate::Transport::published)) before
/// any receiver took it: what in its 16 bytes alone is wrong for `receiver_function`, whose
/// instances map `pools`. The same three faults an [`Endpoint`](crate::Endpoint) blames,
/// judged from the bytes and the plan only (no owner word, no slot header).
pub fn fault_of_sent(desc: &Descriptor, receiver_function: u8, pools: &Pools) -> Option<Fault> {
    if desc.next != receiver_function {
        return Some(Fault::WrongFunction);
    }
    match pools.of_slot(desc.slot) {
        None => Some(Fault::OutOfRange),
        Some(pool) => (desc.len as usize > pool.slot_capacity()).then_some(Fault::TooLong),
    }
}

#[cfg(test)]
mod tests {
    use zerohop_pool::Owner;

    use super::*;

    fn desc(len: u32) -> Descriptor {
        Descriptor {
            slot: 3,
            len,
            request: 1,
            generation: 2,
            next: 0,
        }
    }

    #[test]
    fn only_what_the_sender_alone_wrote_is_its_fault() {
        let capacity = 4096;
        let cases: [(TakeError, u32, Option<Fault>); 6] = [
            (
                TakeError::Ownership(OwnershipError::OutOfRange(99)),
                10,
                Some(Fault::OutOfRange),
            ),
            (
                TakeError::Ownership(OwnershipError::StaleGeneration {
                    slot: 3,
                    expected: 2,
                    actual: 5,
                }),
                10,
                None,
            ),
            (
                TakeError::Ownership(OwnershipError::WrongOwner {
                    slot: 3,
                    actual: Owner::party(7),
                }),
                10,
                None,
            ),
            (
                TakeError::Length {
                    len: 5000,
                    capacity,
                },
                5000,
                Some(Fault::TooLong),
            ),
            // The descriptor's length fits; the header's metadata (anybody's) makes it not.
            (
                TakeError::Length {
                    len: 4100,
                    capacity,
                },
                4000,
                None,
            ),
            (
                TakeError::Length {
                    len: u32::MAX,
                    capacity,
                },
                u32::MAX,
                Some(Fault::TooLong),
            ),
        ];
        for (err, len, want) in cases {
            assert_eq!(fault_of_take(&desc(len), &err), want, "{err:?}");
        }
    }

    #[test]
    fn a_sent_descriptor_is_judged_by_its_bytes_and_the_plan() {
        let pool = |first_slot| {
            std::sync::Arc::new(
                zerohop_pool::Pool::create(
                    "blame-sent",
                    &zerohop_pool::PoolGeometry {
                        slots: 8,
                        first_slot,
                        slot_size: 4096,
                        max_parties: 4,
                        hugepages: false,
                        release: false,
                    },
                )
                .unwrap(),
            )
        };
        let pools = Pools::new(vec![pool(0), pool(16)]).unwrap();
        let capacity = pools.as_slice()[0].slot_capacity() as u32;
        let good = Descriptor {
            next: 2,
            len: capacity,
            ..desc(0)
        };
        let cases = [
            ("valid, first pool", good, None),
            ("valid, second pool", Descriptor { slot: 20, ..good }, None),
            (
                "to another function",
                Descriptor { next: 3, ..good },
                Some(Fault::WrongFunction),
            ),
            (
                "between the pools",
                Descriptor { slot: 9, ..good },
                Some(Fault::OutOfRange),
            ),
            (
                "beyond every pool",
                Descriptor {
                    slot: Descriptor::MAX_SLOT,
                    ..good
                },
                Some(Fault::OutOfRange),
            ),
            (
                "longer than a slot",
                Descriptor {
                    len: capacity + 1,
                    ..good
                },
                Some(Fault::TooLong),
            ),
        ];
        for (what, d, want) in cases {
            assert_eq!(fault_of_sent(&d, 2, &pools), want, "{what}");
        }
    }

    #[test]
    fn every_fault_has_its_own_counter_and_words() {
        for (i, f) in Fault::ALL.iter().enumerate() {
            assert_eq!(f.index(), i);
            assert!(!f.describe().is_empty());
        }
    }
}
