//! One function instance: attach, receive, run the handler, route, send.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{mpsc, Arc, Mutex};

use zerohop_pool::{
    Descriptor, OwnedSlot, PartyState, Pool, PoolError, Pools, Progress, SlotHeader, State,
    StateConfig,
};
use zerohop_transport::{
    Backend, Delivery, Endpoint, FunctionPlan, Hop, JoinPolicy, PartyId, Picker, Plan, RequestIds,
    Sender, TransportError, GATEWAY_FN,
};

use crate::call::{Calls, Pending};
use crate::request::{HandlerError, Next, Request};
use crate::{env, logging, sys, Handler};
use zerohop_transport::PlanExt;

/// Why an instance could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// Not started by the agent.
    #[error(
        "{0} is not set: this program is a zerohop function; start it through its chain with \
         `zerohop up CHAIN.yaml`"
    )]
    NotUnderAgent(&'static str),
    /// The agent's hand-over is inconsistent.
    #[error("bad hand-over from the agent: {0}")]
    HandOver(String),
    /// The agent is already gone.
    #[error("the agent (pid {0}) is gone; exiting")]
    Orphan(u32),
    /// The pool could not be attached.
    #[error("attaching the pool: {0}")]
    Pool(#[from] PoolError),
    /// The transport could not be attached.
    #[error("attaching the transport: {0}")]
    Transport(#[from] TransportError),
}

/// What the handler threads share: it runs the handler on a delivery and sends the result
/// on (where to send, and how to pick the next instance).
pub(crate) struct Dispatcher {
    pub(crate) plan: Arc<Plan>,
    /// The pools of this function's security domains.
    pools: Pools,
    pub(crate) sender: Box<dyn Sender>,
    pub(crate) function: u8,
    /// This instance's party.
    pub(crate) me: PartyId,
    /// Which instance of the next function gets a descriptor.
    pub(crate) picker: Picker,
    /// Which gateway thread waits for a request's answer.
    ids: RequestIds,
    /// The chain's state store, when this function has `state`.
    pub(crate) state: Option<State>,
    /// Its handler threads' word about themselves to the agent's hang watchdog (see
    /// `zerohop_pool::progress`); `None` only in unit tests.
    progress: Option<Progress>,
    /// The instance's root span (chain, function, party), entered on every thread that
    /// handles requests.
    pub(crate) span: tracing::Span,
}

/// An attached instance, ready to serve.
pub struct Instance {
    router: Arc<Dispatcher>,
    endpoint: Endpoint,
    me: PartyId,
}

fn var(name: &'static str) -> Result<String, StartError> {
    std::env::var(name).map_err(|_| StartError::NotUnderAgent(name))
}

fn num<T: std::str::FromStr>(name: &'static str) -> Result<T, StartError> {
    var(name)?
        .parse()
        .map_err(|_| StartError::HandOver(format!("{name} is not a number")))
}

/// Attaches to the chain described by the `ZEROHOP_*` environment and inherited fds. Installs
/// the SDK's `tracing` subscriber first, unless the program has one (see the crate's
/// "Logging").
pub fn start() -> Result<Instance, StartError> {
    logging::init();
    let plan =
        Plan::from_json(&var(env::PLAN)?).map_err(|e| StartError::HandOver(e.to_string()))?;
    let me: PartyId = num(env::PARTY)?;
    let nfds: usize = num(env::FDS)?;
    let agent: u32 = num(env::AGENT_PID)?;
    if !sys::die_with_parent(agent) {
        return Err(StartError::Orphan(agent));
    }
    let fds = (0..nfds as i32)
        .map(|i| {
            sys::take_inherited(env::FIRST_FD + i).ok_or_else(|| {
                StartError::HandOver(format!("fd {} not inherited", env::FIRST_FD + i))
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
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
    let backend: Backend = plan.transport.parse().map_err(StartError::HandOver)?;
    let policy = Arc::new(
        plan.policy()
            .map_err(|e| StartError::HandOver(e.to_string()))?,
    );
    let function = policy
        .function_of(me)
        .filter(|&f| f != GATEWAY_FN)
        .ok_or_else(|| StartError::HandOver(format!("party {me} runs no function")))?;
    // First the pools of this function's domains, in domain order.
    let domains = plan.domains_of(function);
    if domains.is_empty() || fds.len() < domains.len() {
        return Err(StartError::HandOver(format!(
            "{} inherited descriptors, but the function is in {} security domains",
            fds.len(),
            domains.len()
        )));
    }
    // Each pool's shape comes from the plan; its header is only compared with it.
    let pools = fds
        .drain(..domains.len())
        .zip(&domains)
        .map(|(fd, &d)| {
            let geometry = plan.pool_geometry(d).ok_or_else(|| {
                StartError::HandOver(format!("security domain {d}'s pool is out of range"))
            })?;
            Ok(Arc::new(Pool::attach(fd, &geometry)?))
        })
        .collect::<Result<Vec<_>, StartError>>()?;
    let pools = Pools::new(pools)?;
    // Then the state store, for a function with `state`.
    let state = match plan.state {
        Some(geometry) if plan.functions[function as usize].state => {
            if fds.is_empty() {
                return Err(StartError::HandOver(
                    "the function has state but no state store was handed over".into(),
                ));
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
        return Err(StartError::HandOver(
            "no progress region was handed over".into(),
        ));
    }
    let threads = plan.functions[function as usize].handler_threads();
    let progress = Some(Progress::attach(fds.remove(0), threads)?);
    let transport = zerohop_transport::attach(backend, &policy, me, fds, plan.options())?;
    let endpoint = Endpoint::new(pools.clone(), policy, me, transport.receiver(me)?);
    let router = Dispatcher {
        span: logging::instance_span(&plan.chain, plan.function_name(function), me),
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

impl Instance {
    /// Marks the instance ready and serves requests with `handler` on the spec's number of
    /// threads. Returns only if the transport is stopped or closed.
    pub fn serve<H: Handler>(self, handler: H) -> ! {
        self.serve_in_place(handler);
        std::process::exit(0)
    }

    /// Reports every descriptor this instance drops for its sender's fault to `blame` (see
    /// [`Endpoint::with_blame`]): for a party the agent plays in its own process, whose
    /// word the agent can trust.
    pub fn with_blame(mut self, blame: Arc<dyn zerohop_transport::Blame>) -> Self {
        self.endpoint = self.endpoint.with_blame(blame);
        self
    }

    /// What stops [`Instance::serve_in_place`] from another thread: its receiving ends, the
    /// handler threads finish what they hold, and it returns.
    pub fn stopper(&self) -> Arc<dyn zerohop_transport::Stop> {
        self.endpoint.stopper()
    }

    /// [`Instance::serve`] without ending the process: returns once the transport is
    /// stopped or closed (or at once when the agent left the instance parked). For a party
    /// the agent plays in its own process.
    pub fn serve_in_place<H: Handler>(mut self, handler: H) {
        let router = self.router.clone();
        let _root = router.span.clone().entered();
        let concurrency = router
            .plan
            .functions
            .get(router.function as usize)
            .map_or(1, FunctionPlan::handler_threads);
        if !self.activate() {
            return;
        }
        let calls = !router.plan.functions[router.function as usize]
            .calls
            .is_empty();
        if concurrency == 1 && !calls {
            // The handler runs on the receiving thread: no hand-off per request.
            while let Some(d) = self.endpoint.recv() {
                if d.header.flags & SlotHeader::FLAG_ANSWER != 0 {
                    // This function makes no calls: an answer is forged; dropping frees it.
                    continue;
                }
                router.process(&handler, d, None, 0);
            }
        } else {
            // Handler threads take requests from a queue; the receiving thread goes on
            // receiving while they wait for their calls' answers, and hands each answer to
            // its waiter. The queue is unbounded for that reason: a receiving thread that
            // blocked on a full queue could not deliver the answers that free the handlers.
            // Its length is bounded by the slots the requests hold.
            let handler = Arc::new(handler);
            let pending = Arc::new(Pending::default());
            let (tx, rx) = mpsc::channel::<Delivery>();
            let rx = Arc::new(Mutex::new(rx));
            for i in 0..concurrency {
                let (router, handler, rx, pending) =
                    (router.clone(), handler.clone(), rx.clone(), pending.clone());
                std::thread::Builder::new()
                    .name(format!("handler-{i}"))
                    .spawn(move || {
                        let _root = router.span.clone().entered();
                        let cx = Calls {
                            plan: &router.plan,
                            function: router.function,
                            me: router.me,
                            picker: &router.picker,
                            sender: &*router.sender,
                            pending: &pending,
                        };
                        loop {
                            let next = rx.lock().unwrap_or_else(|p| p.into_inner()).recv();
                            match next {
                                Ok(d) => router.process(&*handler, d, calls.then_some(&cx), i),
                                Err(_) => return,
                            }
                        }
                    })
                    .expect("spawn handler thread");
            }
            while let Some(d) = self.endpoint.recv() {
                if d.header.flags & SlotHeader::FLAG_ANSWER != 0 {
                    pending.deliver(d);
                } else if tx.send(d).is_err() {
                    break;
                }
            }
            // Dropping the queue's sender ends the handler threads once they are idle.
        }
    }

    /// Ready now, or parked until the agent activates this instance (its first pool's
    /// record is the one the agent and the instance hand the state over in): whether it
    /// is to serve.
    fn activate(&self) -> bool {
        let records = || self.router.pools.records(self.me);
        let pid = std::process::id();
        records().for_each(|r| r.set_pid(pid));
        let state = records()
            .next()
            .map_or(PartyState::Ready, |r| r.attach_or_park());
        if state != PartyState::Ready {
            tracing::debug!(?state, "not activated; exiting");
            return false;
        }
        records().for_each(|r| r.set_state(PartyState::Ready));
        true
    }

    /// Serves the instance with `start`, called on the receiving thread for each request
    /// with the request to finish later ([`Deferred::finish`]), from any thread: for a
    /// party whose work waits on something else (the agent's relay to a peer node), so
    /// that no thread waits with it. `start` must not block. Returns as
    /// [`Instance::serve_in_place`] does; requests still unfinished then are finished by
    /// whoever holds them.
    #[doc(hidden)]
    pub fn serve_deferred(mut self, start: impl Fn(Deferred)) {
        let router = self.router.clone();
        let _root = router.span.clone().entered();
        if !self.activate() {
            return;
        }
        while let Some(d) = self.endpoint.recv() {
            if d.header.flags & SlotHeader::FLAG_ANSWER != 0 {
                // It makes no calls: an answer is forged; dropping frees it.
                continue;
            }
            if let Some(taken) = router.take(d) {
                start(Deferred {
                    router: router.clone(),
                    taken: Some(taken),
                });
            }
        }
    }
}

impl Dispatcher {
    /// Handler thread `thread` takes `d` and runs the handler on it.
    fn process<H: Handler + ?Sized>(
        &self,
        handler: &H,
        d: Delivery,
        calls: Option<&Calls<'_>>,
        thread: usize,
    ) {
        // Whatever the handler logs names the request (a no-op when INFO is filtered out).
        let _request = logging::request_span(d.desc.request, d.header.route).entered();
        // Until it is done with the request, the watchdog may see this thread stuck in it.
        let _busy = self.progress.as_ref().map(|p| p.busy(thread));
        let Some(mut t) = self.take(d) else { return };
        let plan = &*self.plan;
        // A static fan-out this function joins: every branch gets the request's body (copied
        // into a slot of its own), all at once; the handler sees their outputs.
        let me = &plan.functions[self.function as usize];
        let branches = match calls {
            Some(cx) if !me.fan_out.is_empty() => {
                let m = t.header.meta_len as usize;
                let body = &t.slot.data()[m..m + t.desc.len as usize];
                let list: Vec<(&str, &[u8])> = me
                    .fan_out
                    .iter()
                    .map(|&f| (plan.function_name(f), body))
                    .collect();
                cx.call_all(&t.header, t.slot.pool(), &list)
            }
            _ => Vec::new(),
        };
        let failed = match me.join {
            JoinPolicy::Fail => branches.iter().find_map(|b| b.as_ref().err()).cloned(),
            JoinPolicy::Join => None,
        };
        let mut req = Request {
            slot: &mut t.slot,
            header: t.header,
            len: t.desc.len as usize,
            plan,
            function: self.function,
            calls,
            branches,
            state: self.state.as_ref(),
        };
        let outcome = match failed {
            Some(e) => Err(HandlerError::from(e)),
            None => run_handler(|| handler.handle(&mut req)),
        };
        // The branches' slots go back to the pool now, not when the request leaves.
        req.branches.clear();
        let (len, header) = (req.len, req.header);
        self.finish(t, header, len, outcome);
    }

    /// A delivery checked and counted as started, or `None` when it is dropped (a forged
    /// call).
    fn take(&self, d: Delivery) -> Option<Taken> {
        // The header copy `take` validated (meta_len + len fit the slot); the shared one is
        // never read again.
        let Delivery {
            desc,
            slot,
            mut header,
            ..
        } = d;
        header.request = desc.request;
        let plan = &*self.plan;
        // A call: whatever the handler does, the slot goes back to the caller.
        let call =
            (header.flags & SlotHeader::FLAG_CALL != 0).then_some((header.caller, header.call));
        if let Some((caller, _)) = call {
            let calls_me = plan
                .party_function
                .get(caller as usize)
                .and_then(|&f| plan.functions.get(f as usize))
                .is_some_and(|f| f.calls.contains(&self.function));
            if !calls_me {
                // Nobody allowed to call this function would get the answer: a forged call.
                // Dropping the slot frees it.
                tracing::warn!(
                    caller,
                    "dropped a call from party {caller}, whose function may not call this one"
                );
                return None;
            }
        }
        // The party's counters (in its first pool's record, where the agent reads them):
        // busy while the branches and the handler run, then one handled run with its time.
        if let Some(r) = self.pools.records(self.me).next() {
            r.handler_started();
        }
        Some(Taken {
            desc,
            slot,
            header,
            call,
            started: std::time::Instant::now(),
        })
    }

    /// Ends a request taken with [`Dispatcher::take`] as its handler's `outcome` says: the body
    /// of `len` bytes and `header` (as the handler left them) go on along the route, back to
    /// the caller, or the error to the client.
    fn finish(
        &self,
        t: Taken,
        mut header: SlotHeader,
        len: usize,
        outcome: Result<Next, HandlerError>,
    ) {
        let Taken {
            desc,
            slot,
            call,
            started,
            ..
        } = t;
        let plan = &*self.plan;
        if let Err(e) = &outcome {
            tracing::debug!(status = e.status, "handler failed: {}", e.message);
        }
        if let Some(r) = self.pools.records(self.me).next() {
            r.handler_finished(started.elapsed().as_micros() as u64, outcome.is_ok());
        }
        let route = |next: Next, header: &mut SlotHeader| -> Result<Hop, HandlerError> {
            match next {
                Next::Reply => {
                    // Left the sequence before its end (a peer node relaying this hop
                    // answers its client from this flag instead of going on).
                    header.flags |= SlotHeader::FLAG_DYNAMIC;
                    Ok(Hop::Gateway)
                }
                Next::Continue if header.flags & SlotHeader::FLAG_DYNAMIC != 0 => Ok(Hop::Gateway),
                Next::Continue => {
                    plan.next_in_sequence(header.route, header.hop)
                        .ok_or_else(|| {
                            HandlerError::internal(format!(
                                "slot names unknown route {}",
                                header.route
                            ))
                        })
                }
                Next::Forward(name) => {
                    let target = plan
                        .function_index(&name)
                        .filter(|t| plan.functions[self.function as usize].next.contains(t));
                    match target {
                        Some(function) => {
                            header.flags |= SlotHeader::FLAG_DYNAMIC;
                            Ok(Hop::Function {
                                function,
                                hop: header.hop,
                            })
                        }
                        None => Err(HandlerError::internal(format!(
                            "may not forward to `{name}`: add it to this function's `next` list in the spec"
                        ))),
                    }
                }
            }
        };
        if let Some((caller, number)) = call {
            let outcome = outcome.and_then(|next| match next {
                Next::Forward(name) => Err(HandlerError::internal(format!(
                    "a call's answer goes back to its caller; it cannot be forwarded to `{name}`"
                ))),
                Next::Continue | Next::Reply => Ok(len),
            });
            self.answer(slot, header, desc.request, outcome, caller, number);
            return;
        }
        match outcome.and_then(|next| route(next, &mut header)) {
            Ok(hop) => {
                if let Hop::Function { hop, .. } = hop {
                    header.hop = hop;
                }
                let mut slot = slot;
                slot.set_header(&header);
                if let Err(e) = self.send(slot, desc.request, len as u32, hop) {
                    let (slot, msg) = e;
                    tracing::warn!("{msg}; answering 503");
                    self.fail(slot, header, 503, &msg);
                }
            }
            Err(e) => self.fail(slot, header, e.status, &e.message),
        }
    }

    /// Sends a call's slot back to party `caller`, which waits for it as call `number`: the
    /// output of `len` bytes, or the error.
    fn answer(
        &self,
        mut slot: OwnedSlot,
        mut header: SlotHeader,
        request: u32,
        outcome: Result<usize, HandlerError>,
        caller: PartyId,
        number: u32,
    ) {
        let len = outcome.unwrap_or_else(|e| {
            header.status = e.status;
            write_error(&mut slot, &header, &self.plan, self.function, &e.message)
        });
        header.flags = SlotHeader::FLAG_ANSWER;
        header.call = number;
        header.caller = 0;
        slot.set_header(&header);
        let desc = slot.descriptor(
            request,
            len as u32,
            self.plan.party_function[caller as usize],
        );
        // If the caller cannot be reached the slot is freed on drop; its call fails by the
        // deadline or by its own death.
        match self.sender.send(caller, desc) {
            Ok(()) => slot.into_sent(),
            Err(e) => tracing::warn!(
                caller,
                "could not answer call {number} of party {caller}: {e}"
            ),
        }
    }

    /// Sends the slot on; on failure gives it back with a message.
    fn send(
        &self,
        slot: OwnedSlot,
        request: u32,
        len: u32,
        hop: Hop,
    ) -> Result<(), (OwnedSlot, String)> {
        // Whether the party chosen has no ready instance (the agent is woken to activate it).
        let mut wake = false;
        let (to, next) = match hop {
            // The gateway thread that holds the client waits on its own queue.
            Hop::Gateway => (self.ids.gateway_of(request), Descriptor::GATEWAY),
            // Instances of the next function as the request's own domain sees them.
            Hop::Function { function, .. } => match self.picker.pick_state(function, slot.pool()) {
                Some((p, seen)) => {
                    if seen != PartyState::Ready {
                        wake = true;
                    }
                    (p, function)
                }
                None => {
                    let msg = format!(
                        "no instance of `{}` exists",
                        self.plan.function_name(function)
                    );
                    return Err((slot, msg));
                }
            },
        };
        let desc = slot.descriptor(request, len, next);
        let pool = wake.then(|| slot.pool().clone());
        match self.sender.send(to, desc) {
            Ok(()) => {
                slot.into_sent();
                if let Some(pool) = pool {
                    pool.want_instance();
                }
                Ok(())
            }
            Err(e) => {
                let msg = format!("could not reach `{}`: {e}", self.plan.function_name(next));
                Err((slot, msg))
            }
        }
    }

    /// Replaces the payload with an error message and sends the slot to the gateway.
    fn fail(&self, mut slot: OwnedSlot, mut header: SlotHeader, status: u16, message: &str) {
        header.status = status;
        let n = write_error(&mut slot, &header, &self.plan, self.function, message);
        slot.set_header(&header);
        // If even the gateway cannot be reached the slot is freed on drop and the request
        // runs into the chain's timeout.
        if let Err((_, msg)) = self.send(slot, header.request, n as u32, Hop::Gateway) {
            tracing::warn!("{msg}; the request runs into the chain's timeout");
        }
    }
}

/// Writes `function '<name>': <first line of message>` as the payload (cut to the slot);
/// returns its length.
fn write_error(
    slot: &mut OwnedSlot,
    header: &SlotHeader,
    plan: &Plan,
    function: u8,
    message: &str,
) -> usize {
    let line = format!(
        "function '{}': {}",
        plan.function_name(function),
        message.lines().next().unwrap_or("")
    );
    let m = header.meta_len as usize;
    let room = slot.data().len() - m;
    let n = line.len().min(room);
    slot.data_mut()[m..m + n].copy_from_slice(&line.as_bytes()[..n]);
    n
}

/// A request taken off the transport, its handler not yet finished.
struct Taken {
    desc: Descriptor,
    slot: OwnedSlot,
    header: SlotHeader,
    /// `(caller, number)` of a call, whose answer goes back to the caller.
    call: Option<(PartyId, u32)>,
    started: std::time::Instant,
}

/// Runs a handler; a panic becomes a 500 that names it.
fn run_handler(f: impl FnOnce() -> Result<Next, HandlerError>) -> Result<Next, HandlerError> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|panic| {
        let message = format!("handler panicked: {}", panic_message(&*panic));
        tracing::error!("{message}");
        Err(HandlerError::internal(message))
    })
}

/// A request whose handler finishes later, on any thread: see
/// [`Instance::serve_deferred`]. Dropping it unfinished answers the request 500.
#[doc(hidden)]
pub struct Deferred {
    router: Arc<Dispatcher>,
    taken: Option<Taken>,
}

impl Deferred {
    /// The request as a handler sees it, without calls or state.
    pub fn request(&mut self) -> Request<'_> {
        let t = self.taken.as_mut().expect("an unfinished request");
        Request {
            slot: &mut t.slot,
            header: t.header,
            len: t.desc.len as usize,
            plan: &self.router.plan,
            function: self.router.function,
            calls: None,
            branches: Vec::new(),
            state: None,
        }
    }

    /// Finishes the request as a handler returning what `f` returns would (`f` sees
    /// [`Deferred::request`]): the request goes on along its route, back to its caller, or
    /// its error to the client.
    pub fn finish(mut self, f: impl FnOnce(&mut Request<'_>) -> Result<Next, HandlerError>) {
        let router = self.router.clone();
        let _root = router.span.clone().entered();
        let (request, route) = {
            let h = &self.taken.as_ref().expect("an unfinished request").header;
            (h.request, h.route)
        };
        let _request = logging::request_span(request, route).entered();
        let mut req = self.request();
        let outcome = run_handler(|| f(&mut req));
        let (len, header) = (req.len, req.header);
        let t = self.taken.take().expect("an unfinished request");
        router.finish(t, header, len, outcome);
    }
}

impl Drop for Deferred {
    fn drop(&mut self) {
        if let Some(t) = self.taken.take() {
            let header = t.header;
            let len = t.desc.len as usize;
            self.router.finish(
                t,
                header,
                len,
                Err(HandlerError::internal(
                    "the request was dropped without an answer",
                )),
            );
        }
    }
}

/// What a caught panic says.
fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}

#[cfg(test)]
mod tests {
    use tracing_subscriber::EnvFilter;
    use zerohop_pool::{Owner, PoolGeometry};
    use zerohop_transport::{RoutePlan, SendError};

    use super::*;
    use crate::logging::tests::Captured;

    /// Keeps what the runtime sends instead of sending it.
    #[derive(Clone, Default)]
    struct Kept(Arc<Mutex<Vec<(PartyId, Descriptor)>>>);

    impl Sender for Kept {
        fn send(&self, to: PartyId, desc: Descriptor) -> Result<(), SendError> {
            self.0.lock().unwrap().push((to, desc));
            Ok(())
        }

        fn try_send(&self, to: PartyId, desc: Descriptor) -> Result<(), SendError> {
            self.send(to, desc)
        }
    }

    /// `POST /hello` through upper (party 1) then exclaim (party 2); the gateway is party 0.
    fn hello() -> Plan {
        let function = |name: &str| FunctionPlan {
            name: name.into(),
            concurrency: 1,
            ..Default::default()
        };
        Plan {
            chain: "hello".into(),
            transport: "ring".into(),
            spin_us: 0,
            queue_capacity: 8,
            functions: vec![function("upper"), function("exclaim")],
            routes: vec![RoutePlan {
                method: "POST".into(),
                path: "/hello".into(),
                sequence: vec![0, 1],
                ..Default::default()
            }],
            headers: Vec::new(),
            party_function: vec![GATEWAY_FN, 0, 1],
            timeout_ms: 1000,
            state: None,
            pool: zerohop_transport::PoolPlan {
                slots: 64,
                slot_size: 4096,
                hugepages: false,
            },
        }
    }

    /// Runs one request with body `body` through `handler` as upper's instance, with the SDK's
    /// subscriber writing into memory at `filter`; returns what it wrote and what was sent.
    fn handle(
        filter: &str,
        body: &[u8],
        handler: impl Handler,
    ) -> (String, Vec<(PartyId, Descriptor)>) {
        let out = Captured::default();
        let kept = Kept::default();
        let subscriber = logging::subscriber(out.clone(), EnvFilter::new(filter));
        tracing::subscriber::with_default(subscriber, || {
            let (router, pool) = upper(&kept, "runtime-logging-test");
            let delivery = request(&pool, body);
            let _root = router.span.clone().entered();
            router.process(&handler, delivery, None, 0);
        });
        let sent = kept.0.lock().unwrap().clone();
        (out.text(), sent)
    }

    /// Upper's router (party 1 of `hello`), sending into `kept`, with a pool named `name`.
    fn upper(kept: &Kept, name: &str) -> (Dispatcher, Arc<Pool>) {
        let plan = hello();
        let pool = Arc::new(
            Pool::create(
                name,
                &PoolGeometry {
                    slots: 4,
                    first_slot: 0,
                    slot_size: 4096,
                    max_parties: 3,
                    hugepages: false,
                },
            )
            .unwrap(),
        );
        let router = Dispatcher {
            span: logging::instance_span(&plan.chain, "upper", 1),
            picker: Picker::new(&plan, 1),
            ids: plan.request_ids(),
            sender: Box::new(kept.clone()),
            plan: Arc::new(plan),
            pools: Pools::single(pool.clone()),
            function: 0,
            me: 1,
            state: None,
            progress: None,
        };
        (router, pool)
    }

    /// Request 65537 with body `body`, as the gateway hands it to upper.
    fn request(pool: &Arc<Pool>, body: &[u8]) -> Delivery {
        let mut slot = pool.alloc(Owner::party(1)).unwrap();
        let header = SlotHeader {
            request: 65537,
            ..SlotHeader::default()
        };
        slot.set_header(&header);
        slot.data_mut()[..body.len()].copy_from_slice(body);
        let desc = slot.descriptor(65537, body.len() as u32, 0);
        Delivery {
            from: 0,
            desc,
            slot,
            header,
            refused: false,
        }
    }

    /// A request with body `body` taken by upper's instance to finish later, and what the
    /// runtime sends.
    fn deferred(body: &[u8]) -> (Deferred, Kept, Arc<Pool>) {
        let kept = Kept::default();
        let (router, pool) = upper(&kept, "runtime-deferred-test");
        let router = Arc::new(router);
        let taken = router.take(request(&pool, body)).expect("taken");
        let d = Deferred {
            router,
            taken: Some(taken),
        };
        (d, kept, pool)
    }

    #[test]
    fn a_deferred_request_finished_on_another_thread_goes_on_along_its_route() {
        let (mut d, kept, pool) = deferred(b"hello");
        let r = d.request();
        assert_eq!((r.body(), r.route_index()), (&b"hello"[..], 0));
        std::thread::spawn(move || {
            d.finish(|req| {
                req.set_body(b"HELLO, LATER")?;
                Ok(Next::Continue)
            })
        })
        .join()
        .unwrap();
        let sent = kept.0.lock().unwrap().clone();
        assert_eq!(sent.len(), 1, "one descriptor, on to exclaim");
        assert_eq!((sent[0].0, sent[0].1.next, sent[0].1.len), (2, 1, 12));
        let (_, slot, _) = pool.take(&sent[0].1, Owner::party(2), |_| true).unwrap();
        assert_eq!(&slot.data()[..12], b"HELLO, LATER");
    }

    #[test]
    fn a_deferred_request_dropped_unfinished_is_answered_500_once() {
        let (d, kept, pool) = deferred(b"hello");
        drop(d);
        let sent = kept.0.lock().unwrap().clone();
        assert_eq!(sent.len(), 1, "exactly one answer");
        assert_eq!(sent[0].0, 0, "to the gateway");
        let (_, slot, header) = pool.take(&sent[0].1, Owner::party(0), |_| true).unwrap();
        assert_eq!(header.status, 500);
        let text = String::from_utf8_lossy(&slot.data()[..sent[0].1.len as usize]).into_owned();
        assert!(text.contains("dropped without an answer"), "{text}");
    }

    #[test]
    fn what_a_handler_logs_names_the_request_and_the_function() {
        let (log, sent) = handle("info", b"hello world", |req: &mut Request<'_>| {
            tracing::info!(bytes = req.body().len(), "upper-casing");
            req.body_mut().make_ascii_uppercase();
            Ok(Next::Continue)
        });
        assert_eq!(
            log,
            " INFO zerohop{chain=hello function=upper instance=1}:request{id=65537 route=0}: \
             upper-casing bytes=11\n"
        );
        assert_eq!(sent.len(), 1, "on to exclaim");
        assert_eq!(
            (sent[0].0, sent[0].1.next, sent[0].1.request),
            (2, 1, 65537)
        );
    }

    #[test]
    fn a_panicking_handler_is_logged_with_its_request() {
        let (log, sent) = handle(
            "warn",
            b"x",
            |_: &mut Request<'_>| -> Result<Next, HandlerError> { panic!("boom") },
        );
        assert_eq!(
            log, "ERROR zerohop{chain=hello function=upper instance=1}: handler panicked: boom\n",
            "at warn there is no request span"
        );
        assert_eq!(sent[0].0, 0, "the error goes to the gateway");
        let (log, _) = handle(
            "debug",
            b"x",
            |_: &mut Request<'_>| -> Result<Next, HandlerError> {
                Err(HandlerError::not_found("no such thing"))
            },
        );
        assert!(
            log.contains("request{id=65537 route=0}: handler failed: no such thing status=404"),
            "{log}"
        );
    }
}
