//! Receiving on the ring: scan the queues from our senders round-robin, spin briefly when all
//! are empty, then sleep on all their tails at once (`futex_waitv`).

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use zerohop_pool::sync::{fence, spin_hint, AtomicU32, Ordering};

use super::transport::RingShared;
use super::uring::UringWait;
use super::Spsc;
use crate::{sys, PartyId, Raw, Receiver, Stop};

/// One queue into this receiver.
#[derive(Clone, Copy)]
struct Lane {
    from: PartyId,
    /// Queue index in the sender's outbox.
    out: usize,
}

/// The ring receiver of one party.
pub struct RingReceiver {
    shared: Arc<RingShared>,
    me: PartyId,
    lanes: Vec<Lane>,
    next_lane: usize,
    /// The lane whose queue holds the descriptor the last `peek` returned.
    peeked: Option<usize>,
    /// Per lane, the sender's tail as last read ([`Spsc::peek_cached`]).
    tails: Vec<u32>,
    /// This thread may run on one CPU only.
    one_cpu: bool,
    /// Spin budget before sleeping: the configured one, or zero when this thread may run on
    /// one CPU only. Spinning then only keeps the sender (which needs that very CPU) from
    /// running, so the receiver sleeps at once.
    spin: Duration,
    /// The spin budget now, between zero and `spin`: halved each time spinning ran out
    /// without work arriving, doubled each time work arrived while spinning or soon enough
    /// after falling asleep that spinning would have caught it. A receiver whose work comes
    /// in bursts keeps spinning between them; one fed rarely (or by a sender sharing its
    /// core) stops burning CPU after a few misses.
    budget: Duration,
    /// This thread's involuntary context switches when it last began to spin: when they
    /// grew, something else was waiting for this core, and the receiver does not spin
    /// that time (spinning on a busy core only delays whoever waits, often the sender).
    preempted: u64,
    stop: Arc<RingStop>,
    /// Reused futex_waitv argument (tails, then the stop word).
    waiters: Vec<sys::FutexWaiter>,
    /// Event-loop waiting, once asked for: `Some(None)` when the kernel has none.
    uring: Option<Option<UringWait>>,
}

/// Stops a [`RingReceiver`].
pub struct RingStop {
    stopped: AtomicBool,
    /// A receiver of one queue waits on that queue's tail alone (`FUTEX_WAIT`, cheaper than
    /// `futex_waitv`): the address, for the stopper to wake it; 0 otherwise.
    single_tail: usize,
    /// Set by a receiver of one queue from before its last look at `stopped` until its wait
    /// returned.
    in_wait: AtomicBool,
    /// Bumped by `stop`; the receiver waits on it beside its queues' tails. In this
    /// process's memory (the stopper is a thread of the receiving party), so the kernel finds
    /// it without a page lookup.
    word: AtomicU32,
}

impl Stop for RingStop {
    fn stop(&self) {
        // SYNC POINT: SeqCst pairs with the SeqCst load of `stopped` in `peek` after its
        // fence: either the receiver sees the flag before it waits, or it waits on the stop
        // word's value read before our bump below, and the wake ends that wait.
        self.stopped.store(true, Ordering::SeqCst);
        // SYNC POINT: pairs with the receiver's Acquire load of the stop word before it
        // waits; the changed value makes a racing wait return at once.
        self.word.fetch_add(1, Ordering::Release);
        sys::futex_wake_private(&self.word);
        if self.single_tail != 0 {
            // The receiver waits on a word it cannot be made to see change: wake it until it
            // is out of its wait. SYNC POINT: this SeqCst load pairs with the receiver's
            // SeqCst store of `in_wait` before its SeqCst load of `stopped`: if we read
            // false, the receiver's look at `stopped` comes after our store and sees it.
            for _ in 0..100_000 {
                if !self.in_wait.load(Ordering::SeqCst) {
                    return;
                }
                // SAFETY of the address: the tail lives in a region the receiver (and so
                // this stopper's owner) keeps mapped while the receiver exists.
                sys::futex_wake_addr(self.single_tail);
                std::thread::sleep(std::time::Duration::from_micros(100));
            }
        }
    }
}

/// The smallest spin budget worth its clock reads; below it the receiver does not spin.
const MIN_SPIN: Duration = Duration::from_micros(1);

impl RingReceiver {
    /// Poll mode's receive: the queues, round after round, until work or a stop; never a
    /// system call, except a `sched_yield` every 64 rounds on a thread that may run on one
    /// CPU only (where the sender needs that very CPU).
    fn poll_forever(&mut self) -> Option<Raw> {
        let mut rounds = 0u32;
        loop {
            // Relaxed: a flag looked at every round; nothing the stopper wrote before it is
            // read after (the sleeping receiver's SeqCst look is for its futex wait).
            if self.stop.stopped.load(Ordering::Relaxed) {
                return None;
            }
            if let Some(raw) = self.poll_once() {
                return Some(raw);
            }
            rounds = rounds.wrapping_add(1);
            if self.one_cpu && rounds.is_multiple_of(64) {
                std::thread::yield_now();
            } else {
                spin_hint();
            }
        }
    }

    /// Whether this thread was preempted since it last asked: a sign that its core has
    /// other work, on which spinning only steals time (one `getrusage`, made only where the
    /// receiver would spin).
    fn core_contended(&mut self) -> bool {
        let now = sys::involuntary_switches();
        let contended = now > self.preempted;
        self.preempted = now;
        contended
    }

    /// Doubles the spin budget (from [`MIN_SPIN`] when it was zero), up to the configured one.
    fn grow_budget(&mut self) {
        if self.spin >= MIN_SPIN {
            self.budget = (self.budget * 2).clamp(MIN_SPIN, self.spin);
        }
    }

    pub(crate) fn new(shared: Arc<RingShared>, me: PartyId) -> Self {
        let one_cpu = sys::allowed_cpus() <= 1;
        let spin = if !one_cpu {
            Duration::from_micros(shared.opts.spin_us as u64)
        } else {
            Duration::ZERO
        };
        let lanes: Vec<Lane> = shared
            .policy
            .senders(me)
            .into_iter()
            .map(|from| Lane {
                from,
                out: shared
                    .policy
                    .target_index(from, me)
                    .expect("an edge is in both lists"),
            })
            .collect();
        let single_tail = match lanes.as_slice() {
            [l] => shared.tail(l.from, l.out).as_ptr() as usize,
            _ => 0,
        };
        let stop = Arc::new(RingStop {
            stopped: AtomicBool::new(false),
            single_tail,
            in_wait: AtomicBool::new(false),
            word: AtomicU32::new(0),
        });
        Self {
            one_cpu,
            shared,
            me,
            tails: vec![0; lanes.len()],
            lanes,
            next_lane: 0,
            peeked: None,
            spin,
            budget: spin,
            preempted: 0,
            stop,
            waiters: Vec::new(),
            uring: None,
        }
    }

    fn queue(&self, i: usize) -> Spsc<'_> {
        let l = self.lanes[i];
        self.shared.queue(l.from, l.out, self.me, i)
    }

    /// One round-robin pass over the queues; the descriptor found stays queued.
    fn poll_once(&mut self) -> Option<Raw> {
        let n = self.lanes.len();
        // The descriptor peeked last comes first until it is consumed.
        let first = self.peeked.unwrap_or(self.next_lane);
        for k in 0..n {
            let i = (first + k) % n;
            let mut tail = self.tails[i];
            let found = self.queue(i).peek_cached(&mut tail);
            self.tails[i] = tail;
            if let Some(desc) = found {
                self.peeked = Some(i);
                return Some(Raw {
                    from: self.lanes[i].from,
                    desc,
                    refused: false,
                });
            }
        }
        None
    }

    /// Fills `waiters` with every tail's current value; false if some queue holds work.
    fn arm(&mut self, stop_seen: u32) -> bool {
        if !self.arm_tails() {
            return false;
        }
        self.waiters
            .push(sys::FutexWaiter::private(&self.stop.word, stop_seen));
        true
    }

    /// Fills `waiters` with every tail's current value (nothing else); false if some queue
    /// holds work.
    fn arm_tails(&mut self) -> bool {
        self.waiters.clear();
        for i in 0..self.lanes.len() {
            let l = self.lanes[i];
            let tail = self.shared.tail(l.from, l.out);
            // SYNC POINT: Acquire pairs with the Release store of `tail` in
            // `Spsc::push_cached`; the value read is the one the wait compares against.
            let seen = tail.load(Ordering::Acquire);
            if self.queue(i).head_value() != seen {
                return false;
            }
            self.waiters.push(sys::FutexWaiter::new(tail, seen));
        }
        true
    }
}

impl Receiver for RingReceiver {
    fn consume(&mut self) {
        if let Some(i) = self.peeked.take() {
            self.queue(i).advance();
            self.next_lane = (i + 1) % self.lanes.len();
        }
    }

    fn peek(&mut self) -> Option<Raw> {
        // Poll mode (`transport: poll`): never sleep.
        if self.shared.opts.poll {
            return self.poll_forever();
        }
        let mut spin_start: Option<Instant> = None;
        let mut rounds = 0u32;
        loop {
            // A fast check; the SeqCst load before sleeping is the one that must not miss.
            if self.stop.stopped.load(Ordering::Relaxed) {
                return None;
            }
            if let Some(raw) = self.poll_once() {
                if spin_start.is_some() {
                    // Spinning paid.
                    self.grow_budget();
                }
                return Some(raw);
            }
            // Spin phase: look at the clock only every 64 rounds.
            if spin_start.is_none() && !self.budget.is_zero() && self.core_contended() {
                // Not this time; the budget grows back as it does after a miss.
                self.budget = Duration::ZERO;
            }
            if !self.budget.is_zero() {
                let start = *spin_start.get_or_insert_with(Instant::now);
                rounds = rounds.wrapping_add(1);
                if !rounds.is_multiple_of(64) || start.elapsed() < self.budget {
                    spin_hint();
                    continue;
                }
                // Spinning did not pay this time.
                self.budget /= 2;
                if self.budget < MIN_SPIN {
                    self.budget = Duration::ZERO;
                }
            }
            let asleep = (!self.spin.is_zero()).then(Instant::now);
            // Sleep phase.
            // SYNC POINT: Acquire pairs with the Release `fetch_add` of the stopper.
            let stop_seen = self.stop.word.load(Ordering::Acquire);
            self.shared.sleeping(self.me).store(1, Ordering::Relaxed);
            // SYNC POINT: this SeqCst fence pairs with the sender's fence between publishing
            // `tail` and reading `sleeping`.
            fence(Ordering::SeqCst);
            if self.stop.single_tail != 0 {
                // SYNC POINT: pairs with the stopper's SeqCst load of `in_wait`.
                self.stop.in_wait.store(true, Ordering::SeqCst);
                if self.arm(stop_seen) && !self.stop.stopped.load(Ordering::SeqCst) {
                    let [tail, _stop] = self.waiters[..] else {
                        unreachable!("one queue and the stop word")
                    };
                    sys::futex_wait(tail);
                }
                self.stop.in_wait.store(false, Ordering::SeqCst);
            } else if self.arm(stop_seen) && !self.stop.stopped.load(Ordering::SeqCst) {
                sys::futex_waitv(&self.waiters);
            }
            self.shared.sleeping(self.me).store(0, Ordering::Relaxed);
            if asleep.is_some_and(|t| t.elapsed() < self.spin) {
                // Work came within the configured spin: spinning would have caught it.
                self.grow_budget();
            }
            spin_start = None;
            rounds = 0;
        }
    }

    fn stopper(&self) -> Arc<dyn Stop> {
        self.stop.clone()
    }

    fn try_peek(&mut self) -> Option<Raw> {
        self.poll_once()
    }

    fn event_fd(&mut self) -> Option<std::os::fd::BorrowedFd<'_>> {
        let chunks = self.lanes.len().div_ceil(sys::FUTEX_WAITV_MAX).max(1);
        self.uring
            .get_or_insert_with(|| UringWait::new(chunks))
            .as_ref()
            .map(UringWait::fd)
    }

    fn arm(&mut self) -> bool {
        // The same rule as the sleep phase of `peek`: `sleeping` first, a full fence, then
        // every tail once more; a sender that publishes after our look sees `sleeping` and
        // wakes the tail we wait on.
        self.shared.sleeping(self.me).store(1, Ordering::Relaxed);
        // SYNC POINT: this SeqCst fence pairs with the sender's fence between publishing
        // `tail` and reading `sleeping`.
        fence(Ordering::SeqCst);
        // Not set up for an event loop (no ring to wait on) counts as work: look again.
        let waiting = self.arm_tails()
            && match self.uring.as_mut() {
                Some(Some(uring)) => uring.arm(&self.waiters).is_ok(),
                _ => false,
            };
        if !waiting {
            self.shared.sleeping(self.me).store(0, Ordering::Relaxed);
        }
        waiting
    }

    fn disarm(&mut self) {
        self.shared.sleeping(self.me).store(0, Ordering::Relaxed);
        if let Some(Some(uring)) = self.uring.as_mut() {
            uring.reap();
        }
    }
}
