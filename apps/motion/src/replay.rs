//! The load generator's engine: replays a [trace](crate::trace) against a deployment at its
//! event times divided by a time-scale factor, matches each light command to its event
//! (by `seq`), checks it against the expected one, and reports response times per second of
//! the run with the deployment's CPU.
//!
//! * **MQTT** ([`Target::Mqtt`]): one client publishes every sensor's events on
//!   `PREFIX/ROOM/event` and subscribes to the reply topic. The response time of an event runs
//!   from just before its PUBLISH is handed to the client to the arrival of its command.
//! * **HTTP** ([`Target::Http`]): each event is a POST with the header
//!   `mqtt-topic: PREFIX/ROOM/event` over a pool of keep-alive connections (the chain's HTTP
//!   route, no broker); the answer is the command. A room's events go one at a time, in
//!   order, as its device would send them (MQTT keeps that order by itself); the response
//!   time includes waiting for the room's previous answer.
//!
//! Buckets are by the second (of the run) in which an event was sent; CPU per bucket is the
//! deployment's CPU in that second (see [`crate::procstat`]), so idle seconds show what an
//! idle deployment costs.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Uri};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use rumqttc::{AsyncClient, Event as MqttEvent, MqttOptions, NetworkOptions, Packet, QoS};
use serde::Serialize;
use tokio::sync::mpsc;

use crate::event::{encode, event_topic, parse, Command, Event, Light};
use crate::procstat::ProcessTrees;
use crate::trace::{room_name, TraceEvent};

/// How long to wait for the subscription before giving up.
const SUBSCRIBE_TIMEOUT: Duration = Duration::from_secs(10);
/// Error lines kept in the report (the first ones).
const ERROR_SAMPLES: usize = 5;

/// Why a replay could not run.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// An address is not `HOST:PORT`.
    #[error("`{0}` is not HOST:PORT")]
    BadAddress(String),
    /// The broker did not confirm the subscription to the reply topic in time.
    #[error("no SUBACK for {topic} from mqtt://{addr} within {SUBSCRIBE_TIMEOUT:?}")]
    NotSubscribed {
        /// The reply topic.
        topic: String,
        /// The broker.
        addr: String,
    },
}

/// Where the events go.
#[derive(Clone, Debug)]
pub enum Target {
    /// An MQTT broker (mosquitto, or a zerohop gateway's MQTT listener).
    Mqtt {
        /// `HOST:PORT`.
        addr: String,
        /// Events go to `PREFIX/ROOM/event`.
        prefix: String,
        /// Where the commands come back.
        reply_topic: String,
        /// QoS of events and of the subscription.
        qos: QoS,
    },
    /// An HTTP route taking one event per POST.
    Http {
        /// The route's URL (`http://127.0.0.1:8080/motion`).
        url: Uri,
        /// Topic prefix for the `mqtt-topic` header.
        prefix: String,
        /// Keep-alive connections kept open at most (one request per room is in flight).
        connections: usize,
    },
}

/// POSTs one room's events in order, each after the answer to the one before (a device
/// sends its events over its own connection, one at a time), and hands the answers to
/// `tracker`.
async fn post_in_order(
    client: Client<HttpConnector, Full<Bytes>>,
    url: Uri,
    topic: String,
    mut events: mpsc::UnboundedReceiver<(u64, Vec<u8>)>,
    tracker: Arc<Mutex<Tracker>>,
) {
    while let Some((seq, payload)) = events.recv().await {
        let answer = async {
            let req = Request::post(url.clone())
                .header("mqtt-topic", topic.as_str())
                .body(Full::new(Bytes::from(payload)))
                .map_err(|e| e.to_string())?;
            let resp = client.request(req).await.map_err(|e| e.to_string())?;
            let status = resp.status();
            let body = resp
                .into_body()
                .collect()
                .await
                .map_err(|e| e.to_string())?
                .to_bytes();
            Ok::<_, String>((status, body))
        };
        match answer.await {
            Ok((status, body)) if status.is_success() => lock(&tracker).reply(&body),
            Ok((status, body)) => lock(&tracker).failed(
                Some(seq),
                format!("HTTP {status}: {}", String::from_utf8_lossy(&body).trim()),
            ),
            Err(e) => lock(&tracker).failed(Some(seq), format!("POST: {e}")),
        }
    }
}

impl Target {
    fn describe(&self) -> String {
        match self {
            Target::Mqtt {
                addr, reply_topic, ..
            } => format!("mqtt://{addr} (replies on {reply_topic})"),
            Target::Http { url, .. } => format!("{url}"),
        }
    }
}

/// How to replay.
#[derive(Clone, Debug)]
pub struct ReplayConfig {
    /// Where events go.
    pub target: Target,
    /// Trace seconds per second of replay (10: ten times faster than real time).
    pub scale: f64,
    /// How long to wait for the last answers after the last event.
    pub drain: Duration,
    /// The deployment whose CPU is reported.
    pub cpu: ProcessTrees,
    /// Room names start with this (see [`room_name`]).
    pub tag: String,
}

/// One second of the run.
#[derive(Clone, Debug, Serialize)]
pub struct Bucket {
    /// Second of the run (0 is the first).
    pub second: u64,
    /// Events sent in it.
    pub sent: usize,
    /// Of those, answered.
    pub answered: usize,
    /// Median response time of its answered events, ms.
    pub p50_ms: Option<f64>,
    /// 99th percentile, ms.
    pub p99_ms: Option<f64>,
    /// The deployment's CPU in this second, percent of one core.
    pub cpu_pct: f64,
}

/// What a replay saw.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// Where the events went.
    pub target: String,
    /// Events sent.
    pub events: usize,
    /// Of those, motion events (the rest are heartbeats).
    pub motion_events: usize,
    /// Events whose command arrived.
    pub answered: usize,
    /// Commands that differed from the expected one.
    pub wrong: usize,
    /// Events with no command by the end of the drain.
    pub missing: usize,
    /// Replies that were no command (errors from the deployment), or failed requests.
    pub errors: usize,
    /// Commands for events already answered or never sent.
    pub unexpected: usize,
    /// Commands that switched a light on.
    pub switched_on: usize,
    /// Commands that switched a light off.
    pub switched_off: usize,
    /// Median response time, ms.
    pub p50_ms: Option<f64>,
    /// 99th percentile, ms.
    pub p99_ms: Option<f64>,
    /// Slowest, ms.
    pub max_ms: Option<f64>,
    /// Length of the run (first event to last answer or drain end), seconds.
    pub wall_s: f64,
    /// The deployment's CPU over the run, seconds (0 when no process was named).
    pub cpu_s: f64,
    /// The same, percent of one core.
    pub cpu_pct: f64,
    /// The first error and mismatch lines.
    pub samples: Vec<String>,
    /// Per-second series.
    pub buckets: Vec<Bucket>,
}

/// One event in flight.
struct Pending {
    sent: Instant,
    expected: Command,
}

/// Events in flight and what came back; shared by the sender and the receiver.
struct Tracker {
    start: Instant,
    pending: HashMap<u64, Pending>,
    /// (second sent, response time) of every answered event.
    answered: Vec<(u64, Duration)>,
    sent_per_second: HashMap<u64, usize>,
    wrong: usize,
    errors: usize,
    unexpected: usize,
    switched_on: usize,
    switched_off: usize,
    last_answer: Instant,
    samples: Vec<String>,
}

impl Tracker {
    fn new(start: Instant) -> Self {
        Self {
            start,
            pending: HashMap::new(),
            answered: Vec::new(),
            sent_per_second: HashMap::new(),
            wrong: 0,
            errors: 0,
            unexpected: 0,
            switched_on: 0,
            switched_off: 0,
            last_answer: start,
            samples: Vec::new(),
        }
    }

    fn sample(&mut self, line: String) {
        if self.samples.len() < ERROR_SAMPLES {
            self.samples.push(line);
        }
    }

    fn sent(&mut self, seq: u64, expected: Command) {
        let now = Instant::now();
        let second = now.duration_since(self.start).as_secs();
        *self.sent_per_second.entry(second).or_default() += 1;
        self.pending.insert(
            seq,
            Pending {
                sent: now,
                expected,
            },
        );
    }

    fn failed(&mut self, seq: Option<u64>, why: String) {
        self.errors += 1;
        if let Some(seq) = seq {
            self.pending.remove(&seq);
        }
        self.sample(why);
    }

    fn reply(&mut self, payload: &[u8]) {
        let now = Instant::now();
        let command: Command = match parse("command", payload) {
            Ok(c) => c,
            Err(_) => {
                let text = String::from_utf8_lossy(&payload[..payload.len().min(200)]);
                self.failed(None, format!("reply is no command: {text}"));
                return;
            }
        };
        let Some(p) = self.pending.remove(&command.seq) else {
            self.unexpected += 1;
            self.sample(format!("command for no event in flight: {command:?}"));
            return;
        };
        self.last_answer = now;
        let second = p.sent.duration_since(self.start).as_secs();
        self.answered
            .push((second, now.saturating_duration_since(p.sent)));
        if command != p.expected {
            self.wrong += 1;
            self.sample(format!("expected {:?}, got {command:?}", p.expected));
        }
        match (command.changed, command.light) {
            (true, Light::On) => self.switched_on += 1,
            (true, Light::Off) => self.switched_off += 1,
            _ => {}
        }
    }
}

/// Replays `trace` (with the commands `expected` answers to it) as `cfg` says.
pub async fn replay(
    trace: &[TraceEvent],
    expected: &[Command],
    cfg: &ReplayConfig,
) -> Result<Report, ReplayError> {
    assert_eq!(
        trace.len(),
        expected.len(),
        "one expected command per event"
    );
    let sender = Sender::connect(&cfg.target).await?;
    let start = Instant::now();
    let tracker = Arc::new(Mutex::new(Tracker::new(start)));
    sender.listen(tracker.clone());

    let cpu = cfg.cpu.clone();
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let sampler = tokio::spawn(sample_cpu(cpu, start, stop_rx));

    for (e, want) in trace.iter().zip(expected) {
        let at = start + Duration::from_secs_f64(e.t_ms as f64 / 1_000.0 / cfg.scale);
        tokio::time::sleep_until(at.into()).await;
        let room = room_name(&cfg.tag, e.sensor);
        let payload = encode(&Event {
            seq: e.seq,
            t_ms: e.t_ms,
            motion: e.motion,
        });
        lock(&tracker).sent(e.seq, want.clone());
        sender.send(e.seq, &room, payload, tracker.clone()).await;
    }
    let sent_all = Instant::now();
    while !lock(&tracker).pending.is_empty() && sent_all.elapsed() < cfg.drain {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let end = Instant::now();
    let _ = stop_tx.send(true);
    let cpu_per_second = sampler.await.unwrap_or_default();
    sender.close().await;

    let t = lock(&tracker);
    let wall_s = end.duration_since(start).as_secs_f64();
    let mut all: Vec<f64> = t.answered.iter().map(|(_, d)| ms(*d)).collect();
    all.sort_by(f64::total_cmp);
    let seconds = (wall_s.ceil() as u64).max(cpu_per_second.len() as u64);
    let buckets = (0..seconds)
        .map(|s| {
            let mut times: Vec<f64> = t
                .answered
                .iter()
                .filter(|(sec, _)| *sec == s)
                .map(|(_, d)| ms(*d))
                .collect();
            times.sort_by(f64::total_cmp);
            Bucket {
                second: s,
                sent: t.sent_per_second.get(&s).copied().unwrap_or(0),
                answered: times.len(),
                p50_ms: percentile(&times, 0.50),
                p99_ms: percentile(&times, 0.99),
                cpu_pct: cpu_per_second.get(s as usize).copied().unwrap_or(0.0) * 100.0,
            }
        })
        .collect();
    let cpu_s: f64 = cpu_per_second.iter().sum();
    Ok(Report {
        target: cfg.target.describe(),
        events: trace.len(),
        motion_events: trace.iter().filter(|e| e.motion).count(),
        answered: t.answered.len(),
        wrong: t.wrong,
        missing: t.pending.len(),
        errors: t.errors,
        unexpected: t.unexpected,
        switched_on: t.switched_on,
        switched_off: t.switched_off,
        p50_ms: percentile(&all, 0.50),
        p99_ms: percentile(&all, 0.99),
        max_ms: all.last().copied(),
        wall_s,
        cpu_s,
        cpu_pct: if wall_s > 0.0 {
            cpu_s / wall_s * 100.0
        } else {
            0.0
        },
        samples: t.samples.clone(),
        buckets,
    })
}

/// The deployment's CPU seconds in each second of the run, until `stop`.
async fn sample_cpu(
    trees: ProcessTrees,
    start: Instant,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> Vec<f64> {
    let mut out = Vec::new();
    if trees.is_empty() {
        return out;
    }
    let mut last = trees.cpu_seconds();
    loop {
        let next = start + Duration::from_secs(out.len() as u64 + 1);
        let stopped = tokio::select! {
            _ = tokio::time::sleep_until(next.into()) => false,
            _ = stop.changed() => true,
        };
        let now = trees.cpu_seconds();
        out.push((now - last).max(0.0));
        last = now;
        if stopped {
            return out;
        }
    }
}

/// The `q` quantile of sorted `values` (nearest rank).
pub fn percentile(sorted: &[f64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    Some(sorted[rank - 1])
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1_000.0
}

fn lock(t: &Mutex<Tracker>) -> std::sync::MutexGuard<'_, Tracker> {
    t.lock().unwrap_or_else(|p| p.into_inner())
}

/// Each room's queue of events to POST: (seq, payload).
type RoomQueues = HashMap<String, mpsc::UnboundedSender<(u64, Vec<u8>)>>;

/// The connection events go over.
enum Sender {
    Mqtt {
        client: AsyncClient,
        prefix: String,
        qos: QoS,
        /// The event loop, until [`Sender::listen`] takes it over.
        events: Mutex<Option<tokio::sync::mpsc::UnboundedReceiver<MqttEvent>>>,
        driver: tokio::task::JoinHandle<()>,
        /// Set before disconnecting, so the driver does not report the close as an error.
        closing: Arc<std::sync::atomic::AtomicBool>,
    },
    Http {
        client: Box<Client<HttpConnector, Full<Bytes>>>,
        url: Uri,
        prefix: String,
        /// Each room's queue of events (see [`post_in_order`]).
        rooms: Mutex<RoomQueues>,
    },
}

impl Sender {
    /// Connects (MQTT: and waits for the reply subscription).
    async fn connect(target: &Target) -> Result<Self, ReplayError> {
        match target {
            Target::Mqtt {
                addr,
                prefix,
                reply_topic,
                qos,
            } => {
                let (host, port) = split_addr(addr)?;
                let mut opts =
                    MqttOptions::new(format!("motion-gen-{}", std::process::id()), host, port);
                opts.set_keep_alive(Duration::from_secs(30))
                    .set_max_packet_size(64 * 1024, 64 * 1024)
                    .set_inflight(1_000)
                    .set_request_channel_capacity(100_000);
                let (client, mut eventloop) = AsyncClient::new(opts, 100_000);
                eventloop.set_network_options(nodelay());
                let closing = Arc::new(std::sync::atomic::AtomicBool::new(false));
                let closed = closing.clone();
                let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
                let (sub_client, topic, q) = (client.clone(), reply_topic.clone(), *qos);
                // Drives the connection; (re)subscribes after every CONNACK so a reconnect
                // keeps the replies coming.
                let driver = tokio::spawn(async move {
                    loop {
                        match eventloop.poll().await {
                            Ok(MqttEvent::Incoming(Packet::ConnAck(_))) => {
                                let _ = sub_client.subscribe(topic.clone(), q).await;
                            }
                            Ok(ev) => {
                                if tx.send(ev).is_err() {
                                    return;
                                }
                            }
                            Err(_) if closed.load(std::sync::atomic::Ordering::Relaxed) => return,
                            Err(e) => {
                                eprintln!("motion-gen: MQTT connection: {e}; reconnecting");
                                tokio::time::sleep(Duration::from_millis(200)).await;
                            }
                        }
                    }
                });
                let subscribed = tokio::time::timeout(SUBSCRIBE_TIMEOUT, async {
                    while let Some(ev) = rx.recv().await {
                        if let MqttEvent::Incoming(Packet::SubAck(_)) = ev {
                            return true;
                        }
                    }
                    false
                })
                .await;
                if subscribed != Ok(true) {
                    driver.abort();
                    return Err(ReplayError::NotSubscribed {
                        topic: reply_topic.clone(),
                        addr: addr.clone(),
                    });
                }
                Ok(Sender::Mqtt {
                    client,
                    prefix: prefix.clone(),
                    qos: *qos,
                    events: Mutex::new(Some(rx)),
                    driver,
                    closing,
                })
            }
            Target::Http {
                url,
                prefix,
                connections,
            } => {
                let mut connector = HttpConnector::new();
                connector.set_nodelay(true);
                let client = Client::builder(TokioExecutor::new())
                    .pool_max_idle_per_host(*connections)
                    .build(connector);
                Ok(Sender::Http {
                    client: Box::new(client),
                    url: url.clone(),
                    prefix: prefix.clone(),
                    rooms: Mutex::new(HashMap::new()),
                })
            }
        }
    }

    /// Starts handing replies to `tracker` (MQTT; HTTP answers come with each request).
    fn listen(&self, tracker: Arc<Mutex<Tracker>>) {
        if let Sender::Mqtt { events, .. } = self {
            let Some(mut rx) = events.lock().unwrap_or_else(|p| p.into_inner()).take() else {
                return;
            };
            tokio::spawn(async move {
                while let Some(ev) = rx.recv().await {
                    if let MqttEvent::Incoming(Packet::Publish(p)) = ev {
                        lock(&tracker).reply(&p.payload);
                    }
                }
            });
        }
    }

    /// Sends one event of `room`.
    async fn send(&self, seq: u64, room: &str, payload: Vec<u8>, tracker: Arc<Mutex<Tracker>>) {
        match self {
            Sender::Mqtt {
                client,
                prefix,
                qos,
                ..
            } => {
                if let Err(e) = client
                    .publish(event_topic(prefix, room), *qos, false, payload)
                    .await
                {
                    lock(&tracker).failed(Some(seq), format!("publish: {e}"));
                }
            }
            Sender::Http {
                client,
                url,
                prefix,
                rooms,
            } => {
                let mut rooms = rooms.lock().unwrap_or_else(|p| p.into_inner());
                let queue = rooms.entry(room.to_owned()).or_insert_with(|| {
                    let (tx, rx) = mpsc::unbounded_channel();
                    let topic = event_topic(prefix, room);
                    tokio::spawn(post_in_order(
                        client.as_ref().clone(),
                        url.clone(),
                        topic,
                        rx,
                        tracker,
                    ));
                    tx
                });
                let _ = queue.send((seq, payload));
            }
        }
    }

    async fn close(self) {
        if let Sender::Mqtt {
            client,
            driver,
            closing,
            ..
        } = self
        {
            closing.store(true, std::sync::atomic::Ordering::Relaxed);
            let _ = client.disconnect().await;
            tokio::time::sleep(Duration::from_millis(50)).await;
            driver.abort();
        }
    }
}

/// Network options with `TCP_NODELAY` (rumqttc leaves Nagle on, which holds small
/// packets back for tens of milliseconds).
pub fn nodelay() -> NetworkOptions {
    let mut n = NetworkOptions::new();
    n.set_tcp_nodelay(true);
    n
}

/// `HOST:PORT` split.
pub fn split_addr(addr: &str) -> Result<(String, u16), ReplayError> {
    let (host, port) = addr
        .rsplit_once(':')
        .ok_or_else(|| ReplayError::BadAddress(addr.to_owned()))?;
    let port = port
        .parse()
        .map_err(|_| ReplayError::BadAddress(addr.to_owned()))?;
    Ok((host.trim_matches(['[', ']']).to_owned(), port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 0.5), Some(50.0));
        assert_eq!(percentile(&v, 0.99), Some(99.0));
        assert_eq!(percentile(&v[..1], 0.99), Some(1.0));
        assert_eq!(percentile(&[], 0.5), None);
    }

    #[test]
    fn addresses_split_at_the_last_colon() {
        assert_eq!(
            split_addr("127.0.0.1:1883").unwrap(),
            ("127.0.0.1".into(), 1883)
        );
        assert_eq!(split_addr("[::1]:9").unwrap(), ("::1".into(), 9));
        assert!(split_addr("nohost").is_err());
    }
}
