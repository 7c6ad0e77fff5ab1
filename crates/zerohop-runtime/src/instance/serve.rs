//! An attached [`Instance`] and its serving loops: activation (ready now, or parked until
//! the agent activates it), the receiving thread, and the handler threads it hands requests
//! to; or, for [`Instance::serve_deferred`], requests started on the receiving thread and
//! finished later.

use std::sync::{mpsc, Arc, Mutex};

use zerohop_pool::{PartyState, SlotHeader};
use zerohop_transport::{Delivery, Endpoint, FunctionPlan, PartyId};

use super::deferred::Deferred;
use super::dispatch::Dispatcher;
use crate::call::{Calls, Pending};
use crate::Handler;

/// An attached instance, ready to serve.
pub struct Instance {
    pub(super) router: Arc<Dispatcher>,
    pub(super) endpoint: Endpoint,
    pub(super) me: PartyId,
}

impl Instance {
    /// Marks the instance ready and serves requests with `handler` on the spec's number of
    /// threads. Returns only if the transport is stopped or closed.
    pub fn serve<H: Handler>(self, handler: H) -> ! {
        self.serve_in_place(handler);
        std::process::exit(0)
    }

    /// The functions this instance runs, in order: its own, or every step of the fused group
    /// it runs (`fuse:` in the spec).
    pub fn functions(&self) -> Vec<String> {
        let plan = &self.router.plan;
        plan.group_of(self.router.function)
            .iter()
            .map(|&f| plan.function_name(f).to_owned())
            .collect()
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
                            pools: &router.pools,
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
