//! The node daemon's side (`zerohop agent --kube-node NODE`): it keeps a heartbeat lease for
//! its node, watches the ChainParts the controller placed on it, runs each as `zerohop apply`
//! does (through the same [`Daemon`]), and reports in their status.
//!
//! A part's chain gets the node-local name [`local_name`] and listens on the node's address
//! at the part's port. A changed part (new spec, new port) is applied again: the daemon
//! changes the running chain in place or replaces it without dropping a request, as
//! `zerohop apply` does. A part that goes is stopped after its requests are answered.
//!
//! On shutdown the heartbeat lease is deleted first, so that the controller moves the node's
//! replicas and takes them out of the Service at once, while the daemon still answers every
//! request it accepted.
//!
//! A daemon writes only its own node's objects: the API server lets the credential of a pod on
//! node N (its service-account token names N, [`NODE_NAME_EXTRA`]) write the lease
//! `zerohop-node-N` and the status of the parts placed on N, nothing else
//! (`deploy/kubernetes/21-node-admission.yaml`). At start the daemon asks the API server whom
//! its credential names and says at once when that is not its node.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::authentication::v1::{SelfSubjectReview, UserInfo};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use tokio::sync::{watch, Notify};
use zerohop_agent::api::{ApplyRequest, SplitRequest};
use zerohop_agent::daemon::{Daemon, DaemonError};
use zerohop_agent::AgentError;

use crate::resources::{
    chain_text, local_name, node_lease_name, spec_error, ChainPart, ChainPartSpec, ChainPartStatus,
    ANNOTATION_ADDRESS, ANNOTATION_PEER, LABEL_NODE, NODE_FIELD_MANAGER,
};

/// How long a stopping daemon waits for the controller to move its parts.
const LEAVE_WAIT: Duration = Duration::from_secs(8);
/// How long it waits after that, for whoever routes by the Service's endpoints to stop
/// sending here.
const ENDPOINT_GRACE: Duration = Duration::from_secs(1);

/// The longest wait before a failed part is tried again.
const RETRY_MAX: Duration = Duration::from_secs(60);

/// The extra of an authenticated user that names the node of the pod its service-account
/// token is bound to (Kubernetes 1.30 or newer; the kubelet of node N gets tokens only for
/// pods on N). zerohop's admission policy lets a daemon write only that node's objects.
pub const NODE_NAME_EXTRA: &str = "authentication.kubernetes.io/node-name";

/// How a node's daemon takes part.
#[derive(Clone, Debug)]
pub struct NodeOptions {
    /// The node's name (the DaemonSet passes `spec.nodeName`).
    pub node: String,
    /// zerohop's namespace, where the heartbeat lease lives.
    pub namespace: String,
    /// The address gateways listen on and the Service's endpoints name (the node's IP).
    pub address: IpAddr,
    /// Where this daemon takes peer connections, published for the controller (`None`:
    /// nowhere yet).
    pub peer: Option<std::net::SocketAddr>,
    /// How long the heartbeat lease lasts without renewal: the time to notice a lost node.
    pub lease_duration: Duration,
    /// The folder relative `command` paths of a Chain's functions resolve against.
    pub programs: PathBuf,
}

/// What runs for one part.
#[derive(Clone, Debug, PartialEq)]
struct Applied {
    /// The part object's uid: a part deleted and made again is a new one.
    uid: String,
    /// Its generation when applied.
    generation: i64,
    /// The local chain's name (`None`: nothing of it runs).
    local: Option<String>,
    /// Applying it failed this many times in a row.
    failures: u32,
    /// When to try it again (after a failure).
    retry_at: Option<tokio::time::Instant>,
}

/// The wait before trying a failed part again: 2 s, doubling up to [`RETRY_MAX`].
fn backoff(failures: u32) -> Duration {
    Duration::from_secs(2)
        .saturating_mul(1u32 << failures.saturating_sub(1).min(8))
        .min(RETRY_MAX)
}

/// Runs the node's side until `stop` turns true; then deletes the heartbeat and returns
/// (the caller then stops every chain, answering what they hold).
pub async fn run(
    client: Client,
    daemon: Arc<Daemon>,
    opts: NodeOptions,
    mut stop: watch::Receiver<bool>,
) {
    let changed = Arc::new(Notify::new());
    let mut watching = Vec::new();
    let store = crate::controller::cache(
        Api::<ChainPart>::all(client.clone()),
        watcher::Config::default().labels(&format!("{LABEL_NODE}={}", opts.node)),
        changed.clone(),
        &mut watching,
    );
    let leases: Api<Lease> = Api::namespaced(client.clone(), &opts.namespace);
    let lease_name = node_lease_name(&opts.node);
    // The heartbeat runs on its own, so that a long apply or drain never delays it.
    let heartbeat = tokio::spawn(heartbeat(leases.clone(), lease_name.clone(), opts.clone()));
    let mut running: BTreeMap<String, Applied> = BTreeMap::new();
    tracing::info!(node = %opts.node, "taking part in the cluster");
    // Only a message: it never delays the heartbeat, and a daemon whose credential is wrong
    // stays up (its writes are refused, so the controller places nothing on its node).
    let identity = tokio::spawn(report_identity(client.clone(), opts.node.clone()));
    loop {
        // A part that failed is tried again when its backoff ends.
        let retry = running.values().filter_map(|a| a.retry_at).min();
        let retry_due = async {
            match retry {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            r = stop.changed() => {
                if r.is_err() || *stop.borrow() {
                    break;
                }
                continue;
            }
            () = retry_due => {}
            _ = changed.notified() => {}
        }
        converge(&client, &daemon, &opts, &store, &mut running).await;
    }
    heartbeat.abort();
    let _ = heartbeat.await;
    identity.abort();
    // Leave: the controller moves this node's replicas as soon as the lease is gone.
    match leases.delete(&lease_name, &DeleteParams::default()).await {
        Ok(_) => tracing::info!(node = %opts.node, "heartbeat lease deleted; leaving the cluster"),
        Err(kube::Error::Api(e)) if e.code == 404 => {}
        Err(e) => tracing::warn!(node = %opts.node, "cannot delete the heartbeat lease: {e}"),
    }
    // Wait (bounded) until the controller has taken this node's parts away, so that the
    // Service no longer sends here, then a little longer for the endpoint watchers
    // (kube-proxy) to catch up; only then do the chains stop (the caller drains them).
    let deadline = tokio::time::Instant::now() + LEAVE_WAIT;
    let mut left = false;
    while tokio::time::Instant::now() < deadline {
        if store.state().iter().all(|p| p.spec.node != opts.node) {
            left = true;
            break;
        }
        tokio::select! {
            _ = changed.notified() => {}
            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
    }
    if left {
        tracing::info!(node = %opts.node, "the controller moved this node's parts; draining");
        tokio::time::sleep(ENDPOINT_GRACE).await;
    } else {
        tracing::warn!(
            node = %opts.node,
            "the controller did not move this node's parts within {LEAVE_WAIT:?}; stopping anyway"
        );
    }
    for (key, a) in &running {
        if let Some(p) = store.state().into_iter().find(|p| part_key(p) == *key) {
            let status = ChainPartStatus {
                observed_generation: Some(a.generation),
                phase: "Pending".into(),
                ready: false,
                address: String::new(),
                message: "its node's zerohop daemon is stopping".into(),
                last_transition_time: Some(jiff::Timestamp::now().to_string()),
            };
            let _ = patch_status(&client, &p, &status).await;
        }
    }
    for w in watching {
        w.abort();
    }
}

/// Whose objects a daemon's credential lets it write, as the API server names it.
#[derive(Debug, PartialEq, Eq)]
enum Identity {
    /// The credential names the daemon's own node.
    Mine,
    /// It names another node (or several, listed): the daemon's writes to its own node's
    /// objects are refused.
    Another(String),
    /// It names no node (a long-lived token, an API server older than 1.30): where zerohop's
    /// admission policy is installed, every write of the daemon is refused.
    Unnamed,
}

/// What the API server's view of this daemon's user (`user`) means for node `node`.
fn identity(user: &UserInfo, node: &str) -> Identity {
    let named = user
        .extra
        .as_ref()
        .and_then(|e| e.get(NODE_NAME_EXTRA))
        .map(Vec::as_slice)
        .unwrap_or_default();
    match named {
        [] => Identity::Unnamed,
        [one] if one == node => Identity::Mine,
        other => Identity::Another(other.join(", ")),
    }
}

/// Asks the API server whom this daemon's credential names (a SelfSubjectReview, which every
/// authenticated user may make) and says so, loudly when it is not node `node`.
async fn report_identity(client: Client, node: String) {
    let reviews: Api<SelfSubjectReview> = Api::all(client);
    let review = match reviews
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await
    {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(%node, "cannot ask the API server whom this daemon's credential names: {e}");
            return;
        }
    };
    let user = review.status.and_then(|s| s.user_info).unwrap_or_default();
    let name = user.username.clone().unwrap_or_default();
    match identity(&user, &node) {
        Identity::Mine => tracing::info!(
            %node,
            "the API server knows this daemon as {name} on node {node}: it writes only {node}'s \
             heartbeat lease and the status of the parts placed on {node}"
        ),
        Identity::Another(other) => tracing::error!(
            %node,
            "the API server knows this daemon as {name} on node {other}, but it runs for node \
             {node} (--kube-node): its heartbeat and its parts' status will be refused, so \
             nothing runs here; give it the service-account token of a pod on {node}"
        ),
        Identity::Unnamed => tracing::warn!(
            %node,
            "this daemon's credential ({name}) names no node: where zerohop's admission policy \
             is installed (deploy/kubernetes/21-node-admission.yaml) every write of it is \
             refused; give it the service-account token of a pod on {node} (Kubernetes 1.30 \
             or newer)"
        ),
    }
}

/// `namespace/name` of a part.
fn part_key(p: &ChainPart) -> String {
    format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any())
}

/// Renews the node's heartbeat lease every third of its duration, for ever (the caller
/// aborts it).
async fn heartbeat(leases: Api<Lease>, lease_name: String, opts: NodeOptions) {
    let renew = (opts.lease_duration / 3).max(Duration::from_millis(200));
    let mut tick = tokio::time::interval(renew);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut beating = false;
    loop {
        tick.tick().await;
        match beat(&leases, &lease_name, &opts).await {
            Ok(()) => {
                if !beating {
                    tracing::info!(node = %opts.node, "heartbeat lease {lease_name} renewed every {renew:?}");
                }
                beating = true;
            }
            Err(e) => {
                tracing::warn!(node = %opts.node, "cannot renew the heartbeat lease {lease_name}: {e}");
                beating = false;
            }
        }
    }
}

/// Renews (or creates) the node's heartbeat lease.
async fn beat(leases: &Api<Lease>, name: &str, opts: &NodeOptions) -> Result<(), kube::Error> {
    let now = jiff::Timestamp::now();
    let body = json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": name,
            "annotations": {
                ANNOTATION_ADDRESS: opts.address.to_string(),
                ANNOTATION_PEER: opts.peer.map(|p| p.to_string()).unwrap_or_default(),
            },
            "labels": { "app.kubernetes.io/part-of": "zerohop", LABEL_NODE: opts.node },
        },
        "spec": {
            "holderIdentity": opts.node,
            "leaseDurationSeconds": opts.lease_duration.as_secs().max(1),
            "renewTime": k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(now),
        },
    });
    leases
        .patch(
            name,
            &PatchParams::apply(NODE_FIELD_MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await
        .map(|_| ())
}

async fn patch_status(
    client: &Client,
    part: &ChainPart,
    status: &ChainPartStatus,
) -> Result<(), kube::Error> {
    let api: Api<ChainPart> =
        Api::namespaced(client.clone(), &part.namespace().unwrap_or_default());
    let body = json!({
        "apiVersion": "zerohop.dev/v1alpha1",
        "kind": "ChainPart",
        "status": status,
    });
    api.patch_status(
        &part.name_any(),
        &PatchParams::apply(NODE_FIELD_MANAGER).force(),
        &Patch::Apply(&body),
    )
    .await
    .map(|_| ())
}

/// Makes what runs match the parts placed on this node.
async fn converge(
    client: &Client,
    daemon: &Arc<Daemon>,
    opts: &NodeOptions,
    store: &Store<ChainPart>,
    running: &mut BTreeMap<String, Applied>,
) {
    let parts: BTreeMap<String, Arc<ChainPart>> = store
        .state()
        .into_iter()
        .filter(|p| p.spec.node == opts.node && p.metadata.deletion_timestamp.is_none())
        .map(|p| (part_key(&p), p))
        .collect();
    // Parts that went (moved away, scaled down, their Chain deleted).
    let gone: Vec<String> = running
        .iter()
        .filter(|(k, a)| {
            parts
                .get(*k)
                .is_none_or(|p| p.uid().as_deref() != Some(a.uid.as_str()))
        })
        .map(|(k, _)| k.clone())
        .collect();
    for key in gone {
        // A part that never came up has nothing to stop.
        let Some(local) = running.remove(&key).and_then(|a| a.local) else {
            continue;
        };
        match daemon.down(&local).await {
            Ok(r) => {
                tracing::info!(part = %key, chain = %local, "stopped after answering {} requests", r.answered)
            }
            Err(e) => tracing::warn!(part = %key, chain = %local, "stopping: {e}"),
        }
    }
    for (key, part) in parts {
        let generation = part.metadata.generation.unwrap_or(0);
        let uid = part.uid().unwrap_or_default();
        let before = running.get(&key).filter(|a| a.uid == uid);
        let due = before.is_none_or(|a| {
            a.generation != generation
                || a.retry_at
                    .is_some_and(|at| at <= tokio::time::Instant::now())
        });
        if !due {
            continue;
        }
        let failures = before.map_or(0, |a| a.failures);
        // A version of it that runs already goes on serving while the change is applied.
        let serving = before.and_then(|a| a.local.clone());
        let ns = part.namespace().unwrap_or_default();
        let local = local_name(&ns, &part.spec.chain, part.spec.replica);
        let address = part
            .spec
            .port
            .map(|p| std::net::SocketAddr::new(opts.address, p).to_string())
            .unwrap_or_default();
        let mut status = ChainPartStatus {
            observed_generation: Some(generation),
            phase: if serving.is_some() {
                "Updating"
            } else {
                "Starting"
            }
            .into(),
            ready: serving.is_some(),
            address: if serving.is_some() {
                part.status
                    .as_ref()
                    .map(|s| s.address.clone())
                    .unwrap_or_default()
            } else {
                String::new()
            },
            message: String::new(),
            last_transition_time: Some(jiff::Timestamp::now().to_string()),
        };
        if part.status.as_ref().map(|s| s.phase.as_str()) != Some(status.phase.as_str()) {
            let _ = patch_status(client, &part, &status).await;
        }
        let result = match (split_of(&part.spec), part.spec.port) {
            (Err(e), _) => Err(e),
            (Ok(None), None) => Err("the part has no port for its gateway".into()),
            (Ok(split), port) => {
                let req = ApplyRequest {
                    path: opts
                        .programs
                        .join(format!("{ns}.{}.yaml", part.spec.chain))
                        .display()
                        .to_string(),
                    text: chain_text(&local, &part.spec.template),
                    // A part without the gateway takes only its peers' hops: no port of
                    // the node's, a free one on loopback.
                    listen: port.map(|p| std::net::SocketAddr::new(opts.address, p).to_string()),
                    split,
                };
                daemon
                    .apply(req)
                    .await
                    .map(|r| r.status.listeners)
                    .map_err(|e| describe(&e))
            }
        };
        match result {
            Ok(listeners) => {
                tracing::info!(part = %key, chain = %local, "running: {}", listeners.join(", "));
                status.phase = "Running".into();
                status.ready = true;
                status.address = address;
                running.insert(
                    key.clone(),
                    Applied {
                        uid,
                        generation,
                        local: Some(local),
                        failures: 0,
                        retry_at: None,
                    },
                );
            }
            Err(message) => {
                let failures = failures.saturating_add(1);
                let wait = backoff(failures);
                tracing::warn!(part = %key, chain = %local, "cannot run (trying again in {wait:?}): {message}");
                status.phase = "Failed".into();
                // A version of it that runs still (a change refused) goes on serving and
                // stays known, so that it is stopped when the part goes.
                status.ready = serving.is_some();
                status.message = if serving.is_some() {
                    format!("{message} (the spec before goes on serving; trying again in {wait:?})")
                } else {
                    format!("{message} (trying again in {wait:?})")
                };
                running.insert(
                    key.clone(),
                    Applied {
                        uid,
                        generation,
                        local: serving,
                        failures,
                        retry_at: Some(tokio::time::Instant::now() + wait),
                    },
                );
            }
        }
        status.last_transition_time = Some(jiff::Timestamp::now().to_string());
        if let Err(e) = patch_status(client, &part, &status).await {
            tracing::warn!(part = %key, "cannot report the part's status: {e}");
        }
    }
}

/// A daemon's refusal in one line; a spec error names its field as a path of the part's
/// Chain (`spec.routes[0].sequence[1]: ...`), not the generated file's line.
fn describe(e: &DaemonError) -> String {
    match e {
        DaemonError::Spec(s) | DaemonError::Agent(AgentError::Spec(s)) => spec_error(s),
        e => e.to_string(),
    }
}

/// What a part of a split replica runs here and where the rest runs (`None`: the whole
/// chain runs here); fails naming a peer whose daemon publishes no peer address, and while
/// the replica's other parts are not placed.
fn split_of(spec: &ChainPartSpec) -> Result<Option<SplitRequest>, String> {
    if spec.peers.is_empty() {
        let all = spec
            .template
            .get("functions")
            .and_then(|f| f.as_object())
            .map_or(0, |f| f.len());
        if spec.functions.len() < all {
            return Err(format!(
                "it runs {} of the chain's {all} functions, and the replica's other parts are \
                 not placed yet",
                spec.functions.len()
            ));
        }
        return Ok(None);
    }
    let mut peers = std::collections::BTreeMap::new();
    for p in &spec.peers {
        let addr: std::net::SocketAddr = p.address.parse().map_err(|_| {
            format!(
                "part {} on node {} has no peer address (its daemon runs without \
                 --peer-secret, or has not published it yet)",
                p.part, p.node
            )
        })?;
        for f in &p.functions {
            peers.insert(f.clone(), addr);
        }
    }
    Ok(Some(SplitRequest {
        local: spec.functions.clone(),
        peers,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::Peer;

    fn part(functions: &[&str], peers: Vec<Peer>) -> ChainPartSpec {
        let template = serde_json::from_value(json!({
            "functions": { "upper": {}, "exclaim": {} }
        }))
        .unwrap();
        ChainPartSpec {
            chain: "hello".into(),
            chain_generation: 1,
            replica: 0,
            part: 0,
            node: "node-0".into(),
            port: Some(30100),
            functions: functions.iter().map(|f| f.to_string()).collect(),
            peers,
            template,
        }
    }

    fn user(nodes: &[&str]) -> UserInfo {
        let mut extra = BTreeMap::new();
        extra.insert(
            "authentication.kubernetes.io/pod-name".to_owned(),
            vec!["zerohop-node-abcde".to_owned()],
        );
        if !nodes.is_empty() {
            extra.insert(
                NODE_NAME_EXTRA.to_owned(),
                nodes.iter().map(|n| n.to_string()).collect(),
            );
        }
        UserInfo {
            username: Some("system:serviceaccount:zerohop-system:zerohop-node".into()),
            extra: Some(extra),
            ..UserInfo::default()
        }
    }

    #[test]
    fn a_credential_is_the_nodes_own_only_when_it_names_exactly_that_node() {
        assert_eq!(identity(&user(&["node-0"]), "node-0"), Identity::Mine);
        assert_eq!(
            identity(&user(&["node-1"]), "node-0"),
            Identity::Another("node-1".into())
        );
        assert_eq!(
            identity(&user(&["node-0", "node-1"]), "node-0"),
            Identity::Another("node-0, node-1".into())
        );
        assert_eq!(identity(&user(&[]), "node-0"), Identity::Unnamed);
        assert_eq!(identity(&UserInfo::default(), "node-0"), Identity::Unnamed);
        // A prefix or a case change is another node.
        assert_eq!(
            identity(&user(&["node-0"]), "node-00"),
            Identity::Another("node-0".into())
        );
        assert_eq!(
            identity(&user(&["Node-0"]), "node-0"),
            Identity::Another("Node-0".into())
        );
    }

    #[test]
    fn a_part_runs_the_whole_chain_only_when_it_has_every_function() {
        assert_eq!(split_of(&part(&["upper", "exclaim"], Vec::new())), Ok(None));
        let e = split_of(&part(&["upper"], Vec::new())).unwrap_err();
        assert!(e.contains("1 of the chain's 2 functions"), "{e}");
        let peer = |address: &str| Peer {
            part: 1,
            node: "node-1".into(),
            address: address.into(),
            functions: vec!["exclaim".into()],
        };
        let split = split_of(&part(&["upper"], vec![peer("10.0.0.2:7090")]))
            .unwrap()
            .expect("split");
        assert_eq!(split.local, ["upper"]);
        assert_eq!(
            split.peers.get("exclaim"),
            Some(&"10.0.0.2:7090".parse().unwrap())
        );
        let e = split_of(&part(&["upper"], vec![peer("")])).unwrap_err();
        assert!(e.contains("node-1 has no peer address"), "{e}");
    }
}
