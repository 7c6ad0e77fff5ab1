//! The scaler: per function, how many instances serve, how many wait parked, and which
//! parties have no process.
//!
//! Demand is read from shared memory as input: the requests in each serving instance's
//! handlers (`busy` in its party record) plus the descriptors queued for every party of the
//! function ([`Transport::queued`](zerohop_transport::Transport::queued)). The function
//! wants `ceil(demand / target)` instances, within `min` and `max`:
//!
//! - **Out at once.** More wanted than serving: parked instances are activated first (one
//!   compare-and-swap and a futex wake, no `fork` or `exec`), then parties with no process
//!   are started cold. A party with something queued and no serving instance is always
//!   activated: that is how a request sent to a function scaled to zero, by the gateway or
//!   by another function, gets an instance.
//! - **In after `cooldown`.** Fewer wanted than serving for a whole `cooldown`: down to the
//!   most wanted during that time, the highest parties first. An instance is drained
//!   before it stops (senders avoid it; what they sent meanwhile is served or waits for the
//!   next activation). A party with something queued is not stopped, and no lower one
//!   stops in its place: the scale-in waits until its queue is drained, so that what a
//!   sender queued cannot choose which instance of another function stops.
//! - **To zero after `zero_after`.** A `min: 0` function with no demand for `zero_after`
//!   stops its last serving instance.
//! - **Parked.** Besides the serving ones, `parked` instances (at most `max` minus the
//!   serving ones) are kept started and waiting, so the next activation is near-instant.
//!
//! While requests are in flight the scaler looks every [`TICK`], or less often where a look
//! is dear (a thousand instances: a look reads every queue), so that looking takes at most
//! a fiftieth of a core ([`busy_pause`]); a gateway that sends to a function with no ready
//! instance wakes it at once. Idle, it has no timer but the next `cooldown` or `zero_after`
//! deadline, so an idle chain costs no CPU. It runs on a thread of its own, never beside a
//! gateway.
//!
//! **What a forger can make it do** (issue 30, finding 12; design rule 3: a forged word
//! costs at most the forger's own instances). Everything it reads is a word some party can
//! write, so each is bounded by something the agent knows itself:
//!
//! - *Busy handlers* come from each instance's progress records ([`zerohop_pool::Progress`]),
//!   which only that instance and the agent map: an instance can lie only about itself, and
//!   never about more than its handler threads. (The `busy` counter in the pool's party
//!   table is not read: every party of the domain can write every party's record there.)
//! - *Queue depth* is a sender's tail against the receiver's head, and a sender can move its
//!   tail (ring) or fill its socket at will, up to a queue's capacity per receiver: with
//!   garbage, or with replays of stale descriptors that no receiver can prove to be its
//!   fault. Whether a sender "really" has that much in flight cannot be checked exactly (a
//!   handler may issue any number of calls at once), but every valid descriptor belongs to
//!   a request in flight, which the gateway counts itself. So a function's queues count for
//!   no more than the chain's requests in flight ([`credit`]; at least one, so that what a
//!   request that timed out left queued is still drained). A forger can then make another
//!   function scale for at most as many requests as are really in flight, never to its
//!   `max` on its own, and it cannot make it activate more stranded parties than that. The
//!   garbage itself is dropped at bounded cost when consumed; sent to the gateway, it gets
//!   its sender killed ([`crate::offence`]). The rest of the check is `max`.
//! - *Wake-ups*: a sender bumps its pool's wake word when it sent to a party with no ready
//!   instance; a function can bump it in a loop. The waker threads pass at most one wake-up
//!   per [`TICK`] on, and a wake-up from them makes the scaler look no sooner than a
//!   [`TICK`] after its last look ([`look_at`]): however fast the word moves, the scaler
//!   looks at most once per tick. The gateway's own wake-ups (the agent's, one per request
//!   sent to a function with no ready instance) are not delayed.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use zerohop_gateway::Gateways;
use zerohop_pool::{PartyState, Pools};
use zerohop_transport::{PartyId, Transport};

use crate::parties::{Parties, Want};
use crate::shared::Scaling;
use crate::spec::ScaleSpec;

/// How often the scaler looks while requests are in flight.
pub const TICK: Duration = Duration::from_millis(10);
/// How soon the scaler looks again at a scale-in held up by a party with something queued.
const HELD_LOOK: Duration = Duration::from_millis(100);

/// What the scaler remembers of one function.
#[derive(Clone, Debug)]
struct Memory {
    /// Since when fewer instances were wanted than serve, and the most wanted since.
    low: Option<(Instant, u16)>,
    /// Last time the function had any demand (`None`: not since the chain started).
    last_demand: Option<Instant>,
}

/// One party as the scaler sees it.
#[derive(Clone, Copy, Debug)]
struct Seen {
    party: PartyId,
    want: Want,
    state: PartyState,
    queued: usize,
}

/// Runs until `stop` turns true (bounds from `scaling`, demand from the others).
pub(crate) async fn run(
    scaling: &Scaling,
    parties: &Parties,
    gateways: &Gateways,
    transport: &dyn Transport,
    mut stop: watch::Receiver<bool>,
) {
    let started = Instant::now();
    let mut memory: Vec<Memory> = scaling
        .bounds()
        .iter()
        .map(|s| Memory {
            low: None,
            // A function that comes up serving keeps an instance for `zero_after` at least.
            last_demand: (s.initial > 0).then_some(started),
        })
        .collect();
    loop {
        let now = Instant::now();
        let deadline = tick(scaling, parties, gateways, transport, &mut memory, now);
        let busy = gateways.inflight() > 0;
        let wait = if busy {
            Some(busy_pause(now.elapsed()))
        } else {
            deadline.map(|d| d.saturating_duration_since(now).max(TICK))
        };
        let why = tokio::select! {
            _ = async {
                match wait {
                    Some(w) => tokio::time::sleep(w).await,
                    None => std::future::pending().await,
                }
            } => Wake::Timer,
            _ = gateways.busy(), if !busy => Wake::Gateway,
            _ = gateways.wants_instance() => Wake::Gateway,
            _ = scaling.rescaled() => Wake::Instance,
            r = stop.changed() => if r.is_err() || *stop.borrow() { return } else { Wake::Timer },
        };
        let at = look_at(Some(now), Instant::now(), why);
        let pause = at.saturating_duration_since(Instant::now());
        if !pause.is_zero() {
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                r = stop.changed() => if r.is_err() || *stop.borrow() { return },
            }
        }
    }
}

/// What woke the scaler.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Wake {
    /// Its own timer (a tick while busy, a cooldown or `zero_after` deadline).
    Timer,
    /// The gateway (the agent's own): a request entered an idle chain, or went to a function
    /// with no ready instance.
    Gateway,
    /// A waker thread (a pool's wake word, which any party of the domain can bump) or
    /// `zerohop scale`.
    Instance,
}

/// The decision: when to look after a wake-up for `why` at `now`, the last look having been
/// at `last`. A wake-up any instance can cause comes no sooner than a [`TICK`] after the
/// last look, so a wake word bumped in a loop costs at most one look per tick; the others
/// are looked at at once.
fn look_at(last: Option<Instant>, now: Instant, why: Wake) -> Instant {
    match (why, last) {
        (Wake::Instance, Some(last)) => now.max(last + TICK),
        _ => now,
    }
}

/// The decision: how much of each party's queue the scaler believes, given `queued` (per
/// party of one function: whether it serves, and the descriptors queued for it) and the
/// chain's requests in flight. Together the credit is at most `max(inflight, 1)`: every
/// valid descriptor belongs to a request in flight, and a forged depth must not count for
/// more. Parties that do not serve are credited first (in party order), so what a request
/// left queued for a party with no instance still gets it activated however the serving
/// parties' queues are inflated.
fn credit(queued: &[(bool, usize)], inflight: usize) -> Vec<usize> {
    let mut left = inflight.max(1);
    let mut out = vec![0; queued.len()];
    for serving in [false, true] {
        for (i, &(s, q)) in queued.iter().enumerate() {
            if s == serving {
                out[i] = q.min(left);
                left -= out[i];
            }
        }
    }
    out
}

/// Looks while requests are in flight take at most this share of a core (one part in this
/// many): a look reads every party's queues, which with a thousand instances takes
/// milliseconds, and looking every [`TICK`] regardless would cost a good part of a core.
const LOOK_SHARE: u32 = 50;

/// How long the scaler waits between looks while requests are in flight, after a look that
/// took `spent`: [`TICK`], or longer where looks are dear ([`LOOK_SHARE`]).
fn busy_pause(spent: Duration) -> Duration {
    TICK.max(spent.saturating_mul(LOOK_SHARE))
}

/// One look at every function; returns when the scaler must look again even if nothing
/// happens (a cooldown or zero_after running out). Gathers what [`decide`] needs, then
/// carries out what it decided.
fn tick(
    scaling: &Scaling,
    parties: &Parties,
    gateways: &Gateways,
    transport: &dyn Transport,
    memory: &mut [Memory],
    now: Instant,
) -> Option<Instant> {
    let plan = gateways.plan();
    let bounds: Vec<ScaleSpec> = scaling.bounds();
    let mut next: Option<Instant> = None;
    let inflight = gateways.inflight();
    for (f, (b, mem)) in bounds.iter().zip(memory.iter_mut()).enumerate() {
        if scaling.rolling(f) {
            // A live update swaps its instances one for one; the scaler waits for it.
            mem.low = None;
            continue;
        }
        let function_parties = plan.parties_of(f as u8);
        let threads = plan
            .functions
            .get(f)
            .map_or(1, zerohop_transport::FunctionPlan::handler_threads);
        let mut seen = Vec::with_capacity(function_parties.len());
        let mut busy = 0usize;
        for p in function_parties {
            let Some(c) = parties.get(p) else {
                continue;
            };
            let want = c.wanted();
            let state = parties.state(p);
            let serving =
                c.pgid() != 0 && matches!(state, PartyState::Ready | PartyState::Draining);
            if serving {
                // What the instance says about itself alone (see the module docs).
                busy += busy_threads(parties, p, threads);
            }
            seen.push(Seen {
                party: p,
                want,
                state,
                queued: transport.queued(p),
            });
        }
        // Queue depth is anybody's word: believed up to the requests in flight.
        let believed = credit(
            &seen
                .iter()
                .map(|s| (s.want == Want::Run, s.queued))
                .collect::<Vec<_>>(),
            inflight,
        );
        for (s, q) in seen.iter_mut().zip(believed) {
            s.queued = q;
        }
        let d = decide(b, mem, &seen, busy, now);
        for &p in &d.activate {
            activate(parties, p);
        }
        for &(p, want) in &d.wants {
            parties.set_want(p, want);
        }
        next = match (next, d.next) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }
    next
}

/// What one look decided for one function, carried out in this order.
#[derive(Debug, Default, PartialEq, Eq)]
struct Decision {
    /// Parties to serve ([`activate`]), in order.
    activate: Vec<PartyId>,
    /// Parties whose want changes otherwise (to stop, to park, from parked to stop).
    wants: Vec<(PartyId, Want)>,
    /// When to look again even if nothing happens.
    next: Option<Instant>,
}

/// The decision for one function at `now`: `seen` is each of its parties (queue depth
/// already believed, see [`credit`]), `busy` the handler threads in a request on its serving
/// instances, `b` its bounds, `mem` what the scaler remembers of it (updated here). The rules
/// are the module's: out at once, in after `cooldown`, to zero after `zero_after`, parked
/// instances kept within `max`.
fn decide(b: &ScaleSpec, mem: &mut Memory, seen: &[Seen], busy: usize, now: Instant) -> Decision {
    let mut d = Decision::default();
    let mut at = |t: Instant| d.next = Some(d.next.map_or(t, |n: Instant| n.min(t)));
    // Each party's want as this decision leaves it.
    let mut want: Vec<Want> = seen.iter().map(|s| s.want).collect();
    let demand = busy + seen.iter().map(|s| s.queued).sum::<usize>();
    if demand > 0 {
        mem.last_demand = Some(now);
    }
    let target = usize::from(b.target.max(1));
    let needed = demand.div_ceil(target).min(usize::from(u16::MAX)) as u16;
    let floor = if b.min > 0 {
        b.min
    } else {
        match mem.last_demand {
            Some(t) if now.duration_since(t) < b.zero_after => {
                at(t + b.zero_after);
                1
            }
            _ => 0,
        }
    };
    let max = b.max.min(seen.len() as u16);
    let wanted = needed.max(floor).min(max);
    let serving = seen.iter().filter(|s| s.want == Want::Run).count() as u16;
    // Parties with something queued and nobody to take it: activated whatever the count.
    let stranded: Vec<PartyId> = seen
        .iter()
        .filter(|s| s.queued > 0 && s.want != Want::Run)
        .map(|s| s.party)
        .collect();
    let mut count = serving;
    if wanted > serving || !stranded.is_empty() {
        mem.low = None;
        let mut add = wanted.saturating_sub(serving).max(stranded.len() as u16);
        for i in order_to_activate(seen, &stranded) {
            if add == 0 {
                break;
            }
            want[i] = Want::Run;
            d.activate.push(seen[i].party);
            add -= 1;
            count += 1;
        }
    } else if wanted < serving {
        let (since, most) = mem.low.get_or_insert((now, wanted));
        *most = (*most).max(wanted);
        let (since, most) = (*since, *most);
        // To zero once `zero_after` said so, at once for a fixed count (`min == max`,
        // changed by `zerohop scale` or an update) or above a lowered `max`; otherwise
        // after a whole cooldown.
        if wanted == 0 || !b.scales() || serving > b.max || now.duration_since(since) >= b.cooldown
        {
            let mut extra = serving - most.max(wanted);
            // The highest serving parties go first, in order. One with something queued
            // stays until its queue is drained, and no lower party stops in its place:
            // what a sender queued (garbage included, see the module docs) must not choose
            // which instance of another function stops.
            let mut held = false;
            for (i, s) in seen.iter().enumerate().rev() {
                if extra == 0 {
                    break;
                }
                if s.want != Want::Run {
                    continue;
                }
                if s.queued > 0 {
                    held = true;
                    break;
                }
                want[i] = Want::Stop;
                d.wants.push((s.party, Want::Stop));
                extra -= 1;
                count -= 1;
            }
            if held {
                // The same scale-in, as soon as that queue is drained.
                at(now + HELD_LOOK);
            } else if count > wanted {
                // Still more than wanted now (the last requests of a load kept the most
                // wanted up): another cooldown from here, with its own deadline, so an
                // idle chain gets there too.
                mem.low = Some((now, wanted));
                at(now + b.cooldown);
            } else {
                mem.low = None;
            }
        } else {
            at(since + b.cooldown);
        }
    } else {
        mem.low = None;
    }
    // Parked instances: as many as asked, within what `max` leaves.
    let parked_wanted = b.parked.min(max.saturating_sub(count));
    let parked: Vec<usize> = (0..seen.len()).filter(|&i| want[i] == Want::Park).collect();
    let parked_count = parked.len() as u16;
    let change = if parked_count < parked_wanted {
        let free: Vec<usize> = (0..seen.len())
            .filter(|&i| want[i] == Want::Stop && seen[i].queued == 0)
            .take(usize::from(parked_wanted - parked_count))
            .collect();
        (free, Want::Park)
    } else {
        let extra = usize::from(parked_count.saturating_sub(parked_wanted));
        (parked.into_iter().rev().take(extra).collect(), Want::Stop)
    };
    for i in change.0 {
        d.wants.push((seen[i].party, change.1));
    }
    d
}

/// Handler threads of `party`'s instance in a request now, by its progress records (which
/// only it and the agent map); for a party without them (a relay, played by the agent), the
/// pool's counter, at most `threads`.
fn busy_threads(parties: &Parties, party: PartyId, threads: usize) -> usize {
    match parties.get(party).and_then(|c| c.progress()) {
        Some((_, records)) => (0..records.threads())
            .filter(|&t| records.seq(t) % 2 == 1)
            .count(),
        None => parties
            .records(party)
            .next()
            .map_or(0, |r| (r.busy() as usize).min(threads)),
    }
}

/// Which parties to activate first, as indices into `seen`: those with something stranded
/// in their queue, then parked ones (attached, then still starting to park), then those
/// without a process, lowest first. Parties already serving are not listed.
fn order_to_activate(seen: &[Seen], stranded: &[PartyId]) -> Vec<usize> {
    let rank = |s: &Seen| {
        if stranded.contains(&s.party) {
            0
        } else {
            match s.state {
                PartyState::Parked => 1,
                PartyState::Parking => 2,
                _ => 3,
            }
        }
    };
    let mut list: Vec<usize> = (0..seen.len())
        .filter(|&i| seen[i].want != Want::Run)
        .collect();
    list.sort_by_key(|&i| (rank(&seen[i]), seen[i].party));
    list
}

/// Wants `party` serving; a parked instance is activated right here (no hop through its
/// supervisor), one without a process is started cold by its supervisor.
pub(crate) fn activate(parties: &Parties, party: PartyId) {
    let parked = matches!(
        parties.state(party),
        PartyState::Parked | PartyState::Parking
    );
    if let Some(c) = parties.get(party) {
        c.decided(!parked);
    }
    let woke = parked && parties.activate(party);
    parties.set_want(party, Want::Run);
    if woke {
        // The woken instance usually lands on this CPU, and under SCHED_BATCH it would wait
        // until this thread blocks: give it the CPU now.
        std::thread::yield_now();
    }
}

/// Threads (one per pool of the chain) that sleep on the pool's wake word until a function
/// instance sends to a party with no ready instance, and then wake the scaler at once (the
/// gateway wakes it directly). Blocked in the kernel, they cost nothing while idle.
pub(crate) struct Wakers {
    stop: Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
    pools: Pools,
}

impl Wakers {
    pub fn start(pools: &Pools, scaling: &Arc<Scaling>) -> std::io::Result<Self> {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut threads = Vec::new();
        for (i, pool) in pools.iter().enumerate() {
            let (pool, stop, scaling) = (pool.clone(), stop.clone(), scaling.clone());
            threads.push(
                std::thread::Builder::new()
                    .name(format!("waker-{i}"))
                    .spawn(move || {
                        let mut seen = pool.wait_wanted(u32::MAX, Duration::ZERO);
                        // SYNC POINT: Acquire pairs with the Release store in `signal`.
                        while !stop.load(Ordering::Acquire) {
                            let now = pool.wait_wanted(seen, Duration::from_secs(3600));
                            if now != seen {
                                seen = now;
                                scaling.rescale();
                                // Any party can bump the word in a loop: what moves it
                                // during the next tick is one more wake-up, not thousands.
                                std::thread::sleep(TICK);
                            }
                        }
                    })?,
            );
        }
        Ok(Self {
            stop,
            threads,
            pools: pools.clone(),
        })
    }

    fn signal(&self) {
        // SYNC POINT: Release pairs with the Acquire load in the threads' loop.
        self.stop.store(true, Ordering::Release);
        for pool in self.pools.iter() {
            pool.want_instance();
        }
    }

    /// Stops and joins the threads.
    pub async fn stop(mut self) {
        self.signal();
        let threads = std::mem::take(&mut self.threads);
        let _ = tokio::task::spawn_blocking(move || {
            for t in threads {
                let _ = t.join();
            }
        })
        .await;
    }
}

impl Drop for Wakers {
    /// A chain dropped without `shutdown` still ends its threads (not joined).
    fn drop(&mut self) {
        if !self.threads.is_empty() {
            self.signal();
        }
    }
}

#[cfg(test)]
mod tests;
