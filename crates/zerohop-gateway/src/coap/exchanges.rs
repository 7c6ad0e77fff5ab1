//! Message deduplication (RFC 7252 section 4.5): what the gateway did with each request
//! message it saw, by (peer, message id), so a retransmission is answered with the same
//! response and never runs the chain again.
//!
//! Bounded in time and size: an entry lives [`LIFETIME`] from its request's arrival (the
//! protocol's EXCHANGE_LIFETIME) and at most [`CAPACITY`] are kept; when full, the oldest
//! answered entry goes first. Entries whose chain is still running are never evicted (there
//! are at most as many as requests in flight, fewer than the capacity), so a request in
//! flight is never run twice.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;

/// EXCHANGE_LIFETIME of RFC 7252 section 4.8.2 with the default transmission parameters.
pub(super) const LIFETIME: Duration = Duration::from_secs(247);

/// Most exchanges remembered at once.
pub(super) const CAPACITY: usize = 4096;

/// A message is its sender and its message id.
pub(super) type Key = (SocketAddr, u16);

/// What became of a request message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Seen {
    /// Its chain is running; `acked` once an empty ACK went out for it (a CON whose answer
    /// then comes as a separate response).
    Running { acked: bool },
    /// The message sent in answer (a piggy-backed ACK, a NON response, or the empty ACK of
    /// a separate response), sent again for every duplicate.
    Answered(Bytes),
}

struct Entry {
    since: Instant,
    /// Its place in `order` (a key queued under another number was replaced since).
    seq: u64,
    seen: Seen,
}

/// The deduplication table.
pub(super) struct Exchanges {
    map: HashMap<Key, Entry>,
    /// Keys in arrival order, each with the number its entry had when queued; a key whose
    /// entry has another number was replaced and is skipped.
    order: VecDeque<(u64, Key)>,
    next_seq: u64,
    capacity: usize,
    lifetime: Duration,
}

impl Default for Exchanges {
    fn default() -> Self {
        Self::new(CAPACITY, LIFETIME)
    }
}

impl Exchanges {
    pub fn new(capacity: usize, lifetime: Duration) -> Self {
        Self {
            map: HashMap::new(),
            order: VecDeque::new(),
            next_seq: 0,
            capacity: capacity.max(1),
            lifetime: lifetime.max(Duration::from_millis(1)),
        }
    }

    pub fn get_mut(&mut self, key: &Key) -> Option<&mut Seen> {
        self.map.get_mut(key).map(|e| &mut e.seen)
    }

    /// Records a new message, evicting expired and, when full, the oldest answered entries.
    pub fn insert(&mut self, key: Key, seen: Seen, now: Instant) {
        self.expire(now);
        self.map.remove(&key);
        // Each pass either evicts or re-queues a running entry; bounded so that a table of
        // nothing but running entries (which the in-flight bound rules out) cannot spin.
        let mut passes = self.order.len();
        while self.map.len() >= self.capacity && passes > 0 {
            passes -= 1;
            let Some((seq, k)) = self.order.pop_front() else {
                break;
            };
            let running = match self.map.get(&k) {
                Some(e) if e.seq == seq => matches!(e.seen, Seen::Running { .. }),
                _ => continue,
            };
            if running {
                self.requeue(k, now);
            } else {
                self.map.remove(&k);
            }
        }
        if self.map.len() >= self.capacity {
            // Only running entries left: make room all the same, the bound holds.
            if let Some((_, k)) = self.order.pop_front() {
                self.map.remove(&k);
            }
        }
        let seq = self.push(key);
        self.map.insert(
            key,
            Entry {
                since: now,
                seq,
                seen,
            },
        );
    }

    fn push(&mut self, key: Key) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.order.push_back((seq, key));
        seq
    }

    /// Moves a running entry to the back of the queue with a fresh start.
    fn requeue(&mut self, key: Key, now: Instant) {
        let seq = self.push(key);
        if let Some(e) = self.map.get_mut(&key) {
            e.seq = seq;
            e.since = now;
        }
    }

    /// Sets what became of a message already recorded (or records it, if it was evicted).
    pub fn answer(&mut self, key: Key, bytes: Bytes, now: Instant) {
        match self.map.get_mut(&key) {
            Some(e) => e.seen = Seen::Answered(bytes),
            None => self.insert(key, Seen::Answered(bytes), now),
        }
    }

    /// Drops entries older than the lifetime; a running one is kept (re-queued) until its
    /// chain answers.
    pub fn expire(&mut self, now: Instant) {
        while let Some(&(seq, k)) = self.order.front() {
            let (since, running) = match self.map.get(&k) {
                Some(e) if e.seq == seq => (e.since, matches!(e.seen, Seen::Running { .. })),
                _ => {
                    self.order.pop_front();
                    continue;
                }
            };
            if now.saturating_duration_since(since) < self.lifetime {
                break;
            }
            self.order.pop_front();
            if running {
                self.requeue(k, now);
            } else {
                self.map.remove(&k);
            }
        }
        // Stale queue entries (replaced keys) are dropped as they reach the front; this keeps
        // them bounded when the front stays young.
        if self.order.len() > 2 * self.capacity {
            let map = &self.map;
            self.order
                .retain(|(seq, k)| map.get(k).is_some_and(|e| e.seq == *seq));
        }
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.map.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(port: u16, mid: u16) -> Key {
        (SocketAddr::from(([127, 0, 0, 1], port)), mid)
    }

    #[test]
    fn answered_entries_expire_and_running_ones_stay() {
        let t0 = Instant::now();
        let mut x = Exchanges::new(16, Duration::from_secs(10));
        x.insert(key(1, 1), Seen::Running { acked: false }, t0);
        x.insert(key(1, 2), Seen::Answered(Bytes::from_static(b"a")), t0);
        x.expire(t0 + Duration::from_secs(11));
        assert_eq!(x.get_mut(&key(1, 2)), None);
        assert_eq!(
            x.get_mut(&key(1, 1)),
            Some(&mut Seen::Running { acked: false })
        );
        x.answer(key(1, 1), Bytes::from_static(b"b"), t0);
        x.expire(t0 + Duration::from_secs(22));
        assert_eq!(x.len(), 0);
    }

    #[test]
    fn a_full_table_evicts_the_oldest_answered_never_a_running_one() {
        let t0 = Instant::now();
        let mut x = Exchanges::new(4, Duration::from_secs(100));
        x.insert(key(1, 0), Seen::Running { acked: false }, t0);
        for mid in 1..100 {
            x.insert(key(1, mid), Seen::Answered(Bytes::new()), t0);
            assert!(x.len() <= 4);
        }
        assert!(x.get_mut(&key(1, 0)).is_some(), "running entry kept");
        assert!(x.get_mut(&key(1, 99)).is_some());
        assert!(x.get_mut(&key(1, 1)).is_none());
        // Nothing but running entries: the bound still holds.
        let mut y = Exchanges::new(2, Duration::from_secs(100));
        for mid in 0..10 {
            y.insert(key(2, mid), Seen::Running { acked: false }, t0);
            assert!(y.len() <= 2);
        }
        // Replacing keys again and again keeps the queue bounded too.
        for _ in 0..100 {
            x.insert(key(1, 99), Seen::Answered(Bytes::new()), t0);
        }
        x.expire(t0);
        assert!(x.order.len() <= 2 * 4 + 1);
    }
}
