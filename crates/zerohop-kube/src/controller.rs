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

pub use crate::desired::validate;
use crate::desired::{self, parts_of, Heartbeat};
use crate::placement::{self, Decision};
use crate::resources::{
    Chain, ChainPart, Condition, ReplicaEndpoint, ANNOTATION_ADDRESS, ANNOTATION_PEER,
    CONTROLLER_FIELD_MANAGER, LABEL_CHAIN, NODE_LEASE_PREFIX,
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
        let mut conditions = vec![desired::valid_condition(invalid.as_deref())];
        let want = desired::want(chain);
        if invalid.is_none() {
            // 2. Where do the parts go?
            let mine = parts_of(chain, all_parts.iter().cloned());
            let nodes = self.caches.nodes.state();
            let nodes = desired::node_infos(chain, &nodes, alive, all_parts, placed_now);
            let existing = desired::existing(&mine);
            let decision = placement::place(&want, &nodes, &existing, self.opts.ports.clone());
            self.apply_decision(chain, &decision, alive, &mine).await?;
            placed_now.extend(
                decision
                    .placed
                    .iter()
                    .filter(|p| p.existing.is_none())
                    .map(|p| (p.node.clone(), p.port)),
            );
            conditions.push(desired::placed_condition(chain, &decision));
        }
        // 3. Status, Service and endpoints from the parts as they are now.
        let mine_now = parts_of(chain, self.caches.parts.state());
        let endpoints = desired::endpoints(chain, &mine_now, alive, want.parts);
        conditions.push(desired::ready_condition(
            chain,
            invalid.is_some(),
            &endpoints,
            &mine_now,
        ));
        // The status is written even when the Service cannot be.
        let published = self.publish_service(chain, &endpoints).await;
        let old = chain.status.clone().unwrap_or_default();
        let status = desired::status(chain, &old, conditions, endpoints, jiff::Timestamp::now());
        // Warnings once per change of a condition.
        let before = self.last.get(&key).unwrap_or(&old.conditions);
        for c in desired::warnings(before, &status.conditions) {
            self.event(chain, EventType::Warning, &c.reason, c.message.clone())
                .await;
        }
        self.last.insert(key, status.conditions.clone());
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

    /// Deletes, creates and updates ChainParts as `decision` says.
    async fn apply_decision(
        &self,
        chain: &Chain,
        decision: &Decision,
        alive: &BTreeMap<String, Heartbeat>,
        mine: &[Arc<ChainPart>],
    ) -> Result<(), kube::Error> {
        let ns = chain.namespace().unwrap_or_default();
        let name = chain.name_any();
        for e in &decision.delete {
            let (type_, why) = desired::why_deleted(chain, e, alive);
            tracing::info!(chain = %name, "{why}");
            self.event(chain, type_, "Moved", why).await;
            self.delete::<ChainPart>(&ns, &e.name).await?;
        }
        let api: Api<ChainPart> = Api::namespaced(self.client.clone(), &ns);
        let part_functions = desired::split_functions(chain);
        for p in &decision.placed {
            let spec = desired::part_spec(chain, decision, p, alive, &part_functions);
            let current = mine.iter().find(|m| Some(m.name_any()) == p.existing);
            if current.is_some_and(|c| c.spec == spec) {
                continue;
            }
            if p.existing.is_none() {
                let why = desired::placed_note(p);
                tracing::info!(chain = %name, "{why}");
                self.event(chain, EventType::Normal, "Placed", why).await;
            }
            let body = desired::part_object(chain, p, &spec);
            api.patch(
                &desired::part_name(chain, p),
                &PatchParams::apply(CONTROLLER_FIELD_MANAGER).force(),
                &Patch::Apply(&body),
            )
            .await?;
        }
        Ok(())
    }

    /// The Chain's Service and its EndpointSlices, written where they differ from the
    /// caches.
    async fn publish_service(
        &self,
        chain: &Chain,
        endpoints: &[ReplicaEndpoint],
    ) -> Result<(), kube::Error> {
        let ns = chain.namespace().unwrap_or_default();
        let name = chain.name_any();
        let service = desired::service(chain);
        let current = self
            .caches
            .services
            .state()
            .into_iter()
            .find(|s| s.namespace().as_deref() == Some(ns.as_str()) && s.name_any() == name);
        if desired::service_needs_apply(chain, &service, current.as_deref()) {
            Api::<Service>::namespaced(self.client.clone(), &ns)
                .patch(
                    &name,
                    &PatchParams::apply(CONTROLLER_FIELD_MANAGER).force(),
                    &Patch::Apply(&service),
                )
                .await?;
        }
        let wanted = desired::slices(chain, endpoints);
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

/// The Chain an object the controller made belongs to (its label).
fn chain_label<K: Resource>(o: &K) -> String {
    o.labels().get(LABEL_CHAIN).cloned().unwrap_or_default()
}
