//! The report: what the run wrote (`activation.json`), its Markdown (`activation.md`) and
//! its summary line.

use std::fmt::Write as _;

use serde::Serialize;
use zerohop_bench::report::Machine;

use crate::samples::{Discarded, Stats, VariantReport};

#[derive(Serialize)]
pub(crate) struct Settings {
    pub(crate) rounds_per_variant: usize,
    pub(crate) warm_per_round: usize,
    pub(crate) zero_after_ms: u64,
    pub(crate) settle_ms: u64,
    pub(crate) gateway_threads: u16,
    pub(crate) via: &'static str,
}

/// The machine's floor for the one step a parked activation cannot avoid: waking a process
/// asleep on a futex (from `zerohop_bench::floors`, `futex_rtt`, halved: a round trip is two
/// wakes).
#[derive(Serialize)]
pub(crate) struct FutexFloor {
    /// Median of one wake, microseconds.
    pub(crate) wake_median_us: f64,
    /// Median parked activation over it: how many such wakes an activation costs.
    pub(crate) parked_activation_over_wake: f64,
    /// 99th percentile of the round trip, halved, microseconds.
    pub(crate) wake_p99_us: f64,
    /// How it was measured.
    pub(crate) what: String,
}

#[derive(Serialize)]
pub(crate) struct Report {
    pub(crate) machine: Machine,
    pub(crate) futex_floor: Option<FutexFloor>,
    /// `uptime`'s load averages when the run began (a busy machine lengthens everything).
    pub(crate) loadavg_before: String,
    pub(crate) settings: Settings,
    pub(crate) parked: VariantReport,
    pub(crate) cold: VariantReport,
    pub(crate) ready: VariantReport,
    /// Cold median activation over parked median activation.
    pub(crate) cold_over_parked: f64,
    /// Median first request over median warm request, per variant.
    pub(crate) first_over_warm_parked: f64,
    pub(crate) first_over_warm_cold: f64,
    /// Median first request of a variant over that of `ready` (same pause, no activation).
    pub(crate) first_parked_over_ready: f64,
    pub(crate) first_cold_over_ready: f64,
    pub(crate) target_us: f64,
    /// Whether the parked median activation is under the target.
    pub(crate) target_met: bool,
    pub(crate) discarded: Vec<Discarded>,
    pub(crate) errors: Vec<String>,
    pub(crate) ok: bool,
}

pub(crate) fn summary_line(r: &Report) -> String {
    let parked = r.parked.activation_us.unwrap_or_default();
    format!(
        "activation: parked median {:.1} us (p99 {:.1}), cold median {:.0} us: cold/parked = \
         {:.0} x",
        parked.median,
        parked.p99,
        r.cold.activation_median(),
        r.cold_over_parked
    )
}

pub(crate) fn markdown(r: &Report) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# Activation: a function scaled to zero serves again\n");
    let _ = writeln!(
        s,
        "{} rounds per variant on the node daemon (one gateway thread), each after the same \
         pause with `parked` and `cold` at zero: one request, then {} warm ones to the same \
         instance. Activation is the scaler's decision (`activated_ns` in the status) to the \
         handler's start, on one clock (`CLOCK_MONOTONIC`); `ready` is a function that never \
         scaled to zero. {} cores, {}, load average before the run: {}.\n",
        r.settings.rounds_per_variant,
        r.settings.warm_per_round,
        r.machine.cores,
        r.machine.cpu_model,
        r.loadavg_before
    );
    let _ = writeln!(
        s,
        "| microseconds | n | median | p90 | p99 | min | max |\n|---|---|---|---|---|---|---|"
    );
    let mut row = |name: &str, st: Option<&Stats>| {
        if let Some(st) = st {
            let _ = writeln!(
                s,
                "| {name} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} |",
                st.n, st.median, st.p90, st.p99, st.min, st.max
            );
        }
    };
    let (p, c, w) = (&r.parked, &r.cold, &r.ready);
    row("**activation, parked**", p.activation_us.as_ref());
    row("**activation, cold**", c.activation_us.as_ref());
    row("first request, parked", Some(&p.first_request_us));
    row("first request, cold", Some(&c.first_request_us));
    row(
        "first request, ready (no activation)",
        Some(&w.first_request_us),
    );
    row("warm requests, parked", Some(&p.warm_us));
    row("warm requests, cold", Some(&c.warm_us));
    row("warm requests, ready", Some(&w.warm_us));
    row(
        "parked: client send to decision",
        p.send_to_decision_us.as_ref(),
    );
    row(
        "parked: handler to answer received",
        Some(&p.take_to_answer_us),
    );
    row(
        "cold: client send to decision",
        c.send_to_decision_us.as_ref(),
    );
    row("cold: decision to `main`", c.decision_to_main_us.as_ref());
    row("cold: `main` to handler", c.main_to_take_us.as_ref());
    row(
        "cold: handler to answer received",
        Some(&c.take_to_answer_us),
    );
    row("ready: client send to handler", Some(&w.send_to_take_us));
    row(
        "ready: handler to answer received",
        Some(&w.take_to_answer_us),
    );
    let _ = writeln!(
        s,
        "\nCold over parked activation (medians): **{:.0}x**. First request over the warm ones \
         (medians): parked {:.2}x, cold {:.1}x; over the first request to `ready`: parked \
         {:.2}x, cold {:.1}x.\n",
        r.cold_over_parked,
        r.first_over_warm_parked,
        r.first_over_warm_cold,
        r.first_parked_over_ready,
        r.first_cold_over_ready
    );
    let parked = p.activation_us.unwrap_or_default();
    let _ = writeln!(
        s,
        "Target: parked activation under {:.0} us: **{}** (median {:.1} us, p99 {:.1} us).",
        r.target_us,
        if r.target_met { "met" } else { "missed" },
        parked.median,
        parked.p99
    );
    if let Some(f) = &r.futex_floor {
        let _ = writeln!(
            s,
            "\nFloor of this machine: waking a process asleep on a futex takes {:.1} us \
             (median; p99 {:.1} us), half the round trip of `futex_rtt` ({}); a parked \
             activation costs {:.1} of those.",
            f.wake_median_us, f.wake_p99_us, f.what, f.parked_activation_over_wake
        );
    }
    if !r.discarded.is_empty() {
        let _ = writeln!(s, "\nDiscarded rounds:\n");
        for d in &r.discarded {
            let _ = writeln!(s, "- {}: {}", d.variant.name(), d.why);
        }
    }
    if !r.errors.is_empty() {
        let _ = writeln!(s, "\nErrors:\n");
        for e in &r.errors {
            let _ = writeln!(s, "- {e}");
        }
    }
    s
}
