//! `zerohop-bench-large`: request bodies larger than a slot (1, 16 and 256 MiB) through the
//! hello chain on zerohop beside the monolith and the HTTP chain, in one run, reported as
//! ratios.
//!
//! * **zerohop**: `zerohop up` of `examples/hello/chain.yaml`, written out with
//!   `max_body: 300MiB` (and the programs' paths made absolute): the gateway streams a body
//!   into a large slot as it arrives, `upper` and `exclaim` work on it in place, the answer
//!   streams out of the slot;
//! * **monolith** and **http-chain**: the matrix's baselines, started by
//!   [`zerohop_bench::systems::start`] (`zerohop-bench-fn`, which reads a whole body into
//!   memory, applies its steps, and answers or POSTs it on).
//!
//! All answer `upper(body) + "!"`. For each size and system one keep-alive hyper client sends
//! one warm-up request and then N, one at a time, each body a [`Bytes`] made once per size
//! and shared by every request; the answer is checked as it arrives (length, the final `!`,
//! a sample of upper-cased bytes) and dropped. Per point: p50 latency (send to the answer's
//! last byte), throughput in MiB/s of request body (N bodies over the time of the N),
//! CPU per request of the system's processes (`/proc/PID/stat`, 10 ms ticks), and the
//! system's peak memory while the point ran: sampled every 2 ms as the sum over its
//! processes of `VmRSS - RssShmem`, plus the shared memory once (the resident pages of
//! every memfd its processes hold), so zerohop's pool pages, mapped by the gateway and
//! both functions, count once.
//!
//! On a machine with 2 CPUs or more (and without `--no-pin`) the client and the memory
//! sampler run on CPU 0 and every process of the systems on the others, as in the matrix.
//! `--quick` sends fewer requests (same sizes); `--out DIR` (default `results`) receives
//! `large.md` and `large.json`. Exits 1 when a request failed or was answered wrongly, or a
//! system could not start.
//!
//! Here: starting the systems, the client, the points and the run; [`answer`]: the bodies
//! and the check of each answer; [`memory`]: the sampler; [`report`]: ratios and Markdown.

#![forbid(unsafe_code)]

mod answer;
mod memory;
mod report;

use std::path::Path;
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, ensure, Context, Result};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::net::TcpStream;
use zerohop_bench::percentile::nearest_rank;
use zerohop_bench::procstat::disturbance::MachineTicks;
use zerohop_bench::procstat::{online_cpus, pin_current_thread, ticks_to_seconds};
use zerohop_bench::procstat::{ProcessId, TickSample};
use zerohop_bench::report::{load_average, Machine};
use zerohop_bench::systems::{self, RunningSystem, StartOpts, SystemId};
use zerohop_bench::HELLO;
use zerohop_test_support::descendants;

use crate::answer::{make_body, AnswerCheck, CHECK_STRIDE};
use crate::memory::Sampler;
use crate::report::{cannot_show, markdown, ratios, MEMORY_METHOD};

/// Body sizes, MiB.
pub const SIZES_MIB: [usize; 3] = [1, 16, 256];
/// Measured requests per size (after one warm-up): enough that the smallest point runs for
/// about a second, so 10 ms CPU ticks resolve it.
const REQUESTS: [usize; 3] = [100, 30, 10];
/// The same with `--quick`.
const REQUESTS_QUICK: [usize; 3] = [30, 10, 5];
/// zerohop's `max_body`: the largest size with room to spare.
const MAX_BODY: &str = "300MiB";
/// Longest one request may take, 256 MiB through three processes on a busy machine included.
const WAIT: Duration = Duration::from_secs(120);
/// How long `zerohop up` may take to say it is ready.
const READY: Duration = Duration::from_secs(60);
/// Others (processes and the host) taking more than this many cores make the run "busy".
const BUSY_CORES: f64 = 0.1;
const MIB: f64 = 1024.0 * 1024.0;

/// `zerohop up` of the hello chain: SIGTERM, then SIGKILL, on drop (its functions go with it).
struct ZerohopUp(Child);

impl Drop for ZerohopUp {
    fn drop(&mut self) {
        zerohop_bench::stop_child(&mut self.0, "zerohop-bench-large: zerohop up");
    }
}

/// A system under test, up.
enum Up {
    Zerohop(ZerohopUp),
    Baseline(RunningSystem),
}

/// One system of the run: where to send, and what runs it.
struct Target {
    name: &'static str,
    authority: String,
    path: String,
    up: Up,
}

impl Target {
    /// The system's processes now, named: zerohop up and everything below it (spawner,
    /// instances) by their `comm`, or the baseline's servers by their component names.
    fn processes(&self) -> Vec<(String, u32)> {
        match &self.up {
            Up::Zerohop(z) => descendants(&[z.0.id()])
                .into_iter()
                .map(|pid| {
                    let comm =
                        std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
                    (comm.trim_end().to_owned(), pid)
                })
                .collect(),
            Up::Baseline(sys) => sys
                .components
                .iter()
                .map(|c| (c.name.clone(), c.pid))
                .collect(),
        }
    }
}

/// The hello chain's spec as `examples/hello/chain.yaml` has it, with `max_body` (after the
/// `timeout` line) and the programs taken from `bin` (the example names them relative to its
/// own folder, and the copy lives elsewhere).
fn hello_spec(example: &str, bin: &Path) -> Result<String> {
    const RELATIVE: &str = "../../target/release/";
    ensure!(
        example.contains(RELATIVE),
        "the hello chain no longer names its programs under {RELATIVE}"
    );
    let bin = bin
        .to_str()
        .filter(|b| !b.contains('"'))
        .ok_or_else(|| anyhow!("{} cannot go into a YAML string", bin.display()))?;
    let mut out = String::new();
    let mut placed = false;
    for line in example.lines() {
        out.push_str(&line.replace(RELATIVE, &format!("{bin}/")));
        out.push('\n');
        if line.starts_with("timeout:") {
            out.push_str(&format!("max_body: {MAX_BODY}\n"));
            placed = true;
        }
    }
    ensure!(
        placed,
        "the hello chain has no `timeout:` line to put max_body after"
    );
    Ok(out)
}

/// Starts `zerohop up` of the hello chain with room for the largest body.
fn start_zerohop(root: &Path, bin: &Path, cpus: Option<&str>, dir: &Path) -> Result<Target> {
    let example = std::fs::read_to_string(root.join("examples/hello/chain.yaml"))
        .context("reading examples/hello/chain.yaml")?;
    let spec = dir.join("chain.yaml");
    std::fs::write(&spec, hello_spec(&example, bin)?)
        .with_context(|| format!("writing {}", spec.display()))?;
    let zerohop = zerohop_bench::need_bin(bin, "zerohop")?;
    let mut cmd = match cpus {
        // taskset execs zerohop: the pid is zerohop's, its functions inherit the CPUs.
        Some(cpus) => {
            let mut c = Command::new("taskset");
            c.args(["-c", cpus]).arg(zerohop);
            c
        }
        None => Command::new(zerohop),
    };
    let log = dir.join("zerohop.log");
    let mut child = cmd
        .arg("up")
        .arg(&spec)
        .args(["--listen", "127.0.0.1:0"])
        // Its own state folder: the hello chain of a test running beside it stays apart.
        .env("ZEROHOP_STATE_DIR", dir.join("state"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log)?)
        .spawn()
        .context("starting zerohop up")?;
    let stdout = child.stdout.take().context("stdout")?;
    let up = ZerohopUp(child);
    let line = zerohop_bench::wait_line(stdout, "ready at", READY).map_err(|_| {
        anyhow!(
            "zerohop up was not ready within {READY:?}; see {}",
            log.display()
        )
    })?;
    let authority = zerohop_test_support::listener_in(&line, "http://")
        .ok_or_else(|| anyhow!("no http:// address in {line:?}"))?;
    Ok(Target {
        name: "zerohop",
        authority,
        path: "/hello".into(),
        up: Up::Zerohop(up),
    })
}

/// Starts a baseline of the matrix serving the hello chain.
fn start_baseline(id: SystemId, name: &'static str, opts: &StartOpts) -> Result<Target> {
    let sys = systems::start(id, &HELLO, opts)?;
    let rest = sys
        .url
        .strip_prefix("http://")
        .ok_or_else(|| anyhow!("{name}: not an http:// URL: {}", sys.url))?;
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    Ok(Target {
        name,
        authority: authority.to_owned(),
        path: if path.is_empty() { "/" } else { path }.to_owned(),
        up: Up::Baseline(sys),
    })
}

/// One keep-alive connection to a system.
struct Client {
    authority: String,
    path: String,
    conn: http1::SendRequest<Full<Bytes>>,
}

impl Client {
    async fn connect(target: &Target) -> Result<Self> {
        let stream = TcpStream::connect(&target.authority)
            .await
            .with_context(|| format!("connecting to {}", target.authority))?;
        stream.set_nodelay(true)?;
        let (conn, driver) = http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(driver);
        Ok(Self {
            authority: target.authority.clone(),
            path: target.path.clone(),
            conn,
        })
    }

    /// POSTs `body` (a reference-counted clone, no copy) and checks the answer as it
    /// streams in; the time from sending to its last byte.
    async fn exchange(&mut self, body: &Bytes) -> Result<Duration> {
        let req = http::Request::post(self.path.as_str())
            .header("host", self.authority.as_str())
            .body(Full::new(body.clone()))?;
        let run = async {
            self.conn.ready().await?;
            let sent = Instant::now();
            let resp = self.conn.send_request(req).await?;
            let status = resp.status();
            let mut incoming = resp.into_body();
            if status != http::StatusCode::OK {
                let text = incoming.collect().await?.to_bytes();
                bail!(
                    "status {status}: {}",
                    String::from_utf8_lossy(&text[..text.len().min(300)]).trim_end()
                );
            }
            let mut check = AnswerCheck::new(body);
            while let Some(frame) = incoming.frame().await {
                if let Ok(data) = frame?.into_data() {
                    check.feed(&data);
                }
            }
            let took = sent.elapsed();
            check.finish()?;
            anyhow::Ok(took)
        };
        tokio::time::timeout(WAIT, run)
            .await
            .map_err(|_| anyhow!("no whole answer within {WAIT:?}"))?
    }
}

/// One warm-up and `n` measured requests of `body` to `target`; the point's figures, or
/// what went wrong first.
async fn point(target: &Target, body: &Bytes, n: usize) -> Value {
    let named = target.processes();
    let procs: Vec<(String, ProcessId)> = named
        .iter()
        .filter_map(|(name, pid)| Some((name.clone(), ProcessId::of(*pid)?)))
        .collect();
    let ids: Vec<ProcessId> = procs.iter().map(|(_, p)| *p).collect();
    let split = || -> Vec<(u64, u64)> {
        ids.iter()
            .map(|p| p.cpu_split().unwrap_or((0, 0)))
            .collect()
    };
    let sampler = Sampler::start(named.iter().map(|(_, pid)| *pid).collect());
    let measured = async {
        let mut client = Client::connect(target).await?;
        client.exchange(body).await.context("warm-up")?;
        let before = (TickSample::take(&ids), split());
        let started = Instant::now();
        let mut times = Vec::with_capacity(n);
        for i in 0..n {
            let took = client
                .exchange(body)
                .await
                .with_context(|| format!("request {} of {n}", i + 1))?;
            times.push(took.as_secs_f64());
        }
        let wall = started.elapsed().as_secs_f64();
        let ticks = TickSample::take(&ids).total_since(&before.0);
        let by_process: Vec<Value> = procs
            .iter()
            .zip(before.1.iter().zip(split()))
            .map(|((name, _), ((u0, s0), (u1, s1)))| {
                let ms = |t: u64| ticks_to_seconds(t) * 1e3 / n as f64;
                json!({
                    "process": name,
                    "user_ms_per_request": ms(u1.saturating_sub(*u0)),
                    "system_ms_per_request": ms(s1.saturating_sub(*s0)),
                })
            })
            .collect();
        anyhow::Ok((times, wall, ticks, by_process))
    }
    .await;
    let (before_kib, peak_kib, samples) = sampler.finish();
    let mut out = json!({
        "system": target.name,
        "body_mib": body.len() as f64 / MIB,
        "requests": n,
        "memory_before_mib": before_kib as f64 / 1024.0,
        "memory_peak_mib": peak_kib as f64 / 1024.0,
        "memory_samples": samples,
    });
    match measured {
        Ok((mut times, wall, ticks, by_process)) => {
            times.sort_by(f64::total_cmp);
            out["p50_ms"] = json!(nearest_rank(&times, 0.5).map(|s| s * 1e3));
            out["max_ms"] = json!(times.last().map(|s| s * 1e3));
            out["mib_per_s"] = json!(n as f64 * body.len() as f64 / MIB / wall);
            out["cpu_ticks"] = json!(ticks);
            out["cpu_ms_per_request"] = json!(ticks_to_seconds(ticks) * 1e3 / n as f64);
            out["cpu_by_process"] = json!(by_process);
        }
        Err(e) => out["error"] = json!(format!("{e:#}")),
    }
    out
}

fn run() -> Result<bool> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (quick, out) = zerohop_bench::report_args(&args);
    let cores = online_cpus();
    let system_cpus = (cores >= 2 && !args.iter().any(|a| a == "--no-pin")).then(|| {
        if cores == 2 {
            "1".to_owned()
        } else {
            format!("1-{}", cores - 1)
        }
    });
    if system_cpus.is_some() {
        // The client, the sampler (spawned from here, so it inherits it) on CPU 0.
        pin_current_thread(0);
    }
    let bin = zerohop_bench::bin_dir(None)?;
    let root = zerohop_bench::checkout(&bin, "examples/hello/chain.yaml")?;
    let scratch = tempfile::Builder::new()
        .prefix("zerohop-bench-large-")
        .tempdir_in(root.join("target"))?;
    let opts = StartOpts {
        cpus: system_cpus.clone(),
        gateway_threads: None,
        pipelines: false,
        instances: 1,
        bin_dir: bin.clone(),
        work_dir: scratch.path().to_owned(),
        tls: None,
    };
    let machine = Machine::read();
    let load_before = load_average();
    let ticks = MachineTicks::now();
    let mut failed = Vec::new();
    let mut targets = Vec::new();
    // One after the other, each up before the next starts.
    let started = [
        (
            "zerohop",
            start_zerohop(&root, &bin, system_cpus.as_deref(), scratch.path()),
        ),
        (
            "monolith",
            start_baseline(SystemId::Monolith, "monolith", &opts),
        ),
        (
            "http-chain",
            start_baseline(SystemId::HttpChain, "http-chain", &opts),
        ),
    ];
    for (name, start) in started {
        match start {
            Ok(t) => targets.push(t),
            Err(e) => {
                eprintln!("zerohop-bench-large: {name} did not start: {e:#}");
                failed.push(json!({ "system": name, "error": format!("{e:#}") }));
            }
        }
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let counts = if quick { REQUESTS_QUICK } else { REQUESTS };
    let mut points = Vec::new();
    // Size by size, the systems one after the other: a disturbance of the machine falls on
    // all of them alike.
    for (mib, n) in SIZES_MIB.into_iter().zip(counts) {
        let body = make_body(mib << 20);
        for target in &targets {
            eprintln!("zerohop-bench-large: {} MiB x {n} to {}", mib, target.name);
            let p = rt.block_on(point(target, &body, n));
            if let Some(e) = p["error"].as_str() {
                eprintln!("zerohop-bench-large: {} {mib} MiB: {e}", target.name);
            }
            points.push(p);
        }
    }
    drop(targets);
    let disturbance = ticks.since();
    let ok = failed.is_empty() && points.iter().all(|p| p["error"].is_null());
    let report = json!({
        "machine": machine,
        "quick": quick,
        "system_cpus": system_cpus,
        "max_body": MAX_BODY,
        "check_stride": CHECK_STRIDE,
        "memory_method": MEMORY_METHOD,
        "load_before": load_before,
        "load_after": load_average(),
        "busy": disturbance.exceeds(BUSY_CORES),
        "disturbance": disturbance,
        "not_started": failed,
        "points": points,
        "ratios": ratios(&points, &["monolith", "http-chain"]),
        "cannot_show": cannot_show(cores),
    });
    let summary = if ok {
        "zerohop-bench-large: every answer right".to_owned()
    } else {
        "zerohop-bench-large: some requests failed or were answered wrongly".to_owned()
    };
    zerohop_bench::report::publish(&out, "large", &report, &markdown(&report), Some(&summary))?;
    Ok(ok)
}

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("zerohop-bench-large: {e:#}");
            ExitCode::from(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_spec_is_the_hello_chain_with_room_for_the_largest_body() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let example = std::fs::read_to_string(root.join("examples/hello/chain.yaml")).unwrap();
        let spec = hello_spec(&example, Path::new("/opt/zh/bin")).unwrap();
        assert!(spec.contains("command: [\"/opt/zh/bin/upper\"]"), "{spec}");
        assert!(
            spec.contains("command: [\"/opt/zh/bin/exclaim\"]"),
            "{spec}"
        );
        assert!(spec.contains("\nmax_body: 300MiB\n"), "{spec}");
        assert!(spec.contains("sequence: [upper, exclaim]"), "{spec}");
        assert!(!spec.contains("../"), "{spec}");
        assert!(hello_spec("name: x\n", Path::new("/b")).is_err());
    }
}
