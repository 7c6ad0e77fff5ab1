//! The routing plan (`ZEROHOP_PLAN`) as every party reads it, on arbitrary JSON.
//!
//! A party parses the plan, derives the policy, builds its picker and routes by it
//! (`next_in_sequence`, `answerers`, `function_name`, `parties_of`). None of that may panic
//! on any plan that parses, and what it derives must agree with itself: the policy's
//! per-party targets and senders are the same edges seen from both ends, and both match the
//! plan's function edges.
//!
//! Plans the agent can produce (at most 254 functions, routes of 1 to 255 known functions,
//! parties running known functions) are also held to what the parties rely on: every route
//! can be walked from the gateway and back, and names and indices round-trip.

#![no_main]

use std::collections::HashSet;
use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use zerohop_pool::{Descriptor, Pool, PoolGeometry};
use zerohop_transport::{
    Hop, PartyId, Picker, Plan, PlanExt, PolicyError, SendError, Sender, GATEWAY_FN,
};

/// A sender that never sends and says it has a descriptor queued to every odd party, so
/// picks look past the warm instances too.
struct Queued;

impl Sender for Queued {
    fn send(&self, to: PartyId, _: Descriptor) -> Result<(), SendError> {
        Err(SendError::NotAllowed(to))
    }
    fn try_send(&self, to: PartyId, _: Descriptor) -> Result<(), SendError> {
        Err(SendError::NotAllowed(to))
    }
    fn backlog(&self, to: PartyId) -> u32 {
        u32::from(to % 2)
    }
}

fn pool() -> &'static Arc<Pool> {
    static POOL: OnceLock<Arc<Pool>> = OnceLock::new();
    POOL.get_or_init(|| {
        Arc::new(
            Pool::create(
                "fuzz-plan",
                &PoolGeometry {
                    slots: 1,
                    first_slot: 0,
                    slot_size: 128,
                    max_parties: 4,
                    hugepages: false,
                    release: false,
                },
            )
            .expect("create the pool"),
        )
    })
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(plan) = Plan::from_json(text) else {
        return;
    };
    assert_eq!(
        Plan::from_json(&plan.to_json()).ok().as_ref(),
        Some(&plan),
        "JSON round trip"
    );
    let nf = plan.functions.len();

    let edges = plan.edges();
    assert!(
        edges.windows(2).all(|w| w[0] < w[1]),
        "edges sorted, no repeats"
    );
    let edge_set: HashSet<(u8, u8)> = edges.iter().copied().collect();
    for r in &plan.routes {
        let mut prev = GATEWAY_FN;
        for &f in &r.sequence {
            assert!(edge_set.contains(&(prev, f)), "route edge {prev} -> {f}");
            assert!(edge_set.contains(&(f, GATEWAY_FN)), "{f} may answer early");
            prev = f;
        }
    }
    for (i, f) in plan.functions.iter().enumerate() {
        for &t in &f.next {
            assert!(edge_set.contains(&(i as u8, t)), "next edge {i} -> {t}");
        }
    }

    for r in 0..=plan.routes.len().min(usize::from(u16::MAX)) {
        let route = r as u16;
        let answerers = plan.answerers(route);
        let Some(rp) = plan.routes.get(r) else {
            assert!(answerers.is_empty(), "an unknown route has no answerers");
            continue;
        };
        // Sorted for the gateway's binary search; a function a sequence visits twice may
        // appear twice.
        assert!(answerers.windows(2).all(|w| w[0] <= w[1]));
        for f in &rp.sequence {
            assert!(
                answerers.binary_search(f).is_ok(),
                "{f} of the route answers"
            );
        }
        // The gateway accepts answers only from these, so each must be allowed to send to it.
        for &a in &answerers {
            assert!(
                edge_set.contains(&(a, GATEWAY_FN)),
                "answerer {a} cannot reach the gateway"
            );
        }
        let len = rp.sequence.len();
        for hop in [0u8, 1, 2, 254, 255]
            .into_iter()
            .chain((len.saturating_sub(2)..len.min(256)).map(|h| h as u8))
        {
            let next = hop as usize + 1;
            match plan.next_in_sequence(route, hop) {
                Some(Hop::Gateway) => assert!(next >= len, "hop {hop} of {len} ends early"),
                Some(Hop::Function { function, hop: h }) => {
                    assert_eq!(Some(&function), rp.sequence.get(next));
                    if next < 256 {
                        assert_eq!(h as usize, next);
                    }
                }
                None => panic!("route {r} exists"),
            }
        }
    }
    assert_eq!(plan.next_in_sequence(plan.routes.len() as u16, 0), None);

    for f in 0..=u8::MAX {
        let name = plan.function_name(f);
        match (f, plan.functions.get(f as usize)) {
            (GATEWAY_FN, _) => assert_eq!(name, "gateway"),
            (_, Some(fp)) => assert_eq!(name, fp.name),
            (_, None) => assert_eq!(name, "unknown"),
        }
        let parties = plan.parties_of(f);
        if f == GATEWAY_FN && !plan.party_function.is_empty() {
            assert!(
                (0..plan.gateways()).all(|g| parties.contains(&g)),
                "every gateway party runs the gateway: {parties:?}"
            );
        }
        for p in parties {
            if f != GATEWAY_FN {
                assert!(
                    p >= plan.gateways(),
                    "the gateway's party {p} runs no function"
                );
                assert_eq!(plan.party_function.get(p as usize), Some(&f));
            }
        }
        // Answers go back to a gateway party.
        for request in [0, 1, 2, 63, u32::MAX]
            .into_iter()
            .filter(|_| !plan.party_function.is_empty())
        {
            let g = plan.gateway_of(request);
            assert!(
                plan.parties_of(GATEWAY_FN).contains(&g),
                "answer to party {g}"
            );
        }
    }

    let picker = Picker::new(&plan, 0);
    let policy = plan.policy();
    for f in 0..nf.min(256) {
        let f = f as u8;
        // The gateway picks among the instances it may reach (none when the policy failed).
        let reachable = policy
            .as_ref()
            .map_or_else(|_| Vec::new(), |p| p.targets_running(0, f));
        assert!(reachable.iter().all(|p| plan.parties_of(f).contains(p)));
        match picker.pick(f, pool(), &Queued) {
            Some(p) => assert!(reachable.contains(&p), "picked party {p} it cannot reach"),
            None => assert!(
                reachable.is_empty(),
                "function {f} has {reachable:?} to pick"
            ),
        }
    }

    let policy = match policy {
        Ok(p) => p,
        Err(PolicyError::TooManyFunctions(_)) => {
            assert!(plan
                .party_function
                .iter()
                .skip(1)
                .any(|&f| f >= 254 && f != GATEWAY_FN));
            return;
        }
    };
    let n = plan.party_function.len();
    assert_eq!(policy.parties() as usize, n);
    let function_of = |p: usize| {
        if p == 0 {
            GATEWAY_FN
        } else {
            plan.party_function[p]
        }
    };
    for p in 0..n.min(64) {
        let targets = policy.targets(p as u16);
        let senders = policy.senders(p as u16);
        assert!(targets.windows(2).all(|w| w[0] < w[1]));
        assert!(senders.windows(2).all(|w| w[0] < w[1]));
        for q in 0..n.min(64) {
            let (f, g) = (function_of(p), function_of(q));
            let edge = edge_set.contains(&(f, g));
            let (p16, q16) = (p as u16, q as u16);
            let allowed = policy.allows_parties(p16, q16);
            // Instance edges lie on function edges; the gateway's hops are never capped.
            assert!(!allowed || edge, "{p}->{q} without a function edge");
            if edge && (f == GATEWAY_FN || g == GATEWAY_FN) {
                assert!(allowed, "gateway hop {p}->{q} capped");
            }
            assert_eq!(targets.contains(&q16), allowed, "targets({p}) and {q}");
            assert_eq!(
                policy.senders(q16).contains(&p16),
                allowed,
                "senders({q}) and {p}"
            );
            assert_eq!(
                policy.target_index(p16, q16),
                targets.iter().position(|&x| x == q16)
            );
        }
        // Every instance is reached from every function with an edge into it.
        for &(f, g) in &edge_set {
            if g == function_of(p) && !plan.parties_of(f).is_empty() && p != 0 {
                assert!(
                    senders.iter().any(|&s| function_of(s as usize) == f),
                    "party {p} has no sender running {f}"
                );
            }
        }
    }
    assert!(policy.targets(n as u16).is_empty() && policy.senders(n as u16).is_empty());

    if agent_shaped(&plan) {
        for (i, f) in plan.functions.iter().enumerate() {
            // Names may repeat in a hand-written plan; the first one wins.
            let first = plan.function_index(&f.name).expect("named function");
            assert!(first as usize <= i);
            assert_eq!(plan.function_name(first), f.name);
        }
        for r in &plan.routes {
            let head = r.sequence[0];
            for p in plan.parties_of(head) {
                assert!(
                    policy.allows_parties(0, p),
                    "gateway cannot reach head party {p}"
                );
            }
            for &f in &r.sequence {
                for p in plan.parties_of(f) {
                    assert!(policy.allows_parties(p, 0), "party {p} cannot answer");
                }
            }
        }
    }
});

/// Whether the agent could have produced `plan` from a valid spec.
fn agent_shaped(plan: &Plan) -> bool {
    let nf = plan.functions.len();
    nf <= 254
        && plan.party_function.first() == Some(&GATEWAY_FN)
        && plan.party_function[1..].iter().all(|&f| (f as usize) < nf)
        && plan.routes.iter().all(|r| {
            (1..=255).contains(&r.sequence.len()) && r.sequence.iter().all(|&f| (f as usize) < nf)
        })
        && plan
            .functions
            .iter()
            .all(|f| f.next.iter().all(|&t| (t as usize) < nf))
}
