//! One round of the measurement: wait until the functions are at zero, send the first
//! request and the warm ones, and check from the daemon's status that the round measured an
//! activation of the kind its variant expects.

use std::time::{Duration, Instant};

use anyhow::{bail, Result};

use crate::client::Client;
use crate::daemon::{Daemon, WAIT};
use crate::samples::Sample;
use crate::spec::Variant;

/// How often the status is read while waiting for zero.
pub(crate) const POLL: Duration = Duration::from_millis(20);

pub(crate) struct Bench {
    pub(crate) daemon: Daemon,
    pub(crate) client: Client,
    pub(crate) warm: usize,
    pub(crate) settle: Duration,
}

/// Why a round does not count (kept apart from errors: the run goes on).
pub(crate) enum Outcome {
    Measured(Sample),
    Discarded(String),
}

pub(crate) fn us(from_ns: u64, to_ns: u64) -> f64 {
    (to_ns as f64 - from_ns as f64) / 1_000.0
}

impl Bench {
    /// Waits until neither function has an instance ready, `parked` has its parked one and
    /// `cold` none with a process; returns the parked instance's pid.
    pub(crate) async fn wait_at_zero(&self) -> Result<u32> {
        let deadline = Instant::now() + WAIT;
        loop {
            let s = self.daemon.status().await?;
            let (p, c) = (s.function("parked")?, s.function("cold")?);
            let parked_pid = p
                .instances
                .iter()
                .find(|i| i.state == "parked")
                .and_then(|i| i.pid);
            let at_zero = p.ready == 0
                && p.parked == 1
                && p.instances.iter().all(|i| i.state == "parked")
                && c.ready == 0
                && c.parked == 0
                && c.instances.iter().all(|i| i.pid.is_none());
            if let (true, Some(pid)) = (at_zero, parked_pid) {
                return Ok(pid);
            }
            if Instant::now() >= deadline {
                bail!(
                    "the functions did not reach zero within {WAIT:?} (parked: {} ready, {} \
                     parked, {:?}; cold: {} ready, {:?})",
                    p.ready,
                    p.parked,
                    p.instances.iter().map(|i| &i.state).collect::<Vec<_>>(),
                    c.ready,
                    c.instances.iter().map(|i| &i.state).collect::<Vec<_>>()
                );
            }
            tokio::time::sleep(POLL).await;
        }
    }

    pub(crate) async fn round(&mut self, v: Variant) -> Result<Outcome> {
        // `ready` too is measured with the others at zero: the same quiet chain.
        let parked_pid = self.wait_at_zero().await?;
        // Connected (and the connection checked) before the quiet time, so nothing but the
        // request itself runs after it.
        self.client.ready().await?;
        tokio::time::sleep(self.settle).await;
        let path = format!("/{}", v.name());
        let (stamp, sent, received) = self.client.post(&path).await?;
        let mut warm_us = Vec::with_capacity(self.warm);
        for _ in 0..self.warm {
            let (w, s, r) = self.client.post(&path).await?;
            if w.pid != stamp.pid {
                return Ok(Outcome::Discarded(format!(
                    "a warm request was served by pid {}, not the activated {}",
                    w.pid, stamp.pid
                )));
            }
            warm_us.push(us(s, r));
        }
        let common = |decided: Option<u64>| Sample {
            activation_us: decided.map(|d| us(d, stamp.take_ns)),
            first_request_us: us(sent, received),
            send_to_decision_us: decided.map(|d| us(sent, d)),
            send_to_take_us: us(sent, stamp.take_ns),
            take_to_answer_us: us(stamp.take_ns, received),
            decision_to_main_us: None,
            main_to_take_us: None,
            warm_us: warm_us.clone(),
            pid: stamp.pid,
            sent_ns: sent,
            decided_ns: decided,
            take_ns: stamp.take_ns,
            received_ns: received,
        };
        if v == Variant::Ready {
            // An instance that has served before: nothing to check but that it is the one.
            return Ok(Outcome::Measured(common(None)));
        }
        let status = self.daemon.status().await?;
        let f = status.function(v.name())?;
        let Some(inst) = f.instances.iter().find(|i| i.pid == Some(stamp.pid)) else {
            return Ok(Outcome::Discarded(format!(
                "the status lists no instance with pid {} after the request",
                stamp.pid
            )));
        };
        let (Some(decided), Some(how)) = (inst.activated_ns, inst.activation.as_deref()) else {
            return Ok(Outcome::Discarded(
                "the instance that answered has no activation stamp".into(),
            ));
        };
        if stamp.nth != 1 {
            return Ok(Outcome::Discarded(format!(
                "the first request was request {} of its instance (it was not at zero)",
                stamp.nth
            )));
        }
        if how != v.name() {
            return Ok(Outcome::Discarded(format!(
                "activated {how}, not {}",
                v.name()
            )));
        }
        if v == Variant::Parked && stamp.pid != parked_pid {
            return Ok(Outcome::Discarded(format!(
                "served by pid {}, not the parked instance {parked_pid}",
                stamp.pid
            )));
        }
        if !(sent..=stamp.take_ns).contains(&decided) {
            return Ok(Outcome::Discarded(format!(
                "the decision ({decided} ns) is not between the send ({sent} ns) and the \
                 handler's start ({} ns)",
                stamp.take_ns
            )));
        }
        let cold = v == Variant::Cold;
        Ok(Outcome::Measured(Sample {
            decision_to_main_us: cold.then(|| us(decided, stamp.main_ns)),
            main_to_take_us: cold.then(|| us(stamp.main_ns, stamp.take_ns)),
            ..common(Some(decided))
        }))
    }
}
