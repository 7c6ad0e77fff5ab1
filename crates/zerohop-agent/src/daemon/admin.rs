//! The admin API server: HTTP/1.1 on a unix socket (see [`crate::api`] for the paths).
//!
//! The socket is created with mode 0600 in a folder of mode 0700 the daemon creates if
//! missing, and every connection's peer credentials (`SO_PEERCRED`) are checked: only root
//! and the daemon's own uid are served; anyone else gets 403 and the connection is closed.
//! The folder must be the daemon's alone, and the CLI talks only through a folder no one else
//! can write ([`socket`]).

pub(super) mod dlq;
pub mod socket;

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Body, Frame, Incoming};
use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use serde::Serialize;
use tokio::net::UnixListener;
use tokio::sync::{mpsc, watch};

use super::{Daemon, DaemonError};
use crate::api::{self, ErrorBody, InvokeRequest, InvokeResponse, ScaleRequest};

/// Largest request body the admin API reads (a spec).
const MAX_REQUEST: usize = 4 << 20;

/// A response body: all at once, or JSON lines as they come.
pub enum AdminBody {
    /// The whole body.
    Full(Full<Bytes>),
    /// Chunks from a channel, until its senders are gone.
    Stream(mpsc::Receiver<Bytes>),
}

impl Body for AdminBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.get_mut() {
            AdminBody::Full(f) => Pin::new(f).poll_frame(cx),
            AdminBody::Stream(rx) => rx.poll_recv(cx).map(|c| c.map(|b| Ok(Frame::data(b)))),
        }
    }
}

type Answer = Response<AdminBody>;

fn json<T: Serialize>(status: StatusCode, value: &T) -> Answer {
    let mut body = serde_json::to_vec(value).unwrap_or_else(|_| b"{}".to_vec());
    body.push(b'\n');
    let mut r = Response::new(AdminBody::Full(Full::new(Bytes::from(body))));
    *r.status_mut() = status;
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    r
}

fn error(status: StatusCode, message: impl Into<String>) -> Answer {
    json(
        status,
        &ErrorBody {
            error: message.into(),
        },
    )
}

fn from_daemon(e: DaemonError) -> Answer {
    error(
        StatusCode::from_u16(e.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        e.to_string(),
    )
}

/// Whether a peer with uid `uid` may use the API: root, or the daemon's own uid.
pub fn allowed(uid: u32) -> bool {
    uid == 0 || uid == nix::unistd::geteuid().as_raw()
}

/// Serves the admin API on `listener` until `stop` turns true.
pub async fn serve(daemon: Arc<Daemon>, listener: UnixListener, mut stop: watch::Receiver<bool>) {
    loop {
        let stream = tokio::select! {
            a = listener.accept() => match a {
                Ok((s, _)) => s,
                Err(e) => {
                    tracing::warn!("admin socket: accept failed: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = stop.changed() => return,
        };
        let uid = stream.peer_cred().map(|c| c.uid()).ok();
        let daemon = daemon.clone();
        tokio::spawn(async move {
            let permitted = uid.is_some_and(allowed);
            if !permitted {
                tracing::warn!(?uid, "admin socket: refused a connection from another uid");
            }
            let service = hyper::service::service_fn(move |req| {
                let daemon = daemon.clone();
                async move {
                    if !permitted {
                        return Ok::<_, Infallible>(error(
                            StatusCode::FORBIDDEN,
                            format!(
                                "uid {} may not use this daemon (only root and uid {})",
                                uid.map_or("unknown".into(), |u| u.to_string()),
                                nix::unistd::geteuid()
                            ),
                        ));
                    }
                    Ok(route(&daemon, req).await)
                }
            });
            let conn = http1::Builder::new()
                .keep_alive(permitted)
                .serve_connection(TokioIo::new(stream), service);
            let _ = conn.await;
        });
    }
}

async fn read_json<T: serde::de::DeserializeOwned>(req: Request<Incoming>) -> Result<T, Answer> {
    let body = Limited::new(req.into_body(), MAX_REQUEST)
        .collect()
        .await
        .map_err(|e| error(StatusCode::BAD_REQUEST, format!("reading the request: {e}")))?
        .to_bytes();
    serde_json::from_slice(&body)
        .map_err(|e| error(StatusCode::BAD_REQUEST, format!("malformed request: {e}")))
}

/// The value of `key` in a query string.
fn query<'a>(q: &'a str, key: &str) -> Option<&'a str> {
    q.split('&')
        .filter_map(|kv| kv.split_once('=').or(Some((kv, ""))))
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v)
}

async fn route(daemon: &Arc<Daemon>, req: Request<Incoming>) -> Answer {
    let path = req.uri().path().to_owned();
    let q = req.uri().query().unwrap_or("").to_owned();
    let Some(rest) = path.strip_prefix(api::PREFIX) else {
        return error(StatusCode::NOT_FOUND, format!("no such API path {path}"));
    };
    let parts: Vec<&str> = rest.trim_matches('/').split('/').collect();
    let method = req.method().clone();
    match (method, parts.as_slice()) {
        (Method::GET, ["daemon"]) => json(StatusCode::OK, &daemon.describe()),
        (Method::GET, ["chains"]) => json(StatusCode::OK, &daemon.list()),
        (Method::POST, ["chains"]) => match read_json(req).await {
            Ok(a) => match daemon.apply(a).await {
                Ok(r) => json(StatusCode::OK, &r),
                Err(e) => from_daemon(e),
            },
            Err(e) => e,
        },
        (Method::GET, ["top"]) => {
            let all: Vec<_> = daemon
                .views()
                .iter()
                .map(|v| {
                    let mut s = v.status();
                    s.metrics_url = daemon.metrics_url();
                    s
                })
                .collect();
            json(StatusCode::OK, &all)
        }
        (Method::GET, ["chains", name]) => match daemon.status(name) {
            Ok(s) => json(StatusCode::OK, &s),
            Err(e) => from_daemon(e),
        },
        (Method::DELETE, ["chains", name]) => match daemon.down(name).await {
            Ok(r) => json(StatusCode::OK, &r),
            Err(e) => from_daemon(e),
        },
        (Method::POST, ["chains", name, "scale"]) => match read_json::<ScaleRequest>(req).await {
            Ok(s) => match daemon.scale(name, &s.function, s.instances).await {
                Ok(st) => json(StatusCode::OK, &st),
                Err(e) => from_daemon(e),
            },
            Err(e) => e,
        },
        (Method::POST, ["chains", name, "invoke"]) => match read_json::<InvokeRequest>(req).await {
            Ok(i) => invoke(daemon, name, i).await,
            Err(e) => e,
        },
        (Method::GET, ["chains", name, "logs"]) => {
            let function = query(&q, "function").filter(|f| !f.is_empty());
            let lines = query(&q, "lines")
                .and_then(|n| n.parse().ok())
                .unwrap_or(100);
            let follow = query(&q, "follow").is_some_and(|v| v != "0");
            match daemon.logs(name, function, lines, follow) {
                Ok(rx) => Response::new(AdminBody::Stream(rx)),
                Err(e) => from_daemon(e),
            }
        }
        (m, ["chains", name, "dlq", rest @ ..]) => dlq::route(daemon, &m, name, rest),
        (m, _) => error(
            StatusCode::NOT_FOUND,
            format!("no such API call: {m} {path}"),
        ),
    }
}

/// `zerohop invoke`: runs one request through a route of the chain, protocol-neutral (the
/// same entry point HTTP, MQTT and CoAP use).
async fn invoke(daemon: &Arc<Daemon>, name: &str, req: InvokeRequest) -> Answer {
    let view = match daemon.view(name) {
        Ok(v) => v,
        Err(e) => return from_daemon(e),
    };
    let gws = view.gateways();
    let plan = gws.plan();
    let route = match find_route(plan, &req.route) {
        Ok(r) => r,
        Err(e) => return error(StatusCode::NOT_FOUND, e.to_string()),
    };
    let gw = gws.iter().next().expect("a chain has a gateway").clone();
    let started = Instant::now();
    let body = req.data.into_bytes();
    let result = gw.submit(route, std::iter::empty(), &[body]).await;
    let micros = started.elapsed().as_micros() as u64;
    let (status, body) = match result {
        Ok(r) => (r.status.as_u16(), r.body),
        Err(e) => {
            let r = e.into_response();
            let status = r.status().as_u16();
            let body = r
                .into_body()
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            (status, body)
        }
    };
    json(
        StatusCode::OK,
        &InvokeResponse {
            status,
            body: String::from_utf8_lossy(&body).into_owned(),
            micros,
        },
    )
}

/// Why `zerohop invoke` names no route ([`find_route`]); each lists the chain's routes.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum RouteError {
    /// `#N` with no route `N`.
    #[error("no route {text}; routes: {}", routes.join("; "))]
    NoNumber {
        /// What was asked for.
        text: String,
        /// The chain's routes, `#N (METHOD /path, mqtt TOPIC, coap PATH)` each.
        routes: Vec<String>,
    },
    /// No route matches.
    #[error("no route `{text}`; routes: {}", routes.join("; "))]
    NoMatch {
        /// What was asked for.
        text: String,
        /// The chain's routes.
        routes: Vec<String>,
    },
    /// Several routes match.
    #[error(
        "`{text}` names {matches} routes; say which with METHOD /path or #N; routes: {}",
        routes.join("; ")
    )]
    Ambiguous {
        /// What was asked for.
        text: String,
        /// How many routes it matches.
        matches: usize,
        /// The chain's routes.
        routes: Vec<String>,
    },
}

/// The route `text` names: `#N`, `METHOD /path`, `/path` (one HTTP route with that path), an
/// MQTT topic filter or a CoAP path as written in the spec.
pub fn find_route(plan: &zerohop_transport::Plan, text: &str) -> Result<u16, RouteError> {
    let text = text.trim();
    let known = || {
        plan.routes
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let mut t = Vec::new();
                if !r.path.is_empty() {
                    t.push(format!("{} {}", r.method, r.path));
                }
                if !r.mqtt.is_empty() {
                    t.push(format!("mqtt {}", r.mqtt));
                }
                if !r.coap.is_empty() {
                    t.push(format!("coap {}", r.coap));
                }
                format!("#{i} ({})", t.join(", "))
            })
            .collect::<Vec<_>>()
    };
    if let Some(n) = text.strip_prefix('#') {
        return n
            .parse::<u16>()
            .ok()
            .filter(|&i| usize::from(i) < plan.routes.len())
            .ok_or_else(|| RouteError::NoNumber {
                text: text.to_owned(),
                routes: known(),
            });
    }
    let (method, target) = match text.split_once(' ') {
        Some((m, p)) => (Some(m.to_ascii_uppercase()), p.trim()),
        None => (None, text),
    };
    let hits: Vec<u16> = plan
        .routes
        .iter()
        .enumerate()
        .filter(|(_, r)| match &method {
            Some(m) if m == "MQTT" => r.mqtt == target,
            Some(m) if m == "COAP" => r.coap == target,
            Some(m) => r.method == *m && r.path == target,
            None => r.path == target || r.mqtt == target || r.coap == target,
        })
        .map(|(i, _)| i as u16)
        .collect();
    match hits.as_slice() {
        [one] => Ok(*one),
        [] => Err(RouteError::NoMatch {
            text: text.to_owned(),
            routes: known(),
        }),
        _ => Err(RouteError::Ambiguous {
            text: text.to_owned(),
            matches: hits.len(),
            routes: known(),
        }),
    }
}
