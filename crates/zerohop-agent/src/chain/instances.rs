//! Stages 6 and 7 of bringing a chain up: every instance started (or played here, for a
//! function on a peer node) and attached, then the chain's tasks started: a supervisor per
//! party, the scaler and its wakers, the offence enforcer, the hang watchdog, the servers.

use std::sync::Arc;
use std::time::{Duration, Instant};

use zerohop_pool::PartyState;

use super::listen::{join_threads, serve_all, Bound, GatewaysUp};
use super::{AgentError, Running, UpOptions};
use crate::spec::ChainSpec;
use crate::supervise::{self, Instance, InstanceSpec, Shared, Want};
use crate::watchdog;

/// Every party started as [`start_instances`] says and attached; on failure every instance
/// already started is stopped and reaped, and the gateway stopped, before the error is
/// returned: nothing is left.
pub(super) async fn start_all(
    spec: &ChainSpec,
    shared: &Arc<Shared>,
    opts: &UpOptions,
    gateways: GatewaysUp,
) -> Result<
    (
        Vec<(InstanceSpec, Option<Instance>)>,
        Vec<crate::relay::RelayParty>,
        GatewaysUp,
    ),
    AgentError,
> {
    let mut instances: Vec<(InstanceSpec, Option<Instance>)> = Vec::new();
    let mut relays = Vec::new();
    let Err(e) = start_instances(spec, shared, opts, &mut instances, &mut relays).await else {
        return Ok((instances, relays, gateways));
    };
    for (inst, instance) in &mut instances {
        if let Some(i) = instance {
            supervise::terminate(shared, inst.party, i).await;
        }
    }
    join_threads(relays.into_iter().map(|r| r.stop()).collect()).await;
    // What they printed (why they failed) is read and echoed before the error returns,
    // and its last lines go into the error (a daemon has no terminal to echo to).
    shared.logs.close().await;
    let e = match e {
        AgentError::NotReady {
            function,
            party,
            what,
            ..
        } => {
            let lines: Vec<String> = shared
                .logs
                .snapshot(Some(&function), 50)
                .into_iter()
                .filter(|l| l.instance == party)
                .map(|l| l.text)
                .collect();
            let last = &lines[lines.len().saturating_sub(5)..];
            AgentError::NotReady {
                function,
                party,
                what,
                output: if last.is_empty() {
                    String::new()
                } else {
                    format!("; its last output: {}", last.join(" | "))
                },
            }
        }
        e => e,
    };
    gateways.abort().await;
    Err(e)
}

/// Starts the chain's tasks around its attached `instances` and `relays`, and party 0's
/// servers on the caller's runtime: the chain is up (`summary` says how, in one line).
pub(super) fn supervise_all(
    spec: &ChainSpec,
    summary: String,
    shared: Arc<Shared>,
    instances: Vec<(InstanceSpec, Option<Instance>)>,
    relays: Vec<crate::relay::RelayParty>,
    gateways: GatewaysUp,
    bound: Bound,
) -> Running {
    let GatewaysUp {
        first_listeners,
        receiving,
        threads,
        served,
        http_stop,
        http_rx,
        instance_stop,
        stop_rx,
    } = gateways;
    let supervisors = instances
        .into_iter()
        .map(|(inst, instance)| {
            tokio::spawn(supervise::supervise(
                shared.clone(),
                inst,
                instance,
                stop_rx.clone(),
            ))
        })
        .collect();
    let scaler = tokio::spawn(crate::scale::run(shared.clone(), stop_rx.clone()));
    let wakers = match crate::scale::Wakers::start(&shared) {
        Ok(w) => Some(w),
        Err(e) => {
            tracing::warn!(
                "cannot start the scaler's waker thread: {e}; a function sending to another \
                 with no ready instance waits for the scaler's next look (10 ms)"
            );
            None
        }
    };
    let enforcer = tokio::spawn(crate::enforcer::run(shared.clone(), stop_rx.clone()));
    let watchdog = tokio::spawn(watchdog::watch(shared.clone(), spec.timeout, stop_rx));
    let first = shared.gateways.iter().next().expect("one").clone();
    let mut others = Vec::new();
    if let Some(m) = bound.mqtt {
        others.push(tokio::spawn(first.clone().serve_mqtt(m, http_rx.clone())));
    }
    let coap = bound.coap;
    let coap_addr = coap.as_ref().and_then(|s| s.local_addr().ok());
    if let Some(c) = coap {
        others.push(tokio::spawn(first.clone().serve_coap(c, http_rx.clone())));
    }
    let server = tokio::spawn(serve_all(first, first_listeners, http_rx));
    let view = crate::status::ChainView {
        shared: shared.clone(),
        name: spec.name.clone(),
        spec_file: spec.file.display().to_string(),
        listeners: bound.listeners.clone(),
        started: Instant::now(),
    };
    Running {
        view,
        addr: bound.addr,
        listeners: bound.listeners,
        coap: coap_addr,
        others,
        shared,
        http_stop,
        instance_stop,
        server,
        supervisors,
        watchdog,
        enforcer,
        scaler,
        wakers,
        receiving,
        relays,
        gateway_threads: threads,
        served,
        summary,
    }
}

/// Starts every party of `spec` as the chain comes up: per function its `initial`
/// instances serving, then up to `parked` more waiting parked, the rest without a process;
/// waits until every started one has attached (serving or parked).
async fn start_instances(
    spec: &ChainSpec,
    shared: &Arc<Shared>,
    opts: &UpOptions,
    instances: &mut Vec<(InstanceSpec, Option<Instance>)>,
    relays: &mut Vec<crate::relay::RelayParty>,
) -> Result<(), AgentError> {
    let plan = shared.gateways.plan().clone();
    let mut relaying = Vec::new();
    for (index, f) in spec.functions.iter().enumerate() {
        let parties = plan.parties_of(index as u8);
        if let Some(peer) = f.relay {
            // Played here: its first party relays, the spare one stays unused.
            let spawn_err = |source: std::io::Error| AgentError::Spawn {
                function: f.name.clone(),
                program: format!("relay to {peer}"),
                source,
            };
            let link = opts.link.as_ref().ok_or_else(|| {
                spawn_err(std::io::Error::other(
                    "the function runs on a peer node, and this agent has no peer link",
                ))
            })?;
            for (k, party) in parties.into_iter().enumerate() {
                let want = if k == 0 { Want::Run } else { Want::Stop };
                if let Some(c) = shared.parties.get(party as usize) {
                    c.want.send_replace(want);
                }
                if want == Want::Stop {
                    shared.set_state(party, PartyState::Stopped);
                    continue;
                }
                shared.set_state(party, PartyState::Starting);
                let inst = InstanceSpec {
                    party,
                    index,
                    function: f.name.clone(),
                };
                relays.push(crate::relay::start(shared, &inst, peer, link).map_err(spawn_err)?);
                relaying.push((f.name.clone(), party));
            }
            continue;
        }
        let serving = usize::from(f.scale.initial);
        let parked = usize::from(f.scale.parked).min(parties.len().saturating_sub(serving));
        for (k, party) in parties.into_iter().enumerate() {
            let want = if k < serving {
                Want::Run
            } else if k < serving + parked {
                Want::Park
            } else {
                Want::Stop
            };
            if let Some(c) = shared.parties.get(party as usize) {
                c.want.send_replace(want);
            }
            let inst = InstanceSpec {
                party,
                index,
                function: f.name.clone(),
            };
            if want == Want::Stop {
                shared.set_state(party, PartyState::Stopped);
                instances.push((inst, None));
                continue;
            }
            let child = supervise::spawn(shared, &inst, want == Want::Park).map_err(|source| {
                AgentError::Spawn {
                    function: f.name.clone(),
                    program: f.command[0].clone(),
                    source,
                }
            })?;
            instances.push((inst, Some(child)));
        }
    }
    let attached = |party: u16| match shared.want_of(party) {
        Want::Run => shared.ready(party),
        Want::Park => shared.state(party) == PartyState::Parked,
        Want::Stop => true,
    };
    let deadline = Instant::now() + opts.ready_timeout;
    loop {
        let mut all_ready = true;
        for (inst, instance) in instances.iter_mut() {
            let Some(instance) = instance else { continue };
            if let Ok(Some(status)) = instance.child.try_wait() {
                return Err(AgentError::NotReady {
                    function: inst.function.clone(),
                    party: inst.party,
                    what: format!("exited ({status})"),
                    output: String::new(),
                });
            }
            all_ready &= attached(inst.party);
        }
        if let Some((function, party)) = relaying.iter().find(|(_, p)| !shared.ready(*p)) {
            all_ready = false;
            if Instant::now() > deadline {
                return Err(AgentError::NotReady {
                    function: function.clone(),
                    party: *party,
                    what: format!("(relaying) did not attach within {:?}", opts.ready_timeout),
                    output: String::new(),
                });
            }
        }
        if all_ready {
            return Ok(());
        }
        if Instant::now() > deadline {
            let (inst, _) = instances
                .iter()
                .find(|(i, _)| !attached(i.party))
                .expect("some instance is not ready");
            return Err(AgentError::NotReady {
                function: inst.function.clone(),
                party: inst.party,
                what: format!("did not attach within {:?}", opts.ready_timeout),
                output: String::new(),
            });
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
