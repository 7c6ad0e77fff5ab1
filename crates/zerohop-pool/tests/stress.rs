//! Multi-process stress of the slot allocator and the ownership hand-over, and reclaim after
//! a party is SIGKILLed.
//!
//! Children are this test binary re-run in a role (`zerohop_test_support::spawn_self`); they
//! inherit the pool fd and pass 16-byte descriptors to each other over unix datagram
//! socketpairs, taking slots over with `Pool::take` as a transport's receiver would. Every
//! slot carries a stamp naming its owner, so a slot owned by two parties at once is caught
//! by whichever of them looks next.

use std::collections::VecDeque;

use std::os::fd::OwnedFd;
use std::os::unix::net::UnixDatagram;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use zerohop_pool::{Descriptor, OwnedSlot, Owner, Pool, PoolGeometry, SlotHeader};
use zerohop_test_support::{inherited_fds, role, spawn_self, ChildGuard, ChildLines, Signal};

/// Longest any phase may take before the test calls it hung.
const PHASE: Duration = Duration::from_secs(60);

const CHILD_ENV: &str = "ZH_STRESS_CHILD";

/// Slots of the kill test's pool.
const KILL_SLOTS: u32 = 128;

/// The shape of a test pool of `slots` slots: what the parent creates and tells its children
/// (as the agent tells instances through the plan).
fn geometry(slots: u32) -> PoolGeometry {
    PoolGeometry {
        slots,
        first_slot: 0,
        slot_size: 512,
        max_parties: 8,
        hugepages: false,
        release: false,
    }
}

fn new_pool(slots: u32) -> Arc<Pool> {
    Arc::new(Pool::create("stress", &geometry(slots)).expect("create pool"))
}

fn dup(fd: std::os::fd::BorrowedFd<'_>) -> OwnedFd {
    fd.try_clone_to_owned().expect("dup fd")
}

// ---------------------------------------------------------------------------------------
// The stamp every slot carries while owned
// ---------------------------------------------------------------------------------------

/// Bytes of each slot the stress test writes and checks.
const PAYLOAD: usize = 256;
const STAMP: usize = 24;

/// Who wrote the slot, for which sequence number, and how many hops it still travels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stamp {
    owner: u32,
    origin: u32,
    seq: u64,
    hops_left: u32,
    generation: u32,
}

fn pattern(owner: u32, seq: u64, i: usize) -> u8 {
    ((seq.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as u8 ^ owner as u8).wrapping_add(i as u8)
}

fn write_stamp(slot: &mut OwnedSlot, st: Stamp) {
    let data = &mut slot.data_mut()[..PAYLOAD];
    data[0..4].copy_from_slice(&st.owner.to_le_bytes());
    data[4..8].copy_from_slice(&st.origin.to_le_bytes());
    data[8..16].copy_from_slice(&st.seq.to_le_bytes());
    data[16..20].copy_from_slice(&st.hops_left.to_le_bytes());
    data[20..24].copy_from_slice(&st.generation.to_le_bytes());
    for (i, b) in data.iter_mut().enumerate().skip(STAMP) {
        *b = pattern(st.owner, st.seq, i);
    }
}

/// Reads the stamp of `slot` and checks its pattern and generation.
fn read_stamp(slot: &OwnedSlot) -> Result<Stamp, String> {
    let data = &slot.data()[..PAYLOAD];
    let word = |r: std::ops::Range<usize>| -> u64 {
        let mut b = [0u8; 8];
        b[..r.len()].copy_from_slice(&data[r]);
        u64::from_le_bytes(b)
    };
    let st = Stamp {
        owner: word(0..4) as u32,
        origin: word(4..8) as u32,
        seq: word(8..16),
        hops_left: word(16..20) as u32,
        generation: word(20..24) as u32,
    };
    if st.generation != slot.generation() {
        return Err(format!(
            "slot {}: stamp {st:?} names generation {}, the slot has {}",
            slot.index(),
            st.generation,
            slot.generation()
        ));
    }
    if let Some(i) = (STAMP..PAYLOAD).find(|&i| data[i] != pattern(st.owner, st.seq, i)) {
        return Err(format!(
            "slot {}: stamp {st:?}, pattern broken at byte {i}",
            slot.index()
        ));
    }
    Ok(st)
}

// ---------------------------------------------------------------------------------------
// 1 000 000 alloc + free across four processes
// ---------------------------------------------------------------------------------------

const CHILDREN: u32 = 4;
const SLOTS: u32 = 256;
const TOTAL_ALLOCS: u64 = 1_000_000;
const PER_CHILD: u64 = TOTAL_ALLOCS / CHILDREN as u64;
/// One allocation in this many travels to the next child; the rest are kept a while and
/// freed locally (allocator churn under contention).
const SEND_EVERY: u64 = 2;
/// Slots a producer keeps before freeing the oldest.
const KEEP: usize = 8;

/// Hops a travelling slot makes (1..=3) before its last receiver frees it.
fn hops(seq: u64) -> u32 {
    1 + ((seq / SEND_EVERY) % 3) as u32
}

/// Descriptors each child receives: every child originates the same sequence numbers, so
/// each receives one message per hop of every travelling slot of one upstream child.
fn messages_per_child() -> u64 {
    (0..PER_CHILD)
        .step_by(SEND_EVERY as usize)
        .map(|s| u64::from(hops(s)))
        .sum()
}

/// Party of child `k` (party 0 is this process).
fn party_of(k: u32) -> u16 {
    (k + 1) as u16
}

/// Four children pass slots around a ring: each allocates 250 000 slots and stamps them;
/// every second one it hands (by descriptor, taken over with `Pool::take`) to the next
/// child, which checks the stamp and frees it or forwards it (1 to 3 hops); the others it
/// keeps a while and frees itself. 1 000 000 allocations and as many frees in total. Afterwards: no slot in
/// use, every child saw each alloc/take return a slot it did not hold, every stamp was
/// intact, the counts add up, and every child exited 0.
#[test]
fn ring_of_processes_passes_slots() {
    if role().as_deref() == Some("ring-child") {
        return ring_child();
    }
    let started = Instant::now();
    let pool = new_pool(SLOTS);
    // links[k]: child k sends on .0, child k+1 receives on .1.
    let links: Vec<(UnixDatagram, UnixDatagram)> = (0..CHILDREN)
        .map(|_| UnixDatagram::pair().expect("socketpair"))
        .collect();
    let mut children: Vec<(ChildGuard, ChildLines)> = (0..CHILDREN)
        .map(|k| {
            let upstream = &links[((k + CHILDREN - 1) % CHILDREN) as usize].1;
            let downstream = &links[k as usize].0;
            let fds = vec![
                dup(pool.fd()),
                OwnedFd::from(upstream.try_clone().expect("dup")),
                OwnedFd::from(downstream.try_clone().expect("dup")),
            ];
            let mut child = spawn_self(
                "ring_of_processes_passes_slots",
                "ring-child",
                &[(CHILD_ENV, k.to_string())],
                fds,
            );
            let lines = ChildLines::new(&mut child);
            (child, lines)
        })
        .collect();
    drop(links);
    let reports = collect_reports(&mut children, "STATS ");
    let (mut allocs, mut frees, mut taken, mut forwarded) = (0u64, 0u64, 0u64, 0u64);
    for (k, ((child, _), stats)) in children.iter_mut().zip(reports).enumerate() {
        let who = format!("child {k}");
        let field = |name: &str| -> u64 {
            stats
                .split_whitespace()
                .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('=')?.parse().ok())
                .unwrap_or_else(|| panic!("{who}: no {name} in {stats:?}"))
        };
        allocs += field("allocs");
        frees += field("frees");
        taken += field("taken");
        forwarded += field("forwarded");
        assert_eq!(field("allocs"), PER_CHILD, "{who} allocations");
        assert_eq!(
            field("taken"),
            messages_per_child(),
            "{who} hand-overs received"
        );
        assert_eq!(child.wait_timeout(PHASE), Some(0), "{who} exit code");
    }
    assert_eq!(allocs, TOTAL_ALLOCS, "allocations across all children");
    assert_eq!(frees, TOTAL_ALLOCS, "every allocation freed exactly once");
    assert_eq!(
        taken - forwarded,
        TOTAL_ALLOCS / SEND_EVERY,
        "travelling slots that ended"
    );
    assert_eq!(pool.owners().in_use(), 0, "slots lost");
    for k in 0..CHILDREN {
        assert!(pool.owners().owned_by(Owner::party(party_of(k))).is_empty());
    }
    eprintln!(
        "stress: {allocs} allocs, {taken} hand-overs ({forwarded} forwarded) in {:?}",
        started.elapsed()
    );
}

/// Waits (bounded) for every child's line containing `marker` and returns what follows it;
/// fails as soon as any child exits unsuccessfully, instead of waiting out the others (which
/// then starve for descriptors).
fn collect_reports(children: &mut [(ChildGuard, ChildLines)], marker: &str) -> Vec<String> {
    let deadline = Instant::now() + PHASE;
    let mut reports: Vec<Option<String>> = vec![None; children.len()];
    while reports.iter().any(Option::is_none) {
        for (k, (child, lines)) in children.iter_mut().enumerate() {
            if reports[k].is_some() {
                continue;
            }
            if let Some(line) = lines.next_line(Duration::ZERO) {
                if let Some(at) = line.find(marker) {
                    reports[k] = Some(line[at + marker.len()..].trim().to_owned());
                }
                continue;
            }
            if let Some(status) = child.child_mut().try_wait().expect("try_wait") {
                // Its last lines may still be in the pipe; give the reader a moment.
                match lines.next_line(Duration::from_millis(500)) {
                    Some(line) if line.contains(marker) => {
                        let at = line.find(marker).expect("contains");
                        reports[k] = Some(line[at + marker.len()..].trim().to_owned());
                    }
                    Some(_) => {}
                    None => panic!("child {k} exited ({status}) without a {marker:?} line"),
                }
            }
        }
        assert!(
            Instant::now() < deadline,
            "children {:?} did not report within {PHASE:?}",
            (0..children.len())
                .filter(|&k| reports[k].is_none())
                .collect::<Vec<_>>()
        );
        thread::sleep(Duration::from_millis(5));
    }
    reports
        .into_iter()
        .map(|r| r.expect("all reported"))
        .collect()
}

/// In a child with several threads: a panic anywhere ends the process at once with a
/// failure code, so its peers and the parent notice now, not at their timeouts.
fn exit_on_panic() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        default(info);
        std::process::exit(101);
    }));
}

/// Per-process record of which slots this party holds, shared by its two threads: an
/// alloc or take that returns a slot already held here means the slot was given out twice.
struct Held(Vec<AtomicBool>);

impl Held {
    fn acquire(&self, slot: u32, how: &str) {
        let was = self.0[slot as usize].swap(true, Ordering::SeqCst);
        assert!(
            !was,
            "{how} returned slot {slot}, which this party already holds"
        );
    }
    fn release(&self, slot: u32) {
        let was = self.0[slot as usize].swap(false, Ordering::SeqCst);
        assert!(was, "releasing slot {slot}, which this party does not hold");
    }
}

struct Child {
    k: u32,
    me: Owner,
    upstream: Owner,
    pool: Arc<Pool>,
    held: Held,
    rx: UnixDatagram,
    tx: UnixDatagram,
    deadline: Instant,
}

impl Child {
    /// Checks our own stamp is intact, then frees the slot (which must still be ours).
    fn free(&self, slot: OwnedSlot) {
        let st = read_stamp(&slot).unwrap_or_else(|e| panic!("child {}: {e}", self.k));
        assert_eq!(
            st.owner,
            self.me.raw(),
            "child {}: slot {} restamped by another party",
            self.k,
            slot.index()
        );
        let index = slot.index();
        self.held.release(index);
        slot.into_sent();
        self.pool
            .owners()
            .free(index, self.me)
            .unwrap_or_else(|e| panic!("child {}: free slot {index}: {e}", self.k));
    }

    /// Checks our own stamp, then sends the slot's descriptor downstream.
    fn hand_on(&self, slot: OwnedSlot, seq: u64) {
        let st = read_stamp(&slot).unwrap_or_else(|e| panic!("child {}: {e}", self.k));
        assert_eq!(
            st.owner,
            self.me.raw(),
            "child {}: slot {} restamped by another party",
            self.k,
            slot.index()
        );
        let desc = slot.descriptor(seq as u32, PAYLOAD as u32, 0);
        self.held.release(slot.index());
        slot.into_sent();
        let n = self
            .tx
            .send(&desc.to_bytes())
            .unwrap_or_else(|e| panic!("child {}: send: {e}", self.k));
        assert_eq!(n, Descriptor::LEN);
    }

    fn produce(&self) -> (u64, u64) {
        let (mut allocs, mut frees) = (0, 0);
        let mut kept = VecDeque::with_capacity(KEEP + 1);
        for seq in 0..PER_CHILD {
            let mut slot = loop {
                if let Some(s) = self.pool.alloc(self.me) {
                    break s;
                }
                assert!(
                    Instant::now() < self.deadline,
                    "child {}: pool stayed exhausted",
                    self.k
                );
                thread::yield_now();
            };
            allocs += 1;
            self.held.acquire(slot.index(), "alloc");
            let travels = seq % SEND_EVERY == 0;
            let generation = slot.generation();
            write_stamp(
                &mut slot,
                Stamp {
                    owner: self.me.raw(),
                    origin: self.me.raw(),
                    seq,
                    hops_left: if travels { hops(seq) } else { 0 },
                    generation,
                },
            );
            if travels {
                self.hand_on(slot, seq);
            } else {
                kept.push_back(slot);
                if kept.len() > KEEP {
                    self.free(kept.pop_front().expect("non-empty"));
                    frees += 1;
                }
            }
        }
        for slot in kept {
            self.free(slot);
            frees += 1;
        }
        (allocs, frees)
    }

    fn consume(&self) -> (u64, u64, u64) {
        let (mut taken, mut forwarded, mut frees) = (0, 0, 0);
        for _ in 0..messages_per_child() {
            let mut b = [0u8; Descriptor::LEN];
            let n = self.rx.recv(&mut b).unwrap_or_else(|e| {
                panic!(
                    "child {}: nothing from upstream after {taken} hand-overs: {e}",
                    self.k
                )
            });
            assert_eq!(n, Descriptor::LEN, "child {}: message size", self.k);
            let desc = Descriptor::from_bytes(b);
            let (from, mut slot, _) = self
                .pool
                .take(&desc, self.me, |o| o == self.upstream)
                .unwrap_or_else(|e| panic!("child {}: take {desc:?}: {e}", self.k));
            assert_eq!(from, self.upstream);
            taken += 1;
            self.held.acquire(slot.index(), "take");
            let st = read_stamp(&slot).unwrap_or_else(|e| panic!("child {}: {e}", self.k));
            assert_eq!(
                (st.owner, st.seq),
                (self.upstream.raw(), u64::from(desc.request)),
                "child {}: stamp of slot {} taken from upstream",
                self.k,
                desc.slot
            );
            assert!(st.hops_left >= 1, "child {}: {st:?}", self.k);
            if st.hops_left > 1 {
                let generation = slot.generation();
                write_stamp(
                    &mut slot,
                    Stamp {
                        owner: self.me.raw(),
                        hops_left: st.hops_left - 1,
                        generation,
                        ..st
                    },
                );
                self.hand_on(slot, st.seq);
                forwarded += 1;
            } else {
                write_stamp(
                    &mut slot,
                    Stamp {
                        owner: self.me.raw(),
                        ..st
                    },
                );
                self.free(slot);
                frees += 1;
            }
        }
        (taken, forwarded, frees)
    }
}

fn ring_child() {
    exit_on_panic();
    let k: u32 = std::env::var(CHILD_ENV)
        .ok()
        .and_then(|v| v.parse().ok())
        .expect("child index");
    let mut fds = inherited_fds(3).into_iter();
    let pool = Arc::new(
        Pool::attach(fds.next().expect("pool fd"), &geometry(SLOTS)).expect("attach pool"),
    );
    let rx = UnixDatagram::from(fds.next().expect("upstream fd"));
    let tx = UnixDatagram::from(fds.next().expect("downstream fd"));
    rx.set_read_timeout(Some(PHASE)).expect("read timeout");
    tx.set_write_timeout(Some(PHASE)).expect("write timeout");
    let child = Child {
        k,
        me: Owner::party(party_of(k)),
        upstream: Owner::party(party_of((k + CHILDREN - 1) % CHILDREN)),
        held: Held(
            (0..pool.slot_count())
                .map(|_| AtomicBool::new(false))
                .collect(),
        ),
        pool,
        rx,
        tx,
        deadline: Instant::now() + PHASE,
    };
    let ((allocs, frees_p), (taken, forwarded, frees_c)) = thread::scope(|s| {
        let producer = s.spawn(|| child.produce());
        let consumer = s.spawn(|| child.consume());
        (
            producer.join().expect("producer thread"),
            consumer.join().expect("consumer thread"),
        )
    });
    assert!(
        child.held.0.iter().all(|h| !h.load(Ordering::SeqCst)),
        "child {k} still holds slots"
    );
    println!(
        "STATS allocs={allocs} frees={} taken={taken} forwarded={forwarded}",
        frees_p + frees_c
    );
}

// ---------------------------------------------------------------------------------------
// Reclaim after SIGKILL
// ---------------------------------------------------------------------------------------

const VICTIM: u16 = 1;
const SURVIVOR: u16 = 2;

fn parse_slots(s: &str) -> Vec<u32> {
    let mut v: Vec<u32> = s
        .split(',')
        .filter(|x| !x.is_empty())
        .map(|x| x.parse().expect("slot number"))
        .collect();
    v.sort_unstable();
    v
}

fn slot_list(v: &[u32]) -> String {
    v.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}

/// A victim child holds 23 slots (20 allocated, 3 taken over from this process) and a
/// survivor child holds 10 while churning alloc/free; the victim is SIGKILLed. Reclaim of the
/// victim's owner frees exactly its 23 slots and returns their headers; the survivor's slots
/// and this process's own are untouched, the survivor finishes cleanly, and nothing leaks.
#[test]
fn reclaim_after_sigkill_frees_exactly_the_dead_partys_slots() {
    match role().as_deref() {
        Some("victim") => return victim_child(),
        Some("survivor") => return survivor_child(),
        _ => {}
    }
    let pool = new_pool(KILL_SLOTS);
    let me = Owner::party(0);
    let (victim_ctl, victim_end) = UnixDatagram::pair().expect("socketpair");
    let (survivor_ctl, survivor_end) = UnixDatagram::pair().expect("socketpair");
    let name = "reclaim_after_sigkill_frees_exactly_the_dead_partys_slots";
    let mut victim = spawn_self(name, "victim", &[], vec![dup(pool.fd()), victim_end.into()]);
    let mut survivor = spawn_self(
        name,
        "survivor",
        &[],
        vec![dup(pool.fd()), survivor_end.into()],
    );
    let (victim_out, survivor_out) = (ChildLines::new(&mut victim), ChildLines::new(&mut survivor));

    // Ours: five slots; three are handed to the victim, which takes them over.
    let mut mine: Vec<OwnedSlot> = (0..5).map(|_| pool.alloc(me).expect("free slot")).collect();
    for slot in mine.drain(..3) {
        let desc = slot.descriptor(0, 0, 0);
        slot.into_sent();
        victim_ctl.send(&desc.to_bytes()).expect("send to victim");
    }
    let mine_slots: Vec<u32> = mine.iter().map(OwnedSlot::index).collect();

    let victim_slots = parse_slots(&victim_out.wait_for("victim", "HELD ", PHASE));
    let survivor_slots = parse_slots(&survivor_out.wait_for("survivor", "HELD ", PHASE));
    assert_eq!(
        victim_slots.len(),
        23,
        "victim holds 20 allocated + 3 taken"
    );
    assert_eq!(survivor_slots.len(), 10);
    assert_eq!(pool.owners().owned_by(Owner::party(VICTIM)), victim_slots);

    victim.signal(Signal::SIGKILL);
    assert_eq!(
        victim.wait_timeout(Duration::from_secs(5)),
        None,
        "victim killed by a signal"
    );

    let mut reclaimed = pool.reclaim(Owner::party(VICTIM));
    reclaimed.sort_by_key(|&(slot, _)| slot);
    let reclaimed_slots: Vec<u32> = reclaimed.iter().map(|&(slot, _)| slot).collect();
    assert_eq!(
        reclaimed_slots, victim_slots,
        "reclaim frees exactly the victim's slots"
    );
    for (slot, header) in &reclaimed {
        assert_eq!(
            header.request,
            1000 + slot,
            "header of reclaimed slot {slot}"
        );
    }
    assert!(
        pool.reclaim(Owner::party(VICTIM)).is_empty(),
        "a second reclaim finds nothing"
    );
    assert!(pool.owners().owned_by(Owner::party(VICTIM)).is_empty());
    for &slot in &survivor_slots {
        assert_eq!(
            pool.owners().get(slot).map(|w| w.owner),
            Some(Owner::party(SURVIVOR)),
            "survivor's slot {slot} after the reclaim"
        );
    }
    assert_eq!(
        pool.owners().owned_by(me),
        mine_slots,
        "our own slots after the reclaim"
    );

    survivor_ctl
        .send(b"quit")
        .expect("tell the survivor to finish");
    let churned = survivor_out.wait_for("survivor", "DONE churned=", PHASE);
    assert!(
        churned.parse::<u64>().expect("count") > 0,
        "the survivor churned during the kill"
    );
    assert_eq!(survivor.wait_timeout(PHASE), Some(0), "survivor exit code");
    drop(mine);
    assert_eq!(pool.owners().in_use(), 0, "slots leaked");
}

fn victim_child() {
    let mut fds = inherited_fds(2).into_iter();
    let pool = Arc::new(
        Pool::attach(fds.next().expect("pool fd"), &geometry(KILL_SLOTS)).expect("attach pool"),
    );
    let ctl = UnixDatagram::from(fds.next().expect("control fd"));
    ctl.set_read_timeout(Some(PHASE)).expect("read timeout");
    let me = Owner::party(VICTIM);
    let mut held = Vec::new();
    for _ in 0..3 {
        let mut b = [0u8; Descriptor::LEN];
        ctl.recv(&mut b).expect("descriptor from the parent");
        let desc = Descriptor::from_bytes(b);
        let (_, slot, _) = pool
            .take(&desc, me, |o| o == Owner::party(0))
            .expect("take the parent's slot");
        held.push(slot);
    }
    for _ in 0..20 {
        held.push(pool.alloc(me).expect("free slot"));
    }
    for slot in &mut held {
        let request = 1000 + slot.index();
        slot.set_header(&SlotHeader {
            request,
            ..SlotHeader::default()
        });
    }
    let slots: Vec<u32> = held.iter().map(OwnedSlot::index).collect();
    println!("HELD {}", slot_list(&slots));
    // Wait to be killed; never free anything.
    let mut b = [0u8; 16];
    let r = ctl.recv(&mut b);
    std::mem::forget(held);
    panic!("victim was not killed within {PHASE:?} ({r:?})");
}

fn survivor_child() {
    let mut fds = inherited_fds(2).into_iter();
    let pool = Arc::new(
        Pool::attach(fds.next().expect("pool fd"), &geometry(KILL_SLOTS)).expect("attach pool"),
    );
    let ctl = UnixDatagram::from(fds.next().expect("control fd"));
    ctl.set_read_timeout(Some(PHASE)).expect("read timeout");
    let me = Owner::party(SURVIVOR);
    let mut held: Vec<OwnedSlot> = (0..10)
        .map(|_| pool.alloc(me).expect("free slot"))
        .collect();
    for slot in &mut held {
        let request = 2000 + slot.index();
        slot.set_header(&SlotHeader {
            request,
            ..SlotHeader::default()
        });
    }
    let slots: Vec<u32> = held.iter().map(OwnedSlot::index).collect();
    println!("HELD {}", slot_list(&slots));
    let quit = Arc::new(AtomicBool::new(false));
    let waiter = {
        let quit = quit.clone();
        thread::spawn(move || {
            let mut b = [0u8; 16];
            let r = ctl.recv(&mut b);
            quit.store(true, Ordering::SeqCst);
            r.map(|_| ())
        })
    };
    // Churn alongside the kill and the reclaim: every slot we get is one we do not hold,
    // and nobody writes it while it is ours.
    let deadline = Instant::now() + PHASE;
    let mut churned = 0u64;
    while !quit.load(Ordering::SeqCst) {
        assert!(Instant::now() < deadline, "survivor was never told to quit");
        let Some(mut s) = pool.alloc(me) else {
            thread::yield_now();
            continue;
        };
        assert!(
            !slots.contains(&s.index()),
            "alloc returned held slot {}",
            s.index()
        );
        let generation = s.generation();
        let st = Stamp {
            owner: me.raw(),
            origin: me.raw(),
            seq: churned,
            hops_left: 0,
            generation,
        };
        write_stamp(&mut s, st);
        thread::yield_now();
        assert_eq!(read_stamp(&s), Ok(st), "churn slot {}", s.index());
        drop(s);
        churned += 1;
    }
    waiter.join().expect("waiter").expect("quit message");
    for slot in held {
        assert_eq!(pool.owners().get(slot.index()).map(|w| w.owner), Some(me));
        assert_eq!(
            slot.header().request,
            2000 + slot.index(),
            "survivor's header"
        );
        let index = slot.index();
        slot.into_sent();
        pool.owners()
            .free(index, me)
            .expect("survivor frees its own slot");
    }
    println!("DONE churned={churned}");
}
