//! `motion-gen`: replays a synthesised motion trace against a deployment of the motion
//! workload over MQTT (or HTTP) and reports response times per second and the deployment's
//! CPU. Exits 1 when an event went unanswered, was answered wrongly or failed.

#![forbid(unsafe_code)]

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Parser;
use http::Uri;
use rumqttc::QoS;
use zerohop_app_motion::actuator::DEFAULT_OFF_AFTER_MS;
use zerohop_app_motion::procstat::ProcessTrees;
use zerohop_app_motion::replay::{replay, ReplayConfig, Report, Target};
use zerohop_app_motion::trace::{expected, generate, TraceConfig};

#[derive(Parser)]
#[command(
    name = "motion-gen",
    about = "Replays a synthesised motion trace over MQTT or HTTP; reports response times and CPU"
)]
struct Args {
    /// MQTT broker (mosquitto, or a chain's mqtt:// listener), HOST:PORT.
    #[arg(long, conflicts_with = "http", required_unless_present = "http")]
    mqtt: Option<String>,
    /// Instead of MQTT: the chain's HTTP route (http://HOST:PORT/motion), one POST per event.
    #[arg(long)]
    http: Option<Uri>,
    /// Topic the light commands come back on.
    #[arg(long, default_value = "motion/lights")]
    reply_topic: String,
    /// Events go to PREFIX/ROOM/event.
    #[arg(long, default_value = "motion")]
    prefix: String,
    /// QoS of events and of the reply subscription (0 or 1).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(0..=1))]
    qos: u8,
    /// HTTP: keep-alive connections kept open at most (one request per room in flight).
    #[arg(long, default_value_t = 64)]
    connections: usize,
    /// Sensors (rooms).
    #[arg(long, default_value_t = 8)]
    sensors: usize,
    /// Trace length, seconds of trace time.
    #[arg(long, default_value_t = 3_600.0)]
    duration: f64,
    /// Seed of the trace.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Time-scale factor: trace seconds per second of replay.
    #[arg(long, default_value_t = 10.0)]
    scale: f64,
    /// Mean idle gap between bursts (exponential), seconds.
    #[arg(long, default_value_t = 240.0)]
    mean_idle: f64,
    /// Burst length, uniform between these, seconds.
    #[arg(long, default_value_t = 20.0)]
    burst_min: f64,
    #[arg(long, default_value_t = 60.0)]
    burst_max: f64,
    /// Time between motion events in a burst, uniform between these, seconds.
    #[arg(long, default_value_t = 1.0)]
    step_min: f64,
    #[arg(long, default_value_t = 2.0)]
    step_max: f64,
    /// Heartbeat period, seconds.
    #[arg(long, default_value_t = 15.0)]
    heartbeat: f64,
    /// No heartbeat this long before a burst, seconds.
    #[arg(long, default_value_t = 2.0)]
    guard: f64,
    /// The deployment's OFF_AFTER_MS (to know the right commands).
    #[arg(long, default_value_t = DEFAULT_OFF_AFTER_MS)]
    off_after_ms: u64,
    /// Seconds to wait for the last answers.
    #[arg(long, default_value_t = 10.0)]
    drain: f64,
    /// A process of the deployment whose CPU (with all its descendants) is reported;
    /// repeat for several.
    #[arg(long = "cpu-pid")]
    cpu_pids: Vec<u32>,
    /// Room names start with this (default: a tag of its own per run, so runs against one
    /// deployment never share room state).
    #[arg(long)]
    tag: Option<String>,
    /// Print the report as one JSON object.
    #[arg(long)]
    json: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("motion-gen: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn run(args: Args) -> Result<bool> {
    let trace_cfg = TraceConfig {
        sensors: args.sensors,
        duration_s: args.duration,
        seed: args.seed,
        mean_idle_s: args.mean_idle,
        burst_min_s: args.burst_min,
        burst_max_s: args.burst_max,
        step_min_s: args.step_min,
        step_max_s: args.step_max,
        heartbeat_s: args.heartbeat,
        guard_s: args.guard,
    };
    trace_cfg.validate().map_err(anyhow::Error::msg)?;
    if !(args.scale.is_finite() && args.scale > 0.0) {
        bail!("--scale must be a positive number");
    }
    let trace = generate(&trace_cfg);
    let tag = args.tag.unwrap_or_else(run_tag);
    let want = expected(&trace, &tag, args.off_after_ms);
    let target = match (args.mqtt, args.http) {
        (Some(addr), None) => Target::Mqtt {
            addr,
            prefix: args.prefix,
            reply_topic: args.reply_topic,
            qos: if args.qos == 0 {
                QoS::AtMostOnce
            } else {
                QoS::AtLeastOnce
            },
        },
        (None, Some(url)) => Target::Http {
            url,
            prefix: args.prefix,
            connections: args.connections,
        },
        _ => bail!("give --mqtt or --http"),
    };
    let cfg = ReplayConfig {
        target,
        scale: args.scale,
        drain: Duration::from_secs_f64(args.drain),
        cpu: ProcessTrees::new(args.cpu_pids),
        tag,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("tokio runtime")?;
    let report = runtime.block_on(replay(&trace, &want, &cfg))?;
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print_report(&report, &trace_cfg, args.scale);
    }
    Ok(report.missing == 0 && report.wrong == 0 && report.errors == 0 && report.unexpected == 0)
}

/// `gXXXXXX-`: six hex digits from the clock and the pid.
fn run_tag() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let mix = now.as_millis() as u64 ^ (u64::from(std::process::id()) << 20);
    format!("g{:06x}-", mix & 0xff_ffff)
}

fn opt(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.2}"))
}

fn print_report(r: &Report, t: &TraceConfig, scale: f64) {
    println!(
        "trace: {} sensors, {} s, seed {}, idle Exp({} s), bursts U[{}, {}] s of steps U[{}, {}] s, heartbeat {} s; scale {scale}x",
        t.sensors, t.duration_s, t.seed, t.mean_idle_s, t.burst_min_s, t.burst_max_s,
        t.step_min_s, t.step_max_s, t.heartbeat_s
    );
    println!("target: {}", r.target);
    println!("second  sent  answered  p50_ms  p99_ms  cpu_%");
    for b in &r.buckets {
        println!(
            "{:>6}  {:>4}  {:>8}  {:>6}  {:>6}  {:>5.1}",
            b.second,
            b.sent,
            b.answered,
            opt(b.p50_ms),
            opt(b.p99_ms),
            b.cpu_pct
        );
    }
    println!(
        "events {} ({} motion), answered {}, wrong {}, missing {}, errors {}, unexpected {}; lights on {} / off {}",
        r.events, r.motion_events, r.answered, r.wrong, r.missing, r.errors, r.unexpected,
        r.switched_on, r.switched_off
    );
    println!(
        "response ms: p50 {} p99 {} max {}; wall {:.1} s, deployment CPU {:.2} s ({:.2}% of a core)",
        opt(r.p50_ms),
        opt(r.p99_ms),
        opt(r.max_ms),
        r.wall_s,
        r.cpu_s,
        r.cpu_pct
    );
    for s in &r.samples {
        println!("  {s}");
    }
}
