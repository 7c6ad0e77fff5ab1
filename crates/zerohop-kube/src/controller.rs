//! The controller (`zerohop controller`): places each Chain's replicas on nodes as
//! ChainParts, moves them off nodes whose daemon or kubelet is lost, publishes each Chain's
//! gateways as a Service with EndpointSlices, and reports in the Chain's status and events.
//!
//! It is level-triggered: caches of Chains, ChainParts, Nodes, node heartbeats (leases),
//! Services and EndpointSlices are kept by watches, and on every change (and once a second,
//! so that a heartbeat that merely stops is noticed) the leader compares what is with what
//! should be, for every Chain, and writes only the difference (server-side apply). Several
//! copies may run: a Lease (`zerohop-controller` in the controller's namespace) elects the
//! one that writes; the others keep their caches warm and take over when its lease lapses.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::RangeInclusive;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, ObjectReference, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::json;
use tokio::sync::Notify;

use crate::placement::{self, Decision, Existing, NodeInfo, Want};
use crate::resources::{
    chain_text, local_name, spec_error, Chain, ChainPart, ChainPartSpec, ChainStatus, Condition,
    PartEndpoint, Peer, ReplicaEndpoint, ANNOTATION_ADDRESS, ANNOTATION_PEER,
    CONTROLLER_FIELD_MANAGER, LABEL_CHAIN, LABEL_NODE, LABEL_REPLICA, MANAGER, NODE_LEASE_PREFIX,
};

/// How the controller runs.
#[derive(Clone, Debug)]
pub struct ControllerOptions {
    /// zerohop's namespace: the leader lease and the nodes' heartbeats live there.
    pub namespace: String,
    /// This copy's name in the leader lease (the pod's name).
    pub identity: String,
    /// How long the leader's lease lasts without renewal.
    pub lease_duration: Duration,
    /// Gateway ports given to replicas of Chains that fix none.
    pub ports: RangeInclusive<u16>,
}

/// Why the controller stopped.
#[derive(Debug, thiserror::Error)]
pub enum ControllerError {
    /// The leader election failed.
    #[error("leader election: {0}")]
    Lease(#[from] kube_lease_manager::LeaseManagerError),
    /// The leader election's task ended while the controller ran.
    #[error("leader election: its task ended")]
    LeaseLost,
}

/// The caches the controller works from.
struct Caches {
    chains: Store<Chain>,
    parts: Store<ChainPart>,
    nodes: Store<Node>,
    leases: Store<Lease>,
    services: Store<Service>,
    slices: Store<EndpointSlice>,
}

/// Starts watching `api` into a cache (its task goes into `tasks`); every change pokes
/// `changed`.
pub(crate) fn cache<K>(
    api: Api<K>,
    config: watcher::Config,
    changed: Arc<Notify>,
    tasks: &mut Vec<tokio::task::JoinHandle<()>>,
) -> Store<K>
where
    K: Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone + Send + Sync,
{
    let (reader, writer) = reflector::store();
    let stream = reflector::reflector(writer, watcher(api, config).default_backoff());
    tasks.push(tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(item) = stream.next().await {
            if let Err(e) = item {
                tracing::warn!("watch: {e}");
            }
            changed.notify_one();
        }
    }));
    reader
}

/// Runs the controller until `shutdown` resolves.
pub async fn run(
    client: Client,
    opts: ControllerOptions,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), ControllerError> {
    let changed = Arc::new(Notify::new());
    let mut tasks = Vec::new();
    let ours = watcher::Config::default().labels(LABEL_CHAIN);
    let caches = Caches {
        chains: cache(
            Api::<Chain>::all(client.clone()),
            watcher::Config::default(),
            changed.clone(),
            &mut tasks,
        ),
        parts: cache(
            Api::<ChainPart>::all(client.clone()),
            watcher::Config::default(),
            changed.clone(),
            &mut tasks,
        ),
        nodes: cache(
            Api::<Node>::all(client.clone()),
            watcher::Config::default(),
            changed.clone(),
            &mut tasks,
        ),
        leases: cache(
            Api::<Lease>::namespaced(client.clone(), &opts.namespace),
            watcher::Config::default(),
            changed.clone(),
            &mut tasks,
        ),
        services: cache(
            Api::<Service>::all(client.clone()),
            ours.clone(),
            changed.clone(),
            &mut tasks,
        ),
        slices: cache(
            Api::<EndpointSlice>::all(client.clone()),
            ours,
            changed.clone(),
            &mut tasks,
        ),
    };
    let secs = opts.lease_duration.as_secs().max(3);
    let manager =
        kube_lease_manager::LeaseManagerBuilder::new(client.clone(), "zerohop-controller")
            .with_namespace(&opts.namespace)
            .with_identity(&opts.identity)
            .with_duration(secs)
            .with_grace((secs / 3).max(1))
            .build()
            .await?;
    let (mut leading, lease_task) = manager.watch().await;
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "zerohop-controller".into(),
            instance: Some(opts.identity.clone()),
        },
    );
    let mut world = World {
        client,
        opts,
        caches,
        recorder,
        last: BTreeMap::new(),
        failing: BTreeMap::new(),
        validated: BTreeMap::new(),
        renewals: BTreeMap::new(),
    };
    let mut shutdown = std::pin::pin!(shutdown);
    // A cache that never listed is empty: acting on it would delete every part.
    let listed = async {
        let c = &world.caches;
        let _ = futures::join!(
            c.chains.wait_until_ready(),
            c.parts.wait_until_ready(),
            c.nodes.wait_until_ready(),
            c.leases.wait_until_ready(),
            c.services.wait_until_ready(),
            c.slices.wait_until_ready(),
        );
    };
    let stopped = tokio::select! {
        _ = &mut shutdown => true,
        _ = listed => false,
    };
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut was_leading = false;
    // Whether the loop ended because the election's task did (then the controller fails,
    // and its Deployment starts it again).
    let mut lease_lost = false;
    if !stopped {
        loop {
            tokio::select! {
                _ = &mut shutdown => break,
                _ = changed.notified() => {}
                _ = tick.tick() => {}
                r = leading.changed() => {
                    if r.is_err() {
                        lease_lost = true;
                        break;
                    }
                }
            }
            let lead = *leading.borrow();
            if lead != was_leading {
                tracing::info!(
                    identity = %world.opts.identity,
                    "{}",
                    if lead { "leading: placing chains" } else { "not leading: standing by" }
                );
                was_leading = lead;
                world.last.clear();
            }
            if !lead {
                continue;
            }
            if let Err(e) = world.reconcile_all().await {
                tracing::warn!("reconcile: {e}");
            }
        }
    }
    // Hand the lease on at once rather than letting it lapse.
    drop(leading);
    let ended = match lease_task.await {
        Ok(Ok(manager)) => {
            let _ = manager.release().await;
            Ok(())
        }
        Ok(Err(e)) => Err(ControllerError::Lease(e)),
        Err(_) => Err(ControllerError::LeaseLost),
    };
    for t in tasks {
        t.abort();
    }
    match ended {
        Err(e) if lease_lost => Err(e),
        Err(e) => {
            tracing::warn!("leader lease: {e}");
            Ok(())
        }
        Ok(()) if lease_lost => Err(ControllerError::LeaseLost),
        Ok(()) => Ok(()),
    }
}

/// A node's heartbeat as the controller reads it.
#[derive(Clone, Debug, Default)]
struct Heartbeat {
    /// Where its gateways listen.
    address: String,
    /// Where its daemon takes peer connections.
    peer: String,
}

/// What the leader works with.
struct World {
    client: Client,
    opts: ControllerOptions,
    caches: Caches,
    recorder: Recorder,
    /// Per Chain (namespace/name): the conditions last reported, so that a warning event is
    /// published once per change, not once a second.
    last: BTreeMap<String, Vec<Condition>>,
    /// Per Chain, the error its last reconcile ended with (logged once).
    failing: BTreeMap<String, String>,
    /// Per Chain (by uid: a Chain deleted and made again under its name is another), its
    /// spec's check for the generation it was made for (the parser runs once per change of
    /// a Chain, not once a second).
    validated: BTreeMap<String, (i64, Option<String>)>,
    /// Per node, its heartbeat lease's last `renewTime` and when this controller saw it
    /// change.
    renewals: BTreeMap<String, (jiff::Timestamp, Option<std::time::Instant>)>,
}

impl World {
    /// The live nodes' heartbeats, by node name. A lease is fresh while its `renewTime`
    /// last changed less than its duration ago by this controller's own monotonic clock
    /// (the daemons' clocks may be off from it; only a change counts). A lease seen for the
    /// first time counts from then, unless its `renewTime` is already older than its
    /// duration by the wall clock.
    fn heartbeats(&mut self) -> BTreeMap<String, Heartbeat> {
        let now = jiff::Timestamp::now();
        let tick = std::time::Instant::now();
        let mut alive = BTreeMap::new();
        let mut seen = BTreeMap::new();
        for l in self.caches.leases.state() {
            let Some(node) = l
                .name_any()
                .strip_prefix(NODE_LEASE_PREFIX)
                .map(str::to_owned)
            else {
                continue;
            };
            let Some(spec) = &l.spec else { continue };
            let (Some(renewed), Some(secs)) = (&spec.renew_time, spec.lease_duration_seconds)
            else {
                continue;
            };
            if spec.holder_identity.as_deref() != Some(node.as_str()) {
                continue;
            }
            let duration = Duration::from_secs(u64::try_from(secs).unwrap_or(0));
            // When the renewal was seen (`None`: stale when first seen, not renewed since).
            let observed = match self.renewals.get(&node) {
                Some(&(last, at)) if last == renewed.0 => at,
                Some(_) => Some(tick),
                None => {
                    let until = renewed
                        .0
                        .checked_add(jiff::SignedDuration::from_secs(i64::from(secs)))
                        .unwrap_or(renewed.0);
                    (until > now).then_some(tick)
                }
            };
            seen.insert(node.clone(), (renewed.0, observed));
            if observed.is_none_or(|at| tick.duration_since(at) >= duration) {
                continue;
            }
            let a = l.annotations();
            alive.insert(
                node,
                Heartbeat {
                    address: a.get(ANNOTATION_ADDRESS).cloned().unwrap_or_default(),
                    peer: a.get(ANNOTATION_PEER).cloned().unwrap_or_default(),
                },
            );
        }
        self.renewals = seen;
        alive
    }

    async fn reconcile_all(&mut self) -> Result<(), kube::Error> {
        let chains = self.caches.chains.state();
        let alive = self.heartbeats();
        let parts = self.caches.parts.state();
        let names: BTreeSet<(String, String)> = chains
            .iter()
            .map(|c| (c.namespace().unwrap_or_default(), c.name_any()))
            .collect();
        // What a deleted Chain left: its parts, its Service and slices (the garbage collector
        // removes them too where it runs, through their owner references).
        self.delete_orphans(&parts, &names, |p: &ChainPart| p.spec.chain.clone())
            .await?;
        self.delete_orphans(&self.caches.services.state(), &names, chain_label)
            .await?;
        self.delete_orphans(&self.caches.slices.state(), &names, chain_label)
            .await?;
        // Parts placed in this pass, not yet in the cache: the next Chain's placement counts
        // their nodes and ports.
        let mut placed_now: Vec<(String, Option<u16>)> = Vec::new();
        let uids: BTreeSet<String> = chains.iter().filter_map(|c| c.uid()).collect();
        self.validated.retain(|uid, _| uids.contains(uid));
        for c in chains {
            if c.metadata.deletion_timestamp.is_some() {
                continue;
            }
            let key = format!("{}/{}", c.namespace().unwrap_or_default(), c.name_any());
            match self.reconcile(&c, &alive, &parts, &mut placed_now).await {
                Ok(()) => {
                    self.failing.remove(&key);
                }
                Err(e) => {
                    // Once per distinct error, not once a second.
                    let text = e.to_string();
                    if self.failing.get(&key) != Some(&text) {
                        tracing::warn!(chain = %key, "{text}");
                        self.failing.insert(key, text);
                    }
                }
            }
        }
        Ok(())
    }

    /// Deletes the `objects` whose Chain (`chain_of`) is not among `chains`.
    async fn delete_orphans<K>(
        &self,
        objects: &[Arc<K>],
        chains: &BTreeSet<(String, String)>,
        chain_of: impl Fn(&K) -> String,
    ) -> Result<(), kube::Error>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope>
            + Clone
            + std::fmt::Debug
            + serde::de::DeserializeOwned,
        K::DynamicType: Default,
    {
        for o in objects {
            let ns = o.namespace().unwrap_or_default();
            if !chains.contains(&(ns.clone(), chain_of(o))) {
                self.delete::<K>(&ns, &o.name_any()).await?;
            }
        }
        Ok(())
    }

    async fn delete<K>(&self, ns: &str, name: &str) -> Result<(), kube::Error>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope>
            + Clone
            + std::fmt::Debug
            + serde::de::DeserializeOwned,
        K::DynamicType: Default,
    {
        let api: Api<K> = Api::namespaced(self.client.clone(), ns);
        match api.delete(name, &DeleteParams::background()).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
            Err(e) => Err(e),
        }
    }

    async fn event(&self, chain: &Chain, type_: EventType, reason: &str, note: String) {
        let reference: ObjectReference = chain.object_ref(&());
        let ev = Event {
            type_,
            reason: reason.into(),
            note: Some(note),
            action: "Place".into(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&ev, &reference).await {
            tracing::warn!(chain = %chain.name_any(), "cannot publish an event: {e}");
        }
    }

    /// Brings one Chain's parts, Service and status to what they should be.
    async fn reconcile(
        &mut self,
        chain: &Chain,
        alive: &BTreeMap<String, Heartbeat>,
        all_parts: &[Arc<ChainPart>],
        placed_now: &mut Vec<(String, Option<u16>)>,
    ) -> Result<(), kube::Error> {
        let ns = chain.namespace().unwrap_or_default();
        let name = chain.name_any();
        let generation = chain.metadata.generation.unwrap_or(0);
        let key = format!("{ns}/{name}");
        let mut conditions = Vec::new();
        // 1. Is the spec valid? The API server checked its shape; zerohop's own parser checks
        //    the rest (names in sequences, cycles of calls, sizes that fit).
        let uid = chain.uid().unwrap_or_default();
        let invalid = match self.validated.get(&uid) {
            Some((g, v)) if *g == generation => v.clone(),
            _ => {
                let v = validate(&ns, chain);
                self.validated.insert(uid, (generation, v.clone()));
                v
            }
        };
        conditions.push(match &invalid {
            None => condition("Valid", true, "SpecValid", "the chain spec is valid"),
            Some(m) => condition("Valid", false, "InvalidSpec", m),
        });
        let mine = parts_of(chain, all_parts.iter().cloned());
        let nparts = 1 + chain.spec.placement.parts.len() as u32;
        let part_functions = split_functions(chain);
        if invalid.is_none() {
            // 2. Where do the parts go?
            let nodes = self.node_infos(chain, alive, all_parts, placed_now);
            let existing: Vec<Existing> = mine
                .iter()
                .map(|p| Existing {
                    name: p.name_any(),
                    replica: p.spec.replica,
                    part: p.spec.part,
                    node: p.spec.node.clone(),
                    port: p.spec.port,
                })
                .collect();
            let want = Want {
                replicas: chain.spec.replicas,
                parts: nparts,
                port: chain.spec.port,
                max_per_node: chain.spec.placement.max_per_node,
            };
            let decision = placement::place(&want, &nodes, &existing, self.opts.ports.clone());
            self.apply_decision(chain, &decision, alive, &mine, &part_functions)
                .await?;
            placed_now.extend(
                decision
                    .placed
                    .iter()
                    .filter(|p| p.existing.is_none())
                    .map(|p| (p.node.clone(), p.port)),
            );
            // Replicas with every part on a node.
            let waiting: BTreeSet<u32> = decision.unplaced.iter().map(|u| u.0).collect();
            let placed = want.replicas - waiting.len() as u32;
            conditions.push(if decision.unplaced.is_empty() {
                condition(
                    "Placed",
                    true,
                    "AllPlaced",
                    &format!("{} of {} replicas placed", placed, want.replicas),
                )
            } else {
                condition(
                    "Placed",
                    false,
                    "Unschedulable",
                    &format!(
                        "{placed} of {} replicas placed; no node can take {}: it needs a node \
                         whose zerohop daemon is alive, that is Ready and schedulable{}{}{}",
                        want.replicas,
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
                        if nparts > 1 {
                            ", holds no other part of the same replica"
                        } else {
                            ""
                        },
                        match (chain.spec.port, chain.spec.placement.max_per_node) {
                            (Some(p), _) => format!(", has port {p} free"),
                            (None, Some(m)) => format!(", runs fewer than {m} of its parts"),
                            (None, None) => String::new(),
                        }
                    ),
                )
            });
        }
        // 3. Status, Service and endpoints from the parts as they are now.
        let mine_now = parts_of(chain, self.caches.parts.state());
        let endpoints = endpoints(chain, &mine_now, alive, nparts);
        let ready = endpoints.iter().filter(|e| e.ready).count() as u32;
        let placed = endpoints.len() as u32;
        conditions.push(if ready == chain.spec.replicas && invalid.is_none() {
            condition(
                "Ready",
                true,
                "AllReady",
                &format!("{ready} of {} replicas ready", chain.spec.replicas),
            )
        } else {
            let why = mine_now
                .iter()
                .filter_map(|p| p.status.as_ref())
                .find(|s| s.phase == "Failed")
                .map(|s| format!("; {}", s.message))
                .unwrap_or_default();
            condition(
                "Ready",
                false,
                if invalid.is_some() {
                    "InvalidSpec"
                } else if why.is_empty() {
                    "Starting"
                } else {
                    "PartFailed"
                },
                &format!("{ready} of {} replicas ready{why}", chain.spec.replicas),
            )
        });
        // The status is written even when the Service cannot be.
        let published = self.publish_service(chain, &endpoints).await;
        let old = chain.status.clone().unwrap_or_default();
        let conditions = carry_times(&old.conditions, conditions, generation);
        let status = ChainStatus {
            observed_generation: Some(generation),
            replicas: placed,
            ready_replicas: ready,
            conditions: conditions.clone(),
            endpoints,
        };
        // Warnings once per change of a condition.
        let before = self
            .last
            .get(&key)
            .cloned()
            .unwrap_or(old.conditions.clone());
        for c in &conditions {
            let changed = before
                .iter()
                .find(|b| b.type_ == c.type_)
                .is_none_or(|b| b.status != c.status || b.reason != c.reason);
            if changed && c.status == "False" && c.reason != "Starting" {
                self.event(chain, EventType::Warning, &c.reason, c.message.clone())
                    .await;
            }
        }
        self.last.insert(key, conditions);
        if status != old {
            let api: Api<Chain> = Api::namespaced(self.client.clone(), &ns);
            let patch = json!({
                "apiVersion": "zerohop.dev/v1alpha1",
                "kind": "Chain",
                "status": status,
            });
            api.patch_status(
                &name,
                &PatchParams::apply(CONTROLLER_FIELD_MANAGER).force(),
                &Patch::Apply(&patch),
            )
            .await?;
        }
        published
    }

    /// Nodes as placement sees them for `chain`.
    fn node_infos(
        &self,
        chain: &Chain,
        alive: &BTreeMap<String, Heartbeat>,
        all_parts: &[Arc<ChainPart>],
        placed_now: &[(String, Option<u16>)],
    ) -> Vec<NodeInfo> {
        let mut infos: Vec<NodeInfo> = self
            .caches
            .nodes
            .state()
            .iter()
            .map(|n| {
                let name = n.name_any();
                let labels = n.labels();
                let selected = chain
                    .spec
                    .placement
                    .node_selector
                    .iter()
                    .all(|(k, v)| labels.get(k) == Some(v));
                let schedulable = !n
                    .spec
                    .as_ref()
                    .and_then(|s| s.unschedulable)
                    .unwrap_or(false);
                // A node whose kubelet reports NotReady, or stopped reporting (Unknown), is
                // lost even if the daemon's heartbeat still reaches the API server.
                let ready = n
                    .status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
                    .is_none_or(|c| c.status == "True");
                NodeInfo {
                    eligible: selected && schedulable && ready && alive.contains_key(&name),
                    parts: 0,
                    ports: BTreeSet::new(),
                    name,
                }
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

    /// Deletes, creates and updates ChainParts as `decision` says.
    async fn apply_decision(
        &self,
        chain: &Chain,
        decision: &Decision,
        alive: &BTreeMap<String, Heartbeat>,
        mine: &[Arc<ChainPart>],
        part_functions: &[Vec<String>],
    ) -> Result<(), kube::Error> {
        let ns = chain.namespace().unwrap_or_default();
        let name = chain.name_any();
        for e in &decision.delete {
            let why = if !alive.contains_key(&e.node) {
                format!(
                    "replica {} part {} leaves node {}: its zerohop daemon's heartbeat stopped",
                    e.replica, e.part, e.node
                )
            } else if e.replica >= chain.spec.replicas {
                format!("replica {} part {} removed: scaled down", e.replica, e.part)
            } else {
                format!(
                    "replica {} part {} leaves node {}: the node no longer qualifies",
                    e.replica, e.part, e.node
                )
            };
            tracing::info!(chain = %name, "{why}");
            self.event(
                chain,
                if alive.contains_key(&e.node) {
                    EventType::Normal
                } else {
                    EventType::Warning
                },
                "Moved",
                why,
            )
            .await;
            self.delete::<ChainPart>(&ns, &e.name).await?;
        }
        let api: Api<ChainPart> = Api::namespaced(self.client.clone(), &ns);
        let generation = chain.metadata.generation.unwrap_or(0);
        for p in &decision.placed {
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
            let spec = ChainPartSpec {
                chain: name.clone(),
                chain_generation: generation,
                replica: p.replica,
                part: p.part,
                node: p.node.clone(),
                port: p.port,
                functions: part_functions[p.part as usize].clone(),
                peers,
                template: chain.spec.chain.clone(),
            };
            let object = format!("{name}-{}-{}", p.replica, p.part);
            let current = mine.iter().find(|m| Some(m.name_any()) == p.existing);
            if current.is_some_and(|c| c.spec == spec) {
                continue;
            }
            if p.existing.is_none() {
                let why = format!(
                    "replica {} part {} placed on node {}{}",
                    p.replica,
                    p.part,
                    p.node,
                    p.port
                        .map_or(String::new(), |port| format!(", port {port}"))
                );
                tracing::info!(chain = %name, "{why}");
                self.event(chain, EventType::Normal, "Placed", why).await;
            }
            let owner = chain
                .controller_owner_ref(&())
                .expect("a Chain from the API has a uid");
            let body = json!({
                "apiVersion": "zerohop.dev/v1alpha1",
                "kind": "ChainPart",
                "metadata": {
                    "name": p.existing.clone().unwrap_or(object),
                    "namespace": ns,
                    "labels": {
                        LABEL_CHAIN: name,
                        LABEL_NODE: p.node,
                        LABEL_REPLICA: p.replica.to_string(),
                    },
                    "ownerReferences": [owner],
                },
                "spec": spec,
            });
            let target = body["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            api.patch(
                &target,
                &PatchParams::apply(CONTROLLER_FIELD_MANAGER).force(),
                &Patch::Apply(&body),
            )
            .await?;
        }
        Ok(())
    }

    /// The Chain's Service (selector-less, port 80 or the Chain's port) and one
    /// EndpointSlice per gateway port its replicas use.
    async fn publish_service(
        &self,
        chain: &Chain,
        endpoints: &[ReplicaEndpoint],
    ) -> Result<(), kube::Error> {
        let ns = chain.namespace().unwrap_or_default();
        let name = chain.name_any();
        let owner = chain
            .controller_owner_ref(&())
            .expect("a Chain from the API has a uid");
        let labels = json!({
            LABEL_CHAIN: name,
            "app.kubernetes.io/managed-by": "zerohop",
        });
        let service = json!({
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": { "name": name, "namespace": ns, "labels": labels, "ownerReferences": [owner] },
            "spec": {
                "type": "ClusterIP",
                "ports": [{ "name": "http", "protocol": "TCP", "port": chain.spec.port.unwrap_or(80) }],
            },
        });
        let current = self
            .caches
            .services
            .state()
            .into_iter()
            .find(|s| s.namespace().as_deref() == Some(ns.as_str()) && s.name_any() == name);
        let port_now = current
            .as_ref()
            .and_then(|s| s.spec.as_ref())
            .and_then(|s| s.ports.as_ref())
            .and_then(|p| p.first())
            .map(|p| p.port);
        if port_now != Some(i32::from(chain.spec.port.unwrap_or(80))) {
            Api::<Service>::namespaced(self.client.clone(), &ns)
                .patch(
                    &name,
                    &PatchParams::apply(CONTROLLER_FIELD_MANAGER).force(),
                    &Patch::Apply(&service),
                )
                .await?;
        }
        // One slice per (gateway port, address family).
        let mut wanted: BTreeMap<String, serde_json::Value> = BTreeMap::new();
        let mut groups: BTreeMap<(u16, &str), Vec<&ReplicaEndpoint>> = BTreeMap::new();
        for e in endpoints.iter().filter(|e| !e.address.is_empty()) {
            let family = if e.address.contains(':') {
                "IPv6"
            } else {
                "IPv4"
            };
            groups.entry((e.port, family)).or_default().push(e);
        }
        for ((port, family), eps) in groups {
            let slice = format!("{name}-{port}-{}", family.to_ascii_lowercase());
            let body = json!({
                "apiVersion": "discovery.k8s.io/v1",
                "kind": "EndpointSlice",
                "metadata": {
                    "name": slice,
                    "namespace": ns,
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
        let api: Api<EndpointSlice> = Api::namespaced(self.client.clone(), &ns);
        let existing: Vec<Arc<EndpointSlice>> = self
            .caches
            .slices
            .state()
            .into_iter()
            .filter(|s| {
                s.namespace().as_deref() == Some(ns.as_str())
                    && s.labels().get(LABEL_CHAIN) == Some(&name)
            })
            .collect();
        for s in &existing {
            if !wanted.contains_key(&s.name_any()) {
                self.delete::<EndpointSlice>(&ns, &s.name_any()).await?;
            }
        }
        for (slice, body) in wanted {
            let same = existing
                .iter()
                .find(|s| s.name_any() == slice)
                .is_some_and(|s| {
                    let now = serde_json::to_value(&s.endpoints).unwrap_or_default();
                    now == body["endpoints"]
                        && serde_json::to_value(&s.ports).unwrap_or_default() == body["ports"]
                });
            if !same {
                api.patch(
                    &slice,
                    &PatchParams::apply(CONTROLLER_FIELD_MANAGER).force(),
                    &Patch::Apply(&body),
                )
                .await?;
            }
        }
        Ok(())
    }
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

/// The Chain an object the controller made belongs to (its label).
fn chain_label<K: Resource>(o: &K) -> String {
    o.labels().get(LABEL_CHAIN).cloned().unwrap_or_default()
}

/// The parts of `chain` among `parts`.
fn parts_of(chain: &Chain, parts: impl IntoIterator<Item = Arc<ChainPart>>) -> Vec<Arc<ChainPart>> {
    let ns = chain.namespace();
    let name = chain.name_any();
    parts
        .into_iter()
        .filter(|p| p.namespace() == ns && p.spec.chain == name)
        .collect()
}

/// Per part number, the functions it runs: part 0 what no `placement.parts` list names.
fn split_functions(chain: &Chain) -> Vec<Vec<String>> {
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

/// The replicas as the status shows them: every replica with a gateway part.
fn endpoints(
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

fn condition(type_: &str, ok: bool, reason: &str, message: &str) -> Condition {
    Condition {
        type_: type_.into(),
        status: if ok { "True" } else { "False" }.into(),
        reason: reason.into(),
        message: message.into(),
        observed_generation: None,
        last_transition_time: None,
    }
}

/// Sets each condition's generation, and its transition time: kept from `old` when the
/// status did not change, now otherwise.
fn carry_times(old: &[Condition], new: Vec<Condition>, generation: i64) -> Vec<Condition> {
    let now = jiff::Timestamp::now().to_string();
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
