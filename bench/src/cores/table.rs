//! The multi-core point's tables (pure functions of what it measured): RPS of each system
//! per core count as the mean of its rounds, the ratios and the scaling the issue states its
//! goals in, one client, and the gateway's CPU against the rate.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::{Cores, CoresRun, GO, GO_CHAIN, HYPER, ZEROHOP};
use crate::report::Table;

/// The rounds of one core count, averaged.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Row {
    /// Cores each system had.
    pub cores: usize,
    /// Mean RPS over the rounds, by system.
    pub rps: BTreeMap<String, f64>,
    /// RPS of each round, in round order, by system.
    pub rounds: BTreeMap<String, Vec<f64>>,
    /// Mean CPU microseconds per request over the rounds, by system.
    pub cpu_us: BTreeMap<String, f64>,
}

impl Row {
    /// `a`'s mean RPS over `b`'s, when both ran.
    pub fn rps_ratio(&self, a: &str, b: &str) -> Option<f64> {
        ratio(self.rps.get(a)?, self.rps.get(b)?)
    }

    /// `a`'s mean CPU per request over `b`'s, when both ran.
    pub fn cpu_ratio(&self, a: &str, b: &str) -> Option<f64> {
        ratio(self.cpu_us.get(a)?, self.cpu_us.get(b)?)
    }
}

fn ratio(a: &f64, b: &f64) -> Option<f64> {
    (*b > 0.0).then(|| a / b)
}

/// One row per core count, in increasing order; a round that answered nothing right still
/// counts (as 0), so a failing system does not look fast.
pub fn rows(runs: &[CoresRun]) -> Vec<Row> {
    let mut by_cores: BTreeMap<usize, Row> = BTreeMap::new();
    for r in runs {
        let row = by_cores.entry(r.cores).or_insert_with(|| Row {
            cores: r.cores,
            ..Row::default()
        });
        row.rounds.entry(r.system.clone()).or_default().push(r.rps);
    }
    for row in by_cores.values_mut() {
        for (system, rounds) in &row.rounds {
            let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
            row.rps.insert(system.clone(), mean(rounds));
            let cpu: Vec<f64> = runs
                .iter()
                .filter(|r| r.cores == row.cores && &r.system == system)
                .map(|r| r.cpu_us_per_request)
                .collect();
            row.cpu_us.insert(system.clone(), mean(&cpu));
        }
    }
    by_cores.into_values().collect()
}

/// `system`'s mean RPS on `n` cores over its RPS on 1 core.
pub fn scaling(rows: &[Row], system: &str, n: usize) -> Option<f64> {
    let at = |c: usize| rows.iter().find(|r| r.cores == c)?.rps.get(system).copied();
    ratio(&at(n)?, &at(1)?)
}

/// The point's section of `summary.md`.
pub fn markdown(c: &Cores) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "## Cores: every system on the same N cores (hello, 100 B)\n\n{}\n\nLoad: {}; {} \
         interleaved round(s) of {:.0} s; RPS is the mean of the rounds (each round in \
         brackets). zerohop-ring runs N gateway threads and N instances of each function, \
         a pipeline per core (`cpus`); hyper-monolith is one process on tokio's \
         multi-threaded runtime with N workers; the Go programs run with GOMAXPROCS=N. CPU per request is every process of the system \
         (load generator apart), from schedstat.\n",
        c.pinning, c.load_generator, c.rounds, c.seconds_per_point
    );
    let rows = rows(&c.runs);
    let mut t = Table::new(&[
        "cores",
        "zerohop RPS",
        "hyper monolith",
        "Go monolith",
        "Go HTTP chain",
        "zerohop / hyper",
        "zerohop / Go",
        "scaling zerohop",
        "scaling hyper",
        "CPU per request / hyper",
    ]);
    let x = |v: Option<f64>| v.map_or_else(|| "-".into(), |v| format!("{v:.2}"));
    for row in &rows {
        let rps = |sys: &str| match (row.rps.get(sys), row.rounds.get(sys)) {
            (Some(mean), Some(rounds)) if rounds.len() > 1 => format!(
                "{mean:.0} ({})",
                rounds
                    .iter()
                    .map(|r| format!("{r:.0}"))
                    .collect::<Vec<_>>()
                    .join(" / ")
            ),
            (Some(mean), _) => format!("{mean:.0}"),
            _ => "not run".into(),
        };
        t.row(&[
            if row.cores == 1 && c.counts.len() == 1 {
                "1 (1 core against 1 core)".into()
            } else {
                row.cores.to_string()
            },
            rps(ZEROHOP),
            rps(HYPER),
            rps(GO),
            rps(GO_CHAIN),
            x(row.rps_ratio(ZEROHOP, HYPER)),
            x(row.rps_ratio(ZEROHOP, GO)),
            x(scaling(&rows, ZEROHOP, row.cores)),
            x(scaling(&rows, HYPER, row.cores)),
            x(row.cpu_ratio(ZEROHOP, HYPER)),
        ]);
    }
    let _ = writeln!(s, "{t}");
    let mut cpu = Table::new(&["cores", "system", "CPU us per request", "p50 us", "p99 us"]);
    for row in &rows {
        for (system, us) in &row.cpu_us {
            let lat = |f: fn(&CoresRun) -> f64| {
                let v: Vec<f64> = c
                    .runs
                    .iter()
                    .filter(|r| r.cores == row.cores && &r.system == system)
                    .map(f)
                    .collect();
                format!("{:.0}", v.iter().sum::<f64>() / v.len().max(1) as f64)
            };
            cpu.row(&[
                row.cores.to_string(),
                system.clone(),
                format!("{us:.1}"),
                lat(|r| r.p50_us),
                lat(|r| r.p99_us),
            ]);
        }
    }
    let _ = writeln!(s, "Under that load (means of the rounds):\n\n{cpu}");
    if !c.one_client.is_empty() {
        let _ = writeln!(
            s,
            "One client (one connection, zerohop-bench's load generator on one core of its own; \
             a system on 1 core has one core, on more it has idle cores):\n"
        );
        let mut t = Table::new(&[
            "system",
            "cores",
            "p50 us",
            "p99 us",
            "p50 / hyper",
            "p99 / hyper",
        ]);
        for o in &c.one_client {
            let hyper = c
                .one_client
                .iter()
                .find(|h| h.system == HYPER && h.cores == o.cores);
            let r = |a: f64, b: Option<f64>| x(b.and_then(|b| ratio(&a, &b)));
            t.row(&[
                o.system.clone(),
                o.cores.to_string(),
                format!("{:.0}", o.p50_us),
                format!("{:.0}", o.p99_us),
                r(o.p50_us, hyper.map(|h| h.p50_us)),
                r(o.p99_us, hyper.map(|h| h.p99_us)),
            ]);
        }
        let _ = writeln!(s, "{t}");
    }
    if !c.rates.is_empty() {
        let _ = writeln!(
            s,
            "Gateway CPU against the rate: zerohop-ring on {} core(s), open loop at fractions of \
             its peak (the mean of its rounds there), latency from each request's intended send \
             time:\n",
            c.rate_cores
        );
        let mut t = Table::new(&[
            "of peak",
            "rate /s",
            "answered /s",
            "p50 us",
            "p99 us",
            "gateway CPU us / request",
            "system CPU us / request",
            "errors",
        ]);
        for r in &c.rates {
            t.row(&[
                format!("{:.0}%", r.fraction * 100.0),
                format!("{:.0}", r.rate),
                format!("{:.0}", r.rps),
                format!("{:.0}", r.p50_us),
                format!("{:.0}", r.p99_us),
                format!("{:.1}", r.gateway_cpu_us_per_request),
                format!("{:.1}", r.system_cpu_us_per_request),
                r.errors.to_string(),
            ]);
        }
        let _ = writeln!(s, "{t}");
    }
    if !c.failures.is_empty() {
        let _ = writeln!(s, "Not run or failed in this point:\n");
        for f in &c.failures {
            let _ = writeln!(s, "- {f}");
        }
        let _ = writeln!(s);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(system: &str, cores: usize, round: usize, rps: f64, cpu: f64) -> CoresRun {
        CoresRun {
            system: system.into(),
            cores,
            round,
            connections: 32 * cores,
            rps,
            requests: rps as u64,
            errors: 0,
            p50_us: 100.0,
            p99_us: 200.0,
            cpu_s: BTreeMap::new(),
            cpu_us_per_request: cpu,
            loadgen_cpu_s: 0.0,
        }
    }

    #[test]
    fn rows_average_the_rounds_and_scaling_is_against_one_core() {
        let runs = [
            run(ZEROHOP, 1, 1, 100.0, 10.0),
            run(HYPER, 1, 1, 110.0, 9.0),
            run(ZEROHOP, 1, 2, 120.0, 12.0),
            run(HYPER, 1, 2, 90.0, 11.0),
            run(ZEROHOP, 2, 1, 200.0, 10.0),
            run(HYPER, 2, 1, 150.0, 10.0),
        ];
        let rows = rows(&runs);
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].rps[ZEROHOP], 110.0);
        assert_eq!(rows[0].rounds[ZEROHOP], [100.0, 120.0]);
        assert_eq!(rows[0].rps_ratio(ZEROHOP, HYPER), Some(1.1));
        assert_eq!(rows[0].cpu_ratio(ZEROHOP, HYPER), Some(1.1));
        assert_eq!(rows[0].rps_ratio(ZEROHOP, GO), None);
        assert_eq!(scaling(&rows, ZEROHOP, 2), Some(200.0 / 110.0));
        assert_eq!(scaling(&rows, HYPER, 2), Some(1.5));
        assert_eq!(scaling(&rows, GO, 2), None);
        assert_eq!(scaling(&rows, ZEROHOP, 4), None);
    }

    #[test]
    fn the_table_has_a_row_per_core_count_and_says_what_did_not_run() {
        let c = Cores {
            counts: vec![1],
            rounds: 2,
            runs: vec![run(ZEROHOP, 1, 1, 100.0, 10.0), run(HYPER, 1, 1, 50.0, 5.0)],
            ..Cores::default()
        };
        let md = markdown(&c);
        assert!(
            md.contains("| 1 (1 core against 1 core) | 100 | 50 | not run | not run | 2.00 | - | 1.00 | 1.00 | 2.00 |"),
            "{md}"
        );
    }
}
