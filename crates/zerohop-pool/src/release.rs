//! Releasing pools (a security domain's large pool): a freed slot holds no memory.
//!
//! A large pool's slots are as big as the chain's largest body, so its memfd is sparse: only
//! pages written are resident. Whoever frees a slot first gives its pages back with
//! `madvise(MADV_REMOVE)` over the slot's bytes (a hole punched in the memfd, seen by every
//! mapping), then frees it; after the free the bytes may already be a new owner's, so a
//! punch is only ever made by a party that owns the slot.
//!
//! A slot freed without a punch (revoked by a sender, reclaimed from a dead party, or freed
//! by a hostile function that skips it) keeps its pages until [`Pool::release_free`] claims
//! it: at most the pool's whole size stays resident, never more.

use crate::owner::Owner;
use crate::pool::Pool;
use crate::sys;

impl Pool {
    /// Gives the pages of local slot `local` back to the kernel if this is a releasing pool.
    /// The caller owns the slot (and keeps owning it until the punch has returned).
    pub(crate) fn release_owned(&self, local: u32) {
        if !self.releases() {
            return;
        }
        // SAFETY: `local < slot_count` (every caller holds an `OwnedSlot` or a claimed
        // slot of this pool), so the slot's bytes are inside our writable shared mapping; a
        // releasing pool's slots_offset and slot_size are page multiples (checked by its
        // geometry), so the range is page aligned; and the caller owns the slot, so no one
        // else relies on its bytes. A failure leaves the pages resident, which costs memory
        // only, until the slot's next free.
        let _ = unsafe { sys::madvise_remove(self.slot_ptr(local), self.slot_size() as usize) };
    }

    /// Gives back the pages of every free slot of a releasing pool (nothing for another
    /// pool): for each, claims it for `me` (the allocator's compare-and-swap, so no one else
    /// uses it meanwhile), punches it, frees it (its generation moves on). Returns how many
    /// slots it released.
    ///
    /// For slots freed without a punch: the agent calls it after reclaiming a dead party's
    /// slots, the gateway may after a revoke. An allocation racing with it may find a slot
    /// briefly held and take another one (or find the pool full for that instant).
    pub fn release_free(&self, me: Owner) -> u32 {
        if !self.releases() {
            return 0;
        }
        let owners = self.owners();
        let mut released = 0;
        for local in 0..self.slot_count() {
            if owners.claim(local, me).is_some() {
                self.release_owned(local);
                let _ = owners.free(local, me);
                released += 1;
            }
        }
        released
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::{PoolError, PoolGeometry, Pools};

    const SLOT: u32 = 1 << 20;

    fn large(first_slot: u32) -> Arc<Pool> {
        Arc::new(
            Pool::create(
                "release-test",
                &PoolGeometry {
                    slots: 4,
                    first_slot,
                    slot_size: SLOT,
                    max_parties: 3,
                    hugepages: false,
                    release: true,
                },
            )
            .unwrap(),
        )
    }

    fn resident(pool: &Pool, local: u32) -> usize {
        sys::resident_pages(pool.slot_ptr(local), pool.slot_size() as usize)
    }

    #[test]
    fn a_freed_large_slot_holds_no_pages_in_any_mapping() {
        let a = large(0);
        assert!(a.releases());
        // Another process would attach the same memfd: a second mapping stands in.
        let b =
            Arc::new(Pool::attach(a.fd().try_clone_to_owned().unwrap(), &a.geometry()).unwrap());
        assert!(b.releases());
        assert_eq!(resident(&a, 0), 0, "a new large pool is sparse");
        let mut s = b.alloc(Owner::party(1)).unwrap();
        assert_eq!(s.index(), 0);
        s.data_mut().fill(0xAB);
        let pages = SLOT as usize / 4096;
        assert_eq!(resident(&b, 0), pages);
        assert_eq!(resident(&a, 0), pages, "the same memfd pages");
        drop(s);
        assert_eq!(resident(&a, 0), 0, "freed by b, gone for a too");
        assert_eq!(resident(&b, 0), 0);
        let again = a.alloc(Owner::party(0)).unwrap();
        assert_eq!(again.index(), 0);
        assert!(
            again.data().iter().all(|&x| x == 0),
            "the bytes read back zero"
        );
    }

    #[test]
    fn release_free_punches_slots_freed_without_a_punch_and_leaves_held_ones() {
        let p = large(0);
        let (dead, live, agent) = (Owner::party(1), Owner::party(2), Owner::party(0));
        let mut d = p.alloc(dead).unwrap();
        d.data_mut().fill(1);
        let d_slot = d.index();
        d.into_sent();
        let mut l = p.alloc(live).unwrap();
        l.data_mut().fill(2);
        let l_gen = l.generation();
        // Reclaim frees the dead party's slot without a punch (it is not the owner's to
        // punch: a new owner could already be writing it).
        assert_eq!(p.reclaim(dead).len(), 1);
        assert!(resident(&p, d_slot) > 0);
        let gen = p.owners().get(d_slot).unwrap().generation;
        // Free slots 0, 2, 3 are released; the live party's slot 1 is not touched.
        assert_eq!(p.release_free(agent), 3);
        assert_eq!(resident(&p, d_slot), 0);
        assert_eq!(resident(&p, 1), SLOT as usize / 4096);
        assert!(
            l.data().iter().all(|&x| x == 2),
            "a held slot keeps its bytes"
        );
        assert_eq!(p.owners().get(1).unwrap().generation, l_gen);
        assert_eq!(p.owners().get(d_slot).unwrap().generation, gen + 1);
        assert_eq!(p.owners().in_use(), 1);
        drop(l);
        assert_eq!(p.owners().in_use(), 0);
        assert_eq!(resident(&p, 1), 0);
    }

    #[test]
    fn a_small_pool_does_not_release() {
        let small = Arc::new(
            Pool::create(
                "release-small",
                &PoolGeometry {
                    slots: 2,
                    first_slot: 0,
                    slot_size: 8192,
                    max_parties: 2,
                    hugepages: false,
                    release: false,
                },
            )
            .unwrap(),
        );
        assert!(!small.releases());
        let mut s = small.alloc(Owner::party(0)).unwrap();
        s.data_mut()[..4].copy_from_slice(b"keep");
        drop(s);
        assert_eq!(small.release_free(Owner::party(0)), 0);
        assert_eq!(
            resident(&small, 0),
            1,
            "the written page stays: no punch in a small pool"
        );
    }

    #[test]
    fn a_releasing_pool_needs_whole_pages_and_no_huge_pages() {
        for (slot_size, hugepages) in [(4096 + 64, false), (1 << 21, true)] {
            let r = Pool::create(
                "release-bad",
                &PoolGeometry {
                    slots: 1,
                    first_slot: 0,
                    slot_size,
                    max_parties: 1,
                    hugepages,
                    release: true,
                },
            );
            assert!(
                matches!(r, Err(PoolError::Geometry(_))),
                "{slot_size} {hugepages}"
            );
        }
    }

    #[test]
    fn the_release_flag_is_part_of_the_compared_header() {
        let p = large(0);
        let mut g = p.geometry();
        g.release = false;
        let err = Pool::attach(p.fd().try_clone_to_owned().unwrap(), &g)
            .err()
            .expect("a plan without the flag is refused");
        assert!(err.to_string().contains("flags"), "{err}");
    }

    #[test]
    fn large_of_finds_the_releasing_pool_right_after_a_small_one() {
        let small = |first_slot| {
            Arc::new(
                Pool::create(
                    "release-pair",
                    &PoolGeometry {
                        slots: 8,
                        first_slot,
                        slot_size: 4096,
                        max_parties: 3,
                        hugepages: false,
                        release: false,
                    },
                )
                .unwrap(),
            )
        };
        // Domain 0: small 0..8, large 8..12; domain 1: small 12..20, no large pool.
        let (s0, l0, s1) = (small(0), large(8), small(12));
        let set = Pools::new(vec![s1.clone(), l0.clone(), s0.clone()]).unwrap();
        assert!(Arc::ptr_eq(set.large_of(&s0).unwrap(), &l0));
        assert!(set.large_of(&s1).is_none());
        assert!(
            set.large_of(&l0).is_none(),
            "a large pool has no large pool"
        );
        assert!(Arc::ptr_eq(set.small_of(&l0).unwrap(), &s0));
        assert!(set.small_of(&s0).is_none(), "a small pool is no large one");
        let alone = Pools::new(vec![l0.clone()]).unwrap();
        assert!(alone.small_of(&l0).is_none(), "its small pool not mapped");
    }
}
