//! What the run reports: one row per language ([`Report`]), written as `languages.json`,
//! `languages.md` and a summary line.

use std::fmt::Write as _;

use serde::Serialize;
use zerohop_bench::procstat::disturbance::Disturbance;
use zerohop_bench::procstat::ticks_per_second;
use zerohop_bench::report::{Machine, Table};

use crate::language::Language;
use crate::measure::{Measured, Ratios, SETTLE};
use crate::prepare::{prepare, Function, Paths, Skip};

/// Cores used by others (processes outside the benchmark, steal) past which the report says
/// the run was disturbed: on a quiet machine both stay near zero.
pub(crate) const DISTURBED: f64 = 0.1;

/// Settings of the run, as used.
#[derive(Serialize, Debug)]
pub(crate) struct Settings {
    pub(crate) hops: usize,
    pub(crate) seconds_per_point: f64,
    pub(crate) rounds: usize,
    pub(crate) idle_seconds: f64,
    pub(crate) body_bytes: usize,
    pub(crate) concurrency: usize,
    pub(crate) gateway_threads: usize,
    pub(crate) warmup_seconds_per_route: f64,
    /// What was pinned where.
    pub(crate) pinning: String,
}

#[derive(Serialize, Debug, PartialEq, Eq, Clone, Copy)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Status {
    /// Measured (see `errors` for wrong or failed answers).
    Measured,
    /// Its toolchain or SDK is missing; `reason` says which and what provides it.
    NotRun,
    /// It should have run and did not; `reason` says why.
    Failed,
}

#[derive(Serialize, Debug)]
pub(crate) struct Row {
    pub(crate) language: Language,
    pub(crate) status: Status,
    pub(crate) reason: Option<String>,
    pub(crate) function: Option<Function>,
    pub(crate) result: Option<Measured>,
    pub(crate) ratio_to_rust: Ratios,
    /// Wrong or failed answers, instances that restarted.
    pub(crate) errors: Vec<String>,
}

impl Row {
    /// `language`'s row before it is measured: its function when it could be made runnable
    /// (status `failed` until measured), else why not.
    pub(crate) fn prepared(language: Language, paths: &Paths) -> Self {
        let mut row = Row {
            language,
            status: Status::Failed,
            reason: None,
            function: None,
            result: None,
            ratio_to_rust: Ratios::default(),
            errors: Vec::new(),
        };
        let name = language.name();
        match prepare(language, paths) {
            Ok(f) => row.function = Some(f),
            Err(Skip::NotRun(why)) => {
                eprintln!("zerohop-bench-languages: {name}: not run: {why}");
                row.status = Status::NotRun;
                row.reason = Some(why);
            }
            Err(Skip::Failed(e)) => {
                eprintln!("zerohop-bench-languages: {name}: failed: {e:#}");
                row.reason = Some(format!("{e:#}"));
            }
        }
        row
    }
}

#[derive(Serialize, Debug)]
pub(crate) struct Report {
    pub(crate) machine: Machine,
    /// The load averages when the run began (a busy machine lengthens everything).
    pub(crate) loadavg_before: String,
    pub(crate) settings: Settings,
    pub(crate) reference: Language,
    pub(crate) languages: Vec<Row>,
    /// What else ran on the machine during the points.
    pub(crate) disturbance: Disturbance,
    pub(crate) ok: bool,
}

pub(crate) fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

pub(crate) fn times(r: Option<f64>) -> String {
    r.map_or_else(|| "-".into(), |r| format!("{r:.2}"))
}

pub(crate) fn summary_line(r: &Report) -> String {
    let parts: Vec<String> = r
        .languages
        .iter()
        .map(|row| match (&row.status, &row.result) {
            (Status::Measured, Some(m)) => match row.ratio_to_rust.per_hop_p50 {
                Some(x) if row.language != Language::Rust => {
                    format!(
                        "{} {:.1} us ({x:.2}x)",
                        row.language.name(),
                        m.per_hop_p50_us
                    )
                }
                _ => format!("{} {:.1} us", row.language.name(), m.per_hop_p50_us),
            },
            (Status::NotRun, _) => format!("{} not run", row.language.name()),
            _ => format!("{} failed", row.language.name()),
        })
        .collect();
    format!("languages: per-hop p50 {}", parts.join(", "))
}

pub(crate) fn markdown(r: &Report) -> String {
    let k = r.settings.hops;
    let mut s = String::new();
    let _ = writeln!(s, "# Functions in each language: what a hop costs\n");
    let mut main = Table::new(&[
        "language".to_owned(),
        "per-hop p50 (us)".into(),
        "/ Rust".into(),
        "per-hop mean (us)".into(),
        format!("p99, 1 / {k} fns (us)"),
        "fn CPU per hop (us)".into(),
        "/ Rust".into(),
        format!("idle CPU, {k} instances (ms/s)"),
        "idle wakeups/s".into(),
        "idle RSS (MiB)".into(),
        "Pss / private (MiB)".into(),
        "threads".into(),
    ]);
    for row in &r.languages {
        let title = row.language.title();
        match (&row.status, &row.result) {
            (Status::Measured, Some(m)) => {
                let rollup = match (m.memory.pss_kib, m.memory.private_kib) {
                    (Some(pss), Some(private)) => format!("{:.1} / {:.1}", mib(pss), mib(private)),
                    _ => "unreadable".into(),
                };
                main.row(&[
                    title.to_owned(),
                    format!("**{:.1}**", m.per_hop_p50_us),
                    times(row.ratio_to_rust.per_hop_p50),
                    format!("{:.1}", m.per_hop_mean_us),
                    format!("{:.0} / {:.0}", m.one.p99_us, m.chain.p99_us),
                    format!("{:.1}", m.fn_cpu_us_per_hop),
                    times(row.ratio_to_rust.fn_cpu_per_hop),
                    format!("{:.2}", m.idle.cpu_ms_per_s),
                    format!("{:.1}", m.idle.wakeups_per_s),
                    format!("{:.1}", mib(m.memory.vm_rss_kib)),
                    rollup,
                    m.memory.threads.to_string(),
                ]);
            }
            (status, _) => {
                let what = if *status == Status::NotRun {
                    "not run"
                } else {
                    "failed"
                };
                let reason = row.reason.as_deref().unwrap_or("see errors");
                main.spanning_row(title, &format!("{what}: {reason}"));
            }
        }
    }
    let mut more = Table::new(&[
        "language".to_owned(),
        format!("p50, 1 / {k} fns (us)"),
        format!("mean, 1 / {k} fns (us)"),
        format!("RPS, 1 / {k} fns"),
        "per-hop p50 by round (us)".into(),
        format!("fn CPU per request, 1 / {k} fns (us)"),
        format!("zerohop up CPU per request, {k} fns (us)"),
        "idle CPU from schedstat (us/s)".into(),
    ]);
    for row in &r.languages {
        if let Some(m) = &row.result {
            let rounds: Vec<String> = m
                .per_hop_p50_rounds_us
                .iter()
                .map(|v| format!("{v:.1}"))
                .collect();
            more.row(&[
                row.language.title().to_owned(),
                format!("{:.1} / {:.1}", m.one.p50_us, m.chain.p50_us),
                format!("{:.1} / {:.1}", m.one.mean_us, m.chain.mean_us),
                format!("{:.0} / {:.0}", m.one.rps, m.chain.rps),
                rounds.join(", "),
                format!(
                    "{:.1} / {:.1}",
                    m.one.fn_cpu_us_per_request, m.chain.fn_cpu_us_per_request
                ),
                format!("{:.1}", m.chain.zerohop_cpu_us_per_request),
                format!("{:.1}", m.idle.sched_cpu_us_per_s),
            ]);
        }
    }
    let _ = write!(s, "{main}\n{more}");
    let st = &r.settings;
    let _ = writeln!(
        s,
        "\n## How measured\n\nFor each language, the real `zerohop up` (one gateway thread, \
         ring transport; {}) runs {k} pass-through functions of that language, \
         `p1`..`p{k}`, one instance each, with two routes of the same shape: `POST /one` \
         through `[p1]` and `POST /chain` through all {k}. Each function reads the first byte \
         of the body where the gateway wrote it (no copy) and sends the body on unchanged \
         (`bench/languages/`). The bench's load generator (hyper, keep-alive, {} B bodies, \
         every answer checked) drives each route in a closed loop at concurrency 1, {:.0} s \
         per point after a {:.1} s warm-up per route, in {} rounds; every language's chain \
         is up at once and the languages take turns within each round (each round starting \
         with another one, the routes' order alternating), so that a disturbance falls on \
         all alike. p50, mean and p99 are medians over the rounds. Per-hop = (p50({k}) - \
         p50(1)) / {}; the ratio is to Rust's from this run. CPU is `utime + stime` of the \
         instances' `/proc/PID/stat` over the points (clock ticks of {:.0} ms); per hop is \
         the {k} instances' CPU per request of `/chain` over {k}. Idle: {:.1} s with no \
         traffic after {:.1} s of quiet, every chain up, CPU of each language's {k} instances \
         (ticks; the second table has the same from the threads' `schedstat` in ns) and how often their threads were \
         switched in. RSS: `VmRSS` of `p1` after it served both routes and the idle window; \
         Pss and private memory from `smaps_rollup`. On a small VM with steal time, \
         compare ratios within one run, not absolute numbers across runs.\n",
        st.pinning,
        st.body_bytes,
        st.seconds_per_point,
        st.warmup_seconds_per_route,
        st.rounds,
        k - 1,
        1e3 / ticks_per_second(),
        st.idle_seconds,
        SETTLE.as_secs_f64()
    );
    let _ = writeln!(s, "Functions:\n");
    for row in &r.languages {
        if let Some(f) = &row.function {
            let _ = writeln!(
                s,
                "- {}: `{}`; {}",
                row.language.title(),
                f.command.join(" "),
                f.built
            );
        }
    }
    let m = &r.machine;
    let _ = writeln!(
        s,
        "\nMachine: {} cores, {}, {:.1} GiB, kernel {}; load average before the run: {}.",
        m.cores,
        m.cpu_model,
        m.mem_kib as f64 / (1024.0 * 1024.0),
        m.kernel,
        r.loadavg_before
    );
    let d = &r.disturbance;
    let _ = writeln!(
        s,
        "While the points ran ({:.0} s), this benchmark used {:.2} cores, other processes \
         {:.2} and the host took {:.2} from this VM (steal){}",
        d.seconds,
        d.own_cores,
        d.other_cores,
        d.steal_cores,
        if d.exceeds(DISTURBED) {
            ": **the run was disturbed**, its numbers are not to be trusted; run it on a quiet \
             machine."
        } else {
            "."
        }
    );
    let errors: Vec<String> = r
        .languages
        .iter()
        .flat_map(|row| {
            row.errors
                .iter()
                .map(move |e| format!("{}: {e}", row.language.title()))
        })
        .collect();
    if !errors.is_empty() {
        let _ = writeln!(s, "\nErrors:\n");
        for e in errors {
            let _ = writeln!(s, "- {e}");
        }
    }
    s
}
