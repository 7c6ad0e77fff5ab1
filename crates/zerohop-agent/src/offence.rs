//! Hostile senders: an instance that keeps sending descriptors it alone made invalid is
//! killed with its process group and restarted, and the log names it (design rule 2).
//!
//! **Whose word counts.** Never an instance's: an instance is untrusted, and one that
//! reported another party's garbage could get any instance it receives from killed again
//! and again, which rule 3 forbids (a forged word costs only the forger's own instances).
//! The agent counts only what it saw a sender write itself:
//!
//! * Sent to the agent's own parties (the gateway's parties and the relays of a split
//!   chain): their endpoints ([`Endpoint::with_blame`](zerohop_transport::Endpoint::with_blame))
//!   blame a sender only for what it alone wrote (see [`zerohop_transport::blame`]: wrong
//!   function, slot out of range, length beyond a slot), and the sender is the queue or
//!   socket the descriptor came in on, which no other party can write.
//! * Sent to another instance, on the ring: while requests are in flight, every [`SCAN`]
//!   the agent reads what each instance published on its queues to other instances since
//!   the last look, in the instance's own outbox, which only it writes
//!   ([`Transport::published`](zerohop_transport::Transport::published)), and judges each
//!   descriptor by its 16 bytes and the plan
//!   ([`fault_of_sent`](zerohop_transport::blame::fault_of_sent)). At most a queue's
//!   capacity less one per queue and look; a new instance is read from its first own entry
//!   on. The socket backends keep no copy of what was sent: there a flood of another
//!   instance costs that instance its bounded receive loop (every receive call looks at a
//!   bounded number of descriptors and yields, queues round-robin), and is not punished.
//!
//! **How many.** A party is killed once the faults of its current instance reach
//! [`limit`]: at least [`MIN_LIMIT`], and more than every queue into the agent's parties can
//! hold. After a kill the dead instance's queues may still hold garbage (up to their
//! capacity) that the agent's parties drain, nearly always before the restart (the backoff
//! is 100 ms at least, the drain takes microseconds); the count starts over when the new
//! instance is spawned, and even garbage drained after that cannot reach the limit alone, so
//! a successor is never killed for its predecessor. A flood reaches the limit within
//! milliseconds; a party that sends an odd invalid descriptor by mistake is never killed
//! for it. Until the kill lands its descriptors are still taken one by one at bounded cost
//! ([`RECV_BUDGET`](zerohop_transport::RECV_BUDGET) per receive call), then its queue
//! stays empty: nobody writes it until the instance is restarted.
//!
//! The decision is [`condemned`], a pure function of the counts and the agent's own records
//! (process groups it started); the enforcer task (`enforcer.rs`) wakes when a count reaches the limit
//! and, while requests are in flight, every [`SCAN`] (no timer when the chain is idle), and
//! runs on the agent's supervision runtime, never in a receive path.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use zerohop_transport::{Blame, Fault, PartyId};

/// How often, while requests are in flight, the agent reads what the instances sent to
/// each other (ring only).
pub const SCAN: Duration = Duration::from_millis(100);

/// The fewest faults a party's instance is killed for.
pub const MIN_LIMIT: u64 = 1024;

/// Faults an instance is killed for: [`MIN_LIMIT`] or more than the queues into the agent's
/// `receivers` parties (of `queue_capacity` descriptors each) hold together, whichever is
/// more.
pub fn limit(queue_capacity: u32, receivers: usize) -> u64 {
    let queued = u64::from(queue_capacity).saturating_mul(receivers.max(1) as u64);
    MIN_LIMIT.max(queued.saturating_add(1))
}

/// Faults per party, as the agent's own endpoints report them (a [`Blame`] sink).
pub(crate) struct Offences {
    /// Per party: its current instance's faults, by [`Fault::index`].
    counts: Vec<[AtomicU64; 3]>,
    /// Per party: all its current instance's faults together.
    totals: Vec<AtomicU64>,
    /// Faults that get a party killed ([`limit`]).
    pub(crate) limit: u64,
    /// Told each time a total reaches a multiple of `limit` (the enforcer waits on it).
    pub(crate) reached: tokio::sync::Notify,
    /// Per party: the tails of its queues as the agent last read them (empty: not yet
    /// read since its current instance started).
    pub(crate) seen: Vec<Mutex<Vec<u32>>>,
}

impl Offences {
    /// For `parties` parties, killing at `limit` faults.
    pub fn new(parties: usize, limit: u64) -> Self {
        Self {
            counts: (0..parties).map(|_| Default::default()).collect(),
            totals: (0..parties).map(|_| AtomicU64::new(0)).collect(),
            limit: limit.max(1),
            reached: tokio::sync::Notify::new(),
            seen: (0..parties).map(|_| Mutex::default()).collect(),
        }
    }

    /// The current instance of `party` sent this many invalid descriptors.
    pub fn total(&self, party: PartyId) -> u64 {
        self.totals
            .get(usize::from(party))
            .map_or(0, |t| t.load(Ordering::Relaxed))
    }

    /// By fault, for the log line.
    pub(crate) fn by_fault(&self, party: PartyId) -> [u64; 3] {
        self.counts.get(usize::from(party)).map_or([0; 3], |c| {
            std::array::from_fn(|i| c[i].load(Ordering::Relaxed))
        })
    }

    /// A new instance of `party` starts with a clean slate.
    pub fn forgive(&self, party: PartyId) {
        if let (Some(c), Some(t)) = (
            self.counts.get(usize::from(party)),
            self.totals.get(usize::from(party)),
        ) {
            c.iter().for_each(|c| c.store(0, Ordering::Relaxed));
            t.store(0, Ordering::Relaxed);
        }
        if let Some(seen) = self.seen.get(usize::from(party)) {
            // What its predecessor published is never read.
            seen.lock().unwrap_or_else(|p| p.into_inner()).clear();
        }
    }
}

impl Blame for Offences {
    fn blame(&self, sender: PartyId, fault: Fault) {
        let (Some(c), Some(t)) = (
            self.counts.get(usize::from(sender)),
            self.totals.get(usize::from(sender)),
        ) else {
            return;
        };
        // Statistics and a trigger, nothing ordered after them: Relaxed.
        c[fault.index()].fetch_add(1, Ordering::Relaxed);
        let now = t.fetch_add(1, Ordering::Relaxed) + 1;
        // Once per `limit` faults, not once per fault: a flood costs one wake-up per limit.
        if now.is_multiple_of(self.limit) {
            self.reached.notify_one();
        }
    }
}

/// One party as the decision sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Seen {
    pub party: PartyId,
    /// Faults of its current instance.
    pub faults: u64,
    /// Process group of its instance (the agent's own record), 0 when it has none.
    pub pgid: u32,
    /// The process group the agent last killed for this party's faults, if any.
    pub killed: Option<u32>,
    /// The party runs inside the agent (a gateway thread or a relay): never killed.
    pub in_agent: bool,
}

/// The decision: the parties whose current instance is to be killed for sending invalid
/// descriptors. An instance is killed once, when its faults reach `limit`; a party with no
/// process, one the agent plays itself, and an instance already killed are left alone.
pub(crate) fn condemned(seen: &[Seen], limit: u64) -> Vec<PartyId> {
    seen.iter()
        .filter(|s| !s.in_agent && s.pgid != 0 && s.faults >= limit && s.killed != Some(s.pgid))
        .map(|s| s.party)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(party: PartyId, faults: u64, pgid: u32) -> Seen {
        Seen {
            party,
            faults,
            pgid,
            killed: None,
            in_agent: false,
        }
    }

    #[test]
    fn the_limit_exceeds_what_the_queues_into_the_agent_hold() {
        assert_eq!(limit(1024, 1), 1025);
        assert_eq!(limit(1024, 4), 4097);
        assert_eq!(limit(64, 2), MIN_LIMIT);
        assert_eq!(limit(1024, 0), 1025, "at least one receiver");
        assert_eq!(limit(u32::MAX, usize::MAX), u64::MAX);
    }

    #[test]
    fn an_instance_is_killed_once_when_its_faults_reach_the_limit() {
        let cases: [(&str, Seen, bool); 7] = [
            ("below the limit", seen(3, 99, 700), false),
            ("at the limit", seen(3, 100, 700), true),
            ("past the limit", seen(3, 5_000_000, 700), true),
            ("no process", seen(3, 500, 0), false),
            (
                "already killed",
                Seen {
                    killed: Some(700),
                    ..seen(3, 500, 700)
                },
                false,
            ),
            (
                "a new instance after a kill, hostile too",
                Seen {
                    killed: Some(700),
                    ..seen(3, 100, 701)
                },
                true,
            ),
            (
                "a gateway thread or relay (the agent itself)",
                Seen {
                    in_agent: true,
                    ..seen(0, 500, 1)
                },
                false,
            ),
        ];
        for (what, s, kill) in cases {
            let got = condemned(&[s], 100);
            assert_eq!(got, if kill { vec![3] } else { vec![] }, "{what}");
        }
    }

    #[test]
    fn only_the_offender_is_condemned() {
        let got = condemned(&[seen(2, 0, 600), seen(3, 100, 700), seen(4, 99, 800)], 100);
        assert_eq!(got, [3]);
    }

    #[test]
    fn counts_start_over_for_a_new_instance_and_wake_once_per_limit() {
        let o = Offences::new(4, 3);
        for _ in 0..2 {
            o.blame(2, Fault::OutOfRange);
        }
        o.blame(2, Fault::WrongFunction);
        o.blame(9, Fault::TooLong); // no such party: ignored
        assert_eq!(o.total(2), 3);
        assert_eq!(o.by_fault(2), [1, 2, 0]);
        assert_eq!(o.total(9), 0);
        // The third fault woke the enforcer (a permit is kept for the next wait).
        let woke = futures_now(o.reached.notified());
        assert!(woke, "woken at the limit");
        o.forgive(2);
        assert_eq!((o.total(2), o.by_fault(2)), (0, [0; 3]));
    }

    /// Whether `f` is ready at once.
    fn futures_now(f: impl std::future::Future<Output = ()>) -> bool {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime");
        rt.block_on(async {
            tokio::time::timeout(std::time::Duration::from_millis(50), f)
                .await
                .is_ok()
        })
    }
}
