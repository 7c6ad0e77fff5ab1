//! Descriptor validation against a pool whose shared words a hostile party has written.
//!
//! Every party of a chain maps the pool read-write (`docs/protocol.md`, "what each party can
//! write"), so the receiver of a descriptor must cope with any owner word and any slot header.
//! Input layout (missing bytes read as zero):
//!
//! ```text
//!  0       16                    80                                  336
//!  +-------+---------------------+-----------------------------------+
//!  | desc  | owner word x 8      | slot header x 8                   |
//!  | 16 B  | u64 LE, gen:32|own:32| 32 B each, as `SlotHeader`        |
//!  +-------+---------------------+-----------------------------------+
//! ```
//!
//! Per input the owner words are written raw through a second mapping of the pool's memfd
//! (what another process would do), the headers with `Pool::scribble_header`, then the
//! gateway (party 0) is the only allowed sender and party 1 takes the descriptor. The result
//! must be exactly what the protocol says: the refusal reasons in their order, or a take
//! that leaves party 1 owning the slot with metadata and payload inside it, and no other
//! word touched.

#![no_main]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use zerohop_pool::region::Region;
use zerohop_pool::{
    Descriptor, Owner, OwnershipError, Pool, PoolGeometry, SlotHeader, TakeError, SLOT_HEADER_LEN,
};

const SLOTS: u32 = 8;
const DESC_LEN: usize = Descriptor::LEN;
const WORDS_LEN: usize = SLOTS as usize * 8;
const INPUT_LEN: usize = DESC_LEN + WORDS_LEN + SLOTS as usize * SLOT_HEADER_LEN;
/// Byte offset of `owners_offset` in the pool header (`docs/protocol.md`).
const OWNERS_OFFSET_FIELD: usize = 40;

struct Fixture {
    pool: Arc<Pool>,
    /// A second mapping of the pool's memfd: the hostile party's view.
    raw: Region,
    owners_offset: usize,
}

impl Fixture {
    fn new() -> Self {
        let pool = Arc::new(
            Pool::create(
                "fuzz-descriptor",
                &PoolGeometry {
                    slots: SLOTS,
                    first_slot: 0,
                    slot_size: 256,
                    max_parties: 4,
                    hugepages: false,
                    release: false,
                },
            )
            .expect("create the pool"),
        );
        let fd = pool.fd().try_clone_to_owned().expect("dup the pool memfd");
        let raw = Region::attach(fd).expect("map the pool a second time");
        assert!(raw.writable(), "the pool memfd maps read-write");
        // SAFETY: the mapping is at least one page and page aligned, so the u64 at offset 40
        // of the header is in bounds and aligned; the creator wrote the header before we
        // mapped it and nobody writes it again.
        let owners_offset =
            unsafe { raw.base().add(OWNERS_OFFSET_FIELD).cast::<u64>().read() } as usize;
        assert!(
            owners_offset + WORDS_LEN <= raw.len(),
            "owner words inside the region"
        );
        let f = Self {
            pool,
            raw,
            owners_offset,
        };
        // The raw view and the pool's own view must be the same words, or every check
        // below tests nothing.
        for s in 0..SLOTS {
            let w = 0x1234_5678_0000_0000 | u64::from(s) << 8 | 3;
            f.word(s).store(w, Ordering::Release);
            let seen = f.pool.owners().get(s).expect("slot in range");
            assert_eq!(
                (seen.owner.raw(), seen.generation),
                (w as u32, (w >> 32) as u32)
            );
            f.word(s).store(0, Ordering::Release);
        }
        f
    }

    /// The owner word of `slot` through the raw mapping.
    fn word(&self, slot: u32) -> &AtomicU64 {
        assert!(slot < SLOTS);
        // SAFETY: `owners_offset + 8 * slot + 8 <= len` (checked in `new`), the offset is a
        // multiple of 8 in a page-aligned mapping, `AtomicU64` has the layout of `u64` and
        // every bit pattern is valid; the mapping lives as long as `self`. Other mappings of
        // the same words use atomics too.
        unsafe {
            &*self
                .raw
                .base()
                .add(self.owners_offset + 8 * slot as usize)
                .cast::<AtomicU64>()
        }
    }
}

fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(Fixture::new)
}

fn header_from(b: &[u8]) -> SlotHeader {
    let u16_at = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
    let mut reserved = [0u8; 6];
    reserved.copy_from_slice(&b[18..24]);
    SlotHeader {
        request: u32::from_le_bytes(b[0..4].try_into().expect("4 bytes")),
        route: u16_at(4),
        hop: b[6],
        flags: b[7],
        status: u16_at(8),
        meta_len: u16_at(10),
        call: u32::from_le_bytes(b[12..16].try_into().expect("4 bytes")),
        caller: u16_at(16),
        reserved,
        deadline_ms: u64::from_le_bytes(b[24..32].try_into().expect("8 bytes")),
    }
}

/// What the protocol says `take` must answer, from the words and headers as written.
fn expected(
    desc: &Descriptor,
    words: &[u64],
    headers: &[SlotHeader],
    capacity: usize,
) -> Result<(), TakeError> {
    if desc.slot >= SLOTS {
        return Err(TakeError::Ownership(OwnershipError::OutOfRange(desc.slot)));
    }
    if desc.len as usize > capacity {
        return Err(TakeError::Length {
            len: desc.len,
            capacity,
        });
    }
    let w = words[desc.slot as usize];
    let (owner, generation) = (w as u32, (w >> 32) as u32);
    if generation != desc.generation {
        return Err(TakeError::Ownership(OwnershipError::StaleGeneration {
            slot: desc.slot,
            expected: desc.generation,
            actual: generation,
        }));
    }
    if owner != Owner::party(0).raw() {
        // The actual owner is reported; checked by raw value below.
        return Err(TakeError::Ownership(OwnershipError::WrongOwner {
            slot: desc.slot,
            actual: Owner::FREE,
        }));
    }
    let meta = headers[desc.slot as usize].meta_len as usize;
    if meta + desc.len as usize > capacity {
        return Err(TakeError::Length {
            len: desc.len + meta as u32,
            capacity,
        });
    }
    Ok(())
}

fuzz_target!(|data: &[u8]| {
    let mut input = [0u8; INPUT_LEN];
    let n = data.len().min(INPUT_LEN);
    input[..n].copy_from_slice(&data[..n]);

    // The wire format: every 16-byte pattern decodes, and encodes back to itself.
    let bytes: [u8; 16] = input[..DESC_LEN].try_into().expect("16 bytes");
    let desc = Descriptor::from_bytes(bytes);
    assert_eq!(desc.to_bytes(), bytes, "descriptor round trip");
    assert_eq!(Descriptor::from_words(desc.to_words()), desc);
    assert!(desc.slot <= Descriptor::MAX_SLOT);

    let f = fixture();
    let pool = &f.pool;
    let capacity = pool.slot_capacity();
    let words: Vec<u64> = input[DESC_LEN..DESC_LEN + WORDS_LEN]
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
        .collect();
    let headers: Vec<SlotHeader> = input[DESC_LEN + WORDS_LEN..]
        .chunks_exact(SLOT_HEADER_LEN)
        .map(header_from)
        .collect();
    for s in 0..SLOTS {
        pool.scribble_header(s, |h| *h = headers[s as usize]);
        f.word(s).store(words[s as usize], Ordering::Release);
    }

    let gateway = Owner::party(0);
    let me = Owner::party(1);
    let want = expected(&desc, &words, &headers, capacity);
    let got = pool.take(&desc, me, |o| o == gateway);
    let raw_now = |s: u32| f.word(s).load(Ordering::Acquire);

    match (&got, &want) {
        (Ok((from, slot, header)), Ok(())) => {
            assert_eq!(*from, gateway);
            assert_eq!(slot.index(), desc.slot);
            assert_eq!(slot.generation(), desc.generation);
            assert_eq!(
                *header, headers[desc.slot as usize],
                "header read once, as written"
            );
            assert!(
                header.meta_len as usize + desc.len as usize <= capacity,
                "meta_len {} + len {} beyond the slot's {capacity} bytes",
                header.meta_len,
                desc.len
            );
            assert_eq!(slot.data().len(), capacity);
            let w = raw_now(desc.slot);
            assert_eq!(w as u32, me.raw(), "party 1 owns the slot after the take");
            assert_eq!(
                (w >> 32) as u32,
                desc.generation,
                "a take keeps the generation"
            );
        }
        (
            Err(TakeError::Ownership(OwnershipError::WrongOwner { slot, actual })),
            Err(TakeError::Ownership(OwnershipError::WrongOwner { .. })),
        ) => {
            assert_eq!(*slot, desc.slot);
            assert_eq!(
                actual.raw(),
                words[desc.slot as usize] as u32,
                "the refusal names the owner found"
            );
        }
        (Err(g), Err(w)) => assert_eq!(g, w, "refused for the wrong reason"),
        (g, w) => panic!(
            "take of {desc:?} answered {:?}, the protocol says {w:?} (words {words:x?})",
            g.as_ref().map(|(from, _, h)| (from, h))
        ),
    }

    // A take touches only its own slot's word. A slot refused for its metadata after the
    // take was ours for an instant and is freed (generation moves on); one taken is freed
    // when its handle drops, below.
    let taken_then_freed = matches!(want, Err(TakeError::Length { .. }))
        && desc.slot < SLOTS
        && desc.len as usize <= capacity;
    for s in 0..SLOTS {
        let before = words[s as usize];
        let now = raw_now(s);
        if s == desc.slot && got.is_ok() {
            continue;
        }
        if s == desc.slot && taken_then_freed {
            assert_eq!(
                now as u32, 0,
                "slot {s} freed after the metadata check failed"
            );
            assert_eq!((now >> 32) as u32, ((before >> 32) as u32).wrapping_add(1));
            continue;
        }
        assert_eq!(now, before, "slot {s}'s owner word changed");
    }
    if let Ok((_, slot, _)) = got {
        drop(slot);
        let w = raw_now(desc.slot);
        assert_eq!(w as u32, 0, "dropping the taken slot frees it");
        assert_eq!((w >> 32) as u32, desc.generation.wrapping_add(1));
    }

    // Leave the table empty so inputs stay independent.
    for s in 0..SLOTS {
        f.word(s).store(0, Ordering::Release);
    }
});
