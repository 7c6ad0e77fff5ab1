//! A chain split over nodes: the spec one node runs of it.
//!
//! Every node of a split replica runs the whole chain's routes. A function placed here runs
//! as usual; a function placed on a peer node is played by the agent itself (its instances
//! relay each request to the peer daemon, see `zerohop_link`). For the hops a peer relays
//! here, the node has one extra route per (route, local function the route's requests may
//! reach): no trigger, its sequence that one function, standing for the route it relays.
//! Both nodes derive the same route numbering from the same chain spec, so a relayed hop
//! names its route by index.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use zerohop_transport::JoinPolicy;

use crate::spec::{ChainSpec, FunctionSpec, RouteSpec, ScaleSpec};

/// The concurrency a relaying instance declares. It holds no thread per request (each waits
/// for its peer in a task), so this only tells the scaler one instance is plenty.
pub const RELAY_CONCURRENCY: u16 = 64;

/// Why a chain cannot be split as asked.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum SplitError {
    /// A function named to run here is not in the chain.
    #[error("the chain has no function `{function}` to run here")]
    NoSuchFunction {
        /// The name given.
        function: String,
    },
    /// A function of the chain is placed on no node.
    #[error("function `{function}` runs neither on this node nor on a peer")]
    Unplaced {
        /// The function.
        function: String,
    },
}

/// The part of `spec` this node runs: the functions in `local` run here, every other one on
/// the node `peers` maps it to. Fails naming a function that is neither here nor on a peer.
pub fn split(
    spec: &ChainSpec,
    local: &[String],
    peers: &BTreeMap<String, SocketAddr>,
) -> Result<ChainSpec, SplitError> {
    for name in local {
        if !spec.functions.iter().any(|f| &f.name == name) {
            return Err(SplitError::NoSuchFunction {
                function: name.clone(),
            });
        }
    }
    let mut out = spec.clone();
    for f in &mut out.functions {
        if local.contains(&f.name) {
            continue;
        }
        let Some(&peer) = peers.get(&f.name) else {
            return Err(SplitError::Unplaced {
                function: f.name.clone(),
            });
        };
        *f = relayed(f, peer);
    }
    // The routes relayed hops arrive by: per route, each local function its requests may
    // reach, in function order (the same numbering on every node).
    let whole = crate::plan_from_spec(spec, &spec.transport, 0, 1);
    for (i, r) in spec.routes.iter().enumerate() {
        let reach = whole.answerers(i as u16);
        for (k, f) in spec.functions.iter().enumerate() {
            if local.contains(&f.name) && reach.contains(&(k as u8)) {
                out.routes.push(RouteSpec {
                    line: r.line,
                    method: String::new(),
                    path: String::new(),
                    grpc: String::new(),
                    mqtt: String::new(),
                    mqtt_reply: String::new(),
                    coap: String::new(),
                    content_type: String::new(),
                    auth: None,
                    rate_limit: None,
                    delivery: Default::default(),
                    sequence: vec![f.name.clone()],
                    relay_of: Some(i),
                });
            }
        }
    }
    Ok(out)
}

/// Function `f` as the node that relays it to `peer` sees it: one instance, calling and
/// forwarding to nothing itself (the peer does), keeping the headers it reads (the gateway
/// here copies them into the slot the peer gets).
fn relayed(f: &FunctionSpec, peer: SocketAddr) -> FunctionSpec {
    FunctionSpec {
        command: vec![std::env::current_exe()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|_| "zerohop".into())],
        instances: 1,
        concurrency: RELAY_CONCURRENCY,
        env: Vec::new(),
        next: Vec::new(),
        calls: Vec::new(),
        syscalls: Vec::new(),
        state: false,
        fan_out: Vec::new(),
        join: JoinPolicy::Fail,
        scale: ScaleSpec::fixed(1, RELAY_CONCURRENCY),
        resources: Default::default(),
        relay: Some(peer),
        ..f.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use zerohop_transport::PlanExt;

    fn spec(text: &str) -> ChainSpec {
        crate::spec::parse(std::path::Path::new("/tmp/chain.yaml"), text).expect("valid spec")
    }

    const CHAIN: &str = "name: s\nfunctions:\n  a: { command: [/bin/true] }\n  b: { command: [/bin/true], calls: [c] }\n  c: { command: [/bin/true] }\n  d: { command: [/bin/true] }\nroutes:\n  - http: POST /x\n    sequence: [a, b]\n  - http: GET /y\n    sequence: [d]\n";

    #[test]
    fn each_node_relays_the_others_functions_and_takes_hops_for_its_own() {
        let s = spec(CHAIN);
        let peer: SocketAddr = "10.0.0.2:7100".parse().unwrap();
        let peers: BTreeMap<String, SocketAddr> = [("b".to_owned(), peer), ("c".to_owned(), peer)]
            .into_iter()
            .collect();
        let here = split(&s, &["a".into(), "d".into()], &peers).unwrap();
        let b = here.functions.iter().find(|f| f.name == "b").unwrap();
        assert_eq!(b.relay, Some(peer));
        assert!(b.calls.is_empty(), "the peer makes b's calls");
        assert_eq!((b.instances, b.scale.max), (1, 1));
        assert!(here
            .functions
            .iter()
            .find(|f| f.name == "a")
            .unwrap()
            .relay
            .is_none());
        // The original routes first, unchanged, then one relay route per local function
        // each route reaches: (x, a) and (y, d).
        assert_eq!(here.routes.len(), 4);
        assert_eq!(here.routes[..2], s.routes[..]);
        let relays: Vec<(Option<usize>, Vec<String>)> = here.routes[2..]
            .iter()
            .map(|r| (r.relay_of, r.sequence.clone()))
            .collect();
        assert_eq!(
            relays,
            vec![
                (Some(0), vec!["a".to_owned()]),
                (Some(1), vec!["d".to_owned()])
            ]
        );
        // The other side: b and c here; c is reached by b's call.
        let back: BTreeMap<String, SocketAddr> = [("a".to_owned(), peer), ("d".to_owned(), peer)]
            .into_iter()
            .collect();
        let there = split(&s, &["b".into(), "c".into()], &back).unwrap();
        let seqs: Vec<Vec<String>> = there.routes[2..]
            .iter()
            .map(|r| r.sequence.clone())
            .collect();
        assert_eq!(seqs, vec![vec!["b".to_owned()], vec!["c".to_owned()]]);
        // Both plans build (policy and domains accept the relay routes).
        for part in [&here, &there] {
            let plan = crate::plan_from_spec(part, "ring", 0, 1);
            plan.policy().expect("policy");
            assert!(!plan.domains().is_empty());
        }
    }

    #[test]
    fn a_function_on_no_node_is_refused() {
        let s = spec(CHAIN);
        let e = split(&s, &["a".into()], &BTreeMap::new()).unwrap_err();
        assert_eq!(
            e,
            SplitError::Unplaced {
                function: "b".into()
            }
        );
        assert!(e.to_string().contains("`b` runs neither"), "{e}");
        let e = split(&s, &["zz".into()], &BTreeMap::new()).unwrap_err();
        assert!(e.to_string().contains("no function `zz`"), "{e}");
    }
}
