//! Receiving on the ring: scan the per-sender queues round-robin, spin briefly when all are
//! empty, then sleep on the inbox futex.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use zerohop_pool::sync::{fence, spin_hint, Ordering};

use super::transport::RingShared;
use crate::{sys, PartyId, Raw, Receiver, Stop};

/// The ring receiver of one party.
pub struct RingReceiver {
    shared: Arc<RingShared>,
    me: PartyId,
    next_sender: PartyId,
    /// The sender whose queue holds the descriptor the last `peek` returned.
    peeked: Option<PartyId>,
    /// Spin budget before sleeping: the configured one, or zero when this thread may run on
    /// one CPU only. Spinning then only keeps the sender (which needs that very CPU) from
    /// running, so the receiver sleeps at once.
    spin: Duration,
    stop: Arc<RingStop>,
}

/// Stops a [`RingReceiver`].
pub struct RingStop {
    shared: Arc<RingShared>,
    me: PartyId,
    stopped: AtomicBool,
}

impl Stop for RingStop {
    fn stop(&self) {
        // SYNC POINT: SeqCst pairs with the SeqCst load of `stopped` in `peek` after its
        // fence: either the receiver sees the flag before it waits, or it waits on the `seq`
        // value read before our bump below, and the wake ends that wait.
        self.stopped.store(true, Ordering::SeqCst);
        let seq = self.shared.seq(self.me);
        // SYNC POINT: as a sender's wake: pairs with the Acquire load of `seq` in `recv`.
        seq.fetch_add(1, Ordering::Release);
        sys::futex_wake(seq);
    }
}

impl RingReceiver {
    pub(crate) fn new(shared: Arc<RingShared>, me: PartyId) -> Self {
        let spin = if sys::allowed_cpus() > 1 {
            Duration::from_micros(shared.opts.spin_us as u64)
        } else {
            Duration::ZERO
        };
        let stop = Arc::new(RingStop {
            shared: shared.clone(),
            me,
            stopped: AtomicBool::new(false),
        });
        Self {
            shared,
            me,
            next_sender: 0,
            peeked: None,
            spin,
            stop,
        }
    }

    /// One round-robin pass over the senders' queues; the descriptor found stays queued.
    fn poll_once(&mut self) -> Option<Raw> {
        let n = self.shared.parties;
        // The descriptor peeked last comes first until it is consumed.
        let first = self.peeked.unwrap_or(self.next_sender);
        for k in 0..n {
            let from = (first + k) % n;
            if let Some(desc) = self.shared.queue(self.me, from).peek() {
                self.peeked = Some(from);
                return Some(Raw {
                    from: Some(from),
                    desc,
                });
            }
        }
        None
    }

    fn all_empty(&self) -> bool {
        (0..self.shared.parties).all(|from| self.shared.queue(self.me, from).is_empty())
    }
}

impl Receiver for RingReceiver {
    fn consume(&mut self) {
        if let Some(from) = self.peeked.take() {
            self.shared.queue(self.me, from).advance();
            self.next_sender = (from + 1) % self.shared.parties;
        }
    }

    fn peek(&mut self) -> Option<Raw> {
        let spin = self.spin;
        let mut spin_start: Option<Instant> = None;
        let mut rounds = 0u32;
        loop {
            // A fast check; the SeqCst load before sleeping is the one that must not miss.
            if self.stop.stopped.load(Ordering::Relaxed) {
                return None;
            }
            if let Some(raw) = self.poll_once() {
                return Some(raw);
            }
            // Spin phase: look at the clock only every 64 rounds.
            if !spin.is_zero() {
                let start = *spin_start.get_or_insert_with(Instant::now);
                rounds = rounds.wrapping_add(1);
                if rounds % 64 != 0 || start.elapsed() < spin {
                    spin_hint();
                    continue;
                }
            }
            // Sleep phase.
            let seq = self.shared.seq(self.me);
            let sleeping = self.shared.sleeping(self.me);
            // SYNC POINT: Acquire pairs with the Release `fetch_add` of a waking sender.
            let seen = seq.load(Ordering::Acquire);
            sleeping.store(1, Ordering::Relaxed);
            // SYNC POINT: this SeqCst fence pairs with the sender's fence between publishing
            // `tail` and reading `sleeping`.
            fence(Ordering::SeqCst);
            if self.all_empty() && !self.stop.stopped.load(Ordering::SeqCst) {
                sys::futex_wait(seq, seen);
            }
            sleeping.store(0, Ordering::Relaxed);
            spin_start = None;
            rounds = 0;
        }
    }

    fn stopper(&self) -> Arc<dyn Stop> {
        self.stop.clone()
    }
}
