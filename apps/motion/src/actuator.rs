//! The actuator function: keeps each room's light and last motion time, and answers every
//! reading with the room's light command.
//!
//! **When the light goes off.** Sensors publish motion events while someone moves and a
//! no-motion heartbeat every few seconds otherwise. Motion turns the light on. A heartbeat
//! turns it off when the room has seen no motion for `off_after` (default 60 s) by the
//! heartbeat's own time; otherwise the light stays as it is. So "off" is triggered by the
//! first heartbeat at least `off_after` after the last motion, and every time is the
//! sensors' (`t_ms`): no timer runs in the chain, nothing wakes up while the building is
//! quiet, and a replayed trace gets the same commands at any speed. A reading older than the
//! last motion (late delivery) never turns the light off.
//!
//! The decision is [`Actuator::decide`], a pure function of the room's previous state; the
//! zerohop function keeps that state in chain state (`update`, atomic per room), the
//! baseline server in its own memory ([`Rooms`]).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use crate::event::{self, Command, FormatError, Light, Reading};
use crate::work;

/// Environment variable: the actuator's CPU work per event, in microseconds.
pub const WORK_ENV: &str = "ACTUATOR_WORK_US";
/// Default CPU work per event: SPRIGHT's 1 ms.
pub const DEFAULT_WORK_US: u64 = 1_000;
/// Environment variable: quiet time after the last motion before a heartbeat turns the
/// light off, in milliseconds of sensor time.
pub const OFF_AFTER_ENV: &str = "OFF_AFTER_MS";
/// Default quiet time before the light goes off.
pub const DEFAULT_OFF_AFTER_MS: u64 = 60_000;

/// What the actuator remembers of a room.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RoomState {
    /// The light.
    pub light: Light,
    /// Sensor time of the latest motion seen, if any.
    pub last_motion_ms: Option<u64>,
}

impl RoomState {
    /// Bytes in an encoded state.
    pub const LEN: usize = 9;

    /// The state as stored: light (0 off, 1 on), then the last motion time + 1 as a
    /// little-endian u64 (0: never).
    pub fn encode(&self) -> [u8; Self::LEN] {
        let mut out = [0; Self::LEN];
        out[0] = u8::from(self.light == Light::On);
        let t = self.last_motion_ms.map_or(0, |t| t.saturating_add(1));
        out[1..].copy_from_slice(&t.to_le_bytes());
        out
    }

    /// Reads a stored state; `None` when it is not one (treated as a room never seen).
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        let bytes: &[u8; Self::LEN] = bytes.try_into().ok()?;
        let light = match bytes[0] {
            0 => Light::Off,
            1 => Light::On,
            _ => return None,
        };
        let t = u64::from_le_bytes(bytes[1..].try_into().ok()?);
        Some(Self {
            light,
            last_motion_ms: t.checked_sub(1),
        })
    }
}

/// The key of a room's state in the chain's store.
pub fn state_key(room: &str) -> Vec<u8> {
    format!("room/{room}").into_bytes()
}

/// The actuator function's settings.
#[derive(Clone, Debug)]
pub struct Actuator {
    /// CPU time spent per reading.
    pub work: Duration,
    /// Quiet time (sensor clock) after which a heartbeat turns the light off.
    pub off_after_ms: u64,
}

impl Actuator {
    /// Settings from the environment ([`WORK_ENV`], [`OFF_AFTER_ENV`]).
    pub fn from_env() -> Result<Self, String> {
        let off_after_ms = match std::env::var(OFF_AFTER_ENV) {
            Err(_) => DEFAULT_OFF_AFTER_MS,
            Ok(v) => v
                .trim()
                .parse()
                .map_err(|_| format!("{OFF_AFTER_ENV}={v:?} is not a number of milliseconds"))?,
        };
        Ok(Self {
            work: work::micros_from_env(WORK_ENV, DEFAULT_WORK_US)?,
            off_after_ms,
        })
    }

    /// Parses the sensor's reading and does the actuator's CPU work (outside any lock).
    pub fn read(&self, body: &[u8]) -> Result<Reading, FormatError> {
        let r: Reading = event::parse("reading", body)?;
        event::room_of_topic(&format!("x/{}/event", r.room))?;
        work::burn(self.work, r.seq ^ r.t_ms);
        Ok(r)
    }

    /// The room's new state and the command answering `r`, given what was known before.
    pub fn decide(&self, prev: Option<RoomState>, r: &Reading) -> (RoomState, Command) {
        let prev = prev.unwrap_or(RoomState {
            light: Light::Off,
            last_motion_ms: None,
        });
        let next = if r.motion {
            RoomState {
                light: Light::On,
                last_motion_ms: Some(prev.last_motion_ms.map_or(r.t_ms, |t| t.max(r.t_ms))),
            }
        } else {
            let quiet = match prev.last_motion_ms {
                Some(t) => r.t_ms.saturating_sub(t) >= self.off_after_ms && r.t_ms >= t,
                None => true,
            };
            RoomState {
                light: if quiet { Light::Off } else { prev.light },
                ..prev
            }
        };
        let command = Command {
            room: r.room.clone(),
            seq: r.seq,
            light: next.light,
            changed: next.light != prev.light,
        };
        (next, command)
    }
}

/// Room states in the process's own memory: the baseline actuator's store.
#[derive(Debug, Default)]
pub struct Rooms {
    rooms: Mutex<HashMap<String, RoomState>>,
}

impl Rooms {
    /// Applies `r` to its room and returns the command.
    pub fn apply(&self, actuator: &Actuator, r: &Reading) -> Command {
        let mut rooms = self.rooms.lock().unwrap_or_else(|p| p.into_inner());
        let (next, command) = actuator.decide(rooms.get(&r.room).copied(), r);
        rooms.insert(r.room.clone(), next);
        command
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(t_ms: u64, motion: bool) -> Reading {
        Reading {
            room: "r".into(),
            seq: t_ms,
            t_ms,
            motion,
        }
    }

    #[test]
    fn motion_switches_on_and_a_late_enough_heartbeat_off() {
        let a = Actuator {
            work: Duration::ZERO,
            off_after_ms: 10_000,
        };
        let rooms = Rooms::default();
        let lights: Vec<(Light, bool)> = [
            (0, false),      // never seen motion: off, no change
            (1_000, true),   // on
            (2_000, true),   // still on
            (5_000, false),  // 3 s quiet: stays on
            (11_999, false), // 9.999 s quiet: stays on
            (12_000, false), // 10 s quiet: off
            (20_000, false), // stays off
            (21_000, true),  // on again
        ]
        .into_iter()
        .map(|(t, m)| {
            let c = rooms.apply(&a, &reading(t, m));
            (c.light, c.changed)
        })
        .collect();
        use Light::{Off, On};
        assert_eq!(
            lights,
            [
                (Off, false),
                (On, true),
                (On, false),
                (On, false),
                (On, false),
                (Off, true),
                (Off, false),
                (On, true)
            ]
        );
    }

    #[test]
    fn a_late_heartbeat_never_turns_the_light_off() {
        let a = Actuator {
            work: Duration::ZERO,
            off_after_ms: 10,
        };
        let (s, _) = a.decide(None, &reading(1_000, true));
        let (s, c) = a.decide(Some(s), &reading(500, false));
        assert_eq!((s.light, c.changed), (Light::On, false));
        assert_eq!(s.last_motion_ms, Some(1_000));
    }

    #[test]
    fn states_round_trip_through_bytes() {
        for s in [
            RoomState {
                light: Light::On,
                last_motion_ms: Some(0),
            },
            RoomState {
                light: Light::Off,
                last_motion_ms: None,
            },
            RoomState {
                light: Light::Off,
                last_motion_ms: Some(123_456_789),
            },
        ] {
            assert_eq!(RoomState::decode(&s.encode()), Some(s));
        }
        assert_eq!(RoomState::decode(b"short"), None);
        assert_eq!(RoomState::decode(&[7; RoomState::LEN]), None);
    }
}
