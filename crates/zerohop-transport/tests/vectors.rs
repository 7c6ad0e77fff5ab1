//! The ring transport's test vectors (`protocol/vectors/ring.json`, see "Test vectors" in
//! `docs/protocol.md`) checked against this crate, both ways, in the ring's shared memory
//! itself (through its memfds):
//!
//! * encode: regions created for the file's policy carry the file's header bytes, and a send
//!   of each step's descriptor writes the file's entry bytes and tail, its receipt the file's
//!   head;
//! * decode: the file's header bytes are accepted by every party's attach, and the file's
//!   entry bytes and tail written into an outbox are received as the step's descriptor.
//!
//! With `ZEROHOP_BLESS=1` the test first rewrites the file from the code (keeping the file's
//! policy, capacity and step inputs, or the seeds below when it has none).

#[path = "../../zerohop-pool/tests/vectors_support/mod.rs"]
mod vectors_support;

use std::os::fd::AsFd;

use serde::{Deserialize, Serialize};
use vectors_support::{about, hex, load, unhex, DescFields, Report, Shm};
use zerohop_pool::{Descriptor, PROTOCOL_VERSION};
use zerohop_transport::ring::RingTransport;
use zerohop_transport::{Options, PartyId, Policy, Raw, Receiver, Sender, Transport, GATEWAY_FN};

const FILE: &str = "ring.json";
// The test's own copy of the ring layout (transport.rs keeps it private): an independent check.
/// Ring region version (`docs/protocol.md`, "Ring transport": header version).
const RING_VERSION: u32 = 2;
const HEADER: u64 = 64;
const LINE: u64 = 64;
const ENTRY: u64 = 16;

// ---------------------------------------------------------------------------------------
// The file
// ---------------------------------------------------------------------------------------

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyJson {
    /// Function index of each party (255 for the gateway's parties).
    party_function: Vec<u8>,
    /// Allowed (from function, to function) edges.
    edges: Vec<(u8, u8)>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RegionFields {
    magic: String,
    version: u32,
    party: u32,
    count: u32,
    capacity: u32,
}

impl RegionFields {
    /// Decodes at the offsets of docs/protocol.md ("Ring transport", Header).
    fn decode(b: &[u8]) -> Self {
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4"));
        RegionFields {
            magic: hex(&b[0..8]),
            version: u32_at(8),
            party: u32_at(12),
            count: u32_at(16),
            capacity: u32_at(20),
        }
    }
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RegionCase {
    name: String,
    kind: String,
    party: PartyId,
    len: u64,
    fields: RegionFields,
    header: String,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Step {
    name: String,
    from: PartyId,
    to: PartyId,
    fields: DescFields,
    /// Index of the queue in `from`'s outbox (the position of `to` in targets(from)).
    queue: u32,
    /// Offset of that queue's tail in `from`'s outbox, and its value after the send.
    tail_offset: u64,
    tail_after: u32,
    /// Offset of the entry written in `from`'s outbox, and its 16 bytes.
    entry_offset: u64,
    entry: String,
    /// Offset of the queue's head in `to`'s inbox, and its value after the receipt.
    head_offset: u64,
    head_after: u32,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RingFile {
    about: String,
    protocol_version: u32,
    ring_version: u32,
    policy: PolicyJson,
    capacity: u32,
    regions: Vec<RegionCase>,
    steps: Vec<Step>,
}

fn ring_about() -> String {
    about(
        &format!("\"Ring transport: outboxes and inboxes\" (ring region version {RING_VERSION})"),
        "For the chain `policy` (each party's function, 255 the gateway; the allowed function \
         edges) with queues of `capacity` entries: `regions` gives each party's outbox and \
         inbox (length and 64-byte header); `steps` are sends made in order, each received and \
         consumed before the next: the queue used, the tail and the 16-byte entry the sender \
         writes in its outbox, the head the receiver writes in its inbox (offsets from the \
         region's start, tail and head values after the step). An entry's bytes are the \
         descriptor's (protocol/vectors/descriptor.json). Bytes are hex, byte 0 first.",
    )
}

fn seed_policy() -> PolicyJson {
    // The gateway (party 0) and two instances of function 0 (parties 1 and 2).
    PolicyJson {
        party_function: vec![GATEWAY_FN, 0, 0],
        edges: vec![(GATEWAY_FN, 0), (0, GATEWAY_FN)],
    }
}

fn seed_steps() -> Vec<Step> {
    let step = |name: &str, from, to, slot, next, len, request, generation| Step {
        name: name.into(),
        from,
        to,
        fields: DescFields::new(slot, next, len, request, generation),
        queue: 0,
        tail_offset: 0,
        tail_after: 0,
        entry_offset: 0,
        entry: String::new(),
        head_offset: 0,
        head_after: 0,
    };
    vec![
        step("gateway to party 1", 0, 1, 1, 0, 100, 1, 0),
        step("gateway to party 2, its second queue", 0, 2, 2, 0, 5, 2, 0),
        step("party 1 answers the gateway", 1, 0, 1, GATEWAY_FN, 3, 1, 0),
        step(
            "party 2 answers, the gateway's second head",
            2,
            0,
            2,
            GATEWAY_FN,
            0x1234,
            2,
            0,
        ),
        step("gateway to party 1, entry 1", 0, 1, 3, 0, 7, 3, 1),
        step("gateway to party 1, entry 2", 0, 1, 4, 0, 8, 4, 1),
        step(
            "gateway to party 1, entry 3",
            0,
            1,
            0x03_0201,
            0,
            0x0706_0504,
            0x0B0A_0908,
            0x0F0E_0D0C,
        ),
        step("gateway to party 1 wraps to entry 0", 0, 1, 5, 0, 9, 5, 2),
    ]
}

fn policy_of(p: &PolicyJson) -> Policy {
    Policy::new(p.party_function.clone(), p.edges.iter().copied()).expect("a valid policy")
}

fn options(capacity: u32) -> Options {
    Options {
        queue_capacity: capacity,
        spin_us: 0,
        send_timeout_ms: 100,
        poll: false,
    }
}

/// The agent's transport for the chain and its two regions of each party (outbox, inbox).
fn agent(policy: &Policy, capacity: u32) -> (RingTransport, Vec<(Shm, Shm)>) {
    let t = RingTransport::create("vectors", policy, options(capacity)).expect("create ring");
    let regions = (0..policy.parties())
        .map(|p| {
            let fds = t.fds_for(p).expect("fds");
            let [outbox, inbox] = [0, 1].map(|i| Shm::of(fds[i].as_fd()));
            (outbox, inbox)
        })
        .collect();
    (t, regions)
}

/// Each party's transport, attached from the fds the agent hands over, as a process would.
fn parties(
    t: &RingTransport,
    policy: &Policy,
    capacity: u32,
) -> Result<Vec<RingTransport>, String> {
    (0..policy.parties())
        .map(|p| {
            RingTransport::attach(policy, p, t.fds_for(p).expect("fds"), options(capacity))
                .map_err(|e| format!("party {p} cannot attach: {e}"))
        })
        .collect()
}

/// Where a step's words are, by the documented layout.
fn place(
    policy: &Policy,
    capacity: u32,
    from: PartyId,
    to: PartyId,
    tail_after: u32,
) -> Option<(u32, u64, u64, u64)> {
    let queue = policy.targets(from).iter().position(|&t| t == to)?;
    let head = policy.senders(to).iter().position(|&s| s == from)?;
    let tail_offset = HEADER + queue as u64 * (LINE + ENTRY * u64::from(capacity));
    let entry = u64::from(tail_after.wrapping_sub(1) % capacity);
    Some((
        queue as u32,
        tail_offset,
        tail_offset + LINE + ENTRY * entry,
        HEADER + LINE + LINE * head as u64,
    ))
}

/// Sends `step` and receives it; the step with what the shared memory holds after each.
fn run_step(
    regions: &[(Shm, Shm)],
    senders: &[Box<dyn Sender>],
    receivers: &mut [Box<dyn Receiver>],
    policy: &Policy,
    capacity: u32,
    step: &Step,
) -> Result<Step, String> {
    let d = Descriptor::from(step.fields);
    senders[step.from as usize]
        .try_send(step.to, d)
        .map_err(|e| format!("send: {e}"))?;
    let (out, _) = &regions[step.from as usize];
    let (_, inb) = &regions[step.to as usize];
    let (queue, tail_offset, _, head_offset) =
        place(policy, capacity, step.from, step.to, 1).ok_or("no such edge")?;
    let tail_after = out.u32_at(tail_offset);
    let (_, _, entry_offset, _) =
        place(policy, capacity, step.from, step.to, tail_after).ok_or("no such edge")?;
    let got = receivers[step.to as usize].try_peek();
    let want = Raw {
        from: step.from,
        desc: Descriptor::from_bytes(d.to_bytes()),
        refused: false,
    };
    if got != Some(want) {
        return Err(format!("received {got:?}, expected {want:?}"));
    }
    receivers[step.to as usize].consume();
    Ok(Step {
        name: step.name.clone(),
        queue,
        tail_offset,
        tail_after,
        entry_offset,
        entry: hex(&out.read(entry_offset, ENTRY as usize)),
        head_offset,
        head_after: inb.u32_at(head_offset),
        ..*step
    })
}

fn regions_of(regions: &[(Shm, Shm)]) -> Vec<RegionCase> {
    let mut out = Vec::new();
    for (p, (outbox, inbox)) in regions.iter().enumerate() {
        for (kind, shm) in [("outbox", outbox), ("inbox", inbox)] {
            let h = shm.read(0, HEADER as usize);
            out.push(RegionCase {
                name: format!("{kind} of party {p}"),
                kind: kind.into(),
                party: p as PartyId,
                len: shm.len(),
                fields: RegionFields::decode(&h),
                header: hex(&h),
            });
        }
    }
    out
}

/// Every party's sender and receiver, by party.
type Handles = (Vec<Box<dyn Sender>>, Vec<Box<dyn Receiver>>);

fn handles(ts: &[RingTransport]) -> Handles {
    let senders = (0..ts.len() as PartyId)
        .map(|p| ts[p as usize].sender(p).expect("sender"))
        .collect();
    let receivers = (0..ts.len() as PartyId)
        .map(|p| ts[p as usize].receiver(p).expect("receiver"))
        .collect();
    (senders, receivers)
}

fn bless(old: Option<RingFile>) -> RingFile {
    let (policy_json, capacity, steps) = match old {
        Some(f) => (f.policy, f.capacity, f.steps),
        None => (seed_policy(), 4, seed_steps()),
    };
    let policy = policy_of(&policy_json);
    let (t, regions) = agent(&policy, capacity);
    let ts = parties(&t, &policy, capacity).expect("attach");
    let (senders, mut receivers) = handles(&ts);
    let steps = steps
        .iter()
        .map(|s| run_step(&regions, &senders, &mut receivers, &policy, capacity, s).expect("step"))
        .collect();
    RingFile {
        about: ring_about(),
        protocol_version: PROTOCOL_VERSION,
        ring_version: RING_VERSION,
        policy: policy_json,
        capacity,
        regions: regions_of(&regions),
        steps,
    }
}

#[test]
fn ring_vectors() {
    let doc: RingFile = load(FILE, bless);
    let mut r = Report::new(FILE, &doc.about, &ring_about(), doc.protocol_version);
    r.eq("(file)", "ring_version", RING_VERSION, doc.ring_version);
    let policy = policy_of(&doc.policy);
    let cap = doc.capacity;
    if !cap.is_power_of_two() || !(2..=1 << 16).contains(&cap) {
        r.fail(
            "(file)",
            format!("capacity {cap} is not a power of two in 2..=65536"),
        );
        r.finish();
        return;
    }
    let seeds = seed_steps();
    let seeds: &[Step] = if doc.policy == seed_policy() {
        &seeds
    } else {
        &[]
    };
    r.seeds_present(&doc.steps, seeds, |s| &s.name);

    // The file follows the documented layout.
    for c in &doc.regions {
        let n = c.name.as_str();
        let (magic, count, len) = match c.kind.as_str() {
            "outbox" => {
                let count = policy.targets(c.party).len() as u64;
                (
                    *b"ZHOUTBOX",
                    count,
                    HEADER + count * (LINE + ENTRY * u64::from(cap)),
                )
            }
            "inbox" => {
                let count = policy.senders(c.party).len() as u64;
                (*b"ZHINBOX\0", count, HEADER + LINE + LINE * count)
            }
            k => {
                r.fail(n, format!("kind {k:?} is neither outbox nor inbox"));
                continue;
            }
        };
        r.eq(n, "documented length", len, c.len);
        let want = RegionFields {
            magic: hex(&magic),
            version: RING_VERSION,
            party: c.party.into(),
            count: count as u32,
            capacity: if c.kind == "outbox" { cap } else { 0 },
        };
        r.eq(n, "documented header fields", want, c.fields.clone());
        if let Some(b) = r.bytes(n, "header", &c.header, HEADER as usize) {
            r.eq(
                n,
                "header decoded at the documented offsets",
                RegionFields::decode(&b),
                c.fields.clone(),
            );
            r.eq(
                n,
                "zero bytes 24..64 of the header",
                vec![0u8; 40],
                b[24..].to_vec(),
            );
        }
    }
    r.eq(
        "(file)",
        "regions, outbox and inbox of each party in order",
        (0..policy.parties())
            .flat_map(|p| {
                [
                    format!("outbox of party {p}"),
                    format!("inbox of party {p}"),
                ]
            })
            .collect::<Vec<_>>(),
        doc.regions.iter().map(|c| c.name.clone()).collect(),
    );
    for s in &doc.steps {
        let n = s.name.as_str();
        match place(&policy, cap, s.from, s.to, s.tail_after) {
            Some(p) => r.eq(
                n,
                "documented queue, tail, entry and head offsets",
                p,
                (s.queue, s.tail_offset, s.entry_offset, s.head_offset),
            ),
            None => r.fail(n, "the policy allows no such edge"),
        }
        r.eq_hex(
            n,
            "entry = the descriptor's bytes",
            &Descriptor::from(s.fields).to_bytes(),
            &s.entry,
        );
    }

    // Encode: new regions hold the file's headers; sends and receipts write its words.
    let (t, regions) = agent(&policy, cap);
    let made = regions_of(&regions);
    for (c, m) in doc.regions.iter().zip(&made) {
        r.eq(&c.name, "region length", m.len, c.len);
        r.eq(
            &c.name,
            "header bytes",
            m.header.clone(),
            c.header.to_lowercase(),
        );
    }
    match parties(&t, &policy, cap) {
        Ok(ts) => {
            let (senders, mut receivers) = handles(&ts);
            for s in &doc.steps {
                let n = s.name.as_str();
                match run_step(&regions, &senders, &mut receivers, &policy, cap, s) {
                    Ok(m) => {
                        r.eq(n, "tail after the send", m.tail_after, s.tail_after);
                        r.eq(n, "entry written", m.entry, s.entry.to_lowercase());
                        r.eq(n, "head after the receipt", m.head_after, s.head_after);
                    }
                    Err(e) => r.fail(n, e),
                }
            }
        }
        Err(e) => r.fail("(encode)", e),
    }

    // Decode: the file's headers are accepted by every party; the file's entries and tails
    // are received as the steps' descriptors, and the receipts move the heads as the file
    // says.
    let (t, regions) = agent(&policy, cap);
    for c in &doc.regions {
        let Ok(b) = unhex(&c.header, HEADER as usize) else {
            continue;
        };
        if let Some((outbox, inbox)) = regions.get(c.party as usize) {
            let shm = if c.kind == "outbox" { outbox } else { inbox };
            shm.write(0, &b);
        }
    }
    match parties(&t, &policy, cap) {
        Ok(ts) => {
            let (_, mut receivers) = handles(&ts);
            for s in &doc.steps {
                let n = s.name.as_str();
                let Some(entry) = r.bytes(n, "entry", &s.entry, ENTRY as usize) else {
                    continue;
                };
                let (out, _) = &regions[s.from as usize];
                let (_, inb) = &regions[s.to as usize];
                out.write(s.entry_offset, &entry);
                out.write(s.tail_offset, &s.tail_after.to_le_bytes());
                let rx = &mut receivers[s.to as usize];
                match rx.try_peek() {
                    Some(raw) => {
                        r.eq(n, "received from", raw.from, s.from);
                        r.eq(
                            n,
                            "received descriptor",
                            DescFields::from(raw.desc),
                            s.fields,
                        );
                        rx.consume();
                        r.eq(
                            n,
                            "head after the receipt",
                            inb.u32_at(s.head_offset),
                            s.head_after,
                        );
                    }
                    None => r.fail(n, "the receiver found nothing in the queue"),
                }
            }
        }
        Err(e) => r.fail(
            "(decode)",
            format!("the file's region headers are refused: {e}"),
        ),
    }
    r.finish();
}
