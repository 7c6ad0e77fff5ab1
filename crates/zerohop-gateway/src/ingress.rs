//! The way in: HTTP server, body into a slot, descriptor to the head function, answer.

use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch};
use zerohop_pool::{Descriptor, OwnedSlot, Owner, SlotHeader};
use zerohop_transport::{PartyId, SendError};

use crate::egress::Outcome;
use crate::error::error_response;
use crate::{ErrorSource, Gateway, GatewayError, META_RESERVE};

type Answer = Response<Full<Bytes>>;

/// Removes a request from the in-flight table when its HTTP task ends before an outcome
/// arrived (timed out, client gone, send failed). An outcome's sender already removed it, so
/// the guard is disarmed then and the answered path takes the lock once, not twice.
struct InflightGuard<'a> {
    gw: &'a Gateway,
    id: u32,
    armed: bool,
}

impl Drop for InflightGuard<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        self.gw
            .inflight
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.id);
    }
}

impl Gateway {
    /// Serves HTTP on `listener` until `shutdown` turns true, then lets open requests finish
    /// (up to the chain timeout) and returns.
    pub async fn serve(
        self: Arc<Self>,
        listener: TcpListener,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let graceful = GracefulShutdown::new();
        loop {
            tokio::select! {
                accepted = listener.accept() => {
                    let Ok((stream, _)) = accepted else { continue };
                    let _ = stream.set_nodelay(true);
                    let gw = self.clone();
                    let svc = service_fn(move |req| {
                        let gw = gw.clone();
                        async move { Ok::<_, Infallible>(gw.handle(req).await) }
                    });
                    let conn = http1::Builder::new()
                        .timer(TokioTimer::new())
                        .header_read_timeout(Duration::from_secs(30))
                        .serve_connection(TokioIo::new(stream), svc);
                    let conn = graceful.watch(conn);
                    tokio::spawn(async move {
                        let _ = conn.await;
                    });
                }
                _ = shutdown.changed() => break,
            }
        }
        drop(listener);
        let _ = tokio::time::timeout(self.config.timeout, graceful.shutdown()).await;
    }

    /// Answers one HTTP request.
    pub(crate) async fn handle(&self, req: Request<Incoming>) -> Answer {
        match self.handle_inner(req).await {
            Ok(answer) => {
                self.stats.ok.fetch_add(1, Ordering::Relaxed);
                answer
            }
            Err(e) => {
                self.count_error();
                e.into_response()
            }
        }
    }

    async fn handle_inner(&self, req: Request<Incoming>) -> Result<Answer, GatewayError> {
        let route = self.router.find(req.method(), req.uri().path())?;
        let head = self.plan.routes[route as usize].sequence[0];
        let max = self.config.max_body;
        if let Some(len) = content_length(req.headers())? {
            if len > max {
                return Err(too_large(max));
            }
        }
        let Some(mut slot) = self.pool.alloc(Owner::party(0)) else {
            return Err(GatewayError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                ErrorSource::Gateway,
                format!(
                    "all {} slots of the pool are in use; retry",
                    self.pool.slot_count()
                ),
            )
            .with_header(header::RETRY_AFTER, "1"));
        };
        let meta_len = self.write_meta(&mut slot, req.headers())?;
        // The one copy in: body frames straight into the slot.
        let mut len = 0usize;
        let mut body = req.into_body();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| {
                GatewayError::new(
                    StatusCode::BAD_REQUEST,
                    ErrorSource::Gateway,
                    format!("malformed request body: {e}"),
                )
            })?;
            if let Ok(data) = frame.into_data() {
                if (len + data.len()) as u64 > max {
                    return Err(too_large(max));
                }
                slot.data_mut()[meta_len + len..meta_len + len + data.len()].copy_from_slice(&data);
                len += data.len();
            }
        }
        let id = self.next_request.fetch_add(1, Ordering::Relaxed);
        slot.set_header(&SlotHeader {
            request: id,
            route,
            meta_len: meta_len as u16,
            ..SlotHeader::default()
        });
        let (tx, rx) = oneshot::channel();
        self.inflight
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, tx);
        let mut guard = InflightGuard {
            gw: self,
            id,
            armed: true,
        };
        let desc = slot.descriptor(id, len as u32, head);
        let sent = (slot.index(), slot.generation());
        let delivered = match self.picker.pick(head, &self.pool) {
            Some(to) => self.sender.send(to, desc),
            None => Err(SendError::NoSuchParty(Descriptor::GATEWAY as PartyId)),
        };
        match delivered {
            Ok(()) => slot.into_sent(),
            Err(e) => {
                return Err(GatewayError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    ErrorSource::Transport,
                    format!("could not reach `{}`: {e}", self.plan.function_name(head)),
                ))
            }
        }
        self.stats.accepted.fetch_add(1, Ordering::Relaxed);
        let outcome = tokio::time::timeout(self.config.timeout, rx).await;
        // Whoever resolved the oneshot (`complete`, or dropping the table) took the entry out.
        guard.armed = outcome.is_err();
        if !matches!(outcome, Ok(Ok(Outcome::Done { .. }))) {
            // No answer: if the head never took the slot (the descriptor still waits in the
            // queue of a dead or stuck instance), it is still ours under the generation we
            // sent; take it back so it cannot leak. A slot anyone took is left alone.
            self.pool.owners().revoke(sent.0, sent.1, Owner::party(0));
        }
        match outcome {
            Ok(Ok(Outcome::Done { slot, len })) => Ok(self.answer(slot, len)),
            Ok(Ok(Outcome::Failed(e))) => Err(e),
            Ok(Err(_)) => Err(GatewayError::new(
                StatusCode::BAD_GATEWAY,
                ErrorSource::Gateway,
                "the request was dropped without an answer",
            )),
            Err(_) => Err(GatewayError::new(
                StatusCode::GATEWAY_TIMEOUT,
                ErrorSource::Gateway,
                format!(
                    "chain '{}' did not answer within {:?}",
                    self.plan.chain, self.config.timeout
                ),
            )),
        }
    }

    /// The one copy out: the response body from the slot; the slot is freed on return.
    fn answer(&self, slot: OwnedSlot, len: u32) -> Answer {
        let header = slot.header();
        let m = header.meta_len as usize;
        let body = Bytes::copy_from_slice(&slot.data()[m..m + len as usize]);
        drop(slot);
        if header.status == 0 {
            return Response::new(Full::new(body));
        }
        self.count_error();
        // Undo the count `handle` will add for an Ok answer.
        self.stats.ok.fetch_sub(1, Ordering::Relaxed);
        let status =
            StatusCode::from_u16(header.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut text = String::from_utf8_lossy(&body).into_owned();
        text.push('\n');
        error_response(status, text, &[])
    }

    /// Writes the headers the functions asked for as `name: value\n` lines into the slot's
    /// metadata area; returns its length.
    fn write_meta(&self, slot: &mut OwnedSlot, headers: &HeaderMap) -> Result<usize, GatewayError> {
        let mut meta = String::new();
        for name in &self.plan.headers {
            for v in headers.get_all(name.as_str()) {
                if let Ok(v) = v.to_str() {
                    meta.push_str(name);
                    meta.push_str(": ");
                    meta.push_str(v);
                    meta.push('\n');
                }
            }
        }
        if meta.len() > META_RESERVE {
            return Err(GatewayError::new(
                StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                ErrorSource::Gateway,
                format!(
                    "the headers the chain's functions ask for take {} bytes, more than {META_RESERVE}",
                    meta.len()
                ),
            ));
        }
        slot.data_mut()[..meta.len()].copy_from_slice(meta.as_bytes());
        Ok(meta.len())
    }
}

fn content_length(h: &HeaderMap) -> Result<Option<u64>, GatewayError> {
    match h.get(header::CONTENT_LENGTH) {
        None => Ok(None),
        Some(v) => v
            .to_str()
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .map(Some)
            .ok_or_else(|| {
                GatewayError::new(
                    StatusCode::BAD_REQUEST,
                    ErrorSource::Gateway,
                    "Content-Length is not a number",
                )
            }),
    }
}

fn too_large(max: u64) -> GatewayError {
    GatewayError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        ErrorSource::Gateway,
        format!("request body exceeds the chain's limit of {max} bytes (max_body)"),
    )
}
