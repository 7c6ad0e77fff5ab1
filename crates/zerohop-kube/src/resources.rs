//! The `zerohop.dev/v1alpha1` resources: [`Chain`] (what users write) and [`ChainPart`] (what
//! the controller asks one node's daemon to run). Their schemas live in
//! `deploy/kubernetes/1*-crd-*.yaml`, written by hand so that the API server's checks read
//! like the chain spec's documentation; these types are what the controller and the daemons
//! read and write, and `crates/zerohop-e2e/tests/kubernetes.rs` holds the two together
//! against a real API server.

use std::collections::BTreeMap;

use kube::CustomResource;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Label on every object the controller makes for a Chain: the Chain's name.
pub const LABEL_CHAIN: &str = "zerohop.dev/chain";
/// Label on a ChainPart: the node it runs on (the daemons select theirs by it).
pub const LABEL_NODE: &str = "zerohop.dev/node";
/// Label on a ChainPart: its replica's index.
pub const LABEL_REPLICA: &str = "zerohop.dev/replica";
/// Who manages the EndpointSlices of a Chain's Service (`endpointslice.kubernetes.io/managed-by`).
pub const MANAGER: &str = "controller.zerohop.dev";
/// The field manager the controller writes with.
pub const CONTROLLER_FIELD_MANAGER: &str = "zerohop-controller";
/// The field manager a node daemon writes with.
pub const NODE_FIELD_MANAGER: &str = "zerohop-node";
/// Annotation of a node's heartbeat lease: the address its gateways listen on.
pub const ANNOTATION_ADDRESS: &str = "zerohop.dev/address";
/// Annotation of a node's heartbeat lease: where its daemon takes peer connections
/// (`HOST:PORT`).
pub const ANNOTATION_PEER: &str = "zerohop.dev/peer";
/// Prefix of a node's heartbeat lease name: `zerohop-node-NODE`.
pub const NODE_LEASE_PREFIX: &str = "zerohop-node-";

/// The name of the heartbeat lease of node `node`.
pub fn node_lease_name(node: &str) -> String {
    format!("{NODE_LEASE_PREFIX}{node}")
}

/// A chain spec (docs/spec.md, without `name`) plus how many replicas run and where.
#[derive(CustomResource, Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[kube(
    group = "zerohop.dev",
    version = "v1alpha1",
    kind = "Chain",
    namespaced,
    status = "ChainStatus",
    schema = "disabled",
    shortname = "zc"
)]
pub struct ChainSpec {
    /// Copies of the whole chain, each with its own gateway.
    #[serde(default = "one")]
    pub replicas: u32,
    /// The port every replica's gateway listens on (`None`: the controller picks one per
    /// replica).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// Where replicas may run.
    #[serde(default, skip_serializing_if = "Placement::is_empty")]
    pub placement: Placement,
    /// The chain spec's own fields (`functions`, `routes`, `pool`, ...), as written.
    #[serde(flatten)]
    pub chain: Map<String, Value>,
}

fn one() -> u32 {
    1
}

/// Where a Chain's replicas may run.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Placement {
    /// Labels a node must have.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    /// At most this many replicas on one node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_per_node: Option<u32>,
    /// Functions that run on nodes of their own, one list per part.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parts: Vec<Vec<String>>,
}

impl Placement {
    fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// What the controller reports about a Chain.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ChainStatus {
    /// The Chain's generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Replicas placed on nodes.
    #[serde(default)]
    pub replicas: u32,
    /// Replicas whose every part runs the current spec.
    #[serde(default)]
    pub ready_replicas: u32,
    /// `Valid`, `Placed`, `Ready`.
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// Where each replica answers.
    #[serde(default)]
    pub endpoints: Vec<ReplicaEndpoint>,
}

/// A Kubernetes-style condition.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// What it is about (`Ready`).
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// One word, CamelCase.
    #[serde(default)]
    pub reason: String,
    /// One line for people.
    #[serde(default)]
    pub message: String,
    /// The generation it was computed for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// When `status` last changed (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<String>,
}

/// One replica of a Chain as the status shows it.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ReplicaEndpoint {
    /// Its index.
    pub replica: u32,
    /// The node of its gateway.
    pub node: String,
    /// The address its gateway listens on (empty until its node's daemon published one).
    #[serde(default)]
    pub address: String,
    /// Its gateway's port.
    pub port: u16,
    /// Every part runs the current spec and is ready.
    pub ready: bool,
    /// Every part is ready and its node alive, whatever spec it runs: the replica answers
    /// requests (while a changed spec rolls out, it goes on serving the one before).
    #[serde(default)]
    pub serving: bool,
    /// Its parts, the gateway's first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parts: Vec<PartEndpoint>,
}

/// One part of a split replica as the status shows it.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct PartEndpoint {
    /// Where it runs.
    pub node: String,
    /// What it runs.
    pub functions: Vec<String>,
    /// It runs the current spec.
    pub ready: bool,
}

/// One replica of a Chain, or one part of a split replica, placed on one node.
#[derive(CustomResource, Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[kube(
    group = "zerohop.dev",
    version = "v1alpha1",
    kind = "ChainPart",
    namespaced,
    status = "ChainPartStatus",
    schema = "disabled",
    shortname = "zcp"
)]
#[serde(rename_all = "camelCase")]
pub struct ChainPartSpec {
    /// The Chain (same namespace).
    pub chain: String,
    /// The Chain's `metadata.generation` this part was made from.
    #[serde(default)]
    pub chain_generation: i64,
    /// The replica's index.
    pub replica: u32,
    /// 0 runs the gateway; 1.. are the Chain's `placement.parts`, in order.
    pub part: u32,
    /// The node whose daemon runs it.
    pub node: String,
    /// Where part 0's gateway listens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// The functions this part runs.
    pub functions: Vec<String>,
    /// The replica's other parts.
    #[serde(default)]
    pub peers: Vec<Peer>,
    /// The Chain's spec (its `chain` fields).
    pub template: Map<String, Value>,
}

/// Another part of the same replica.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Peer {
    /// Its part number.
    pub part: u32,
    /// Its node.
    pub node: String,
    /// Its node daemon's peer address, `HOST:PORT` (empty until published).
    #[serde(default)]
    pub address: String,
    /// The functions it runs.
    #[serde(default)]
    pub functions: Vec<String>,
}

/// What a node's daemon reports about a part it runs.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ChainPartStatus {
    /// The part's `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Pending`, `Starting`, `Updating` (a version before runs and serves), `Running` or
    /// `Failed`.
    #[serde(default)]
    pub phase: String,
    /// It runs and answers (during `Updating`, and `Failed` after a refused change: the
    /// version before).
    #[serde(default)]
    pub ready: bool,
    /// `HOST:PORT` of part 0's gateway.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub address: String,
    /// Why it is not running, in one line.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// When `phase` last changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<String>,
}

/// The chain spec text (YAML; JSON is YAML) a part runs: the Chain's `template` under the
/// chain's node-local name `local` (see [`local_name`]).
pub fn chain_text(local: &str, template: &Map<String, Value>) -> String {
    let mut doc = Map::new();
    doc.insert("name".into(), Value::String(local.to_owned()));
    for (k, v) in template {
        if k != "name" {
            doc.insert(k.clone(), v.clone());
        }
    }
    serde_json::to_string_pretty(&Value::Object(doc)).expect("a JSON map serialises")
}

/// A spec error of a Chain's template, its field as a path of the Chain:
/// `spec.routes[0].sequence[1]: unknown function ...` (the generated text's file and line
/// mean nothing to the Chain's author).
pub fn spec_error(e: &zerohop_spec::SpecError) -> String {
    format!("spec.{}: {}", e.field, e.message)
}

/// The name a part's chain has on its node's daemon (`zerohop ls`): `NAMESPACE_CHAIN_REPLICA`
/// (a chain's name allows letters, digits, `-`, `_`), the namespace shortened and a hash
/// appended when it would pass 64 characters.
pub fn local_name(namespace: &str, chain: &str, replica: u32) -> String {
    let full = format!("{namespace}_{chain}_{replica}");
    if full.len() <= 64 {
        return full;
    }
    // FNV-1a: stable across versions and processes, unlike std's hasher.
    let hash = full.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    let tail = format!("_{chain}_{replica}_{:08x}", hash as u32);
    let keep = 64usize.saturating_sub(tail.len());
    format!("{}{tail}", &namespace[..keep.min(namespace.len())])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chain_reads_the_chain_fields_apart_from_its_own() {
        let c: ChainSpec = serde_json::from_value(serde_json::json!({
            "replicas": 3,
            "placement": { "nodeSelector": { "a": "b" }, "parts": [["exclaim"]] },
            "functions": { "upper": { "command": ["upper"] } },
            "routes": [ { "http": "POST /hello", "sequence": ["upper"] } ]
        }))
        .unwrap();
        assert_eq!(c.replicas, 3);
        assert_eq!(c.port, None);
        assert_eq!(c.placement.parts, vec![vec!["exclaim".to_string()]]);
        assert_eq!(
            c.chain.keys().collect::<Vec<_>>(),
            vec!["functions", "routes"]
        );
        let d: ChainSpec = serde_json::from_value(serde_json::json!({"functions": {}})).unwrap();
        assert_eq!(d.replicas, 1, "replicas default to 1");
    }

    #[test]
    fn the_chain_text_parses_as_a_chain_spec() {
        let template: Map<String, Value> = serde_json::from_value(serde_json::json!({
            "timeout": "5s",
            "gateway_threads": 1,
            "functions": { "upper": { "command": ["/bin/true"], "instances": 2 } },
            "routes": [ { "http": "POST /hello", "sequence": ["upper"] } ]
        }))
        .unwrap();
        let text = chain_text("default_hello_0", &template);
        let spec = zerohop_spec::parse(std::path::Path::new("/x/hello.yaml"), &text)
            .expect("the JSON a part carries is a valid spec");
        assert_eq!(spec.name, "default_hello_0");
        assert_eq!(spec.functions[0].instances, 2);
        assert_eq!(spec.timeout, std::time::Duration::from_secs(5));
    }

    #[test]
    fn local_names_fit_the_daemon() {
        assert_eq!(local_name("default", "hello", 2), "default_hello_2");
        let long = "n".repeat(63);
        let a = local_name(&long, &"c".repeat(40), 999);
        assert_eq!(a.len(), 64, "{a}");
        let (head, hash) = a.split_at(a.len() - 8);
        assert!(head.ends_with(&format!("_{}_999_", "c".repeat(40))), "{a}");
        assert!(hash.chars().all(|c| c.is_ascii_hexdigit()), "{a}");
        assert_ne!(
            a,
            local_name(&format!("{}m", &long[1..]), &"c".repeat(40), 999)
        );
        assert!(a
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'));
    }
}
