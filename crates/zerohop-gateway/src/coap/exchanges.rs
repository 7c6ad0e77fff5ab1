//! Message deduplication (RFC 7252 section 4.5): what the gateway did with each request
//! message it saw, so a retransmission is answered with the same response and never runs the
//! chain again.
//!
//! A message is its sender, its message id and a keyed digest of its bytes: a retransmission
//! is the same datagram again (RFC 7252 section 4.2), so only the very same bytes from the
//! same address count as a duplicate. A spoofer who sends other bytes under a victim's
//! address and message id makes an entry of its own: it cannot pre-fill or replace the
//! victim's answer (and one that sends the victim's exact bytes only asks for what the victim
//! asked, answered to the victim).
//!
//! Bounded in time and size: an entry lives [`LIFETIME`] from its request's arrival (the
//! protocol's EXCHANGE_LIFETIME), at most [`CAPACITY`] are kept and at most [`PER_SOURCE`]
//! per IP address; when either is full, the oldest answered entry (of that address, or of
//! all) goes first. Entries whose chain is still running are never evicted (there are at
//! most as many as requests in flight, fewer than the capacity), so a request in flight is
//! never run twice. The server keeps two tables, one for addresses that proved they receive
//! (`reachability`) and one for the others, so spoofed traffic from any number of made-up
//! addresses churns only the second.

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use bytes::Bytes;

/// EXCHANGE_LIFETIME of RFC 7252 section 4.8.2 with the default transmission parameters.
pub(super) const LIFETIME: Duration = Duration::from_secs(247);

/// Most exchanges remembered at once (per table).
pub(super) const CAPACITY: usize = 4096;

/// Most exchanges remembered for one IP address (per table): a client sending a request a
/// second has about 250 within the lifetime.
pub(super) const PER_SOURCE: usize = 512;

/// A message is its sender, its message id and the digest of its bytes.
pub(super) type Key = (SocketAddr, u16, u64);

/// What became of a request message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Seen {
    /// Its chain is running; `acked` once an empty ACK went out for it (a CON whose answer
    /// then comes as a separate response).
    Running { acked: bool },
    /// The message sent in answer (a piggy-backed ACK, a NON response, the empty ACK of a
    /// separate response, or the 4.01 Echo challenge; empty when nothing could be sent),
    /// sent again for every duplicate.
    Answered(Bytes),
}

struct Entry {
    since: Instant,
    /// Its place in `order` (a key queued under another number was replaced since).
    seq: u64,
    seen: Seen,
}

/// One address's entries, oldest first (with stale numbers skipped, as in `order`).
#[derive(Default)]
struct Source {
    count: usize,
    order: VecDeque<(u64, Key)>,
}

/// The deduplication table.
pub(super) struct Exchanges {
    map: HashMap<Key, Entry>,
    /// Keys in arrival order, each with the number its entry had when queued; a key whose
    /// entry has another number was replaced and is skipped.
    order: VecDeque<(u64, Key)>,
    sources: HashMap<IpAddr, Source>,
    next_seq: u64,
    capacity: usize,
    per_source: usize,
    lifetime: Duration,
}

impl Default for Exchanges {
    fn default() -> Self {
        Self::new(CAPACITY, PER_SOURCE, LIFETIME)
    }
}

impl Exchanges {
    pub fn new(capacity: usize, per_source: usize, lifetime: Duration) -> Self {
        Self {
            map: HashMap::new(),
            order: VecDeque::new(),
            sources: HashMap::new(),
            next_seq: 0,
            capacity: capacity.max(1),
            per_source: per_source.max(1),
            lifetime: lifetime.max(Duration::from_millis(1)),
        }
    }

    pub fn get_mut(&mut self, key: &Key) -> Option<&mut Seen> {
        self.map.get_mut(key).map(|e| &mut e.seen)
    }

    /// Whether `key` is recorded here.
    pub fn has(&self, key: &Key) -> bool {
        self.map.contains_key(key)
    }

    fn forget(&mut self, key: &Key) {
        if self.map.remove(key).is_none() {
            return;
        }
        let ip = key.0.ip();
        if let Some(src) = self.sources.get_mut(&ip) {
            src.count -= 1;
            if src.count == 0 {
                self.sources.remove(&ip);
            }
        }
    }

    /// Makes room in `queue` (the global order, or one address's) by evicting its oldest
    /// answered entry while `full` says so; running entries are re-queued. Bounded: each
    /// pass pops one queued key.
    fn make_room(&mut self, ip: Option<IpAddr>, now: Instant) {
        let full = |x: &Self| match ip {
            None => x.map.len() >= x.capacity,
            Some(ip) => x.sources.get(&ip).is_some_and(|s| s.count >= x.per_source),
        };
        let queue_len = |x: &Self| match ip {
            None => x.order.len(),
            Some(ip) => x.sources.get(&ip).map_or(0, |s| s.order.len()),
        };
        let mut passes = queue_len(self);
        while full(self) && passes > 0 {
            passes -= 1;
            let popped = match ip {
                None => self.order.pop_front(),
                Some(ip) => self.sources.get_mut(&ip).and_then(|s| s.order.pop_front()),
            };
            let Some((seq, k)) = popped else { break };
            let running = match self.map.get(&k) {
                Some(e) if e.seq == seq => matches!(e.seen, Seen::Running { .. }),
                _ => continue,
            };
            if running {
                self.requeue(k, now);
            } else {
                self.forget(&k);
            }
        }
        if full(self) {
            // Only running entries left: make room all the same, the bound holds.
            let oldest = match ip {
                None => self.order.front().map(|&(_, k)| k),
                Some(ip) => self
                    .sources
                    .get(&ip)
                    .and_then(|s| s.order.iter().find(|(_, k)| self.map.contains_key(k)))
                    .map(|&(_, k)| k),
            };
            if let Some(k) = oldest {
                self.forget(&k);
            }
        }
    }

    /// Records a new message, evicting expired and, when full, the oldest answered entries
    /// of its address or of all.
    pub fn insert(&mut self, key: Key, seen: Seen, now: Instant) {
        self.expire(now);
        self.forget(&key);
        self.make_room(Some(key.0.ip()), now);
        self.make_room(None, now);
        let seq = self.push(key);
        self.sources.entry(key.0.ip()).or_default().count += 1;
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
        let per_source = self.per_source;
        let map = &self.map;
        let src = self.sources.entry(key.0.ip()).or_default();
        src.order.push_back((seq, key));
        if src.order.len() > 2 * per_source + 1 {
            // Keys evicted through the global order stay queued here until they reach the
            // front; this keeps them bounded.
            src.order
                .retain(|(q, k)| *q == seq || map.get(k).is_some_and(|e| e.seq == *q));
        }
        seq
    }

    /// Moves a running entry to the back of the queues with a fresh start.
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
                self.forget(&k);
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

    /// Messages remembered.
    pub fn len(&self) -> usize {
        self.map.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(port: u16, mid: u16) -> Key {
        (SocketAddr::from(([127, 0, 0, 1], port)), mid, 0)
    }

    #[test]
    fn answered_entries_expire_and_running_ones_stay() {
        let t0 = Instant::now();
        let mut x = Exchanges::new(16, 16, Duration::from_secs(10));
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
        let mut x = Exchanges::new(4, 4, Duration::from_secs(100));
        x.insert(key(1, 0), Seen::Running { acked: false }, t0);
        for mid in 1..100 {
            x.insert(key(1, mid), Seen::Answered(Bytes::new()), t0);
            assert!(x.len() <= 4);
        }
        assert!(x.get_mut(&key(1, 0)).is_some(), "running entry kept");
        assert!(x.get_mut(&key(1, 99)).is_some());
        assert!(x.get_mut(&key(1, 1)).is_none());
        // Nothing but running entries: the bound still holds.
        let mut y = Exchanges::new(2, 2, Duration::from_secs(100));
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

    /// The review found the table poisonable by spoofing: entries were (address, message
    /// id), so a spoofer could pre-fill a victim's ids with its own answers, and fill the
    /// table to evict the victim's. Now a message is also its bytes, and each address has a
    /// quota of its own.
    #[test]
    fn a_spoofer_can_neither_take_a_victims_entry_nor_evict_it() {
        let t0 = Instant::now();
        let victim = SocketAddr::from(([192, 0, 2, 1], 5683));
        let mut x = Exchanges::new(64, 8, Duration::from_secs(100));
        // The spoofer sends other bytes under the victim's address and every message id.
        for mid in 0..1000u16 {
            x.insert(
                (victim, mid, 666),
                Seen::Answered(Bytes::from_static(b"spoof")),
                t0,
            );
        }
        // The victim's own message with one of those ids is new, not a duplicate...
        let real = (victim, 7, 42);
        assert_eq!(x.get_mut(&real), None);
        x.insert(real, Seen::Answered(Bytes::from_static(b"mine")), t0);
        // ...and is answered as its own when it comes again.
        assert_eq!(
            x.get_mut(&real),
            Some(&mut Seen::Answered(Bytes::from_static(b"mine")))
        );
        // The spoofer's entries stay within the victim address's quota, so the victim's
        // own later messages only evict its own (and the spoofer's under its name).
        assert!(x.len() <= 8);
        // Another address is untouched by any of it: it keeps its entries while a flood
        // from one address comes and goes.
        let other = SocketAddr::from(([198, 51, 100, 2], 40000));
        for mid in 0..8 {
            x.insert((other, mid, 1), Seen::Answered(Bytes::new()), t0);
        }
        for mid in 0..10_000u16 {
            x.insert((victim, mid, 667), Seen::Answered(Bytes::new()), t0);
        }
        for mid in 0..8 {
            assert!(
                x.has(&(other, mid, 1)),
                "entry {mid} of another address evicted"
            );
        }
        assert!(x.len() <= 16);
        // The per-address queue stays bounded by the compaction too.
        assert!(x.sources[&victim.ip()].order.len() <= 2 * 8 + 1);
    }

    #[test]
    fn an_address_at_its_quota_keeps_its_running_entries() {
        let t0 = Instant::now();
        let mut x = Exchanges::new(100, 3, Duration::from_secs(100));
        x.insert(key(1, 0), Seen::Running { acked: false }, t0);
        for mid in 1..50 {
            x.insert(key(1, mid), Seen::Answered(Bytes::new()), t0);
            assert!(x.len() <= 3);
        }
        assert!(x.has(&key(1, 0)));
        assert!(x.has(&key(1, 49)));
    }
}
