//! `parking-cam`: the cameras of a parking lot. Every `--period` seconds a burst of one
//! ~3 KB snapshot per spot goes to the chain over HTTP (keep-alive) or CoAP (block-wise);
//! every answer is checked and each burst's completion time is reported. Exits 1 when a
//! snapshot failed or was answered wrongly.

#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Parser;
use http::Uri;
use zerohop_app_parking::cam::{self, CamConfig, CamReport, CamTarget};
use zerohop_app_parking::lot::LotConfig;
use zerohop_app_parking::snapshot::DEFAULT_SIZE;

#[derive(Parser)]
#[command(
    name = "parking-cam",
    about = "Sends bursts of parking-spot snapshots over HTTP or CoAP; checks and times the answers"
)]
struct Args {
    /// The chain's HTTP route (http://127.0.0.1:8080/snapshot).
    #[arg(long, conflicts_with = "coap", required_unless_present = "coap")]
    http: Option<Uri>,
    /// Instead: the chain's CoAP address, HOST:PORT (UDP).
    #[arg(long)]
    coap: Option<SocketAddr>,
    /// CoAP: the route's path.
    #[arg(long, default_value = "/snapshot")]
    coap_path: String,
    /// CoAP: block size of block-wise transfers (16 to 1024).
    #[arg(long, default_value_t = 1024)]
    block: usize,
    /// Spots in the lot (snapshots per burst).
    #[arg(long, default_value_t = 164)]
    spots: u32,
    /// Bursts to send.
    #[arg(long, default_value_t = 3)]
    bursts: usize,
    /// Seconds between burst starts (SPRIGHT: 240).
    #[arg(long, default_value_t = 240.0)]
    period: f64,
    /// Chance that a spot's car is replaced between two bursts.
    #[arg(long, default_value_t = 0.25)]
    turnover: f64,
    /// Seed of the plates (the same seed gives the same cars, burst by burst).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Bytes per snapshot.
    #[arg(long, default_value_t = DEFAULT_SIZE)]
    size: usize,
    /// Snapshots in flight at once at most (HTTP connections, CoAP sockets).
    #[arg(long, default_value_t = 32)]
    connections: usize,
    /// Camera id written into the snapshots.
    #[arg(long, default_value_t = 0)]
    camera: u32,
    /// Seconds one snapshot may take.
    #[arg(long, default_value_t = 60.0)]
    timeout: f64,
    /// The plate store started empty: a plate's first snapshot must take the long chain.
    #[arg(long)]
    fresh_db: bool,
    /// Print the report as one JSON object.
    #[arg(long)]
    json: bool,
}

fn main() -> ExitCode {
    match run(Args::parse()) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("parking-cam: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn run(args: Args) -> Result<bool> {
    let positive = |v: f64| v.is_finite() && v > 0.0;
    if !positive(args.period) || !positive(args.timeout) {
        bail!("--period and --timeout must be positive numbers of seconds");
    }
    if !(0.0..=1.0).contains(&args.turnover) {
        bail!("--turnover must be between 0 and 1");
    }
    if !(args.block.is_power_of_two() && (16..=1024).contains(&args.block)) {
        bail!("--block must be a power of two from 16 to 1024");
    }
    if args.spots == 0 || args.connections == 0 || args.bursts == 0 {
        bail!("--spots, --connections and --bursts must be at least 1");
    }
    let target = match (args.http, args.coap) {
        (Some(url), None) => CamTarget::Http(url),
        (None, Some(addr)) => CamTarget::Coap {
            addr,
            path: args.coap_path,
            block: args.block,
        },
        _ => bail!("give --http or --coap"),
    };
    let cfg = CamConfig {
        target,
        lot: LotConfig {
            spots: args.spots,
            turnover: args.turnover,
            seed: args.seed,
            ..LotConfig::default()
        },
        bursts: args.bursts,
        period: Duration::from_secs_f64(args.period),
        size: args.size,
        connections: args.connections,
        camera: args.camera,
        timeout: Duration::from_secs_f64(args.timeout),
        fresh_db: args.fresh_db,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("tokio runtime")?;
    let report = runtime.block_on(cam::run(&cfg))?;
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print_report(&report, args.period);
    }
    Ok(report.errors == 0 && report.wrong == 0 && report.ok == report.sent)
}

fn opt(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.1}"))
}

fn print_report(r: &CamReport, period: f64) {
    println!(
        "target: {}; {} spots, a burst every {period} s",
        r.target, r.spots
    );
    println!("burst  sent    ok  errors  wrong  long  short  completion_ms  p50_ms  p99_ms");
    for b in &r.bursts {
        println!(
            "{:>5}  {:>4}  {:>4}  {:>6}  {:>5}  {:>4}  {:>5}  {:>13.1}  {:>6}  {:>6}",
            b.burst,
            b.sent,
            b.ok,
            b.errors,
            b.wrong,
            b.long_path,
            b.short_path,
            b.completion_ms,
            opt(b.p50_ms),
            opt(b.p99_ms)
        );
    }
    println!(
        "sent {}, ok {}, errors {}, wrong {}; long chain {}, short chain {}; {} plates ({} known from before)",
        r.sent, r.ok, r.errors, r.wrong, r.long_path, r.short_path, r.distinct_plates, r.new_but_known
    );
    println!(
        "response ms: p50 {} p99 {} max {}; burst completion ms: p50 {} max {}",
        opt(r.p50_ms),
        opt(r.p99_ms),
        opt(r.max_ms),
        opt(r.completion_p50_ms),
        opt(r.completion_max_ms)
    );
    for s in &r.samples {
        println!("  {s}");
    }
}
