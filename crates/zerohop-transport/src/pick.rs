//! Choosing the instance of a function a descriptor goes to: warm first. Built once from
//! the plan; a pick looks at a bounded number of candidates, however many instances the
//! function has, and neither allocates nor scans the party table.
//!
//! Each sender keeps, per function, the instance it picked last. A pick takes, in order,
//! the first *free* one of: the instance picked last, the first [`WARM`] instances of the
//! function (in party order, the same for every sender), and [`SPILL`] instances from a
//! round-robin cursor. In a chain with `cpus` (core-affine pipelines, `zerohop_spec::cpus`)
//! the sender's *home* instance, the first of the function on the sender's own core, comes
//! before all of them and takes the place of the warm ones: a request runs to its answer on
//! one core while that core's instances have room. Free means ready, with fewer requests in its handlers plus queued
//! from this sender than it has handler threads. When none of those is free, the least
//! loaded ready one of them is taken. So light load stays on a few instances (awake, their
//! caches warm, the others asleep and free for the scaler to park), and heavy load spreads
//! over as many as it needs, a handful of looks per pick. Only when none of the looked-at
//! instances is ready does a pick look at all of them (a function scaled from zero, or
//! being replaced).
//!
//! The handler counts come from the pool's party table, which every party of the domain
//! can write: a forged count steers load within the forger's own domain only, and a pick
//! always ends at an instance the plan gives.

use std::sync::atomic::{AtomicU32, Ordering};

use zerohop_pool::{PartyState, Pool};

use crate::PlanExt;
use crate::{PartyId, Plan, Sender};

/// The first instances of a function in party order, preferred by every sender: light
/// load stays on them.
pub const WARM: usize = 2;
/// Instances looked at beyond the warm ones, per pick, when none of those is free.
pub const SPILL: usize = 4;

/// Warm-first instance choice, shared by the threads of one party.
pub struct Picker {
    /// Parties running each function, by function index.
    parties: Vec<Vec<PartyId>>,
    /// Handler threads of each function's instances.
    threads: Vec<u32>,
    /// Per function, the index into `parties` picked last (a hint: Relaxed).
    last: Vec<AtomicU32>,
    /// Per function, where looking for room goes on when the warm ones are full (a hint).
    spill: Vec<AtomicU32>,
    /// Per function, the index into `parties` of this sender's home instance: the first on
    /// its own core, when the chain has `cpus`.
    home: Vec<Option<usize>>,
}

/// The choice among a function's `n` instances (by index), given the sender's `home` one
/// (on its own core), the one picked `last`, the spill cursor, the instances' handler
/// threads and what a `look` at one instance learns: `Some(load)` for a ready one (requests
/// in its handlers plus queued from this sender), `None` for one that is not ready. Returns
/// the index and where the spill cursor goes next; `None` when none of the looked-at
/// instances is ready.
fn choose(
    n: usize,
    home: Option<usize>,
    last: usize,
    spill: usize,
    threads: u32,
    mut look: impl FnMut(usize) -> Option<u32>,
) -> Option<(usize, usize)> {
    let last = last % n;
    let home = home.filter(|&h| h < n);
    // With a home, it and the last one; without, the last one and the warm ones.
    let first: [Option<usize>; 1 + WARM] = match home {
        Some(h) => [Some(h), (last != h).then_some(last), None],
        None => [
            Some(last),
            (last != 0).then_some(0),
            (last != 1 && n > 1).then_some(1),
        ],
    };
    let mut best: Option<(usize, u32)> = None;
    for i in first.into_iter().flatten() {
        match look(i) {
            Some(load) if load < threads => return Some((i, spill)),
            Some(load) if best.is_none_or(|(_, l)| load < l) => best = Some((i, load)),
            _ => {}
        }
    }
    for k in 0..SPILL.min(n) {
        let i = (spill + k) % n;
        match look(i) {
            Some(load) if load < threads => return Some((i, i + 1)),
            Some(load) if best.is_none_or(|(_, l)| load < l) => best = Some((i, load)),
            _ => {}
        }
    }
    best.map(|(i, _)| (i, spill + SPILL))
}

impl Picker {
    /// The picker of party `me` of `plan`: per function, the instances `me` may send to
    /// ([`Policy::targets_running`](crate::Policy::targets_running)). Its spill cursors
    /// start at `me`, so that senders spill to different instances.
    pub fn new(plan: &Plan, me: PartyId) -> Self {
        let n = plan.functions.len();
        let policy = plan.policy().ok();
        let parties: Vec<Vec<PartyId>> = (0..n)
            .map(|f| match &policy {
                Some(p) => p.targets_running(me, f as u8),
                None => Vec::new(),
            })
            .collect();
        let lanes = zerohop_spec::cpus::lanes(&plan.party_function, plan.cpus.len());
        let lane = |p: PartyId| lanes.get(usize::from(p)).copied().flatten();
        let home = parties
            .iter()
            .map(|ps| {
                let mine = lane(me)?;
                ps.iter().position(|&q| lane(q) == Some(mine))
            })
            .collect();
        Self {
            parties,
            home,
            threads: plan
                .functions
                .iter()
                .map(|f| f.handler_threads() as u32)
                .collect(),
            last: (0..n).map(|_| AtomicU32::new(0)).collect(),
            spill: (0..n).map(|_| AtomicU32::new(u32::from(me))).collect(),
        }
    }

    /// An instance of function `f` (see [`pick_state`](Picker::pick_state)).
    pub fn pick(&self, f: u8, pool: &Pool, sender: &dyn Sender) -> Option<PartyId> {
        self.pick_state(f, pool, sender).map(|(p, _)| p)
    }

    /// An instance of function `f`, warm first (see the module docs), with the state it
    /// was seen in: anything but `Ready` means the descriptor waits for an activation.
    /// `sender` tells what this party has queued to each; `None` when the function has no
    /// instance.
    ///
    /// Without a ready instance every sender makes the same choice, so that what is sent
    /// while a function has none converges on one party: the lowest one starting, else the
    /// lowest parked one, else the lowest with no process, and only last one draining.
    pub fn pick_state(
        &self,
        f: u8,
        pool: &Pool,
        sender: &dyn Sender,
    ) -> Option<(PartyId, PartyState)> {
        let parties = self.parties.get(f as usize).filter(|p| !p.is_empty())?;
        let state = |p: PartyId| pool.party(p).map_or(PartyState::Empty, |r| r.state());
        let n = parties.len();
        if n == 1 {
            return Some((parties[0], state(parties[0])));
        }
        let fi = f as usize;
        let threads = self.threads.get(fi).copied().unwrap_or(1);
        let look = |i: usize| {
            let p = parties[i];
            let r = pool.party(p)?;
            (r.state() == PartyState::Ready).then(|| r.busy().saturating_add(sender.backlog(p)))
        };
        let last = self.last[fi].load(Ordering::Relaxed) as usize;
        let spill = self.spill[fi].load(Ordering::Relaxed) as usize;
        let home = self.home.get(fi).copied().flatten();
        if let Some((i, next_spill)) = choose(n, home, last, spill, threads, look) {
            if i != last {
                self.last[fi].store(i as u32, Ordering::Relaxed);
            }
            if next_spill != spill {
                self.spill[fi].store((next_spill % n) as u32, Ordering::Relaxed);
            }
            return Some((parties[i], PartyState::Ready));
        }
        if let Some(p) = parties
            .iter()
            .copied()
            .find(|&p| state(p) == PartyState::Ready)
        {
            return Some((p, PartyState::Ready));
        }
        let rank = |s: PartyState| match s {
            PartyState::Ready => 0,
            PartyState::Starting => 1,
            PartyState::Parked | PartyState::Parking => 2,
            PartyState::Stopped | PartyState::Empty | PartyState::Dead => 3,
            PartyState::Draining => 4,
        };
        parties
            .iter()
            .map(|&p| (p, state(p)))
            .min_by_key(|&(p, s)| (rank(s), p))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Mutex;

    use super::*;
    use crate::{Descriptor, SendError, GATEWAY_FN};
    use zerohop_pool::PoolGeometry;

    /// A sender that only says what it has queued to each party.
    #[derive(Default)]
    struct Backlog(Mutex<HashMap<PartyId, u32>>);

    impl Sender for Backlog {
        fn send(&self, _: PartyId, _: Descriptor) -> Result<(), SendError> {
            unreachable!("pick never sends")
        }
        fn try_send(&self, _: PartyId, _: Descriptor) -> Result<(), SendError> {
            unreachable!("pick never sends")
        }
        fn backlog(&self, to: PartyId) -> u32 {
            self.0.lock().unwrap().get(&to).copied().unwrap_or(0)
        }
    }

    /// `choose` over loads by index (`None`: not ready), with the indices it looked at.
    fn choose_over(
        loads: &[Option<u32>],
        last: usize,
        spill: usize,
        threads: u32,
    ) -> (Option<(usize, usize)>, Vec<usize>) {
        let mut looked = Vec::new();
        let got = choose(loads.len(), None, last, spill, threads, |i| {
            looked.push(i);
            loads[i]
        });
        (got, looked)
    }

    #[test]
    fn light_load_stays_on_the_warm_instance() {
        let idle = vec![Some(0); 1000];
        // The one picked last, when free: one look, whatever the number of instances.
        assert_eq!(choose_over(&idle, 7, 500, 1), (Some((7, 500)), vec![7]));
        // Busy: the first warm one that is free.
        let mut loads = idle.clone();
        loads[7] = Some(1);
        assert_eq!(choose_over(&loads, 7, 500, 1), (Some((0, 500)), vec![7, 0]));
        // Two handler threads: one request in them still leaves room.
        assert_eq!(choose_over(&loads, 7, 500, 2).0, Some((7, 500)));
    }

    #[test]
    fn a_sender_picks_the_instance_on_its_own_core_first() {
        let mut loads = vec![Some(0); 8];
        let looks = |loads: &[Option<u32>], home| {
            let mut looked = Vec::new();
            let got = choose(loads.len(), Some(home), 2, 6, 1, |i| {
                looked.push(i);
                loads[i]
            });
            (got, looked)
        };
        // Home free: one look, though another was picked last.
        assert_eq!(looks(&loads, 5), (Some((5, 6)), vec![5]));
        // Home busy: the one picked last.
        loads[5] = Some(1);
        assert_eq!(looks(&loads, 5), (Some((2, 6)), vec![5, 2]));
        // Both busy: spill from the cursor, never to the warm ones of other cores first.
        loads[2] = Some(1);
        assert_eq!(looks(&loads, 5), (Some((6, 7)), vec![5, 2, 6]));
        // A home out of range is no home.
        assert_eq!(looks(&loads, 99).1[..2], [2, 0]);
    }

    #[test]
    fn a_chain_with_cpus_gives_each_sender_the_instance_of_its_lane() {
        let f = crate::plan::test_function;
        let mut plan = crate::plan::test_plan(
            "lanes",
            vec![f("a")],
            vec![0],
            vec![GATEWAY_FN, GATEWAY_FN, 0, 0, 0, 0],
        );
        plan.cpus = vec![4, 6];
        let pool = Pool::create(
            "lanes",
            &PoolGeometry {
                slots: 1,
                first_slot: 0,
                slot_size: 4096,
                max_parties: 6,
                hugepages: false,
                release: false,
            },
        )
        .unwrap();
        for party in 2..6 {
            pool.party(party).unwrap().set_state(PartyState::Ready);
        }
        let queued = Backlog::default();
        // Gateway 0 is on CPU 4 with instances 0 and 2 (parties 2 and 4); gateway 1 on
        // CPU 6 with parties 3 and 5.
        assert_eq!(plan.cpu_of(1), Some(6));
        assert_eq!(plan.cpu_of(5), Some(6));
        for (gateway, home) in [(0, 2), (1, 3)] {
            let p = Picker::new(&plan, gateway);
            assert!((0..5).all(|_| p.pick(0, &pool, &queued) == Some(home)));
            queued.0.lock().unwrap().insert(home, 1);
            let spilled = p.pick(0, &pool, &queued).unwrap();
            assert_ne!(spilled, home, "a busy home spills");
            queued.0.lock().unwrap().clear();
            assert_eq!(p.pick(0, &pool, &queued), Some(home), "and comes home");
        }
    }

    #[test]
    fn heavy_load_spills_with_a_bounded_number_of_looks() {
        // The warm ones full: spill from the cursor, which moves past the one taken.
        let mut loads = vec![Some(0); 1000];
        for l in &mut loads[..503] {
            *l = Some(1);
        }
        let (got, looked) = choose_over(&loads, 1, 500, 1);
        assert_eq!(got, Some((503, 504)));
        assert_eq!(looked, [1, 0, 500, 501, 502, 503]);
        // Everyone full: the least loaded looked at, and the next spill looks further on.
        let mut full = vec![Some(3); 1000];
        full[502] = Some(2);
        let (got, looked) = choose_over(&full, 1, 500, 1);
        assert_eq!(got, Some((502, 500 + SPILL)));
        assert_eq!(looked.len(), 1 + (WARM - 1) + SPILL, "bounded: {looked:?}");
        // Not ready ones are passed over; none ready among those looked at: no choice here.
        let mut some = vec![None; 1000];
        some[501] = Some(5);
        assert_eq!(choose_over(&some, 0, 500, 1).0, Some((501, 504)));
        assert_eq!(choose_over(&[None; 9], 0, 0, 1).0, None);
        // Fewer instances than looks: each looked at, the cursor wraps.
        assert_eq!(
            choose_over(&[Some(1), Some(1), Some(0)], 0, 5, 1).0,
            Some((2, 3))
        );
    }

    #[test]
    fn warm_first_prefers_ready_instances() {
        let f = crate::plan::test_function;
        let plan = crate::plan::test_plan(
            "p",
            vec![f("a"), f("b")],
            vec![0],
            vec![GATEWAY_FN, 0, 0, 0],
        );
        let pool = Pool::create(
            "pick",
            &PoolGeometry {
                slots: 1,
                first_slot: 0,
                slot_size: 4096,
                max_parties: 4,
                hugepages: false,
                release: false,
            },
        )
        .unwrap();
        let p = Picker::new(&plan, 0);
        let queued = Backlog::default();
        let sender: &dyn Sender = &queued;
        // None ready: every pick converges on one party, the one closest to serving.
        let got: Vec<_> = (0..3).map(|_| p.pick(0, &pool, sender).unwrap()).collect();
        assert_eq!(got, [1, 1, 1], "none started: the lowest");
        let set = |party: u16, s: PartyState| pool.party(party).unwrap().set_state(s);
        set(1, PartyState::Draining);
        set(2, PartyState::Stopped);
        set(3, PartyState::Parked);
        assert_eq!(
            p.pick_state(0, &pool, sender),
            Some((3, PartyState::Parked))
        );
        set(2, PartyState::Starting);
        assert_eq!(
            p.pick_state(0, &pool, sender),
            Some((2, PartyState::Starting))
        );
        set(2, PartyState::Stopped);
        set(3, PartyState::Stopped);
        assert_eq!(
            p.pick(0, &pool, sender),
            Some(2),
            "draining only when nothing else"
        );
        set(1, PartyState::Empty);
        set(3, PartyState::Empty);
        // Only party 2 ready: always party 2.
        pool.party(2).unwrap().set_state(PartyState::Ready);
        assert!((0..5).all(|_| p.pick(0, &pool, sender) == Some(2)));
        // Two ready: the warm one while it is free.
        pool.party(3).unwrap().set_state(PartyState::Ready);
        assert!((0..5).all(|_| p.pick(0, &pool, sender) == Some(2)));
        // A request queued to it (one handler thread): the other one, which is then the
        // warm one; a request in its handler makes the first one free again.
        queued.0.lock().unwrap().insert(2, 1);
        assert_eq!(p.pick(0, &pool, sender), Some(3));
        assert_eq!(p.pick(0, &pool, sender), Some(3));
        pool.party(3).unwrap().handler_started();
        queued.0.lock().unwrap().clear();
        assert_eq!(p.pick(0, &pool, sender), Some(2));
        // A function without instances, and one that does not exist.
        assert_eq!(p.pick(1, &pool, sender), None);
        assert_eq!(p.pick(9, &pool, sender), None);
    }
}
