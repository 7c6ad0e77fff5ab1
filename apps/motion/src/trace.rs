//! A synthesised motion trace, standing in for the MERL motion detector data set (which
//! cannot be fetched here): when each sensor reports motion and when it sends heartbeats.
//!
//! **Shape** (all times are trace time; [`TraceConfig`] holds every parameter):
//!
//! * `sensors` sensors, one per room (`room-00`, `room-01`, ..., after a tag of the run), each independent, with its
//!   own random stream derived from `seed` and its index (adding sensors does not change the
//!   others).
//! * Each sensor alternates **idle gaps** and **bursts**, starting idle. A gap lasts
//!   Exp(mean `mean_idle_s`) seconds (default 240: minutes of nobody around); a burst
//!   (someone moving) lasts Uniform[`burst_min_s`, `burst_max_s`] seconds (default 20 to
//!   60) and holds motion events separated by Uniform[`step_min_s`, `step_max_s`] seconds
//!   (default 1 to 2), the first at the burst's start.
//! * **Heartbeats** (no motion) on a fixed grid every `heartbeat_s` seconds (default 15) at
//!   a random phase per sensor, sent only outside bursts and not within `guard_s` (default
//!   2) before a burst's first event: a real sensor does not report "nothing" while it sees
//!   motion, and the guard keeps a heartbeat and the next motion far enough apart that no
//!   deployment can deliver them out of order.
//! * Events are cut at `duration_s` and numbered (`seq`) in time order over all sensors.
//!
//! With the defaults a sensor cycles every ~280 s and sends ~27 motion events and ~16
//! heartbeats per cycle: 8 sensors make ~1.2 events per second of trace time, in clumps.
//! The replay divides times by a time-scale factor.

use crate::actuator::Actuator;
use crate::event::Command;
use crate::event::Reading;

/// Every parameter of a trace.
#[derive(Clone, Debug, PartialEq)]
pub struct TraceConfig {
    /// Sensors (rooms).
    pub sensors: usize,
    /// Length of the trace, seconds.
    pub duration_s: f64,
    /// Seed of the random streams.
    pub seed: u64,
    /// Mean idle gap between bursts (exponential), seconds.
    pub mean_idle_s: f64,
    /// Shortest burst, seconds.
    pub burst_min_s: f64,
    /// Longest burst, seconds.
    pub burst_max_s: f64,
    /// Shortest time between two motion events of a burst, seconds.
    pub step_min_s: f64,
    /// Longest time between two motion events of a burst, seconds.
    pub step_max_s: f64,
    /// Heartbeat period, seconds.
    pub heartbeat_s: f64,
    /// No heartbeat this long before a burst, seconds.
    pub guard_s: f64,
}

impl Default for TraceConfig {
    fn default() -> Self {
        Self {
            sensors: 8,
            duration_s: 3_600.0,
            seed: 1,
            mean_idle_s: 240.0,
            burst_min_s: 20.0,
            burst_max_s: 60.0,
            step_min_s: 1.0,
            step_max_s: 2.0,
            heartbeat_s: 15.0,
            guard_s: 2.0,
        }
    }
}

impl TraceConfig {
    /// Checks the parameters make a trace (positive times, min <= max).
    pub fn validate(&self) -> Result<(), String> {
        let positive = [
            ("duration", self.duration_s),
            ("mean idle", self.mean_idle_s),
            ("burst min", self.burst_min_s),
            ("step min", self.step_min_s),
            ("heartbeat", self.heartbeat_s),
        ];
        for (what, v) in positive {
            if !(v.is_finite() && v > 0.0) {
                return Err(format!(
                    "{what} must be a positive number of seconds, not {v}"
                ));
            }
        }
        if !(self.guard_s.is_finite() && self.guard_s >= 0.0) {
            return Err(format!("guard must be >= 0 seconds, not {}", self.guard_s));
        }
        if self.burst_max_s < self.burst_min_s || self.step_max_s < self.step_min_s {
            return Err("a maximum is below its minimum (burst or step)".into());
        }
        if self.sensors == 0 || self.sensors > 10_000 {
            return Err(format!("sensors must be 1 to 10000, not {}", self.sensors));
        }
        Ok(())
    }
}

/// One event of the trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceEvent {
    /// Position in the trace (time order over all sensors).
    pub seq: u64,
    /// Trace time, milliseconds.
    pub t_ms: u64,
    /// The sensor (room index).
    pub sensor: usize,
    /// Motion, or a heartbeat.
    pub motion: bool,
}

/// The name of room `i`, after `tag` (a run's rooms are its own: `tag` keeps two runs
/// against one deployment from sharing room state).
pub fn room_name(tag: &str, i: usize) -> String {
    format!("{tag}room-{i:02}")
}

/// The trace `cfg` describes (call [`TraceConfig::validate`] first).
pub fn generate(cfg: &TraceConfig) -> Vec<TraceEvent> {
    let end_ms = (cfg.duration_s * 1_000.0) as u64;
    let mut events = Vec::new();
    for sensor in 0..cfg.sensors {
        let mut rng =
            SplitMix64::new(cfg.seed ^ (sensor as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let mut bursts = Vec::new(); // (start_ms, end_ms)
        let mut t = 0.0;
        loop {
            t += rng.exponential(cfg.mean_idle_s);
            if t * 1_000.0 >= end_ms as f64 {
                break;
            }
            let len = rng.uniform(cfg.burst_min_s, cfg.burst_max_s);
            let start = t;
            while t < start + len && t * 1_000.0 < end_ms as f64 {
                events.push((ms(t), sensor, true));
                t += rng.uniform(cfg.step_min_s, cfg.step_max_s);
            }
            bursts.push((ms(start), ms(t)));
        }
        let phase = rng.uniform(0.0, cfg.heartbeat_s);
        let (period, guard) = (cfg.heartbeat_s * 1_000.0, cfg.guard_s * 1_000.0);
        let mut k = 0u64;
        loop {
            let hb = phase * 1_000.0 + k as f64 * period;
            k += 1;
            if hb >= end_ms as f64 {
                break;
            }
            let quiet = bursts.iter().all(|&(s, e)| {
                let (s, e) = (s as f64, e as f64);
                hb >= e || hb < s - guard
            });
            if quiet {
                events.push((hb as u64, sensor, false));
            }
        }
    }
    events.sort_by_key(|&(t, sensor, _)| (t, sensor));
    events
        .into_iter()
        .enumerate()
        .map(|(i, (t_ms, sensor, motion))| TraceEvent {
            seq: i as u64,
            t_ms,
            sensor,
            motion,
        })
        .collect()
}

/// The commands a correct actuator answers to each event of `trace` in rooms named after
/// `tag`, in order (the trace applied to a fresh actuator, event by event).
pub fn expected(trace: &[TraceEvent], tag: &str, off_after_ms: u64) -> Vec<Command> {
    let actuator = Actuator {
        work: std::time::Duration::ZERO,
        off_after_ms,
    };
    let rooms = crate::actuator::Rooms::default();
    trace
        .iter()
        .map(|e| {
            rooms.apply(
                &actuator,
                &Reading {
                    room: room_name(tag, e.sensor),
                    seq: e.seq,
                    t_ms: e.t_ms,
                    motion: e.motion,
                },
            )
        })
        .collect()
}

fn ms(seconds: f64) -> u64 {
    (seconds * 1_000.0) as u64
}

/// SplitMix64 (Steele, Lea, Flood 2014): small, seedable, good enough for a workload.
#[derive(Clone, Debug)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A stream from `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in [lo, hi).
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.unit()
    }

    /// Exponential with mean `mean`.
    pub fn exponential(&mut self, mean: f64) -> f64 {
        -mean * (1.0 - self.unit()).ln()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::Light;

    #[test]
    fn the_same_seed_gives_the_same_trace() {
        let cfg = TraceConfig {
            duration_s: 600.0,
            ..TraceConfig::default()
        };
        assert_eq!(generate(&cfg), generate(&cfg));
        let other = TraceConfig {
            seed: 2,
            ..cfg.clone()
        };
        assert_ne!(generate(&cfg), generate(&other));
    }

    #[test]
    fn bursts_step_one_to_two_seconds_and_heartbeats_stay_out_of_them() {
        let cfg = TraceConfig {
            sensors: 4,
            duration_s: 7_200.0,
            ..TraceConfig::default()
        };
        let trace = generate(&cfg);
        assert!(trace.windows(2).all(|w| w[0].t_ms <= w[1].t_ms));
        assert!(trace.iter().enumerate().all(|(i, e)| e.seq == i as u64));
        for s in 0..cfg.sensors {
            let mine: Vec<_> = trace.iter().filter(|e| e.sensor == s).collect();
            let motions = mine.iter().filter(|e| e.motion).count();
            assert!(motions > 50, "sensor {s}: {motions} motion events in 2 h");
            for w in mine.windows(2) {
                let gap = w[1].t_ms - w[0].t_ms;
                if w[0].motion && w[1].motion {
                    // Inside a burst 1-2 s; between bursts at least an idle gap.
                    assert!(gap >= 999, "{w:?}");
                }
                if !w[0].motion && w[1].motion {
                    assert!(gap >= 2_000, "heartbeat right before motion: {w:?}");
                }
                if !w[0].motion && !w[1].motion {
                    assert!(gap >= 14_999, "{w:?}");
                }
            }
        }
    }

    #[test]
    fn expected_commands_go_on_at_motion_and_off_after_the_quiet_period() {
        let cfg = TraceConfig {
            sensors: 3,
            duration_s: 3_600.0,
            ..TraceConfig::default()
        };
        let trace = generate(&cfg);
        let commands = expected(&trace, "t-", 60_000);
        assert_eq!(commands.len(), trace.len());
        for (e, c) in trace.iter().zip(&commands) {
            assert_eq!(c.seq, e.seq);
            assert_eq!(c.room, room_name("t-", e.sensor));
            if e.motion {
                assert_eq!(c.light, Light::On);
            }
        }
        let offs = commands
            .iter()
            .filter(|c| c.changed && c.light == Light::Off)
            .count();
        let ons = commands
            .iter()
            .filter(|c| c.changed && c.light == Light::On)
            .count();
        assert!(ons > 0 && offs > 0, "{ons} on, {offs} off");
        assert!(offs <= ons);
    }

    #[test]
    fn exponential_has_about_its_mean() {
        let mut rng = SplitMix64::new(9);
        let n = 20_000;
        let mean = (0..n).map(|_| rng.exponential(240.0)).sum::<f64>() / n as f64;
        assert!((mean - 240.0).abs() < 10.0, "{mean}");
    }
}
