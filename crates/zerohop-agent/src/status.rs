//! What a running chain looks like from outside: the agent's own records (instances, pids,
//! restarts) plus counters read from the gateway and the pools, turned into the admin API's
//! [`ChainStatus`].
//!
//! Nothing here trusts shared memory for more than a number to show: party states and slot
//! owners are read as they are, never acted upon.

use std::sync::Arc;
use std::time::Instant;

use zerohop_pool::{Owner, PartyState, LATENCY_BUCKETS};
use zerohop_transport::GATEWAY_FN;

use crate::api::{
    ChainStatus, FunctionStatus, GatewayCounters, InstanceStatus, KernelCounters, RouteStatus,
    SlotCounters,
};
use crate::parties::{PartyControl, Want};
use crate::shared::Shared;

/// Why a function cannot be scaled as asked ([`ChainView::scale`]).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum ScaleError {
    /// The chain has no such function.
    #[error("chain '{chain}' has no function '{function}'; its functions: {}", functions.join(", "))]
    NoFunction {
        /// The chain.
        chain: String,
        /// The name given.
        function: String,
        /// The chain's functions.
        functions: Vec<String>,
    },
    /// More instances than the function's `scale.max`.
    #[error(
        "function '{function}' may have at most {max} instances (its scale.max; the chain \
         reserves {reserved} parties for it); raise scale.max in the spec and apply it"
    )]
    AboveMax {
        /// The function.
        function: String,
        /// Its `scale.max`.
        max: u16,
        /// The parties the chain reserved for it.
        reserved: u16,
    },
}

/// A cheap, cloneable handle on a running chain for status and metrics (it does not keep the
/// chain running: [`Running`](crate::Running) does).
#[derive(Clone)]
pub struct ChainView {
    pub(crate) shared: Arc<Shared>,
    pub(crate) name: String,
    pub(crate) spec_file: String,
    pub(crate) listeners: Vec<String>,
    pub(crate) started: Instant,
}

impl ChainView {
    /// Runs function `function` on a hop a peer node relays (this node runs that function of
    /// a chain split over nodes): through the relay route that stands for route `route`,
    /// with the peer's slot metadata `meta` and `payload`, within `timeout`. An error is
    /// the status and the one-line message the peer's client gets.
    pub async fn relayed(
        &self,
        route: u16,
        function: &str,
        meta: &[u8],
        payload: &[u8],
        timeout: std::time::Duration,
    ) -> Result<zerohop_gateway::Reply, (u16, String)> {
        let gateways = &self.shared.gateways;
        let plan = gateways.plan();
        let relay = plan.function_index(function).and_then(|f| {
            plan.routes
                .iter()
                .position(|r| r.relay_of == Some(route) && r.sequence == [f])
        });
        let Some(relay) = relay else {
            return Err((
                404,
                format!(
                    "chain '{}' runs no function `{function}` for route {route} on this node",
                    self.name
                ),
            ));
        };
        // Any gateway party will do (answers find their way by request id); spread them.
        let n = RELAYED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let gw = gateways
            .iter()
            .nth(n % gateways.len())
            .expect("a chain has a gateway");
        gw.submit_relayed(relay as u16, meta, payload, timeout)
            .await
            .map_err(|e| (e.status.as_u16(), e.to_string()))
    }

    /// Pins function `function` to at least `n` serving instances (its `min`; under load it
    /// still grows to `max`), starting or activating them now. `n` may be 0 (scale to zero
    /// once idle for `zero_after`). Errors name what is wrong.
    pub fn scale(&self, function: &str, n: u16) -> Result<crate::spec::ScaleSpec, ScaleError> {
        let plan = self.shared.gateways.plan();
        let Some(f) = plan.function_index(function) else {
            return Err(ScaleError::NoFunction {
                chain: self.name.clone(),
                function: function.to_owned(),
                functions: plan.functions.iter().map(|f| f.name.clone()).collect(),
            });
        };
        // A fused group scales as one: through any of its functions, its first one's.
        let f = plan.host_of(f);
        let reserved = plan.parties_of(f).len() as u16;
        self.shared
            .scaling
            .set_min(usize::from(f), n)
            .map_err(|b| ScaleError::AboveMax {
                function: function.to_owned(),
                max: b.max,
                reserved,
            })
    }

    /// Chain name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Every way in, as URLs.
    pub fn listeners(&self) -> &[String] {
        &self.listeners
    }

    /// The gateways (to submit requests, read counters).
    pub fn gateways(&self) -> &zerohop_gateway::Gateways {
        &self.shared.gateways
    }

    /// What its instances print.
    pub fn logs(&self) -> &crate::logs::LogBook {
        self.shared.launch.logs()
    }

    /// Seconds since the chain came up.
    pub fn uptime_s(&self) -> u64 {
        self.started.elapsed().as_secs()
    }

    /// The chain now.
    pub fn status(&self) -> ChainStatus {
        let s = &self.shared;
        let gws = &s.gateways;
        let plan = gws.plan();
        let pools = gws.pools();
        let total =
            |c: fn(&zerohop_gateway::GatewayStats) -> &std::sync::atomic::AtomicU64| gws.total(c);
        let bounds = s.scaling.bounds();
        let mut functions: Vec<FunctionStatus> = plan
            .functions
            .iter()
            .enumerate()
            .map(|(i, f)| {
                let b = bounds.get(i);
                let host = plan.host_of(i as u8);
                FunctionStatus {
                    name: f.name.clone(),
                    fused: if plan.is_fused(host) {
                        plan.group_name(host)
                    } else {
                        String::new()
                    },
                    min: b.map_or(1, |b| b.min),
                    max: b.map_or(1, |b| b.max),
                    target: b.map_or(1, |b| b.target),
                    latency_buckets: vec![0; LATENCY_BUCKETS],
                    ..Default::default()
                }
            })
            .collect();
        let kernel = s.transport.kernel_counters();
        if let Some(k) = &kernel {
            for (fs, row) in functions.iter_mut().zip(&k.functions) {
                fs.kernel = Some(KernelCounters::from_row(row));
            }
        }
        // One pass over every owner word: slots in use, and held per party.
        let mut held = vec![0u64; plan.party_function.len()];
        let (mut in_use, mut large_in_use) = (0u64, 0u64);
        for p in pools.iter() {
            let owners = p.owners();
            for w in (0..owners.len()).filter_map(|l| owners.get(l)) {
                if w.owner == Owner::FREE {
                    continue;
                }
                in_use += 1;
                if p.releases() {
                    large_in_use += 1;
                }
                if let Some(h) = w
                    .owner
                    .as_party()
                    .and_then(|q| held.get_mut(usize::from(q)))
                {
                    *h += 1;
                }
            }
        }
        let lanes = crate::spec::cpus::lanes(&plan.party_function, plan.cpus.len());
        for (party, &f) in plan.party_function.iter().enumerate() {
            if party < usize::from(plan.gateways()) || f == GATEWAY_FN {
                continue;
            }
            let Some(fs) = functions.get_mut(f as usize) else {
                continue;
            };
            let party = party as u16;
            let parties = &s.parties;
            let control = parties.get(party);
            let pgid = control.map_or(0, PartyControl::pgid);
            let restarts = control.map_or(0, PartyControl::restarts);
            let want = control.map_or(Want::Stop, |c| c.wanted());
            let state = if pgid == 0 {
                match (parties.state(party), want) {
                    (PartyState::Dead, _) => "dead",
                    // Wanted, its process about to be started.
                    (_, Want::Run | Want::Park) => "starting",
                    _ => "stopped",
                }
            } else if parties.ready(party) {
                "ready"
            } else {
                match parties.state(party) {
                    PartyState::Dead => "dead",
                    PartyState::Parked => "parked",
                    PartyState::Draining => "draining",
                    _ => "starting",
                }
            };
            match state {
                "ready" => fs.ready += 1,
                "parked" => fs.parked += 1,
                _ => {}
            }
            if want == Want::Run {
                fs.desired += 1;
            }
            fs.restarts += u64::from(restarts);
            if let Some(c) = control {
                fs.activations += c.activations();
                fs.cold_starts += c.cold_starts();
            }
            // The party's counters live in its first pool's record.
            if let Some(r) = parties.records(party).next() {
                let st = r.stats();
                // A dead instance's handlers are not running, whatever its record says.
                if pgid != 0 {
                    fs.busy += u64::from(st.busy);
                }
                fs.handled = fs.handled.saturating_add(st.handled);
                fs.failed = fs.failed.saturating_add(st.failed);
                fs.latency_us_sum = fs.latency_us_sum.saturating_add(st.latency_us_sum);
                for (acc, v) in fs.latency_buckets.iter_mut().zip(st.buckets) {
                    *acc = acc.saturating_add(v);
                }
                for (acc, v) in fs.rejected.iter_mut().zip(st.rejected) {
                    *acc = acc.saturating_add(v);
                }
            }
            fs.slots += held[usize::from(party)];
            let usage = control
                .and_then(PartyControl::usage)
                .map(|probe| probe.read())
                .unwrap_or_default();
            // A party with no process and no wish for one is room to scale into, not an
            // instance.
            if pgid == 0 && want == Want::Stop {
                continue;
            }
            // The scaler's last activation decision: when, and parked or cold.
            let decided = control
                .map(|c| {
                    let (ns, cold) = c.last_decision();
                    (ns, if cold { "cold" } else { "parked" })
                })
                .filter(|&(ns, _)| ns != 0);
            fs.instances.push(InstanceStatus {
                party,
                pid: (pgid != 0).then_some(pgid),
                state: state.into(),
                restarts,
                cpu_ns: usage.cpu_ns,
                memory_bytes: usage.memory_bytes,
                throttled: usage.nr_throttled,
                activated_ns: decided.map(|(ns, _)| ns),
                activation: decided.map(|(_, how)| how.into()),
                cpu: lanes[usize::from(party)].map(|l| plan.cpus[l]),
            });
        }
        let access = gws.iter().next().map(|g| g.access());
        let routes = plan
            .routes
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let mut guards = access.map(|a| a.describe(i)).unwrap_or_default();
                if !r.content_type.is_empty() {
                    guards.push(format!("content type {}", r.content_type));
                }
                if let Some(d) = gws.iter().next().and_then(|g| g.deferred()) {
                    guards.extend(d.describe(i));
                }
                let mut triggers = Vec::new();
                if r.grpc {
                    triggers.push(format!("grpc {}", r.path.trim_start_matches('/')));
                } else if !r.path.is_empty() {
                    triggers.push(format!("{} {}", r.method, r.path));
                }
                if !r.mqtt.is_empty() {
                    triggers.push(format!("mqtt {}", r.mqtt));
                }
                if !r.coap.is_empty() {
                    triggers.push(format!("coap {}", r.coap));
                }
                if let Some(of) = r.relay_of {
                    // No trigger of its own: hops a peer node relays for one of its routes.
                    let of = plan
                        .routes
                        .get(of as usize)
                        .filter(|o| !o.path.is_empty())
                        .map_or(format!("#{of}"), |o| format!("{} {}", o.method, o.path));
                    triggers.push(format!("relayed from a peer ({of})"));
                }
                RouteStatus {
                    triggers,
                    guards,
                    sequence: r
                        .sequence
                        .iter()
                        .map(|&f| plan.function_name(f).to_owned())
                        .collect(),
                }
            })
            .collect();
        for fs in &mut functions {
            if let Some(l) = s.launch.logs().stats(&fs.name) {
                fs.log_lines = l.kept + l.evicted;
                fs.log_dropped = l.dropped;
            }
        }
        ChainStatus {
            name: self.name.clone(),
            spec: self.spec_file.clone(),
            listeners: self.listeners.clone(),
            metrics_url: None,
            transport: plan.transport.clone(),
            confinement: s.launch.jail().describe(),
            uptime_s: self.uptime_s(),
            gateway: GatewayCounters {
                accepted: total(|s| &s.accepted),
                ok: total(|s| &s.ok),
                errors: total(|s| &s.errors),
                inflight: gws.inflight() as u64,
                refused: total(|s| &s.refused),
                late: total(|s| &s.late),
                kernel: kernel
                    .as_ref()
                    .map(|k| KernelCounters::from_row(&k.functions[GATEWAY_FN as usize])),
            },
            slots: SlotCounters {
                in_use,
                total: pools.iter().map(|p| u64::from(p.slot_count())).sum(),
                large_in_use,
                large_total: pools
                    .iter()
                    .filter(|p| p.releases())
                    .map(|p| u64::from(p.slot_count()))
                    .sum(),
                max_body: gws.iter().next().map_or(0, |g| g.max_body()),
            },
            functions,
            routes,
        }
    }
}

/// Relayed hops taken so far (which gateway party takes the next one). Relaxed: only
/// spreads work, orders nothing.
static RELAYED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
