//! `boutique-load --url URL`: drives the boutique's frontend (either deployment) with the
//! original's locust tasks and weights, checks every answer, and reports requests, errors,
//! requests per second and latency percentiles, per route too. Exits 1 when any request
//! failed or none was made.

use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Parser;
use zerohop_app_boutique::load::{self, LoadOptions};

#[derive(Parser)]
#[command(about = "Closed-loop load generator for the Online Boutique")]
struct Args {
    /// Base URL of the frontend.
    #[arg(long)]
    url: String,
    /// How long to run: `10s`, `500ms`, `2m`.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    duration: Duration,
    /// Users, each one request at a time.
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// Seed of the users' choices.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let (n, unit) = s
        .find(|c: char| !c.is_ascii_digit())
        .map_or((s, "s"), |at| s.split_at(at));
    let n: u64 = n.parse().map_err(|_| format!("{s:?}: expected e.g. 10s"))?;
    match unit {
        "ms" => Ok(Duration::from_millis(n)),
        "s" => Ok(Duration::from_secs(n)),
        "m" => Ok(Duration::from_secs(n * 60)),
        _ => Err(format!("{s:?}: the unit is ms, s or m")),
    }
}

fn main() -> Result<()> {
    let args = Args::parse();
    let opts = LoadOptions {
        url: args.url,
        duration: args.duration,
        concurrency: args.concurrency,
        seed: args.seed,
        // Long runs report every 5 s on stderr.
        progress: (args.duration > Duration::from_secs(5)).then_some(Duration::from_secs(5)),
    };
    let report = load::run(&opts).context("boutique-load")?;
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print!("{}", report.to_text());
    }
    if report.errors > 0 {
        bail!("{} of {} requests failed", report.errors, report.requests);
    }
    if report.requests == 0 {
        bail!("no request was made");
    }
    Ok(())
}
