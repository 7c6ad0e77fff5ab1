//! The plan, as the transport sees it (the types live in `zerohop-spec`), and how the agent
//! hands a chain to an instance process.

pub use zerohop_spec::plan::{
    Domain, FunctionPlan, Hop, JoinPolicy, Plan, PoolPlan, RequestIds, RoutePlan, StatePlan,
};

use crate::policy::GATEWAY_FN;
use crate::{Options, Policy, PolicyError};

pub use zerohop_spec::handover;

/// What the transport derives from a [`Plan`].
pub trait PlanExt {
    /// The policy: which party may send to which.
    fn policy(&self) -> Result<Policy, PolicyError>;
    /// The transport's tunables.
    fn options(&self) -> Options;
}

impl PlanExt for Plan {
    fn policy(&self) -> Result<Policy, PolicyError> {
        let mut pf = self.party_function.clone();
        if let Some(g) = pf.first_mut() {
            // Party 0 is the gateway whatever the plan says.
            *g = GATEWAY_FN;
        }
        Policy::new(pf, self.edges())
    }

    fn options(&self) -> Options {
        Options {
            queue_capacity: self.queue_capacity,
            spin_us: self.spin_us,
            ..Options::default()
        }
    }
}

/// A function of a test plan: `name`, one handler thread.
#[cfg(test)]
pub(crate) fn test_function(name: &str) -> FunctionPlan {
    FunctionPlan {
        name: name.into(),
        concurrency: 1,
        ..Default::default()
    }
}

/// A test plan named `chain`: `functions`, one route `POST /` through `sequence`, and a
/// party per entry of `party_function` (spin 20 us, queues of 64, a small pool).
#[cfg(test)]
pub(crate) fn test_plan(
    chain: &str,
    functions: Vec<FunctionPlan>,
    sequence: Vec<u8>,
    party_function: Vec<u8>,
) -> Plan {
    Plan {
        chain: chain.into(),
        transport: "ring".into(),
        spin_us: 20,
        queue_capacity: 64,
        functions,
        routes: vec![RoutePlan {
            method: "POST".into(),
            path: "/".into(),
            sequence,
            ..Default::default()
        }],
        headers: vec![],
        party_function,
        cpus: Vec::new(),
        timeout_ms: 30_000,
        state: None,
        pool: PoolPlan {
            slots: 64,
            slot_size: 4096,
            hugepages: false,
            large_slots: 0,
            large_slot_size: 0,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_policy_allows_the_plans_edges_only() {
        let f = test_function;
        let p = test_plan(
            "hello",
            vec![f("upper"), f("exclaim")],
            vec![0, 1],
            vec![GATEWAY_FN, 0, 1],
        );
        let pol = p.policy().unwrap();
        assert!(pol.allows_parties(0, 1) && pol.allows_parties(1, 2) && pol.allows_parties(2, 0));
        assert!(pol.allows_parties(1, 0), "upper may answer early");
        assert!(
            !pol.allows_parties(0, 2),
            "the gateway may not skip to exclaim"
        );
        assert!(!pol.allows_parties(2, 1), "no edge back");
        assert_eq!((p.options().queue_capacity, p.options().spin_us), (64, 20));
    }

    #[test]
    fn a_fused_group_is_one_party_on_every_edge() {
        let f = test_function;
        // audit (0) -> upper+exclaim (1, 2 fused: upper's two instances) -> audit.
        let mut functions = vec![f("audit"), f("upper"), f("exclaim")];
        functions[1].fused = vec![1, 2];
        functions[2].host = Some(1);
        let p = test_plan(
            "fused",
            functions,
            vec![0, 1, 2, 0],
            vec![GATEWAY_FN, 0, 1, 1],
        );
        let pol = p.policy().unwrap();
        assert!(pol.allows(0, 1), "into the group: to its first function");
        assert!(
            pol.allows(1, 0),
            "out of the group: from its first function"
        );
        assert!(
            !pol.allows(1, 1) && !pol.allows(1, 2),
            "a hop inside is no edge"
        );
        assert!(
            !pol.allows(0, 2) && !pol.allows(2, 0),
            "exclaim is never an end"
        );
        assert_eq!(
            pol.targets(1),
            [0, 2, 3],
            "audit reaches the group's instances"
        );
        assert_eq!(
            pol.targets(2),
            [0, 1],
            "the group answers audit and the gateway"
        );
        assert_eq!(pol.parties_of(2).count(), 0, "exclaim has no parties");
    }
}
