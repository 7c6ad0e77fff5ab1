use k8s_openapi::api::core::v1::{NodeCondition, NodeSpec, NodeStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

use super::*;
use crate::resources::{ChainPartStatus, ChainSpec};

/// The Chain's generation in these tests.
const GENERATION: i64 = 2;

/// A Chain `c` in namespace `ns` of two functions routed `upper` then `exclaim`, with
/// `replicas`, `split` (`exclaim` in a part of its own) and at generation [`GENERATION`].
fn chain(replicas: u32, split: bool) -> Chain {
    let spec: ChainSpec = serde_json::from_value(json!({
        "replicas": replicas,
        "functions": {
            "upper": { "command": ["/bin/true"] },
            "exclaim": { "command": ["/bin/true"] },
        },
        "routes": [ { "http": "POST /hello", "sequence": ["upper", "exclaim"] } ],
    }))
    .unwrap();
    let mut c = Chain::new("c", spec);
    c.metadata.namespace = Some("ns".into());
    c.metadata.uid = Some("uid-c".into());
    c.metadata.generation = Some(GENERATION);
    if split {
        c.spec.placement.parts = vec![vec!["exclaim".into()]];
    }
    c
}

/// Heartbeats of `nodes`, each with address `ADDR-NODE` and peer `PEER-NODE`.
fn alive(nodes: &[&str]) -> BTreeMap<String, Heartbeat> {
    nodes
        .iter()
        .map(|n| {
            let h = Heartbeat {
                address: format!("addr-{n}"),
                peer: format!("peer-{n}"),
            };
            (n.to_string(), h)
        })
        .collect()
}

/// Part `part` of replica `replica` of Chain `c` on `node`, made from the Chain's current
/// generation and running it (`Running`, ready, its own generation observed).
fn part(replica: u32, part: u32, node: &str) -> ChainPart {
    let mut p = ChainPart::new(
        &format!("c-{replica}-{part}"),
        ChainPartSpec {
            chain: "c".into(),
            chain_generation: GENERATION,
            replica,
            part,
            node: node.into(),
            port: (part == 0).then_some(30100 + replica as u16),
            functions: Vec::new(),
            peers: Vec::new(),
            template: Default::default(),
        },
    );
    p.metadata.namespace = Some("ns".into());
    p.metadata.generation = Some(1);
    p.status = Some(ChainPartStatus {
        observed_generation: Some(1),
        phase: "Running".into(),
        ready: true,
        ..Default::default()
    });
    p
}

fn arcs(parts: Vec<ChainPart>) -> Vec<Arc<ChainPart>> {
    parts.into_iter().map(Arc::new).collect()
}

fn placed(replica: u32, part: u32, node: &str, port: Option<u16>) -> Placed {
    Placed {
        replica,
        part,
        node: node.into(),
        port,
        existing: None,
    }
}

/// A node `name` with `labels`, `unschedulable`, and a kubelet `Ready` condition of status
/// `ready` (`None`: no Ready condition reported).
fn node(
    name: &str,
    labels: &[(&str, &str)],
    unschedulable: bool,
    ready: Option<&str>,
) -> Arc<Node> {
    Arc::new(Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            unschedulable: unschedulable.then_some(true),
            ..Default::default()
        }),
        status: Some(NodeStatus {
            conditions: ready.map(|s| {
                vec![
                    NodeCondition {
                        type_: "MemoryPressure".into(),
                        status: "False".into(),
                        ..Default::default()
                    },
                    NodeCondition {
                        type_: "Ready".into(),
                        status: s.into(),
                        ..Default::default()
                    },
                ]
            }),
            ..Default::default()
        }),
    })
}

fn selector(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn cond(type_: &str, status: &str, reason: &str) -> Condition {
    Condition {
        type_: type_.into(),
        status: status.into(),
        reason: reason.into(),
        message: format!("{type_} is {status}: {reason}"),
        observed_generation: None,
        last_transition_time: None,
    }
}

#[test]
fn a_node_is_eligible_only_when_selected_schedulable_ready_and_heartbeating() {
    let zone = selector(&[("zone", "a")]);
    let none = selector(&[]);
    let beating = alive(&["n"]);
    let silent = alive(&["other"]);
    let rows = [
        // (what, node, selector, heartbeats, eligible)
        (
            "all fine",
            node("n", &[("zone", "a")], false, Some("True")),
            &zone,
            &beating,
            true,
        ),
        (
            "no selector, no Ready condition reported yet",
            node("n", &[], false, None),
            &none,
            &beating,
            true,
        ),
        (
            "selector value differs",
            node("n", &[("zone", "b")], false, Some("True")),
            &zone,
            &beating,
            false,
        ),
        (
            "selector label missing",
            node("n", &[], false, Some("True")),
            &zone,
            &beating,
            false,
        ),
        (
            "unschedulable (cordoned)",
            node("n", &[("zone", "a")], true, Some("True")),
            &zone,
            &beating,
            false,
        ),
        (
            "kubelet NotReady",
            node("n", &[("zone", "a")], false, Some("False")),
            &zone,
            &beating,
            false,
        ),
        (
            "kubelet stopped reporting",
            node("n", &[("zone", "a")], false, Some("Unknown")),
            &zone,
            &beating,
            false,
        ),
        (
            "no heartbeat from its daemon",
            node("n", &[("zone", "a")], false, Some("True")),
            &zone,
            &silent,
            false,
        ),
    ];
    for (what, n, sel, hb, want) in rows {
        assert_eq!(eligible(&n, sel, hb), want, "{what}");
    }
}

#[test]
fn node_infos_are_sorted_and_count_every_chains_parts_and_ports_and_this_passs() {
    let mut c = chain(1, false);
    c.spec.placement.node_selector = selector(&[("zone", "a")]);
    let nodes = [
        node("b", &[("zone", "a")], false, Some("True")),
        node("a", &[("zone", "a")], false, Some("True")),
        node("c", &[], false, Some("True")),
    ];
    let mut other = part(0, 0, "a");
    other.spec.chain = "other".into();
    other.spec.port = Some(9000);
    let all = arcs(vec![other, part(0, 1, "a"), part(0, 0, "gone")]);
    let now = [("b".to_string(), Some(30100)), ("b".to_string(), None)];
    let infos = node_infos(&c, &nodes, &alive(&["a", "b", "c"]), &all, &now);
    let seen: Vec<_> = infos
        .iter()
        .map(|n| {
            let ports: Vec<u16> = n.ports.iter().copied().collect();
            (n.name.as_str(), n.eligible, n.parts, ports)
        })
        .collect();
    assert_eq!(
        seen,
        vec![
            ("a", true, 2, vec![9000]),
            ("b", true, 2, vec![30100]),
            ("c", false, 0, vec![]),
        ]
    );
}

#[test]
fn placement_is_asked_for_the_chains_shape_and_sees_its_parts() {
    let mut c = chain(3, true);
    c.spec.port = Some(8080);
    c.spec.placement.max_per_node = Some(2);
    assert_eq!(
        want(&c),
        Want {
            replicas: 3,
            parts: 2,
            port: Some(8080),
            max_per_node: Some(2),
        }
    );
    assert_eq!(
        existing(&arcs(vec![part(1, 0, "a")])),
        vec![Existing {
            name: "c-1-0".into(),
            replica: 1,
            part: 0,
            node: "a".into(),
            port: Some(30101),
        }]
    );
}

#[test]
fn the_placed_condition_counts_replicas_when_all_are_placed() {
    let d = Decision {
        placed: vec![placed(0, 0, "a", Some(30100))],
        ..Default::default()
    };
    let c = placed_condition(&chain(1, false), &d);
    assert_eq!(
        (c.status.as_str(), c.reason.as_str(), c.message.as_str()),
        ("True", "AllPlaced", "1 of 1 replicas placed")
    );
}

#[test]
fn an_unplaced_replica_names_every_part_left_and_what_a_node_needs() {
    const START: &str = "it needs a node whose zerohop daemon is alive, that is Ready and \
                         schedulable";
    let plain = chain(3, false);
    let mut selected = chain(3, false);
    selected.spec.placement.node_selector = selector(&[("zone", "a")]);
    let split = chain(3, true);
    let mut port = chain(3, false);
    port.spec.port = Some(8080);
    let mut max = chain(3, false);
    max.spec.placement.max_per_node = Some(2);
    let mut port_and_max = max.clone();
    port_and_max.spec.port = Some(8080);
    let mut everything = chain(3, true);
    everything.spec.placement.node_selector = selector(&[("zone", "a")]);
    everything.spec.placement.max_per_node = Some(2);
    let rows = [
        (&plain, ""),
        (&selected, ", matches the node selector"),
        (&split, ", holds no other part of the same replica"),
        (&port, ", has port 8080 free"),
        (&max, ", runs fewer than 2 of its parts"),
        // A fixed port is what a node lacks first: max_per_node is not named then.
        (&port_and_max, ", has port 8080 free"),
        (
            &everything,
            ", matches the node selector, holds no other part of the same replica, runs \
             fewer than 2 of its parts",
        ),
    ];
    // Replica 1 misses two parts, replica 2 one: two of three replicas wait.
    let d = Decision {
        placed: vec![placed(0, 0, "a", Some(30100))],
        delete: Vec::new(),
        unplaced: vec![(1, 0), (1, 1), (2, 0)],
    };
    for (c, suffix) in rows {
        let got = placed_condition(c, &d);
        let want = format!(
            "1 of 3 replicas placed; no node can take replica 1 part 0, replica 1 part 1, \
             replica 2 part 0: {START}{suffix}"
        );
        assert_eq!(got.status, "False", "{suffix}");
        assert_eq!(got.reason, "Unschedulable", "{suffix}");
        assert_eq!(got.message, want);
    }
}

#[test]
fn the_ready_condition_is_all_ready_or_says_why_not() {
    let two = chain(2, false);
    let endpoints_of = |ready: &[bool]| -> Vec<ReplicaEndpoint> {
        ready
            .iter()
            .enumerate()
            .map(|(i, &ready)| ReplicaEndpoint {
                replica: i as u32,
                ready,
                ..Default::default()
            })
            .collect()
    };
    let running = arcs(vec![part(0, 0, "a"), part(1, 0, "b")]);
    let mut broken = part(1, 0, "b");
    broken.status = Some(ChainPartStatus {
        phase: "Failed".into(),
        message: "exclaim exited with status 1".into(),
        ..Default::default()
    });
    let failed = arcs(vec![part(0, 0, "a"), broken.clone()]);
    // The failure was of the part's spec before (it has been changed since), or of a
    // replica a scale-down removes.
    let mut changed = broken.clone();
    changed.metadata.generation = Some(2);
    changed.status.as_mut().unwrap().observed_generation = Some(1);
    let stale = arcs(vec![part(0, 0, "a"), changed]);
    let mut removed = broken;
    removed.spec.replica = 2;
    let gone = arcs(vec![part(0, 0, "a"), part(1, 0, "b"), removed]);
    let rows = [
        // (what, invalid, endpoints' readiness, parts, status, reason, message)
        (
            "every replica ready",
            false,
            endpoints_of(&[true, true]),
            &running,
            "True",
            "AllReady",
            "2 of 2 replicas ready",
        ),
        (
            "a replica not ready yet",
            false,
            endpoints_of(&[true, false]),
            &running,
            "False",
            "Starting",
            "1 of 2 replicas ready",
        ),
        (
            "a replica missing",
            false,
            endpoints_of(&[true]),
            &running,
            "False",
            "Starting",
            "1 of 2 replicas ready",
        ),
        (
            "a part failed",
            false,
            endpoints_of(&[true, false]),
            &failed,
            "False",
            "PartFailed",
            "1 of 2 replicas ready; exclaim exited with status 1",
        ),
        (
            "a failure of the part's spec before",
            false,
            endpoints_of(&[true, false]),
            &stale,
            "False",
            "Starting",
            "1 of 2 replicas ready",
        ),
        (
            "a scale-down from 3: the third replica still answers, and failed",
            false,
            endpoints_of(&[true, true, true]),
            &gone,
            "True",
            "AllReady",
            "2 of 2 replicas ready",
        ),
        (
            "the spec is invalid, though the parts before it still run",
            true,
            endpoints_of(&[true, true]),
            &failed,
            "False",
            "InvalidSpec",
            "2 of 2 replicas ready; exclaim exited with status 1",
        ),
    ];
    for (what, invalid, eps, parts, status, reason, message) in rows {
        let c = ready_condition(&two, invalid, &eps, parts);
        assert_eq!(
            (c.status.as_str(), c.reason.as_str(), c.message.as_str()),
            (status, reason, message),
            "{what}"
        );
    }
}

#[test]
fn the_valid_condition_carries_the_parsers_line() {
    let ok = valid_condition(None);
    assert_eq!(
        (ok.status.as_str(), ok.reason.as_str()),
        ("True", "SpecValid")
    );
    let bad = valid_condition(Some("spec.routes[0]: no"));
    assert_eq!(
        (
            bad.status.as_str(),
            bad.reason.as_str(),
            bad.message.as_str()
        ),
        ("False", "InvalidSpec", "spec.routes[0]: no")
    );
}

#[test]
fn a_warning_is_raised_once_per_change_and_never_for_starting() {
    let valid = cond("Valid", "True", "SpecValid");
    let invalid = cond("Valid", "False", "InvalidSpec");
    let unplaced = cond("Placed", "False", "Unschedulable");
    let starting = cond("Ready", "False", "Starting");
    let failed = cond("Ready", "False", "PartFailed");
    let not_ready = cond("Ready", "False", "InvalidSpec");
    let ready = cond("Ready", "True", "AllReady");
    let rows = [
        // (what, before, now, warnings)
        (
            "nothing reported before, all well",
            vec![],
            vec![valid.clone(), ready.clone()],
            vec![],
        ),
        (
            "nothing reported before, a new False condition",
            vec![],
            vec![invalid.clone()],
            vec![&invalid],
        ),
        (
            "the same False condition again: no second warning",
            vec![invalid.clone(), unplaced.clone()],
            vec![invalid.clone(), unplaced.clone()],
            vec![],
        ),
        (
            "the same status with another reason",
            vec![valid.clone(), failed.clone()],
            vec![valid.clone(), not_ready.clone()],
            vec![&not_ready],
        ),
        (
            "a condition not reported before",
            vec![valid.clone(), failed.clone()],
            vec![valid.clone(), unplaced.clone(), failed.clone()],
            vec![&unplaced],
        ),
        (
            "Starting is the way to Ready, not a warning",
            vec![valid.clone(), ready.clone()],
            vec![valid.clone(), starting.clone()],
            vec![],
        ),
        (
            "Starting then a part fails",
            vec![starting.clone()],
            vec![failed.clone()],
            vec![&failed],
        ),
        (
            "Ready then a part fails",
            vec![ready.clone()],
            vec![failed.clone()],
            vec![&failed],
        ),
        (
            "back to True raises nothing",
            vec![invalid.clone(), failed.clone()],
            vec![valid.clone(), ready.clone()],
            vec![],
        ),
    ];
    for (what, before, now, want) in &rows {
        assert_eq!(&warnings(before, now), want, "{what}");
    }
}

#[test]
fn carry_times_keeps_the_transition_time_while_the_status_is_unchanged() {
    let then = "2024-01-01T00:00:00Z";
    let now: jiff::Timestamp = "2025-06-01T12:00:00Z".parse().unwrap();
    let mut old_valid = cond("Valid", "True", "SpecValid");
    old_valid.last_transition_time = Some(then.into());
    let mut old_ready = cond("Ready", "False", "Starting");
    old_ready.last_transition_time = Some(then.into());
    let old = [old_valid, old_ready];
    let new = vec![
        cond("Valid", "True", "SpecValid"),
        cond("Placed", "True", "AllPlaced"),
        // Another reason, the same status: still no transition.
        cond("Ready", "False", "PartFailed"),
    ];
    let carried = carry_times(&old, new, 7, now);
    let times: Vec<_> = carried
        .iter()
        .map(|c| (c.type_.as_str(), c.last_transition_time.as_deref()))
        .collect();
    assert_eq!(
        times,
        vec![
            ("Valid", Some(then)),
            ("Placed", Some("2025-06-01T12:00:00Z")),
            ("Ready", Some(then)),
        ]
    );
    assert!(carried.iter().all(|c| c.observed_generation == Some(7)));
    let flipped = carry_times(&old, vec![cond("Ready", "True", "AllReady")], 7, now);
    assert_eq!(
        flipped[0].last_transition_time.as_deref(),
        Some("2025-06-01T12:00:00Z"),
        "a status that changed takes the time of now"
    );
}

#[test]
fn the_status_counts_placed_and_ready_replicas_and_keeps_the_transition_times() {
    let c = chain(3, false);
    let mut kept = cond("Ready", "False", "Starting");
    kept.last_transition_time = Some("2024-01-01T00:00:00Z".into());
    let old = ChainStatus {
        conditions: vec![kept],
        ..Default::default()
    };
    let eps = vec![
        ReplicaEndpoint {
            replica: 0,
            ready: true,
            ..Default::default()
        },
        ReplicaEndpoint {
            replica: 1,
            ..Default::default()
        },
    ];
    let now = "2025-06-01T12:00:00Z".parse().unwrap();
    let s = status(&c, &old, vec![cond("Ready", "False", "Starting")], eps, now);
    assert_eq!(s.observed_generation, Some(GENERATION));
    assert_eq!((s.replicas, s.ready_replicas), (2, 1));
    assert_eq!(
        s.conditions[0].last_transition_time.as_deref(),
        Some("2024-01-01T00:00:00Z")
    );
}

#[test]
fn an_endpoint_is_ready_when_every_part_runs_the_current_spec_on_a_live_node() {
    let both = alive(&["a", "b"]);
    let only_a = alive(&["a"]);
    let old_spec = |mut p: ChainPart| {
        p.spec.chain_generation = GENERATION - 1;
        p
    };
    let phase = |phase: &str, ready: bool, mut p: ChainPart| {
        let s = p.status.as_mut().unwrap();
        s.phase = phase.into();
        s.ready = ready;
        p
    };
    let unobserved = |mut p: ChainPart| {
        p.metadata.generation = Some(2);
        p
    };
    let rows = [
        // (what, parts of replica 0, heartbeats, ready, serving)
        (
            "every part runs the current spec",
            vec![part(0, 0, "a"), part(0, 1, "b")],
            &both,
            true,
            true,
        ),
        (
            "a part's node lost its heartbeat",
            vec![part(0, 0, "a"), part(0, 1, "b")],
            &only_a,
            false,
            false,
        ),
        (
            "a part still runs the spec before: serving, not ready",
            vec![part(0, 0, "a"), old_spec(part(0, 1, "b"))],
            &both,
            false,
            true,
        ),
        (
            "a part updating: the version before serves",
            vec![part(0, 0, "a"), phase("Updating", true, part(0, 1, "b"))],
            &both,
            false,
            true,
        ),
        (
            "a part whose daemon has not seen its change yet",
            vec![part(0, 0, "a"), unobserved(part(0, 1, "b"))],
            &both,
            false,
            true,
        ),
        (
            "a part starting",
            vec![part(0, 0, "a"), phase("Starting", false, part(0, 1, "b"))],
            &both,
            false,
            false,
        ),
        ("a part missing", vec![part(0, 0, "a")], &both, false, false),
    ];
    let c = chain(1, true);
    for (what, parts, hb, ready, serving) in rows {
        let eps = endpoints(&c, &arcs(parts), hb, 2);
        assert_eq!(eps.len(), 1, "{what}");
        assert_eq!((eps[0].ready, eps[0].serving), (ready, serving), "{what}");
    }
}

#[test]
fn endpoints_list_replicas_with_a_gateway_at_their_nodes_address() {
    let c = chain(3, true);
    let mut leaving = part(2, 0, "a");
    leaving.metadata.deletion_timestamp = Some(Time(Default::default()));
    let mut gateway = part(0, 0, "a");
    gateway.spec.functions = vec!["upper".into()];
    let mut other = part(0, 0, "b");
    other.spec.chain = "other".into();
    let parts = arcs(vec![
        part(0, 1, "b"),
        gateway,
        // Replica 1 has no gateway part: no endpoint.
        part(1, 1, "b"),
        leaving,
    ]);
    let eps = endpoints(&c, &parts, &alive(&["a", "b"]), 2);
    assert_eq!(eps.len(), 1);
    let e = &eps[0];
    assert_eq!(
        (e.replica, e.node.as_str(), e.address.as_str(), e.port),
        (0, "a", "addr-a", 30100)
    );
    let nodes: Vec<_> = e.parts.iter().map(|p| p.node.as_str()).collect();
    assert_eq!(nodes, vec!["a", "b"], "the gateway's part first");
    assert_eq!(e.parts[0].functions, vec!["upper".to_string()]);
    assert!(e.parts.iter().all(|p| p.ready));
    let whole = endpoints(
        &chain(1, false),
        &arcs(vec![part(0, 0, "a")]),
        &alive(&[]),
        1,
    );
    assert_eq!(whole[0].address, "", "no heartbeat, no address");
    assert!(whole[0].parts.is_empty(), "a whole replica lists no parts");
}

#[test]
fn a_deleted_part_says_why_it_goes() {
    let c = chain(2, false);
    let gone = |replica: u32, node: &str| Existing {
        name: format!("c-{replica}-0"),
        replica,
        part: 0,
        node: node.into(),
        port: None,
    };
    let hb = alive(&["a"]);
    let rows = [
        (
            gone(0, "lost"),
            EventType::Warning,
            "replica 0 part 0 leaves node lost: its zerohop daemon's heartbeat stopped",
        ),
        // A lost heartbeat is named before a scale down.
        (
            gone(3, "lost"),
            EventType::Warning,
            "replica 3 part 0 leaves node lost: its zerohop daemon's heartbeat stopped",
        ),
        (
            gone(2, "a"),
            EventType::Normal,
            "replica 2 part 0 removed: scaled down",
        ),
        (
            gone(1, "a"),
            EventType::Normal,
            "replica 1 part 0 leaves node a: the node no longer qualifies",
        ),
    ];
    for (e, type_, why) in rows {
        assert_eq!(why_deleted(&c, &e, &hb), (type_, why.to_string()));
    }
}

#[test]
fn a_parts_peers_are_the_other_parts_of_its_replica_at_their_daemons() {
    let mut c = chain(2, true);
    c.spec.port = Some(8080);
    let d = Decision {
        placed: vec![
            placed(0, 0, "a", Some(8080)),
            placed(0, 1, "b", None),
            placed(1, 0, "b", Some(8080)),
            placed(1, 1, "lost", None),
        ],
        ..Default::default()
    };
    let functions = split_functions(&c);
    let hb = alive(&["a", "b"]);
    let spec = part_spec(&c, &d, &d.placed[2], &hb, &functions);
    assert_eq!(
        (
            spec.chain.as_str(),
            spec.chain_generation,
            spec.replica,
            spec.part
        ),
        ("c", GENERATION, 1, 0)
    );
    assert_eq!((spec.node.as_str(), spec.port), ("b", Some(8080)));
    assert_eq!(spec.functions, vec!["upper".to_string()]);
    assert_eq!(spec.template, c.spec.chain);
    assert_eq!(
        spec.peers,
        vec![Peer {
            part: 1,
            node: "lost".into(),
            address: String::new(),
            functions: vec!["exclaim".into()],
        }],
        "a peer whose heartbeat is not seen has no address yet"
    );
    let spec = part_spec(&c, &d, &d.placed[1], &hb, &functions);
    assert_eq!(spec.peers[0].address, "peer-a");
}

#[test]
fn a_new_part_is_announced_with_its_port_and_named_after_its_place() {
    let c = chain(1, true);
    let gw = placed(0, 0, "a", Some(30100));
    assert_eq!(
        placed_note(&gw),
        "replica 0 part 0 placed on node a, port 30100"
    );
    let inner = placed(0, 1, "b", None);
    assert_eq!(placed_note(&inner), "replica 0 part 1 placed on node b");
    assert_eq!(part_name(&c, &inner), "c-0-1");
    let kept = Placed {
        existing: Some("c-0-1-old".into()),
        ..inner
    };
    assert_eq!(part_name(&c, &kept), "c-0-1-old");
    let spec = part_spec(
        &c,
        &Decision::default(),
        &kept,
        &alive(&[]),
        &split_functions(&c),
    );
    let body = part_object(&c, &kept, &spec);
    assert_eq!(body["metadata"]["name"], "c-0-1-old");
    assert_eq!(body["metadata"]["namespace"], "ns");
    assert_eq!(
        body["metadata"]["labels"],
        json!({ LABEL_CHAIN: "c", LABEL_NODE: "b", LABEL_REPLICA: "0" })
    );
    assert_eq!(body["metadata"]["ownerReferences"][0]["uid"], "uid-c");
    assert_eq!(body["spec"]["node"], "b");
}

#[test]
fn part_zero_runs_the_functions_no_part_lists() {
    let mut c = chain(1, false);
    assert_eq!(
        split_functions(&c),
        vec![vec!["exclaim".to_string(), "upper".to_string()]]
    );
    c.spec.placement.parts = vec![vec!["exclaim".into()]];
    assert_eq!(
        split_functions(&c),
        vec![vec!["upper".to_string()], vec!["exclaim".to_string()]]
    );
}

#[test]
fn a_chains_parts_are_those_naming_it_in_its_namespace() {
    let c = chain(1, false);
    let mut elsewhere = part(0, 0, "a");
    elsewhere.metadata.namespace = Some("other".into());
    let mut another = part(0, 1, "a");
    another.spec.chain = "d".into();
    let all = arcs(vec![part(0, 0, "a"), elsewhere, another, part(1, 0, "b")]);
    let mine: Vec<_> = parts_of(&c, all)
        .iter()
        .map(|p| (p.spec.replica, p.spec.part))
        .collect();
    assert_eq!(mine, vec![(0, 0), (1, 0)]);
}

#[test]
fn validate_names_the_field_of_the_chain_that_is_wrong() {
    let unknown_in_route = {
        let mut c = chain(1, false);
        c.spec.chain["routes"][0]["sequence"] = json!(["upper", "shout"]);
        c
    };
    let unknown_in_part = {
        let mut c = chain(1, false);
        c.spec.placement.parts = vec![vec!["shout".into()]];
        c
    };
    let in_two_parts = {
        let mut c = chain(1, false);
        c.spec.placement.parts = vec![vec!["exclaim".into()], vec!["exclaim".into()]];
        c
    };
    let rows = [
        (chain(1, true), None),
        (unknown_in_route, Some("spec.routes[0].sequence[1]: ")),
        (
            unknown_in_part,
            Some("spec.placement.parts[0][0]: unknown function `shout`"),
        ),
        (
            in_two_parts,
            Some(
                "spec.placement.parts[1][0]: function `exclaim` is in two parts; a function \
                 runs in one",
            ),
        ),
    ];
    for (c, want) in rows {
        let got = validate("ns", &c);
        match want {
            None => assert_eq!(got, None),
            Some(start) => {
                let got = got.expect(start);
                assert!(got.starts_with(start), "{got}");
            }
        }
    }
}

#[test]
fn the_service_is_applied_when_missing_or_when_what_the_controller_owns_of_it_changed() {
    use k8s_openapi::api::core::v1::Service;
    let c = chain(2, false);
    let want = service(&c);
    let applied: Service = serde_json::from_value(want.clone()).expect("a Service");
    assert!(service_needs_apply(&c, &want, None), "missing");
    assert!(
        !service_needs_apply(&c, &want, Some(&applied)),
        "as applied"
    );
    let mut other_port = applied.clone();
    other_port.spec.as_mut().unwrap().ports.as_mut().unwrap()[0].port = 81;
    assert!(
        service_needs_apply(&c, &want, Some(&other_port)),
        "port changed"
    );
    let mut unlabelled = applied.clone();
    unlabelled
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .remove(LABEL_CHAIN);
    assert!(
        service_needs_apply(&c, &want, Some(&unlabelled)),
        "label removed"
    );
    let mut relabelled = applied.clone();
    relabelled
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .insert(LABEL_CHAIN.into(), "other".into());
    assert!(
        service_needs_apply(&c, &want, Some(&relabelled)),
        "label changed"
    );
    let mut orphan = applied.clone();
    orphan.metadata.owner_references = None;
    assert!(
        service_needs_apply(&c, &want, Some(&orphan)),
        "owner reference removed"
    );
    let mut extra = applied;
    extra
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .insert("team".into(), "a".into());
    assert!(
        !service_needs_apply(&c, &want, Some(&extra)),
        "a label of someone else's is theirs"
    );
}

#[test]
fn a_service_has_one_slice_per_port_and_family_of_replicas_with_an_address() {
    let mut c = chain(4, false);
    assert_eq!(service(&c)["spec"]["ports"][0]["port"], 80);
    c.spec.port = Some(8080);
    assert_eq!(service(&c)["spec"]["ports"][0]["port"], 8080);
    assert_eq!(service(&c)["metadata"]["labels"][LABEL_CHAIN], "c");
    let ep = |replica: u32, node: &str, address: &str, port: u16, serving: bool| ReplicaEndpoint {
        replica,
        node: node.into(),
        address: address.into(),
        port,
        serving,
        ..Default::default()
    };
    let eps = [
        ep(0, "a", "10.0.0.1", 8080, true),
        ep(1, "b", "10.0.0.2", 8080, false),
        ep(2, "c", "fd00::3", 8080, true),
        ep(3, "d", "", 8080, true),
    ];
    let s = slices(&c, &eps);
    assert_eq!(
        s.keys().collect::<Vec<_>>(),
        vec!["c-8080-ipv4", "c-8080-ipv6"]
    );
    let v4 = &s["c-8080-ipv4"];
    assert_eq!(v4["addressType"], "IPv4");
    assert_eq!(v4["metadata"]["labels"]["kubernetes.io/service-name"], "c");
    assert_eq!(v4["ports"][0]["port"], 8080);
    assert_eq!(
        v4["endpoints"],
        json!([
            {
                "addresses": ["10.0.0.1"],
                "conditions": { "ready": true, "serving": true, "terminating": false },
                "nodeName": "a",
            },
            {
                "addresses": ["10.0.0.2"],
                "conditions": { "ready": false, "serving": false, "terminating": false },
                "nodeName": "b",
            },
        ])
    );
    assert_eq!(s["c-8080-ipv6"]["endpoints"][0]["nodeName"], "c");
}
