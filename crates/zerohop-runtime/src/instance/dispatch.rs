//! The dispatcher the handler threads share: it takes a request off the transport, runs
//! the handler on it, and sends the result on (along the request's route, back to the
//! caller of a call, or an error to the client).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use zerohop_pool::{Descriptor, OwnedSlot, PartyState, Pools, Progress, SlotHeader, State};
use zerohop_transport::{Delivery, Hop, JoinPolicy, PartyId, Picker, Plan, RequestIds, Sender};

use crate::call::Calls;
use crate::request::{HandlerError, Next, Request};
use crate::{logging, Handler};

/// What the handler threads share: it runs the handler on a delivery and sends the result
/// on (where to send, and how to pick the next instance).
pub(crate) struct Dispatcher {
    pub(crate) plan: Arc<Plan>,
    /// The pools of this function's security domains.
    pub(super) pools: Pools,
    pub(crate) sender: Box<dyn Sender>,
    pub(crate) function: u8,
    /// This instance's party.
    pub(crate) me: PartyId,
    /// Which instance of the next function gets a descriptor.
    pub(crate) picker: Picker,
    /// Which gateway thread waits for a request's answer.
    pub(super) ids: RequestIds,
    /// The chain's state store, when this function has `state`.
    pub(crate) state: Option<State>,
    /// Its handler threads' word about themselves to the agent's hang watchdog (see
    /// `zerohop_pool::progress`); `None` only in unit tests.
    pub(super) progress: Option<Progress>,
    /// The instance's root span (chain, function, party), entered on every thread that
    /// handles requests.
    pub(crate) span: tracing::Span,
}

impl Dispatcher {
    /// Handler thread `thread` takes `d` and runs the handler on it.
    pub(super) fn process<H: Handler + ?Sized>(
        &self,
        handler: &H,
        d: Delivery,
        calls: Option<&Calls<'_>>,
        thread: usize,
    ) {
        // Whatever the handler logs names the request (a no-op when INFO is filtered out).
        let _request = logging::request_span(d.desc.request, d.header.route);
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
        // A fused instance is entered at its group's first step only (the route's hop into
        // the group); the slot's route and hop are the sender's word.
        if !me.fused.is_empty() && !self.enters_here(&t.header) {
            let (header, len) = (t.header, t.desc.len as usize);
            let msg = format!(
                "the request names step {} of route {}, where the fused group `{}` does not \
                 start",
                t.header.hop,
                t.header.route,
                plan.group_name(self.function)
            );
            tracing::warn!("{msg}; answering 502");
            return self.finish(t, header, len, Err(HandlerError::new(502, msg)));
        }
        let (mut header, mut len) = (t.header, t.desc.len as usize);
        let mut branches = Some(branches);
        let outcome = loop {
            // Each step of a fused group logs under its own function's name.
            let _step = (!me.fused.is_empty())
                .then(|| logging::step_span(plan.function_name(t.step)).entered());
            let mut req = Request {
                slot: &mut t.slot,
                header,
                len,
                plan,
                function: t.step,
                calls,
                branches: branches.take().unwrap_or_default(),
                state: self.state.as_ref(),
                pools: &self.pools,
            };
            let outcome = match &failed {
                Some(e) => Err(HandlerError::from(e.clone())),
                None => run_handler(|| handler.handle(&mut req)),
            };
            // The branches' slots go back to the pool now, not when the request leaves.
            req.branches.clear();
            (len, header) = (req.len, req.header);
            // The next hop inside this instance's fused group is a function call on the
            // same slot: no descriptor, no wake-up.
            match (&outcome, self.next_step(&header)) {
                (Ok(Next::Continue), Some((step, hop))) => {
                    header.hop = hop;
                    // The slot says which step holds it: if the instance dies now, the
                    // gateway's 502 names that step.
                    t.slot.set_header(&header);
                    t.step = step;
                }
                _ => break outcome,
            }
        };
        self.finish(t, header, len, outcome);
    }

    /// Whether a request with `header` enters this instance's fused group at its first
    /// function (the only way in the spec allows).
    fn enters_here(&self, header: &SlotHeader) -> bool {
        self.plan
            .routes
            .get(header.route as usize)
            .and_then(|r| r.sequence.get(header.hop as usize))
            == Some(&self.function)
    }

    /// The step after a request's `header` position when that is a function this instance's
    /// fused group runs (not after dynamic routing): `(function, hop)`.
    fn next_step(&self, header: &SlotHeader) -> Option<(u8, u8)> {
        let me = &self.plan.functions[self.function as usize];
        if me.fused.is_empty() || header.flags & SlotHeader::FLAG_DYNAMIC != 0 {
            return None;
        }
        match self.plan.next_in_sequence(header.route, header.hop)? {
            Hop::Function { function, hop } if me.fused.contains(&function) => {
                Some((function, hop))
            }
            _ => None,
        }
    }

    /// A delivery checked and counted as started, or `None` when it is dropped (a forged
    /// call).
    pub(super) fn take(&self, d: Delivery) -> Option<Taken> {
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
            step: self.function,
            started: std::time::Instant::now(),
        })
    }

    /// Ends a request taken with [`Dispatcher::take`] as its handler's `outcome` says: the body
    /// of `len` bytes and `header` (as the handler left them) go on along the route, back to
    /// the caller, or the error to the client.
    pub(super) fn finish(
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
            step,
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
                        .filter(|t| plan.functions[step as usize].next.contains(t));
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
                    self.fail(slot, header, 503, &msg, step);
                }
            }
            Err(e) => self.fail(slot, header, e.status, &e.message, step),
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
            Hop::Function { function, .. } => {
                match self.picker.pick_state(function, slot.pool(), &*self.sender) {
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
                }
            }
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

    /// Replaces the payload with an error message of function `step` and sends the slot to
    /// the gateway.
    fn fail(
        &self,
        mut slot: OwnedSlot,
        mut header: SlotHeader,
        status: u16,
        message: &str,
        step: u8,
    ) {
        header.status = status;
        let n = write_error(&mut slot, &header, &self.plan, step, message);
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
pub(super) struct Taken {
    pub(super) desc: Descriptor,
    pub(super) slot: OwnedSlot,
    pub(super) header: SlotHeader,
    /// `(caller, number)` of a call, whose answer goes back to the caller.
    call: Option<(PartyId, u32)>,
    /// The function whose handler runs it: this instance's, or a later step of its fused
    /// group.
    pub(super) step: u8,
    started: std::time::Instant,
}

/// Runs a handler; a panic becomes a 500 that names it.
pub(super) fn run_handler(
    f: impl FnOnce() -> Result<Next, HandlerError>,
) -> Result<Next, HandlerError> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|panic| {
        let message = format!("handler panicked: {}", panic_message(&*panic));
        tracing::error!("{message}");
        Err(HandlerError::internal(message))
    })
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

    use super::*;
    use crate::instance::testing::{hello_fused, request, router_of, upper, Kept};
    use crate::logging::tests::Captured;
    use zerohop_pool::Owner;
    use zerohop_transport::GATEWAY_FN;

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
            log,
            "ERROR zerohop{chain=hello function=upper instance=1}:request{id=65537 route=0}: \
             handler panicked: boom\n",
            "at warn too, the line names the request"
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

    /// Runs one request with body `body` at `hop` through party 1 of the fused hello
    /// (upper+exclaim) with `handlers`, logging at `filter`: what it logged, the one
    /// descriptor it sent and the status and body of that slot.
    fn fused(
        filter: &str,
        body: &[u8],
        hop: u8,
        handlers: crate::Handlers,
    ) -> (String, (PartyId, Descriptor), u16, String) {
        let out = Captured::default();
        let kept = Kept::default();
        let subscriber = logging::subscriber(out.clone(), EnvFilter::new(filter));
        let pool = tracing::subscriber::with_default(subscriber, || {
            let (router, pool) = router_of(
                hello_fused(),
                &kept,
                &format!("runtime-fused-test-{filter}-{hop}"),
            );
            let mut delivery = request(&pool, body);
            delivery.header.hop = hop;
            let _root = router.span.clone().entered();
            router.process(&handlers, delivery, None, 0);
            pool
        });
        let sent = kept.0.lock().unwrap().clone();
        assert_eq!(
            sent.len(),
            1,
            "one descriptor for the whole group: {sent:?}"
        );
        let (_, slot, header) = pool.take(&sent[0].1, Owner::party(0), |_| true).unwrap();
        let m = header.meta_len as usize;
        let text = String::from_utf8_lossy(&slot.data()[m..m + sent[0].1.len as usize]);
        (out.text(), sent[0], header.status, text.into_owned())
    }

    fn upper_then(exclaim: impl Handler) -> crate::Handlers {
        crate::Handlers::new()
            .on("upper", |req: &mut Request<'_>| {
                tracing::info!("upper-casing");
                req.body_mut().make_ascii_uppercase();
                Ok(Next::Continue)
            })
            .on("exclaim", exclaim)
    }

    #[test]
    fn a_fused_group_runs_its_steps_as_calls_and_sends_once_to_the_gateway() {
        let (log, (to, desc), status, body) = fused(
            "info",
            b"hello world",
            0,
            upper_then(|req: &mut Request<'_>| {
                tracing::info!(function = req.function(), "exclaiming");
                req.extend(b"!")?;
                Ok(Next::Continue)
            }),
        );
        assert_eq!((to, desc.next, status), (0, GATEWAY_FN, 0), "straight back");
        assert_eq!(body, "HELLO WORLD!");
        assert_eq!(
            log,
            " INFO zerohop{chain=hello function=upper+exclaim instance=1}:request{id=65537 \
             route=0}:step{function=upper}: upper-casing\n \
             INFO zerohop{chain=hello function=upper+exclaim instance=1}:request{id=65537 \
             route=0}:step{function=exclaim}: exclaiming function=\"exclaim\"\n",
            "each step logs under its own name"
        );
    }

    #[test]
    fn an_error_or_a_panic_in_a_later_step_names_that_step() {
        let (_, (to, _), status, body) = fused(
            "warn",
            b"x",
            0,
            upper_then(|_: &mut Request<'_>| -> Result<Next, HandlerError> {
                Err(HandlerError::bad_request("too quiet"))
            }),
        );
        assert_eq!((to, status), (0, 400));
        assert_eq!(body, "function 'exclaim': too quiet");
        let (log, _, status, body) = fused(
            "warn",
            b"x",
            0,
            upper_then(|_: &mut Request<'_>| -> Result<Next, HandlerError> { panic!("boom") }),
        );
        assert_eq!(status, 500);
        assert_eq!(body, "function 'exclaim': handler panicked: boom");
        assert!(log.contains("handler panicked: boom"), "{log}");
        // A program without a handler for a step fails the request, naming it.
        let only_upper =
            crate::Handlers::new().on("upper", |_: &mut Request<'_>| Ok(Next::Continue));
        let (_, _, status, body) = fused("warn", b"x", 0, only_upper);
        assert_eq!(status, 500);
        assert_eq!(
            body,
            "function 'exclaim': this program registers no handler for function `exclaim` (it \
             has: upper)"
        );
    }

    #[test]
    fn a_fused_group_is_entered_at_its_first_step_only() {
        let ran = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let r = ran.clone();
        let handlers = crate::Handlers::new().on("exclaim", move |_: &mut Request<'_>| {
            r.store(true, std::sync::atomic::Ordering::SeqCst);
            Ok(Next::Continue)
        });
        let (_, (to, _), status, body) = fused("warn", b"x", 1, handlers);
        assert_eq!((to, status), (0, 502));
        assert!(
            !ran.load(std::sync::atomic::Ordering::SeqCst),
            "no step ran"
        );
        assert_eq!(
            body,
            "function 'upper': the request names step 1 of route 0, where the fused group \
             `upper+exclaim` does not start"
        );
    }
}
