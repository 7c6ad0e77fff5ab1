//! The pools of one chain: one per security domain, numbered in disjoint slot ranges.

use std::sync::Arc;

use crate::owner::{Owner, OwnershipError};
use crate::pool::{OwnedSlot, PartyRecord, Pool, SlotHeader, TakeError};
use crate::{Descriptor, PoolError};

/// The pools a party maps, ordered by their first slot. A chain has one pool per security
/// domain (a set of routes and the functions that may touch their requests); the gateway
/// maps all of them, an instance only those of its function's domains. Slot numbers are
/// chain-wide, so a descriptor's slot names its pool: a descriptor naming a slot of a pool
/// the receiver does not map is out of range, like any other bad slot.
#[derive(Clone)]
pub struct Pools {
    list: Arc<[Arc<Pool>]>,
}

impl Pools {
    /// A set of pools whose slot ranges must not overlap.
    pub fn new(mut list: Vec<Arc<Pool>>) -> Result<Self, PoolError> {
        list.sort_by_key(|p| p.first_slot());
        for w in list.windows(2) {
            if u64::from(w[0].first_slot()) + u64::from(w[0].slot_count())
                > u64::from(w[1].first_slot())
            {
                return Err(PoolError::Geometry(format!(
                    "pools overlap: slots {}..{} and {}..",
                    w[0].first_slot(),
                    w[0].first_slot() + w[0].slot_count(),
                    w[1].first_slot()
                )));
            }
        }
        Ok(Self { list: list.into() })
    }

    /// One pool alone.
    pub fn single(pool: Arc<Pool>) -> Self {
        Self {
            list: vec![pool].into(),
        }
    }

    /// The pools, by first slot.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<Pool>> {
        self.list.iter()
    }

    /// The pools, by first slot.
    pub fn as_slice(&self) -> &[Arc<Pool>] {
        &self.list
    }

    /// Number of pools.
    pub fn len(&self) -> usize {
        self.list.len()
    }

    /// Whether there is none (a party of no domain).
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// The pool holding chain-wide slot `slot`.
    pub fn of_slot(&self, slot: u32) -> Option<&Arc<Pool>> {
        let i = self
            .list
            .partition_point(|p| p.first_slot() <= slot)
            .checked_sub(1)?;
        let p = &self.list[i];
        p.contains(slot).then_some(p)
    }

    /// The large pool of the security domain whose small pool is `small`: the releasing
    /// pool numbered right after it (`first_slot == small.first_slot() + small.slot_count()`);
    /// `None` when the domain has none (every body fits a small slot) or this party does
    /// not map it.
    pub fn large_of(&self, small: &Pool) -> Option<&Arc<Pool>> {
        let first = small.first_slot().checked_add(small.slot_count())?;
        self.of_slot(first)
            .filter(|p| p.releases() && p.first_slot() == first)
    }

    /// The small pool of the security domain whose large pool is `large`: the pool numbered
    /// right before it; `None` when `large` is not a releasing pool or this party does not
    /// map its domain's small pool.
    pub fn small_of(&self, large: &Pool) -> Option<&Arc<Pool>> {
        if !large.releases() {
            return None;
        }
        self.of_slot(large.first_slot().checked_sub(1)?)
            .filter(|p| {
                !p.releases()
                    && u64::from(p.first_slot()) + u64::from(p.slot_count())
                        == u64::from(large.first_slot())
            })
    }

    /// [`Pool::take`] in the pool the descriptor's slot belongs to.
    pub fn take(
        &self,
        desc: &Descriptor,
        me: Owner,
        allowed: impl Fn(Owner) -> bool,
    ) -> Result<(Owner, OwnedSlot, SlotHeader), TakeError> {
        match self.of_slot(desc.slot) {
            Some(p) => p.take(desc, me, allowed),
            None => Err(TakeError::Ownership(OwnershipError::OutOfRange(desc.slot))),
        }
    }

    /// [`Pool::revoke`] in the pool of `slot`.
    pub fn revoke(&self, slot: u32, generation: u32, owner: Owner) -> bool {
        self.of_slot(slot)
            .is_some_and(|p| p.revoke(slot, generation, owner))
    }

    /// `party`'s record in each pool (each pool has its own party table, read by the
    /// parties of that domain).
    pub fn records(&self, party: u16) -> impl Iterator<Item = &PartyRecord> {
        self.iter().filter_map(move |p| p.party(party))
    }

    /// The (chain-wide slot, generation) of every slot `owner` holds, in all pools.
    pub fn held_by(&self, owner: Owner) -> Vec<(u32, u32)> {
        self.iter().flat_map(|p| p.held_by(owner)).collect()
    }

    /// Slots in use, all pools together.
    pub fn in_use(&self) -> u32 {
        self.iter().map(|p| p.owners().in_use()).sum()
    }

    /// Slots, all pools together.
    pub fn slot_count(&self) -> u32 {
        self.iter().map(|p| p.slot_count()).sum()
    }
}

impl From<Arc<Pool>> for Pools {
    fn from(pool: Arc<Pool>) -> Self {
        Self::single(pool)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::PoolGeometry;

    fn pool(first_slot: u32, slots: u32) -> Arc<Pool> {
        Arc::new(
            Pool::create(
                "pools-test",
                &PoolGeometry {
                    slots,
                    first_slot,
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
    fn slots_name_their_pool() {
        let (a, b) = (pool(0, 8), pool(8, 4));
        let set = Pools::new(vec![b.clone(), a.clone()]).unwrap();
        assert!(Arc::ptr_eq(set.of_slot(0).unwrap(), &a));
        assert!(Arc::ptr_eq(set.of_slot(7).unwrap(), &a));
        assert!(Arc::ptr_eq(set.of_slot(8).unwrap(), &b));
        assert!(set.of_slot(12).is_none());
        let s = b.alloc(Owner::party(0)).unwrap();
        assert!((8..12).contains(&s.index()));
        let d = s.descriptor(1, 3, 0);
        s.into_sent();
        // A party mapping only `a` cannot take a slot of `b`.
        let only_a = Pools::single(a.clone());
        assert!(matches!(
            only_a.take(&d, Owner::party(1), |_| true),
            Err(TakeError::Ownership(OwnershipError::OutOfRange(_)))
        ));
        let (_, got, _) = set.take(&d, Owner::party(1), |_| true).unwrap();
        assert_eq!(got.index(), d.slot);
        assert_eq!(b.held_by(Owner::party(1)), vec![(d.slot, d.generation)]);
        drop(got);
        assert_eq!(set.in_use(), 0);
        assert_eq!(set.slot_count(), 12);
    }

    #[test]
    fn overlapping_ranges_are_refused() {
        assert!(Pools::new(vec![pool(0, 8), pool(4, 8)]).is_err());
    }

    #[test]
    fn ranges_stay_within_24_bits() {
        let r = Pool::create(
            "too-far",
            &PoolGeometry {
                slots: 2,
                first_slot: Descriptor::MAX_SLOT,
                slot_size: 4096,
                max_parties: 4,
                hugepages: false,
                release: false,
            },
        );
        assert!(matches!(r, Err(PoolError::Geometry(_))));
    }
}
