//! Stage 3 of bringing a chain up: its shared memory and transport. One pool per security
//! domain and its large pool when bodies may outgrow a slot (each function maps only its own
//! domains' pools), the transport with the policy
//! the plan allows, the gateway's parties (their senders and validating endpoints, counted
//! as the agent's own for [`crate::offence`]), and the state store (a chain it replaces
//! hands its store over).

use std::sync::Arc;

use zerohop_gateway::{Access, GatewayConfig, Gateways};
use zerohop_pool::{PartyState, Pool, PoolError, Pools};
use zerohop_transport::{Backend, Endpoint, Plan, PlanExt, Transport, TransportError};

use super::AgentError;
use crate::offence::Offences;
use crate::spec::{ChainSpec, SpecError};

/// What [`wire`] made.
pub(super) struct Wired {
    /// Per party, the pools it maps (the gateway's parties map all of them).
    pub party_pools: Vec<Pools>,
    /// The chain's transport; the agent acts only as the gateway's parties.
    pub transport: Box<dyn Transport>,
    /// The gateway's parties, with the plan.
    pub gateways: Gateways,
    /// Per gateway party, its validating receiving end (consumed when its thread starts).
    pub endpoints: Vec<Endpoint>,
    /// What the agent's own parties saw each sender send that was invalid.
    pub offences: Arc<Offences>,
    /// The plan as every instance is handed it.
    pub plan_json: String,
    /// The chain's state store, if its spec has one.
    pub state: Option<Arc<zerohop_pool::State>>,
}

/// Makes the pools, the transport (`backend`) and the `gateway_threads` parties of `spec`'s
/// chain by its `plan` (all three from [`validate`](super::validate::validate));
/// `inherited` is the state store of a chain this one replaces.
pub(super) fn wire(
    spec: &ChainSpec,
    backend: Backend,
    gateway_threads: u16,
    plan: Plan,
    inherited: Option<Arc<zerohop_pool::State>>,
) -> Result<Wired, AgentError> {
    let domains = plan.domains().len();
    // Per domain its pools in hand-over order: the small pool, then the large pool if the
    // chain has large pools (docs/protocol.md, "Large pools").
    let mut by_domain: Vec<Vec<Arc<Pool>>> = Vec::with_capacity(domains);
    for i in 0..domains {
        // The shapes every party is told through the plan (validated: they fit).
        let geometries = plan.pool_geometries(i).ok_or_else(|| {
            AgentError::Pool(PoolError::Geometry(format!(
                "security domain {i}'s slots do not fit a descriptor"
            )))
        })?;
        let name = if domains == 1 {
            spec.name.clone()
        } else {
            format!("{}:{i}", spec.name)
        };
        let made = geometries
            .iter()
            .map(|g| {
                let name = if g.release {
                    format!("{name}:large")
                } else {
                    name.clone()
                };
                Pool::create(&name, g).map(Arc::new)
            })
            .collect::<Result<Vec<_>, _>>()?;
        by_domain.push(made);
    }
    let pools = Pools::new(by_domain.iter().flatten().cloned().collect())?;
    // Per function the pools of its domains, once; every instance of it shares that set.
    let function_pools = (0..plan.functions.len())
        .map(|f| {
            Pools::new(
                plan.domains_of(f as u8)
                    .into_iter()
                    .flat_map(|d| by_domain[d].iter().cloned())
                    .collect(),
            )
        })
        .collect::<Result<Vec<_>, _>>()?;
    let party_pools: Vec<Pools> = plan
        .party_function
        .iter()
        .enumerate()
        .map(|(p, &f)| {
            if p < usize::from(gateway_threads) {
                pools.clone()
            } else {
                function_pools[f as usize].clone()
            }
        })
        .collect();
    let policy = Arc::new(
        plan.policy()
            .map_err(|e| TransportError::Layout(e.to_string()))?,
    );
    let mut transport = zerohop_transport::create(backend, &spec.name, &policy, plan.options())?;
    // The agent is only the gateway's parties; it keeps the rest as bare descriptors.
    transport.act_only_as(&(0..gateway_threads).collect::<Vec<_>>())?;
    // What the agent's own parties (gateway threads, relays) see of each sender's invalid
    // descriptors: the only counts the agent kills for.
    let receivers =
        usize::from(gateway_threads) + spec.functions.iter().filter(|f| f.relay.is_some()).count();
    let offences = Arc::new(Offences::new(
        usize::from(plan.parties()),
        crate::offence::limit(plan.queue_capacity, receivers),
    ));
    let mut senders = Vec::new();
    let mut endpoints = Vec::new();
    for g in 0..gateway_threads {
        senders.push(transport.sender(g)?);
        endpoints.push(
            Endpoint::new(pools.clone(), policy.clone(), g, transport.receiver(g)?)
                .with_blame(offences.clone()),
        );
    }
    let plan_json = plan.to_json();
    // Key files read and JWKS URLs fetched now: a route that cannot check its callers does
    // not start (the error names the route's line and field).
    let access = Arc::new(Access::new(&spec.routes).map_err(|e| {
        AgentError::Spec(SpecError {
            file: spec.file.display().to_string(),
            line: spec.routes.get(e.route).map_or(1, |r| r.line),
            field: format!("routes[{}].{}", e.route, e.field),
            message: e.message,
        })
    })?);
    let state = state_store(spec, inherited)?;
    let gateways = Gateways::new(
        pools.clone(),
        senders,
        Arc::new(plan),
        GatewayConfig {
            max_body: spec.max_body,
            timeout: spec.timeout,
            body_timeout: spec.body_timeout,
            max_connections: spec.max_connections,
            access,
        },
    );
    super::deferred::open(spec, &gateways)?;
    for g in 0..gateway_threads {
        pools.records(g).for_each(|r| {
            r.set_pid(std::process::id());
            r.set_state(PartyState::Ready);
        });
    }
    Ok(Wired {
        party_pools,
        transport,
        gateways,
        endpoints,
        offences,
        plan_json,
        state,
    })
}

/// The chain's state store: the one `inherited` from the chain it replaces (which must have
/// the spec's shape), else a new one, if the spec has `state`.
fn state_store(
    spec: &ChainSpec,
    inherited: Option<Arc<zerohop_pool::State>>,
) -> Result<Option<Arc<zerohop_pool::State>>, AgentError> {
    Ok(match (spec.state, inherited) {
        (Some(g), Some(old)) => {
            if (old.capacity(), old.value_size()) != (g.entries as usize, g.value_size as usize) {
                return Err(AgentError::StateShape {
                    entries: old.capacity(),
                    value_size: old.value_size(),
                    want_entries: g.entries,
                    want_value_size: g.value_size,
                });
            }
            Some(old)
        }
        (Some(g), None) => Some(Arc::new(zerohop_pool::State::create(
            &spec.name,
            zerohop_pool::StateConfig {
                entries: g.entries,
                value_size: g.value_size,
            },
        )?)),
        (None, _) => None,
    })
}
