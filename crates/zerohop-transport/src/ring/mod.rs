//! The `ring` backend: one single-producer single-consumer queue per allowed edge (sender,
//! receiver), in shared memory split so that each word has exactly one writer: a queue's
//! tail and entries live in its producer's *outbox*, its head in its consumer's *inbox*.
//! Each party maps its own outbox and inbox read-write and, read-only, the inboxes of the
//! parties it sends to and the outboxes of the parties that send to it.
//!
//! ```text
//!  outbox of party s (written by s only)          inbox of party r (written by r only)
//!  +----------------+                              +----------------+
//!  | header  64 B   | magic ZHOUTBOX, version 2,   | header  64 B   | magic ZHINBOX, version 2,
//!  |                | party, queues, capacity      |                | party, senders
//!  +----------------+                              +----------------+
//!  | tail  (64 B)   | queue to targets(s)[0]       | sleeping       | control line (64 B)
//!  | entries        | capacity x 16 B              +----------------+
//!  +----------------+                              | head (64 B)    | of the queue from
//!  | tail  (64 B)   | queue to targets(s)[1]       |                | senders(r)[0]
//!  | entries        |                              +----------------+
//!  +----------------+ ...                          | head (64 B)    | senders(r)[1] ...
//! ```
//!
//! `targets(s)` and `senders(r)` are the chain's allowed edges (its routes) in ascending
//! party order, so memory grows with the edges, not with the square of the instances.
//!
//! Wakeup rule (Dekker-style, both sides use SeqCst fences); the futex words are the queues'
//! tails, each written by its producer only, waited on together with `futex_waitv`:
//! * receiver: finds every queue empty, spins for `spin_us`, then sets `sleeping = 1`,
//!   fence, reads every tail again, and only if all queues are still empty calls
//!   `futex_waitv` on every tail with the value it read (plus its own stop word, in its
//!   private memory).
//! * sender: publishes the entry (`tail` Release), fence, reads `sleeping`; only if set it
//!   calls `FUTEX_WAKE` on the tail it just wrote.
//!
//! One of the two fences comes second, so either the receiver sees the new entry on its
//! re-check or the sender sees `sleeping` and wakes it; a tail that moved after the receiver
//! read it makes `futex_waitv` return at once.
//!
//! Each side keeps the other side's index as it last read it: the sender re-reads a queue's
//! head only when the queue looks full by its copy, the receiver re-reads a tail only when
//! the entries its copy promised are taken (and always, fresh, before it sleeps). A busy hop
//! then reads the other side's line once per burst, not once per entry. A copy is never
//! ahead of the real index (heads and tails only move on), so it never promises room or
//! entries that are not there; a hostile party that moves its own index back garbles only
//! its own queue, whose descriptors are validated anyway.
//!
//! Everything read from another party's memory is input: a tail more than `capacity` ahead
//! of the head makes the receiver skip that queue's entries, a head that is not behind the
//! tail makes the sender report the queue full; descriptors are validated by the
//! [`Endpoint`](crate::Endpoint). A sender that dies mid-send leaves at most an unpublished
//! entry in its own queue; a restarted party continues from the indices in the regions.

#[cfg(not(loom))]
mod recv;
#[cfg(not(loom))]
mod send;
#[cfg(not(loom))]
mod uring;

#[cfg(not(loom))]
pub use self::{recv::RingReceiver, send::RingSender, transport::RingTransport};

use zerohop_pool::sync::{AtomicU32, AtomicU64, Ordering};
use zerohop_pool::Descriptor;

/// One single-producer single-consumer queue, over atomics in shared memory (or on the heap
/// for loom).
pub struct Spsc<'a> {
    head: &'a AtomicU32,
    tail: &'a AtomicU32,
    entries: &'a [AtomicU64],
}

impl<'a> Spsc<'a> {
    /// A queue over `entries` (two words per slot; slot count a power of two).
    pub fn new(head: &'a AtomicU32, tail: &'a AtomicU32, entries: &'a [AtomicU64]) -> Self {
        debug_assert!((entries.len() / 2).is_power_of_two());
        Self {
            head,
            tail,
            entries,
        }
    }

    fn capacity(&self) -> u32 {
        (self.entries.len() / 2) as u32
    }

    /// Producer: appends `d`; false when full. Only one thread may push at a time.
    pub fn push(&self, d: Descriptor) -> bool {
        let mut head = self.head_acquire();
        self.push_cached(d, &mut head)
    }

    /// Producer: [`Spsc::push`] with the consumer's head as last read kept in `head` (start
    /// it from [`Spsc::head_acquire`]): the consumer's line is read again only when the
    /// queue looks full by it. A head read earlier is never ahead of the real one (heads
    /// only move on), so the room it shows is there.
    pub fn push_cached(&self, d: Descriptor, head: &mut u32) -> bool {
        let tail = self.tail.load(Ordering::Relaxed);
        if tail.wrapping_sub(*head) >= self.capacity() {
            // SYNC POINT: Acquire pairs with the Release store of `head` in `advance`: the
            // consumer has finished reading the entries we are about to overwrite (a cached
            // value came from such a load too).
            *head = self.head.load(Ordering::Acquire);
            if tail.wrapping_sub(*head) >= self.capacity() {
                return false;
            }
        }
        let i = (tail & (self.capacity() - 1)) as usize * 2;
        let [a, b] = d.to_words();
        self.entries[i].store(a, Ordering::Relaxed);
        self.entries[i + 1].store(b, Ordering::Relaxed);
        // SYNC POINT: Release pairs with the Acquire load of `tail` in `peek_cached`: the
        // entry words (and the slot bytes written before the send) are visible to the
        // consumer.
        self.tail.store(tail.wrapping_add(1), Ordering::Release);
        true
    }

    /// Producer: entries the consumer has not taken yet, at most the capacity (a head that is
    /// not behind the tail is the consumer's garbage and counts as a full queue). A hint for
    /// picking an instance: both loads Relaxed, it orders no memory.
    pub fn backlog(&self) -> u32 {
        let tail = self.tail.load(Ordering::Relaxed);
        tail.wrapping_sub(self.head.load(Ordering::Relaxed))
            .min(self.capacity())
    }

    /// Producer: the consumer's head now, as a start for [`Spsc::push_cached`].
    pub fn head_acquire(&self) -> u32 {
        // SYNC POINT: Acquire pairs with the Release store of `head` in `advance`.
        self.head.load(Ordering::Acquire)
    }

    /// Consumer: removes the oldest entry. Only one thread may pop at a time.
    pub fn pop(&self) -> Option<Descriptor> {
        let d = self.peek()?;
        self.advance();
        Some(d)
    }

    /// Consumer: removes the entry [`Spsc::peek`] returned.
    pub fn advance(&self) {
        let head = self.head.load(Ordering::Relaxed);
        // SYNC POINT: Release pairs with the Acquire loads of `head` in `push_cached`,
        // `head_acquire` and `behind`: we are done with the entry before the producer may
        // reuse it.
        self.head.store(head.wrapping_add(1), Ordering::Release);
    }

    /// Consumer: the oldest entry, left in the queue. Only one thread may consume.
    pub fn peek(&self) -> Option<Descriptor> {
        let mut tail = self.head.load(Ordering::Relaxed);
        self.peek_cached(&mut tail)
    }

    /// Consumer: [`Spsc::peek`] with the producer's tail as last read kept in `tail`: the
    /// producer's line is read again only when the entries known by it are used up, so a
    /// burst costs one read of it. Any start value works (one equal to the head reads it).
    pub fn peek_cached(&self, tail: &mut u32) -> Option<Descriptor> {
        let head = self.head.load(Ordering::Relaxed);
        let queued = tail.wrapping_sub(head);
        if queued == 0 || queued > self.capacity() {
            // SYNC POINT: Acquire pairs with the Release store of `tail` in `push_cached`
            // (entries below a cached value were published before the load that read it).
            *tail = self.tail.load(Ordering::Acquire);
            let queued = tail.wrapping_sub(head);
            if queued == 0 {
                return None;
            }
            if queued > self.capacity() {
                // Indices corrupted (a party scribbled on the region): drop what is there
                // rather than read garbage forever.
                // SYNC POINT: Release pairs with the producer's Acquire loads of `head` in
                // `push_cached` and `head_acquire`: nothing below `tail` is read any more.
                self.head.store(*tail, Ordering::Release);
                return None;
            }
        }
        let i = (head & (self.capacity() - 1)) as usize * 2;
        Some(Descriptor::from_words([
            self.entries[i].load(Ordering::Relaxed),
            self.entries[i + 1].load(Ordering::Relaxed),
        ]))
    }

    /// Consumer: the head index (the consumer's own word).
    pub fn head_value(&self) -> u32 {
        self.head.load(Ordering::Relaxed)
    }

    /// Producer: whether the consumer has not yet taken the entry before tail value `mark`
    /// (its head is behind `mark` by at most the capacity). A consumer in that state cannot
    /// go to sleep before it takes that entry, and it re-reads every tail before it sleeps.
    pub fn behind(&self, mark: u32) -> bool {
        // SYNC POINT: Acquire pairs with the Release store of `head` in `advance`.
        let lag = mark.wrapping_sub(self.head.load(Ordering::Acquire));
        lag != 0 && lag <= self.capacity()
    }

    /// Whether the queue looks empty now.
    pub fn is_empty(&self) -> bool {
        // SYNC POINT: Acquire pairs with the Release store of `tail` in `push_cached`.
        self.tail.load(Ordering::Acquire) == self.head.load(Ordering::Relaxed)
    }
}

#[cfg(not(loom))]
mod transport;

#[cfg(all(test, loom))]
mod loom_tests {
    use loom::sync::Arc;

    use super::*;

    struct Q {
        head: AtomicU32,
        tail: AtomicU32,
        entries: Vec<AtomicU64>,
    }

    impl Q {
        /// An empty queue of two entries (two words each).
        fn two_entries() -> Self {
            Q {
                head: AtomicU32::new(0),
                tail: AtomicU32::new(0),
                entries: (0..4).map(|_| AtomicU64::new(0)).collect(),
            }
        }
    }

    fn desc(n: u32) -> Descriptor {
        Descriptor {
            slot: n,
            len: n * 10,
            request: n,
            generation: n,
            next: 1,
        }
    }

    /// Producer pushes three descriptors through a two-entry queue while the consumer pops:
    /// every descriptor arrives once, whole and in order.
    #[test]
    fn spsc_delivers_in_order_without_tearing() {
        loom::model(|| {
            let q = Arc::new(Q::two_entries());
            let p = q.clone();
            let producer = loom::thread::spawn(move || {
                let s = Spsc::new(&p.head, &p.tail, &p.entries);
                for n in 1..=3 {
                    while !s.push(desc(n)) {
                        loom::thread::yield_now();
                    }
                }
            });
            let s = Spsc::new(&q.head, &q.tail, &q.entries);
            let mut got = Vec::new();
            while got.len() < 3 {
                match s.pop() {
                    Some(d) => got.push(d),
                    None => loom::thread::yield_now(),
                }
            }
            producer.join().unwrap();
            assert_eq!(got, vec![desc(1), desc(2), desc(3)]);
            assert!(s.is_empty());
        });
    }

    /// The same with the cached indices the ring's sender and receiver use.
    #[test]
    fn spsc_with_cached_indices_delivers_in_order_without_tearing() {
        loom::model(|| {
            let q = Arc::new(Q::two_entries());
            let p = q.clone();
            let producer = loom::thread::spawn(move || {
                let s = Spsc::new(&p.head, &p.tail, &p.entries);
                let mut head = s.head_acquire();
                for n in 1..=3 {
                    while !s.push_cached(desc(n), &mut head) {
                        loom::thread::yield_now();
                    }
                }
            });
            let s = Spsc::new(&q.head, &q.tail, &q.entries);
            let mut tail = 0;
            let mut got = Vec::new();
            while got.len() < 3 {
                match s.peek_cached(&mut tail) {
                    Some(d) => {
                        s.advance();
                        got.push(d);
                    }
                    None => loom::thread::yield_now(),
                }
            }
            producer.join().unwrap();
            assert_eq!(got, vec![desc(1), desc(2), desc(3)]);
            assert!(s.is_empty());
        });
    }

    /// The sleep/wake handshake: the receiver either sees the entry on its re-check or the
    /// sender sees `sleeping` and would wake it; never neither.
    #[test]
    fn no_lost_wakeup() {
        use loom::sync::atomic::fence;
        loom::model(|| {
            let q = Arc::new((
                Q::two_entries(),
                AtomicU32::new(0), // sleeping
            ));
            let p = q.clone();
            let sender = loom::thread::spawn(move || {
                let s = Spsc::new(&p.0.head, &p.0.tail, &p.0.entries);
                assert!(s.push(desc(1)));
                fence(Ordering::SeqCst);
                p.1.load(Ordering::SeqCst) == 1 // would wake
            });
            let s = Spsc::new(&q.0.head, &q.0.tail, &q.0.entries);
            q.1.store(1, Ordering::SeqCst);
            fence(Ordering::SeqCst);
            let saw_entry = !s.is_empty();
            let woke = sender.join().unwrap();
            assert!(saw_entry || woke, "lost wakeup");
        });
    }
}
