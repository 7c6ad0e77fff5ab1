//! The protocol's test vectors (`protocol/vectors/*.json`, see "Test vectors" in
//! `docs/protocol.md`) checked against this crate, both ways: the code encodes each case's
//! fields to the file's bytes, and decodes the file's bytes to the file's fields. The bytes
//! are read from and written to the pool's shared memory itself (through its memfd), so what
//! is checked is what another process mapping the pool sees.
//!
//! With `ZEROHOP_BLESS=1` each test first rewrites its file from the code (keeping the
//! file's case inputs, adding the seed cases below if missing), for a deliberate protocol
//! change; review the diff, then bump the protocol version.

#[macro_use]
mod vectors_support;

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use vectors_support::{about, hex, load, DescFields, Report, Shm};
use zerohop_pool::{
    latency_bucket, Descriptor, Owner, PartyRecord, PartyState, Pool, PoolGeometry, Rejected,
    SlotHeader, HEADER_MAGIC, LATENCY_BUCKETS, PARTY_RECORD_LEN, PROTOCOL_VERSION, SLOT_HEADER_LEN,
};

/// Largest integer every JSON parser reads exactly (a float64 mantissa): every number in the
/// files stays at or below it.
const MAX_SAFE: u64 = (1 << 53) - 1;

// ---------------------------------------------------------------------------------------
// Files, cases, pools (the rest is in vectors_support, shared with the transport's test)
// ---------------------------------------------------------------------------------------

/// The `about` of one of this crate's files: `what` it holds, under `section`.
fn file_about(section: &str, what: &str) -> String {
    about(
        &format!("\"{section}\""),
        &format!(
            "{what} Bytes are hex, byte 0 first; every other number is a plain JSON number \
             (all below 2^53)."
        ),
    )
}

/// Cases as blessing writes them: the file's (told apart by `key`), then every seed case it
/// lacks, each remade by the code.
fn bless_cases<C, K: PartialEq>(
    old: Option<Vec<C>>,
    seeds: Vec<C>,
    key: impl Fn(&C) -> K,
    remake: impl FnMut(C) -> C,
) -> Vec<C> {
    let mut out = old.unwrap_or_default();
    for s in seeds {
        if !out.iter().any(|c| key(c) == key(&s)) {
            out.push(s);
        }
    }
    out.into_iter().map(remake).collect()
}

impl Report {
    /// Each of the file's `numbers` is one every JSON parser reads exactly.
    fn safe(&mut self, case: &str, numbers: &[(&str, u64)]) {
        for &(what, n) in numbers {
            if n > MAX_SAFE {
                self.fail(
                    case,
                    format!(
                        "{what} = {n} is above 2^53-1, which not every JSON parser reads exactly"
                    ),
                );
            }
        }
    }
}

impl Shm {
    fn u64_at(&self, offset: u64) -> u64 {
        u64::from_le_bytes(self.read(offset, 8).try_into().expect("8"))
    }
}

fn create_pool(name: &str, c: PoolConfigJson) -> Result<Pool, String> {
    Pool::create(
        &format!("vectors-{name}"),
        &PoolGeometry {
            slots: c.slots,
            first_slot: c.first_slot,
            slot_size: c.slot_size,
            max_parties: c.max_parties,
            hugepages: c.hugepages,
            release: c.release,
        },
    )
    .map_err(|e| format!("cannot create the pool: {e}"))
}

fn pool(name: &str, slots: u32, first_slot: u32, slot_size: u32, max_parties: u16) -> Arc<Pool> {
    let config = PoolConfigJson::new(slots, first_slot, slot_size, max_parties);
    Arc::new(create_pool(name, config).expect("create pool"))
}

// ---------------------------------------------------------------------------------------
// descriptor.json
// ---------------------------------------------------------------------------------------

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct DescCase {
    name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    note: Option<String>,
    fields: DescFields,
    /// What the bytes decode to, where encoding loses part of `fields`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    decoded: Option<DescFields>,
    bytes: String,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct DescFile {
    about: String,
    protocol_version: u32,
    cases: Vec<DescCase>,
}

fn desc_about() -> String {
    file_about(
        "Descriptor (16 bytes)",
        "Each case: a descriptor's fields and its 16 bytes on the wire (in a ring entry or a \
         socket message). `decoded`, where present, is what the bytes decode to when encoding \
         loses part of the fields (a slot above 24 bits keeps its low 24 bits).",
    )
}

fn desc_seeds() -> Vec<DescCase> {
    let case = |name: &str, note: Option<&str>, slot, next, len, request, generation| DescCase {
        name: name.into(),
        note: note.map(Into::into),
        fields: DescFields::new(slot, next, len, request, generation),
        decoded: None,
        bytes: String::new(),
    };
    vec![
        case(
            "ordinary",
            Some("the example of docs/protocol.md"),
            0x0002_0304,
            1,
            0x400,
            0xAABB_CCDD,
            0x1234_5678,
        ),
        case(
            "to the gateway",
            Some("next 0xFF addresses the gateway"),
            5,
            0xFF,
            12,
            7,
            1,
        ),
        case(
            "max slot",
            Some("slot 2^24-1, the last a chain can have"),
            0xFF_FFFF,
            2,
            1,
            1,
            2,
        ),
        case("zero", None, 0, 0, 0, 0, 0),
        case(
            "large len, request and generation",
            None,
            1,
            3,
            0xFFFF_FFFF,
            0xFFFF_FFFE,
            0xFFFF_FFFD,
        ),
        case(
            "distinct bytes",
            Some("every byte differs, to show the order of the fields and of their bytes"),
            0x03_0201,
            0x04,
            0x0807_0605,
            0x0C0B_0A09,
            0x100F_0E0D,
        ),
        case(
            "slot above 24 bits is truncated",
            Some(
                "an encoder keeps the low 24 bits of slot (no pool has such a slot, so the \
                 receiver refuses it anyway)",
            ),
            0x0102_0304,
            7,
            16,
            9,
            3,
        ),
    ]
}

/// The case with its bytes, and what they decode to where that is not `fields`, as the code
/// makes them.
fn desc_made(c: DescCase) -> DescCase {
    let b = Descriptor::from(c.fields).to_bytes();
    let back = DescFields::from(Descriptor::from_bytes(b));
    DescCase {
        decoded: (back != c.fields).then_some(back),
        bytes: hex(&b),
        ..c
    }
}

#[test]
fn descriptor_vectors() {
    const FILE: &str = "descriptor.json";
    let doc: DescFile = load(FILE, |old: Option<DescFile>| DescFile {
        about: desc_about(),
        protocol_version: PROTOCOL_VERSION,
        cases: bless_cases(
            old.map(|d| d.cases),
            desc_seeds(),
            |c| c.name.clone(),
            desc_made,
        ),
    });
    let mut r = Report::new(FILE, &doc.about, &desc_about(), doc.protocol_version);
    r.seeds_present(&doc.cases, &desc_seeds(), |c| &c.name);
    for c in &doc.cases {
        let Some(bytes) = r.bytes(&c.name, "bytes", &c.bytes, Descriptor::LEN) else {
            continue;
        };
        let bytes = <[u8; 16]>::try_from(bytes).expect("16");
        // Encode: the fields give the file's bytes (and the same as two ring words).
        let d = Descriptor::from(c.fields);
        r.eq_hex(&c.name, "encoded bytes", &d.to_bytes(), &c.bytes);
        let words = d.to_words();
        let mut from_words = [0u8; 16];
        from_words[..8].copy_from_slice(&words[0].to_le_bytes());
        from_words[8..].copy_from_slice(&words[1].to_le_bytes());
        r.eq(&c.name, "bytes of the two entry words", from_words, bytes);
        // Decode: the file's bytes give the file's fields.
        let want = c.decoded.unwrap_or(c.fields);
        r.eq(
            &c.name,
            "decoded fields",
            DescFields::from(Descriptor::from_bytes(bytes)),
            want,
        );
        r.eq(
            &c.name,
            "decoded from entry words",
            DescFields::from(Descriptor::from_words(words)),
            want,
        );
        if c.decoded == Some(c.fields) {
            r.fail(&c.name, "`decoded` equals `fields`: leave it out");
        }
    }
    r.finish();
}

// ---------------------------------------------------------------------------------------
// slot_header.json
// ---------------------------------------------------------------------------------------

json_mirror!(HeaderFields <-> SlotHeader {
    request: u32,
    route: u16,
    hop: u8,
    flags: u8,
    status: u16,
    meta_len: u16,
    call: u32,
    caller: u16,
    deadline_ms: u64,
} + { reserved: [0; 6] });

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct HeaderCase {
    name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    note: Option<String>,
    fields: HeaderFields,
    bytes: String,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct HeaderFile {
    about: String,
    protocol_version: u32,
    header_len: usize,
    cases: Vec<HeaderCase>,
}

fn header_about() -> String {
    file_about(
        "Slot",
        "Each case: a SlotHeader's fields and the header_len bytes at the start of the slot \
         as its owner writes them into the pool (the 6 reserved bytes at offset 18 are zero). \
         flags: bit 0 dynamic, bit 1 call, bit 2 answer; status 0 is 200 OK.",
    )
}

fn header_seeds() -> Vec<HeaderCase> {
    let case = |name: &str, note: Option<&str>, fields| HeaderCase {
        name: name.into(),
        note: note.map(Into::into),
        fields,
        bytes: String::new(),
    };
    let zero = HeaderFields::from(SlotHeader::default());
    vec![
        case(
            "fresh slot",
            Some("what a slot's header is right after alloc"),
            zero,
        ),
        case(
            "first hop with metadata",
            Some("57 bytes of `name: value\\n` lines before the payload"),
            HeaderFields {
                request: 0x0102_0304,
                route: 2,
                meta_len: 57,
                ..zero
            },
        ),
        case(
            "deadline and dynamic routing",
            None,
            HeaderFields {
                request: 77,
                route: 1,
                hop: 3,
                flags: SlotHeader::FLAG_DYNAMIC,
                deadline_ms: 0x0001_0203_0405_0607,
                ..zero
            },
        ),
        case(
            "error status",
            Some("422 with a 12-byte error message as payload"),
            HeaderFields {
                request: 1000,
                hop: 2,
                status: 422,
                meta_len: 12,
                deadline_ms: 5_000,
                ..zero
            },
        ),
        case(
            "call",
            Some("party 3 calls; its number for the call is 0xDEADBEEF"),
            HeaderFields {
                request: 42,
                route: 4,
                hop: 1,
                flags: SlotHeader::FLAG_CALL,
                call: 0xDEAD_BEEF,
                caller: 3,
                deadline_ms: 123_456_789_012,
                ..zero
            },
        ),
        case(
            "answer to a call",
            Some("the callee's status 503 goes back to the caller"),
            HeaderFields {
                request: 42,
                route: 4,
                hop: 1,
                flags: SlotHeader::FLAG_ANSWER,
                status: 503,
                call: 0xDEAD_BEEF,
                deadline_ms: 123_456_789_012,
                ..zero
            },
        ),
        case(
            "distinct bytes",
            Some("every field byte differs, to show the order of the fields and their bytes"),
            HeaderFields {
                request: 0x0403_0201,
                route: 0x0605,
                hop: 0x07,
                flags: 0x08,
                status: 0x0A09,
                meta_len: 0x0C0B,
                call: 0x100F_0E0D,
                caller: 0x1211,
                deadline_ms: 0x001E_1D1C_1B1A_1918,
            },
        ),
    ]
}

/// Encodes `fields` by writing them into a slot of `pool`; the slot's bytes as shared.
fn header_bytes(pool: &Arc<Pool>, shm: &Shm, fields: HeaderFields) -> Vec<u8> {
    let mut slot = pool.alloc(Owner::party(0)).expect("a free slot");
    slot.set_header(&fields.into());
    shm.read(slot_offset(pool, shm, slot.index()), SLOT_HEADER_LEN)
}

fn slot_offset(pool: &Pool, shm: &Shm, slot: u32) -> u64 {
    let slots_offset = shm.u64_at(48);
    slots_offset + u64::from(slot - pool.first_slot()) * u64::from(pool.slot_size())
}

#[test]
fn slot_header_vectors() {
    const FILE: &str = "slot_header.json";
    let pool = pool("slot-header", 4, 0, 4096, 2);
    let shm = Shm::of(pool.fd());
    let doc: HeaderFile = load(FILE, |old: Option<HeaderFile>| HeaderFile {
        about: header_about(),
        protocol_version: PROTOCOL_VERSION,
        header_len: SLOT_HEADER_LEN,
        cases: bless_cases(
            old.map(|d| d.cases),
            header_seeds(),
            |c| c.name.clone(),
            |c| HeaderCase {
                bytes: hex(&header_bytes(&pool, &shm, c.fields)),
                ..c
            },
        ),
    });
    let mut r = Report::new(FILE, &doc.about, &header_about(), doc.protocol_version);
    r.eq("(file)", "header_len", SLOT_HEADER_LEN, doc.header_len);
    r.seeds_present(&doc.cases, &header_seeds(), |c| &c.name);
    for c in &doc.cases {
        r.safe(&c.name, &[("deadline_ms", c.fields.deadline_ms)]);
        let Some(bytes) = r.bytes(&c.name, "bytes", &c.bytes, SLOT_HEADER_LEN) else {
            continue;
        };
        // Encode: the owner writes the fields into its slot; the shared bytes are the file's.
        let encoded = header_bytes(&pool, &shm, c.fields);
        r.eq_hex(&c.name, "bytes in the slot", &encoded, &c.bytes);
        // Decode: the file's bytes in a slot read back as the file's fields.
        let slot = pool.alloc(Owner::party(0)).expect("a free slot");
        shm.write(slot_offset(&pool, &shm, slot.index()), &bytes);
        let h = slot.header();
        r.eq(&c.name, "decoded fields", HeaderFields::from(h), c.fields);
        r.eq(&c.name, "decoded reserved bytes", h.reserved, [0; 6]);
        r.eq(
            &c.name,
            "header as the agent peeks it",
            pool.peek_header(slot.index()).map(HeaderFields::from),
            Some(c.fields),
        );
    }
    r.finish();
}

// ---------------------------------------------------------------------------------------
// pool_header.json
// ---------------------------------------------------------------------------------------

/// Bytes of the pool region before the party table: the 64-byte header, then the line of
/// the wake word.
const POOL_HEAD: usize = 128;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct PoolConfigJson {
    slots: u32,
    first_slot: u32,
    slot_size: u32,
    max_parties: u16,
    hugepages: bool,
    /// A releasing (large) pool: header flags bit 1.
    #[serde(default)]
    release: bool,
}

impl PoolConfigJson {
    fn new(slots: u32, first_slot: u32, slot_size: u32, max_parties: u16) -> Self {
        PoolConfigJson {
            slots,
            first_slot,
            slot_size,
            max_parties,
            hugepages: false,
            release: false,
        }
    }
}

/// PoolHeader and the wake word, as docs/protocol.md lays them out.
// The test's own copy of the layout (pool.rs's PoolHeader is private): an independent check.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct PoolFields {
    magic: String,
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
    wake_word: u32,
}

impl PoolFields {
    /// Decodes at the offsets of docs/protocol.md ("Pool region").
    fn decode(b: &[u8]) -> Self {
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4"));
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8"));
        PoolFields {
            magic: hex(&b[0..8]),
            version: u32_at(8),
            slot_count: u32_at(12),
            slot_size: u32_at(16),
            max_parties: u32_at(20),
            flags: u32_at(24),
            first_slot: u32_at(28),
            parties_offset: u64_at(32),
            owners_offset: u64_at(40),
            slots_offset: u64_at(48),
            total_len: u64_at(56),
            wake_word: u32_at(64),
        }
    }
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Ignored {
    offset: usize,
    len: usize,
    reason: String,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct PoolCase {
    name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    note: Option<String>,
    config: PoolConfigJson,
    fields: PoolFields,
    bytes: String,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct PoolFile {
    about: String,
    protocol_version: u32,
    bytes_len: usize,
    ignored: Vec<Ignored>,
    cases: Vec<PoolCase>,
}

fn pool_about() -> String {
    file_about(
        "Pool region",
        "Each case: a pool created with `config` and the first bytes_len bytes of its region \
         right after creation: the 64-byte PoolHeader, then the wake word at offset 64 (zero \
         at creation) and reserved bytes (zero). `fields` is those bytes decoded at the \
         documented offsets (magic as hex). Every byte is deterministic: `ignored` is empty \
         (no pid, time or host value is in the header). Huge pages (flags bit 0) are not \
         covered: a pool with them can be created only on a host that has them reserved. \
         A releasing pool (a security domain's large pool, `config.release`) has flags bit 1.",
    )
}

fn pool_seeds() -> Vec<PoolCase> {
    let case =
        |name: &str, note: Option<&str>, slots, first_slot, slot_size, max_parties| PoolCase {
            name: name.into(),
            note: note.map(Into::into),
            config: PoolConfigJson::new(slots, first_slot, slot_size, max_parties),
            fields: PoolFields::decode(&[0; POOL_HEAD]),
            bytes: String::new(),
        };
    vec![
        case(
            "one pool",
            Some("16 slots of 4 KiB, the gateway and 3 instances"),
            16,
            0,
            4096,
            4,
        ),
        case(
            "second security domain",
            Some("the pool of domain 1 numbers its slots from first_slot = 1 * slots"),
            1024,
            1024,
            256,
            9,
        ),
        case(
            "top of the slot space",
            Some("first_slot + slot_count = 2^24; the smallest slot_size (128)"),
            8,
            (1 << 24) - 8,
            128,
            1,
        ),
        case(
            "many parties",
            Some("300 party records push the owner words and the slots out"),
            100,
            0,
            1024,
            300,
        ),
        PoolCase {
            config: PoolConfigJson {
                release: true,
                ..PoolConfigJson::new(16, 2064, (64 << 20) + 4096, 9)
            },
            ..case(
                "large pool",
                Some(
                    "domain 1's large pool with slots 1024 and large_slots 16: first_slot \
                     1 * (1024 + 16) + 1024; slots for a 64 MiB max_body (64 MiB + slot \
                     header + metadata reserve, rounded up to 4096); flags bit 1 (release)",
                ),
                0,
                0,
                0,
                0,
            )
        },
    ]
}

/// The case with its fields and bytes as a pool created with its configuration has them.
fn pool_made(c: PoolCase) -> PoolCase {
    let p = create_pool("bless", c.config).expect("a seed configuration");
    let b = Shm::of(p.fd()).read(0, POOL_HEAD);
    PoolCase {
        fields: PoolFields::decode(&b),
        bytes: hex(&b),
        ..c
    }
}

#[test]
fn pool_header_vectors() {
    const FILE: &str = "pool_header.json";
    let doc: PoolFile = load(FILE, |old: Option<PoolFile>| PoolFile {
        about: pool_about(),
        protocol_version: PROTOCOL_VERSION,
        bytes_len: POOL_HEAD,
        ignored: Vec::new(),
        cases: bless_cases(
            old.map(|d| d.cases),
            pool_seeds(),
            |c| c.name.clone(),
            pool_made,
        ),
    });
    let mut r = Report::new(FILE, &doc.about, &pool_about(), doc.protocol_version);
    r.eq("(file)", "bytes_len", POOL_HEAD, doc.bytes_len);
    r.seeds_present(&doc.cases, &pool_seeds(), |c| &c.name);
    let ignored = |i: usize| {
        doc.ignored
            .iter()
            .any(|g| (g.offset..g.offset + g.len).contains(&i))
    };
    let mask = |b: &[u8]| -> Vec<u8> {
        b.iter()
            .enumerate()
            .map(|(i, &x)| if ignored(i) { 0 } else { x })
            .collect()
    };
    for c in &doc.cases {
        let n = c.name.as_str();
        let Some(bytes) = r.bytes(n, "bytes", &c.bytes, POOL_HEAD) else {
            continue;
        };
        let f = &c.fields;
        r.safe(
            n,
            &[
                ("parties_offset", f.parties_offset),
                ("owners_offset", f.owners_offset),
                ("slots_offset", f.slots_offset),
                ("total_len", f.total_len),
            ],
        );
        // The file is consistent with the documented offsets.
        r.eq(
            n,
            "fields decoded from the file's bytes at the documented offsets",
            PoolFields::decode(&bytes),
            f.clone(),
        );
        r.eq(n, "magic", hex(&HEADER_MAGIC), f.magic.clone());
        // Encode: a pool created with the configuration holds the file's bytes.
        let created = match create_pool(n, c.config) {
            Ok(p) => p,
            Err(e) => {
                r.fail(n, e);
                continue;
            }
        };
        let shm = Shm::of(created.fd());
        r.eq(
            n,
            "header bytes of a new pool",
            hex(&mask(&shm.read(0, POOL_HEAD))),
            hex(&mask(&bytes)),
        );
        r.eq(n, "memfd size", shm.len(), f.total_len);
        // Decode: the file's bytes in a pool's memfd are accepted by attach (told the geometry of
        // the configuration, as the plan tells a party) and read as the file's fields.
        shm.write(0, &bytes);
        match Pool::attach(
            created.fd().try_clone_to_owned().expect("dup"),
            &created.geometry(),
        ) {
            Ok(p) => {
                // What attach reads, and what the configuration asked for, is the file's.
                let geometry =
                    "(slot_count, first_slot, slot_size, max_parties, hugepages, release)";
                let want = (
                    f.slot_count,
                    f.first_slot,
                    f.slot_size,
                    f.max_parties,
                    f.flags & 1 != 0,
                    f.flags & 2 != 0,
                );
                let attached = (
                    p.slot_count(),
                    p.first_slot(),
                    p.slot_size(),
                    u32::from(p.max_parties()),
                    p.hugepages(),
                    p.releases(),
                );
                r.eq(n, &format!("attached {geometry}"), attached, want);
                let cfg = c.config;
                let asked = (
                    cfg.slots,
                    cfg.first_slot,
                    cfg.slot_size,
                    u32::from(cfg.max_parties),
                    cfg.hugepages,
                    cfg.release,
                );
                r.eq(n, &format!("config {geometry}"), asked, want);
                r.eq(
                    n,
                    "attached total length",
                    p.mapped_len() as u64,
                    f.total_len,
                );
                // The offsets place the party records and the owner words.
                let party = p.party(0).expect("party 0");
                party.set_pid(0x5A5A_5A5A);
                r.eq(
                    n,
                    "pid of party 0 at parties_offset + 4",
                    shm.read(f.parties_offset + 4, 4),
                    vec![0x5A; 4],
                );
                let slot = Arc::new(p).alloc(Owner::party(6)).expect("a free slot");
                r.eq(
                    n,
                    "owner word of the first slot at owners_offset",
                    shm.u64_at(f.owners_offset),
                    7,
                );
                drop(slot);
            }
            Err(e) => r.fail(n, format!("attach refuses the file's bytes: {e}")),
        }
    }
    r.finish();
}

// ---------------------------------------------------------------------------------------
// party_states.json
// ---------------------------------------------------------------------------------------

const STATES: [(&str, PartyState); 8] = [
    ("empty", PartyState::Empty),
    ("starting", PartyState::Starting),
    ("ready", PartyState::Ready),
    ("dead", PartyState::Dead),
    ("parking", PartyState::Parking),
    ("parked", PartyState::Parked),
    ("stopped", PartyState::Stopped),
    ("draining", PartyState::Draining),
];

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct StateCase {
    name: String,
    value: u32,
    bytes: String,
}

#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct LayoutField {
    name: String,
    offset: u64,
    #[serde(rename = "type")]
    ty: String,
    count: usize,
}

impl LayoutField {
    fn size(&self) -> u64 {
        if self.ty == "u32" {
            4
        } else {
            8
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct BucketCase {
    us: u64,
    bucket: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Run {
    us: u64,
    ok: bool,
}

/// What a record case does to a fresh record: its state and pid set, restarts counted,
/// handlers entered and left, descriptors dropped.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RecordOps {
    state: String,
    pid: u32,
    restarts: u32,
    /// Handlers entered and not left.
    busy: u32,
    /// Handlers entered and left.
    runs: Vec<Run>,
    /// Descriptors dropped: wrong function, ownership, malformed.
    rejected: [u32; 3],
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RecordFields {
    state: u32,
    pid: u32,
    restarts: u32,
    busy: u32,
    handled: u64,
    failed: u64,
    latency_us_sum: u64,
    rejected: [u64; 3],
    buckets: Vec<u64>,
}

impl RecordFields {
    fn of(r: &PartyRecord) -> Self {
        let s = r.stats();
        RecordFields {
            state: r.state() as u32,
            pid: r.pid(),
            restarts: r.restarts(),
            busy: s.busy,
            handled: s.handled,
            failed: s.failed,
            latency_us_sum: s.latency_us_sum,
            rejected: s.rejected,
            buckets: s.buckets.to_vec(),
        }
    }
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RecordCase {
    name: String,
    ops: RecordOps,
    fields: RecordFields,
    bytes: String,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct PartyFile {
    about: String,
    protocol_version: u32,
    record_len: usize,
    record_offset: String,
    states: Vec<StateCase>,
    layout: Vec<LayoutField>,
    latency_buckets: Vec<BucketCase>,
    records: Vec<RecordCase>,
}

fn party_about() -> String {
    file_about(
        "Pool region",
        "PartyRecord: `states` is the value of each party state in the record's state word \
         (u32 at offset 0) and its 4 bytes; `layout` the record's fields (offset within the \
         record, type, count of consecutive elements); `latency_buckets` the histogram bucket \
         of a handler run of `us` microseconds; `records` whole records (record_len bytes) \
         after the operations `ops` on a fresh one, with the fields they read back as.",
    )
}

fn layout_seeds() -> Vec<LayoutField> {
    let f = |name: &str, offset, ty: &str, count| LayoutField {
        name: name.into(),
        offset,
        ty: ty.into(),
        count,
    };
    vec![
        f("state", 0, "u32", 1),
        f("pid", 4, "u32", 1),
        f("restarts", 8, "u32", 1),
        f("busy", 12, "u32", 1),
        f("handled", 16, "u64", 1),
        f("failed", 24, "u64", 1),
        f("latency_us_sum", 32, "u64", 1),
        f("rejected_function", 40, "u64", 1),
        f("rejected_ownership", 48, "u64", 1),
        f("rejected_malformed", 56, "u64", 1),
        f("latency_buckets", 64, "u64", LATENCY_BUCKETS),
    ]
}

fn bucket_seeds() -> Vec<BucketCase> {
    [
        0,
        1,
        2,
        3,
        4,
        1000,
        1023,
        1024,
        (1 << 22) - 1,
        1 << 22,
        1 << 40,
    ]
    .into_iter()
    .map(|us| BucketCase { us, bucket: 0 })
    .collect()
}

fn record_seeds() -> Vec<RecordCase> {
    let case = |name: &str, ops| RecordCase {
        name: name.into(),
        ops,
        fields: RecordFields::default(),
        bytes: String::new(),
    };
    vec![
        case(
            "fresh",
            RecordOps {
                state: "empty".into(),
                pid: 0,
                restarts: 0,
                busy: 0,
                runs: Vec::new(),
                rejected: [0; 3],
            },
        ),
        case(
            "after some work",
            RecordOps {
                state: "ready".into(),
                pid: 0x0001_E240,
                restarts: 2,
                busy: 1,
                runs: vec![
                    Run { us: 3, ok: true },
                    Run {
                        us: 1500,
                        ok: false,
                    },
                    Run { us: 0, ok: true },
                    Run {
                        us: 10_000_000,
                        ok: true,
                    },
                ],
                rejected: [1, 0, 3],
            },
        ),
    ]
}

fn fresh_pool() -> (Arc<Pool>, Shm) {
    let p = pool("party", 1, 0, 4096, 3);
    let shm = Shm::of(p.fd());
    (p, shm)
}

fn record_offset(shm: &Shm, party: u16) -> u64 {
    shm.u64_at(32) + u64::from(party) * PARTY_RECORD_LEN as u64
}

fn state_of(name: &str) -> Option<PartyState> {
    STATES.iter().find(|(n, _)| *n == name).map(|&(_, s)| s)
}

/// Applies `ops` to a fresh record (party 1 of a new pool); its bytes and fields.
fn record_after(ops: &RecordOps) -> Result<(Vec<u8>, RecordFields), String> {
    let (pool, shm) = fresh_pool();
    let r = pool.party(1).expect("party 1");
    r.set_state(state_of(&ops.state).ok_or_else(|| format!("no state {:?}", ops.state))?);
    r.set_pid(ops.pid);
    for _ in 0..ops.restarts {
        r.count_restart();
    }
    for run in &ops.runs {
        r.handler_started();
        r.handler_finished(run.us, run.ok);
    }
    for _ in 0..ops.busy {
        r.handler_started();
    }
    let why = [
        Rejected::WrongFunction,
        Rejected::Ownership,
        Rejected::Malformed,
    ];
    for (n, why) in ops.rejected.iter().zip(why) {
        for _ in 0..*n {
            r.count_rejected(why);
        }
    }
    Ok((
        shm.read(record_offset(&shm, 1), PARTY_RECORD_LEN),
        RecordFields::of(r),
    ))
}

/// The values of layout field `name` as the code reads them from a record.
fn read_field(r: &PartyRecord, name: &str) -> Option<Vec<u64>> {
    let s = r.stats();
    Some(match name {
        "state" => vec![r.state() as u64],
        "pid" => vec![r.pid().into()],
        "restarts" => vec![r.restarts().into()],
        "busy" => vec![s.busy.into()],
        "handled" => vec![s.handled],
        "failed" => vec![s.failed],
        "latency_us_sum" => vec![s.latency_us_sum],
        "rejected_function" => vec![s.rejected[0]],
        "rejected_ownership" => vec![s.rejected[1]],
        "rejected_malformed" => vec![s.rejected[2]],
        "latency_buckets" => s.buckets.to_vec(),
        _ => return None,
    })
}

#[test]
fn party_state_vectors() {
    const FILE: &str = "party_states.json";
    let doc: PartyFile = load(FILE, |old: Option<PartyFile>| {
        let (pool, shm) = fresh_pool();
        let rec = pool.party(2).expect("party 2");
        let state_word = record_offset(&shm, 2);
        let (buckets, records) = old.map(|d| (d.latency_buckets, d.records)).unzip();
        PartyFile {
            about: party_about(),
            protocol_version: PROTOCOL_VERSION,
            record_len: PARTY_RECORD_LEN,
            record_offset: format!("parties_offset + {PARTY_RECORD_LEN} * party"),
            states: STATES
                .iter()
                .map(|&(name, s)| {
                    rec.set_state(s);
                    StateCase {
                        name: name.into(),
                        value: shm.u32_at(state_word),
                        bytes: hex(&shm.read(state_word, 4)),
                    }
                })
                .collect(),
            layout: layout_seeds(),
            latency_buckets: bless_cases(
                buckets,
                bucket_seeds(),
                |c| c.us,
                |c| BucketCase {
                    bucket: latency_bucket(c.us),
                    ..c
                },
            ),
            records: bless_cases(
                records,
                record_seeds(),
                |c| c.name.clone(),
                |c| {
                    let (b, fields) = record_after(&c.ops).expect("valid ops");
                    RecordCase {
                        fields,
                        bytes: hex(&b),
                        ..c
                    }
                },
            ),
        }
    });
    let mut r = Report::new(FILE, &doc.about, &party_about(), doc.protocol_version);
    r.eq("(file)", "record_len", PARTY_RECORD_LEN, doc.record_len);
    r.eq(
        "(file)",
        "record_offset",
        format!("parties_offset + {PARTY_RECORD_LEN} * party"),
        doc.record_offset.clone(),
    );
    let (pool, shm) = fresh_pool();

    // States, both ways, in party 2's state word.
    r.eq(
        "(file)",
        "state names in order",
        STATES.iter().map(|s| s.0.to_string()).collect::<Vec<_>>(),
        doc.states.iter().map(|s| s.name.clone()).collect(),
    );
    let rec = pool.party(2).expect("party 2");
    let state_word = record_offset(&shm, 2);
    for c in &doc.states {
        let Some(s) = state_of(&c.name) else {
            r.fail(&c.name, "no such party state");
            continue;
        };
        let Some(bytes) = r.bytes(&c.name, "bytes", &c.bytes, 4) else {
            continue;
        };
        r.eq(
            &c.name,
            "bytes of the value",
            c.value.to_le_bytes().to_vec(),
            bytes.clone(),
        );
        rec.set_state(s);
        r.eq_hex(
            &c.name,
            "state word written",
            &shm.read(state_word, 4),
            &c.bytes,
        );
        shm.write(state_word, &bytes);
        r.eq(&c.name, "state read from the word", rec.state(), s);
        r.eq(
            &c.name,
            "compare-and-set from the word's state",
            rec.compare_set_state(s, PartyState::Empty),
            Ok(()),
        );
    }

    // Layout: fields tile the record, and a value stored at each field's offset is what the
    // code reads as that field.
    r.seeds_present(&doc.layout, &layout_seeds(), |f| &f.name);
    let mut end = 0;
    for f in &doc.layout {
        if f.offset != end {
            r.fail(
                &f.name,
                format!(
                    "starts at {} but the previous field ends at {end}",
                    f.offset
                ),
            );
        }
        if f.ty != "u32" && f.ty != "u64" {
            r.fail(&f.name, format!("type {:?} is neither u32 nor u64", f.ty));
        }
        end = f.offset + f.size() * f.count as u64;
        let (pool, shm) = fresh_pool();
        let base = record_offset(&shm, 1);
        let mut want = Vec::new();
        for k in 0..f.count as u64 {
            // A valid state for the state word (others read as empty), distinct bytes else.
            let v = if f.name == "state" {
                5
            } else {
                0x0102_0304 + 0x1111 * k
            };
            let b = v.to_le_bytes();
            shm.write(base + f.offset + k * f.size(), &b[..f.size() as usize]);
            want.push(v);
        }
        match read_field(pool.party(1).expect("party 1"), &f.name) {
            Some(got) => r.eq(&f.name, "value read at the field's offset", got, want),
            None => r.fail(&f.name, "the test knows no such record field"),
        }
    }
    r.eq(
        "(layout)",
        "end of the last field",
        PARTY_RECORD_LEN as u64,
        end,
    );

    for c in &doc.latency_buckets {
        let name = format!("latency bucket of {} us", c.us);
        r.safe(&name, &[("us", c.us)]);
        r.eq(&name, "bucket", latency_bucket(c.us), c.bucket);
    }

    // Whole records: encode by the operations, decode by writing the bytes.
    r.seeds_present(&doc.records, &record_seeds(), |c| &c.name);
    for c in &doc.records {
        let n = c.name.as_str();
        let Some(bytes) = r.bytes(n, "bytes", &c.bytes, PARTY_RECORD_LEN) else {
            continue;
        };
        r.safe(
            n,
            &[
                ("handled", c.fields.handled),
                ("failed", c.fields.failed),
                ("latency_us_sum", c.fields.latency_us_sum),
            ],
        );
        match record_after(&c.ops) {
            Ok((b, fields)) => {
                r.eq_hex(n, "record bytes after the ops", &b, &c.bytes);
                r.eq(n, "fields after the ops", fields, c.fields.clone());
            }
            Err(e) => r.fail(n, e),
        }
        let (pool, shm) = fresh_pool();
        shm.write(record_offset(&shm, 1), &bytes);
        r.eq(
            n,
            "fields read from the bytes",
            RecordFields::of(pool.party(1).expect("party 1")),
            c.fields.clone(),
        );
    }
    drop(pool);
    r.finish();
}
