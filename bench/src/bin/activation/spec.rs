//! The chain this benchmark runs: one function and one route per [`Variant`], all the stamp
//! program, written as the spec the daemon applies.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Result;
use serde::Serialize;

/// The chain's name on the daemon.
pub(crate) const CHAIN: &str = "activation";

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Variant {
    Parked,
    Cold,
    Ready,
}

impl Variant {
    pub(crate) const ALL: [Variant; 3] = [Variant::Parked, Variant::Cold, Variant::Ready];

    /// The function's and its route's name.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Variant::Parked => "parked",
            Variant::Cold => "cold",
            Variant::Ready => "ready",
        }
    }
}

pub(crate) fn spec(stamp: &Path, zero_after_ms: u64) -> Result<String> {
    let command = serde_json::to_string(&stamp.display().to_string())?;
    let mut s = format!("name: {CHAIN}\ngateway_threads: 1\ntimeout: 10s\nfunctions:\n");
    for (name, parked) in [("parked", 1), ("cold", 0)] {
        let _ = writeln!(
            s,
            "  {name}:\n    command: [{command}]\n    instances: 0\n    scale: {{ min: 0, \
             max: 1, parked: {parked}, zero_after: {zero_after_ms}ms }}"
        );
    }
    let _ = writeln!(s, "  ready:\n    command: [{command}]\n    instances: 1");
    s.push_str("routes:\n");
    for name in Variant::ALL.map(Variant::name) {
        let _ = writeln!(s, "  - http: POST /{name}\n    sequence: [{name}]");
    }
    Ok(s)
}
