//! Choosing the instance of a function a descriptor goes to: round-robin over the ready
//! instances. Built once from the plan, so the per-request path neither allocates nor scans
//! the whole party table.

use std::sync::atomic::{AtomicU32, Ordering};

use zerohop_pool::{PartyState, Pool};

use crate::PlanExt;
use crate::{PartyId, Plan};

/// Round-robin instance choice, shared by the threads of one party.
pub struct Picker {
    /// Parties running each function, by function index.
    parties: Vec<Vec<PartyId>>,
    /// Round-robin cursor per function (a hint: Relaxed, no ordering with anything).
    cursors: Vec<AtomicU32>,
}

impl Picker {
    /// The picker of party `me` of `plan`: per function, the instances `me` may send to
    /// ([`Policy::targets_running`](crate::Policy::targets_running)); its cursors start at
    /// `me`, so parties' first requests spread.
    pub fn new(plan: &Plan, me: PartyId) -> Self {
        let n = plan.functions.len();
        let policy = plan.policy().ok();
        Self {
            parties: (0..n)
                .map(|f| match &policy {
                    Some(p) => p.targets_running(me, f as u8),
                    None => Vec::new(),
                })
                .collect(),
            cursors: (0..n).map(|_| AtomicU32::new(u32::from(me))).collect(),
        }
    }

    /// An instance of function `f`: the next ready one in round-robin order, else the one
    /// the function's next instance comes up as (its queue keeps the descriptor until it is
    /// ready); `None` when the function has no instance.
    pub fn pick(&self, f: u8, pool: &Pool) -> Option<PartyId> {
        self.pick_state(f, pool).map(|(p, _)| p)
    }

    /// Like [`pick`](Picker::pick), with the state the chosen party was seen in: anything
    /// but `Ready` means the descriptor waits for an activation.
    ///
    /// Without a ready instance every sender makes the same choice, so that what is sent
    /// while a function has none converges on one party: the lowest one starting, else the
    /// lowest parked one, else the lowest with no process, and only last one draining.
    pub fn pick_state(&self, f: u8, pool: &Pool) -> Option<(PartyId, PartyState)> {
        let parties = self.parties.get(f as usize).filter(|p| !p.is_empty())?;
        let n = parties.len();
        let start = self.cursors[f as usize].fetch_add(1, Ordering::Relaxed) as usize;
        let state = |p: PartyId| pool.party(p).map_or(PartyState::Empty, |r| r.state());
        if let Some(p) = (0..n)
            .map(|i| parties[(start + i) % n])
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
    use super::*;
    use crate::{FunctionPlan, RoutePlan, GATEWAY_FN};
    use zerohop_pool::PoolGeometry;

    #[test]
    fn round_robin_prefers_ready_instances() {
        let f = |name: &str| FunctionPlan {
            name: name.into(),
            concurrency: 1,
            next: vec![],
            calls: Vec::new(),
            ..Default::default()
        };
        let plan = Plan {
            chain: "p".into(),
            transport: "ring".into(),
            spin_us: 0,
            queue_capacity: 2,
            functions: vec![f("a"), f("b")],
            routes: vec![RoutePlan {
                method: "POST".into(),
                path: "/".into(),
                sequence: vec![0],
                ..Default::default()
            }],
            headers: vec![],
            party_function: vec![GATEWAY_FN, 0, 0, 0],
            timeout_ms: 30_000,
            state: None,
            pool: crate::PoolPlan {
                slots: 64,
                slot_size: 4096,
                hugepages: false,
                large_slots: 0,
                large_slot_size: 0,
            },
        };
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
        // None ready: every pick converges on one party, the one closest to serving.
        let got: Vec<_> = (0..3).map(|_| p.pick(0, &pool).unwrap()).collect();
        assert_eq!(got, [1, 1, 1], "none started: the lowest");
        let set = |party: u16, s: PartyState| pool.party(party).unwrap().set_state(s);
        set(1, PartyState::Draining);
        set(2, PartyState::Stopped);
        set(3, PartyState::Parked);
        assert_eq!(p.pick_state(0, &pool), Some((3, PartyState::Parked)));
        set(2, PartyState::Starting);
        assert_eq!(p.pick_state(0, &pool), Some((2, PartyState::Starting)));
        set(2, PartyState::Stopped);
        set(3, PartyState::Stopped);
        assert_eq!(p.pick(0, &pool), Some(2), "draining only when nothing else");
        set(1, PartyState::Empty);
        set(3, PartyState::Empty);
        // Only party 2 ready: always party 2.
        pool.party(2).unwrap().set_state(PartyState::Ready);
        assert!((0..5).all(|_| p.pick(0, &pool) == Some(2)));
        // Two ready: they alternate.
        pool.party(3).unwrap().set_state(PartyState::Ready);
        let got: Vec<_> = (0..4).map(|_| p.pick(0, &pool).unwrap()).collect();
        assert_eq!(got.iter().filter(|&&x| x == 2).count(), 2, "{got:?}");
        assert_eq!(got.iter().filter(|&&x| x == 3).count(), 2, "{got:?}");
        // A function without instances, and one that does not exist.
        assert_eq!(p.pick(1, &pool), None);
        assert_eq!(p.pick(9, &pool), None);
    }
}
