//! `zerohop-bench-scale`: how zerohop behaves with many warm instances in one chain.
//!
//! For each instance count N (`--instances 10,100,1000`) it writes a chain of
//! F = min(16, N) pass-through functions (`zerohop-bench-pass`) in one route, `POST /bench`,
//! with N instances spread evenly over them and `gateway_threads: 1`, runs
//! `zerohop up SPEC --listen 127.0.0.1:0` and measures:
//!
//! * ready time: from spawn to zerohop's `ready at` line, and when the instances were started
//!   (their start times in `/proc/PID/stat`, relative to zerohop's);
//! * memory: per instance (children of the zerohop process) `Private_Clean + Private_Dirty`,
//!   `Pss` and `Rss` of `/proc/PID/smaps_rollup`, page tables, and a per-mapping breakdown
//!   from `/proc/PID/smaps` (binary, libraries, heap, anonymous, pool, ring outboxes and
//!   inboxes); the same for the agent (the zerohop process); measured at ready and again
//!   after the load;
//! * shared memory: the memfds the agent holds (pool and ring regions, by their names, each
//!   counted once even where the agent holds it twice), their sizes, and how much of it is
//!   resident (sum of `Pss_Shmem` over the chain's processes; `Shmem` of `/proc/meminfo`
//!   before and after as a cross-check);
//! * idle CPU: utime + stime of the agent and every instance over an idle window, before and
//!   after the load;
//! * requests per second: a closed loop of 32 connections sending 100-byte bodies for 3 s,
//!   every answer checked (status 200, body unchanged) by the benchmark's load generator.
//!
//! Then zerohop is stopped with SIGTERM and every process it started must be gone before the
//! next N. Progress goes to stderr, a JSON document to stdout (plus a markdown table with
//! `--markdown`). Exit code 1 when any point failed (the reason is in its `error` field and
//! on stderr), 0 otherwise.
//!
//! Every wait is bounded. zerohop runs in a process group of its own; on an error, a panic,
//! SIGINT or SIGTERM the chain is stopped (SIGTERM, then SIGKILL) and every instance and
//! every member of zerohop's process group that is left is killed.

#![forbid(unsafe_code)]

mod memory;
mod output;
mod point;
mod processes;
mod spec;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Parser;
use zerohop_bench::report::{self, Machine};

use crate::output::{markdown, Point, Report, Settings};
use crate::point::run_point;
use crate::processes::{install_signal_handler, kill_registered};
use crate::spec::spread;

#[derive(Parser, Debug)]
#[command(
    name = "zerohop-bench-scale",
    about = "Measures ready time, memory, idle CPU and throughput of zerohop with many warm \
             instances in one chain"
)]
struct Args {
    /// Instance counts to measure, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "10,100,1000")]
    instances: Vec<usize>,
    /// Most functions in the chain (F = min(this, N)).
    #[arg(long, default_value_t = 16)]
    max_functions: usize,
    /// Length of each idle window, seconds.
    #[arg(long, default_value_t = 5.0)]
    idle_seconds: f64,
    /// Length of the measured load, seconds (after a 0.5 s warm-up).
    #[arg(long, default_value_t = 3.0)]
    load_seconds: f64,
    /// Connections of the closed-loop load.
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// Bound on waiting for the ready line and for zerohop to stop, seconds.
    #[arg(long, default_value_t = 60.0)]
    timeout: f64,
    /// Instances broken down per mapping in the JSON (one of the first, middle and last
    /// function each, up to this many).
    #[arg(long, default_value_t = 3)]
    detail: usize,
    /// Folder of the built binaries (`zerohop`, `zerohop-bench-pass`); default: this
    /// binary's folder.
    #[arg(long)]
    bin_dir: Option<PathBuf>,
    /// Also print a markdown table (after the JSON).
    #[arg(long)]
    markdown: bool,
    /// Keep the per-point folders (spec, zerohop's log) instead of removing them.
    #[arg(long)]
    keep: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("scale: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn run(args: &Args) -> Result<bool> {
    if args.instances.is_empty() {
        bail!("--instances needs at least one count");
    }
    if args.max_functions == 0 || args.max_functions > 254 {
        bail!("--max-functions must be 1..=254");
    }
    if !(args.timeout > 0.0 && args.idle_seconds >= 0.0 && args.load_seconds > 0.0) {
        bail!("--timeout and --load-seconds must be positive, --idle-seconds not negative");
    }
    let bin_dir = zerohop_bench::bin_dir(args.bin_dir.as_deref())?;
    let bin_dir = bin_dir
        .canonicalize()
        .with_context(|| format!("binary folder {}", bin_dir.display()))?;
    for b in ["zerohop", "zerohop-bench-pass"] {
        if !bin_dir.join(b).is_file() {
            bail!(
                "{} is missing; build the binaries first: `cargo build --release --workspace --bins`",
                bin_dir.join(b).display()
            );
        }
    }
    install_signal_handler()?;
    let root = tempfile::Builder::new()
        .prefix("zerohop-scale-")
        .tempdir()
        .context("creating the scratch folder")?;

    let mut points = Vec::new();
    for &n in &args.instances {
        let f = args.max_functions.min(n).max(1);
        let mut point = Point {
            instances: n,
            functions: f,
            per_function: spread(n, f),
            ..Point::default()
        };
        eprintln!(
            "scale: N={n}: {f} functions x {}..{} instances",
            point.per_function.iter().min().unwrap_or(&0),
            point.per_function.iter().max().unwrap_or(&0)
        );
        match run_point(args, &bin_dir, root.path(), &mut point) {
            Ok(()) => point.ok = true,
            Err(e) => {
                let e = format!("{e:#}");
                eprintln!("scale: N={n}: FAILED: {e}");
                point.error = Some(e);
            }
        }
        // Whatever happened, nothing of this point may still run.
        let left = kill_registered(Duration::from_secs(5));
        if left > 0 {
            eprintln!("scale: N={n}: killed {left} leftover processes");
        }
        points.push(point);
    }
    let ok = points.iter().all(|p| p.ok);
    if args.keep || !ok {
        eprintln!("scale: specs and logs kept in {}", root.keep().display());
    }
    let report = Report {
        machine: Machine::read(),
        settings: Settings {
            idle_seconds: args.idle_seconds,
            load_seconds: args.load_seconds,
            concurrency: args.concurrency,
            body_bytes: 100,
            gateway_threads: 1,
            pool: "default (1024 slots x 64 KiB)",
        },
        points,
        ok,
    };
    report::print(&report, args.markdown.then(|| markdown(&report)).as_deref())?;
    Ok(ok)
}
