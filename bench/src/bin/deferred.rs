//! `zerohop-bench-async`: what an async invocation costs beside the same request run
//! synchronously, on the hello chain under the real `zerohop up`, in one run.
//!
//! One keep-alive client sends requests one at a time (nothing else in flight, so each
//! figure is a latency, not a queueing delay):
//! * **sync**: `POST /hello`, until its `200`;
//! * **async accept**: the same with `Prefer: respond-async` and an `X-Callback-Url`, until
//!   its `202` (the request is on disk, fsync'd, when it comes);
//! * **async end to end**: from sending that request until its result reaches the callback
//!   (a hyper server in this process), i.e. queue, run, record, POST.
//!
//! Reported as p50/p99 and as ratios to sync. `--quick` sends fewer requests; `--out DIR`
//! (default `results`) receives `async.md` and `async.json`. Exits 1 when a request failed, a
//! callback did not come, or it could not run.

use std::collections::HashMap;
use std::convert::Infallible;
use std::path::Path;
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::net::{TcpListener, TcpStream};
use zerohop_bench::percentile::nearest_rank;
use zerohop_pool::monotonic_ns;

/// Longest any one request or callback may take.
const WAIT: Duration = Duration::from_secs(10);

/// Callbacks that arrived, by request id: when (a callback may come before its 202 has been
/// read, so arrivals are kept until looked for).
type Arrivals = Arc<Mutex<HashMap<String, u64>>>;

/// `zerohop up` of the hello chain: SIGTERM, then SIGKILL, on drop.
struct Chain(Child);

impl Drop for Chain {
    fn drop(&mut self) {
        zerohop_bench::stop_child(&mut self.0, "zerohop-bench-async: zerohop up");
    }
}

/// Receives callbacks on a free loopback port; returns its URL.
async fn callback_server(arrivals: Arrivals) -> Result<String> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/done", listener.local_addr()?);
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let arrivals = arrivals.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req: http::Request<_>| {
                    let at = monotonic_ns();
                    let id = req
                        .headers()
                        .get("x-zerohop-request-id")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or_default()
                        .to_owned();
                    arrivals
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(id, at);
                    async { Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::new()))) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Ok(url)
}

/// One keep-alive connection to the gateway.
struct Client {
    authority: String,
    conn: http1::SendRequest<Full<Bytes>>,
}

impl Client {
    async fn connect(authority: &str) -> Result<Self> {
        let stream = TcpStream::connect(authority)
            .await
            .with_context(|| format!("connecting to {authority}"))?;
        stream.set_nodelay(true)?;
        let (conn, driver) = http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(driver);
        Ok(Self {
            authority: authority.to_owned(),
            conn,
        })
    }

    /// POSTs `hello` with `headers`; the status, body, and the time it was sent.
    async fn post(&mut self, headers: &[(&str, &str)]) -> Result<(u16, Bytes, u64)> {
        self.conn.ready().await?;
        let mut req = http::Request::post("/hello").header("host", self.authority.as_str());
        for (n, v) in headers {
            req = req.header(*n, *v);
        }
        let req = req.body(Full::new(Bytes::from_static(b"hello")))?;
        let sent = monotonic_ns();
        let exchange = async {
            let resp = self.conn.send_request(req).await?;
            let status = resp.status().as_u16();
            let body = resp.into_body().collect().await?.to_bytes();
            anyhow::Ok((status, body))
        };
        let (status, body) = tokio::time::timeout(WAIT, exchange)
            .await
            .map_err(|_| anyhow!("no answer within {WAIT:?}"))??;
        Ok((status, body, sent))
    }
}

/// Microseconds from nanosecond stamps.
fn us(from: u64, to: u64) -> f64 {
    to.saturating_sub(from) as f64 / 1000.0
}

/// p50 and p99 of `samples` (microseconds).
fn summary(mut samples: Vec<f64>) -> Value {
    samples.sort_by(f64::total_cmp);
    json!({
        "n": samples.len(),
        "p50_us": nearest_rank(&samples, 0.50),
        "p99_us": nearest_rank(&samples, 0.99),
    })
}

async fn measure(authority: &str, n: usize) -> Result<Value> {
    let arrivals: Arrivals = Arc::default();
    let callback = callback_server(arrivals.clone()).await?;
    let mut client = Client::connect(authority).await?;
    // Warm-up: connections, instances, the queue's folder.
    for _ in 0..20 {
        client.post(&[]).await?;
    }
    let mut sync = Vec::with_capacity(n);
    for _ in 0..n {
        let (status, body, sent) = client.post(&[]).await?;
        if status != 200 || &body[..] != b"HELLO!" {
            bail!(
                "sync: status {status}, body {:?}",
                String::from_utf8_lossy(&body)
            );
        }
        sync.push(us(sent, monotonic_ns()));
    }
    let (mut accept, mut end_to_end) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for _ in 0..n {
        let (status, body, sent) = client
            .post(&[
                ("prefer", "respond-async"),
                ("x-callback-url", callback.as_str()),
            ])
            .await?;
        let accepted = monotonic_ns();
        if status != 202 {
            bail!(
                "async: status {status}, body {:?}",
                String::from_utf8_lossy(&body)
            );
        }
        let answer: Value = serde_json::from_slice(&body).context("the 202's JSON")?;
        let id = answer["id"]
            .as_str()
            .context("no id in the 202")?
            .to_owned();
        // The arrival is stamped by the callback server; how soon it is looked for here
        // does not change it.
        let waited = tokio::time::Instant::now();
        let arrived = loop {
            let got = arrivals
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&id);
            if let Some(at) = got {
                break at;
            }
            if waited.elapsed() > WAIT {
                bail!("no callback for {id} within {WAIT:?}");
            }
            tokio::time::sleep(Duration::from_micros(200)).await;
        };
        accept.push(us(sent, accepted));
        end_to_end.push(us(sent, arrived));
    }
    Ok(json!({
        "requests": n,
        "sync": summary(sync),
        "async_accept": summary(accept),
        "async_end_to_end": summary(end_to_end),
    }))
}

fn ratio(a: &Value, b: &Value) -> String {
    match (a.as_f64(), b.as_f64()) {
        (Some(a), Some(b)) if b > 0.0 => format!("{:.2}", a / b),
        _ => "-".into(),
    }
}

fn markdown(r: &Value) -> String {
    let mut s = String::from(
        "# Async invocations beside synchronous ones (hello chain, one request at a time)\n\n\
         | | p50 (us) | p99 (us) | p50 / sync | p99 / sync |\n|---|---|---|---|---|\n",
    );
    let sync = &r["sync"];
    for (name, key) in [
        ("sync: POST until 200", "sync"),
        ("async: POST until 202 (on disk)", "async_accept"),
        ("async: POST until the callback", "async_end_to_end"),
    ] {
        let row = &r[key];
        s.push_str(&format!(
            "| {name} | {:.0} | {:.0} | {} | {} |\n",
            row["p50_us"].as_f64().unwrap_or(f64::NAN),
            row["p99_us"].as_f64().unwrap_or(f64::NAN),
            ratio(&row["p50_us"], &sync["p50_us"]),
            ratio(&row["p99_us"], &sync["p99_us"]),
        ));
    }
    s.push_str(&format!(
        "\n{} requests of each kind; the async queue on {} (its fsync is most of the 202's \
         time).\n",
        r["requests"],
        r["state_dir_fs"]
            .as_str()
            .unwrap_or("an unknown file system")
    ));
    s
}

/// The file system type of `dir`'s mount, from /proc/self/mounts (the longest prefix).
fn fs_type(dir: &Path) -> String {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_owned());
    mounts
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() > 2 && dir.starts_with(f[1])).then(|| (f[1].len(), f[2].to_owned()))
        })
        .max()
        .map_or_else(|| "unknown".into(), |(_, t)| t)
}

fn run() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (quick, out) = zerohop_bench::report_args(&args);
    let bin = zerohop_bench::bin_dir(None)?;
    let root = zerohop_bench::checkout(&bin, "examples/hello/chain.yaml")?;
    let state = tempfile::Builder::new()
        .prefix("zerohop-bench-async-")
        .tempdir_in(root.join("target"))?;
    let mut child = Command::new(zerohop_bench::need_bin(&bin, "zerohop")?)
        .arg("up")
        .arg(root.join("examples/hello/chain.yaml"))
        .args(["--listen", "127.0.0.1:0"])
        .env("ZEROHOP_STATE_DIR", state.path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("starting zerohop up")?;
    let stdout = child.stdout.take().context("stdout")?;
    let chain = Chain(child);
    let line = zerohop_bench::wait_line(stdout, "ready at", Duration::from_secs(60))
        .map_err(|_| anyhow!("zerohop up was not ready within 60 s"))?;
    let authority = zerohop_test_support::listener_in(&line, "http://")
        .ok_or_else(|| anyhow!("no http:// address in {line:?}"))?;
    let n = if quick { 300 } else { 2000 };
    eprintln!("zerohop-bench-async: {n} sync, then {n} async requests to {authority}");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut report = rt.block_on(measure(&authority, n))?;
    drop(chain);
    report["state_dir_fs"] = json!(fs_type(state.path()));
    zerohop_bench::report::publish(&out, "async", &report, &markdown(&report), None)
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("zerohop-bench-async: {e:#}");
            ExitCode::from(1)
        }
    }
}
