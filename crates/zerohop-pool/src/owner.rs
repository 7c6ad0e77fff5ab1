//! Slot ownership: one 64-bit word per slot, which is at once the allocator and the record
//! of who holds the slot.
//!
//! ```text
//!  63                32 31                 0
//!  +-------------------+-------------------+
//!  |    generation     |       owner       |    owner 0 = free
//!  +-------------------+-------------------+
//! ```
//!
//! Every transition is a single compare-and-swap on that word, so a process that dies at any
//! instruction leaves each slot either free or owned by exactly one party, never lost in
//! between (a free-list allocator could lose a slot popped but not yet recorded):
//!
//! * alloc:    `(g, FREE)  -> (g, me)`      the lowest free slot
//! * take:     `(g, from)  -> (g, me)`      the receiver takes a slot it was sent
//! * free:     `(g, me)    -> (g+1, FREE)`  the generation moves on, stale descriptors die
//! * reclaim:  `(g, dead)  -> (g+1, FREE)`  the agent, after a party died
//!
//! `from` may be the receiver itself (a route `[f, f]` with one instance): it takes back the
//! slot it sent, through its own queue, and the word stays as it is.
//!
//! The receiver (not the sender) performs the hand-over, so a descriptor that never arrives
//! leaves its slot with the sender, where reclaim finds it if the sender dies.

use crate::sync::{AtomicU64, Ordering};

/// Who owns a slot: 0 is "free", party `p` is stored as `p + 1`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Owner(u32);

impl Owner {
    /// The "nobody" owner of a free slot.
    pub const FREE: Owner = Owner(0);

    /// The owner id of party `party` (0 is the gateway, 1.. the instances).
    pub const fn party(party: u16) -> Owner {
        Owner(party as u32 + 1)
    }

    /// The party this owner stands for, `None` for [`Owner::FREE`] or a corrupt value.
    pub fn as_party(self) -> Option<u16> {
        self.0.checked_sub(1).and_then(|p| u16::try_from(p).ok())
    }

    /// Raw value as stored in the owner word.
    pub fn raw(self) -> u32 {
        self.0
    }
}

/// Owner and generation of a slot at one instant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OwnerWord {
    /// Current owner.
    pub owner: Owner,
    /// Current generation (increments on every free).
    pub generation: u32,
}

impl OwnerWord {
    fn pack(self) -> u64 {
        (u64::from(self.generation) << 32) | u64::from(self.owner.0)
    }
    fn unpack(w: u64) -> Self {
        Self {
            owner: Owner(w as u32),
            generation: (w >> 32) as u32,
        }
    }
}

/// Why a hand-over or free was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum OwnershipError {
    /// Slot index beyond the pool.
    #[error("slot {0} is out of range")]
    OutOfRange(u32),
    /// Generation differs: the descriptor is stale or forged.
    #[error("slot {slot} has generation {actual}, descriptor says {expected}")]
    StaleGeneration {
        /// Slot index.
        slot: u32,
        /// Generation the caller expected.
        expected: u32,
        /// Generation found.
        actual: u32,
    },
    /// The slot is owned by someone the caller did not expect (or is free).
    #[error("slot {slot} is owned by {actual:?}, not by an allowed party")]
    WrongOwner {
        /// Slot index.
        slot: u32,
        /// Owner found.
        actual: Owner,
    },
}

/// View of the owner words of a pool (in shared memory, or on the heap for loom tests).
pub struct OwnerTable<'a> {
    words: &'a [AtomicU64],
}

impl<'a> OwnerTable<'a> {
    /// Builds a table over `words` (one per slot).
    pub fn new(words: &'a [AtomicU64]) -> Self {
        Self { words }
    }

    /// Number of slots.
    pub fn len(&self) -> u32 {
        self.words.len() as u32
    }

    /// True when the table has no slots.
    pub fn is_empty(&self) -> bool {
        self.words.is_empty()
    }

    /// Owner and generation of `slot` now.
    pub fn get(&self, slot: u32) -> Option<OwnerWord> {
        // SYNC POINT: Acquire pairs with the AcqRel CAS of whoever last changed the word, so
        // a reader that sees itself as owner also sees the previous owner's slot writes.
        self.words
            .get(slot as usize)
            .map(|w| OwnerWord::unpack(w.load(Ordering::Acquire)))
    }

    /// Allocates the lowest free slot for `me`. Returns `(slot, generation)` or `None` when
    /// every slot is taken (after one full scan).
    ///
    /// Lowest first, so the few slots a load keeps in flight are used again and again:
    /// already mapped (no page faults) and in cache in every party, where walking the whole
    /// pool would touch every page of it (a 1 GiB pool of 1 MiB bodies: hundreds of
    /// thousands of faults per party before the first reuse). The scan reads one word per
    /// slot in use.
    pub fn alloc(&self, me: Owner) -> Option<(u32, u32)> {
        debug_assert_ne!(me, Owner::FREE);
        for (slot, word) in self.words.iter().enumerate() {
            let slot = slot as u32;
            let cur = OwnerWord::unpack(word.load(Ordering::Relaxed));
            if cur.owner != Owner::FREE {
                continue;
            }
            let new = OwnerWord { owner: me, ..cur };
            // SYNC POINT: AcqRel pairs with the Release half of `free`/`reclaim` by the last
            // owner: its writes to the slot happen-before ours.
            if word
                .compare_exchange(cur.pack(), new.pack(), Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                return Some((slot, cur.generation));
            }
        }
        None
    }

    /// Allocates `slot` itself for `me` if it is free: the same transition as
    /// [`alloc`](Self::alloc) (`(g, FREE) -> (g, me)`), for one chosen slot. Returns its
    /// generation, `None` when the slot is out of range or held.
    pub fn claim(&self, slot: u32, me: Owner) -> Option<u32> {
        debug_assert_ne!(me, Owner::FREE);
        let word = self.words.get(slot as usize)?;
        let cur = OwnerWord::unpack(word.load(Ordering::Relaxed));
        if cur.owner != Owner::FREE {
            return None;
        }
        let new = OwnerWord { owner: me, ..cur };
        // SYNC POINT: AcqRel pairs with the Release half of `free`/`reclaim`, as in `alloc`.
        word.compare_exchange(cur.pack(), new.pack(), Ordering::AcqRel, Ordering::Relaxed)
            .ok()
            .map(|_| cur.generation)
    }

    /// Takes over `slot` for `me`, sent with generation `generation`, if its current owner
    /// passes `allowed`. Returns the previous owner. The owner may be `me` itself when
    /// `allowed` admits it: a party that sends to itself (a route `[f, f]`) takes back the
    /// slot it sent, and the word does not change.
    pub fn take(
        &self,
        slot: u32,
        generation: u32,
        me: Owner,
        allowed: impl Fn(Owner) -> bool,
    ) -> Result<Owner, OwnershipError> {
        let word = self
            .words
            .get(slot as usize)
            .ok_or(OwnershipError::OutOfRange(slot))?;
        // SYNC POINT: Acquire pairs with the AcqRel CAS that made the sender owner (alloc or
        // its own take); the sender's payload writes are ordered before its queue publish,
        // which the transport's Acquire already covers; this keeps the word itself coherent.
        let cur = OwnerWord::unpack(word.load(Ordering::Acquire));
        if cur.generation != generation {
            return Err(OwnershipError::StaleGeneration {
                slot,
                expected: generation,
                actual: cur.generation,
            });
        }
        if cur.owner == Owner::FREE || !allowed(cur.owner) {
            return Err(OwnershipError::WrongOwner {
                slot,
                actual: cur.owner,
            });
        }
        let new = OwnerWord { owner: me, ..cur };
        // SYNC POINT: AcqRel pairs with the owner's earlier CAS and with a concurrent reclaim;
        // if reclaim wins, this fails and the descriptor is dropped.
        word.compare_exchange(cur.pack(), new.pack(), Ordering::AcqRel, Ordering::Acquire)
            .map(|_| cur.owner)
            .map_err(|w| OwnershipError::WrongOwner {
                slot,
                actual: OwnerWord::unpack(w).owner,
            })
    }

    /// Frees `slot`, which `owner` must hold; the generation moves on.
    pub fn free(&self, slot: u32, owner: Owner) -> Result<(), OwnershipError> {
        let word = self
            .words
            .get(slot as usize)
            .ok_or(OwnershipError::OutOfRange(slot))?;
        let mut cur = OwnerWord::unpack(word.load(Ordering::Relaxed));
        loop {
            if cur.owner != owner || owner == Owner::FREE {
                return Err(OwnershipError::WrongOwner {
                    slot,
                    actual: cur.owner,
                });
            }
            let new = OwnerWord {
                owner: Owner::FREE,
                generation: cur.generation.wrapping_add(1),
            };
            // SYNC POINT: Release pairs with the AcqRel CAS in `alloc` of the next owner.
            match word.compare_exchange(cur.pack(), new.pack(), Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => return Ok(()),
                Err(w) => cur = OwnerWord::unpack(w),
            }
        }
    }

    /// Frees `slot` only if it is still exactly `(generation, owner)`: how a sender takes back
    /// a slot whose descriptor it sent but nobody took (the receiver died between popping it
    /// and taking it). If the receiver takes it first, this fails; if this wins, the late
    /// receiver's take fails on the generation. Returns whether the slot was freed.
    pub fn revoke(&self, slot: u32, generation: u32, owner: Owner) -> bool {
        let Some(word) = self.words.get(slot as usize) else {
            return false;
        };
        if owner == Owner::FREE {
            return false;
        }
        let cur = OwnerWord { owner, generation };
        let new = OwnerWord {
            owner: Owner::FREE,
            generation: generation.wrapping_add(1),
        };
        // SYNC POINT: AcqRel pairs with the AcqRel CAS of a racing `take` (exactly one wins)
        // and with the next owner's `alloc`.
        word.compare_exchange(cur.pack(), new.pack(), Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    }

    /// Slots currently held by `owner` (a snapshot).
    pub fn owned_by(&self, owner: Owner) -> Vec<u32> {
        (0..self.len())
            .filter(|&s| self.get(s).is_some_and(|w| w.owner == owner))
            .collect()
    }

    /// Number of slots not free.
    pub fn in_use(&self) -> u32 {
        (0..self.len())
            .filter(|&s| self.get(s).is_some_and(|w| w.owner != Owner::FREE))
            .count() as u32
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn table(n: usize) -> Vec<AtomicU64> {
        (0..n).map(|_| AtomicU64::new(0)).collect()
    }

    #[test]
    fn alloc_until_full_then_free() {
        let w = table(4);
        let t = OwnerTable::new(&w);
        let a = Owner::party(0);
        let mut got: Vec<u32> = (0..4).map(|_| t.alloc(a).unwrap().0).collect();
        got.sort();
        assert_eq!(got, vec![0, 1, 2, 3]);
        assert_eq!(t.alloc(a), None);
        assert_eq!(t.in_use(), 4);
        t.free(2, a).unwrap();
        assert_eq!(t.alloc(a), Some((2, 1)), "generation moved on after free");
    }

    #[test]
    fn claim_takes_only_the_named_free_slot() {
        let w = table(3);
        let t = OwnerTable::new(&w);
        let (a, b) = (Owner::party(0), Owner::party(1));
        assert_eq!(t.alloc(a), Some((0, 0)));
        assert_eq!(t.claim(0, b), None, "held by a");
        assert_eq!(t.claim(3, b), None, "out of range");
        assert_eq!(t.claim(2, b), Some(0));
        assert_eq!(t.get(2).unwrap().owner, b);
        assert_eq!(t.get(1).unwrap().owner, Owner::FREE, "no other slot taken");
        t.free(2, b).unwrap();
        assert_eq!(t.claim(2, b), Some(1), "the generation it found");
    }

    #[test]
    fn take_checks_generation_and_owner() {
        let w = table(2);
        let t = OwnerTable::new(&w);
        let (gw, f1, f2) = (Owner::party(0), Owner::party(1), Owner::party(2));
        let (s, g) = t.alloc(gw).unwrap();
        assert!(matches!(
            t.take(s, g + 1, f1, |_| true),
            Err(OwnershipError::StaleGeneration { .. })
        ));
        assert!(matches!(
            t.take(s, g, f1, |o| o == f2),
            Err(OwnershipError::WrongOwner { .. })
        ));
        assert_eq!(t.take(s, g, f1, |o| o == gw), Ok(gw));
        assert_eq!(t.get(s).unwrap().owner, f1);
        // The old owner can no longer free it.
        assert!(t.free(s, gw).is_err());
        // A party that sent the slot to itself takes it back (the word stays), but only where
        // its own queue is the one it came in on.
        assert!(matches!(
            t.take(s, g, f1, |o| o == gw),
            Err(OwnershipError::WrongOwner { .. })
        ));
        assert_eq!(t.take(s, g, f1, |o| o == f1), Ok(f1));
        assert_eq!(t.get(s).unwrap().owner, f1);
        assert!(matches!(
            t.take(9, 0, f1, |_| true),
            Err(OwnershipError::OutOfRange(9))
        ));
    }

    #[test]
    fn revoke_needs_the_exact_generation_and_owner() {
        let w = table(1);
        let t = OwnerTable::new(&w);
        let (gw, f1) = (Owner::party(0), Owner::party(1));
        let (s, g) = t.alloc(gw).unwrap();
        // Taken by the receiver: the sender cannot revoke it.
        t.take(s, g, f1, |o| o == gw).unwrap();
        assert!(!t.revoke(s, g, gw));
        t.free(s, f1).unwrap();
        // Reallocated by the sender for another request: the old generation does not match.
        let (s2, g2) = t.alloc(gw).unwrap();
        assert_eq!((s2, g2), (s, g + 1));
        assert!(!t.revoke(s, g, gw));
        // Never taken: revoked, and a late take of the old descriptor fails.
        assert!(t.revoke(s, g2, gw));
        assert_eq!(t.get(s).unwrap().owner, Owner::FREE);
        assert!(t.take(s, g2, f1, |o| o == gw).is_err());
    }

    #[test]
    fn reclaim_finds_dead_owner() {
        let w = table(8);
        let t = OwnerTable::new(&w);
        let dead = Owner::party(3);
        for _ in 0..3 {
            t.alloc(dead).unwrap();
        }
        t.alloc(Owner::party(1)).unwrap();
        let held = t.owned_by(dead);
        assert_eq!(held.len(), 3);
        for s in held {
            t.free(s, dead).unwrap();
        }
        assert_eq!(t.owned_by(dead), Vec::<u32>::new());
        assert_eq!(t.in_use(), 1);
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use crate::sync::AtomicU32;
    use loom::sync::Arc;

    /// Two allocators racing for two slots each get a distinct one; a free then makes it
    /// available again with a new generation.
    #[test]
    fn concurrent_alloc_is_exclusive() {
        loom::model(|| {
            let words: Arc<Vec<AtomicU64>> = Arc::new((0..2).map(|_| AtomicU64::new(0)).collect());
            let handles: Vec<_> = (0..2u16)
                .map(|p| {
                    let w = words.clone();
                    loom::thread::spawn(move || {
                        let t = OwnerTable::new(&w);
                        t.alloc(Owner::party(p)).map(|(s, _)| s)
                    })
                })
                .collect();
            let mut got: Vec<u32> = handles
                .into_iter()
                .map(|h| h.join().unwrap().expect("two slots for two allocators"))
                .collect();
            got.sort();
            assert_eq!(got, vec![0, 1]);
        });
    }

    /// A take racing with a reclaim of the same slot: exactly one of them wins.
    #[test]
    fn take_races_reclaim() {
        loom::model(|| {
            let words: Arc<Vec<AtomicU64>> = Arc::new(vec![AtomicU64::new(0)]);
            let sender = Owner::party(1);
            let (slot, g) = OwnerTable::new(&words).alloc(sender).unwrap();
            let w2 = words.clone();
            let taker = loom::thread::spawn(move || {
                OwnerTable::new(&w2)
                    .take(slot, g, Owner::party(2), |o| o == sender)
                    .is_ok()
            });
            let reclaimed = OwnerTable::new(&words).free(slot, sender).is_ok();
            let taken = taker.join().unwrap();
            assert!(taken ^ reclaimed, "taken={taken} reclaimed={reclaimed}");
            let w = OwnerTable::new(&words).get(slot).unwrap();
            if taken {
                assert_eq!(w.owner, Owner::party(2));
            } else {
                assert_eq!(w.owner, Owner::FREE);
                assert_eq!(w.generation, g + 1);
            }
        });
    }

    /// Alloc, free and alloc again from two threads: no slot is ever owned twice.
    #[test]
    fn alloc_free_cycle() {
        loom::model(|| {
            let words: Arc<Vec<AtomicU64>> = Arc::new(vec![AtomicU64::new(0)]);
            let held = Arc::new(AtomicU32::new(0));
            let handles: Vec<_> = (0..2u16)
                .map(|p| {
                    let (w, h) = (words.clone(), held.clone());
                    loom::thread::spawn(move || {
                        let t = OwnerTable::new(&w);
                        if let Some((s, _)) = t.alloc(Owner::party(p)) {
                            assert_eq!(h.fetch_add(1, Ordering::SeqCst), 0, "owned twice");
                            h.fetch_sub(1, Ordering::SeqCst);
                            t.free(s, Owner::party(p)).unwrap();
                        }
                    })
                })
                .collect();
            for h in handles {
                h.join().unwrap();
            }
            assert_eq!(OwnerTable::new(&words).in_use(), 0);
        });
    }
}
