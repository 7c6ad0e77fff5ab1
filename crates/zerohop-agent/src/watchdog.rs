//! Hung instances: an instance that holds a slot far past the chain's timeout is killed
//! (with its process group and cgroup), which makes its supervisor reclaim its slots,
//! answer its requests and restart it, as after a crash.
//!
//! Detected from what each instance says about itself alone: every handler thread keeps a
//! record in a region that only its instance and the agent map
//! ([`zerohop_pool::progress`]), odd while it works on a request. While the gateway has
//! requests in flight, every [`SAMPLE`] the watchdog reads the records of the instances it
//! started and remembers since when each odd record has been unchanged. A thread in one
//! request for longer than [`limit`] (the chain's timeout plus a grace of
//! max(1 s, timeout / 2)) is hung: the gateway answered that request 504 long before.
//!
//! Nothing another party can write counts: owner words in the pool can be forged by any
//! party of the domain, so they are not read at all, and an instance's records can lie only
//! about that instance (which then only keeps its own requests waiting until the gateway's
//! timeout). The party number and process group come from the agent's own records.
//!
//! Idle (nothing in flight, nothing tracked), the watchdog has no timer: it waits for the
//! gateways' [`busy`](zerohop_gateway::Gateways::busy) signal, so an idle chain costs no CPU.
//! A hang is detected within limit + SAMPLE.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use tokio::sync::watch;
use zerohop_transport::{PartyId, Plan};

use zerohop_gateway::Gateways;

use crate::parties::Parties;

/// Sampling period while requests are in flight.
pub const SAMPLE: Duration = Duration::from_millis(300);

/// How long an instance may hold one slot: the chain's timeout plus max(1 s, timeout / 2).
pub fn limit(timeout: Duration) -> Duration {
    timeout + (timeout / 2).max(Duration::from_secs(1))
}

/// One handler thread of one instance: (party, the instance's process group, thread).
type Thread = (PartyId, u32, usize);

/// Runs until `stop` turns true: watches the instances of `parties`, sampling while the
/// `gateways` have requests in flight.
pub(crate) async fn watch(
    parties: &Parties,
    gateways: &Gateways,
    timeout: Duration,
    mut stop: watch::Receiver<bool>,
) {
    let limit = limit(timeout);
    // busy thread -> (its record, first seen with it)
    let mut seen: HashMap<Thread, (u64, Instant)> = HashMap::new();
    loop {
        if gateways.inflight() == 0 && seen.is_empty() {
            // Idle: no timer at all until a request enters the chain.
            tokio::select! {
                _ = gateways.busy() => {}
                r = stop.changed() => if r.is_err() || *stop.borrow() { return },
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(SAMPLE) => {}
            r = stop.changed() => if r.is_err() || *stop.borrow() { return },
        }
        let busy = busy_threads(parties, gateways.plan());
        for (thread, held) in stuck(&mut seen, &busy, Instant::now(), limit) {
            kill(parties, gateways.plan(), thread, held, timeout, limit);
        }
    }
}

/// The handler threads of the chain's instances that are in a request now, with their
/// records.
fn busy_threads(parties: &Parties, plan: &Plan) -> Vec<(Thread, u64)> {
    let gateways = usize::from(plan.gateways());
    let mut busy = Vec::new();
    for (party, control) in parties.iter().skip(gateways) {
        let Some((pgid, records)) = control.progress() else {
            continue;
        };
        for t in 0..records.threads() {
            let seq = records.seq(t);
            if seq % 2 == 1 {
                busy.push(((party, pgid, t), seq));
            }
        }
    }
    busy
}

/// The decision: given the busy threads of this sample, remembers since when each has been
/// in the same request (`seen`) and returns, one per instance, those in it for longer than
/// `limit`, with how long. A thread that moved on, went idle or whose instance is gone is
/// forgotten.
fn stuck(
    seen: &mut HashMap<Thread, (u64, Instant)>,
    busy: &[(Thread, u64)],
    now: Instant,
    limit: Duration,
) -> Vec<(Thread, Duration)> {
    seen.retain(|t, (seq, _)| busy.iter().any(|(b, s)| b == t && s == seq));
    let mut out: Vec<(Thread, Duration)> = Vec::new();
    for &(thread, seq) in busy {
        let since = seen.entry(thread).or_insert((seq, now)).1;
        let held = now.saturating_duration_since(since);
        let instance = (thread.0, thread.1);
        if held > limit && !out.iter().any(|((p, g, _), _)| (*p, *g) == instance) {
            out.push((thread, held));
        }
    }
    // Its other threads start over with the instance that replaces it.
    seen.retain(|(p, g, _), _| !out.iter().any(|((q, h, _), _)| (p, g) == (q, h)));
    out
}

/// Kills the instance of a stuck `thread` (with its process group), if it still runs.
fn kill(
    parties: &Parties,
    plan: &Plan,
    thread: Thread,
    held: Duration,
    timeout: Duration,
    limit: Duration,
) {
    let (party, pgid, t) = thread;
    let Some(control) = parties.get(party) else {
        return;
    };
    if pgid == 0 || control.pgid() != pgid {
        return; // already gone or replaced
    }
    // A fused group's instance is named by its group (`upper+exclaim`): any step may hang.
    let function = plan
        .party_function
        .get(party as usize)
        .map_or_else(|| "unknown".to_owned(), |&f| plan.group_name(f));
    tracing::warn!(
        function = %function,
        instance = party,
        "function '{function}' instance {party} hung: its handler thread {t} was in one \
         request for {:.1}s (chain timeout {timeout:?} + grace {:?}); killing it and its \
         process group",
        held.as_secs_f64(),
        limit - timeout,
    );
    control.condemn(format!(
        "hung (held a request for {:.1}s, past the chain timeout of {timeout:?}) and was killed",
        held.as_secs_f64()
    ));
    if !control.signal_group(pgid, Signal::SIGKILL) {
        // It went by itself meanwhile: the reason is not its.
        control.take_condemned();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grace_is_half_the_timeout_at_least_a_second() {
        assert_eq!(limit(Duration::from_secs(1)), Duration::from_secs(2));
        assert_eq!(limit(Duration::from_secs(30)), Duration::from_secs(45));
        assert_eq!(
            limit(Duration::from_millis(100)),
            Duration::from_millis(1100)
        );
    }

    const LIMIT: Duration = Duration::from_secs(2);

    /// Runs `samples` (each: seconds since start, busy threads) through `stuck`; returns what
    /// each sample decided.
    fn decide(samples: &[(u64, &[(Thread, u64)])]) -> Vec<Vec<Thread>> {
        let t0 = Instant::now();
        let mut seen = HashMap::new();
        samples
            .iter()
            .map(|&(at, busy)| {
                stuck(&mut seen, busy, t0 + Duration::from_secs(at), LIMIT)
                    .into_iter()
                    .map(|(t, _)| t)
                    .collect()
            })
            .collect()
    }

    #[test]
    fn a_thread_in_one_request_past_the_limit_is_stuck_once() {
        let a = (3, 100, 0);
        let got = decide(&[
            (0, &[(a, 1)]),
            (2, &[(a, 1)]),
            (3, &[(a, 1)]),
            (4, &[(a, 1)]),
        ]);
        assert_eq!(
            got,
            [vec![], vec![], vec![a], vec![]],
            "killed once, then starts over"
        );
    }

    #[test]
    fn a_thread_that_moves_on_or_goes_idle_is_never_stuck() {
        let a = (3, 100, 0);
        let moving = decide(&[
            (0, &[(a, 1)]),
            (2, &[(a, 3)]),
            (4, &[(a, 5)]),
            (5, &[(a, 5)]),
        ]);
        assert!(moving.iter().all(Vec::is_empty), "{moving:?}");
        let idle_between = decide(&[(0, &[(a, 1)]), (2, &[]), (3, &[(a, 1)]), (4, &[(a, 1)])]);
        assert!(idle_between.iter().all(Vec::is_empty), "{idle_between:?}");
    }

    #[test]
    fn one_kill_per_instance_and_a_restarted_instance_starts_over() {
        let (a0, a1, b) = ((3, 100, 0), (3, 100, 1), (4, 200, 0));
        let got = decide(&[
            (0, &[(a0, 1), (a1, 7), (b, 1)]),
            (3, &[(a0, 1), (a1, 7), (b, 1)]),
        ]);
        assert_eq!(got, [vec![], vec![a0, b]]);
        // The same party with a new process group: a new instance, its own clock.
        let a_new = (3, 101, 0);
        let got = decide(&[(0, &[(a0, 1)]), (1, &[(a_new, 1)]), (3, &[(a_new, 1)])]);
        assert_eq!(got, [vec![], vec![], vec![]]);
    }
}
