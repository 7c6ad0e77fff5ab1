//! Sending on the ring: push into our own queue of the receiver's inbox, wake it only if it
//! said it sleeps.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use zerohop_pool::sync::{fence, Ordering};
use zerohop_pool::Descriptor;

use super::transport::RingShared;
use crate::{sys, PartyId, SendError, Sender};

/// The ring sender of one party.
pub struct RingSender {
    shared: Arc<RingShared>,
    me: PartyId,
    /// The queues are single-producer: threads of this party take turns per receiver.
    locks: Vec<Mutex<()>>,
}

impl RingSender {
    pub(crate) fn new(shared: Arc<RingShared>, me: PartyId) -> Self {
        let locks = (0..shared.parties).map(|_| Mutex::new(())).collect();
        Self { shared, me, locks }
    }
}

impl Sender for RingSender {
    fn send(&self, to: PartyId, desc: Descriptor) -> Result<(), SendError> {
        let lock = self
            .locks
            .get(to as usize)
            .ok_or(SendError::NoSuchParty(to))?;
        let q = self.shared.queue(to, self.me);
        {
            let _turn = lock.lock().unwrap_or_else(|p| p.into_inner());
            if !q.push(desc) {
                // Full: the receiver is behind. Back off (yielding the core it may need)
                // for a bounded time.
                let deadline =
                    Instant::now() + Duration::from_millis(self.shared.opts.send_timeout_ms as u64);
                let mut pause = Duration::from_micros(1);
                loop {
                    self.wake(to);
                    std::thread::sleep(pause);
                    if q.push(desc) {
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
        // `sleeping` and re-checking its queues (see the module docs).
        fence(Ordering::SeqCst);
        if self.shared.sleeping(to).load(Ordering::Relaxed) != 0 {
            self.wake(to);
        }
        Ok(())
    }
}

impl RingSender {
    fn wake(&self, to: PartyId) {
        let seq = self.shared.seq(to);
        // SYNC POINT: Release pairs with the receiver's Acquire load of `seq` before it
        // waits; the changed value makes a FUTEX_WAIT that races with us return at once.
        seq.fetch_add(1, Ordering::Release);
        sys::futex_wake(seq);
    }
}
