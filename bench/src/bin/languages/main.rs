//! `zerohop-bench-languages`: what a hop costs when the function is written in Rust, C, Go,
//! Python or Node.js, all over the same runtime (`crates/zerohop-runtime`, reached through
//! each language's SDK).
//!
//! For each language the real `zerohop up` (one gateway thread) runs one chain of `--hops`
//! (K, default 5) pass-through functions of that language, `p1` .. `pK`, with two routes of
//! the same shape: `POST /one` through `[p1]` and `POST /chain` through `[p1, .., pK]`. Every
//! function is the same program (`bench/languages/`): it reads the first byte of the body
//! where the gateway wrote it (no copy) and sends the body on unchanged, so what differs
//! between languages is the SDK's crossing into the handler and back, and the language's
//! own runtime. Measured, per language:
//!
//! * **per-hop cost**: closed loop at concurrency 1 (the bench's load generator, hyper
//!   keep-alive, 100-byte bodies, every answer checked) on `/one` and `/chain`; per-hop =
//!   (p50(K) - p50(1)) / (K - 1) from the medians over `--rounds` rounds, and the same with
//!   the means; RPS; p99; CPU of the function instances per request and per hop (`utime +
//!   stime` of `/proc/PID/stat`), and of the `zerohop up` process (gateway and agent);
//! * **idle CPU**: with every chain up and no traffic for `--idle-seconds`, CPU of the K
//!   instances (clock ticks, and nanoseconds from `/proc/PID/task/TID/schedstat`) and how
//!   often their threads were switched in;
//! * **idle RSS**: `VmRSS` of `p1` (which served both routes) from `/proc/PID/status`, `Pss`
//!   and private memory from `/proc/PID/smaps_rollup`, and its threads.
//!
//! Every language's chain is up at once and the languages take turns within each round (each
//! round starting with another one, the routes' order alternating), so that a disturbance of
//! the machine falls on all of them alike; the CPU that other processes and the host (steal)
//! took while the points ran is reported beside the numbers, and a run where they took more
//! than a tenth of a core is called disturbed. As in `zerohop-bench`, on 2 or more CPUs the
//! load generator runs on CPU 0 and every chain on CPU 1 (`--no-pin` turns that off): a hop
//! is then a wake-up on the same core, and the numbers do not depend on where the scheduler
//! put each process (unpinned, the same point ran at 32 us in one round and 70 us in the
//! next). Rust is the reference: per-hop cost, CPU per hop and RSS are also given as a ratio
//! to Rust's from the same run. Trust ratios within one run, not absolute numbers.
//!
//! The binary builds what it needs (C with `cc` and `pkg-config` against the installed C SDK,
//! Go with `go build`, into `target/bench-languages/`) and checks the rest; a language whose
//! toolchain or SDK is missing is reported as "not run" with the command that provides it,
//! and the others run. `--quick` runs shorter points; `--out DIR` (default `results`)
//! receives `languages.md` and `languages.json`; the last line of stdout is the summary.
//! Exits 1 when a language failed or a run had wrong or failed answers (the report is still
//! written), 2 when it could not run at all.

#![forbid(unsafe_code)]

mod chain;
mod language;
mod measure;
mod output;
mod prepare;
mod spec;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use clap::Parser;
use zerohop_bench::loadgen::RunResult;
use zerohop_bench::procstat::disturbance::MachineTicks;
use zerohop_bench::procstat::{online_cpus, pin_current_thread};
use zerohop_bench::report::{self, Machine};

use crate::language::Language;
use crate::measure::{ratios, Idle, Plan, Ratios, Round, Up, CONCURRENCY, SETTLE};
use crate::output::{markdown, mib, summary_line, Report, Row, Settings, Status};
use crate::prepare::Paths;
use crate::spec::GATEWAY_THREADS;

#[derive(Parser, Debug)]
#[command(
    name = "zerohop-bench-languages",
    about = "Per-hop cost, idle CPU and idle memory of pass-through functions written in \
             Rust, C, Go, Python and Node.js, on the same runtime"
)]
struct Args {
    /// Shorter points (2 s, 2 rounds, 2 s idle) instead of 5 s, 3 rounds, 5 s idle.
    #[arg(long)]
    quick: bool,
    /// Where `languages.md` and `languages.json` go.
    #[arg(long, default_value = "results")]
    out: PathBuf,
    /// Languages to measure, comma separated (Rust, the reference, should be among them).
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = Language::ALL)]
    languages: Vec<Language>,
    /// Functions in the long chain (K); the short one has 1.
    #[arg(long, default_value_t = 5)]
    hops: usize,
    /// Measured seconds per point (overrides --quick's and the default).
    #[arg(long)]
    seconds: Option<f64>,
    /// Rounds of the two points per language, alternating (overrides --quick's and the
    /// default).
    #[arg(long)]
    rounds: Option<usize>,
    /// Seconds of the idle window (overrides --quick's and the default).
    #[arg(long)]
    idle_seconds: Option<f64>,
    /// Request body, bytes.
    #[arg(long, default_value_t = 100)]
    body: usize,
    /// Folder of the built binaries (`zerohop`, `zerohop-bench-lang-pass`); default: this
    /// binary's folder. Its parent holds the installed SDKs (`c-sdk`, `python-sdk`) and
    /// receives `bench-languages/`.
    #[arg(long)]
    bin_dir: Option<PathBuf>,
    /// The zerohop checkout (`bench/languages`, `sdk/go`, `sdk/node`); default: the one this
    /// binary was built from.
    #[arg(long)]
    root: Option<PathBuf>,
    /// Do not pin the load generator (CPU 0) and the chain (CPU 1) to separate cores.
    #[arg(long)]
    no_pin: bool,
}

fn run(args: &Args) -> Result<bool> {
    ensure!(args.hops >= 2, "--hops must be at least 2");
    let bin = zerohop_bench::bin_dir(args.bin_dir.as_deref())?;
    let zerohop = zerohop_bench::need_bin(&bin, "zerohop")?;
    let target = bin
        .parent()
        .context("the binaries' folder has no parent")?
        .to_path_buf();
    let root = match &args.root {
        Some(r) => r.clone(),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join(".."),
    };
    let root = root
        .canonicalize()
        .with_context(|| format!("the checkout {}", root.display()))?;
    ensure!(
        root.join("bench/languages").is_dir(),
        "{} has no bench/languages: give the checkout with --root",
        root.display()
    );
    let work = target.join("bench-languages");
    std::fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
    let scratch = tempfile::Builder::new()
        .prefix("zerohop-bench-languages-")
        .tempdir()?;
    let paths = Paths {
        bin,
        target: target.canonicalize()?,
        root,
        work: work.canonicalize()?,
        scratch: scratch.path().to_path_buf(),
    };
    let cores = online_cpus();
    let pin = !args.no_pin && cores >= 2;
    let plan = Plan {
        chain_cpu: pin.then_some(1),
        hops: args.hops,
        seconds: args.seconds.unwrap_or(if args.quick { 2.0 } else { 5.0 }),
        rounds: args.rounds.unwrap_or(if args.quick { 2 } else { 3 }).max(1),
        idle_seconds: args
            .idle_seconds
            .unwrap_or(if args.quick { 2.0 } else { 5.0 }),
        body: args.body,
        warmup: if args.quick { 0.5 } else { 1.0 },
    };
    ensure!(
        plan.seconds > 0.0 && plan.idle_seconds > 0.0,
        "--seconds and --idle-seconds must be positive"
    );
    let machine = Machine::read();
    let loadavg_before = report::load_average();
    let mut languages: Vec<Language> = Vec::new();
    for l in &args.languages {
        if !languages.contains(l) {
            languages.push(*l);
        }
    }
    // Everything is built first, on every core; then the load generator (this thread) is
    // pinned and the languages are measured one after another.
    let mut rows: Vec<Row> = languages
        .iter()
        .map(|&language| Row::prepared(language, &paths))
        .collect();
    if plan.chain_cpu.is_some() {
        ensure!(
            pin_current_thread(0),
            "cannot pin the load generator to CPU 0 (--no-pin runs without pinning)"
        );
    }
    // Every chain up at once, so that the languages take turns within each round: a
    // disturbance of the machine (another build, the host) falls on all of them alike.
    let mut ups: Vec<(usize, Up)> = Vec::new();
    for (i, row) in rows.iter_mut().enumerate() {
        let Some(f) = &row.function else {
            continue;
        };
        match Up::start(row.language, f, &plan, &zerohop, &paths) {
            Ok(up) => ups.push((i, up)),
            Err(e) => {
                eprintln!(
                    "zerohop-bench-languages: {}: failed: {e:#}",
                    row.language.name()
                );
                row.reason = Some(format!("{e:#}"));
            }
        }
    }
    let before = MachineTicks::now();
    for round in 0..plan.rounds {
        // Each round starts with another language, and alternates the routes' order (ABBA).
        let order = if round % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        };
        let n = ups.len();
        for j in 0..n {
            let (_, up) = &mut ups[(j + round) % n];
            for long in order {
                if let Err(e) = up.point(long, &plan) {
                    up.errors.push(format!("{}: {e:#}", up.url(long)));
                }
            }
            let last = |v: &Vec<(RunResult, Round)>| v.last().map_or(0.0, |(_, r)| r.p50_us);
            eprintln!(
                "zerohop-bench-languages: round {}/{}, {}: p50 /one {:.1} us, /chain {:.1} us \
                 ({:.0} s)",
                round + 1,
                plan.rounds,
                up.language.name(),
                last(&up.one),
                last(&up.long),
                before.at().elapsed().as_secs_f64()
            );
        }
    }
    let disturbance = before.since();
    // Idle: every chain up, no traffic.
    eprintln!(
        "zerohop-bench-languages: idle window, {:.1} s",
        plan.idle_seconds
    );
    std::thread::sleep(SETTLE);
    let before: Vec<_> = ups.iter().map(|(_, up)| up.idle_counters()).collect();
    let idle_started = Instant::now();
    std::thread::sleep(Duration::from_secs_f64(plan.idle_seconds));
    let after: Vec<_> = ups.iter().map(|(_, up)| up.idle_counters()).collect();
    let idle_s = idle_started.elapsed().as_secs_f64();
    for (((i, up), b), a) in ups.into_iter().zip(before).zip(after) {
        let idle = Idle::between(&b, &a, idle_s, up.fns.len());
        let row = &mut rows[i];
        let name = up.language.name();
        match up.finish(idle) {
            Ok((m, errors)) => {
                eprintln!(
                    "zerohop-bench-languages: {name}: per-hop p50 {:.1} us, mean {:.1} us; fn \
                     CPU per hop {:.1} us; idle {:.2} ms/s; RSS {:.1} MiB",
                    m.per_hop_p50_us,
                    m.per_hop_mean_us,
                    m.fn_cpu_us_per_hop,
                    m.idle.cpu_ms_per_s,
                    mib(m.memory.vm_rss_kib),
                );
                row.status = Status::Measured;
                row.result = Some(m);
                row.errors = errors;
            }
            Err(e) => {
                eprintln!("zerohop-bench-languages: {name}: failed: {e:#}");
                row.reason = Some(format!("{e:#}"));
            }
        }
    }
    let rust = rows
        .iter()
        .find(|r| r.language == Language::Rust)
        .and_then(|r| r.result.as_ref());
    let to_rust: Vec<Ratios> = rows
        .iter()
        .map(|row| match (&row.result, rust) {
            (Some(m), Some(rust)) => ratios(m, rust),
            _ => Ratios::default(),
        })
        .collect();
    for (row, ratio) in rows.iter_mut().zip(to_rust) {
        row.ratio_to_rust = ratio;
    }
    let ok = rows
        .iter()
        .all(|r| r.status != Status::Failed && r.errors.is_empty());
    let report = Report {
        machine,
        loadavg_before,
        settings: Settings {
            hops: plan.hops,
            seconds_per_point: plan.seconds,
            rounds: plan.rounds,
            idle_seconds: plan.idle_seconds,
            body_bytes: plan.body,
            concurrency: CONCURRENCY,
            gateway_threads: GATEWAY_THREADS,
            warmup_seconds_per_route: plan.warmup,
            pinning: if pin {
                "load generator on CPU 0; zerohop up and every instance on CPU 1".into()
            } else {
                format!("nothing pinned ({cores} CPUs, --no-pin={})", args.no_pin)
            },
        },
        reference: Language::Rust,
        languages: rows,
        disturbance,
        ok,
    };
    report::publish(
        &args.out,
        "languages",
        &report,
        &markdown(&report),
        Some(&summary_line(&report)),
    )?;
    Ok(report.ok)
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("zerohop-bench-languages: a language failed or had errors; see the report");
            ExitCode::from(1)
        }
        Err(e) => {
            eprintln!("zerohop-bench-languages: {e:#}");
            ExitCode::from(2)
        }
    }
}
