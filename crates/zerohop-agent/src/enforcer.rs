//! The offence enforcer: the task that carries out what [`crate::offence`] decides. It
//! wakes when a sender's count reaches the limit and, while requests are in flight, every
//! [`SCAN`] to read what each instance published to other instances; it kills the
//! instances [`condemned`] names, with their process groups, and the log names them. It runs
//! on the agent's supervision runtime, never in a receive path.

use std::collections::HashMap;
use std::sync::Arc;

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::sync::watch;
use zerohop_pool::Descriptor;
use zerohop_transport::blame::fault_of_sent;
use zerohop_transport::{Blame, Fault, PartyId};

use crate::offence::{condemned, Seen, SCAN};
use crate::supervise::Shared;

/// Runs until `stop` turns true: each time a party's count reaches the limit (by the
/// agent's endpoints, or by a [`look`] every [`SCAN`] while requests are in flight), kills
/// the instances [`condemned`] names.
pub(crate) async fn run(shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    let offences = shared.offences.clone();
    let mut killed: HashMap<PartyId, u32> = HashMap::new();
    let mut sent = Vec::new();
    // Whether the transport keeps what was sent (ring): known after the first look.
    let mut readable = true;
    loop {
        let busy = readable && shared.gateways.inflight() > 0;
        tokio::select! {
            _ = offences.reached.notified() => {}
            // Idle: no timer at all until a request enters the chain.
            _ = shared.gateways.busy(), if readable && !busy => continue,
            // A count that reached the limit in the look has woken `reached` (its permit
            // waits for the next turn of the loop): nothing to decide here.
            _ = tokio::time::sleep(SCAN), if busy => {
                readable = look(&shared, &mut sent);
                continue;
            }
            r = stop.changed() => if r.is_err() || *stop.borrow() { return },
        }
        let gateways = usize::from(shared.gateways.plan().gateways());
        let seen: Vec<Seen> = shared
            .parties
            .iter()
            .enumerate()
            .map(|(p, control)| {
                let party = p as PartyId;
                let pgid = control.pgid();
                Seen {
                    party,
                    faults: offences.total(party),
                    pgid,
                    killed: killed.get(&party).copied(),
                    // A relay has no process group of its own (pgid 0): it is the agent.
                    in_agent: p < gateways,
                }
            })
            .collect();
        for party in condemned(&seen, offences.limit) {
            let pgid = seen[usize::from(party)].pgid;
            kill(&shared, party, pgid, offences.limit);
            killed.insert(party, pgid);
        }
    }
}

/// Reads what every running instance published to other running instances since the last
/// look and counts what is its own fault (see the module's notes); `sent` is scratch room.
/// `false` when the transport keeps no copy of what was sent (then there is nothing to
/// look at, ever).
fn look(shared: &Shared, sent: &mut Vec<(PartyId, Descriptor)>) -> bool {
    let plan = shared.gateways.plan();
    let gateways = usize::from(plan.gateways());
    // An instance with a process now: not a gateway party, not a relay (the agent itself:
    // its endpoint blames what it receives; it has no process group), not a party between
    // two instances.
    let running = |p: usize| {
        p >= gateways
            && shared
                .parties
                .get(p)
                .is_some_and(|control| control.pgid() != 0)
    };
    for (sender, seen) in shared.offences.seen.iter().enumerate() {
        if !running(sender) {
            continue;
        }
        sent.clear();
        let mut seen = seen.lock().unwrap_or_else(|p| p.into_inner());
        if !shared
            .transport
            .published(sender as PartyId, &mut seen, sent)
        {
            return false;
        }
        for (receiver, desc) in sent.iter() {
            let r = usize::from(*receiver);
            let (true, Some(&function), Some(pools)) = (
                running(r),
                plan.party_function.get(r),
                shared.party_pools.get(r),
            ) else {
                continue;
            };
            if let Some(fault) = fault_of_sent(desc, function, pools) {
                shared.offences.blame(sender as PartyId, fault);
            }
        }
    }
    true
}

/// Kills the instance `pgid` of `party` with its process group; its supervisor then
/// reclaims its slots, answers its requests and restarts it, as after a crash.
fn kill(shared: &Shared, party: PartyId, pgid: u32, limit: u64) {
    let Some(control) = shared.parties.get(usize::from(party)) else {
        return;
    };
    let plan = shared.gateways.plan();
    let function = plan
        .party_function
        .get(usize::from(party))
        .map_or("unknown", |&f| plan.function_name(f))
        .to_owned();
    let offences = &shared.offences;
    let total = offences.total(party);
    let by_fault = offences.by_fault(party);
    let detail = Fault::ALL
        .iter()
        .zip(by_fault)
        .filter(|(_, n)| *n > 0)
        .map(|(f, n)| format!("{}: {n}", f.describe()))
        .collect::<Vec<_>>()
        .join(", ");
    tracing::warn!(
        chain = %plan.chain,
        function = %function,
        instance = party,
        pid = pgid,
        "chain '{}': function '{function}' instance {party} (pid {pgid}) is hostile: it sent \
         {total} invalid descriptors ({detail}; the bound is {limit}); killing it and its \
         process group",
        plan.chain,
    );
    *control.hung.lock().unwrap_or_else(|p| p.into_inner()) = Some(format!(
        "sent {total} invalid descriptors ({detail}) and was killed as hostile"
    ));
    let _ = killpg(Pid::from_raw(pgid as i32), Signal::SIGKILL);
}
