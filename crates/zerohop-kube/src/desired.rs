//! What a Chain's parts, status, Service endpoints and events should be, as pure functions
//! of what the controller read (the Chain, the ChainParts, the Nodes, the daemons'
//! heartbeats, and the placement [`Decision`]), so that they can be tested without a
//! cluster. The controller gathers their inputs and carries out what they return.
//!
//! A Chain's status has three conditions, in order: `Valid` (zerohop's parser accepts the
//! spec), `Placed` (every part of every replica has a node) and `Ready` (every replica's
//! parts run the Chain's current spec). A condition that is False raises one Warning event
//! when its status or reason changes, never once a second, and never for `Starting`: that is
//! the normal way to Ready.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use serde_json::{json, Value};

use crate::placement::{Decision, Existing, NodeInfo, Placed, Want};
use crate::resources::{
    chain_text, local_name, spec_error, Chain, ChainPart, ChainPartSpec, ChainStatus, Condition,
    PartEndpoint, Peer, ReplicaEndpoint, LABEL_CHAIN, LABEL_NODE, LABEL_REPLICA, MANAGER,
};

#[cfg(test)]
mod tests;

/// A node's heartbeat as the controller reads it.
#[derive(Clone, Debug, Default)]
pub(crate) struct Heartbeat {
    /// Where its gateways listen.
    pub(crate) address: String,
    /// Where its daemon takes peer connections.
    pub(crate) peer: String,
}

/// Checks a Chain's spec with zerohop's own parser; `None` when valid, else one line
/// naming the field as a path of the Chain (`spec.routes[0].sequence[1]: ...`).
pub fn validate(namespace: &str, chain: &Chain) -> Option<String> {
    let local = local_name(namespace, &chain.name_any(), 0);
    let text = chain_text(&local, &chain.spec.chain);
    if let Err(e) = zerohop_spec::parse(Path::new("/chain.yaml"), &text) {
        return Some(spec_error(&e));
    }
    let functions = chain
        .spec
        .chain
        .get("functions")
        .and_then(|f| f.as_object())
        .map(|f| f.keys().cloned().collect::<BTreeSet<_>>())
        .unwrap_or_default();
    let mut seen = BTreeSet::new();
    for (i, part) in chain.spec.placement.parts.iter().enumerate() {
        for (j, f) in part.iter().enumerate() {
            if !functions.contains(f) {
                return Some(format!(
                    "spec.placement.parts[{i}][{j}]: unknown function `{f}`"
                ));
            }
            if !seen.insert(f.clone()) {
                return Some(format!(
                    "spec.placement.parts[{i}][{j}]: function `{f}` is in two parts; a function runs in one"
                ));
            }
        }
    }
    None
}

/// The parts of `chain` among `parts`.
pub(crate) fn parts_of(
    chain: &Chain,
    parts: impl IntoIterator<Item = Arc<ChainPart>>,
) -> Vec<Arc<ChainPart>> {
    let ns = chain.namespace();
    let name = chain.name_any();
    parts
        .into_iter()
        .filter(|p| p.namespace() == ns && p.spec.chain == name)
        .collect()
}

/// Per part number, the functions it runs: part 0 what no `placement.parts` list names.
pub(crate) fn split_functions(chain: &Chain) -> Vec<Vec<String>> {
    let all: Vec<String> = chain
        .spec
        .chain
        .get("functions")
        .and_then(|f| f.as_object())
        .map(|f| f.keys().cloned().collect())
        .unwrap_or_default();
    let listed: BTreeSet<&String> = chain.spec.placement.parts.iter().flatten().collect();
    let mut parts = vec![all
        .iter()
        .filter(|f| !listed.contains(f))
        .cloned()
        .collect()];
    parts.extend(chain.spec.placement.parts.iter().cloned());
    parts
}

/// What `chain` asks of placement.
pub(crate) fn want(chain: &Chain) -> Want {
    Want {
        replicas: chain.spec.replicas,
        parts: 1 + chain.spec.placement.parts.len() as u32,
        port: chain.spec.port,
        max_per_node: chain.spec.placement.max_per_node,
    }
}

/// A Chain's parts as placement sees them.
pub(crate) fn existing(mine: &[Arc<ChainPart>]) -> Vec<Existing> {
    mine.iter()
        .map(|p| Existing {
            name: p.name_any(),
            replica: p.spec.replica,
            part: p.spec.part,
            node: p.spec.node.clone(),
            port: p.spec.port,
        })
        .collect()
}

/// Whether a Chain with node selector `selector` may have a part on `node`: the node has
/// the labels, is schedulable, its kubelet reports Ready, and its zerohop daemon is `alive`.
pub(crate) fn eligible(
    node: &Node,
    selector: &BTreeMap<String, String>,
    alive: &BTreeMap<String, Heartbeat>,
) -> bool {
    let labels = node.labels();
    let selected = selector.iter().all(|(k, v)| labels.get(k) == Some(v));
    let schedulable = !node
        .spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false);
    // A node whose kubelet reports NotReady, or stopped reporting (Unknown), is lost even if
    // the daemon's heartbeat still reaches the API server.
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
        .is_none_or(|c| c.status == "True");
    selected && schedulable && ready && alive.contains_key(&node.name_any())
}

/// `nodes` as placement sees them for `chain`, by name: whether eligible, and the parts and
/// gateway ports of every Chain on them (`all_parts`, and `placed_now`: parts placed in
/// this pass, not yet in the cache).
pub(crate) fn node_infos(
    chain: &Chain,
    nodes: &[Arc<Node>],
    alive: &BTreeMap<String, Heartbeat>,
    all_parts: &[Arc<ChainPart>],
    placed_now: &[(String, Option<u16>)],
) -> Vec<NodeInfo> {
    let mut infos: Vec<NodeInfo> = nodes
        .iter()
        .map(|n| NodeInfo {
            name: n.name_any(),
            eligible: eligible(n, &chain.spec.placement.node_selector, alive),
            parts: 0,
            ports: BTreeSet::new(),
        })
        .collect();
    infos.sort_by(|a, b| a.name.cmp(&b.name));
    let taken = all_parts
        .iter()
        .map(|p| (&p.spec.node, p.spec.port))
        .chain(placed_now.iter().map(|(n, p)| (n, *p)));
    for (node, port) in taken {
        if let Some(n) = infos.iter_mut().find(|n| &n.name == node) {
            n.parts += 1;
            if let Some(port) = port {
                n.ports.insert(port);
            }
        }
    }
    infos
}

/// Why placement deletes part `e` of `chain`, as the note of a `Moved` event, and the
/// event's type: a Warning when its node's daemon stopped (`alive` lacks it), else Normal
/// (the Chain has fewer replicas now, or the node no longer qualifies).
pub(crate) fn why_deleted(
    chain: &Chain,
    e: &Existing,
    alive: &BTreeMap<String, Heartbeat>,
) -> (EventType, String) {
    if !alive.contains_key(&e.node) {
        let why = format!(
            "replica {} part {} leaves node {}: its zerohop daemon's heartbeat stopped",
            e.replica, e.part, e.node
        );
        (EventType::Warning, why)
    } else if e.replica >= chain.spec.replicas {
        let why = format!("replica {} part {} removed: scaled down", e.replica, e.part);
        (EventType::Normal, why)
    } else {
        let why = format!(
            "replica {} part {} leaves node {}: the node no longer qualifies",
            e.replica, e.part, e.node
        );
        (EventType::Normal, why)
    }
}

/// The spec of part `p` of `chain`: its peers are the other parts of its replica in
/// `decision`, each with its node's peer address (empty while its heartbeat is not seen);
/// `part_functions` is [`split_functions`].
pub(crate) fn part_spec(
    chain: &Chain,
    decision: &Decision,
    p: &Placed,
    alive: &BTreeMap<String, Heartbeat>,
    part_functions: &[Vec<String>],
) -> ChainPartSpec {
    let peers: Vec<Peer> = decision
        .placed
        .iter()
        .filter(|o| o.replica == p.replica && o.part != p.part)
        .map(|o| Peer {
            part: o.part,
            node: o.node.clone(),
            address: alive
                .get(&o.node)
                .map(|h| h.peer.clone())
                .unwrap_or_default(),
            functions: part_functions[o.part as usize].clone(),
        })
        .collect();
    ChainPartSpec {
        chain: chain.name_any(),
        chain_generation: chain.metadata.generation.unwrap_or(0),
        replica: p.replica,
        part: p.part,
        node: p.node.clone(),
        port: p.port,
        functions: part_functions[p.part as usize].clone(),
        peers,
        template: chain.spec.chain.clone(),
    }
}

/// The note of the `Placed` event for a new part.
pub(crate) fn placed_note(p: &Placed) -> String {
    format!(
        "replica {} part {} placed on node {}{}",
        p.replica,
        p.part,
        p.node,
        p.port
            .map_or(String::new(), |port| format!(", port {port}"))
    )
}

/// The name of part `p`'s object: the existing one's, else `CHAIN-REPLICA-PART`.
pub(crate) fn part_name(chain: &Chain, p: &Placed) -> String {
    p.existing
        .clone()
        .unwrap_or_else(|| format!("{}-{}-{}", chain.name_any(), p.replica, p.part))
}

/// The ChainPart object the controller applies for part `p` of `chain`, with `spec`.
pub(crate) fn part_object(chain: &Chain, p: &Placed, spec: &ChainPartSpec) -> Value {
    let owner = chain
        .controller_owner_ref(&())
        .expect("a Chain from the API has a uid");
    json!({
        "apiVersion": "zerohop.dev/v1alpha1",
        "kind": "ChainPart",
        "metadata": {
            "name": part_name(chain, p),
            "namespace": chain.namespace().unwrap_or_default(),
            "labels": {
                LABEL_CHAIN: chain.name_any(),
                LABEL_NODE: p.node,
                LABEL_REPLICA: p.replica.to_string(),
            },
            "ownerReferences": [owner],
        },
        "spec": spec,
    })
}

/// The replicas as the status shows them: every replica with a gateway part.
pub(crate) fn endpoints(
    chain: &Chain,
    parts: &[Arc<ChainPart>],
    alive: &BTreeMap<String, Heartbeat>,
    nparts: u32,
) -> Vec<ReplicaEndpoint> {
    let generation = chain.metadata.generation.unwrap_or(0);
    // Serving: its daemon runs it, whatever spec (a node applies a change while the spec
    // before goes on answering, so an edit or a scale costs the Service no endpoint).
    let serving = |p: &ChainPart| {
        p.status.as_ref().is_some_and(|s| s.ready) && alive.contains_key(&p.spec.node)
    };
    // Current: running the Chain's spec of now.
    let current = |p: &ChainPart| {
        serving(p)
            && p.spec.chain_generation == generation
            && p.status.as_ref().is_some_and(|s| {
                s.phase == "Running" && s.observed_generation == p.metadata.generation
            })
    };
    let mut by_replica: BTreeMap<u32, Vec<&ChainPart>> = BTreeMap::new();
    for p in parts {
        if p.metadata.deletion_timestamp.is_none() {
            by_replica.entry(p.spec.replica).or_default().push(p);
        }
    }
    let mut out = Vec::new();
    for (replica, mut ps) in by_replica {
        ps.sort_by_key(|p| p.spec.part);
        let Some(gw) = ps.iter().find(|p| p.spec.part == 0) else {
            continue;
        };
        let whole = ps.len() as u32 == nparts;
        let ready = whole && ps.iter().all(|p| current(p));
        out.push(ReplicaEndpoint {
            replica,
            node: gw.spec.node.clone(),
            address: alive
                .get(&gw.spec.node)
                .map(|h| h.address.clone())
                .unwrap_or_default(),
            port: gw.spec.port.unwrap_or(0),
            ready,
            serving: whole && ps.iter().all(|p| serving(p)),
            parts: if nparts > 1 {
                ps.iter()
                    .map(|p| PartEndpoint {
                        node: p.spec.node.clone(),
                        functions: p.spec.functions.clone(),
                        ready: current(p),
                    })
                    .collect()
            } else {
                Vec::new()
            },
        });
    }
    out
}

/// The Chain's Service: selector-less (its EndpointSlices are [`slices`]), on port 80 or
/// the Chain's port.
pub(crate) fn service(chain: &Chain) -> Value {
    let name = chain.name_any();
    let owner = chain
        .controller_owner_ref(&())
        .expect("a Chain from the API has a uid");
    let labels = json!({
        LABEL_CHAIN: name,
        "app.kubernetes.io/managed-by": "zerohop",
    });
    json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": name,
            "namespace": chain.namespace().unwrap_or_default(),
            "labels": labels,
            "ownerReferences": [owner],
        },
        "spec": {
            "type": "ClusterIP",
            "ports": [{ "name": "http", "protocol": "TCP", "port": service_port(chain) }],
        },
    })
}

/// Whether the Chain's Service (`want`, its [`service`]) must be applied: it is missing, or
/// someone changed what the controller owns of it (its port, its labels, its owner reference
/// to the Chain).
pub(crate) fn service_needs_apply(
    chain: &Chain,
    want: &Value,
    current: Option<&k8s_openapi::api::core::v1::Service>,
) -> bool {
    let Some(current) = current else {
        return true;
    };
    let port = current
        .spec
        .as_ref()
        .and_then(|s| s.ports.as_ref())
        .and_then(|p| p.first())
        .map(|p| p.port);
    let labels_kept = want["metadata"]["labels"]
        .as_object()
        .into_iter()
        .flatten()
        .all(|(k, v)| current.labels().get(k).map(String::as_str) == v.as_str());
    let owned = chain.uid().is_some_and(|uid| {
        current
            .owner_references()
            .iter()
            .any(|o| o.uid == uid && o.controller == Some(true))
    });
    port != Some(i32::from(service_port(chain))) || !labels_kept || !owned
}

/// The port of the Chain's Service.
pub(crate) fn service_port(chain: &Chain) -> u16 {
    chain.spec.port.unwrap_or(80)
}

/// The EndpointSlices of the Chain's Service, by name: one per (gateway port, address
/// family) its replicas use, leaving out replicas whose node published no address yet.
pub(crate) fn slices(chain: &Chain, endpoints: &[ReplicaEndpoint]) -> BTreeMap<String, Value> {
    let name = chain.name_any();
    let owner = chain
        .controller_owner_ref(&())
        .expect("a Chain from the API has a uid");
    let mut groups: BTreeMap<(u16, &str), Vec<&ReplicaEndpoint>> = BTreeMap::new();
    for e in endpoints.iter().filter(|e| !e.address.is_empty()) {
        let family = if e.address.contains(':') {
            "IPv6"
        } else {
            "IPv4"
        };
        groups.entry((e.port, family)).or_default().push(e);
    }
    let mut wanted = BTreeMap::new();
    for ((port, family), eps) in groups {
        let slice = format!("{name}-{port}-{}", family.to_ascii_lowercase());
        let body = json!({
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": slice,
                "namespace": chain.namespace().unwrap_or_default(),
                "labels": {
                    "kubernetes.io/service-name": name,
                    "endpointslice.kubernetes.io/managed-by": MANAGER,
                    LABEL_CHAIN: name,
                },
                "ownerReferences": [owner],
            },
            "addressType": family,
            "ports": [{ "name": "http", "protocol": "TCP", "port": port }],
            "endpoints": eps.iter().map(|e| json!({
                "addresses": [e.address],
                "conditions": { "ready": e.serving, "serving": e.serving, "terminating": false },
                "nodeName": e.node,
            })).collect::<Vec<_>>(),
        });
        wanted.insert(slice, body);
    }
    wanted
}

/// A condition as it is decided, before [`carry_times`].
pub(crate) fn condition(type_: &str, ok: bool, reason: &str, message: &str) -> Condition {
    Condition {
        type_: type_.into(),
        status: if ok { "True" } else { "False" }.into(),
        reason: reason.into(),
        message: message.into(),
        observed_generation: None,
        last_transition_time: None,
    }
}

/// `Valid`, from [`validate`]'s answer.
pub(crate) fn valid_condition(invalid: Option<&str>) -> Condition {
    match invalid {
        None => condition("Valid", true, "SpecValid", "the chain spec is valid"),
        Some(m) => condition("Valid", false, "InvalidSpec", m),
    }
}

/// `Placed`, from placement's `decision` for `chain`: how many replicas have every part on
/// a node, and for the others, what a node needs to take them.
pub(crate) fn placed_condition(chain: &Chain, decision: &Decision) -> Condition {
    let replicas = chain.spec.replicas;
    let waiting: BTreeSet<u32> = decision.unplaced.iter().map(|u| u.0).collect();
    let placed = replicas - waiting.len() as u32;
    if decision.unplaced.is_empty() {
        return condition(
            "Placed",
            true,
            "AllPlaced",
            &format!("{placed} of {replicas} replicas placed"),
        );
    }
    let message = format!(
        "{placed} of {replicas} replicas placed; no node can take {}: it needs a node whose \
         zerohop daemon is alive, that is Ready and schedulable{}{}{}",
        decision
            .unplaced
            .iter()
            .map(|(r, p)| format!("replica {r} part {p}"))
            .collect::<Vec<_>>()
            .join(", "),
        if chain.spec.placement.node_selector.is_empty() {
            String::new()
        } else {
            ", matches the node selector".into()
        },
        if want(chain).parts > 1 {
            ", holds no other part of the same replica"
        } else {
            ""
        },
        match (chain.spec.port, chain.spec.placement.max_per_node) {
            (Some(p), _) => format!(", has port {p} free"),
            (None, Some(m)) => format!(", runs fewer than {m} of its parts"),
            (None, None) => String::new(),
        }
    );
    condition("Placed", false, "Unschedulable", &message)
}

/// `Ready`, from the replicas' `endpoints` and the Chain's `parts`: AllReady, else
/// InvalidSpec when the spec is `invalid`, PartFailed (with the first failed part's message)
/// when a part failed, Starting otherwise. Only the wanted replicas count (one being removed
/// after a scale-down is neither ready nor failed), and only a failure of a part's current
/// spec (a status that describes a generation before is stale).
pub(crate) fn ready_condition(
    chain: &Chain,
    invalid: bool,
    endpoints: &[ReplicaEndpoint],
    parts: &[Arc<ChainPart>],
) -> Condition {
    let replicas = chain.spec.replicas;
    let ready = endpoints
        .iter()
        .filter(|e| e.ready && e.replica < replicas)
        .map(|e| e.replica)
        .collect::<BTreeSet<_>>()
        .len() as u32;
    if ready == replicas && !invalid {
        return condition(
            "Ready",
            true,
            "AllReady",
            &format!("{ready} of {replicas} replicas ready"),
        );
    }
    let why = parts
        .iter()
        .filter(|p| p.spec.replica < replicas)
        .filter_map(|p| {
            let s = p.status.as_ref()?;
            let current =
                s.observed_generation.is_none() || s.observed_generation == p.metadata.generation;
            (s.phase == "Failed" && current).then_some(s)
        })
        .next()
        .map(|s| format!("; {}", s.message))
        .unwrap_or_default();
    let reason = if invalid {
        "InvalidSpec"
    } else if why.is_empty() {
        "Starting"
    } else {
        "PartFailed"
    };
    condition(
        "Ready",
        false,
        reason,
        &format!("{ready} of {replicas} replicas ready{why}"),
    )
}

/// The conditions that raise a Warning event: False, not `Starting`, and new or changed in
/// status or reason since `before` (the conditions last reported).
pub(crate) fn warnings<'a>(
    before: &[Condition],
    conditions: &'a [Condition],
) -> Vec<&'a Condition> {
    conditions
        .iter()
        .filter(|c| {
            let changed = before
                .iter()
                .find(|b| b.type_ == c.type_)
                .is_none_or(|b| b.status != c.status || b.reason != c.reason);
            changed && c.status == "False" && c.reason != "Starting"
        })
        .collect()
}

/// Sets each condition's generation, and its transition time: kept from `old` when the
/// status did not change, `now` otherwise.
pub(crate) fn carry_times(
    old: &[Condition],
    new: Vec<Condition>,
    generation: i64,
    now: jiff::Timestamp,
) -> Vec<Condition> {
    let now = now.to_string();
    new.into_iter()
        .map(|mut c| {
            c.observed_generation = Some(generation);
            c.last_transition_time = Some(
                old.iter()
                    .find(|o| o.type_ == c.type_ && o.status == c.status)
                    .and_then(|o| o.last_transition_time.clone())
                    .unwrap_or_else(|| now.clone()),
            );
            c
        })
        .collect()
}

/// The status of `chain` at `now`, given the one it has (`old`), the `conditions` decided
/// and the replicas' `endpoints`.
pub(crate) fn status(
    chain: &Chain,
    old: &ChainStatus,
    conditions: Vec<Condition>,
    endpoints: Vec<ReplicaEndpoint>,
    now: jiff::Timestamp,
) -> ChainStatus {
    let generation = chain.metadata.generation.unwrap_or(0);
    ChainStatus {
        observed_generation: Some(generation),
        replicas: endpoints.len() as u32,
        ready_replicas: endpoints.iter().filter(|e| e.ready).count() as u32,
        conditions: carry_times(&old.conditions, conditions, generation, now),
        endpoints,
    }
}
