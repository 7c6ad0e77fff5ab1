//! Hung instances: an instance that holds a slot far past the chain's timeout is killed
//! (with its process group and cgroup), which makes its supervisor reclaim its slots,
//! answer its requests and restart it, as after a crash.
//!
//! Detected from the pool's owner table alone: while the gateway has requests in flight,
//! every [`SAMPLE`] the watchdog reads each slot's owner word and remembers since when each
//! (slot, owner, generation) has been unchanged. A function party holding the same slot and
//! generation for longer than [`limit`] (the chain's timeout plus a grace of
//! max(1 s, timeout / 2)) is hung: any request it holds has been answered 504 by the
//! gateway long before. The owner words are input from shared memory: the watchdog only
//! compares them and maps a party number to the agent's own record of that party's process
//! group, never to anything read back from the pool.
//!
//! Idle (nothing in flight, nothing tracked), the watchdog has no timer: it waits for the
//! gateways' [`busy`](zerohop_gateway::Gateways::busy) signal, so an idle chain costs no CPU.
//! A hang is detected within limit + SAMPLE.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::sync::watch;
use zerohop_pool::OwnerWord;

use crate::supervise::Shared;

/// Sampling period while requests are in flight.
pub const SAMPLE: Duration = Duration::from_millis(300);

/// How long an instance may hold one slot: the chain's timeout plus max(1 s, timeout / 2).
pub fn limit(timeout: Duration) -> Duration {
    timeout + (timeout / 2).max(Duration::from_secs(1))
}

/// Runs until `stop` turns true.
pub(crate) async fn watch(shared: Arc<Shared>, timeout: Duration, mut stop: watch::Receiver<bool>) {
    let limit = limit(timeout);
    // slot -> (owner word, first seen)
    let mut seen: HashMap<u32, (OwnerWord, Instant)> = HashMap::new();
    loop {
        if shared.gateways.inflight() == 0 && seen.is_empty() {
            // Idle: no timer at all until a request enters the chain.
            tokio::select! {
                _ = shared.gateways.busy() => {}
                r = stop.changed() => if r.is_err() || *stop.borrow() { return },
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(SAMPLE) => {}
            r = stop.changed() => if r.is_err() || *stop.borrow() { return },
        }
        sample(&shared, limit, timeout, &mut seen);
    }
}

fn sample(
    shared: &Shared,
    limit: Duration,
    timeout: Duration,
    seen: &mut HashMap<u32, (OwnerWord, Instant)>,
) {
    let now = Instant::now();
    let mut hung: Vec<(u16, u32, Duration)> = Vec::new();
    let words = shared.gateways.pools().iter().flat_map(|p| {
        let owners = p.owners();
        (0..owners.len()).filter_map(move |l| owners.get(l).map(|w| (p.first_slot() + l, w)))
    });
    let gateways = shared.gateways.plan().gateways();
    for (slot, word) in words {
        let party = word.owner.as_party().filter(|&p| p >= gateways);
        let Some(party) = party else {
            seen.remove(&slot);
            continue;
        };
        match seen.get(&slot) {
            Some((w, since)) if *w == word => {
                let held = now - *since;
                if held > limit && !hung.iter().any(|(p, _, _)| *p == party) {
                    hung.push((party, slot, held));
                }
            }
            _ => {
                seen.insert(slot, (word, now));
            }
        }
    }
    for (party, slot, held) in hung {
        seen.retain(|_, (w, _)| w.owner.as_party() != Some(party));
        let Some(control) = shared.parties.get(party as usize) else {
            continue;
        };
        let pgid = control.pgid();
        if pgid == 0 {
            continue;
        }
        let plan = shared.gateways.plan();
        let function = plan
            .party_function
            .get(party as usize)
            .map_or("unknown", |&f| plan.function_name(f))
            .to_owned();
        tracing::warn!(
            function = %function,
            instance = party,
            "function '{function}' instance {party} hung: held slot {slot} for {:.1}s \
             (chain timeout {timeout:?} + grace {:?}); killing it and its process group",
            held.as_secs_f64(),
            limit - timeout,
        );
        *control.hung.lock().unwrap_or_else(|p| p.into_inner()) = Some(format!(
            "hung (held a request for {:.1}s, past the chain timeout of {timeout:?}) and was killed",
            held.as_secs_f64()
        ));
        let _ = killpg(Pid::from_raw(pgid as i32), Signal::SIGKILL);
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
}
