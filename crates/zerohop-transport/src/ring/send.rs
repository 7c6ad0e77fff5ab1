//! Sending on the ring: push into our own queue to the receiver (in our outbox), wake it only
//! if it said it sleeps and has not yet taken the entry our last wake-up was for.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use zerohop_pool::sync::{fence, Ordering};
use zerohop_pool::Descriptor;

use super::transport::RingShared;
use crate::{sys, PartyId, SendError, Sender};

/// Where the queue to one receiver is: our outbox queue index and its inbox head index.
#[derive(Clone, Copy)]
struct Lane {
    out: usize,
    in_: usize,
}

/// The ring sender of one party.
pub struct RingSender {
    shared: Arc<RingShared>,
    me: PartyId,
    /// Per receiver party: the lane, `None` when the policy does not allow the edge.
    lanes: Vec<Option<Lane>>,
    /// The queues are single-producer: threads of this party take turns per receiver.
    locks: Vec<Mutex<LaneState>>,
}

/// What a sender keeps per receiver, under its lock.
#[derive(Default)]
struct LaneState {
    /// Our tail just after our last wake-up of that receiver, if any.
    woke: Option<u32>,
    /// The receiver's head as last read ([`super::Spsc::push_cached`]).
    head: u32,
}

impl RingSender {
    pub(crate) fn new(shared: Arc<RingShared>, me: PartyId) -> Self {
        let parties = shared.policy.parties();
        let mut lanes = vec![None; parties as usize];
        let mut locks: Vec<Mutex<LaneState>> = (0..parties).map(|_| Mutex::default()).collect();
        for (out, to) in shared.policy.targets(me).into_iter().enumerate() {
            let in_ = shared
                .policy
                .sender_index(me, to)
                .expect("an edge is in both lists");
            lanes[to as usize] = Some(Lane { out, in_ });
            let head = shared.queue(me, out, to, in_).head_acquire();
            *locks[to as usize]
                .get_mut()
                .unwrap_or_else(|p| p.into_inner()) = LaneState { woke: None, head };
        }
        Self {
            shared,
            me,
            lanes,
            locks,
        }
    }

    fn lane(&self, to: PartyId) -> Result<Lane, SendError> {
        match self.lanes.get(to as usize) {
            None => Err(SendError::NoSuchParty(to)),
            Some(None) => Err(SendError::NotAllowed(to)),
            Some(Some(l)) => Ok(*l),
        }
    }

    fn push(
        &self,
        to: PartyId,
        lane: Lane,
        desc: Descriptor,
        wait: Duration,
    ) -> Result<(), SendError> {
        let q = self.shared.queue(self.me, lane.out, to, lane.in_);
        let mut state = self.locks[to as usize]
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let LaneState { woke, head } = &mut *state;
        {
            if !q.push_cached(desc, head) {
                if wait.is_zero() {
                    return Err(SendError::Full(to));
                }
                // Full: the receiver is behind. Back off (yielding the core it may need)
                // for a bounded time.
                let deadline = Instant::now() + wait;
                let mut pause = Duration::from_micros(1);
                loop {
                    self.wake(lane);
                    std::thread::sleep(pause);
                    if q.push_cached(desc, head) {
                        break;
                    }
                    if Instant::now() > deadline {
                        return Err(SendError::Full(to));
                    }
                    pause = (pause * 2).min(Duration::from_millis(1));
                }
            }
        }
        // SYNC POINT: this SeqCst fence pairs with the receiver's fence between setting
        // `sleeping` and re-reading the tails (see the module docs).
        fence(Ordering::SeqCst);
        if self.shared.sleeping(to).load(Ordering::Relaxed) != 0 {
            // A receiver we woke that has not run yet still says it sleeps: waking it again
            // for every entry of a burst would cost a system call each. While it has not
            // taken the entry of our last wake-up it cannot go back to sleep without
            // re-reading our tail (after its fence, which follows ours: it has not moved
            // its head, which we read after our fence), so it will see this entry too.
            if woke.is_some_and(|mark| q.behind(mark)) {
                return Ok(());
            }
            self.wake(lane);
            *woke = Some(self.shared.tail(self.me, lane.out).load(Ordering::Relaxed));
        }
        Ok(())
    }

    fn wake(&self, lane: Lane) {
        // The tail we published is the futex word the receiver waits on; a FUTEX_WAIT that
        // races with us sees the changed value and returns at once.
        sys::futex_wake(self.shared.tail(self.me, lane.out));
    }
}

impl Sender for RingSender {
    fn send(&self, to: PartyId, desc: Descriptor) -> Result<(), SendError> {
        let lane = self.lane(to)?;
        let wait = Duration::from_millis(self.shared.opts.send_timeout_ms as u64);
        self.push(to, lane, desc, wait)
    }

    fn try_send(&self, to: PartyId, desc: Descriptor) -> Result<(), SendError> {
        let lane = self.lane(to)?;
        self.push(to, lane, desc, Duration::ZERO)
    }

    fn backlog(&self, to: PartyId) -> u32 {
        let Ok(lane) = self.lane(to) else {
            return 0;
        };
        // Read without the lane's lock: a hint, stale by an entry at most.
        self.shared.queue(self.me, lane.out, to, lane.in_).backlog()
    }
}
