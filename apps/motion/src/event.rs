//! The three messages of the workload and how they are written: what a sensor publishes
//! ([`Event`], on `motion/ROOM/event`), what the sensor function hands the actuator
//! ([`Reading`]) and what the actuator answers ([`Command`], published to the reply topic).
//!
//! All three are one-line JSON objects. Times are the sensor's clock in milliseconds
//! (`t_ms`), never the receiver's: the actuator decides "off" from the times the sensors
//! report, so a replayed trace gets the same commands however fast or slow it is delivered.

use serde::{Deserialize, Serialize};

/// Longest room name accepted (the topic level between `motion/` and `/event`).
pub const MAX_ROOM: usize = 64;

/// What went wrong with a message; every variant is the sender's fault (400).
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    /// The topic is not `PREFIX/ROOM/event` with a valid room name.
    #[error("topic `{0}` does not name a room: expected motion/ROOM/event, ROOM of 1 to 64 letters, digits, `-` or `_`")]
    BadTopic(String),
    /// The request did not say which topic it came from (the `mqtt-topic` header).
    #[error("no `mqtt-topic`: MQTT ingress sets it; over HTTP send the header `mqtt-topic: motion/ROOM/event`")]
    NoTopic,
    /// The payload is not the JSON object expected at this hop.
    #[error("{what} is not valid: {source}")]
    BadJson {
        /// Which message (`event`, `reading`, `command`).
        what: &'static str,
        /// The parser's complaint.
        source: serde_json::Error,
    },
}

/// What a motion sensor publishes: motion seen (`motion: true`) or a periodic heartbeat
/// saying it saw none (`motion: false`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// Sequence number of the event in its trace (unique per run; echoed in the command).
    pub seq: u64,
    /// When the sensor saw it, in milliseconds of the sensor's clock (trace time).
    pub t_ms: u64,
    /// Motion seen, or a no-motion heartbeat.
    pub motion: bool,
}

/// What the sensor function passes on: the event with the room it came from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reading {
    /// The room (from the topic).
    pub room: String,
    /// The event's sequence number.
    pub seq: u64,
    /// The event's time (sensor clock, ms).
    pub t_ms: u64,
    /// Motion seen, or a heartbeat.
    pub motion: bool,
}

/// A light's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Light {
    /// Lit.
    On,
    /// Dark.
    Off,
}

/// The actuator's answer to one event: the room's light after it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Command {
    /// The room.
    pub room: String,
    /// The sequence number of the event this answers.
    pub seq: u64,
    /// The light after this event.
    pub light: Light,
    /// Whether this event switched it (on at first motion, off after the quiet period).
    pub changed: bool,
}

/// The room named by a topic `PREFIX/ROOM/event` (the level before the last).
pub fn room_of_topic(topic: &str) -> Result<&str, FormatError> {
    let mut levels = topic.rsplit('/');
    let bad = || FormatError::BadTopic(topic.chars().take(200).collect());
    if levels.next() != Some("event") {
        return Err(bad());
    }
    let room = levels.next().ok_or_else(bad)?;
    let valid = !room.is_empty()
        && room.len() <= MAX_ROOM
        && room
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if valid {
        Ok(room)
    } else {
        Err(bad())
    }
}

/// The topic a sensor of `room` publishes on, under `prefix` (`motion`).
pub fn event_topic(prefix: &str, room: &str) -> String {
    format!("{prefix}/{room}/event")
}

/// Parses one message of kind `what` (for the error).
pub fn parse<'a, T: Deserialize<'a>>(
    what: &'static str,
    bytes: &'a [u8],
) -> Result<T, FormatError> {
    serde_json::from_slice(bytes).map_err(|source| FormatError::BadJson { what, source })
}

/// Writes a message as one line of JSON.
pub fn encode<T: Serialize>(msg: &T) -> Vec<u8> {
    // Serialising these plain structs cannot fail (no maps with non-string keys, no I/O).
    serde_json::to_vec(msg).expect("plain struct serialises")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_room_is_the_level_before_event() {
        assert_eq!(room_of_topic("motion/kitchen/event").unwrap(), "kitchen");
        assert_eq!(
            room_of_topic("site/3/motion/r-07_a/event").unwrap(),
            "r-07_a"
        );
        for bad in [
            "motion/kitchen",
            "motion//event",
            "event",
            "motion/a b/event",
            "motion/kitchen/event/x",
        ] {
            assert!(room_of_topic(bad).is_err(), "{bad}");
        }
        let long = format!("motion/{}/event", "a".repeat(MAX_ROOM + 1));
        assert!(room_of_topic(&long).is_err());
    }

    #[test]
    fn messages_round_trip_as_json() {
        let c = Command {
            room: "r1".into(),
            seq: 7,
            light: Light::On,
            changed: true,
        };
        let text = encode(&c);
        assert_eq!(
            std::str::from_utf8(&text).unwrap(),
            r#"{"room":"r1","seq":7,"light":"on","changed":true}"#
        );
        assert_eq!(parse::<Command>("command", &text).unwrap(), c);
        assert!(matches!(
            parse::<Event>("event", b"{\"seq\":1}"),
            Err(FormatError::BadJson { what: "event", .. })
        ));
    }
}
