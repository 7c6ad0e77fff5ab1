//! Calls: a handler asks other functions of its chain for their output and waits for it.
//!
//! A call takes a new slot from the request's pool, writes the input into it and sends it
//! to an instance of the callee with [`SlotHeader::FLAG_CALL`], this party as `caller` and
//! a number of this instance's own as `call`. The callee's runtime runs its handler and
//! sends the slot back (whatever the handler returned, an error too) with
//! [`SlotHeader::FLAG_ANSWER`]. This instance's receive thread hands the answer to the
//! handler thread that waits for that number; the handler reads the output in place (no
//! copy) and the slot is freed when the [`Answer`] is dropped.
//!
//! A caller waits at most the chain's timeout, and gives up at once on a callee instance
//! that died or restarted (its party record says so): the call then fails with 502, and the
//! handler decides what the request answers.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use zerohop_pool::{OwnedSlot, Owner, PartyState, Pool, Pools, SlotHeader};
use zerohop_transport::{Delivery, PartyId, Picker, Plan, Sender};

/// How often a waiting caller looks whether its callees are still alive.
const LIVENESS_EVERY: Duration = Duration::from_millis(20);

/// A call that could not give an output: the callee answered with an error, died, took too
/// long, or could not be reached.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("call to `{function}` failed with {status}: {message}")]
pub struct CallError {
    /// The function called.
    pub function: String,
    /// HTTP-like status: the callee's own error status, 502 if it died, 504 if it did not
    /// answer within the chain's timeout, 503 if it could not be reached, 500 if this
    /// function may not call it.
    pub status: u16,
    /// What went wrong, in one line.
    pub message: String,
}

/// A callee's output, read in place in its slot (freed when this is dropped).
pub struct Answer {
    slot: OwnedSlot,
    meta_len: usize,
    len: usize,
}

impl Answer {
    /// The output.
    pub fn body(&self) -> &[u8] {
        &self.slot.data()[self.meta_len..self.meta_len + self.len]
    }
}

impl std::fmt::Debug for Answer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Answer").field("len", &self.len).finish()
    }
}

/// The calls this instance is waiting for: call number -> the waiting handler thread.
#[derive(Default)]
pub(crate) struct Pending {
    next: AtomicU32,
    waiting: Mutex<HashMap<u32, mpsc::Sender<Delivery>>>,
}

impl Pending {
    fn register(&self, tx: &mpsc::Sender<Delivery>) -> u32 {
        let mut w = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            let n = self.next.fetch_add(1, Ordering::Relaxed).wrapping_add(1);
            if n != 0 && !w.contains_key(&n) {
                w.insert(n, tx.clone());
                return n;
            }
        }
    }

    fn forget(&self, n: u32) {
        self.waiting
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&n);
    }

    /// Hands an answer to the thread waiting for it. An answer nobody waits for (late, or
    /// forged) is dropped, which frees its slot.
    pub(crate) fn deliver(&self, d: Delivery) {
        let n = d.header.call;
        let tx = self
            .waiting
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&n);
        if let Some(tx) = tx {
            let _ = tx.send(d);
        }
    }
}

/// How long calls for the request of `header` may wait: until a little before its deadline
/// (a tenth of the chain's timeout, at most 100 ms, so the caller can still answer before
/// the gateway gives up), never longer than the chain's timeout.
fn wait_at_most(header: &SlotHeader, timeout_ms: u64) -> Duration {
    let margin = (timeout_ms / 10).min(100);
    let by_deadline = match header.deadline_ms {
        0 => timeout_ms,
        d => d
            .saturating_sub(margin)
            .saturating_sub(zerohop_pool::monotonic_ms()),
    };
    Duration::from_millis(by_deadline.min(timeout_ms))
}

/// What a request's handler needs to make calls: the instance's plan, function, party,
/// picker and sender (its dispatcher's), and its calls waiting for answers.
pub(crate) struct Calls<'a> {
    pub plan: &'a Plan,
    /// The calling function.
    pub function: u8,
    /// The calling instance's party.
    pub me: PartyId,
    pub picker: &'a Picker,
    pub sender: &'a dyn Sender,
    pub pending: &'a Pending,
    /// The pools this instance maps: a call's input goes into a small slot of the request's
    /// domain, or into a large one when it does not fit.
    pub pools: &'a Pools,
}

/// One call on its way.
#[derive(Clone, Copy)]
struct Out {
    function: u8,
    /// The instance it went to and its restart count then.
    party: PartyId,
    restarts: u32,
    number: u32,
}

/// Where one call of [`Calls::call_all`] stands.
enum Call {
    Waiting(Out),
    Done(Result<Answer, CallError>),
}

/// The error of a call `from` may not make: `to` is not in its `calls` list (or no
/// function of the chain at all).
pub(crate) fn not_allowed(plan: &Plan, from: u8, to: &str) -> CallError {
    let message = match plan.function_index(to) {
        Some(_) => format!(
            "`{}` may not call `{to}`: add it to its `calls` list in the spec",
            plan.function_name(from)
        ),
        None => format!("no function `{to}` in this chain"),
    };
    CallError {
        function: to.to_owned(),
        status: 500,
        message,
    }
}

impl Calls<'_> {
    /// Sends every call, then waits for every answer (or failure); results in the order
    /// given.
    pub(crate) fn call_all(
        &self,
        header: &SlotHeader,
        pool: &Arc<Pool>,
        calls: &[(&str, &[u8])],
    ) -> Vec<Result<Answer, CallError>> {
        let (tx, rx) = mpsc::channel();
        let mut state: Vec<Call> = calls
            .iter()
            .map(
                |&(name, input)| match self.send(header, pool, name, input, &tx) {
                    Ok(o) => Call::Waiting(o),
                    Err(e) => Call::Done(Err(e)),
                },
            )
            .collect();
        let deadline = Instant::now() + wait_at_most(header, self.plan.timeout_ms);
        while state.iter().any(|c| matches!(c, Call::Waiting(_))) {
            let now = Instant::now();
            if now >= deadline {
                for c in &mut state {
                    self.give_up(c, 504, |_| "no answer before the request's deadline".into());
                }
                break;
            }
            // `tx` lives here, so the channel never disconnects: only answers or a timeout.
            match rx.recv_timeout(LIVENESS_EVERY.min(deadline - now)) {
                Ok(d) => {
                    for c in &mut state {
                        if let Call::Waiting(o) = *c {
                            if o.number == d.header.call {
                                *c = Call::Done(self.answer(o, d));
                                break;
                            }
                        }
                    }
                }
                Err(_) => {
                    for c in &mut state {
                        // Dead or restarted since: the call is lost. Not ready yet (parked,
                        // stopped, starting: being activated) is no loss, the call waits.
                        let gone = matches!(c, Call::Waiting(o) if pool.party(o.party).is_none_or(|rec| {
                            rec.state() == PartyState::Dead || rec.restarts() != o.restarts
                        }));
                        if gone {
                            self.give_up(c, 502, |o| {
                                format!("instance {} died while handling the call", o.party)
                            });
                        }
                    }
                }
            }
        }
        state
            .into_iter()
            .map(|c| match c {
                Call::Done(r) => r,
                Call::Waiting(_) => unreachable!("every call is settled when the loop ends"),
            })
            .collect()
    }

    /// Settles a call still waiting as failed with `status`: its answer, should it come
    /// later, is dropped.
    fn give_up(&self, c: &mut Call, status: u16, message: impl Fn(&Out) -> String) {
        if let Call::Waiting(o) = c {
            self.pending.forget(o.number);
            *c = Call::Done(Err(CallError {
                function: self.plan.function_name(o.function).to_owned(),
                status,
                message: message(o),
            }));
        }
    }

    fn send(
        &self,
        header: &SlotHeader,
        pool: &Arc<Pool>,
        name: &str,
        input: &[u8],
        tx: &mpsc::Sender<Delivery>,
    ) -> Result<Out, CallError> {
        let r = self;
        let fail = |status: u16, message: String| CallError {
            function: name.to_owned(),
            status,
            message,
        };
        let function = r
            .plan
            .function_index(name)
            .filter(|f| r.plan.functions[r.function as usize].calls.contains(f))
            .ok_or_else(|| not_allowed(r.plan, r.function, name))?;
        let (party, seen) = r
            .picker
            .pick_state(function, pool, r.sender)
            .ok_or_else(|| fail(503, "no instance of it exists".into()))?;
        // The request's domain: its small pool, and its large pool for an input that does
        // not fit a small slot (the request itself may be in either).
        let small = r.pools.small_of(pool).unwrap_or(pool);
        let large = r.pools.large_of(small);
        let target = match large {
            Some(large) if input.len() > small.slot_capacity() => {
                if input.len() > large.slot_capacity() {
                    return Err(fail(
                        500,
                        format!(
                            "call input of {} bytes exceeds the largest slot of {} bytes (for \
                             the chain's max_body); raise max_body",
                            input.len(),
                            large.slot_capacity()
                        ),
                    ));
                }
                large
            }
            _ => small,
        };
        let mut slot = target.alloc(Owner::party(r.me)).ok_or_else(|| {
            let which = if target.releases() {
                "large slot"
            } else {
                "slot"
            };
            fail(503, format!("no free {which} for the call's input"))
        })?;
        let room = slot.data().len();
        if input.len() > room {
            return Err(fail(
                500,
                format!(
                    "call input of {} bytes exceeds the slot capacity of {room} bytes, and the \
                     chain has no large slots; raise max_body (or pool.slot_size)",
                    input.len()
                ),
            ));
        }
        slot.data_mut()[..input.len()].copy_from_slice(input);
        let restarts = pool.party(party).map_or(0, |rec| rec.restarts());
        let number = self.pending.register(tx);
        slot.set_header(&SlotHeader {
            request: header.request,
            route: header.route,
            hop: header.hop,
            flags: SlotHeader::FLAG_CALL,
            call: number,
            caller: r.me,
            deadline_ms: header.deadline_ms,
            ..SlotHeader::default()
        });
        let desc = slot.descriptor(header.request, input.len() as u32, function);
        match r.sender.send(party, desc) {
            Ok(()) => {
                slot.into_sent();
                if seen != PartyState::Ready {
                    // It waits in that party's queue: the agent activates it.
                    pool.want_instance();
                }
                Ok(Out {
                    function,
                    party,
                    restarts,
                    number,
                })
            }
            Err(e) => {
                self.pending.forget(number);
                Err(fail(503, format!("could not reach it: {e}")))
            }
        }
    }

    fn answer(&self, o: Out, d: Delivery) -> Result<Answer, CallError> {
        let r = self;
        let function = r.plan.function_name(o.function).to_owned();
        // Only an instance of the function called may answer.
        if r.plan.party_function.get(d.from as usize) != Some(&o.function) {
            return Err(CallError {
                function,
                status: 502,
                message: format!("answered by party {}, which does not run it", d.from),
            });
        }
        let meta_len = d.header.meta_len as usize;
        let len = d.desc.len as usize;
        let answer = Answer {
            slot: d.slot,
            meta_len,
            len,
        };
        match d.header.status {
            0 | 200..=299 => Ok(answer),
            status => Err(CallError {
                function,
                status: if (400..=599).contains(&status) {
                    status
                } else {
                    502
                },
                message: String::from_utf8_lossy(answer.body())
                    .lines()
                    .next()
                    .unwrap_or("")
                    .to_owned(),
            }),
        }
    }
}
