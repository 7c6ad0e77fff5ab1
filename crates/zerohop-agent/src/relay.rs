//! The instances of a function that runs on a peer node (a chain split over nodes, see
//! [`crate::split`]): the agent plays them itself, in its own process, attached to the
//! chain like any instance (`zerohop_runtime::attach`). Each request such an instance takes
//! goes to the peer daemon over the one connection between the two nodes
//! (`zerohop_link`); the peer runs the function on it and the answer comes back into the
//! request's slot here, so the rest of the route goes on as if the function had run here.
//!
//! No thread waits for a peer: the instance's receiving thread hands each request
//! (`zerohop_runtime::Deferred`) to a task on the daemon's peer thread, which sends the call
//! and finishes the request when the answer arrives.

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use zerohop_link::{Answer, Call, Peers};
use zerohop_runtime::{Deferred, HandlerError, Next, Request};

use crate::supervise::{handover_fds, InstanceSpec, Supervision};

/// How an agent reaches the daemons of its peer nodes: shared by all its chains.
#[derive(Clone)]
pub struct Link {
    peers: Arc<Peers>,
    runtime: tokio::runtime::Handle,
}

impl Link {
    /// Relays over `peers`, whose connections run on `runtime`.
    pub fn new(peers: Arc<Peers>, runtime: tokio::runtime::Handle) -> Self {
        Self { peers, runtime }
    }
}

impl fmt::Debug for Link {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Link")
    }
}

/// A relaying instance: the thread serving it and what stops it.
pub(crate) struct RelayParty {
    stop: Arc<dyn zerohop_transport::Stop>,
    thread: std::thread::JoinHandle<()>,
}

impl RelayParty {
    /// Stops receiving; the returned thread ends at once. The requests on their way to the
    /// peer are finished by their tasks (each within its deadline).
    pub(crate) fn stop(self) -> std::thread::JoinHandle<()> {
        self.stop.stop();
        self.thread
    }
}

/// Attaches `inst`'s party in this process and serves it, relaying to `peer`: it is handed
/// what an instance of the party would be (`s`), with the offence counts to blame senders.
pub(crate) fn start(
    s: Supervision<'_>,
    inst: &InstanceSpec,
    peer: SocketAddr,
    link: &Link,
) -> std::io::Result<RelayParty> {
    // Its handler threads are the agent's own: nobody watches these records.
    let progress = s.parties.progress_for(inst.party)?;
    let fds = handover_fds(s.parties, s.launch, s.transport, inst, &progress)?;
    let plan = (**s.gateways.plan()).clone();
    let chain = plan.chain.clone();
    // A relay is one of the agent's own parties: what it receives is a count the agent
    // trusts (see `crate::offence`).
    let instance = zerohop_runtime::attach(plan, inst.party, fds)
        .map_err(|e| std::io::Error::other(e.to_string()))?
        .with_blame(s.offences.clone());
    let stop = instance.stopper();
    let relay = Arc::new(Relay {
        link: link.clone(),
        peer,
        chain,
        function: inst.function.clone(),
    });
    let thread = std::thread::Builder::new()
        .name(format!("relay-{}", inst.function))
        .spawn(move || instance.serve_deferred(|req| relay.start(req)))?;
    Ok(RelayParty { stop, thread })
}

/// The handler of a relaying instance.
struct Relay {
    link: Link,
    peer: SocketAddr,
    chain: String,
    function: String,
}

impl Relay {
    /// Sends `req` to the peer and finishes it when the answer comes: a task on the
    /// daemon's peer thread does both, so no thread of this instance waits (the receiving
    /// thread goes straight back to receiving).
    fn start(self: &Arc<Self>, mut req: Deferred) {
        let r = req.request();
        let (hop, flags, deadline) = r.hop_flags_deadline();
        let left = match deadline {
            0 => Duration::from_secs(30),
            d => Duration::from_millis(d.saturating_sub(zerohop_pool::monotonic_ms())),
        };
        let call = (!left.is_zero()).then(|| Call {
            chain: self.chain.clone(),
            function: self.function.clone(),
            deadline_ms: left.as_millis().min(u128::from(u32::MAX)) as u32,
            route: r.route_index(),
            hop,
            flags,
            meta: r.meta().to_vec(),
            payload: r.body().to_vec(),
        });
        let Some(call) = call else {
            req.finish(|_| {
                Err(HandlerError::new(
                    504,
                    "no time left for the hop to the peer node",
                ))
            });
            return;
        };
        let me = self.clone();
        self.link.runtime.spawn(async move {
            let answer = me.link.peers.call(me.peer, call, left).await;
            req.finish(|r| match answer {
                Ok(a) => outcome(r, &me.function, a),
                Err(e) => Err(HandlerError::new(e.status(), e.to_string())),
            });
        });
    }
}

/// What a peer's answer means here: its output in the slot and the route going on (or the
/// client answered, when the request left its sequence there), or its error.
fn outcome(req: &mut Request<'_>, function: &str, a: Answer) -> Result<Next, HandlerError> {
    if matches!(a.status, 0 | 200..=399) {
        req.set_body(&a.payload)?;
        return Ok(if a.flags & Answer::LEFT != 0 {
            Next::Reply
        } else {
            Next::Continue
        });
    }
    let text = String::from_utf8_lossy(&a.payload);
    // The peer's runtime named the function already; this one names it again.
    let prefix = format!("function '{function}': ");
    let message = text.strip_prefix(&prefix).unwrap_or(&text).trim_end();
    let status = if (400..=599).contains(&a.status) {
        a.status
    } else {
        502
    };
    Err(HandlerError::new(status, message.to_owned()))
}
