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

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use bytes::Bytes;
use clap::Parser;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use serde::{Deserialize, Serialize};
use tokio::net::{TcpStream, UnixStream};
use zerohop_bench::percentile::nearest_rank;
use zerohop_bench::report::Machine;
use zerohop_pool::monotonic_ns;

/// What the issue asks of a parked activation.
const TARGET_US: f64 = 30.0;
/// The chain's name on the daemon.
const CHAIN: &str = "activation";
/// Bound on any single wait: the daemon's start, a function reaching zero, a request.
const WAIT: Duration = Duration::from_secs(20);
/// How often the status is read while waiting for zero.
const POLL: Duration = Duration::from_millis(20);

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

// ---------------------------------------------------------------------------------------
// The daemon's status, as far as this benchmark reads it (a subset of
// `zerohop_agent::api::ChainStatus`; unknown fields are ignored, so the bench does not
// depend on the agent crate).

#[derive(Deserialize, Debug)]
struct ChainStatus {
    listeners: Vec<String>,
    functions: Vec<FunctionStatus>,
}

#[derive(Deserialize, Debug)]
struct FunctionStatus {
    name: String,
    ready: usize,
    #[serde(default)]
    parked: usize,
    instances: Vec<InstanceStatus>,
}

#[derive(Deserialize, Debug)]
struct InstanceStatus {
    pid: Option<u32>,
    state: String,
    #[serde(default)]
    activated_ns: Option<u64>,
    #[serde(default)]
    activation: Option<String>,
}

#[derive(Deserialize)]
struct ApplyResponse {
    status: ChainStatus,
}

impl ChainStatus {
    fn function(&self, name: &str) -> Result<&FunctionStatus> {
        self.functions
            .iter()
            .find(|f| f.name == name)
            .ok_or_else(|| anyhow!("the chain's status has no function {name:?}"))
    }
}

// ---------------------------------------------------------------------------------------
// Output.

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
enum Variant {
    Parked,
    Cold,
    Ready,
}

impl Variant {
    const ALL: [Variant; 3] = [Variant::Parked, Variant::Cold, Variant::Ready];

    /// The function's and its route's name.
    fn name(self) -> &'static str {
        match self {
            Variant::Parked => "parked",
            Variant::Cold => "cold",
            Variant::Ready => "ready",
        }
    }
}

/// One measured round, microseconds unless named otherwise (the activation's parts are
/// `None` for `ready`, which has none).
#[derive(Serialize, Clone, Debug)]
struct Sample {
    /// Decision to handler start.
    activation_us: Option<f64>,
    /// The first request, sent to answer received.
    first_request_us: f64,
    /// Client send to the scaler's decision.
    send_to_decision_us: Option<f64>,
    /// Client send to handler start.
    send_to_take_us: f64,
    /// Handler start to the answer received by the client.
    take_to_answer_us: f64,
    /// Decision to the function's `main` (cold starts only).
    decision_to_main_us: Option<f64>,
    /// `main` to handler start (cold starts only).
    main_to_take_us: Option<f64>,
    /// The warm requests after it, sent to answer received.
    warm_us: Vec<f64>,
    pid: u32,
    /// The moments themselves (`CLOCK_MONOTONIC` ns), to find the round in a trace taken
    /// with the same clock (`perf record -k mono`).
    sent_ns: u64,
    decided_ns: Option<u64>,
    take_ns: u64,
    received_ns: u64,
}

/// A round that did not measure what it should have.
#[derive(Serialize, Debug)]
struct Discarded {
    variant: Variant,
    why: String,
}

/// Order statistics of one quantity, microseconds (nearest rank: with n samples, p99 is the
/// largest once n < 100).
#[derive(Serialize, Clone, Copy, Debug, Default)]
struct Stats {
    n: usize,
    median: f64,
    p90: f64,
    p99: f64,
    min: f64,
    max: f64,
}

impl Stats {
    fn of(values: impl IntoIterator<Item = f64>) -> Self {
        let mut v: Vec<f64> = values.into_iter().collect();
        if v.is_empty() {
            return Self::default();
        }
        v.sort_by(f64::total_cmp);
        let rank = |q: f64| nearest_rank(&v, q).unwrap_or_default();
        Self {
            n: v.len(),
            median: rank(0.5),
            p90: rank(0.9),
            p99: rank(0.99),
            min: v[0],
            max: v[v.len() - 1],
        }
    }
}

#[derive(Serialize)]
struct VariantReport {
    #[serde(skip_serializing_if = "Option::is_none")]
    activation_us: Option<Stats>,
    first_request_us: Stats,
    warm_us: Stats,
    #[serde(skip_serializing_if = "Option::is_none")]
    send_to_decision_us: Option<Stats>,
    send_to_take_us: Stats,
    take_to_answer_us: Stats,
    #[serde(skip_serializing_if = "Option::is_none")]
    decision_to_main_us: Option<Stats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    main_to_take_us: Option<Stats>,
    samples: Vec<Sample>,
}

impl VariantReport {
    fn of(samples: Vec<Sample>) -> Self {
        let field = |f: fn(&Sample) -> f64| Stats::of(samples.iter().map(f));
        let optional = |f: fn(&Sample) -> Option<f64>| {
            let v: Vec<f64> = samples.iter().filter_map(f).collect();
            (!v.is_empty()).then(|| Stats::of(v))
        };
        Self {
            activation_us: optional(|s| s.activation_us),
            first_request_us: field(|s| s.first_request_us),
            warm_us: Stats::of(samples.iter().flat_map(|s| s.warm_us.iter().copied())),
            send_to_decision_us: optional(|s| s.send_to_decision_us),
            send_to_take_us: field(|s| s.send_to_take_us),
            take_to_answer_us: field(|s| s.take_to_answer_us),
            decision_to_main_us: optional(|s| s.decision_to_main_us),
            main_to_take_us: optional(|s| s.main_to_take_us),
            samples,
        }
    }

    /// The median activation (0 without samples).
    fn activation_median(&self) -> f64 {
        self.activation_us.map_or(0.0, |s| s.median)
    }
}

#[derive(Serialize)]
struct Settings {
    rounds_per_variant: usize,
    warm_per_round: usize,
    zero_after_ms: u64,
    settle_ms: u64,
    gateway_threads: u16,
    via: &'static str,
}

/// The machine's floor for the one step a parked activation cannot avoid: waking a process
/// asleep on a futex (from `zerohop_bench::floors`, `futex_rtt`, halved: a round trip is two
/// wakes).
#[derive(Serialize)]
struct FutexFloor {
    /// Median of one wake, microseconds.
    wake_median_us: f64,
    /// Median parked activation over it: how many such wakes an activation costs.
    parked_activation_over_wake: f64,
    /// 99th percentile of the round trip, halved, microseconds.
    wake_p99_us: f64,
    /// How it was measured.
    what: String,
}

#[derive(Serialize)]
struct Report {
    machine: Machine,
    futex_floor: Option<FutexFloor>,
    /// `uptime`'s load averages when the run began (a busy machine lengthens everything).
    loadavg_before: String,
    settings: Settings,
    parked: VariantReport,
    cold: VariantReport,
    ready: VariantReport,
    /// Cold median activation over parked median activation.
    cold_over_parked: f64,
    /// Median first request over median warm request, per variant.
    first_over_warm_parked: f64,
    first_over_warm_cold: f64,
    /// Median first request of a variant over that of `ready` (same pause, no activation).
    first_parked_over_ready: f64,
    first_cold_over_ready: f64,
    target_us: f64,
    /// Whether the parked median activation is under the target.
    target_met: bool,
    discarded: Vec<Discarded>,
    errors: Vec<String>,
    ok: bool,
}

// ---------------------------------------------------------------------------------------
// The daemon.

/// `zerohop agent` on a socket of its own: SIGTERM on drop (it stops the chain and every
/// instance), SIGKILL if it lingers.
struct Daemon {
    child: Child,
    socket: PathBuf,
}

impl Daemon {
    fn start(zerohop: &Path, dir: &Path) -> Result<Self> {
        let socket = dir.join("admin.sock");
        let log = std::fs::File::create(dir.join("daemon.log"))?;
        let mut child = Command::new(zerohop)
            .arg("agent")
            .arg("--socket")
            .arg(&socket)
            .args(["--metrics", "none"])
            .env_remove("ZEROHOP_SOCKET")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .context("starting zerohop agent")?;
        let out = child.stdout.take().context("stdout")?;
        let daemon = Self { child, socket };
        zerohop_bench::wait_line(out, "daemon ready on ", WAIT).map_err(|_| {
            anyhow!(
                "zerohop agent did not say it was ready within {WAIT:?}; see {}",
                dir.join("daemon.log").display()
            )
        })?;
        Ok(daemon)
    }

    /// One admin API call; the answer's body. A connection each, as the CLI does.
    async fn call(&self, method: http::Method, path: &str, body: Option<Vec<u8>>) -> Result<Bytes> {
        let stream = UnixStream::connect(&self.socket)
            .await
            .with_context(|| format!("connecting to {}", self.socket.display()))?;
        let (mut sender, conn) = http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let req = http::Request::builder()
            .method(method)
            .uri(format!("/v1{path}"))
            .header(http::header::HOST, "zerohop")
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body.unwrap_or_default())))?;
        let resp = tokio::time::timeout(WAIT, async {
            let resp = sender.send_request(req).await?;
            let status = resp.status();
            let bytes = resp.into_body().collect().await?.to_bytes();
            anyhow::Ok((status, bytes))
        })
        .await
        .map_err(|_| anyhow!("the daemon did not answer {path} within {WAIT:?}"))??;
        if !resp.0.is_success() {
            bail!(
                "the daemon answered {path} with {}: {}",
                resp.0,
                String::from_utf8_lossy(&resp.1).trim()
            );
        }
        Ok(resp.1)
    }

    async fn status(&self) -> Result<ChainStatus> {
        let bytes = self
            .call(http::Method::GET, &format!("/chains/{CHAIN}"), None)
            .await?;
        serde_json::from_slice(&bytes).context("the daemon's status is not the JSON expected")
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        zerohop_bench::stop_child(&mut self.child, "zerohop-bench-activation: zerohop agent");
    }
}

// ---------------------------------------------------------------------------------------
// The chain's HTTP side.

/// One keep-alive connection to the chain's listener, reopened (outside any measured span)
/// when the gateway closed it.
struct Client {
    authority: String,
    conn: Option<http1::SendRequest<Full<Bytes>>>,
}

/// What the stamp function answered.
struct Stamp {
    take_ns: u64,
    main_ns: u64,
    pid: u32,
    nth: u64,
}

impl Client {
    /// A connection that can take a request now.
    async fn ready(&mut self) -> Result<()> {
        if let Some(c) = &mut self.conn {
            if !c.is_closed() && c.ready().await.is_ok() {
                return Ok(());
            }
        }
        let stream = TcpStream::connect(&self.authority)
            .await
            .with_context(|| format!("connecting to {}", self.authority))?;
        stream.set_nodelay(true)?;
        let (send, conn) = http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        self.conn = Some(send);
        Ok(())
    }

    /// POSTs to `path` on a ready connection; the stamp and the client's send and receive
    /// times (`CLOCK_MONOTONIC`, ns).
    async fn post(&mut self, path: &str) -> Result<(Stamp, u64, u64)> {
        self.ready().await?;
        let c = self.conn.as_mut().expect("connected above");
        let req = http::Request::post(path)
            .header(http::header::HOST, self.authority.as_str())
            .body(Full::new(Bytes::from_static(b"x")))?;
        let sent = monotonic_ns();
        let exchange = async {
            let resp = c.send_request(req).await?;
            let status = resp.status();
            let body = resp.into_body().collect().await?.to_bytes();
            anyhow::Ok((status, body))
        };
        let outcome = tokio::time::timeout(WAIT, exchange).await;
        let received = monotonic_ns();
        let (status, body) = match outcome {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => {
                self.conn = None;
                bail!("POST {path}: {e}");
            }
            Err(_) => {
                self.conn = None;
                bail!("POST {path}: no answer within {WAIT:?}");
            }
        };
        let text = String::from_utf8_lossy(&body);
        if status != http::StatusCode::OK {
            bail!("POST {path}: status {status}: {}", text.trim());
        }
        let fields: Vec<u64> = text
            .split_whitespace()
            .map(str::parse)
            .collect::<Result<_, _>>()
            .map_err(|_| anyhow!("POST {path}: not a stamp: {text:?}"))?;
        let [take_ns, main_ns, pid, nth] = fields[..] else {
            bail!("POST {path}: not a stamp: {text:?}");
        };
        Ok((
            Stamp {
                take_ns,
                main_ns,
                pid: pid as u32,
                nth,
            },
            sent,
            received,
        ))
    }
}

// ---------------------------------------------------------------------------------------
// Rounds.

struct Bench {
    daemon: Daemon,
    client: Client,
    warm: usize,
    settle: Duration,
}

/// Why a round does not count (kept apart from errors: the run goes on).
enum Outcome {
    Measured(Sample),
    Discarded(String),
}

fn us(from_ns: u64, to_ns: u64) -> f64 {
    (to_ns as f64 - from_ns as f64) / 1_000.0
}

impl Bench {
    /// Waits until neither function has an instance ready, `parked` has its parked one and
    /// `cold` none with a process; returns the parked instance's pid.
    async fn wait_at_zero(&self) -> Result<u32> {
        let deadline = Instant::now() + WAIT;
        loop {
            let s = self.daemon.status().await?;
            let (p, c) = (s.function("parked")?, s.function("cold")?);
            let parked_pid = p
                .instances
                .iter()
                .find(|i| i.state == "parked")
                .and_then(|i| i.pid);
            let at_zero = p.ready == 0
                && p.parked == 1
                && p.instances.iter().all(|i| i.state == "parked")
                && c.ready == 0
                && c.parked == 0
                && c.instances.iter().all(|i| i.pid.is_none());
            if let (true, Some(pid)) = (at_zero, parked_pid) {
                return Ok(pid);
            }
            if Instant::now() >= deadline {
                bail!(
                    "the functions did not reach zero within {WAIT:?} (parked: {} ready, {} \
                     parked, {:?}; cold: {} ready, {:?})",
                    p.ready,
                    p.parked,
                    p.instances.iter().map(|i| &i.state).collect::<Vec<_>>(),
                    c.ready,
                    c.instances.iter().map(|i| &i.state).collect::<Vec<_>>()
                );
            }
            tokio::time::sleep(POLL).await;
        }
    }

    async fn round(&mut self, v: Variant) -> Result<Outcome> {
        // `ready` too is measured with the others at zero: the same quiet chain.
        let parked_pid = self.wait_at_zero().await?;
        // Connected (and the connection checked) before the quiet time, so nothing but the
        // request itself runs after it.
        self.client.ready().await?;
        tokio::time::sleep(self.settle).await;
        let path = format!("/{}", v.name());
        let (stamp, sent, received) = self.client.post(&path).await?;
        let mut warm_us = Vec::with_capacity(self.warm);
        for _ in 0..self.warm {
            let (w, s, r) = self.client.post(&path).await?;
            if w.pid != stamp.pid {
                return Ok(Outcome::Discarded(format!(
                    "a warm request was served by pid {}, not the activated {}",
                    w.pid, stamp.pid
                )));
            }
            warm_us.push(us(s, r));
        }
        let common = |decided: Option<u64>| Sample {
            activation_us: decided.map(|d| us(d, stamp.take_ns)),
            first_request_us: us(sent, received),
            send_to_decision_us: decided.map(|d| us(sent, d)),
            send_to_take_us: us(sent, stamp.take_ns),
            take_to_answer_us: us(stamp.take_ns, received),
            decision_to_main_us: None,
            main_to_take_us: None,
            warm_us: warm_us.clone(),
            pid: stamp.pid,
            sent_ns: sent,
            decided_ns: decided,
            take_ns: stamp.take_ns,
            received_ns: received,
        };
        if v == Variant::Ready {
            // An instance that has served before: nothing to check but that it is the one.
            return Ok(Outcome::Measured(common(None)));
        }
        let status = self.daemon.status().await?;
        let f = status.function(v.name())?;
        let Some(inst) = f.instances.iter().find(|i| i.pid == Some(stamp.pid)) else {
            return Ok(Outcome::Discarded(format!(
                "the status lists no instance with pid {} after the request",
                stamp.pid
            )));
        };
        let (Some(decided), Some(how)) = (inst.activated_ns, inst.activation.as_deref()) else {
            return Ok(Outcome::Discarded(
                "the instance that answered has no activation stamp".into(),
            ));
        };
        if stamp.nth != 1 {
            return Ok(Outcome::Discarded(format!(
                "the first request was request {} of its instance (it was not at zero)",
                stamp.nth
            )));
        }
        if how != v.name() {
            return Ok(Outcome::Discarded(format!(
                "activated {how}, not {}",
                v.name()
            )));
        }
        if v == Variant::Parked && stamp.pid != parked_pid {
            return Ok(Outcome::Discarded(format!(
                "served by pid {}, not the parked instance {parked_pid}",
                stamp.pid
            )));
        }
        if !(sent..=stamp.take_ns).contains(&decided) {
            return Ok(Outcome::Discarded(format!(
                "the decision ({decided} ns) is not between the send ({sent} ns) and the \
                 handler's start ({} ns)",
                stamp.take_ns
            )));
        }
        let cold = v == Variant::Cold;
        Ok(Outcome::Measured(Sample {
            decision_to_main_us: cold.then(|| us(decided, stamp.main_ns)),
            main_to_take_us: cold.then(|| us(stamp.main_ns, stamp.take_ns)),
            ..common(Some(decided))
        }))
    }
}

fn spec(stamp: &Path, zero_after_ms: u64) -> Result<String> {
    let command = serde_json::to_string(&stamp.display().to_string())?;
    let mut s = format!("name: {CHAIN}\ngateway_threads: 1\ntimeout: 10s\nfunctions:\n");
    for (name, parked) in [("parked", 1), ("cold", 0)] {
        let _ = writeln!(
            s,
            "  {name}:\n    command: [{command}]\n    instances: 0\n    scale: {{ min: 0, \
             max: 1, parked: {parked}, zero_after: {zero_after_ms}ms }}"
        );
    }
    let _ = writeln!(s, "  ready:\n    command: [{command}]\n    instances: 1");
    s.push_str("routes:\n");
    for name in Variant::ALL.map(Variant::name) {
        let _ = writeln!(s, "  - http: POST /{name}\n    sequence: [{name}]");
    }
    Ok(s)
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

// ---------------------------------------------------------------------------------------
// The report.

fn summary_line(r: &Report) -> String {
    let parked = r.parked.activation_us.unwrap_or_default();
    format!(
        "activation: parked median {:.1} us (p99 {:.1}), cold median {:.0} us: cold/parked = \
         {:.0} x",
        parked.median,
        parked.p99,
        r.cold.activation_median(),
        r.cold_over_parked
    )
}

fn markdown(r: &Report) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# Activation: a function scaled to zero serves again\n");
    let _ = writeln!(
        s,
        "{} rounds per variant on the node daemon (one gateway thread), each after the same \
         pause with `parked` and `cold` at zero: one request, then {} warm ones to the same \
         instance. Activation is the scaler's decision (`activated_ns` in the status) to the \
         handler's start, on one clock (`CLOCK_MONOTONIC`); `ready` is a function that never \
         scaled to zero. {} cores, {}, load average before the run: {}.\n",
        r.settings.rounds_per_variant,
        r.settings.warm_per_round,
        r.machine.cores,
        r.machine.cpu_model,
        r.loadavg_before
    );
    let _ = writeln!(
        s,
        "| microseconds | n | median | p90 | p99 | min | max |\n|---|---|---|---|---|---|---|"
    );
    let mut row = |name: &str, st: Option<&Stats>| {
        if let Some(st) = st {
            let _ = writeln!(
                s,
                "| {name} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} |",
                st.n, st.median, st.p90, st.p99, st.min, st.max
            );
        }
    };
    let (p, c, w) = (&r.parked, &r.cold, &r.ready);
    row("**activation, parked**", p.activation_us.as_ref());
    row("**activation, cold**", c.activation_us.as_ref());
    row("first request, parked", Some(&p.first_request_us));
    row("first request, cold", Some(&c.first_request_us));
    row(
        "first request, ready (no activation)",
        Some(&w.first_request_us),
    );
    row("warm requests, parked", Some(&p.warm_us));
    row("warm requests, cold", Some(&c.warm_us));
    row("warm requests, ready", Some(&w.warm_us));
    row(
        "parked: client send to decision",
        p.send_to_decision_us.as_ref(),
    );
    row(
        "parked: handler to answer received",
        Some(&p.take_to_answer_us),
    );
    row(
        "cold: client send to decision",
        c.send_to_decision_us.as_ref(),
    );
    row("cold: decision to `main`", c.decision_to_main_us.as_ref());
    row("cold: `main` to handler", c.main_to_take_us.as_ref());
    row(
        "cold: handler to answer received",
        Some(&c.take_to_answer_us),
    );
    row("ready: client send to handler", Some(&w.send_to_take_us));
    row(
        "ready: handler to answer received",
        Some(&w.take_to_answer_us),
    );
    let _ = writeln!(
        s,
        "\nCold over parked activation (medians): **{:.0}x**. First request over the warm ones \
         (medians): parked {:.2}x, cold {:.1}x; over the first request to `ready`: parked \
         {:.2}x, cold {:.1}x.\n",
        r.cold_over_parked,
        r.first_over_warm_parked,
        r.first_over_warm_cold,
        r.first_parked_over_ready,
        r.first_cold_over_ready
    );
    let parked = p.activation_us.unwrap_or_default();
    let _ = writeln!(
        s,
        "Target: parked activation under {:.0} us: **{}** (median {:.1} us, p99 {:.1} us).",
        r.target_us,
        if r.target_met { "met" } else { "missed" },
        parked.median,
        parked.p99
    );
    if let Some(f) = &r.futex_floor {
        let _ = writeln!(
            s,
            "\nFloor of this machine: waking a process asleep on a futex takes {:.1} us \
             (median; p99 {:.1} us), half the round trip of `futex_rtt` ({}); a parked \
             activation costs {:.1} of those.",
            f.wake_median_us, f.wake_p99_us, f.what, f.parked_activation_over_wake
        );
    }
    if !r.discarded.is_empty() {
        let _ = writeln!(s, "\nDiscarded rounds:\n");
        for d in &r.discarded {
            let _ = writeln!(s, "- {}: {}", d.variant.name(), d.why);
        }
    }
    if !r.errors.is_empty() {
        let _ = writeln!(s, "\nErrors:\n");
        for e in &r.errors {
            let _ = writeln!(s, "- {e}");
        }
    }
    s
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
