//! Running deferred requests: the worker that takes them from the queue, the retries of one
//! run (async, and synchronous on `idempotent` routes), the result or the dead letter, the
//! callback.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use zerohop_spec::RetrySpec;

use super::policy::{self, Verdict};
use super::{jitter, lock, now_ms, Deferred, ASYNC_DEADLINE, HEAVY_BODY, MAX_RUNNING};
use super::{DLQ, DONE, QUEUE};
use crate::ingress::Reply;
use crate::{Gateway, GatewayError};

/// How often the worker looks at the results' age and the undelivered callbacks, and
/// whether its chain is gone, when no request wakes it.
const TICK: Duration = Duration::from_secs(1);
/// A callback's retries: 5 POSTs, from 200 ms apart up to 5 s.
fn callback_retry() -> RetrySpec {
    RetrySpec {
        attempts: 5,
        backoff: Duration::from_millis(200),
        max_backoff: Duration::from_secs(5),
        statuses: Vec::new(),
    }
}
/// How long one callback POST may take.
const CALLBACK_TIMEOUT: Duration = Duration::from_secs(10);

/// The worker: runs what is queued, at most [`MAX_RUNNING`] at once, until the chain stops
/// (or its queue is dropped).
pub(super) async fn work(d: Weak<Deferred>) {
    let permits = Arc::new(tokio::sync::Semaphore::new(MAX_RUNNING));
    loop {
        let Some(q) = d.upgrade() else { return };
        if q.stopping.load(Ordering::Relaxed) {
            return;
        }
        let next = lock(&q.pending).pop_front();
        if let Some(id) = next {
            let Ok(permit) = permits.clone().acquire_owned().await else {
                return;
            };
            if !lock(&q.running).insert(id.clone()) {
                continue;
            }
            tokio::spawn(async move {
                run_one(&q, &id).await;
                lock(&q.running).remove(&id);
                drop(permit);
            });
            continue;
        }
        // Callbacks a previous run did not see confirmed: all at once (each waits on its own
        // server).
        let callbacks: Vec<(&str, String)> = lock(&q.callbacks).drain(..).collect();
        for (folder, id) in callbacks {
            let q2 = q.clone();
            tokio::spawn(async move { deliver(&q2, folder, &id).await });
        }
        q.sweep();
        let woken = q.wake.notified();
        let _ = tokio::time::timeout(TICK, woken).await;
    }
}

/// What a run came to: a reply, or an error answer (its status and line).
fn status_of(r: &Result<Reply, GatewayError>) -> u16 {
    match r {
        Ok(reply) => reply.status.as_u16(),
        Err(e) => e.status.as_u16(),
    }
}

/// Runs queued request `id` with its route's retries, to a result or to the dead-letter
/// queue; leaves it queued if the chain stops meanwhile.
async fn run_one(d: &Arc<Deferred>, id: &str) {
    if d.store.has(DONE, id) || d.store.has(DLQ, id) {
        // Finished by the chain this one replaces (both ran while it wound down).
        let _ = d.store.remove(QUEUE, id);
        return;
    }
    // A large body is read into memory for its runs: few at once (see MAX_HEAVY_RUNNING).
    let heavy = d.store.size(QUEUE, id).is_ok_and(|n| n > HEAVY_BODY);
    let _permit = if heavy {
        match d.heavy.clone().acquire_owned().await {
            Ok(p) => Some(p),
            Err(_) => return,
        }
    } else {
        None
    };
    let Ok((mut head, body)) = d.store.get(QUEUE, id) else {
        // Replayed or dropped meanwhile.
        return;
    };
    let key = head["route"].as_str().unwrap_or_default();
    let route = d.routes.iter().position(|r| r.key == key);
    let Some(gw) = d.gateway.get().and_then(Weak::upgrade) else {
        return;
    };
    let Some(route) = route else {
        let why = format!("the chain has no route `{key}` any more");
        dead_letter(d, id, head, &body, 404, &why, 0).await;
        return;
    };
    let retry = d.routes[route].delivery.retry.clone().unwrap_or(RetrySpec {
        attempts: 1,
        ..RetrySpec::default()
    });
    let meta: Vec<(String, String)> = head["meta"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| Some((p[0].as_str()?.to_owned(), p[1].as_str()?.to_owned())))
        .collect();
    let accepted = head["accepted_ms"].as_u64().unwrap_or_else(now_ms);
    let deadline_ms = accepted + ASYNC_DEADLINE.as_millis() as u64;
    // Runs that failed before a restart count: the route's attempts are for the request,
    // not for each start of the daemon.
    let mut runs = head["runs"]
        .as_u64()
        .map_or(0, |r| r.min(u64::from(u32::MAX)) as u32);
    if runs >= retry.attempts {
        let why = format!("its {runs} attempts were used before a restart");
        dead_letter(d, id, head, &body, 502, &why, runs).await;
        return;
    }
    loop {
        runs += 1;
        let out = gw
            .submit(
                route as u16,
                meta.iter().map(|(n, v)| (n.as_str(), v.as_str())),
                &[&body[..]],
            )
            .await;
        let status = status_of(&out);
        let verdict = policy::classify(status, &retry.statuses);
        if verdict != Verdict::Answer && d.stopping.load(Ordering::Relaxed) {
            // Failing because the chain goes down: the next start runs it again.
            return;
        }
        match (verdict, out) {
            (Verdict::Answer, Ok(reply)) => return finish(d, id, &head, reply).await,
            (Verdict::Answer, Err(e)) => {
                // A gateway's 4xx (e.g. 413): the answer is the error.
                let reply = Reply {
                    status: e.status,
                    body: format!("{e}\n").into(),
                    headers: Vec::new(),
                    left: false,
                };
                return finish(d, id, &head, reply).await;
            }
            (verdict, out) => {
                let left = Duration::from_millis(deadline_ms.saturating_sub(now_ms()));
                let wait = (verdict == Verdict::Retry)
                    .then(|| policy::backoff(&retry, runs, left, jitter()))
                    .flatten();
                if let Some(wait) = wait {
                    d.stats.retried.fetch_add(1, Ordering::Relaxed);
                    count_run(d, id, &mut head, &body, runs).await;
                    tokio::time::sleep(wait).await;
                    continue;
                }
                let why = match out {
                    Ok(reply) => String::from_utf8_lossy(&reply.body).trim_end().to_owned(),
                    Err(e) => e.to_string(),
                };
                dead_letter(d, id, head, &body, status, &why, runs).await;
                return;
            }
        }
    }
}

/// Writes `runs`, the runs of queued request `id` that failed, into its queue file (`head`
/// with `body`), so that a restart goes on counting. A failed write only costs that count.
async fn count_run(d: &Arc<Deferred>, id: &str, head: &mut Value, body: &[u8], runs: u32) {
    if let Value::Object(m) = head {
        m.insert("runs".into(), json!(runs));
    }
    let (d2, id2, head2, body2) = (d.clone(), id.to_owned(), head.clone(), body.to_vec());
    let written = tokio::task::spawn_blocking(move || {
        // Replayed or dropped meanwhile: nothing to count.
        if !d2.store.has(QUEUE, &id2) {
            return Ok(());
        }
        d2.store.put(QUEUE, &id2, &head2, &body2)
    })
    .await;
    if let Ok(Err(e)) | Err(e) = written.map_err(std::io::Error::other) {
        tracing::warn!(%id, "cannot record the runs of an async request: {e}");
    }
}

/// Records `reply` as request `id`'s result, then removes it from the queue; delivers it to
/// its callback.
async fn finish(d: &Arc<Deferred>, id: &str, request: &Value, reply: Reply) {
    let finished = now_ms();
    let callback = request["callback"].as_str().map(str::to_owned);
    let head = json!({
        "id": id,
        "status": reply.status.as_u16(),
        "headers": reply.headers.iter()
            .map(|(n, v)| [n.as_str(), v.to_str().unwrap_or_default()])
            .collect::<Vec<_>>(),
        "finished_ms": finished,
        "callback": callback,
        "delivered": false,
    });
    if d.store.has(DONE, id) {
        // Another run recorded it first (a chain winding down beside its replacement):
        // one answer, one callback.
        let _ = d.store.remove(QUEUE, id);
        return;
    }
    let (d2, id2) = (d.clone(), id.to_owned());
    let written = tokio::task::spawn_blocking(move || {
        d2.store.put(DONE, &id2, &head, &reply.body)?;
        d2.store.remove(QUEUE, &id2)
    })
    .await;
    if let Ok(Err(e)) | Err(e) = written.map_err(std::io::Error::other) {
        tracing::error!(%id, "cannot record an async result: {e}");
        return;
    }
    d.stats.completed.fetch_add(1, Ordering::Relaxed);
    lock(&d.results).push_back((finished, id.to_owned()));
    if callback.is_some() {
        deliver(d, DONE, id).await;
    }
}

/// Moves request `id` to the dead-letter queue with its last error.
async fn dead_letter(
    d: &Arc<Deferred>,
    id: &str,
    mut head: Value,
    body: &[u8],
    status: u16,
    why: &str,
    runs: u32,
) {
    let callback = head["callback"].is_string();
    if let Value::Object(m) = &mut head {
        m.insert("status".into(), json!(status));
        m.insert("error".into(), json!(why));
        m.insert("attempts".into(), json!(runs));
        m.insert("failed_ms".into(), json!(now_ms()));
        m.remove("runs");
        if callback {
            m.insert("delivered".into(), json!(false));
        }
    }
    let (d2, id2, body) = (d.clone(), id.to_owned(), body.to_vec());
    let written = tokio::task::spawn_blocking(move || {
        d2.store.put(DLQ, &id2, &head, &body)?;
        d2.store.remove(QUEUE, &id2)
    })
    .await;
    if let Ok(Err(e)) | Err(e) = written.map_err(std::io::Error::other) {
        tracing::error!(%id, "cannot dead-letter an async request: {e}");
        return;
    }
    tracing::warn!(%id, status, "async request dead-lettered: {why}");
    d.stats.dead_lettered.fetch_add(1, Ordering::Relaxed);
    if callback {
        deliver(d, DLQ, id).await;
    }
}

/// POSTs request `id`'s outcome to its callback URL, with retries: its result (in `folder`
/// [`DONE`]: the body as the function answered it), or its dead letter ([`DLQ`]: a JSON
/// document of its last status and error); marks it delivered once the callback answered
/// 2xx.
async fn deliver(d: &Arc<Deferred>, folder: &'static str, id: &str) {
    let Ok((mut head, body)) = d.store.get(folder, id) else {
        return;
    };
    let (state, payload) = if folder == DLQ {
        let letter = json!({
            "id": id,
            "state": "dead-letter",
            "status": head["status"],
            "error": head["error"],
            "attempts": head["attempts"],
        });
        ("dead-letter", letter.to_string().into_bytes())
    } else {
        ("done", body.clone())
    };
    let Some(url) = head["callback"].as_str().map(str::to_owned) else {
        return;
    };
    if head["delivered"] == Value::Bool(true) {
        return;
    }
    let status = head["status"].as_u64().unwrap_or(200);
    let schedule = callback_retry();
    let started = Instant::now();
    let mut runs = 0;
    loop {
        runs += 1;
        let (url2, id2, body2) = (url.clone(), id.to_owned(), payload.clone());
        let sent = tokio::task::spawn_blocking(move || {
            let req = ureq::AgentBuilder::new()
                .timeout(CALLBACK_TIMEOUT)
                .redirects(0)
                .build()
                .post(&url2);
            let req = if state == "dead-letter" {
                req.set("Content-Type", "application/json")
            } else {
                req
            };
            req.set("X-Zerohop-Request-Id", &id2)
                .set("X-Zerohop-Status", &status.to_string())
                .set("X-Zerohop-State", state)
                .send_bytes(&body2)
                .map(|r| r.status())
                .map_err(|e| e.to_string())
        })
        .await;
        match sent {
            Ok(Ok(s)) if (200..300).contains(&s) => break,
            other => {
                let left = Duration::from_secs(60).saturating_sub(started.elapsed());
                match policy::backoff(&schedule, runs, left, jitter()) {
                    Some(w) => tokio::time::sleep(w).await,
                    None => {
                        tracing::warn!(%id, %url, "callback given up: {other:?}");
                        d.stats.callbacks_failed.fetch_add(1, Ordering::Relaxed);
                        return;
                    }
                }
            }
        }
    }
    d.stats.callbacks.fetch_add(1, Ordering::Relaxed);
    head["delivered"] = Value::Bool(true);
    let (d2, id2) = (d.clone(), id.to_owned());
    let _ = tokio::task::spawn_blocking(move || d2.store.put(folder, &id2, &head, &body)).await;
}

impl Gateway {
    /// [`Gateway::submit_within`] with the route's retries when it is `idempotent`: a
    /// retryable status is run again after a backoff while the request's `timeout` allows.
    pub(crate) async fn submit_retrying<C: AsRef<[u8]>>(
        &self,
        route: u16,
        meta: &[(&str, &str)],
        chunks: &[C],
        timeout: Duration,
    ) -> Result<Reply, GatewayError> {
        let retry = self
            .deferred()
            .and_then(|d| d.delivery(route))
            .filter(|r| r.idempotent)
            .and_then(|r| r.retry.clone());
        let Some(retry) = retry else {
            return self
                .submit_within(route, meta.iter().copied(), chunks, timeout)
                .await;
        };
        let deadline = Instant::now() + timeout;
        let mut runs = 0;
        loop {
            runs += 1;
            let left = deadline.saturating_duration_since(Instant::now());
            let out = self
                .submit_within(route, meta.iter().copied(), chunks, left)
                .await;
            if policy::classify(status_of(&out), &retry.statuses) != Verdict::Retry {
                return out;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match policy::backoff(&retry, runs, left, jitter()) {
                Some(wait) => {
                    if let Some(d) = self.deferred() {
                        d.stats.retried.fetch_add(1, Ordering::Relaxed);
                    }
                    tokio::time::sleep(wait).await;
                }
                None => return out,
            }
        }
    }
}
