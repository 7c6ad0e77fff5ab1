//! The way back: a thread receives descriptors from the chain's functions, checks each
//! against the request it claims to answer, and completes that request; the agent reports
//! dead instances, whose requests fail with 502.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use http::StatusCode;
use zerohop_pool::{OwnedSlot, Owner, SlotHeader};
use zerohop_transport::{Delivery, Endpoint, PartyId, Stop};

use crate::{ErrorSource, Gateway, GatewayError};

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

/// The running receive thread; stop it with [`Receiving::stop`].
pub struct Receiving {
    stop: Arc<dyn Stop>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Receiving {
    /// Stops the thread and waits for it (dropping does the same).
    pub fn stop(self) {}
}

impl Drop for Receiving {
    fn drop(&mut self) {
        self.stop.stop();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Gateway {
    /// Starts the thread that receives the chain's answers on `endpoint` (party 0's). The
    /// thread is its own supervisor: a panic while handling one answer is logged, fails the
    /// requests in flight with 502 (their state is unknown), and receiving goes on.
    pub fn start_receiving(self: &Arc<Self>, mut endpoint: Endpoint) -> Receiving {
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
        Receiving {
            stop,
            thread: Some(thread),
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
            return;
        };
        let genuine = w.slot == desc.slot
            && w.generation == desc.generation
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
            }
        }
    }

    /// Called by the agent when `party` died (or was killed): frees every slot it held and
    /// answers each of those requests with 502. Returns how many requests were failed.
    ///
    /// The request a slot belongs to is taken from the gateway's own record of which slot
    /// and generation each request was sent in, not from the dead party's slot header.
    pub fn party_died(&self, party: PartyId, what: &str) -> usize {
        let function = self
            .plan
            .party_function
            .get(party as usize)
            .map_or("unknown", |&f| self.plan.function_name(f))
            .to_owned();
        let held = self.pools.held_by(Owner::party(party));
        let mut hit: Vec<u32> = Vec::new();
        {
            let table = self.inflight.lock().unwrap_or_else(|p| p.into_inner());
            for (id, w) in table.iter() {
                if held.contains(&(w.slot, w.generation)) {
                    hit.push(*id);
                }
            }
        }
        for (slot, _) in &held {
            if let Some(p) = self.pools.of_slot(*slot) {
                p.free_held(*slot, Owner::party(party));
            }
        }
        for &id in &hit {
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
