//! The dead-letter queue of a chain through the admin API (`zerohop dlq`), and the async
//! counters the metrics endpoint shows:
//!
//! | call | answer |
//! |---|---|
//! | `GET /v1/chains/NAME/dlq` | the dead letters, oldest first (no bodies) |
//! | `GET /v1/chains/NAME/dlq/ID` | one, with its body (`body`: text when it is UTF-8, else `body_hex`) |
//! | `POST /v1/chains/NAME/dlq/ID/replay` | queued again: to an answer or back to the queue |
//! | `DELETE /v1/chains/NAME/dlq/ID` | forgotten |

use std::sync::atomic::Ordering;
use std::sync::Arc;

use http::{Method, StatusCode};
use serde_json::{json, Value};
use zerohop_gateway::{DeadLetter, Deferred, DeferredError};

use super::{error, from_daemon, json, Answer};
use crate::daemon::Daemon;
use crate::ChainView;

/// Answers `METHOD /v1/chains/NAME/dlq/REST...`.
pub(super) fn route(daemon: &Arc<Daemon>, method: &Method, chain: &str, rest: &[&str]) -> Answer {
    let view = match daemon.view(chain) {
        Ok(v) => v,
        Err(e) => return from_daemon(e),
    };
    let Some(d) = deferred(&view) else {
        return error(
            StatusCode::NOT_FOUND,
            format!("chain '{chain}' has no async queue"),
        );
    };
    let done = |r: Result<(), DeferredError>, what: &str, id: &str| match r {
        Ok(()) => json(StatusCode::OK, &json!({ "id": id, "done": what })),
        Err(e) => failed(e),
    };
    match (method, rest) {
        (&Method::GET, []) => match d.dead_letters() {
            Ok(list) => json(
                StatusCode::OK,
                &list.iter().map(|l| letter(l, false)).collect::<Vec<_>>(),
            ),
            Err(e) => failed(e),
        },
        (&Method::GET, [id]) => match d.dead_letter(id) {
            Ok(l) => json(StatusCode::OK, &letter(&l, true)),
            Err(e) => failed(e),
        },
        (&Method::POST, [id, "replay"]) => done(d.replay(id), "replayed", id),
        (&Method::DELETE, [id]) => done(d.drop_dead_letter(id), "dropped", id),
        _ => error(
            StatusCode::NOT_FOUND,
            format!("no such API call: {method} .../dlq/{}", rest.join("/")),
        ),
    }
}

/// The chain's deferred requests.
fn deferred(view: &ChainView) -> Option<Arc<Deferred>> {
    view.gateways()
        .iter()
        .next()
        .and_then(|g| g.deferred().cloned())
}

fn failed(e: DeferredError) -> Answer {
    let status = match e {
        DeferredError::Unknown(_) => StatusCode::NOT_FOUND,
        DeferredError::Io { .. } => StatusCode::INTERNAL_SERVER_ERROR,
    };
    error(status, e.to_string())
}

/// A dead letter as JSON; `body`: with its body.
fn letter(l: &DeadLetter, body: bool) -> Value {
    let mut v = json!({
        "id": l.id,
        "route": l.route,
        "status": l.status,
        "error": l.error,
        "attempts": l.attempts,
        "accepted_ms": l.accepted_ms,
        "failed_ms": l.failed_ms,
        "callback": l.callback,
    });
    if body {
        v["body_len"] = json!(l.body.len());
        match std::str::from_utf8(&l.body) {
            Ok(t) => v["body"] = json!(t),
            Err(_) => {
                let hex: String = l.body.iter().map(|b| format!("{b:02x}")).collect();
                v["body_hex"] = json!(hex);
            }
        }
    }
    v
}

/// One metric family of the chains' async requests: name, help, counter (else gauge), and
/// per chain its value.
pub(in crate::daemon) type Family = (&'static str, &'static str, bool, Vec<(String, u64)>);

/// The metric families of the chains' async requests.
pub(in crate::daemon) fn families(views: &[ChainView]) -> Vec<Family> {
    type Read = fn(&Deferred) -> u64;
    let list: [(&str, &str, bool, Read); 7] = [
        (
            "zerohop_async_accepted",
            "Async requests accepted (answered 202)",
            true,
            |d| d.stats().accepted.load(Ordering::Relaxed),
        ),
        (
            "zerohop_async_completed",
            "Async requests that reached an answer",
            true,
            |d| d.stats().completed.load(Ordering::Relaxed),
        ),
        (
            "zerohop_retries",
            "Runs retried after a retryable status (async and idempotent routes)",
            true,
            |d| d.stats().retried.load(Ordering::Relaxed),
        ),
        (
            "zerohop_dead_lettered",
            "Requests moved to the dead-letter queue",
            true,
            |d| d.stats().dead_lettered.load(Ordering::Relaxed),
        ),
        (
            "zerohop_async_callbacks",
            "Async results delivered to a callback URL",
            true,
            |d| d.stats().callbacks.load(Ordering::Relaxed),
        ),
        (
            "zerohop_async_callbacks_failed",
            "Callbacks given up after their retries",
            true,
            |d| d.stats().callbacks_failed.load(Ordering::Relaxed),
        ),
        (
            "zerohop_async_pending",
            "Async requests waiting or running now",
            false,
            |d| d.pending() as u64,
        ),
    ];
    let chains: Vec<(String, Arc<Deferred>)> = views
        .iter()
        .filter_map(|v| Some((v.name().to_owned(), deferred(v)?)))
        .collect();
    list.iter()
        .map(|(name, help, counter, read)| {
            let samples = chains.iter().map(|(c, d)| (c.clone(), read(d))).collect();
            (*name, *help, *counter, samples)
        })
        .collect()
}
