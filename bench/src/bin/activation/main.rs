//! `zerohop-bench-activation`: how long a function scaled to zero takes to serve again, with
//! an instance waiting parked and without one.
//!
//! Runs the real node daemon (`zerohop agent`) with one chain of three functions, all
//! `zerohop-bench-stamp` (answers with `CLOCK_MONOTONIC` at the start of its handler), one
//! route each:
//!
//! * `parked`: `scale: { min: 0, max: 1, parked: 1, zero_after: 200ms }`, starting at zero:
//!   a started instance waits on its state word; activating it is one compare-and-swap and a
//!   futex wake;
//! * `cold`: the same with `parked: 0`: no process; activating it is a cold start (the
//!   supervisor's spawn, `fork` + `execve`, dynamic linking, the runtime's start, attaching);
//! * `ready`: one instance that always serves, the reference: the same request after the
//!   same idle pause, with no activation at all.
//!
//! One round (the variants take turns): wait until `parked` and `cold` are at zero (no
//! instance ready; `parked` has its parked instance, `cold` none), let the machine settle,
//! send one request with a real HTTP client (hyper, keep-alive, connected beforehand), then
//! `--warm` more while the instance is warm, then read the chain's status from the admin
//! socket. The scaler stamps each activation decision (`activated_ns`, same clock), so:
//!
//! * **activation** = handler start - decision (what the issue asks to be under 30 us for a
//!   parked instance);
//! * **first request** = the client's whole request, sent to answer received, against the
//!   **warm** requests that follow it to the same instance, and against the first request
//!   to the `ready` function after the same pause;
//! * where the first request's time goes: client send -> decision (loopback HTTP, the
//!   gateway sends the descriptor and notifies the scaler, the scaler wakes), decision ->
//!   handler (activation), handler -> answer received; for cold starts also decision ->
//!   `main` (spawn, `fork`, `execve`, linking) and `main` -> handler (runtime start, attach).
//!
//! A round counts only if the status says the instance that answered was activated by a
//! decision after the request was sent, the way the variant expects (`parked`/`cold`), and
//! the answer was its first request; other rounds are listed as discarded, with why. One
//! unrecorded round per variant comes first (first-time costs in the daemon).
//!
//! First (unless `--no-floor`) the machine's futex floor is measured for reference
//! (`zerohop_bench::floors`, ~4 s): waking a process asleep on a futex is the one step a
//! parked activation cannot avoid.
//!
//! `--quick` runs fewer rounds; `--out DIR` (default `results`) receives `activation.md` and
//! `activation.json`; the last line of stdout is the summary. Exits 1 when a request failed
//! or too many rounds were discarded (the report is still written), 2 when it could not run.

#![forbid(unsafe_code)]

mod client;
mod daemon;
mod report;
mod rounds;
mod samples;
mod spec;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context, Result};
use clap::Parser;
use zerohop_bench::report::Machine;

use crate::client::Client;
use crate::daemon::{ApplyResponse, Daemon};
use crate::report::{markdown, summary_line, FutexFloor, Report, Settings};
use crate::rounds::{Bench, Outcome};
use crate::samples::{Discarded, Stats, VariantReport};
use crate::spec::{spec, Variant};

/// What the issue asks of a parked activation.
const TARGET_US: f64 = 30.0;

#[derive(Parser, Debug)]
#[command(
    name = "zerohop-bench-activation",
    about = "Measures activation of a function scaled to zero: a parked instance next to a \
             cold start"
)]
struct Args {
    /// Fewer rounds (10 per variant instead of 30).
    #[arg(long)]
    quick: bool,
    /// Measured rounds per variant (overrides --quick's and the default count).
    #[arg(long)]
    rounds: Option<usize>,
    /// Warm requests after each activation (the warm baseline).
    #[arg(long, default_value_t = 5)]
    warm: usize,
    /// The functions' `zero_after`, milliseconds (the pause between rounds is about this).
    #[arg(long, default_value_t = 200)]
    zero_after_ms: u64,
    /// Quiet time once both functions are at zero, before the request, milliseconds.
    #[arg(long, default_value_t = 100)]
    settle_ms: u64,
    /// Where `activation.md` and `activation.json` go.
    #[arg(long, default_value = "results")]
    out: PathBuf,
    /// Skip the machine's futex floor (measured first, ~4 s).
    #[arg(long)]
    no_floor: bool,
    /// Folder of the built binaries (`zerohop`, `zerohop-bench-stamp`); default: this
    /// binary's folder.
    #[arg(long)]
    bin_dir: Option<PathBuf>,
}

async fn measure(args: &Args, dir: &Path) -> Result<Report> {
    let bin = zerohop_bench::bin_dir(args.bin_dir.as_deref())?;
    let need = |name: &str| zerohop_bench::need_bin(&bin, name);
    let (zerohop, stamp) = (need("zerohop")?, need("zerohop-bench-stamp")?);
    let rounds = args
        .rounds
        .unwrap_or(if args.quick { 10 } else { 30 })
        .max(1);
    let loadavg_before = zerohop_bench::report::load_average();
    let futex_floor = if args.no_floor {
        None
    } else {
        eprintln!("zerohop-bench-activation: the machine's futex floor (~4 s)");
        let floors = zerohop_bench::floors::measure(true, &mut |_| {})?;
        floors
            .into_iter()
            .find(|f| f.name == "futex_rtt")
            .map(|f| FutexFloor {
                wake_median_us: f.p50_ns / 2_000.0,
                // Filled in once the activations are measured.
                parked_activation_over_wake: 0.0,
                wake_p99_us: f.p99_ns / 2_000.0,
                what: f.what,
            })
    };
    let file = dir.join("chain.yaml");
    let text = spec(&stamp, args.zero_after_ms)?;
    std::fs::write(&file, &text)?;
    let daemon = Daemon::start(&zerohop, dir)?;
    let apply = serde_json::json!({ "path": file.display().to_string(), "text": text });
    let applied: ApplyResponse = serde_json::from_slice(
        &daemon
            .call(
                http::Method::POST,
                "/chains",
                Some(serde_json::to_vec(&apply)?),
            )
            .await
            .context("applying the chain")?,
    )?;
    let authority = applied
        .status
        .listeners
        .iter()
        .find_map(|l| l.strip_prefix("http://"))
        .ok_or_else(|| anyhow!("the chain has no http listener"))?
        .trim_end_matches('/')
        .to_owned();
    eprintln!(
        "zerohop-bench-activation: chain up at http://{authority} (load average {loadavg_before}); \
         {rounds} rounds per variant, zero_after {} ms",
        args.zero_after_ms
    );
    let mut bench = Bench {
        daemon,
        client: Client {
            authority,
            conn: None,
        },
        warm: args.warm,
        settle: Duration::from_millis(args.settle_ms),
    };
    let (mut parked, mut cold, mut ready) = (Vec::new(), Vec::new(), Vec::new());
    let (mut discarded, mut errors) = (Vec::new(), Vec::new());
    let started = Instant::now();
    // One unrecorded round per variant, then the variants take turns.
    let n = Variant::ALL.len();
    let plan = Variant::ALL
        .into_iter()
        .map(|v| (v, false))
        .chain((0..n * rounds).map(|i| (Variant::ALL[i % n], true)));
    for (i, (v, recorded)) in plan.enumerate() {
        match bench.round(v).await {
            Ok(Outcome::Measured(s)) if recorded => {
                eprintln!(
                    "zerohop-bench-activation: round {i} {}: activation {:.1} us, first \
                     request {:.0} us, warm {:.0} us ({:.0} s)",
                    v.name(),
                    s.activation_us.unwrap_or(0.0),
                    s.first_request_us,
                    Stats::of(s.warm_us.iter().copied()).median,
                    started.elapsed().as_secs_f64()
                );
                match v {
                    Variant::Parked => parked.push(s),
                    Variant::Cold => cold.push(s),
                    Variant::Ready => ready.push(s),
                }
            }
            Ok(Outcome::Measured(_)) => {}
            Ok(Outcome::Discarded(why)) => {
                eprintln!(
                    "zerohop-bench-activation: round {i} {} discarded: {why}",
                    v.name()
                );
                if recorded {
                    discarded.push(Discarded { variant: v, why });
                }
            }
            Err(e) => {
                eprintln!("zerohop-bench-activation: round {i} {}: {e:#}", v.name());
                errors.push(format!("{}: {e:#}", v.name()));
                if errors.len() >= 3 {
                    errors.push("stopped after 3 errors".into());
                    break;
                }
            }
        }
    }
    drop(bench);
    let (parked, cold, ready) = (
        VariantReport::of(parked),
        VariantReport::of(cold),
        VariantReport::of(ready),
    );
    let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
    let futex_floor = futex_floor.map(|f| FutexFloor {
        parked_activation_over_wake: ratio(parked.activation_median(), f.wake_median_us),
        ..f
    });
    let enough = |r: &VariantReport| r.first_request_us.n * 2 >= rounds;
    let ok = errors.is_empty() && enough(&parked) && enough(&cold) && enough(&ready);
    Ok(Report {
        machine: Machine::read(),
        futex_floor,
        loadavg_before,
        settings: Settings {
            rounds_per_variant: rounds,
            warm_per_round: args.warm,
            zero_after_ms: args.zero_after_ms,
            settle_ms: args.settle_ms,
            gateway_threads: 1,
            via: "zerohop agent (daemon); status from its admin socket",
        },
        cold_over_parked: ratio(cold.activation_median(), parked.activation_median()),
        first_over_warm_parked: ratio(parked.first_request_us.median, parked.warm_us.median),
        first_over_warm_cold: ratio(cold.first_request_us.median, cold.warm_us.median),
        first_parked_over_ready: ratio(
            parked.first_request_us.median,
            ready.first_request_us.median,
        ),
        first_cold_over_ready: ratio(cold.first_request_us.median, ready.first_request_us.median),
        target_us: TARGET_US,
        target_met: parked.activation_us.is_some_and(|a| a.median < TARGET_US),
        parked,
        cold,
        ready,
        discarded,
        errors,
        ok,
    })
}

fn run(args: &Args) -> Result<bool> {
    let dir = tempfile::Builder::new()
        .prefix("zerohop-bench-activation-")
        .tempdir()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let report = runtime.block_on(measure(args, dir.path()))?;
    zerohop_bench::report::publish(
        &args.out,
        "activation",
        &report,
        &markdown(&report),
        Some(&summary_line(&report)),
    )?;
    Ok(report.ok)
}

fn main() -> ExitCode {
    // The futex floor re-runs this executable as its peer.
    zerohop_bench::floors::maybe_run_echo_role();
    let args = Args::parse();
    match run(&args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!(
                "zerohop-bench-activation: errors or too many discarded rounds; see the report"
            );
            ExitCode::from(1)
        }
        Err(e) => {
            eprintln!("zerohop-bench-activation: {e:#}");
            ExitCode::from(2)
        }
    }
}
