//! Deferred delivery: async requests (`Prefer: respond-async`, or a route with `async: true`)
//! answered `202 Accepted` once they are on disk and run later by a worker, retries (`retry`)
//! for them and for `idempotent` routes, and the dead-letter queue of what did not succeed.
//!
//! Exactly once to an answer or to the dead-letter queue: a request is in `queue/` from
//! before its 202 until its result is in `done/` or its last error in `dlq/` (written first,
//! then the queue file removed; a start finds both and only removes the queue file). A
//! request that was running when the process died is run again at the next start, so a
//! function may see it twice; its answer is recorded once. A result goes to the request's
//! callback (`X-Callback-Url`) after it is recorded, and is marked delivered after the
//! callback answered 2xx: a crash between the two delivers it again.
//!
//! Limits: at most [`MAX_RESULTS`] results kept, each for [`RESULT_TTL`] (oldest dropped
//! first); bodies are bounded by the chain's `max_body` as for synchronous requests; at most
//! [`MAX_RUNNING`] deferred requests in the chain at once, of which [`MAX_HEAVY_RUNNING`] with
//! a body over [`HEAVY_BODY`] (a run reads its body into memory); an async request is given up
//! (dead-lettered) [`ASYNC_DEADLINE`] after it was accepted.

mod policy;
mod run;
mod store;

use std::collections::{HashSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue};
use http::{header, HeaderMap, Method, StatusCode};
use serde_json::{json, Value};
use zerohop_spec::{DeliverySpec, RouteSpec};

use crate::body::AnswerBody;
use crate::body::Received;
use crate::handle::Streamed;
use crate::ingress::Reply;
use crate::{ErrorSource, Gateway, GatewayError, Gateways};
use http_body_util::Either;
use store::{Store, DLQ, DONE, QUEUE};

/// Where a deferred request's result is read: `GET /_zerohop/async/ID`.
pub const RESULT_PATH: &str = "/_zerohop/async/";
/// The header that names a callback URL for the result.
pub const CALLBACK_HEADER: &str = "x-callback-url";
/// Results kept at most; the oldest are dropped first.
pub const MAX_RESULTS: usize = 10_000;
/// How long a result is kept.
pub const RESULT_TTL: Duration = Duration::from_secs(3600);
/// Deferred requests run at once, at most (the rest wait in the queue).
pub const MAX_RUNNING: usize = 64;
/// Of those, how many may have a body over [`HEAVY_BODY`] at once: a run holds its body in
/// memory (read from its queue file), so this bounds the worker's memory to about
/// `MAX_HEAVY_RUNNING * max_body` however many large requests are queued.
pub const MAX_HEAVY_RUNNING: usize = 2;
/// A queued request bigger than this (head line and body) counts against
/// [`MAX_HEAVY_RUNNING`].
pub const HEAVY_BODY: u64 = 1 << 20;
/// How long after its 202 an async request may still be retried.
pub const ASYNC_DEADLINE: Duration = Duration::from_secs(3600);
/// Longest callback URL taken.
const MAX_CALLBACK_URL: usize = 2048;

/// Why the deferred requests' folder cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum DeferredError {
    /// The folder or a file in it.
    #[error("{}: {source}", path.display())]
    Io {
        /// The folder or file.
        path: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// No dead letter by that id.
    #[error("no dead letter {0}")]
    Unknown(String),
}

/// Counters of deferred delivery (Prometheus reads them through the agent).
#[derive(Debug, Default)]
pub struct DeferredStats {
    /// Async requests accepted (answered 202).
    pub accepted: AtomicU64,
    /// Async requests that reached an answer.
    pub completed: AtomicU64,
    /// Runs that were retried (async and synchronous).
    pub retried: AtomicU64,
    /// Requests that went to the dead-letter queue.
    pub dead_lettered: AtomicU64,
    /// Results delivered to a callback.
    pub callbacks: AtomicU64,
    /// Callbacks given up after their retries.
    pub callbacks_failed: AtomicU64,
}

/// One dead letter, as `zerohop dlq ls` and `show` list it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeadLetter {
    /// The request id.
    pub id: String,
    /// `METHOD /path` of its route.
    pub route: String,
    /// The last run's status.
    pub status: u16,
    /// The last run's error, one line.
    pub error: String,
    /// Runs made.
    pub attempts: u32,
    /// When it was accepted (ms since the epoch).
    pub accepted_ms: u64,
    /// When it was dead-lettered (ms since the epoch).
    pub failed_ms: u64,
    /// The callback URL it named, if any.
    pub callback: Option<String>,
    /// Its body.
    pub body: Vec<u8>,
}

/// A route's delivery settings and how it is known across restarts (`METHOD /path`).
struct RouteDelivery {
    key: String,
    delivery: DeliverySpec,
}

/// The deferred requests of one chain: their folder, the queue of ids to run, the results'
/// retention; shared by the chain's gateway threads (see [`Deferred::attach`]).
pub struct Deferred {
    store: Store,
    routes: Vec<RouteDelivery>,
    /// Ids waiting to run, oldest first.
    pending: Mutex<VecDeque<String>>,
    /// Ids running now (a replay of one of them waits).
    running: Mutex<HashSet<String>>,
    /// Permits for runs of a body over [`HEAVY_BODY`].
    heavy: Arc<tokio::sync::Semaphore>,
    /// Finished results, oldest first: (finish time in ms, id).
    results: Mutex<VecDeque<(u64, String)>>,
    /// Results and dead letters whose callback is still to be delivered: their folder
    /// ([`DONE`] or [`DLQ`]) and id.
    callbacks: Mutex<VecDeque<(&'static str, String)>>,
    wake: tokio::sync::Notify,
    stopping: AtomicBool,
    gateway: OnceLock<Weak<Gateway>>,
    stats: DeferredStats,
}

impl Deferred {
    /// Opens (or makes) the folder `dir` for a chain with `routes` and finds what a previous
    /// run left: requests accepted but not finished are queued again (unless their result or
    /// dead letter is already recorded), results are kept for the rest of their time, and
    /// undelivered callbacks are tried again.
    pub fn open(dir: &Path, routes: &[RouteSpec]) -> Result<Arc<Self>, DeferredError> {
        let io = |path: &Path| {
            let path = path.to_owned();
            move |source| DeferredError::Io { path, source }
        };
        let store = Store::open(dir).map_err(io(dir))?;
        let mut pending = VecDeque::new();
        for id in store.ids(QUEUE).map_err(io(dir))? {
            if store.has(DONE, &id) || store.has(DLQ, &id) {
                // Finished just before a crash: its queue file outlived it.
                store.remove(QUEUE, &id).map_err(io(dir))?;
            } else {
                pending.push_back(id);
            }
        }
        let mut results = Vec::new();
        let mut callbacks = VecDeque::new();
        for folder in [DONE, DLQ] {
            for id in store.ids(folder).map_err(io(dir))? {
                let Ok((head, _)) = store.get(folder, &id) else {
                    if folder == DONE {
                        let _ = store.remove(DONE, &id);
                    }
                    continue;
                };
                if folder == DONE {
                    results.push((head["finished_ms"].as_u64().unwrap_or(0), id.clone()));
                }
                if head["callback"].is_string() && head["delivered"] == Value::Bool(false) {
                    callbacks.push_back((folder, id));
                }
            }
        }
        results.sort();
        let d = Arc::new(Self {
            store,
            routes: routes
                .iter()
                .map(|r| RouteDelivery {
                    key: format!("{} {}", r.method, r.path),
                    delivery: r.delivery.clone(),
                })
                .collect(),
            pending: Mutex::new(pending),
            running: Mutex::new(HashSet::new()),
            heavy: Arc::new(tokio::sync::Semaphore::new(MAX_HEAVY_RUNNING)),
            results: Mutex::new(results.into()),
            callbacks: Mutex::new(callbacks),
            wake: tokio::sync::Notify::new(),
            stopping: AtomicBool::new(false),
            gateway: OnceLock::new(),
            stats: DeferredStats::default(),
        });
        d.sweep();
        Ok(d)
    }

    /// Gives the chain's gateway threads this queue: its routes' retries, async requests and
    /// `GET /_zerohop/async/ID`. Requests are run once [`Deferred::start`] is called.
    pub fn attach(self: &Arc<Self>, gateways: &Gateways) {
        for g in gateways.iter() {
            let _ = g.deferred.set(self.clone());
        }
        if let Some(g) = gateways.iter().next() {
            let _ = self.gateway.set(Arc::downgrade(g));
        }
    }

    /// Starts the worker on the current tokio runtime, once the chain's instances are ready
    /// (earlier, what the last run left would fail for want of an instance). It runs requests
    /// through the first gateway thread and ends with the chain (see [`Deferred::stop`]).
    pub fn start(self: &Arc<Self>) {
        tokio::spawn(run::work(Arc::downgrade(self)));
    }

    /// Stops running requests (the chain is going down): what runs now is left in the queue
    /// for the next start unless it already has its answer.
    pub fn stop(&self) {
        // Relaxed: a flag; a run that misses it finishes normally.
        self.stopping.store(true, Ordering::Relaxed);
        self.wake.notify_one();
    }

    /// The folder.
    pub fn dir(&self) -> &Path {
        self.store.dir()
    }

    /// Its counters.
    pub fn stats(&self) -> &DeferredStats {
        &self.stats
    }

    /// Requests waiting or running.
    pub fn pending(&self) -> usize {
        lock(&self.pending).len() + lock(&self.running).len()
    }

    /// The dead letters, oldest first (bodies left out).
    pub fn dead_letters(&self) -> Result<Vec<DeadLetter>, DeferredError> {
        let ids = self.store.ids(DLQ).map_err(|e| self.io(e))?;
        Ok(ids
            .iter()
            .filter_map(|id| self.dead_letter(id).ok())
            .map(|mut d| {
                d.body.clear();
                d
            })
            .collect())
    }

    /// Dead letter `id`, with its body.
    pub fn dead_letter(&self, id: &str) -> Result<DeadLetter, DeferredError> {
        if !store::valid_id(id) || !self.store.has(DLQ, id) {
            return Err(DeferredError::Unknown(id.to_owned()));
        }
        let (h, body) = self.store.get(DLQ, id).map_err(|e| self.io(e))?;
        Ok(DeadLetter {
            id: id.to_owned(),
            route: h["route"].as_str().unwrap_or_default().to_owned(),
            status: h["status"].as_u64().unwrap_or(0) as u16,
            error: h["error"].as_str().unwrap_or_default().to_owned(),
            attempts: h["attempts"].as_u64().unwrap_or(0) as u32,
            accepted_ms: h["accepted_ms"].as_u64().unwrap_or(0),
            failed_ms: h["failed_ms"].as_u64().unwrap_or(0),
            callback: h["callback"].as_str().map(str::to_owned),
            body,
        })
    }

    /// Runs dead letter `id` again, with all its attempts: to an answer or back to the
    /// dead-letter queue.
    pub fn replay(&self, id: &str) -> Result<(), DeferredError> {
        if !store::valid_id(id) || !self.store.has(DLQ, id) {
            return Err(DeferredError::Unknown(id.to_owned()));
        }
        let (mut head, body) = self.store.get(DLQ, id).map_err(|e| self.io(e))?;
        if let Value::Object(m) = &mut head {
            for k in [
                "error",
                "status",
                "attempts",
                "failed_ms",
                "runs",
                "delivered",
            ] {
                m.remove(k);
            }
            // A fresh deadline: the replay is a new delivery.
            m.insert("accepted_ms".into(), json!(now_ms()));
        }
        // Queued first: a crash in between leaves it in both, and the start keeps the
        // dead letter (it is finished) until a replay is asked again.
        self.store
            .put(QUEUE, id, &head, &body)
            .map_err(|e| self.io(e))?;
        self.store.remove(DLQ, id).map_err(|e| self.io(e))?;
        lock(&self.pending).push_back(id.to_owned());
        self.wake.notify_one();
        Ok(())
    }

    /// Forgets dead letter `id`.
    pub fn drop_dead_letter(&self, id: &str) -> Result<(), DeferredError> {
        if !store::valid_id(id) || !self.store.has(DLQ, id) {
            return Err(DeferredError::Unknown(id.to_owned()));
        }
        self.store.remove(DLQ, id).map_err(|e| self.io(e))
    }

    /// How route `route` delivers, for `zerohop status`: `async`, `retry 3x (100ms to 10s,
    /// on 502/503/504)`, `idempotent`; nothing for the default.
    pub fn describe(&self, route: usize) -> Vec<String> {
        let Some(d) = self.routes.get(route).map(|r| &r.delivery) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        if d.is_async {
            out.push("async".to_owned());
        }
        if let Some(r) = &d.retry {
            let on: Vec<String> = r.statuses.iter().map(u16::to_string).collect();
            out.push(format!(
                "retry {}x ({:?} to {:?}, on {})",
                r.attempts,
                r.backoff,
                r.max_backoff,
                on.join("/")
            ));
        }
        if d.idempotent {
            out.push("idempotent".to_owned());
        }
        out
    }

    /// The delivery settings of route `route`.
    fn delivery(&self, route: u16) -> Option<&DeliverySpec> {
        self.routes.get(usize::from(route)).map(|r| &r.delivery)
    }

    fn io(&self, source: std::io::Error) -> DeferredError {
        DeferredError::Io {
            path: self.store.dir().to_owned(),
            source,
        }
    }

    /// Drops the results past their time or over the cap.
    fn sweep(&self) {
        let gone: Vec<String> = {
            let mut r = lock(&self.results);
            let times: Vec<u64> = r.iter().map(|(t, _)| *t).collect();
            let n = policy::expired(&times, now_ms(), RESULT_TTL.as_millis() as u64, MAX_RESULTS);
            r.drain(..n).map(|(_, id)| id).collect()
        };
        for id in gone {
            let _ = self.store.remove(DONE, &id);
        }
    }
}

impl Gateway {
    /// The chain's deferred requests, if the agent gave it some (see [`Deferred::attach`]).
    pub fn deferred(&self) -> Option<&Arc<Deferred>> {
        self.deferred.get()
    }

    /// Answers `GET /_zerohop/async/ID`: the result (its status, headers and body), 202 while
    /// it is pending, the last error of a dead letter, 404 for an id it does not know. `None`:
    /// not such a request (or no deferred delivery here).
    pub(crate) fn deferred_result(&self, method: &Method, path: &str) -> Option<Streamed> {
        let d = self.deferred()?;
        let id = path.strip_prefix(RESULT_PATH)?;
        if method != Method::GET {
            return None;
        }
        let json_answer = |status: StatusCode, v: Value| {
            let mut r = http::Response::new(http_body_util::Full::new(Bytes::from(v.to_string())));
            *r.status_mut() = status;
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            r.map(Either::Left)
        };
        if !store::valid_id(id) {
            return Some(
                GatewayError::new(
                    StatusCode::NOT_FOUND,
                    ErrorSource::Gateway,
                    "no such request",
                )
                .into_response()
                .map(Either::Left),
            );
        }
        if let Ok((head, file, len)) = d.store.open_body(DONE, id) {
            let status = head["status"]
                .as_u64()
                .and_then(|s| StatusCode::from_u16(s as u16).ok())
                .unwrap_or(StatusCode::OK);
            // Read from its file as the client takes it: many readers of large results
            // hold a piece each, not a whole result.
            let mut r = http::Response::new(Either::Right(AnswerBody::file(file, len)));
            *r.status_mut() = status;
            for pair in head["headers"].as_array().into_iter().flatten() {
                let (Some(n), Some(v)) = (pair[0].as_str(), pair[1].as_str()) else {
                    continue;
                };
                if let (Ok(n), Ok(v)) = (HeaderName::try_from(n), HeaderValue::from_str(v)) {
                    r.headers_mut().append(n, v);
                }
            }
            return Some(r);
        }
        if d.store.has(QUEUE, id) {
            let mut r = json_answer(
                StatusCode::ACCEPTED,
                json!({ "id": id, "state": "pending" }),
            );
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            return Some(r);
        }
        if let Ok(dl) = d.dead_letter(id) {
            let status = StatusCode::from_u16(dl.status).unwrap_or(StatusCode::BAD_GATEWAY);
            return Some(json_answer(
                status,
                json!({ "id": id, "state": "dead-letter", "error": dl.error }),
            ));
        }
        Some(
            GatewayError::new(
                StatusCode::NOT_FOUND,
                ErrorSource::Gateway,
                "no such request",
            )
            .into_response()
            .map(Either::Left),
        )
    }

    /// Queues the request on route `route` when it is async (the route's `async`, or
    /// `Prefer: respond-async`) and answers the 202; `Err(body)`: run it now.
    ///
    /// A body in memory is written to the queue from there; one streamed into a large slot
    /// is written straight from the slot (no copy in memory), which is then freed.
    pub(crate) async fn defer(
        &self,
        route: u16,
        headers: &HeaderMap,
        meta: &[(&str, &str)],
        body: Received,
    ) -> Result<Result<Reply, Received>, GatewayError> {
        let wants = prefers_async(headers);
        // Without a queue (a gateway the agent did not give one) the preference is not
        // applied: the request runs now.
        let Some(d) = self.deferred() else {
            return Ok(Err(body));
        };
        let Some(rd) = d.routes.get(usize::from(route)) else {
            return Ok(Err(body));
        };
        if !(rd.delivery.is_async || wants) {
            return Ok(Err(body));
        }
        let callback = match headers.get(CALLBACK_HEADER) {
            None => None,
            Some(v) => Some(callback_url(v)?),
        };
        let id = new_id();
        let head = json!({
            "id": id,
            "route": rd.key,
            "meta": meta.iter().map(|(n, v)| [n, v]).collect::<Vec<_>>(),
            "callback": callback,
            "accepted_ms": now_ms(),
        });
        let (d2, id2) = (d.clone(), id.clone());
        // fsync takes milliseconds: off the gateway's thread.
        tokio::task::spawn_blocking(move || match body {
            Received::Chunks(chunks) => d2.store.put(QUEUE, &id2, &head, &chunks.concat()),
            Received::Slot(filled) => d2.store.put(QUEUE, &id2, &head, filled.body()),
        })
        .await
        .map_err(|e| unavailable(&e.to_string()))?
        .map_err(|e| {
            tracing::error!(dir = %d.dir().display(), "cannot queue an async request: {e}");
            unavailable("the async queue cannot be written")
        })?;
        d.stats.accepted.fetch_add(1, Ordering::Relaxed);
        lock(&d.pending).push_back(id.clone());
        d.wake.notify_one();
        let location = format!("{RESULT_PATH}{id}");
        let body = json!({ "id": id, "location": location }).to_string();
        let hv = |s: &str| HeaderValue::from_str(s).unwrap_or(HeaderValue::from_static(""));
        Ok(Ok(Reply {
            status: StatusCode::ACCEPTED,
            body: Bytes::from(body),
            headers: vec![
                (
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                ),
                (header::LOCATION, hv(&location)),
                (
                    HeaderName::from_static("preference-applied"),
                    HeaderValue::from_static("respond-async"),
                ),
                (HeaderName::from_static("x-request-id"), hv(&id)),
            ],
            left: false,
        }))
    }
}

/// Whether `Prefer` (RFC 7240) holds `respond-async`.
fn prefers_async(h: &HeaderMap) -> bool {
    h.get_all("prefer")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|p| {
            p.split(';')
                .next()
                .is_some_and(|t| t.trim().eq_ignore_ascii_case("respond-async"))
        })
}

/// A callback URL the gateway will POST to: `http://` or `https://`, bounded.
fn callback_url(v: &HeaderValue) -> Result<String, GatewayError> {
    let bad = |why: &str| {
        GatewayError::new(
            StatusCode::BAD_REQUEST,
            ErrorSource::Gateway,
            format!("X-Callback-Url: {why}"),
        )
    };
    let s = v.to_str().map_err(|_| bad("not text"))?.trim();
    if s.len() > MAX_CALLBACK_URL {
        return Err(bad("longer than 2048 bytes"));
    }
    let uri: http::Uri = s.parse().map_err(|_| bad("not a URL"))?;
    match uri.scheme_str() {
        Some("http" | "https") if uri.host().is_some() => Ok(s.to_owned()),
        _ => Err(bad("name an http:// or https:// URL")),
    }
}

fn unavailable(why: &str) -> GatewayError {
    GatewayError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        ErrorSource::Gateway,
        format!("cannot accept an async request: {why}"),
    )
}

/// 128 random bits as 32 hex digits.
fn new_id() -> String {
    use ring::rand::SecureRandom;
    let mut b = [0u8; 16];
    ring::rand::SystemRandom::new()
        .fill(&mut b)
        .expect("the OS random source works");
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A random number for backoff jitter.
fn jitter() -> u64 {
    use ring::rand::SecureRandom;
    let mut b = [0u8; 8];
    let _ = ring::rand::SystemRandom::new().fill(&mut b);
    u64::from_le_bytes(b)
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a start finds: a request with its result already written is not queued again,
    /// one without is, a dead letter stays one, an unconfirmed callback is sent again.
    #[test]
    fn a_start_queues_only_what_has_no_answer() {
        let dir = std::env::temp_dir().join(format!("zh-deferred-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let store = Store::open(&dir).unwrap();
        let [answered, waiting, dead] = ["a", "b", "c"].map(|c| c.repeat(32));
        let request = json!({ "route": "POST /x", "meta": [], "accepted_ms": now_ms() });
        for id in [&answered, &waiting] {
            store.put(QUEUE, id, &request, b"body").unwrap();
        }
        let result = json!({ "status": 200, "headers": [], "finished_ms": now_ms(),
                             "callback": "http://127.0.0.1:9/", "delivered": false });
        store.put(DONE, &answered, &result, b"BODY").unwrap();
        store.put(DLQ, &dead, &request, b"body").unwrap();
        let told = "d".repeat(32);
        let letter = json!({ "route": "POST /x", "meta": [], "status": 502,
                             "callback": "http://127.0.0.1:9/", "delivered": false });
        store.put(DLQ, &told, &letter, b"body").unwrap();
        let d = Deferred::open(&dir, &[]).unwrap();
        assert_eq!(lock(&d.pending).iter().collect::<Vec<_>>(), [&waiting]);
        assert!(!d.store.has(QUEUE, &answered), "its queue file outlived it");
        assert_eq!(
            lock(&d.callbacks).iter().cloned().collect::<Vec<_>>(),
            [(DONE, answered.clone()), (DLQ, told.clone())],
            "undelivered callbacks of results and of dead letters are tried again"
        );
        d.drop_dead_letter(&told).unwrap();
        let letters = d.dead_letters().unwrap();
        assert_eq!(letters.len(), 1);
        assert_eq!(
            (letters[0].id.as_str(), letters[0].route.as_str()),
            (dead.as_str(), "POST /x")
        );
        // Replayed: queued, no longer a dead letter; unknown or malformed ids refused.
        d.replay(&dead).unwrap();
        assert!(d.store.has(QUEUE, &dead) && !d.store.has(DLQ, &dead));
        assert!(matches!(d.replay(&dead), Err(DeferredError::Unknown(_))));
        assert!(matches!(
            d.drop_dead_letter("../x"),
            Err(DeferredError::Unknown(_))
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn prefer_table() {
        for (values, want) in [
            (vec![], false),
            (vec!["respond-async"], true),
            (vec!["Respond-Async"], true),
            (vec!["wait=10, respond-async"], true),
            (vec!["return=minimal", "respond-async; x=1"], true),
            (vec!["respond-asyncx"], false),
            (vec!["return=representation"], false),
        ] {
            let mut h = HeaderMap::new();
            for v in &values {
                h.append("prefer", HeaderValue::from_str(v).unwrap());
            }
            assert_eq!(prefers_async(&h), want, "{values:?}");
        }
    }

    #[test]
    fn callback_urls() {
        for (url, ok) in [
            ("http://127.0.0.1:9/hook", true),
            ("https://example.com/x?y=1", true),
            ("ftp://example.com/", false),
            ("/relative", false),
            ("http://", false),
        ] {
            let got = callback_url(&HeaderValue::from_str(url).unwrap());
            assert_eq!(got.is_ok(), ok, "{url}: {got:?}");
        }
        let long = format!("http://a/{}", "x".repeat(3000));
        assert!(callback_url(&HeaderValue::from_str(&long).unwrap()).is_err());
    }
}
