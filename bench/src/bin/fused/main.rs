//! `zerohop-bench-fused`: the hello chain fused (`fuse: [[upper, exclaim]]`, one instance
//! runs both steps, the hop between them a function call) beside hello in two processes
//! (the same program, `hello-fused`, as two functions: one descriptor and one wake-up more
//! per request) and beside the hyper monolith (the bench's own, one worker thread), in one
//! run.
//!
//! Each system is driven by the bench's load generator, closed loop, 100-byte bodies, every
//! answer checked: at `--concurrency` connections (default 32) and at one client. Printed per
//! point: RPS, p50 and p99, CPU per request (every process of the system: `zerohop up`, its
//! gateway threads and instances; the monolith's server), and the ratios of the fused chain
//! to the two others. `--seconds N` sets each point's measured window (default 5).
//!
//! Runs anywhere `cargo build --release -p zerohop-cli -p zerohop-example-hello -p
//! zerohop-bench` left its binaries (`zerohop`, `hello-fused`, `zerohop-bench-fn`).

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use zerohop_bench::loadgen::{self, BodyMix, Load, RunResult};
use zerohop_bench::procstat::{ticks_to_seconds, tree_ticks};
use zerohop_bench::systems::{self, StartOpts, SystemId};
use zerohop_bench::HELLO;

/// `zerohop up`, stopped (SIGTERM, then SIGKILL) on drop.
struct Chain(Child);

impl Drop for Chain {
    fn drop(&mut self) {
        // SIGTERM lets the agent stop its instances; then make sure.
        let _ = kill(Pid::from_raw(self.0.id() as i32), Signal::SIGTERM);
        for _ in 0..300 {
            if matches!(self.0.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts the hello chain with `hello` as both functions, fused or not, one gateway thread;
/// returns it and its URL.
fn start_chain(zerohop: &Path, hello: &Path, dir: &Path, fused: bool) -> Result<(Chain, String)> {
    let name = if fused { "fused" } else { "two" };
    let spec = format!(
        "name: hello-{name}\ntimeout: 10s\nfunctions:\n\
         \x20 upper: {{ command: [\"{h}\"] }}\n\
         \x20 exclaim: {{ command: [\"{h}\"] }}\n\
         routes:\n\
         \x20 - http: POST /bench\n    sequence: [upper, exclaim]\n{fuse}",
        h = hello.display(),
        fuse = if fused {
            "fuse:\n  - [upper, exclaim]\n"
        } else {
            ""
        }
    );
    let file = dir.join(format!("{name}.yaml"));
    std::fs::write(&file, spec)?;
    let mut child = Command::new(zerohop)
        .arg("up")
        .arg(&file)
        .args(["--listen", "127.0.0.1:0", "--gateway-threads", "1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("starting zerohop up")?;
    let stdout = child.stdout.take().context("stdout")?;
    let chain = Chain(child);
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line)?;
    let base = zerohop_test_support::listener_in(&line, "http://")
        .map(|a| format!("http://{a}/bench"))
        .ok_or_else(|| anyhow!("no ready line from zerohop up: {line:?}"))?;
    Ok((chain, base))
}

/// One measured point.
struct Point {
    system: &'static str,
    clients: usize,
    run: RunResult,
    /// CPU microseconds per request, over every process of the system.
    cpu_us: f64,
}

/// Drives `url` at `clients` connections, counting the CPU of the processes below `pids`.
fn measure(
    system: &'static str,
    url: &str,
    pids: &[u32],
    clients: usize,
    seconds: u64,
) -> Result<Point> {
    let ticks = || pids.iter().map(|&p| tree_ticks(p)).sum::<u64>();
    // A short warm-up outside the window (the load generator's own is not counted either).
    loadgen::run(
        url,
        &HELLO,
        &BodyMix::Fixed(100),
        &Load::Closed {
            concurrency: clients,
        },
        Duration::ZERO,
        Duration::from_millis(500),
    )?;
    let before = ticks();
    let run = loadgen::run(
        url,
        &HELLO,
        &BodyMix::Fixed(100),
        &Load::Closed {
            concurrency: clients,
        },
        Duration::ZERO,
        Duration::from_secs(seconds),
    )?;
    let cpu = ticks_to_seconds(ticks().saturating_sub(before));
    if run.errors + run.wrong > 0 || run.requests == 0 {
        bail!(
            "{system}: {} errors, {} wrong answers of {} (first: {:?})",
            run.errors,
            run.wrong,
            run.requests,
            run.first_error
        );
    }
    let cpu_us = cpu * 1e6 / run.requests as f64;
    Ok(Point {
        system,
        clients,
        run,
        cpu_us,
    })
}

fn main() -> Result<()> {
    let arg = |name: &str, default: u64| -> Result<u64> {
        std::env::args()
            .skip_while(|a| a != name)
            .nth(1)
            .map_or(Ok(default), |s| s.parse())
            .with_context(|| format!("{name} N"))
    };
    let seconds = arg("--seconds", 5)?;
    let concurrency = arg("--concurrency", 32)? as usize;
    let bin = std::env::current_exe()?
        .parent()
        .context("binary folder")?
        .to_owned();
    let zerohop = zerohop_bench::need_bin(&bin, "zerohop")?;
    let hello = zerohop_bench::need_bin(&bin, "hello-fused")?;
    let dir = tempfile::Builder::new()
        .prefix("zerohop-bench-fused-")
        .tempdir()?;
    eprintln!(
        "zerohop-bench-fused: hello fused, in two processes and the hyper monolith; closed \
         loop at {concurrency} connections and at 1, {seconds} s per point"
    );
    let mut points = Vec::new();
    for clients in [concurrency, 1] {
        // Started per load level and stopped after it: one system runs at a time.
        for fused in [true, false] {
            let (chain, url) = start_chain(&zerohop, &hello, dir.path(), fused)?;
            let system = if fused { "fused" } else { "two processes" };
            points.push(measure(system, &url, &[chain.0.id()], clients, seconds)?);
            drop(chain);
        }
        let opts = StartOpts {
            cpus: None,
            gateway_threads: None,
            pipelines: false,
            instances: 1,
            bin_dir: bin.clone(),
            work_dir: dir.path().to_owned(),
            tls: None,
        };
        let mono = systems::start(SystemId::HyperMonolith(1), &HELLO, &opts)?;
        let pids: Vec<u32> = mono.components.iter().map(|c| c.pid).collect();
        points.push(measure(
            "hyper monolith",
            &mono.url,
            &pids,
            clients,
            seconds,
        )?);
        mono.stop();
    }
    println!("| clients | system | RPS | p50 (us) | p99 (us) | CPU/request (us) |");
    println!("|---|---|---|---|---|---|");
    for p in &points {
        println!(
            "| {} | {} | {:.0} | {:.1} | {:.1} | {:.1} |",
            p.clients, p.system, p.run.rps, p.run.latency.p50_us, p.run.latency.p99_us, p.cpu_us
        );
    }
    println!();
    println!("| clients | fused vs | RPS | p50 | p99 | CPU/request |");
    println!("|---|---|---|---|---|---|");
    for group in points.chunks(3) {
        let fused = &group[0];
        for other in &group[1..] {
            println!(
                "| {} | {} | {:.2}x | {:.2}x | {:.2}x | {:.2}x |",
                fused.clients,
                other.system,
                fused.run.rps / other.run.rps,
                fused.run.latency.p50_us / other.run.latency.p50_us,
                fused.run.latency.p99_us / other.run.latency.p99_us,
                fused.cpu_us / other.cpu_us
            );
        }
    }
    Ok(())
}
