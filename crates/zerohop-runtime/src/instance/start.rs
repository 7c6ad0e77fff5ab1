//! Attaching an instance from the agent's hand-over: its `ZEROHOP_*` environment and
//! inherited descriptors ([`start`]), or a plan, a party and descriptors given directly
//! ([`attach`]); and [`run`], which starts and serves.

use std::sync::Arc;

use zerohop_pool::{Pool, Pools, Progress, State, StateConfig};
use zerohop_transport::{Backend, Endpoint, PartyId, Picker, Plan, PlanExt, GATEWAY_FN};

use super::dispatch::Dispatcher;
use super::error::{HandOverError, StartError};
use super::serve::Instance;
use crate::{env, logging, sys, Handler};

fn var(name: &'static str) -> Result<String, StartError> {
    std::env::var(name).map_err(|_| StartError::NotUnderAgent(name))
}

fn num<T: std::str::FromStr>(name: &'static str) -> Result<T, StartError> {
    var(name)?
        .parse()
        .map_err(|_| HandOverError::NotANumber(name).into())
}

/// Attaches to the chain described by the `ZEROHOP_*` environment and inherited fds. Installs
/// the SDK's `tracing` subscriber first, unless the program has one (see the crate's
/// "Logging").
pub fn start() -> Result<Instance, StartError> {
    logging::init();
    let plan = Plan::from_json(&var(env::PLAN)?).map_err(HandOverError::Plan)?;
    let me: PartyId = num(env::PARTY)?;
    let nfds: usize = num(env::FDS)?;
    let agent: u32 = num(env::AGENT_PID)?;
    if !sys::die_with_parent(agent) {
        return Err(StartError::Orphan(agent));
    }
    let fds = (0..nfds as i32)
        .map(|i| {
            let fd = env::FIRST_FD + i;
            sys::take_inherited(fd).ok_or(HandOverError::NotInherited(fd))
        })
        .collect::<Result<Vec<_>, _>>()?;
    // In a chain with `cpus`, on the core of this instance's lane, before its handler
    // threads exist (threads the language's runtime started already are pinned too).
    if let Some(cpu) = plan.cpu_of(me) {
        if let Err(e) = sys::pin_process(cpu) {
            tracing::warn!("cannot run on CPU {cpu} as the chain's `cpus` asks: {e}");
        }
    }
    attach(plan, me, fds)
}

/// Attaches party `me` of the chain `plan` describes, with the hand-over descriptors `fds`
/// in the agent's order (the pools of the function's domains, the state store when it has
/// one, its progress records, then the transport's): what [`start`] does with what the agent
/// handed to the process. The agent itself uses it for a party it plays in its own process.
pub fn attach(
    plan: Plan,
    me: PartyId,
    mut fds: Vec<std::os::fd::OwnedFd>,
) -> Result<Instance, StartError> {
    let backend: Backend = plan
        .transport
        .parse()
        .map_err(|_| HandOverError::UnknownTransport(plan.transport.clone()))?;
    let policy = Arc::new(plan.policy().map_err(HandOverError::Policy)?);
    let function = policy
        .function_of(me)
        .filter(|&f| f != GATEWAY_FN)
        .ok_or(HandOverError::NoFunction(me))?;
    // First the pools of this function's domains, in domain order: per domain its small
    // pool, then its large pool when the plan has large pools.
    let domains = plan.domains_of(function);
    let geometries = domains
        .iter()
        .map(|&d| {
            plan.pool_geometries(d)
                .ok_or(HandOverError::PoolOutOfRange(d))
        })
        .collect::<Result<Vec<_>, _>>()?
        .concat();
    if domains.is_empty() || fds.len() < geometries.len() {
        return Err(HandOverError::TooFewDescriptors {
            fds: fds.len(),
            domains: domains.len(),
        }
        .into());
    }
    // Each pool's shape comes from the plan; its header is only compared with it.
    let pools = fds
        .drain(..geometries.len())
        .zip(&geometries)
        .map(|(fd, geometry)| Ok(Arc::new(Pool::attach(fd, geometry)?)))
        .collect::<Result<Vec<_>, StartError>>()?;
    let pools = Pools::new(pools)?;
    // Then the state store, for a function with `state`.
    let state = match plan.state {
        Some(geometry) if plan.functions[function as usize].state => {
            if fds.is_empty() {
                return Err(HandOverError::NoStateStore.into());
            }
            let cfg = StateConfig {
                entries: geometry.entries,
                value_size: geometry.value_size,
            };
            Some(State::attach(fds.remove(0), cfg)?)
        }
        _ => None,
    };
    // Then its progress records, one per handler thread (as many as the plan says).
    if fds.is_empty() {
        return Err(HandOverError::NoProgress.into());
    }
    let threads = plan.functions[function as usize].handler_threads();
    let progress = Some(Progress::attach(fds.remove(0), threads)?);
    let transport = zerohop_transport::attach(backend, &policy, me, fds, plan.options())?;
    let endpoint = Endpoint::new(pools.clone(), policy, me, transport.receiver(me)?);
    let router = Dispatcher {
        span: logging::instance_span(&plan.chain, &plan.group_name(function), me),
        picker: Picker::new(&plan, me),
        ids: plan.request_ids(),
        sender: transport.sender(me)?,
        plan: Arc::new(plan),
        pools,
        function,
        me,
        state,
        progress,
    };
    Ok(Instance {
        router: Arc::new(router),
        endpoint,
        me,
    })
}

/// Runs `handler` as this process's function until the agent stops it. Never returns.
pub fn run<H: Handler>(handler: H) -> ! {
    match start() {
        Ok(instance) => instance.serve(handler),
        Err(e) => {
            tracing::error!("cannot start: {e}");
            std::process::exit(2)
        }
    }
}
