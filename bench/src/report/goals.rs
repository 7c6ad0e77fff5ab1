//! The goals of issue 33 ("Performance on big machines") as rows of the targets table: one
//! per goal and core count, each with its bound and met or missed, or said to be not measured
//! and why (a 2-CPU machine cannot hold 2 systems' cores and a load generator's; a step did
//! not run in this run). Never silently absent. Pure functions of what was measured:
//!
//! * [`cores_targets`]: from the multi-core point ([`crate::cores`]);
//! * [`step_targets`]: from the steps `cargo xtask bench` runs after the matrix
//!   (`activation.json`, `scale.json`), counted only when written by this run (their machine's
//!   `started_unix` not before the matrix's).

use serde_json::Value;

use super::matrix::Target;
use crate::cores::table::{rows, scaling};
use crate::cores::{Cores, GO, GOAL_COUNTS, HYPER, ZEROHOP};

/// Row name of the parked-activation goal.
pub const ACTIVATION: &str = "parked activation, median (scaler's decision to handler start)";
/// Row name of the hot path's throughput goal.
pub const SCALE_RPS: &str = "hot path O(1): requests/s at 1,000 instances / at 100";
/// Row name of the ready-time goal.
pub const SCALE_READY: &str = "ready at 1,000 instances, seconds";
/// The rows [`step_targets`] makes, which a later update replaces.
pub const STEP_ROWS: [&str; 3] = [ACTIVATION, SCALE_RPS, SCALE_READY];

/// Bound of zerohop's RPS over the hyper monolith's at each core count.
pub const RPS_HYPER: f64 = 1.0;
/// Bound of zerohop's RPS over the Go monolith's.
pub const RPS_GO: f64 = 1.15;
/// Bound of zerohop's CPU per request over the hyper monolith's.
pub const CPU_HYPER: f64 = 1.05;
/// Bound of the one-client p50 ratio with idle cores.
pub const ONE_CLIENT_IDLE: f64 = 1.15;
/// Bound of the one-client p50 ratio on one core.
pub const ONE_CLIENT_ONE_CORE: f64 = 1.3;
/// Bound of the gateway's CPU per request, most over least, from 5% to 100% of peak.
pub const GATEWAY_FLAT: f64 = 1.15;
/// Bound of the parked activation, microseconds.
pub const ACTIVATION_US: f64 = 30.0;
/// Bound of requests/s at 1,000 instances over 100.
pub const SCALE_RATIO: f64 = 0.8;
/// Bound of the ready time at 1,000 instances, seconds.
pub const SCALE_READY_S: f64 = 2.0;

/// The scaling bound at `n` cores (2: 1.8, 4: 3.5, 8: 6.5).
pub fn scaling_bound(n: usize) -> Option<f64> {
    match n {
        2 => Some(1.8),
        4 => Some(3.5),
        8 => Some(6.5),
        _ => None,
    }
}

/// A measured row.
pub fn measured(name: String, value: f64, bound: f64, at_least: bool, note: String) -> Target {
    Target {
        name,
        value,
        target: bound,
        at_least,
        met: if at_least {
            value >= bound
        } else {
            value <= bound
        },
        measured: true,
        note,
    }
}

/// A row that could not be measured, and why.
pub fn not_measured(name: String, bound: f64, at_least: bool, why: String) -> Target {
    Target {
        name,
        value: f64::NAN,
        target: bound,
        at_least,
        met: false,
        measured: false,
        note: why,
    }
}

/// Why nothing was measured at `n` cores: the machine, or the run.
fn why_not_at(n: usize, cores: Option<&Cores>, online: usize) -> String {
    if 2 * n > online {
        format!(
            "not measured on this machine: needs {} CPUs ({n} for each system, {n} for the load \
             generator), it has {online}",
            2 * n
        )
    } else {
        match cores {
            None => "not run: the cores point was left out (--cores 0)".into(),
            Some(c) => format!(
                "not run: --cores stopped at {}",
                c.counts.iter().max().copied().unwrap_or(0)
            ),
        }
    }
}

/// The rows of the multi-core point's goals (`None`: the point did not run) on a machine with
/// `online` CPUs.
pub fn cores_targets(cores: Option<&Cores>, online: usize) -> Vec<Target> {
    let mut t = Vec::new();
    let rows = cores.map(|c| rows(&c.runs)).unwrap_or_default();
    let row = |n: usize| rows.iter().find(|r| r.cores == n);
    let missing = |n: usize, sys: &str| match row(n) {
        Some(_) => format!("not measured: {sys} did not run on {n} core(s) (see the failures)"),
        None => why_not_at(n, cores, online),
    };
    let one_core = |n: usize| {
        if n == 1 {
            " (1 core against 1 core)".to_owned()
        } else {
            String::new()
        }
    };
    for n in GOAL_COUNTS {
        let name = format!(
            "zerohop RPS / hyper monolith RPS on {n} core(s){}",
            one_core(n)
        );
        match row(n).and_then(|r| Some((r, r.rps_ratio(ZEROHOP, HYPER)?))) {
            Some((r, v)) => t.push(measured(
                name,
                v,
                RPS_HYPER,
                true,
                format!(
                    "{:.0} / {:.0} requests/s, mean of the rounds",
                    r.rps[ZEROHOP], r.rps[HYPER]
                ),
            )),
            None => t.push(not_measured(name, RPS_HYPER, true, missing(n, HYPER))),
        }
    }
    for n in GOAL_COUNTS {
        let name = format!(
            "zerohop RPS / Go monolith RPS on {n} core(s){}",
            one_core(n)
        );
        match row(n).and_then(|r| Some((r, r.rps_ratio(ZEROHOP, GO)?))) {
            Some((r, v)) => t.push(measured(
                name,
                v,
                RPS_GO,
                true,
                format!(
                    "{:.0} / {:.0} requests/s, GOMAXPROCS={n}",
                    r.rps[ZEROHOP], r.rps[GO]
                ),
            )),
            None => t.push(not_measured(name, RPS_GO, true, missing(n, GO))),
        }
    }
    for n in GOAL_COUNTS {
        let Some(bound) = scaling_bound(n) else {
            continue;
        };
        let name = format!("zerohop scaling: RPS on {n} cores / on 1 core");
        match scaling(&rows, ZEROHOP, n) {
            Some(v) => t.push(measured(
                name,
                v,
                bound,
                true,
                format!(
                    "hyper monolith: {}",
                    scaling(&rows, HYPER, n).map_or_else(|| "-".into(), |h| format!("{h:.2}x"))
                ),
            )),
            None => t.push(not_measured(name, bound, true, missing(n, ZEROHOP))),
        }
    }
    for n in GOAL_COUNTS {
        let name = format!(
            "zerohop CPU per request / hyper monolith's on {n} core(s){}",
            one_core(n)
        );
        match row(n).and_then(|r| Some((r, r.cpu_ratio(ZEROHOP, HYPER)?))) {
            Some((r, v)) => t.push(measured(
                name,
                v,
                CPU_HYPER,
                false,
                format!(
                    "{:.1} / {:.1} us, every process of the system",
                    r.cpu_us[ZEROHOP], r.cpu_us[HYPER]
                ),
            )),
            None => t.push(not_measured(name, CPU_HYPER, false, missing(n, HYPER))),
        }
    }
    let one = |many: bool| {
        let c = cores?;
        let z = c
            .one_client
            .iter()
            .find(|o| o.system == ZEROHOP && (o.cores > 1) == many)?;
        let h = c
            .one_client
            .iter()
            .find(|o| o.system == HYPER && o.cores == z.cores)?;
        Some((z.clone(), h.clone()))
    };
    for (many, bound, name) in [
        (
            true,
            ONE_CLIENT_IDLE,
            "one client: zerohop p50 / hyper monolith p50, idle cores",
        ),
        (
            false,
            ONE_CLIENT_ONE_CORE,
            "one client: zerohop p50 / hyper monolith p50, on one core",
        ),
    ] {
        match one(many) {
            Some((z, h)) => t.push(measured(
                name.into(),
                z.p50_us / h.p50_us.max(1e-9),
                bound,
                false,
                format!(
                    "{:.0} / {:.0} us on {} core(s); p99 {:.0} / {:.0} us ({:.2}x)",
                    z.p50_us,
                    h.p50_us,
                    z.cores,
                    z.p99_us,
                    h.p99_us,
                    z.p99_us / h.p99_us.max(1e-9)
                ),
            )),
            None if many && online < 4 => t.push(not_measured(
                name.into(),
                bound,
                false,
                format!(
                    "not measured on this machine: needs 4 CPUs (the system on 2, the load \
                     generator on 2), it has {online}"
                ),
            )),
            None => t.push(not_measured(
                name.into(),
                bound,
                false,
                match cores {
                    None => "not run: the cores point was left out (--cores 0)".into(),
                    Some(_) => "not measured: a system did not run (see the failures)".into(),
                },
            )),
        }
    }
    let name = "gateway CPU per request, most / least from 5% to 100% of peak".to_owned();
    match cores.filter(|c| c.rates.len() >= 2) {
        Some(c) => {
            let spread = |f: fn(&crate::cores::RatePoint) -> f64| {
                let v: Vec<f64> = c.rates.iter().map(f).collect();
                let max = v.iter().copied().fold(0.0, f64::max);
                let min = v.iter().copied().fold(f64::INFINITY, f64::min);
                max / min.max(1e-9)
            };
            t.push(measured(
                name,
                spread(|r| r.gateway_cpu_us_per_request),
                GATEWAY_FLAT,
                false,
                format!(
                    "{} us at {}% of peak on {} core(s); whole system {:.2}x",
                    c.rates
                        .iter()
                        .map(|r| format!("{:.1}", r.gateway_cpu_us_per_request))
                        .collect::<Vec<_>>()
                        .join(" / "),
                    c.rates
                        .iter()
                        .map(|r| format!("{:.0}", r.fraction * 100.0))
                        .collect::<Vec<_>>()
                        .join(" / "),
                    c.rate_cores,
                    spread(|r| r.system_cpu_us_per_request)
                ),
            ));
        }
        None => t.push(not_measured(
            name,
            GATEWAY_FLAT,
            false,
            match cores {
                None => "not run: the cores point was left out (--cores 0)".into(),
                Some(_) => {
                    "not measured: zerohop's rate points did not run (see the failures)".into()
                }
            },
        )),
    }
    t
}

/// Whether a step's JSON was written by this run: its machine's `started_unix` is not before
/// `started` (the matrix's).
fn fresh(v: &Value, started: u64) -> bool {
    v["machine"]["started_unix"]
        .as_u64()
        .is_some_and(|s| s >= started)
}

/// The rows of the steps after the matrix, from their JSON documents when present (`None`: no
/// file); a file from an earlier run counts as not run.
pub fn step_targets(
    started: u64,
    activation: Option<&Value>,
    scale: Option<&Value>,
) -> Vec<Target> {
    let mut t = Vec::new();
    match activation.filter(|a| fresh(a, started)) {
        Some(a) => match a["parked"]["activation_us"]["median"].as_f64() {
            Some(us) => {
                let floor = a["futex_floor"]["wake_median_us"]
                    .as_f64()
                    .map_or_else(|| "not measured".into(), |f| format!("{f:.1} us"));
                t.push(measured(
                    ACTIVATION.into(),
                    us,
                    ACTIVATION_US,
                    false,
                    format!(
                        "us; futex wake floor of this machine {floor}; activation.json, {} rounds",
                        a["parked"]["activation_us"]["n"].as_u64().unwrap_or(0)
                    ),
                ));
            }
            None => t.push(not_measured(
                ACTIVATION.into(),
                ACTIVATION_US,
                false,
                "not measured: activation.json has no parked activation (see activation.md)".into(),
            )),
        },
        None => t.push(not_measured(
            ACTIVATION.into(),
            ACTIVATION_US,
            false,
            "not run in this run (the activation step of `cargo xtask bench`)".into(),
        )),
    }
    let point = |s: &Value, n: u64| -> Option<Value> {
        s["points"]
            .as_array()?
            .iter()
            .find(|p| p["instances"].as_u64() == Some(n))
            .cloned()
    };
    match scale.filter(|s| fresh(s, started)) {
        Some(s) => {
            let (hundred, thousand) = (point(s, 100), point(s, 1000));
            let rps = |p: &Option<Value>| p.as_ref()?["load"]["rps"].as_f64();
            match (rps(&hundred), rps(&thousand)) {
                (Some(a), Some(b)) => t.push(measured(
                    SCALE_RPS.into(),
                    b / a.max(1e-9),
                    SCALE_RATIO,
                    true,
                    format!("{b:.0} / {a:.0} requests/s, scale.json"),
                )),
                _ => t.push(not_measured(
                    SCALE_RPS.into(),
                    SCALE_RATIO,
                    true,
                    "not measured: scale.json lacks the load at 100 or 1,000 instances".into(),
                )),
            }
            match thousand.as_ref().and_then(|p| p["ready_s"].as_f64()) {
                Some(s) => t.push(measured(
                    SCALE_READY.into(),
                    s,
                    SCALE_READY_S,
                    false,
                    "s, spawn to the ready line, scale.json".into(),
                )),
                None => t.push(not_measured(
                    SCALE_READY.into(),
                    SCALE_READY_S,
                    false,
                    "not measured: scale.json has no ready time at 1,000 instances".into(),
                )),
            }
        }
        None => {
            for (name, bound, at_least) in [
                (SCALE_RPS, SCALE_RATIO, true),
                (SCALE_READY, SCALE_READY_S, false),
            ] {
                t.push(not_measured(
                    name.into(),
                    bound,
                    at_least,
                    "not run in this run (the scale step of `cargo xtask bench`)".into(),
                ));
            }
        }
    }
    t
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::cores::{CoresRun, OneClient, RatePoint, GO_CHAIN};

    fn run(system: &str, cores: usize, rps: f64, cpu: f64) -> CoresRun {
        CoresRun {
            system: system.into(),
            cores,
            round: 1,
            connections: 32,
            rps,
            requests: 1,
            errors: 0,
            p50_us: 1.0,
            p99_us: 1.0,
            cpu_s: BTreeMap::new(),
            cpu_us_per_request: cpu,
            loadgen_cpu_s: 0.0,
        }
    }

    fn one(system: &str, cores: usize, p50: f64) -> OneClient {
        OneClient {
            system: system.into(),
            cores,
            p50_us: p50,
            p99_us: 2.0 * p50,
            requests: 10,
            errors: 0,
        }
    }

    fn rate(fraction: f64, gateway: f64) -> RatePoint {
        RatePoint {
            fraction,
            rate: 1000.0 * fraction,
            rps: 1000.0 * fraction,
            errors: 0,
            p50_us: 1.0,
            p99_us: 1.0,
            gateway_cpu_us_per_request: gateway,
            system_cpu_us_per_request: 2.0 * gateway,
        }
    }

    fn find<'a>(t: &'a [Target], name: &str) -> &'a Target {
        t.iter()
            .find(|t| t.name.starts_with(name))
            .unwrap_or_else(|| panic!("no row {name}: {t:#?}"))
    }

    /// A 2-CPU machine: 1 core against 1 core measured, every other count said to need
    /// more CPUs, no row missing.
    #[test]
    fn on_two_cpus_one_core_is_judged_and_the_rest_needs_more_cpus() {
        let c = Cores {
            counts: vec![1],
            online: 2,
            runs: vec![
                run(ZEROHOP, 1, 110.0, 10.0),
                run(HYPER, 1, 100.0, 10.0),
                run(GO, 1, 100.0, 12.0),
                run(GO_CHAIN, 1, 30.0, 40.0),
            ],
            one_client: vec![one(ZEROHOP, 1, 40.0), one(HYPER, 1, 25.0)],
            rate_cores: 1,
            rates: vec![
                rate(0.05, 12.0),
                rate(0.25, 10.0),
                rate(0.5, 10.0),
                rate(1.0, 11.0),
            ],
            ..Cores::default()
        };
        let t = cores_targets(Some(&c), 2);
        // 4 counts x (hyper, Go, CPU) + 3 scaling + 2 one-client + 1 gateway.
        assert_eq!(t.len(), 18, "{t:#?}");
        let r = find(
            &t,
            "zerohop RPS / hyper monolith RPS on 1 core(s) (1 core against 1 core)",
        );
        assert!(r.measured && r.met && (r.value - 1.1).abs() < 1e-9, "{r:?}");
        let g = find(&t, "zerohop RPS / Go monolith RPS on 1 core");
        assert!(g.measured && !g.met, "1.1 < 1.15: {g:?}");
        assert!(find(&t, "zerohop CPU per request / hyper monolith's on 1 core").met);
        for n in [2, 4, 8] {
            let r = find(&t, &format!("zerohop RPS / hyper monolith RPS on {n} core"));
            assert!(!r.measured && !r.met && r.value.is_nan(), "{r:?}");
            assert!(
                r.note.starts_with(&format!(
                    "not measured on this machine: needs {} CPUs",
                    2 * n
                )),
                "{r:?}"
            );
            let s = find(&t, &format!("zerohop scaling: RPS on {n} cores"));
            assert!(!s.measured && s.target == scaling_bound(n).unwrap());
        }
        let idle = find(
            &t,
            "one client: zerohop p50 / hyper monolith p50, idle cores",
        );
        assert!(
            !idle.measured && idle.note.contains("needs 4 CPUs"),
            "{idle:?}"
        );
        let lone = find(
            &t,
            "one client: zerohop p50 / hyper monolith p50, on one core",
        );
        assert!(
            lone.measured && !lone.met && (lone.value - 1.6).abs() < 1e-9,
            "{lone:?}"
        );
        let flat = find(&t, "gateway CPU per request");
        assert!(
            flat.measured && (flat.value - 1.2).abs() < 1e-9 && !flat.met,
            "{flat:?}"
        );
    }

    #[test]
    fn a_machine_with_the_cores_gets_scaling_and_idle_core_rows() {
        let c = Cores {
            counts: vec![1, 2],
            online: 4,
            runs: vec![
                run(ZEROHOP, 1, 100.0, 10.0),
                run(HYPER, 1, 100.0, 10.0),
                run(ZEROHOP, 2, 190.0, 10.0),
                run(HYPER, 2, 170.0, 10.0),
            ],
            one_client: vec![one(ZEROHOP, 2, 22.0), one(HYPER, 2, 20.0)],
            ..Cores::default()
        };
        let t = cores_targets(Some(&c), 4);
        let s = find(&t, "zerohop scaling: RPS on 2 cores");
        assert!(s.measured && s.met && (s.value - 1.9).abs() < 1e-9, "{s:?}");
        assert!(s.note.contains("1.70x"), "{s:?}");
        let go = find(&t, "zerohop RPS / Go monolith RPS on 2 core");
        assert!(
            !go.measured && go.note.contains("go-monolith did not run"),
            "{go:?}"
        );
        let four = find(&t, "zerohop scaling: RPS on 4 cores");
        assert!(four.note.contains("needs 8 CPUs"), "{four:?}");
        let idle = find(
            &t,
            "one client: zerohop p50 / hyper monolith p50, idle cores",
        );
        assert!(idle.measured && idle.met, "{idle:?}");
        assert!(!find(&t, "gateway CPU per request").measured);
        // Without the point at all: every row there, none measured, the reason given.
        let none = cores_targets(None, 64);
        assert_eq!(none.len(), 18);
        assert!(none
            .iter()
            .all(|t| !t.measured && t.note.contains("--cores 0")));
    }

    #[test]
    fn step_rows_count_only_files_of_this_run() {
        let started = 1000;
        let activation = serde_json::json!({
            "machine": { "started_unix": 1200 },
            "futex_floor": { "wake_median_us": 21.5 },
            "parked": { "activation_us": { "n": 30, "median": 45.0 } }
        });
        let scale = serde_json::json!({
            "machine": { "started_unix": 1100 },
            "points": [
                { "instances": 10, "ready_s": 0.05, "load": { "rps": 40000.0 } },
                { "instances": 100, "ready_s": 0.3, "load": { "rps": 5000.0 } },
                { "instances": 1000, "ready_s": 1.5, "load": { "rps": 4500.0 } }
            ]
        });
        let t = step_targets(started, Some(&activation), Some(&scale));
        assert_eq!(t.len(), 3);
        let a = find(&t, ACTIVATION);
        assert!(
            a.measured && !a.met && a.value == 45.0 && a.note.contains("21.5 us"),
            "{a:?}"
        );
        let r = find(&t, SCALE_RPS);
        assert!(r.measured && r.met && (r.value - 0.9).abs() < 1e-9, "{r:?}");
        let ready = find(&t, SCALE_READY);
        assert!(
            ready.measured && ready.met && ready.value == 1.5,
            "{ready:?}"
        );
        // Files from an earlier run, or none: every row there, not measured.
        for t in [
            step_targets(5000, Some(&activation), Some(&scale)),
            step_targets(started, None, None),
        ] {
            assert_eq!(
                t.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(),
                STEP_ROWS
            );
            assert!(t
                .iter()
                .all(|t| !t.measured && t.note.starts_with("not run in this run")));
        }
    }
}
