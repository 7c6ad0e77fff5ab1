//! Stages 6 and 7 of bringing a chain up: every instance started (or played here, for a
//! function on a peer node) and attached, then the chain's tasks started: a supervisor per
//! party, the scaler and its wakers, the offence enforcer, the hang watchdog, the servers.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use zerohop_pool::PartyState;

use super::listen::{join_threads, serve_all, Bound, GatewaysUp};
use super::{AgentError, Running, UpOptions};
use crate::parties::Want;
use crate::shared::Shared;
use crate::spec::ChainSpec;
use crate::supervise::{self, Instance, InstanceSpec};
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
            supervise::terminate(&shared.parties, shared.launch.jail(), inst.party, i).await;
        }
    }
    join_threads(relays.into_iter().map(|r| r.stop()).collect()).await;
    // What they printed (why they failed) is read and echoed before the error returns,
    // and its last lines go into the error (a daemon has no terminal to echo to).
    shared.launch.logs().close().await;
    let e = match e {
        AgentError::NotReady {
            function,
            party,
            what,
            ..
        } => {
            let lines: Vec<String> = shared
                .launch
                .logs()
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
    // Each task owns a handle on `shared` and borrows from it only the parts it uses.
    let supervisors = instances
        .into_iter()
        .map(|(inst, instance)| {
            let (s, stop) = (shared.clone(), stop_rx.clone());
            tokio::spawn(async move {
                supervise::supervise(s.supervision(), inst, instance, stop).await
            })
        })
        .collect();
    let (s, stop) = (shared.clone(), stop_rx.clone());
    let scaler = on_own_thread("scaler", async move {
        crate::scale::run(
            &s.scaling,
            &s.parties,
            &s.gateways,
            s.transport.as_ref(),
            stop,
        )
        .await
    });
    let wakers = match crate::scale::Wakers::start(shared.gateways.pools(), &shared.scaling) {
        Ok(w) => Some(w),
        Err(e) => {
            tracing::warn!(
                "cannot start the scaler's waker thread: {e}; a function sending to another \
                 with no ready instance waits for the scaler's next look (10 ms)"
            );
            None
        }
    };
    let (s, stop) = (shared.clone(), stop_rx.clone());
    let enforcer = on_own_thread("enforcer", async move {
        let transport = s.transport.as_ref();
        crate::enforcer::run(&s.parties, &s.gateways, transport, &s.offences, stop).await
    });
    let (s, timeout) = (shared.clone(), spec.timeout);
    let watchdog = on_own_thread("watchdog", async move {
        let (parties, gateways) = (&s.parties, &s.gateways);
        watchdog::watch(parties, gateways, timeout, stop_rx).await
    });
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
    if let Some(tls) = &bound.tls {
        // New certificates for new handshakes when the files change, until the chain stops.
        others.push(tokio::spawn(tls.clone().watch(http_rx.clone())));
    }
    let server = tokio::spawn(serve_all(
        first,
        first_listeners,
        bound.tls.clone(),
        http_rx,
    ));
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

/// Runs `task` on a thread of its own (with a current-thread runtime): the scaler, the
/// enforcer and the watchdog look at every party, which with a thousand instances takes
/// milliseconds, and party 0's gateway serves on the caller's runtime; supervision never
/// shares a thread with the traffic it supervises. The handle resolves when the task ended
/// (on the caller's runtime, if the thread cannot be made).
fn on_own_thread<F>(name: &str, task: F) -> tokio::task::JoinHandle<()>
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    let (done_tx, done) = tokio::sync::oneshot::channel::<()>();
    let slot = Arc::new(std::sync::Mutex::new(Some(task)));
    let started = std::thread::Builder::new().name(name.to_owned()).spawn({
        let (name, task) = (name.to_owned(), slot.clone());
        move || {
            // Not on the core of gateway 0's pipeline, where the chain's thread may be.
            super::cores::float();
            let Some(task) = task.lock().unwrap_or_else(|p| p.into_inner()).take() else {
                return;
            };
            match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt.block_on(task),
                Err(e) => tracing::error!("the {name} cannot run: no runtime: {e}"),
            }
            let _ = done_tx.send(());
        }
    });
    match started {
        Ok(_) => tokio::spawn(async move {
            let _ = done.await;
        }),
        Err(e) => {
            tracing::warn!("cannot start the {name}'s thread: {e}; it runs beside the gateway");
            let task = slot.lock().unwrap_or_else(|p| p.into_inner()).take();
            tokio::spawn(async move {
                if let Some(task) = task {
                    task.await;
                }
            })
        }
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
    let parties = &shared.parties;
    let mut relaying = Vec::new();
    // Instances sent to the spawner and not yet known to run, oldest first (dropped on an
    // error: each waits for its answer and kills what started).
    let mut submitted = VecDeque::new();
    for (index, f) in spec.functions.iter().enumerate() {
        let reserved = plan.parties_of(index as u8);
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
            for (k, party) in reserved.into_iter().enumerate() {
                let want = if k == 0 { Want::Run } else { Want::Stop };
                parties.init_want(party, want);
                if want == Want::Stop {
                    parties.set_state(party, PartyState::Stopped);
                    continue;
                }
                parties.set_state(party, PartyState::Starting);
                let inst = InstanceSpec {
                    party,
                    index,
                    function: f.name.clone(),
                };
                let relay = crate::relay::start(shared.supervision(), &inst, peer, link);
                relays.push(relay.map_err(spawn_err)?);
                relaying.push((f.name.clone(), party));
            }
            continue;
        }
        let serving = usize::from(f.scale.initial);
        let parked = usize::from(f.scale.parked).min(reserved.len().saturating_sub(serving));
        for (k, party) in reserved.into_iter().enumerate() {
            let want = if k < serving {
                Want::Run
            } else if k < serving + parked {
                Want::Park
            } else {
                Want::Stop
            };
            parties.init_want(party, want);
            let inst = InstanceSpec {
                party,
                index,
                function: f.name.clone(),
            };
            if want == Want::Stop {
                parties.set_state(party, PartyState::Stopped);
                instances.push((inst, None));
                continue;
            }
            let park = want == Want::Park;
            if submitted.len() == SPAWNS_IN_FLIGHT {
                finish_oldest(shared, spec, &mut submitted, instances)?;
            }
            let started = supervise::submit(shared.supervision(), &inst, park)
                .map_err(|source| spawn_error(spec, &inst, source))?;
            submitted.push_back((inst, started));
        }
    }
    while !submitted.is_empty() {
        finish_oldest(shared, spec, &mut submitted, instances)?;
    }
    let attached = |party: u16| match parties.want_of(party) {
        Want::Run => parties.ready(party),
        Want::Park => parties.state(party) == PartyState::Parked,
        Want::Stop => true,
    };
    let deadline = Instant::now() + opts.ready_timeout;
    loop {
        let mut all_ready = true;
        for (inst, instance) in instances.iter_mut() {
            let Some(instance) = instance else { continue };
            // Not reaped here: whoever stops it kills what is left of its group first.
            if let Ok(Some(status)) = instance.child.peek() {
                return Err(AgentError::NotReady {
                    function: inst.function.clone(),
                    party: inst.party,
                    what: format!("exited ({status})"),
                    output: String::new(),
                });
            }
            all_ready &= attached(inst.party);
        }
        if let Some((function, party)) = relaying.iter().find(|(_, p)| !parties.ready(*p)) {
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

/// Most instances sent to the spawner before the oldest of them is known to run. The agent
/// prepares the next instance (cgroup, pipes, hand-over descriptors) and the spawner forks
/// it while the ones before it confine themselves and `execve`; a few keep both busy, more
/// only hold more children half-made.
const SPAWNS_IN_FLIGHT: usize = 4;

/// Waits for the oldest submitted instance to run and adds it to `instances`; a failed start
/// is the error of that instance's function.
fn finish_oldest<'a>(
    shared: &'a Arc<Shared>,
    spec: &ChainSpec,
    submitted: &mut VecDeque<(InstanceSpec, supervise::Submitted<'a>)>,
    instances: &mut Vec<(InstanceSpec, Option<Instance>)>,
) -> Result<(), AgentError> {
    let Some((inst, started)) = submitted.pop_front() else {
        return Ok(());
    };
    let child = started
        .finish(shared.supervision(), &inst)
        .map_err(|source| spawn_error(spec, &inst, source))?;
    instances.push((inst, Some(child)));
    Ok(())
}

/// Starting `inst` failed: the error names its function and program.
fn spawn_error(spec: &ChainSpec, inst: &InstanceSpec, source: std::io::Error) -> AgentError {
    let program = spec
        .functions
        .get(inst.index)
        .and_then(|f| f.command.first())
        .cloned()
        .unwrap_or_default();
    AgentError::Spawn {
        function: inst.function.clone(),
        program,
        source,
    }
}
