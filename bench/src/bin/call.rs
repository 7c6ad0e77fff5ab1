//! `zerohop-bench-call`: what one call costs next to one hop of a sequence.
//!
//! Runs the real `zerohop up` with three routes of pass-through functions and drives each
//! with the benchmark's load generator (closed loop, 100-byte bodies, every answer checked),
//! at concurrency 1 and 8:
//!
//! * `/one`: `[pass]`, the floor (gateway -> function -> gateway);
//! * `/hop`: `[pass, pass2]`, one more hop of a sequence;
//! * `/call`: `[relay]`, where `relay` calls `pass3` and answers its output: a call is two
//!   hops (there and back) plus the copy of the input into a new slot. `relay` has 8
//!   handler threads: a handler waits for its call's answer, so one thread would carry one
//!   request at a time.
//!
//! Prints a table: p50 and RPS per route, and the extra median latency of a hop and of a
//! call over `/one`, with their ratio. `--seconds N` sets each point's measured window.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use zerohop_bench::loadgen::{self, BodyMix, Load, RunResult};
use zerohop_bench::Step;

struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        // SIGTERM lets the agent stop its instances; then make sure. Not reaped yet, so the
        // pid is still the agent's.
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

fn main() -> Result<()> {
    let seconds: u64 = std::env::args()
        .skip_while(|a| a != "--seconds")
        .nth(1)
        .map_or(Ok(3), |s| s.parse())
        .context("--seconds N")?;
    let bin = std::env::current_exe()?
        .parent()
        .context("binary folder")?
        .to_owned();
    let need = |name: &str| zerohop_bench::need_bin(&bin, name);
    let (zerohop, pass, relay) = (
        need("zerohop")?,
        need("zerohop-bench-pass")?,
        need("zerohop-bench-relay")?,
    );
    // The spec's folder, removed when main returns (after the guard stopped the chain).
    let dir = tempfile::Builder::new()
        .prefix("zerohop-bench-call-")
        .tempdir()?;
    let spec = format!(
        "name: callcost\ntimeout: 10s\nfunctions:\n\
         \x20 pass: {{ command: [\"{p}\"] }}\n\
         \x20 pass2: {{ command: [\"{p}\"] }}\n\
         \x20 pass3: {{ command: [\"{p}\"] }}\n\
         \x20 relay: {{ command: [\"{r}\"], env: {{ RELAY_TO: pass3 }}, calls: [pass3], concurrency: 8 }}\n\
         routes:\n\
         \x20 - http: POST /one\n    sequence: [pass]\n\
         \x20 - http: POST /hop\n    sequence: [pass, pass2]\n\
         \x20 - http: POST /call\n    sequence: [relay]\n",
        p = pass.display(),
        r = relay.display()
    );
    let file = dir.path().join("chain.yaml");
    std::fs::write(&file, spec)?;
    let mut child = Command::new(&zerohop)
        .arg("up")
        .arg(&file)
        .args(["--listen", "127.0.0.1:0", "--gateway-threads", "1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("starting zerohop up")?;
    let stdout = child.stdout.take().context("stdout")?;
    let guard = Guard(child);
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line)?;
    let base = zerohop_test_support::listener_in(&line, "http://")
        .map(|a| format!("http://{a}"))
        .ok_or_else(|| anyhow!("no ready line from zerohop up: {line:?}"))?;
    eprintln!("zerohop-bench-call: chain ready at {base}; {seconds} s per point");
    println!("| concurrency | route | p50 (us) | RPS |");
    println!("|---|---|---|---|");
    let mut summary = Vec::new();
    for concurrency in [1usize, 8] {
        let mut p50 = Vec::new();
        for route in ["one", "hop", "call"] {
            let r: RunResult = loadgen::run(
                &format!("{base}/{route}"),
                &[Step::Pass],
                &BodyMix::Fixed(100),
                &Load::Closed { concurrency },
                Duration::from_secs(1),
                Duration::from_secs(seconds),
            )?;
            if r.errors + r.wrong > 0 {
                bail!(
                    "/{route}: {} errors, {} wrong answers (first: {:?})",
                    r.errors,
                    r.wrong,
                    r.first_error
                );
            }
            println!(
                "| {concurrency} | /{route} | {:.1} | {:.0} |",
                r.latency.p50_us, r.rps
            );
            p50.push(r.latency.p50_us);
        }
        let (hop, call) = (p50[1] - p50[0], p50[2] - p50[0]);
        summary.push(format!(
            "concurrency {concurrency}: a hop adds {hop:.1} us, a call {call:.1} us (call/hop {:.2})",
            call / hop
        ));
    }
    println!();
    for s in summary {
        println!("{s}");
    }
    drop(guard);
    Ok(())
}
