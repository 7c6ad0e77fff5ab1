//! The sensor function: takes a device's [`Event`] off its topic, does its (stand-in) signal
//! processing and hands the actuator a [`Reading`] naming the room.
//!
//! The same code runs as the zerohop function `motion-sensor` and inside the baseline's
//! HTTP sensor server.

use std::time::Duration;

use crate::event::{self, encode, Event, FormatError, Reading};
use crate::work;

/// Environment variable: the sensor's CPU work per event, in microseconds.
pub const WORK_ENV: &str = "SENSOR_WORK_US";
/// Default CPU work per event: SPRIGHT's 1 ms.
pub const DEFAULT_WORK_US: u64 = 1_000;

/// The sensor function's settings.
#[derive(Clone, Debug)]
pub struct Sensor {
    /// CPU time spent per event.
    pub work: Duration,
}

impl Sensor {
    /// Settings from the environment ([`WORK_ENV`]).
    pub fn from_env() -> Result<Self, String> {
        Ok(Self {
            work: work::micros_from_env(WORK_ENV, DEFAULT_WORK_US)?,
        })
    }

    /// Turns the event `payload` published on `topic` into the actuator's input.
    pub fn sense(&self, topic: Option<&str>, payload: &[u8]) -> Result<Vec<u8>, FormatError> {
        let room = event::room_of_topic(topic.ok_or(FormatError::NoTopic)?)?;
        let ev: Event = event::parse("event", payload)?;
        work::burn(self.work, ev.seq ^ ev.t_ms);
        Ok(encode(&Reading {
            room: room.to_owned(),
            seq: ev.seq,
            t_ms: ev.t_ms,
            motion: ev.motion,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reading_names_the_topic_s_room() {
        let s = Sensor {
            work: Duration::ZERO,
        };
        let out = s
            .sense(
                Some("motion/hall/event"),
                br#"{"seq":3,"t_ms":1500,"motion":true}"#,
            )
            .unwrap();
        let r: Reading = event::parse("reading", &out).unwrap();
        assert_eq!(
            r,
            Reading {
                room: "hall".into(),
                seq: 3,
                t_ms: 1500,
                motion: true
            }
        );
        assert!(matches!(s.sense(None, b"{}"), Err(FormatError::NoTopic)));
        assert!(s.sense(Some("motion/hall/event"), b"nope").is_err());
    }
}
