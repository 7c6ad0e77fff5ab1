//! What travels down the chain after detection, and what the camera gets back: the plate
//! and spot, the functions the request went through, what the plate store knew and the
//! charge.
//!
//! ```text
//! {"camera":0,"spot":17,"plate":"KX482TB","t_ms":1795490978000,
//!  "path":["detection","search","persist","charge"],"known":false,
//!  "tariff_cents":250,"charge_cents":250}
//! ```

use serde::{Deserialize, Serialize};

/// The long chain, for a plate seen for the first time.
pub const LONG_PATH: [&str; 4] = ["detection", "search", "persist", "charge"];
/// The short chain, for a known plate.
pub const SHORT_PATH: [&str; 3] = ["detection", "search", "charge"];

/// A malformed record (a function upstream is broken: 500).
#[derive(Debug, thiserror::Error)]
#[error("record is not valid: {0}")]
pub struct RecordError(#[from] serde_json::Error);

/// One snapshot's record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// The camera.
    pub camera: u32,
    /// The spot.
    pub spot: u32,
    /// The plate detection read.
    pub plate: String,
    /// The snapshot's time (camera clock, ms since the epoch).
    pub t_ms: u64,
    /// The functions this request went through, in order.
    pub path: Vec<String>,
    /// Whether the plate store knew the plate (set by search).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub known: Option<bool>,
    /// The plate's tariff per period, from the store (search) or as registered (persist).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tariff_cents: Option<u32>,
    /// What was charged (set by charge).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub charge_cents: Option<u32>,
}

impl Record {
    /// Parses a record.
    pub fn decode(bytes: &[u8]) -> Result<Self, RecordError> {
        Ok(serde_json::from_slice(bytes)?)
    }

    /// The record as JSON.
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("plain struct serialises")
    }

    /// Appends `function` to the path.
    pub fn passed(&mut self, function: &str) {
        self.path.push(function.to_owned());
    }

    /// Whether the path is the long chain (through persist).
    pub fn took_long_path(&self) -> bool {
        self.path.iter().map(String::as_str).eq(LONG_PATH)
    }

    /// Whether the path is the short chain.
    pub fn took_short_path(&self) -> bool {
        self.path.iter().map(String::as_str).eq(SHORT_PATH)
    }
}

/// The tariff per period of a plate being registered: plates starting with `E` (electric
/// cars) 150 cents, every other 250.
pub fn tariff_for(plate: &str) -> u32 {
    if plate.starts_with('E') {
        150
    } else {
        250
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_name_their_path() {
        let mut r = Record {
            camera: 0,
            spot: 1,
            plate: "EV100AA".into(),
            t_ms: 5,
            path: vec![],
            known: None,
            tariff_cents: None,
            charge_cents: None,
        };
        for f in LONG_PATH {
            r.passed(f);
        }
        assert!(r.took_long_path() && !r.took_short_path());
        let text = r.encode();
        assert!(!String::from_utf8_lossy(&text).contains("known"));
        assert_eq!(Record::decode(&text).unwrap(), r);
        assert_eq!(tariff_for(&r.plate), 150);
        assert_eq!(tariff_for("KX482TB"), 250);
    }
}
