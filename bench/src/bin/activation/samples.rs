//! What a round measured ([`Sample`]), or why it did not count ([`Discarded`]), and the
//! order statistics of each quantity over a variant's rounds ([`VariantReport`]).

use serde::Serialize;
use zerohop_bench::percentile::nearest_rank;

use crate::spec::Variant;

/// One measured round, microseconds unless named otherwise (the activation's parts are
/// `None` for `ready`, which has none).
#[derive(Serialize, Clone, Debug)]
pub(crate) struct Sample {
    /// Decision to handler start.
    pub(crate) activation_us: Option<f64>,
    /// The first request, sent to answer received.
    pub(crate) first_request_us: f64,
    /// Client send to the scaler's decision.
    pub(crate) send_to_decision_us: Option<f64>,
    /// Client send to handler start.
    pub(crate) send_to_take_us: f64,
    /// Handler start to the answer received by the client.
    pub(crate) take_to_answer_us: f64,
    /// Decision to the function's `main` (cold starts only).
    pub(crate) decision_to_main_us: Option<f64>,
    /// `main` to handler start (cold starts only).
    pub(crate) main_to_take_us: Option<f64>,
    /// The warm requests after it, sent to answer received.
    pub(crate) warm_us: Vec<f64>,
    pub(crate) pid: u32,
    /// The moments themselves (`CLOCK_MONOTONIC` ns), to find the round in a trace taken
    /// with the same clock (`perf record -k mono`).
    pub(crate) sent_ns: u64,
    pub(crate) decided_ns: Option<u64>,
    pub(crate) take_ns: u64,
    pub(crate) received_ns: u64,
}

/// A round that did not measure what it should have.
#[derive(Serialize, Debug)]
pub(crate) struct Discarded {
    pub(crate) variant: Variant,
    pub(crate) why: String,
}

/// Order statistics of one quantity, microseconds (nearest rank: with n samples, p99 is the
/// largest once n < 100).
#[derive(Serialize, Clone, Copy, Debug, Default)]
pub(crate) struct Stats {
    pub(crate) n: usize,
    pub(crate) median: f64,
    pub(crate) p90: f64,
    pub(crate) p99: f64,
    pub(crate) min: f64,
    pub(crate) max: f64,
}

impl Stats {
    pub(crate) fn of(values: impl IntoIterator<Item = f64>) -> Self {
        let mut v: Vec<f64> = values.into_iter().collect();
        if v.is_empty() {
            return Self::default();
        }
        v.sort_by(f64::total_cmp);
        let rank = |q: f64| nearest_rank(&v, q).unwrap_or_default();
        Self {
            n: v.len(),
            median: rank(0.5),
            p90: rank(0.9),
            p99: rank(0.99),
            min: v[0],
            max: v[v.len() - 1],
        }
    }
}

#[derive(Serialize)]
pub(crate) struct VariantReport {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) activation_us: Option<Stats>,
    pub(crate) first_request_us: Stats,
    pub(crate) warm_us: Stats,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) send_to_decision_us: Option<Stats>,
    pub(crate) send_to_take_us: Stats,
    pub(crate) take_to_answer_us: Stats,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) decision_to_main_us: Option<Stats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) main_to_take_us: Option<Stats>,
    pub(crate) samples: Vec<Sample>,
}

impl VariantReport {
    pub(crate) fn of(samples: Vec<Sample>) -> Self {
        let field = |f: fn(&Sample) -> f64| Stats::of(samples.iter().map(f));
        let optional = |f: fn(&Sample) -> Option<f64>| {
            let v: Vec<f64> = samples.iter().filter_map(f).collect();
            (!v.is_empty()).then(|| Stats::of(v))
        };
        Self {
            activation_us: optional(|s| s.activation_us),
            first_request_us: field(|s| s.first_request_us),
            warm_us: Stats::of(samples.iter().flat_map(|s| s.warm_us.iter().copied())),
            send_to_decision_us: optional(|s| s.send_to_decision_us),
            send_to_take_us: field(|s| s.send_to_take_us),
            take_to_answer_us: field(|s| s.take_to_answer_us),
            decision_to_main_us: optional(|s| s.decision_to_main_us),
            main_to_take_us: optional(|s| s.main_to_take_us),
            samples,
        }
    }

    /// The median activation (0 without samples).
    pub(crate) fn activation_median(&self) -> f64 {
        self.activation_us.map_or(0.0, |s| s.median)
    }
}
