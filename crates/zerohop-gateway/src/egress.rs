//! The way back: descriptors from the chain's functions are received on the gateway's own
//! runtime (the transport's wait is one more descriptor its event loop polls) or, where the
//! transport cannot be polled, by a thread; each is checked against the request it claims to
//! answer, which it then completes. The agent reports dead instances, whose requests fail
//! with 502.

use std::os::fd::OwnedFd;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use http::StatusCode;
use zerohop_pool::{OwnedSlot, Owner, SlotHeader};
use zerohop_transport::{Delivery, Endpoint, PartyId, Stop};

use crate::{ErrorSource, Gateway, GatewayError, Inflight};

/// How a request ended, handed from the receive thread (or the agent) to its HTTP task.
pub(crate) enum Outcome {
    /// The chain answered; the slot holds the response.
    Done {
        /// The slot, now the gateway's.
        slot: OwnedSlot,
        /// Payload bytes.
        len: u32,
        /// The slot header as read once when the slot was taken (validated: metadata and
        /// payload fit the slot).
        header: SlotHeader,
        /// Function index of the party that answered.
        function: u8,
    },
    /// The request failed outside the chain's functions.
    Failed(GatewayError),
}

/// The running receive path; stop it with [`Receiving::stop`].
pub enum Receiving {
    /// A task on the gateway's runtime.
    Task(Option<tokio::task::JoinHandle<()>>),
    /// A thread blocked in the transport.
    Thread {
        /// Ends the thread's wait.
        stop: Arc<dyn Stop>,
        /// The thread.
        thread: Option<std::thread::JoinHandle<()>>,
    },
}

impl Receiving {
    /// Stops receiving and waits until the endpoint (and the pools it holds) is released.
    pub async fn stop(mut self) {
        if let Receiving::Task(task) = &mut self {
            if let Some(t) = task.take() {
                t.abort();
                let _ = t.await;
            }
        }
    }
}

impl Drop for Receiving {
    fn drop(&mut self) {
        match self {
            Receiving::Task(task) => {
                if let Some(t) = task.take() {
                    t.abort();
                }
            }
            Receiving::Thread { stop, thread } => {
                stop.stop();
                if let Some(t) = thread.take() {
                    let _ = t.join();
                }
            }
        }
    }
}

/// What the receive task owns: the endpoint, and its wait descriptor registered with the
/// runtime.
struct EventRx {
    ready: tokio::io::unix::AsyncFd<OwnedFd>,
    endpoint: Endpoint,
}

/// Answers taken in one go before the receive task lets the HTTP tasks run.
const BATCH: u32 = 256;

impl Gateway {
    /// Starts the thread that receives the chain's answers on `endpoint` (party 0's). The
    /// thread is its own supervisor: a panic while handling one answer is logged, fails the
    /// requests in flight with 502 (their state is unknown), and receiving goes on.
    ///
    /// Inside a tokio runtime, and where the transport offers a descriptor to poll (the ring
    /// with io_uring `futex_waitv`, kernel 6.7+; the socket backend always), answers are
    /// received by a task of that runtime: no thread hand-off per request. Otherwise by a
    /// thread of its own.
    pub fn start_receiving(self: &Arc<Self>, mut endpoint: Endpoint) -> Receiving {
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            if let Some(poller) = endpoint.poller() {
                match poller {
                    Ok(ready) => {
                        let gw = self.clone();
                        let rx = EventRx { ready, endpoint };
                        return Receiving::Task(Some(handle.spawn(gw.receive_events(rx))));
                    }
                    Err(e) => tracing::warn!(
                        "gateway: cannot poll the transport ({e}); receiving on a thread"
                    ),
                }
            }
        }
        let stop = endpoint.stopper();
        let gw = self.clone();
        let thread = std::thread::Builder::new()
            .name("gateway-rx".into())
            .spawn(move || loop {
                let step = catch_unwind(AssertUnwindSafe(|| match endpoint.recv() {
                    Some(d) => {
                        gw.answer_arrived(d);
                        true
                    }
                    None => false,
                }));
                match step {
                    Ok(true) => {}
                    // The endpoint returns None only once stopped.
                    Ok(false) => return,
                    Err(_) => gw.receive_failed(),
                }
            })
            .expect("spawn gateway receive thread");
        Receiving::Thread {
            stop,
            thread: Some(thread),
        }
    }

    /// The receive task: takes every answer queued, then waits for the transport's
    /// descriptor. A panic while handling one answer is handled as on the thread.
    async fn receive_events(self: Arc<Self>, mut rx: EventRx) {
        loop {
            let mut taken = 0u32;
            loop {
                let step = catch_unwind(AssertUnwindSafe(|| {
                    rx.endpoint.try_recv().map(|d| self.answer_arrived(d))
                }));
                match step {
                    Ok(Some(())) => {
                        taken += 1;
                        if taken.is_multiple_of(BATCH) {
                            // Let the requests answered so far go out.
                            tokio::task::yield_now().await;
                        }
                    }
                    Ok(None) => break,
                    Err(_) => self.receive_failed(),
                }
            }
            if !rx.endpoint.arm() {
                // More is queued (or `try_recv` stopped at its budget of invalid ones): the
                // other tasks of this runtime (other protocols, other routes) get their turn
                // first, however much garbage a function queues.
                tokio::task::yield_now().await;
                continue;
            }
            match rx.ready.readable().await {
                Ok(mut guard) => guard.clear_ready(),
                Err(e) => {
                    // The reactor lost the descriptor: nothing could wake us any more.
                    tracing::error!("gateway: polling the transport failed: {e}; retrying");
                    tokio::time::sleep(std::time::Duration::from_millis(1)).await;
                }
            }
            rx.endpoint.disarm();
        }
    }

    fn receive_failed(&self) {
        self.stats.receive_restarts.fetch_add(1, Ordering::Relaxed);
        let waiting: Vec<u32> = self
            .inflight
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .copied()
            .collect();
        tracing::error!(
            chain = %self.plan.chain,
            requests = ?waiting,
            "the gateway's receive path failed; {} request(s) in flight answered 502; receiving again",
            waiting.len()
        );
        for id in waiting {
            self.complete(
                id,
                Outcome::Failed(GatewayError::new(
                    StatusCode::BAD_GATEWAY,
                    ErrorSource::Gateway,
                    "the gateway's receive path failed while this request was in the chain",
                )),
            );
        }
    }

    /// A validated descriptor came back: hand it to its request if it really is that
    /// request's answer, else drop it (freeing the slot) and count it.
    fn answer_arrived(&self, d: Delivery) {
        let Delivery {
            from,
            desc,
            slot,
            header,
            refused,
        } = d;
        let function = self
            .plan
            .party_function
            .get(from as usize)
            .copied()
            .unwrap_or(zerohop_transport::GATEWAY_FN);
        let mut table = self.inflight.lock().unwrap_or_else(|p| p.into_inner());
        let Some(w) = table.get(&desc.request) else {
            // Nobody waits for it any more (answered by a timeout or a crash report), or it
            // never was: dropping it frees the slot.
            drop(table);
            self.stats.late.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(
                function = self.plan.function_name(function),
                party = from,
                request = desc.request,
                "dropped an answer nobody waits for (late, or no such request)"
            );
            return;
        };
        if refused {
            // The kernel refused to carry this request's descriptor from `function` to
            // `desc.next` (sockmap transport): answered only if the sender really held the
            // request's slot, which the endpoint's ownership check and this compare prove.
            let held = w.slot == desc.slot && w.generation == desc.generation;
            drop(table);
            if !held {
                self.stats.refused.fetch_add(1, Ordering::Relaxed);
                return;
            }
            let to = if desc.next == zerohop_transport::GATEWAY_FN {
                "the gateway".to_owned()
            } else {
                match self.plan.functions.get(desc.next as usize) {
                    Some(f) => format!("function {:?}", f.name),
                    None => format!("function index {}", desc.next),
                }
            };
            let from_name = self.plan.function_name(function);
            tracing::warn!(
                function = %from_name,
                party = from,
                request = desc.request,
                "refused in the kernel: no declared edge to {to}; answered 403"
            );
            drop(slot);
            self.complete(
                desc.request,
                Outcome::Failed(GatewayError::new(
                    StatusCode::FORBIDDEN,
                    ErrorSource::Function(from_name.to_owned()),
                    format!(
                        "function {from_name:?} sent this request to {to}, but the chain \
                         declares no such edge; the kernel refused it"
                    ),
                )),
            );
            return;
        }
        let same_slot = w.slot == desc.slot && w.generation == desc.generation;
        let genuine = (same_slot || self.moved(w, desc.slot))
            && header.request == desc.request
            && header.route == w.route
            && self
                .answerers
                .get(w.route as usize)
                .is_some_and(|a| a.binary_search(&function).is_ok());
        if !genuine {
            drop(table);
            self.stats.refused.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(
                function = self.plan.function_name(function),
                party = from,
                request = desc.request,
                "refused an answer that does not match the request it names"
            );
            return;
        }
        let waiter = table.remove(&desc.request).expect("checked above");
        drop(table);
        let _ = waiter.tx.send(Outcome::Done {
            slot,
            len: desc.len,
            header,
            function,
        });
    }

    /// Whether request `w` may be answered from `slot` though it was sent in another: a
    /// function whose output outgrew its slot moved the request into a large slot of its
    /// domain (docs/protocol.md, "Large pools"). Only a slot of the large pool of `w`'s
    /// route, and only once the slot `w` was sent in has been freed (its generation moved
    /// on), so that no other party still holds that request and could answer it too.
    fn moved(&self, w: &Inflight, slot: u32) -> bool {
        self.large_pool(w.route).is_some_and(|l| l.contains(slot))
            && !self.still_at(w.route, w.slot, w.generation)
    }

    /// Whether slot `slot` of route `route`'s pools is still at `generation` (held, or sent
    /// and not taken); `false` for a slot of neither pool.
    fn still_at(&self, route: u16, slot: u32, generation: u32) -> bool {
        let small = self.route_pool(route);
        [small, self.large_pool(route)]
            .into_iter()
            .flatten()
            .find(|p| p.contains(slot))
            .and_then(|p| p.owners().get(slot - p.first_slot()))
            .is_some_and(|w| w.generation == generation)
    }

    /// Hands `outcome` to the waiting request; a request no longer waiting (answered by a
    /// timeout or a crash report) just drops it, which frees its slot.
    pub(crate) fn complete(&self, request: u32, outcome: Outcome) {
        let waiter = self
            .inflight
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&request);
        match waiter {
            Some(w) => {
                let _ = w.tx.send(outcome);
            }
            None => {
                self.stats.late.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(
                    request,
                    "already answered (timeout or crash); outcome dropped"
                );
            }
        }
    }

    /// Called by the agent when `party` died (or was killed): frees every slot it held and
    /// answers each of those requests with 502. Returns how many requests were failed.
    ///
    /// The request a slot belongs to is taken from the gateway's own record of which slot
    /// and generation each request was sent in, not from the dead party's slot header.
    /// With several gateway threads use [`Gateways::party_died`](crate::Gateways::party_died).
    pub fn party_died(&self, party: PartyId, what: &str) -> usize {
        let held = self.pools.held_by(Owner::party(party));
        let failed = self.fail_held(party, &held, what);
        self.free_held(party, &held);
        failed
    }

    /// Frees `held`, the slots dead party `party` held.
    pub(crate) fn free_held(&self, party: PartyId, held: &[(u32, u32)]) {
        for (slot, _) in held {
            if let Some(p) = self.pools.of_slot(*slot) {
                p.free_held(*slot, Owner::party(party));
            }
        }
    }

    /// Answers with 502 this gateway's requests whose slot and generation dead party
    /// `party` held (`held`); returns how many.
    /// For a party that runs a fused group: the step request `id` was in when the party
    /// died (its slot header says, as the runtime writes it before each step: shared memory,
    /// so only a step of the party's own group is believed) and the group's name.
    fn fused_step(&self, party: PartyId, id: u32) -> Option<(String, String)> {
        let plan = &self.plan;
        let f = *plan.party_function.get(party as usize)?;
        if !plan.is_fused(f) {
            return None;
        }
        let group = plan.group_name(f);
        let table = self.inflight.lock().unwrap_or_else(|p| p.into_inner());
        let w = table.get(&id)?;
        let header = self.pools().of_slot(w.slot)?.peek_header(w.slot);
        let step = header
            .filter(|h| h.route == w.route)
            .and_then(|h| {
                plan.routes
                    .get(h.route as usize)?
                    .sequence
                    .get(h.hop as usize)
                    .copied()
            })
            .filter(|s| plan.group_of(f).contains(s))
            .unwrap_or(f);
        Some((plan.function_name(step).to_owned(), group))
    }

    pub(crate) fn fail_held(&self, party: PartyId, held: &[(u32, u32)], what: &str) -> usize {
        let function = self
            .plan
            .party_function
            .get(party as usize)
            .map_or("unknown", |&f| self.plan.function_name(f))
            .to_owned();
        let mut hit: Vec<u32> = Vec::new();
        {
            let table = self.inflight.lock().unwrap_or_else(|p| p.into_inner());
            for (id, w) in table.iter() {
                if held.contains(&(w.slot, w.generation)) {
                    hit.push(*id);
                }
            }
            // Requests it had moved into a large slot (its output outgrew the slot): the
            // request id is the dead party's word, so only a request whose own slot is gone
            // (see `moved`) and whose route's large pool holds that slot is failed by it.
            for &(slot, _) in held {
                let Some(pool) = self.large_pools().find(|p| p.contains(slot)) else {
                    continue;
                };
                let Some(header) = pool.peek_header(slot) else {
                    continue;
                };
                let Some(w) = table.get(&header.request) else {
                    continue;
                };
                if w.route == header.route && !hit.contains(&header.request) && self.moved(w, slot)
                {
                    hit.push(header.request);
                }
            }
        }
        for &id in &hit {
            let (function, what) = match self.fused_step(party, id) {
                Some((step, group)) => (step, format!("{what} (fused group {group})")),
                None => (function.clone(), what.to_owned()),
            };
            tracing::warn!(
                request = id,
                function = %function,
                party,
                "instance {party} {what} while handling this request; answered 502"
            );
            let err = GatewayError::new(
                StatusCode::BAD_GATEWAY,
                ErrorSource::Function(function.clone()),
                format!("instance {party} {what} while handling this request"),
            );
            self.complete(id, Outcome::Failed(err));
        }
        hit.len()
    }
}
