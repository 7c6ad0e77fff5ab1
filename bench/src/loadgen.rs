//! The load generator every system is driven by: HTTP/1.1 keep-alive connections (hyper's
//! client, the same library as the servers), every answer checked against the expected
//! body, latencies in an HDR histogram.
//!
//! * Closed loop: `concurrency` connections, each sends its next request when the previous
//!   answer arrived. Measures peak throughput at that concurrency.
//! * Open loop: requests are scheduled at a constant rate, request `i` at `start + i/rate`,
//!   and latency counts from that intended time, so a stalled system is charged for the
//!   requests it delayed (no coordinated omission). A pool of connections sends them; when all
//!   are busy the wait shows up as latency, as it would for a real client.
//!
//! [`run`] drives the load from one tokio current-thread runtime on the calling thread, so it
//! uses one core; the caller pins that thread. [`run_on`] splits the connections (and an open
//! loop's rate) over one such thread per CPU it is given, each pinned to its CPU, and merges
//! their histograms: the multi-core point's load generator, on cores of its own.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use hdrhistogram::Histogram;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::Step;

/// Request bodies of a run.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub enum BodyMix {
    /// Every body this many bytes.
    Fixed(usize),
    /// SPRIGHT's mix: 98% of 100 B, 2% of 10 KB.
    Spright,
}

impl BodyMix {
    /// Label for reports: `100B`, `10KB`, `1MiB`, `mix`.
    pub fn label(&self) -> String {
        match self {
            BodyMix::Fixed(n) if *n >= 1 << 20 && n % (1 << 20) == 0 => {
                format!("{}MiB", n >> 20)
            }
            BodyMix::Fixed(n) if *n >= 1000 && n % 1000 == 0 => format!("{}KB", n / 1000),
            BodyMix::Fixed(n) => format!("{n}B"),
            BodyMix::Spright => "mix".into(),
        }
    }

    /// The body sizes used, and how request `i` picks one.
    fn sizes(&self) -> Vec<usize> {
        match self {
            BodyMix::Fixed(n) => vec![*n],
            BodyMix::Spright => vec![100, 10_000],
        }
    }

    fn pick(&self, i: u64) -> usize {
        match self {
            BodyMix::Fixed(_) => 0,
            // 1 in 50 is the large one: 2%.
            BodyMix::Spright => usize::from(i % 50 == 49),
        }
    }
}

/// The request body of `n` bytes every run sends (lower-case text, so `upper` shows).
pub fn payload(n: usize) -> Vec<u8> {
    let text = b"zero hop payload ";
    (0..n).map(|i| text[i % text.len()]).collect()
}

/// Bodies to send and the answers to expect, prepared once.
struct Payloads {
    bodies: Vec<Bytes>,
    expected: Vec<Bytes>,
}

impl Payloads {
    fn new(mix: &BodyMix, steps: &[Step]) -> Self {
        let bodies: Vec<Bytes> = mix
            .sizes()
            .into_iter()
            .map(|n| Bytes::from(payload(n)))
            .collect();
        let expected = bodies
            .iter()
            .map(|b| Bytes::from(Step::expected(steps, b)))
            .collect();
        Self { bodies, expected }
    }
}

/// Latency percentiles in microseconds.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct Latency {
    /// Median.
    pub p50_us: f64,
    /// 90th percentile.
    pub p90_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// 99.9th percentile.
    pub p999_us: f64,
    /// Largest.
    pub max_us: f64,
    /// Mean.
    pub mean_us: f64,
}

impl Latency {
    fn from_hist(h: &Histogram<u64>) -> Self {
        let us = |ns: u64| ns as f64 / 1000.0;
        Self {
            p50_us: us(h.value_at_quantile(0.50)),
            p90_us: us(h.value_at_quantile(0.90)),
            p99_us: us(h.value_at_quantile(0.99)),
            p999_us: us(h.value_at_quantile(0.999)),
            max_us: us(h.max()),
            mean_us: h.mean() / 1000.0,
        }
    }
}

/// What one run measured.
#[derive(Clone, Debug, serde::Serialize)]
pub struct RunResult {
    /// Requests answered correctly in the measured window.
    pub requests: u64,
    /// Requests that failed (connection error, non-200 status).
    pub errors: u64,
    /// Answers with status 200 but the wrong body.
    pub wrong: u64,
    /// Length of the measured window in seconds.
    pub seconds: f64,
    /// Correct answers per second.
    pub rps: f64,
    /// Latency of correct answers.
    pub latency: Latency,
    /// Latency CDF points `(percentile, microseconds)` for plots.
    pub cdf: Vec<(f64, f64)>,
    /// The first failure seen, if any.
    pub first_error: Option<String>,
}

/// How to load a system.
#[derive(Clone, Debug)]
pub enum Load {
    /// `concurrency` connections back to back.
    Closed {
        /// Connections.
        concurrency: usize,
    },
    /// Constant arrival rate over `connections` connections.
    Open {
        /// Requests per second.
        rate: f64,
        /// Connections available to carry them.
        connections: usize,
    },
}

/// Drives `url` (which runs `steps`) with `load` for `warmup` (not measured) then
/// `duration`.
pub fn run(
    url: &str,
    steps: &[Step],
    mix: &BodyMix,
    load: &Load,
    warmup: Duration,
    duration: Duration,
) -> Result<RunResult> {
    let uri: http::Uri = url.parse().with_context(|| format!("bad URL {url}"))?;
    let authority = uri
        .authority()
        .context("URL without host:port")?
        .as_str()
        .to_owned();
    let payloads = Arc::new(Payloads::new(mix, steps));
    let tally = drive_here(uri, authority, payloads, mix, load, warmup, duration)?;
    Ok(tally.result(duration))
}

/// [`run`] from one new thread per CPU of `cpus` (each pinned there; the caller's affinity
/// stays as it was), the connections and an open loop's rate split evenly between them; one
/// merged result. With no CPU given, [`run`] on this thread.
pub fn run_on(
    url: &str,
    steps: &[Step],
    mix: &BodyMix,
    load: &Load,
    warmup: Duration,
    duration: Duration,
    cpus: &[usize],
) -> Result<RunResult> {
    if cpus.is_empty() {
        return run(url, steps, mix, load, warmup, duration);
    }
    let uri: http::Uri = url.parse().with_context(|| format!("bad URL {url}"))?;
    let authority = uri
        .authority()
        .context("URL without host:port")?
        .as_str()
        .to_owned();
    let payloads = Arc::new(Payloads::new(mix, steps));
    let threads = cpus.len();
    let handles: Vec<_> = cpus
        .iter()
        .enumerate()
        .map(|(i, &cpu)| {
            let share = load.share(i, threads);
            let (uri, authority, payloads, mix) = (
                uri.clone(),
                authority.clone(),
                payloads.clone(),
                mix.clone(),
            );
            std::thread::Builder::new()
                .name(format!("loadgen-{i}"))
                .spawn(move || {
                    crate::procstat::pin_current_thread(cpu);
                    drive_here(uri, authority, payloads, &mix, &share, warmup, duration)
                })
                .context("starting a load generator thread")
        })
        .collect::<Result<_>>()?;
    let mut total = Tally::new();
    for h in handles {
        let tally = h
            .join()
            .map_err(|_| anyhow::anyhow!("a load generator thread panicked"))??;
        total.merge(tally);
    }
    Ok(total.result(duration))
}

/// Drives the load from a current-thread runtime on this thread.
fn drive_here(
    uri: http::Uri,
    authority: String,
    payloads: Arc<Payloads>,
    mix: &BodyMix,
    load: &Load,
    warmup: Duration,
    duration: Duration,
) -> Result<Tally> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("tokio runtime")?;
    rt.block_on(drive(
        uri,
        authority,
        payloads,
        mix.clone(),
        load.clone(),
        warmup,
        duration,
    ))
}

/// Shared by the connection tasks of one run.
struct Shared {
    uri: http::Uri,
    authority: String,
    payloads: Arc<Payloads>,
    mix: BodyMix,
    /// Requests issued (the index of the next one).
    issued: AtomicU64,
    /// Set when the run is over.
    done: AtomicBool,
    /// Start of the measured window.
    measure_from: Instant,
    /// End of the run.
    end: Instant,
}

/// Per connection: its histogram and counters.
struct Tally {
    hist: Histogram<u64>,
    ok: u64,
    errors: u64,
    wrong: u64,
    first_error: Option<String>,
}

impl Tally {
    fn new() -> Self {
        Self {
            // 1 us .. 100 s at 3 significant digits, in ns.
            hist: Histogram::new_with_bounds(1_000, 100_000_000_000, 3).expect("histogram bounds"),
            ok: 0,
            errors: 0,
            wrong: 0,
            first_error: None,
        }
    }

    fn error(&mut self, what: String) {
        self.errors += 1;
        self.first_error.get_or_insert(what);
    }

    /// Adds `other`'s answers and histogram to these.
    fn merge(&mut self, other: Tally) {
        self.hist.add(&other.hist).expect("same histogram bounds");
        self.ok += other.ok;
        self.errors += other.errors;
        self.wrong += other.wrong;
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
    }

    /// What a run of `duration` measured.
    fn result(self, duration: Duration) -> RunResult {
        let seconds = duration.as_secs_f64();
        let cdf = [
            0.0, 10.0, 25.0, 50.0, 75.0, 90.0, 95.0, 99.0, 99.5, 99.9, 99.95, 99.99, 100.0,
        ]
        .iter()
        .map(|&p| (p, self.hist.value_at_percentile(p) as f64 / 1000.0))
        .collect();
        RunResult {
            requests: self.ok,
            errors: self.errors,
            wrong: self.wrong,
            seconds,
            rps: self.ok as f64 / seconds,
            latency: Latency::from_hist(&self.hist),
            cdf,
            first_error: self.first_error,
        }
    }
}

impl Load {
    /// Thread `i`'s part of this load when `threads` threads carry it: the connections shared
    /// out (the first ones take the remainder; at least one each), an open loop's rate in
    /// proportion to its connections.
    pub fn share(&self, i: usize, threads: usize) -> Load {
        let threads = threads.max(1);
        let part = |n: usize| (n / threads + usize::from(i < n % threads)).max(1);
        match *self {
            Load::Closed { concurrency } => Load::Closed {
                concurrency: part(concurrency),
            },
            Load::Open { rate, connections } => {
                let mine = part(connections);
                let all: usize = (0..threads)
                    .map(|j| {
                        (connections / threads + usize::from(j < connections % threads)).max(1)
                    })
                    .sum();
                Load::Open {
                    rate: rate * mine as f64 / all as f64,
                    connections: mine,
                }
            }
        }
    }
}

async fn drive(
    uri: http::Uri,
    authority: String,
    payloads: Arc<Payloads>,
    mix: BodyMix,
    load: Load,
    warmup: Duration,
    duration: Duration,
) -> Result<Tally> {
    let start = Instant::now();
    let shared = Arc::new(Shared {
        uri,
        authority,
        payloads,
        mix,
        issued: AtomicU64::new(0),
        done: AtomicBool::new(false),
        measure_from: start + warmup,
        end: start + warmup + duration,
    });
    let (connections, rate) = match load {
        Load::Closed { concurrency } => (concurrency.max(1), None),
        Load::Open { rate, connections } => {
            if rate.is_nan() || rate <= 0.0 {
                bail!("open-loop rate must be positive, got {rate}");
            }
            (connections.max(1), Some(rate))
        }
    };
    let tasks: Vec<_> = (0..connections)
        .map(|_| tokio::spawn(connection(shared.clone(), rate, start)))
        .collect();
    let mut total = Tally::new();
    for t in tasks {
        total.merge(t.await.context("load task panicked")?);
    }
    Ok(total)
}

type Conn = http1::SendRequest<Full<Bytes>>;

async fn connect(shared: &Shared) -> Result<Conn, String> {
    let stream = TcpStream::connect(&shared.authority)
        .await
        .map_err(|e| format!("connect {}: {e}", shared.authority))?;
    let _ = stream.set_nodelay(true);
    let (send, conn) = http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(send)
}

/// One connection's loop. Closed loop when `rate` is `None`.
async fn connection(shared: Arc<Shared>, rate: Option<f64>, start: Instant) -> Tally {
    let mut tally = Tally::new();
    let mut conn: Option<Conn> = None;
    loop {
        if shared.done.load(Ordering::Relaxed) || Instant::now() >= shared.end {
            shared.done.store(true, Ordering::Relaxed);
            return tally;
        }
        let i = shared.issued.fetch_add(1, Ordering::Relaxed);
        // Open loop: wait for the request's intended time; latency counts from it.
        let began = match rate {
            None => Instant::now(),
            Some(rate) => {
                let intended = start + Duration::from_secs_f64(i as f64 / rate);
                if intended >= shared.end {
                    shared.done.store(true, Ordering::Relaxed);
                    return tally;
                }
                wait_until(intended).await;
                intended
            }
        };
        let which = shared.mix.pick(i);
        let body = shared.payloads.bodies[which].clone();
        if conn.as_ref().is_none_or(|c| c.is_closed()) {
            match connect(&shared).await {
                Ok(c) => conn = Some(c),
                Err(e) => {
                    if began >= shared.measure_from {
                        tally.error(e);
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            }
        }
        let c = conn.as_mut().expect("connected above");
        let outcome = request(c, &shared, body).await;
        let done_at = Instant::now();
        // Measured by when it was answered, its latency counted from when it was due. An
        // open loop that a system cannot keep up with falls behind its schedule: judged by
        // when they were due, its requests would all belong to the warm-up, and the window
        // would show no answer at all (the smoke matrix's poll system on 2 cores did).
        let measured =
            done_at >= shared.measure_from && done_at <= shared.end + Duration::from_secs(5);
        match outcome {
            Ok((200, answer)) if answer == shared.payloads.expected[which] => {
                if measured {
                    tally.ok += 1;
                    let ns = done_at.duration_since(began).as_nanos() as u64;
                    tally.hist.saturating_record(ns.max(1_000));
                }
            }
            Ok((200, answer)) => {
                if measured {
                    tally.wrong += 1;
                    tally.first_error.get_or_insert(format!(
                        "wrong body: {} bytes, expected {}",
                        answer.len(),
                        shared.payloads.expected[which].len()
                    ));
                }
            }
            Ok((status, answer)) => {
                if measured {
                    tally.error(format!(
                        "status {status}: {}",
                        String::from_utf8_lossy(&answer[..answer.len().min(200)]).trim()
                    ));
                }
            }
            Err(e) => {
                conn = None;
                if measured {
                    tally.error(e);
                }
            }
        }
    }
}

async fn request(c: &mut Conn, shared: &Shared, body: Bytes) -> Result<(u16, Bytes), String> {
    c.ready().await.map_err(|e| format!("connection: {e}"))?;
    let req = http::Request::post(shared.uri.clone())
        .header(http::header::HOST, shared.authority.as_str())
        .body(Full::new(body))
        .map_err(|e| e.to_string())?;
    let resp = c
        .send_request(req)
        .await
        .map_err(|e| format!("request: {e}"))?;
    let status = resp.status().as_u16();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| format!("body: {e}"))?
        .to_bytes();
    Ok((status, body))
}

/// Sleeps until `t` with sub-millisecond precision: the timer wheel for the bulk, then
/// yielding (other connections keep running) for the last stretch.
async fn wait_until(t: Instant) {
    let now = Instant::now();
    if t > now + Duration::from_millis(2) {
        tokio::time::sleep_until((t - Duration::from_millis(1)).into()).await;
    }
    while Instant::now() < t {
        tokio::task::yield_now().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_and_mix() {
        assert_eq!(BodyMix::Fixed(100).label(), "100B");
        assert_eq!(BodyMix::Fixed(10_000).label(), "10KB");
        assert_eq!(BodyMix::Fixed(1 << 20).label(), "1MiB");
        assert_eq!(BodyMix::Spright.label(), "mix");
        let large = (0..10_000)
            .filter(|&i| BodyMix::Spright.pick(i) == 1)
            .count();
        assert_eq!(large, 200, "2% large bodies");
        let p = Payloads::new(&BodyMix::Spright, &crate::HELLO);
        assert_eq!(p.bodies[1].len(), 10_000);
        assert_eq!(p.expected[0].len(), 101);
        assert!(p.expected[0].starts_with(b"ZERO HOP PAYLOAD"));
    }

    #[test]
    fn a_load_shared_by_threads_keeps_its_connections_and_rate() {
        let closed = Load::Closed { concurrency: 10 };
        let parts: Vec<usize> = (0..3)
            .map(|i| match closed.share(i, 3) {
                Load::Closed { concurrency } => concurrency,
                Load::Open { .. } => unreachable!(),
            })
            .collect();
        assert_eq!(parts, [4, 3, 3]);
        let open = Load::Open {
            rate: 1000.0,
            connections: 4,
        };
        let (mut rate, mut conns) = (0.0, 0);
        for i in 0..4 {
            if let Load::Open {
                rate: r,
                connections,
            } = open.share(i, 4)
            {
                rate += r;
                conns += connections;
            }
        }
        assert_eq!(conns, 4);
        assert!((rate - 1000.0).abs() < 1e-6, "{rate}");
        // More threads than connections: one each, the rate still adds up.
        let (mut rate, mut conns) = (0.0, 0);
        for i in 0..3 {
            if let Load::Open {
                rate: r,
                connections,
            } = (Load::Open {
                rate: 90.0,
                connections: 1,
            })
            .share(i, 3)
            {
                rate += r;
                conns += connections;
            }
        }
        assert_eq!(conns, 3);
        assert!((rate - 90.0).abs() < 1e-6, "{rate}");
    }
}
