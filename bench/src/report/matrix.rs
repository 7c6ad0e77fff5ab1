//! The results of one run of the matrix (`zerohop-bench`): `results.json` (every figure)
//! and `summary.md` (tables with ratios against the baselines, and the targets met or
//! missed, said plainly).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result};

use super::goals::{self, STEP_ROWS};
use super::{Machine, Table};
use crate::cores::Cores;
use crate::floors::Floor;
use crate::loadgen::RunResult;
use crate::protocols::Protocols;

/// One load run of one system.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Run {
    /// System name (`zerohop-ring`, `monolith`, ...).
    pub system: String,
    /// Which experiment: `concurrency`, `body`, `chain_length`, `open_loop` (the multi-core
    /// point has its own records, [`Cores`]).
    pub experiment: String,
    /// Functions of the chain.
    pub chain: Vec<String>,
    /// Number of functions.
    pub chain_len: usize,
    /// Body label (`100B`, `10KB`, `1MiB`, `mix`).
    pub body: String,
    /// `closed` or `open`.
    pub mode: String,
    /// Connections.
    pub concurrency: usize,
    /// Open loop: requests per second asked for.
    pub rate: Option<f64>,
    /// What the load generator measured.
    pub result: RunResult,
    /// CPU seconds per component over the measured window (and warm-up), `loadgen` apart.
    pub cpu_s: BTreeMap<String, f64>,
    /// CPU milliseconds per 1,000 correct answers, per component.
    pub cpu_ms_per_1k: BTreeMap<String, f64>,
    /// CPU milliseconds per 1,000 answers of the system under test (load generator
    /// excluded).
    pub sut_cpu_ms_per_1k: f64,
    /// Open loop: the p99 of each repeated run of this point, in the order run; this run
    /// is the one with the median p99.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub p99_repeats_us: Vec<f64>,
}

/// CPU of a system with everything up and no traffic.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Idle {
    /// System name.
    pub system: String,
    /// Length of the idle window.
    pub seconds: f64,
    /// CPU seconds per component.
    pub cpu_s: BTreeMap<String, f64>,
    /// All components together, as a fraction of one core.
    pub core_fraction: f64,
}

/// Resident memory of one component after the load.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Memory {
    /// System name.
    pub system: String,
    /// Component name.
    pub component: String,
    /// VmRSS in KiB.
    pub rss_kib: u64,
    /// Of which shared memory (pool, rings) in KiB.
    pub shmem_kib: u64,
}

/// One of the targets, met or not, or not measured (and why, in the note).
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Target {
    /// What is compared.
    pub name: String,
    /// Measured value (NaN, `null` in JSON, when not measured).
    #[serde(deserialize_with = "nan_if_null")]
    pub value: f64,
    /// The bound.
    pub target: f64,
    /// Whether the value must reach the bound (else stay under it).
    pub at_least: bool,
    /// Whether it was met (false when not measured).
    pub met: bool,
    /// Whether it was measured in this run; when not, the note says why.
    pub measured: bool,
    /// How the value was computed, or why it was not.
    pub note: String,
}

/// A number that JSON holds as `null` when it was NaN (as serde_json writes NaN).
fn nan_if_null<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    let v: Option<f64> = serde::Deserialize::deserialize(d)?;
    Ok(v.unwrap_or(f64::NAN))
}

/// Everything one run produced.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Results {
    /// The machine.
    pub machine: Machine,
    /// `quick`, `full` or `smoke`.
    pub matrix: String,
    /// What was pinned where.
    pub pinning: String,
    /// The multi-core point (issue 33; `None` when it did not run).
    pub cores: Option<Cores>,
    /// Seconds of measurement per load point (after warm-up).
    pub seconds_per_point: f64,
    /// Physical floors and transport hops.
    pub floors: Vec<Floor>,
    /// Load runs.
    pub runs: Vec<Run>,
    /// Idle CPU per system.
    pub idle: Vec<Idle>,
    /// Memory per component.
    pub memory: Vec<Memory>,
    /// The targets.
    pub targets: Vec<Target>,
    /// Systems or points that could not run, and why.
    pub failures: Vec<String>,
    /// The HTTPS and HTTP/2 rows (h2load), with their ratios.
    pub protocols: Protocols,
}

impl Results {
    /// The closed-loop hello-chain run of `system` at `concurrency` with 100 B bodies.
    pub fn hello_point(&self, system: &str, concurrency: usize) -> Option<&Run> {
        self.runs.iter().find(|r| {
            r.system == system
                && r.experiment == "concurrency"
                && r.concurrency == concurrency
                && r.body == "100B"
        })
    }

    /// Concurrency the targets are read at: 32, or the largest measured.
    pub fn target_concurrency(&self) -> usize {
        let cs: Vec<usize> = self
            .runs
            .iter()
            .filter(|r| r.experiment == "concurrency")
            .map(|r| r.concurrency)
            .collect();
        if cs.contains(&32) {
            32
        } else {
            cs.into_iter().max().unwrap_or(32)
        }
    }

    /// Works out the targets from the runs and floors.
    pub fn evaluate_targets(&mut self) {
        let mut t = Vec::new();
        // The point is concurrency 32; a matrix without it uses its largest.
        let c = self.target_concurrency();
        let ring = self.hello_point("zerohop-ring", c);
        let mono = self.hello_point("monolith", c);
        let http = self.hello_point("http-chain", c);
        let mut bound = |name: String, v: f64, target: f64, at_least: bool, note: String| {
            t.push(goals::measured(name, v, target, at_least, note))
        };
        if let (Some(r), Some(m)) = (ring, mono) {
            let (v, note) = rps_ratio(r, m);
            bound(
                format!("ring RPS / monolith RPS (hello, c={c})"),
                v,
                0.9,
                true,
                note,
            );
            let (v, note) = cpu_ratio(r, m);
            bound(
                format!("ring CPU per request / monolith CPU per request (hello, c={c})"),
                v,
                1.15,
                false,
                note,
            );
        }
        if let (Some(r), Some(m)) = (
            self.hello_point("zerohop-ring", 1),
            self.hello_point("monolith", 1),
        ) {
            bound(
                "ring p50 latency / monolith p50 latency (hello, c=1)".into(),
                r.result.latency.p50_us / m.result.latency.p50_us.max(1e-9),
                1.15,
                false,
                format!(
                    "{:.0} us / {:.0} us",
                    r.result.latency.p50_us, m.result.latency.p50_us
                ),
            );
        }
        let open = |sys: &str| -> Vec<&Run> {
            self.runs
                .iter()
                .filter(|r| r.system == sys && r.experiment == "open_loop")
                .collect()
        };
        let mut open_pairs = 0;
        for (r, m) in open("zerohop-ring").into_iter().zip(open("monolith")) {
            if r.rate != m.rate {
                continue;
            }
            open_pairs += 1;
            bound(
                format!(
                    "ring p99 / monolith p99, open loop at {:.0} requests/s",
                    r.rate.unwrap_or(0.0)
                ),
                r.result.latency.p99_us / m.result.latency.p99_us.max(1e-9),
                1.5,
                false,
                format!(
                    "{:.0} us / {:.0} us (the same rate, a fraction of the monolith's peak){}",
                    r.result.latency.p99_us,
                    m.result.latency.p99_us,
                    repeats(r, m)
                ),
            );
        }
        let chain = |n: usize| {
            self.runs.iter().find(|r| {
                r.system == "zerohop-ring" && r.experiment == "chain_length" && r.chain_len == n
            })
        };
        if let (Some(one), Some(eight)) = (chain(1), chain(8)) {
            let (v, note) = rps_ratio(eight, one);
            bound(
                "ring chain of 8 pass-through functions RPS / chain of 1 RPS".into(),
                v,
                0.6,
                true,
                note,
            );
        }
        let big = |sys: &str| {
            self.runs
                .iter()
                .find(|r| r.system == sys && r.experiment == "body" && r.body == "1MiB")
        };
        if let (Some(r), Some(m)) = (big("zerohop-ring"), big("monolith")) {
            let (v, note) = rps_ratio(r, m);
            bound(
                format!(
                    "ring RPS / monolith RPS (1 MiB bodies, c={})",
                    r.concurrency
                ),
                v,
                0.9,
                true,
                note,
            );
        }
        if let (Some(r), Some(h)) = (ring, http) {
            let (v, note) = rps_ratio(r, h);
            bound(
                format!("ring RPS / HTTP chain RPS (hello, c={c})"),
                v,
                3.0,
                true,
                note,
            );
            let (v, note) = cpu_ratio(r, h);
            bound(
                format!("ring CPU per request / HTTP chain CPU per request (hello, c={c})"),
                v,
                1.0 / 3.0,
                false,
                note,
            );
        }
        let floor = |n: &str| self.floors.iter().find(|f| f.name == n);
        if let (Some(hop), Some(line)) = (floor("hop_ring_busy_rtt"), floor("cacheline_rtt")) {
            bound(
                "ring hop p50 / cache-line ping-pong p50 (receiver busy)".into(),
                hop.p50_ns / line.p50_ns.max(1e-9),
                2.0,
                false,
                format!("{:.0} ns / {:.0} ns round trip", hop.p50_ns, line.p50_ns),
            );
        }
        if let Some(idle) = self.idle.iter().find(|i| i.system == "zerohop-ring") {
            let v: f64 = idle.cpu_s.values().sum();
            t.push(Target {
                name: "ring idle CPU seconds (everything up, no traffic)".into(),
                value: v,
                target: 0.0,
                at_least: false,
                // One 10 ms tick of slack: /proc counts in ticks.
                met: v <= 0.01,
                measured: true,
                note: format!("over {:.0} s", idle.seconds),
            });
        }
        if open_pairs == 0 {
            for f in [50, 80] {
                t.push(goals::not_measured(
                    format!("ring p99 / monolith p99, open loop at {f}% of the monolith's peak"),
                    1.5,
                    false,
                    "not run in this run: the hello matrix's open loop needs zerohop-ring and \
                     monolith"
                        .into(),
                ));
            }
        }
        t.extend(goals::cores_targets(
            self.cores.as_ref(),
            self.machine.cores,
        ));
        t.extend(goals::step_targets(self.machine.started_unix, None, None));
        self.targets = t;
    }

    /// Writes `results.json` and `summary.md` into `dir`.
    pub fn write(&self, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let json = serde_json::to_string_pretty(self).context("serialising results")?;
        std::fs::write(dir.join("results.json"), json).context("writing results.json")?;
        std::fs::write(dir.join("summary.md"), self.summary()).context("writing summary.md")?;
        Ok(())
    }

    /// The Markdown summary.
    pub fn summary(&self) -> String {
        let mut s = String::new();
        let m = &self.machine;
        let _ = writeln!(s, "# zerohop benchmark ({})\n", self.matrix);
        let _ = writeln!(
            s,
            "Machine: {} cores ({}), kernel {}, {} GiB. {}. {:.1} s measured per point after warm-up. \
             Every system is driven by the same load generator in the same run; ratios compare \
             systems measured minutes apart on the same machine.\n",
            m.cores,
            m.cpu_model,
            m.kernel,
            m.mem_kib >> 20,
            self.pinning,
            self.seconds_per_point
        );
        if !self.failures.is_empty() {
            let _ = writeln!(s, "## Could not run\n");
            for f in &self.failures {
                let _ = writeln!(s, "- {f}");
            }
            let _ = writeln!(s);
        }
        let _ = writeln!(s, "{TARGETS_HEADING}");
        let _ = writeln!(s, "{}", targets_table(&self.targets));
        self.summary_concurrency(&mut s);
        self.summary_experiment(&mut s, "body", "Body size (hello chain)", |r| {
            format!("{} c={}", r.body, r.concurrency)
        });
        self.summary_experiment(
            &mut s,
            "chain_length",
            "Chain length (pass-through functions, 100 B)",
            |r| format!("{} functions c={}", r.chain_len, r.concurrency),
        );
        self.summary_experiment(
            &mut s,
            "open_loop",
            "Open loop (hello, 100 B, constant rate)",
            |r| format!("{:.0}/s", r.rate.unwrap_or(0.0)),
        );
        if let Some(cores) = &self.cores {
            s.push_str(&crate::cores::table::markdown(cores));
        }
        self.summary_protocols(&mut s);
        if self.runs.is_empty() && self.floors.is_empty() {
            // `--cores-only`: the matrix did not run.
            return s;
        }
        let _ = writeln!(s, "## Idle (everything up, no traffic)\n");
        let mut idle = Table::new(&["system", "seconds", "CPU seconds", "share of one core"]);
        for i in &self.idle {
            idle.row(&[
                i.system.clone(),
                format!("{:.0}", i.seconds),
                format!("{:.2}", i.cpu_s.values().sum::<f64>()),
                format!("{:.2}%", i.core_fraction * 100.0),
            ]);
        }
        let _ = writeln!(s, "{idle}\n## Memory after the load (hello chain)\n");
        let mut memory = Table::new(&["system", "component", "RSS KiB", "of which shared KiB"]);
        for mm in &self.memory {
            memory.row(&[
                mm.system.clone(),
                mm.component.clone(),
                mm.rss_kib.to_string(),
                mm.shmem_kib.to_string(),
            ]);
        }
        let _ = writeln!(
            s,
            "{memory}\n## Floors of this machine and descriptor hops (round trips between two \
             processes)\n"
        );
        let mut floors = Table::new(&["measurement", "p50", "p99", "what"]);
        for f in &self.floors {
            let extra = f
                .gb_per_s
                .map(|g| format!(" ({g:.1} GB/s)"))
                .unwrap_or_default();
            floors.row(&[
                f.name.clone(),
                format!("{:.0} ns{extra}", f.p50_ns),
                format!("{:.0} ns", f.p99_ns),
                f.what.clone(),
            ]);
        }
        let _ = write!(s, "{floors}");
        s
    }

    fn summary_concurrency(&self, s: &mut String) {
        if !self.runs.iter().any(|r| r.experiment == "concurrency") {
            return;
        }
        let _ = writeln!(s, "## Hello chain, 100 B bodies, closed loop\n");
        let _ = writeln!(
            s,
            "Ratios: RPS against the monolith (upper bound) and against the HTTP microservice \
             chain; CPU is milliseconds of the system under test per 1,000 requests.\n"
        );
        let mut table = Table::new(&[
            "system",
            "concurrency",
            "RPS",
            "vs monolith",
            "vs http-chain",
            "p50 us",
            "p99 us",
            "p99.9 us",
            "CPU ms/1k",
            "errors",
        ]);
        for r in self.runs.iter().filter(|r| r.experiment == "concurrency") {
            let ratio = |sys: &str| {
                self.hello_point(sys, r.concurrency)
                    .map(|b| format!("{:.2}x", r.result.rps / b.result.rps.max(1e-9)))
                    .unwrap_or_else(|| "-".into())
            };
            table.row(&[
                r.system.clone(),
                r.concurrency.to_string(),
                format!("{:.0}", r.result.rps),
                ratio("monolith"),
                ratio("http-chain"),
                format!("{:.0}", r.result.latency.p50_us),
                format!("{:.0}", r.result.latency.p99_us),
                format!("{:.0}", r.result.latency.p999_us),
                format!("{:.1}", r.sut_cpu_ms_per_1k),
                (r.result.errors + r.result.wrong).to_string(),
            ]);
        }
        let _ = writeln!(s, "{table}");
    }

    fn summary_protocols(&self, s: &mut String) {
        let p = &self.protocols;
        if p.runs.is_empty() {
            return;
        }
        let _ = writeln!(
            s,
            "## HTTPS and HTTP/2 (hello, 100 B, h2load)\n\n\
             zerohop-ring over each protocol, and nginx terminating TLS (HTTP/1.1 and h2 by ALPN) \
             in front of the monolith over keep-alive HTTP/1.1. The same requests in flight at \
             every point: one per connection over HTTP/1.1, several streams per connection over \
             HTTP/2. CPU is milliseconds of the system per 1,000 requests (h2load apart). With \
             the matrix pinned, h2load has CPU 0 and the whole system CPU 1: the ratios say what \
             a protocol costs per request on one busy core, not how the gateway, the functions \
             or nginx would use more cores.\n"
        );
        let mut table = Table::new(&[
            "system",
            "protocol",
            "connections x streams",
            "RPS",
            "mean us",
            "CPU ms/1k",
            "h2load CPU ms/1k",
            "TLS",
            "fault",
        ]);
        for r in &p.runs {
            table.row(&[
                r.system.clone(),
                r.protocol.clone(),
                format!("{} x {}", r.connections, r.streams),
                format!("{:.0}", r.result.rps),
                format!("{:.0}", r.result.mean_us),
                format!("{:.1}", r.sut_cpu_ms_per_1k),
                format!(
                    "{:.1}",
                    r.cpu_ms_per_1k.get("loadgen").copied().unwrap_or(0.0)
                ),
                format!("{} {}", r.result.tls_version, r.result.cipher)
                    .trim()
                    .to_owned(),
                r.fault.clone().unwrap_or_else(|| "-".into()),
            ]);
        }
        let _ = writeln!(s, "{table}");
        let mut ratios = Table::new(&["ratio", "RPS", "CPU per request"]);
        for r in &p.ratios {
            ratios.row(&[
                r.name.clone(),
                format!("{:.2}x", r.rps),
                format!("{:.2}x", r.cpu_per_request),
            ]);
        }
        let _ = writeln!(s, "{ratios}");
    }

    fn summary_experiment(
        &self,
        s: &mut String,
        experiment: &str,
        title: &str,
        point: impl Fn(&Run) -> String,
    ) {
        let runs: Vec<&Run> = self
            .runs
            .iter()
            .filter(|r| r.experiment == experiment)
            .collect();
        if runs.is_empty() {
            return;
        }
        let _ = writeln!(s, "## {title}\n");
        let mut table = Table::new(&[
            "point",
            "system",
            "RPS",
            "vs http-chain",
            "p50 us",
            "p99 us",
            "p99.9 us",
            "CPU ms/1k",
            "errors",
        ]);
        for r in &runs {
            let base = runs.iter().find(|b| {
                b.system == "http-chain" && point(b) == point(r) && b.chain_len == r.chain_len
            });
            let ratio = base
                .map(|b| format!("{:.2}x", r.result.rps / b.result.rps.max(1e-9)))
                .unwrap_or_else(|| "-".into());
            table.row(&[
                point(r),
                r.system.clone(),
                format!("{:.0}", r.result.rps),
                ratio,
                format!("{:.0}", r.result.latency.p50_us),
                format!("{:.0}", r.result.latency.p99_us),
                format!("{:.0}", r.result.latency.p999_us),
                format!("{:.1}", r.sut_cpu_ms_per_1k),
                (r.result.errors + r.result.wrong).to_string(),
            ]);
        }
        let _ = writeln!(s, "{table}");
    }
}

/// The heading of the targets section of `summary.md`.
const TARGETS_HEADING: &str = "## Targets\n";

/// The targets as a Markdown table: measured, bound, met (or "not measured" and why).
pub fn targets_table(targets: &[Target]) -> Table {
    let mut table = Table::new(&["target", "measured", "bound", "met"]);
    for t in targets {
        let cmp = if t.at_least { ">=" } else { "<=" };
        table.row(&[
            t.name.clone(),
            if t.measured {
                format!("{:.3} ({})", t.value, t.note)
            } else {
                t.note.clone()
            },
            format!("{cmp} {:.3}", t.target),
            (if !t.measured {
                "not measured"
            } else if t.met {
                "yes"
            } else {
                "**NO**"
            })
            .to_owned(),
        ]);
    }
    table
}

/// After the steps that follow the matrix (`cargo xtask bench`): replaces the rows of
/// [`STEP_ROWS`] in `dir/results.json` and `dir/summary.md` by what `dir/activation.json` and
/// `dir/scale.json` hold, when this run wrote them (else they stay "not run in this run").
pub fn update_step_targets(dir: &Path) -> Result<()> {
    let path = dir.join("results.json");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let mut results: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    let started = results["machine"]["started_unix"].as_u64().unwrap_or(0);
    let read = |name: &str| -> Option<serde_json::Value> {
        serde_json::from_str(&std::fs::read_to_string(dir.join(name)).ok()?).ok()
    };
    let steps = goals::step_targets(
        started,
        read("activation.json").as_ref(),
        read("scale.json").as_ref(),
    );
    let mut targets: Vec<Target> = serde_json::from_value(results["targets"].take())
        .with_context(|| format!("the targets of {}", path.display()))?;
    targets.retain(|t| !STEP_ROWS.contains(&t.name.as_str()));
    targets.extend(steps);
    results["targets"] = serde_json::to_value(&targets).context("serialising the targets")?;
    std::fs::write(
        &path,
        serde_json::to_string_pretty(&results).context("serialising results")?,
    )
    .with_context(|| format!("writing {}", path.display()))?;
    let summary_path = dir.join("summary.md");
    let summary = std::fs::read_to_string(&summary_path)
        .with_context(|| format!("reading {}", summary_path.display()))?;
    let updated = splice_targets(&summary, &targets_table(&targets).to_string())
        .with_context(|| format!("no targets section in {}", summary_path.display()))?;
    std::fs::write(&summary_path, updated)
        .with_context(|| format!("writing {}", summary_path.display()))
}

/// `summary` with the table of its targets section replaced by `table`; `None` when it has
/// no such section.
fn splice_targets(summary: &str, table: &str) -> Option<String> {
    let start = summary.find(TARGETS_HEADING)? + TARGETS_HEADING.len() + 1;
    let end = summary[start..]
        .find("\n## ")
        .map_or(summary.len(), |i| start + i + 1);
    Some(format!("{}{table}\n{}", &summary[..start], &summary[end..]))
}

/// `; median of N runs each (p99s ring a/b/c us, monolith d/e/f us)` where the open-loop
/// point was repeated, else nothing.
fn repeats(ring: &Run, monolith: &Run) -> String {
    if ring.p99_repeats_us.is_empty() && monolith.p99_repeats_us.is_empty() {
        return String::new();
    }
    let list = |r: &Run| {
        r.p99_repeats_us
            .iter()
            .map(|p| format!("{p:.0}"))
            .collect::<Vec<_>>()
            .join("/")
    };
    format!(
        "; median of {} runs (p99 of each: ring {} us, monolith {} us)",
        ring.p99_repeats_us.len().max(monolith.p99_repeats_us.len()),
        list(ring),
        list(monolith)
    )
}

/// `a`'s requests per second over `b`'s, and the note saying both.
fn rps_ratio(a: &Run, b: &Run) -> (f64, String) {
    (
        a.result.rps / b.result.rps.max(1e-9),
        format!("{:.0} / {:.0} requests/s", a.result.rps, b.result.rps),
    )
}

/// `a`'s CPU per request over `b`'s (the system under test only), and the note saying both.
fn cpu_ratio(a: &Run, b: &Run) -> (f64, String) {
    (
        a.sut_cpu_ms_per_1k / b.sut_cpu_ms_per_1k.max(1e-9),
        format!(
            "{:.1} / {:.1} CPU ms per 1,000 requests, load generator excluded",
            a.sut_cpu_ms_per_1k, b.sut_cpu_ms_per_1k
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_targets_table_is_replaced_in_place_and_not_measured_rows_say_why() {
        let rows = [
            goals::measured("a".into(), 2.0, 1.0, true, "x".into()),
            goals::not_measured("b".into(), 30.0, false, "not run in this run".into()),
        ];
        let table = targets_table(&rows).to_string();
        assert!(
            table.contains("| a | 2.000 (x) | >= 1.000 | yes |"),
            "{table}"
        );
        assert!(
            table.contains("| b | not run in this run | <= 30.000 | not measured |"),
            "{table}"
        );
        let summary = format!("# t\n\n{TARGETS_HEADING}\n| old |\n|---|\n\n## Next\n\nrest\n");
        let spliced = splice_targets(&summary, &table).unwrap();
        assert_eq!(
            spliced,
            format!("# t\n\n{TARGETS_HEADING}\n{table}\n## Next\n\nrest\n")
        );
        assert_eq!(splice_targets("# no targets\n", &table), None);
        // NaN (not measured) goes out as null and comes back as NaN.
        let json = serde_json::to_string(&rows[1]).unwrap();
        assert!(json.contains("\"value\":null"), "{json}");
        let back: Target = serde_json::from_str(&json).unwrap();
        assert!(back.value.is_nan() && !back.measured);
    }
}
