//! The camera load generator's engine: every `period` a burst of one snapshot per spot of
//! the [lot](crate::lot), sent at once over up to `connections` connections (HTTP/1.1
//! keep-alive, or one UDP socket each for CoAP); every answer is checked, and each burst's
//! completion time (burst start to its last answer) and response times are reported.
//!
//! **Checks** of each answer: it is a [`Record`] of the snapshot's spot and plate, charged
//! the plate's tariff, through the long chain (detection, search, persist, charge) or the short
//! one (detection, search, charge); a plate whose earlier snapshot was answered before this one
//! was sent must take the short chain (the store knows it); with `fresh_db` (the store started
//! empty) a plate seen for the first time must take the long one. A plate new to this run that
//! takes the short chain was stored by an earlier run (`new_but_known`).

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{Request, Uri};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde::Serialize;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::coap::{CoapClient, CoapError};
use crate::lot::{Lot, LotConfig};
use crate::record::{tariff_for, Record};
use crate::snapshot::Snapshot;

/// Error and mismatch lines kept in the report (the first ones).
const SAMPLES: usize = 5;

/// Where snapshots go.
#[derive(Clone, Debug)]
pub enum CamTarget {
    /// The chain's HTTP route (`http://127.0.0.1:8080/snapshot`).
    Http(Uri),
    /// The chain's CoAP route.
    Coap {
        /// The gateway's UDP address.
        addr: SocketAddr,
        /// The route's path (`/snapshot`).
        path: String,
        /// Block size for Block1 (16 to 1024).
        block: usize,
    },
}

impl std::fmt::Display for CamTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CamTarget::Http(u) => write!(f, "{u}"),
            CamTarget::Coap { addr, path, block } => {
                write!(f, "coap://{addr}{path} (blocks of {block} B)")
            }
        }
    }
}

/// How to run the cameras.
#[derive(Clone, Debug)]
pub struct CamConfig {
    /// Where snapshots go.
    pub target: CamTarget,
    /// The lot.
    pub lot: LotConfig,
    /// Bursts to send.
    pub bursts: usize,
    /// Time between burst starts.
    pub period: Duration,
    /// Bytes per snapshot.
    pub size: usize,
    /// Snapshots in flight at once at most.
    pub connections: usize,
    /// The camera id written into snapshots.
    pub camera: u32,
    /// How long one snapshot may take.
    pub timeout: Duration,
    /// The plate store started empty: a first sighting must take the long chain.
    pub fresh_db: bool,
}

/// One burst's outcome.
#[derive(Clone, Debug, Default, Serialize)]
pub struct BurstReport {
    /// Burst number (0 first).
    pub burst: usize,
    /// Snapshots sent.
    pub sent: usize,
    /// Answered correctly.
    pub ok: usize,
    /// Failed (error status, no answer, not a record).
    pub errors: usize,
    /// Answered, but not as the checks expect.
    pub wrong: usize,
    /// Through the long chain (persist).
    pub long_path: usize,
    /// Through the short chain.
    pub short_path: usize,
    /// Burst start to its last answer, ms.
    pub completion_ms: f64,
    /// Median response time (request sent to answer), ms.
    pub p50_ms: Option<f64>,
    /// 99th percentile, ms.
    pub p99_ms: Option<f64>,
}

/// What a run saw.
#[derive(Clone, Debug, Serialize)]
pub struct CamReport {
    /// Where snapshots went.
    pub target: String,
    /// Spots (snapshots per burst).
    pub spots: u32,
    /// Snapshots sent.
    pub sent: usize,
    /// Answered correctly.
    pub ok: usize,
    /// Failed.
    pub errors: usize,
    /// Answered wrongly.
    pub wrong: usize,
    /// Through the long chain.
    pub long_path: usize,
    /// Through the short chain.
    pub short_path: usize,
    /// Plates sent.
    pub distinct_plates: usize,
    /// Plates new to this run that the store already knew.
    pub new_but_known: usize,
    /// Median response time over every answer, ms.
    pub p50_ms: Option<f64>,
    /// 99th percentile, ms.
    pub p99_ms: Option<f64>,
    /// Slowest, ms.
    pub max_ms: Option<f64>,
    /// Median burst completion time, ms.
    pub completion_p50_ms: Option<f64>,
    /// Slowest burst completion, ms.
    pub completion_max_ms: Option<f64>,
    /// The first error and mismatch lines.
    pub samples: Vec<String>,
    /// Per burst.
    pub bursts: Vec<BurstReport>,
}

/// One snapshot to send.
struct Job {
    burst: usize,
    spot: u32,
    plate: String,
    /// What the answer's path must be, if anything: `Some(true)` long, `Some(false)` short.
    must_be_long: Option<bool>,
    /// The plate was sent before in this run.
    seen_before: bool,
    body: Vec<u8>,
}

/// What came back for one job.
struct Outcome {
    job: Job,
    elapsed: Duration,
    answer: Result<Vec<u8>, String>,
}

/// Every outcome so far.
struct Tally {
    bursts: Vec<BurstReport>,
    burst_start: Vec<Instant>,
    burst_last: Vec<Instant>,
    times: Vec<Vec<f64>>,
    answered_plates: HashSet<String>,
    new_but_known: usize,
    samples: Vec<String>,
    done: usize,
}

impl Tally {
    fn sample(&mut self, line: String) {
        if self.samples.len() < SAMPLES {
            self.samples.push(line);
        }
    }

    fn record(&mut self, o: Outcome) {
        let b = o.job.burst;
        self.done += 1;
        self.burst_last[b] = Instant::now();
        let body = match o.answer {
            Ok(body) => body,
            Err(e) => {
                self.bursts[b].errors += 1;
                self.sample(format!("spot {} plate {}: {e}", o.job.spot, o.job.plate));
                return;
            }
        };
        let r = match Record::decode(&body) {
            Ok(r) => r,
            Err(e) => {
                self.bursts[b].errors += 1;
                self.sample(format!("spot {}: {e}", o.job.spot));
                return;
            }
        };
        self.times[b].push(o.elapsed.as_secs_f64() * 1_000.0);
        let long = r.took_long_path();
        if long {
            self.bursts[b].long_path += 1;
        } else if r.took_short_path() {
            self.bursts[b].short_path += 1;
        }
        if !long && !o.job.seen_before && r.took_short_path() {
            self.new_but_known += 1;
        }
        let tariff = tariff_for(&o.job.plate);
        let why = if r.plate != o.job.plate || r.spot != o.job.spot {
            Some(format!("answer names spot {} plate {}", r.spot, r.plate))
        } else if !long && !r.took_short_path() {
            Some(format!("path {:?} is neither chain", r.path))
        } else if o.job.must_be_long.is_some_and(|l| l != long) {
            Some(format!(
                "path {:?}, expected the {} chain",
                r.path,
                if long { "short" } else { "long" }
            ))
        } else if r.known != Some(!long) {
            Some(format!("known {:?} on path {:?}", r.known, r.path))
        } else if r.charge_cents != Some(tariff) || r.tariff_cents != Some(tariff) {
            Some(format!(
                "charged {:?} (tariff {:?}), expected {tariff}",
                r.charge_cents, r.tariff_cents
            ))
        } else {
            None
        };
        match why {
            Some(why) => {
                self.bursts[b].wrong += 1;
                self.sample(format!("spot {} plate {}: {why}", o.job.spot, o.job.plate));
            }
            None => {
                self.bursts[b].ok += 1;
                self.answered_plates.insert(o.job.plate);
            }
        }
    }
}

/// Sends the bursts `cfg` describes and reports (fails only when a CoAP socket cannot be
/// opened; every snapshot's failure is in the report).
pub async fn run(cfg: &CamConfig) -> Result<CamReport, CoapError> {
    let tally = Arc::new(Mutex::new(Tally {
        bursts: Vec::new(),
        burst_start: Vec::new(),
        burst_last: Vec::new(),
        times: Vec::new(),
        answered_plates: HashSet::new(),
        new_but_known: 0,
        samples: Vec::new(),
        done: 0,
    }));
    let (jobs_tx, jobs_rx) = mpsc::unbounded_channel::<Job>();
    let jobs_rx = Arc::new(tokio::sync::Mutex::new(jobs_rx));
    let mut workers = Vec::new();
    let http = {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(cfg.connections)
            .build::<_, Full<Bytes>>(connector)
    };
    for _ in 0..cfg.connections.max(1) {
        let mut sender = match &cfg.target {
            CamTarget::Http(url) => Sender::Http(Box::new(http.clone()), url.clone()),
            CamTarget::Coap { addr, path, block } => {
                Sender::Coap(CoapClient::connect(*addr, *block).await?, path.clone())
            }
        };
        let (rx, tally, timeout) = (jobs_rx.clone(), tally.clone(), cfg.timeout);
        workers.push(tokio::spawn(async move {
            loop {
                let job = { rx.lock().await.recv().await };
                let Some(job) = job else { return };
                let start = Instant::now();
                let answer = sender.send(&job.body, start + timeout).await;
                let elapsed = start.elapsed();
                lock(&tally).record(Outcome {
                    job,
                    elapsed,
                    answer,
                });
            }
        }));
    }

    let mut lot = Lot::new(cfg.lot.clone());
    let mut sent_plates: HashSet<String> = HashSet::new();
    let start = Instant::now();
    for burst in 0..cfg.bursts {
        if burst > 0 {
            lot.advance();
        }
        tokio::time::sleep_until(start + cfg.period * burst as u32).await;
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let mut t = lock(&tally);
        t.bursts.push(BurstReport {
            burst,
            sent: lot.cars().len(),
            ..BurstReport::default()
        });
        t.burst_start.push(Instant::now());
        t.burst_last.push(Instant::now());
        t.times.push(Vec::new());
        for (spot, plate) in lot.cars().iter().enumerate() {
            let seen_before = sent_plates.contains(plate);
            let must_be_long = if t.answered_plates.contains(plate) {
                Some(false)
            } else if cfg.fresh_db && !seen_before {
                Some(true)
            } else {
                None
            };
            let snapshot = Snapshot {
                camera: cfg.camera,
                spot: spot as u32,
                plate: plate.clone(),
                t_ms: now_ms,
            };
            let _ = jobs_tx.send(Job {
                burst,
                spot: spot as u32,
                plate: plate.clone(),
                must_be_long,
                seen_before,
                body: snapshot.encode(cfg.size),
            });
        }
        drop(t);
        sent_plates.extend(lot.cars().iter().cloned());
    }
    drop(jobs_tx);
    let total = cfg.bursts * lot.cars().len();
    // Every job ends by its timeout; the workers finish once the queue is empty.
    for w in workers {
        let _ = w.await;
    }
    let mut t = lock(&tally);
    debug_assert_eq!(t.done, total);
    let mut all = Vec::new();
    let mut completions = Vec::new();
    for b in 0..t.bursts.len() {
        let mut times = std::mem::take(&mut t.times[b]);
        times.sort_by(f64::total_cmp);
        let completion = t.burst_last[b].duration_since(t.burst_start[b]);
        let report = &mut t.bursts[b];
        report.p50_ms = percentile(&times, 0.5);
        report.p99_ms = percentile(&times, 0.99);
        report.completion_ms = completion.as_secs_f64() * 1_000.0;
        completions.push(report.completion_ms);
        all.extend(times);
    }
    all.sort_by(f64::total_cmp);
    completions.sort_by(f64::total_cmp);
    let sum = |f: fn(&BurstReport) -> usize| t.bursts.iter().map(f).sum::<usize>();
    Ok(CamReport {
        target: cfg.target.to_string(),
        spots: cfg.lot.spots,
        sent: total,
        ok: sum(|b| b.ok),
        errors: sum(|b| b.errors),
        wrong: sum(|b| b.wrong),
        long_path: sum(|b| b.long_path),
        short_path: sum(|b| b.short_path),
        distinct_plates: sent_plates.len(),
        new_but_known: t.new_but_known,
        p50_ms: percentile(&all, 0.5),
        p99_ms: percentile(&all, 0.99),
        max_ms: all.last().copied(),
        completion_p50_ms: percentile(&completions, 0.5),
        completion_max_ms: completions.last().copied(),
        samples: t.samples.clone(),
        bursts: t.bursts.clone(),
    })
}

/// The `q` quantile of sorted `values` (nearest rank).
pub fn percentile(sorted: &[f64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    Some(sorted[rank - 1])
}

fn lock(t: &Mutex<Tally>) -> std::sync::MutexGuard<'_, Tally> {
    t.lock().unwrap_or_else(|p| p.into_inner())
}

/// One connection's way of sending a snapshot. The HTTP client is boxed: it is several
/// hundred bytes (with HTTP/2 support), the CoAP one a few dozen.
enum Sender {
    Http(Box<Client<HttpConnector, Full<Bytes>>>, Uri),
    Coap(CoapClient, String),
}

impl Sender {
    /// Sends `body`; the answer's body on success, else one line saying what failed.
    async fn send(&mut self, body: &[u8], deadline: Instant) -> Result<Vec<u8>, String> {
        match self {
            Sender::Http(client, url) => {
                let req = Request::post(url.clone())
                    .header("content-type", "application/octet-stream")
                    .body(Full::new(Bytes::copy_from_slice(body)))
                    .map_err(|e| e.to_string())?;
                let exchange = async {
                    let resp = client.request(req).await.map_err(|e| e.to_string())?;
                    let status = resp.status();
                    let body = resp
                        .into_body()
                        .collect()
                        .await
                        .map_err(|e| e.to_string())?
                        .to_bytes();
                    if status.is_success() {
                        Ok(body.to_vec())
                    } else {
                        Err(format!(
                            "HTTP {status}: {}",
                            String::from_utf8_lossy(&body).trim()
                        ))
                    }
                };
                tokio::time::timeout_at(deadline, exchange)
                    .await
                    .map_err(|_| "no answer before the timeout".to_owned())?
            }
            Sender::Coap(client, path) => {
                let r = client
                    .post(path, body, deadline)
                    .await
                    .map_err(|e| e.to_string())?;
                if r.is_success() {
                    Ok(r.payload)
                } else {
                    Err(format!(
                        "CoAP {}: {}",
                        r.code(),
                        String::from_utf8_lossy(&r.payload)
                    ))
                }
            }
        }
    }
}
