//! The offence enforcer: the task that carries out what [`crate::offence`] decides. It
//! wakes when a sender's count reaches the limit and, while requests are in flight, every
//! [`SCAN`] to read what each instance published to other instances; it kills the
//! instances [`condemned`] names, with their process groups, and the log names them. It runs
//! on the agent's supervision runtime, never in a receive path.

use std::collections::HashMap;

use nix::sys::signal::Signal;
use tokio::sync::watch;
use zerohop_gateway::Gateways;
use zerohop_pool::Descriptor;
use zerohop_transport::blame::fault_of_sent;
use zerohop_transport::{Blame, Fault, PartyId, Plan, Transport};

use crate::offence::{condemned, Offences, Seen, SCAN};
use crate::parties::Parties;

/// Runs until `stop` turns true: each time a party's count reaches the limit (by the
/// agent's endpoints, or by a [`look`] every [`SCAN`] while requests are in flight), kills
/// the instances [`condemned`] names. Reads what was sent on the `transport`, while the
/// `gateways` have requests in flight.
pub(crate) async fn run(
    parties: &Parties,
    gateways: &Gateways,
    transport: &dyn Transport,
    offences: &Offences,
    mut stop: watch::Receiver<bool>,
) {
    let mut killed: HashMap<PartyId, u32> = HashMap::new();
    let mut sent = Vec::new();
    // Whether the transport keeps what was sent (ring): known after the first look.
    let mut readable = true;
    loop {
        let busy = readable && gateways.inflight() > 0;
        tokio::select! {
            _ = offences.reached.notified() => {}
            // Idle: no timer at all until a request enters the chain.
            _ = gateways.busy(), if readable && !busy => continue,
            // A count that reached the limit in the look has woken `reached` (its permit
            // waits for the next turn of the loop): nothing to decide here.
            _ = tokio::time::sleep(SCAN), if busy => {
                readable = look(parties, gateways.plan(), transport, offences, &mut sent);
                continue;
            }
            r = stop.changed() => if r.is_err() || *stop.borrow() { return },
        }
        let gateway_parties = usize::from(gateways.plan().gateways());
        let seen: Vec<Seen> = parties
            .iter()
            .map(|(party, control)| {
                let pgid = control.pgid();
                Seen {
                    party,
                    faults: offences.total(party),
                    pgid,
                    killed: killed.get(&party).copied(),
                    // A relay has no process group of its own (pgid 0): it is the agent.
                    in_agent: usize::from(party) < gateway_parties,
                }
            })
            .collect();
        for party in condemned(&seen, offences.limit) {
            let pgid = seen[usize::from(party)].pgid;
            kill(parties, gateways.plan(), offences, party, pgid);
            killed.insert(party, pgid);
        }
    }
}

/// Reads what every running instance published to other running instances since the last
/// look and counts what is its own fault (see the module's notes); `sent` is scratch room.
/// `false` when the transport keeps no copy of what was sent (then there is nothing to
/// look at, ever).
fn look(
    parties: &Parties,
    plan: &Plan,
    transport: &dyn Transport,
    offences: &Offences,
    sent: &mut Vec<(PartyId, Descriptor)>,
) -> bool {
    let gateways = usize::from(plan.gateways());
    // An instance with a process now: not a gateway party, not a relay (the agent itself:
    // its endpoint blames what it receives; it has no process group), not a party between
    // two instances.
    let running = |p: usize| p >= gateways && parties.pgid(p as PartyId) != 0;
    for (sender, seen) in offences.seen.iter().enumerate() {
        if !running(sender) {
            continue;
        }
        sent.clear();
        let mut seen = seen.lock().unwrap_or_else(|p| p.into_inner());
        if !transport.published(sender as PartyId, &mut seen, sent) {
            return false;
        }
        for (receiver, desc) in sent.iter() {
            let r = usize::from(*receiver);
            let (true, Some(&function), Some(pools)) = (
                running(r),
                plan.party_function.get(r),
                parties.pools(*receiver),
            ) else {
                continue;
            };
            if let Some(fault) = fault_of_sent(desc, function, pools) {
                offences.blame(sender as PartyId, fault);
            }
        }
    }
    true
}

/// Kills the instance `pgid` of `party` with its process group; its supervisor then
/// reclaims its slots, answers its requests and restarts it, as after a crash.
fn kill(parties: &Parties, plan: &Plan, offences: &Offences, party: PartyId, pgid: u32) {
    let Some(control) = parties.get(party) else {
        return;
    };
    if pgid == 0 || control.pgid() != pgid {
        return; // already gone or replaced
    }
    let limit = offences.limit;
    let function = plan
        .party_function
        .get(usize::from(party))
        .map_or("unknown", |&f| plan.function_name(f))
        .to_owned();
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
    control.condemn(format!(
        "sent {total} invalid descriptors ({detail}) and was killed as hostile"
    ));
    if !control.signal_group(pgid, Signal::SIGKILL) {
        // It went by itself meanwhile: the reason is not its.
        control.take_condemned();
    }
}
