//! The way back: a thread receives descriptors from the last functions and completes the
//! waiting requests; the agent reports dead instances, whose requests fail with 502.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use http::StatusCode;
use zerohop_pool::{OwnedSlot, Owner};
use zerohop_transport::{Endpoint, PartyId, Stop};

use crate::{ErrorSource, Gateway, GatewayError};

/// How a request ended, handed from the receive thread (or the agent) to its HTTP task.
pub(crate) enum Outcome {
    /// The chain answered; the slot holds the response.
    Done {
        /// The slot, now the gateway's.
        slot: OwnedSlot,
        /// Payload bytes.
        len: u32,
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
    /// Starts the thread that receives the chain's answers on `endpoint` (party 0's).
    pub fn start_receiving(self: &Arc<Self>, mut endpoint: Endpoint) -> Receiving {
        let stop = endpoint.stopper();
        let gw = self.clone();
        let thread = std::thread::Builder::new()
            .name("gateway-rx".into())
            .spawn(move || {
                while let Some(d) = endpoint.recv() {
                    gw.complete(
                        d.desc.request,
                        Outcome::Done {
                            slot: d.slot,
                            len: d.desc.len,
                        },
                    );
                }
            })
            .expect("spawn gateway receive thread");
        Receiving {
            stop,
            thread: Some(thread),
        }
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
            Some(tx) => {
                let _ = tx.send(outcome);
            }
            None => {
                self.stats.late.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Called by the agent when `party` died: frees every slot it held and answers each of
    /// those requests with 502. Returns how many requests were failed.
    pub fn party_died(&self, party: PartyId, what: &str) -> usize {
        let function = self
            .plan
            .party_function
            .get(party as usize)
            .map_or("unknown", |&f| self.plan.function_name(f))
            .to_owned();
        let mut failed = 0;
        for (_, header) in self.pool.reclaim(Owner::party(party)) {
            let err = GatewayError::new(
                StatusCode::BAD_GATEWAY,
                ErrorSource::Function(function.clone()),
                format!("instance {party} {what} while handling this request"),
            );
            if self
                .inflight
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .contains_key(&header.request)
            {
                failed += 1;
            }
            self.complete(header.request, Outcome::Failed(err));
        }
        failed
    }
}
