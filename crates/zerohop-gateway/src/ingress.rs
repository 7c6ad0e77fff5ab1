//! The way in: HTTP server, body into a slot, descriptor to the head function, answer.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch, Semaphore};
use tracing::Instrument;
use zerohop_pool::{Descriptor, OwnedSlot, Owner, SlotHeader};
use zerohop_transport::{PartyId, SendError};

use crate::egress::Outcome;
use crate::error::error_response;
use crate::{ErrorSource, Gateway, GatewayError, Inflight, META_RESERVE};

/// The gateway as hyper's service (a named type, so connections of it can be named too).
struct Service(Arc<Gateway>);

impl hyper::service::Service<Request<Incoming>> for Service {
    type Response = Answer;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Answer, Infallible>> + Send>>;

    fn call(&self, req: Request<Incoming>) -> Self::Future {
        let gw = self.0.clone();
        Box::pin(async move {
            let mut answer = gw.handle(req).await;
            // Relaxed: a late sight of the flag costs one more keep-alive answer, no more.
            if gw.closing.load(Ordering::Relaxed) {
                // hyper closes the connection once this answer is written.
                answer.headers_mut().insert(
                    header::CONNECTION,
                    header::HeaderValue::from_static("close"),
                );
            }
            Ok(answer)
        })
    }
}

/// How long a client may take to send a request's headers.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);
const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(5);
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);
/// After [`Gateway::close_connections`], how long connections get to close after their next
/// answer (a client between two requests sends its next one and is told to close) before
/// the rest are shut down gracefully (idle ones closed, busy ones after their answer).
const IDLE_GRACE: Duration = Duration::from_secs(1);
/// How often the winding down looks at the connections.
const CLOSE_POLL: Duration = Duration::from_millis(5);

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
    /// (up to the chain timeout) and returns. At most `max_connections` connections are
    /// served at once; the next waits in the listen backlog until one closes.
    ///
    /// After [`Gateway::close_connections`] it first waits, once stopped, for its
    /// connections to close after their next answer: until none is left or [`IDLE_GRACE`]
    /// has passed; the graceful shutdown then closes the idle ones and lets busy ones
    /// finish their request.
    pub async fn serve(
        self: Arc<Self>,
        listener: TcpListener,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let graceful = GracefulShutdown::new();
        let slots = Arc::new(Semaphore::new(self.config.max_connections.max(1) as usize));
        let mut backoff = ACCEPT_BACKOFF_MIN;
        loop {
            let permit = tokio::select! {
                p = slots.clone().acquire_owned() => p.expect("the semaphore is never closed"),
                _ = shutdown.changed() => break,
            };
            let stream = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => {
                        backoff = ACCEPT_BACKOFF_MIN;
                        stream
                    }
                    Err(e) => {
                        // EMFILE, ENFILE, ENOBUFS...: retrying at once would spin.
                        tracing::warn!("gateway: accept failed: {e}; retrying in {backoff:?}");
                        tokio::select! {
                            _ = tokio::time::sleep(backoff) => {}
                            _ = shutdown.changed() => break,
                        }
                        backoff = (backoff * 2).min(ACCEPT_BACKOFF_MAX);
                        continue;
                    }
                },
                _ = shutdown.changed() => break,
            };
            let _ = stream.set_nodelay(true);
            let conn = graceful.watch(self.connection(stream, true));
            tokio::spawn(async move {
                let _ = conn.await;
                drop(permit);
            });
        }
        // Relaxed: `close_connections` is called before the shutdown signal this loop was
        // stopped by, and the watch channel orders the two.
        let handed_over = self.closing.load(Ordering::Relaxed);
        let mut last = Vec::new();
        if !handed_over {
            // Connections the kernel completed that nobody accepted yet would be reset when
            // the listener closes, though their clients already sent their requests: serve
            // them too. (Handed over, the listener lives on in the new chain, which takes
            // them.) `timeout(ZERO, ..)` polls the accept once: only what is waiting now.
            // Each gets one answer and is closed (a graceful shutdown would close a
            // connection whose request was not read yet).
            while let Ok(Ok((stream, _))) =
                tokio::time::timeout(Duration::ZERO, listener.accept()).await
            {
                let Ok(permit) = slots.clone().try_acquire_owned() else {
                    break;
                };
                let _ = stream.set_nodelay(true);
                let conn = self.connection(stream, false);
                last.push(tokio::spawn(async move {
                    let _ = conn.await;
                    drop(permit);
                }));
            }
        }
        drop(listener);
        if handed_over {
            let all = self.config.max_connections.max(1) as usize;
            let started = tokio::time::Instant::now();
            loop {
                let waited = started.elapsed();
                let open = all - slots.available_permits();
                if open == 0 || waited >= IDLE_GRACE {
                    tracing::debug!(
                        open,
                        "gateway {}: connections wound down in {waited:?}",
                        self.party
                    );
                    break;
                }
                tokio::time::sleep(CLOSE_POLL).await;
            }
        }
        let _ = tokio::time::timeout(self.config.timeout, async {
            graceful.shutdown().await;
            for c in last {
                let _ = c.await;
            }
        })
        .await;
    }

    /// Serves one connection over any byte stream (the fuzz target of the HTTP ingress feeds
    /// it arbitrary bytes this way); returns when the connection ends.
    pub async fn serve_io<I>(self: &Arc<Self>, io: I)
    where
        I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let _ = self.connection(io, true).await;
    }

    /// One HTTP/1.1 connection over `io`, answering with [`Gateway::handle`].
    fn connection<I>(
        self: &Arc<Self>,
        io: I,
        keep_alive: bool,
    ) -> http1::Connection<TokioIo<I>, Service>
    where
        I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(HEADER_READ_TIMEOUT)
            .keep_alive(keep_alive)
            .serve_connection(TokioIo::new(io), Service(self.clone()))
    }

    /// Answers one HTTP request.
    pub(crate) async fn handle(&self, req: Request<Incoming>) -> Answer {
        match self.handle_inner(req).await {
            Ok(reply) => reply.into_http(),
            Err(e) => e.into_response(),
        }
    }

    async fn handle_inner(&self, req: Request<Incoming>) -> Result<Reply, GatewayError> {
        let route = self
            .router
            .find(req.method(), req.uri().path())
            .inspect_err(|_| self.count_error())?;
        let max = self.config.max_body;
        if let Some(len) = content_length(req.headers()).inspect_err(|_| self.count_error())? {
            if len > max {
                self.count_error();
                return Err(too_large(max));
            }
        }
        let (parts, body) = req.into_parts();
        // The whole body first, as the chunks hyper read it (no copy), bounded in size and
        // time: a slow client holds memory of its own, never a slot.
        let chunks =
            match tokio::time::timeout(self.config.body_timeout, read_body(body, max)).await {
                Ok(Ok(chunks)) => chunks,
                Ok(Err(e)) => {
                    self.count_error();
                    return Err(e);
                }
                Err(_) => {
                    self.count_error();
                    return Err(GatewayError::new(
                        StatusCode::REQUEST_TIMEOUT,
                        ErrorSource::Gateway,
                        format!(
                            "the request body did not arrive within {:?} (body_timeout)",
                            self.config.body_timeout
                        ),
                    ));
                }
            };
        let mut meta: Vec<(&str, &str)> = Vec::new();
        for name in &self.plan.headers {
            for v in parts.headers.get_all(name.as_str()) {
                if let Ok(v) = v.to_str() {
                    meta.push((name, v));
                }
            }
        }
        self.submit(route, meta, &chunks).await
    }

    /// Runs one request through route `route` of the chain, whatever protocol it came by:
    /// takes a slot, writes `meta` (name, value pairs the chain's functions asked for: HTTP
    /// looks up only those, other protocols filter theirs with [`Gateway::asked`]) and the body (`chunks`, the only copy in), sends it to the head
    /// function and waits for the answer. Counts the outcome in [`GatewayStats`]: a reply
    /// with a 2xx or 3xx status is `ok`, anything else `errors`.
    ///
    /// [`GatewayStats`]: crate::GatewayStats
    pub async fn submit<'m, C: AsRef<[u8]>>(
        &self,
        route: u16,
        meta: impl IntoIterator<Item = (&'m str, &'m str)>,
        chunks: &[C],
    ) -> Result<Reply, GatewayError> {
        // The request's life in a span, its id recorded once assigned. DEBUG: under the
        // agent's usual `info` filter the span is never created (a check of a few ns, no
        // allocation), so the error events below name the request themselves.
        let span = tracing::debug_span!("request", id = tracing::field::Empty, route);
        let result = self
            .submit_inner(route, meta, chunks, self.config.timeout, &span)
            .instrument(span.clone())
            .await;
        self.tally(&result);
        result
    }

    /// Runs one hop a peer node relays (a chain split over nodes): [`Gateway::submit`] on
    /// `route`, a relay route (`RoutePlan::relay_of`), with `meta` as the peer's slot held it
    /// and `timeout` the time the peer's request has left (at most the chain's timeout).
    /// The reply says whether the function left the sequence ([`Reply::left`]).
    pub async fn submit_relayed(
        &self,
        route: u16,
        meta: &[u8],
        body: &[u8],
        timeout: Duration,
    ) -> Result<Reply, GatewayError> {
        let relay = self
            .plan
            .routes
            .get(route as usize)
            .is_some_and(|r| r.relay_of.is_some());
        if !relay {
            self.count_error();
            return Err(GatewayError::new(
                StatusCode::NOT_FOUND,
                ErrorSource::Gateway,
                format!("route {route} takes no relayed hops"),
            ));
        }
        let text = String::from_utf8_lossy(meta);
        let pairs = text.lines().filter_map(|l| l.split_once(": "));
        let span = tracing::debug_span!("relayed", id = tracing::field::Empty, route);
        let result = self
            .submit_inner(
                route,
                pairs,
                &[body],
                timeout.min(self.config.timeout),
                &span,
            )
            .instrument(span.clone())
            .await;
        self.tally(&result);
        result
    }

    /// Counts a request's outcome in [`GatewayStats`]: a reply with a 2xx or 3xx status is
    /// `ok`, anything else `errors`.
    ///
    /// [`GatewayStats`]: crate::GatewayStats
    fn tally(&self, result: &Result<Reply, GatewayError>) {
        match result {
            Ok(r) if r.status.is_success() || r.status.is_redirection() => {
                // Relaxed: a counter for reports, it orders nothing.
                self.stats.ok.fetch_add(1, Ordering::Relaxed);
            }
            _ => self.count_error(),
        }
    }

    async fn submit_inner<'m, C: AsRef<[u8]>>(
        &self,
        route: u16,
        meta: impl IntoIterator<Item = (&'m str, &'m str)>,
        chunks: &[C],
        timeout: Duration,
        span: &tracing::Span,
    ) -> Result<Reply, GatewayError> {
        let head = self.plan.routes[route as usize].sequence[0];
        let total: u64 = chunks.iter().map(|c| c.as_ref().len() as u64).sum();
        if total > self.config.max_body {
            return Err(too_large(self.config.max_body));
        }
        let meta = self.meta(meta)?;
        let pool = &self.route_pools[route as usize];
        let Some(mut slot) = pool.alloc(Owner::party(self.party)) else {
            tracing::debug!(route, "every slot of the pool is in use; answered 503");
            return Err(GatewayError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                ErrorSource::Gateway,
                format!(
                    "all {} slots of the pool are in use; retry",
                    pool.slot_count()
                ),
            )
            .with_header(header::RETRY_AFTER, "1"));
        };
        let meta_len = meta.len();
        // The one copy in: the metadata and the body's chunks straight into the slot.
        let mut len = 0usize;
        {
            let data = slot.data_mut();
            data[..meta_len].copy_from_slice(meta.as_bytes());
            for c in chunks {
                let c = c.as_ref();
                data[meta_len + len..meta_len + len + c.len()].copy_from_slice(c);
                len += c.len();
            }
        }
        let id = self.ids.id(
            self.party,
            self.next_request.fetch_add(1, Ordering::Relaxed),
        );
        span.record("id", id);
        slot.set_header(&SlotHeader {
            request: id,
            route,
            meta_len: meta_len as u16,
            deadline_ms: zerohop_pool::monotonic_ms() + timeout.as_millis() as u64,
            ..SlotHeader::default()
        });
        let (tx, rx) = oneshot::channel();
        let sent = (slot.index(), slot.generation());
        let was_idle = {
            let mut table = self.inflight.lock().unwrap_or_else(|p| p.into_inner());
            let was_idle = table.is_empty();
            table.insert(
                id,
                Inflight {
                    tx,
                    slot: sent.0,
                    generation: sent.1,
                    route,
                },
            );
            was_idle
        };
        if was_idle {
            self.became_busy.notify_waiters();
        }
        let mut guard = InflightGuard {
            gw: self,
            id,
            armed: true,
        };
        let desc = slot.descriptor(id, len as u32, head);
        // Never wait for room on this thread: it serves every connection of the chain.
        let delivered = match self.picker.pick_state(head, pool) {
            Some((to, state)) => {
                let sent = self.sender.try_send(to, desc);
                if state != zerohop_pool::PartyState::Ready && sent.is_ok() {
                    // It waits in that party's queue until the agent activates it.
                    self.wants_instance.notify_one();
                }
                sent
            }
            None => Err(SendError::NoSuchParty(Descriptor::GATEWAY as PartyId)),
        };
        match delivered {
            Ok(()) => slot.into_sent(),
            Err(SendError::Full(_)) => {
                // Back-pressure, not a fault: the client is told to retry.
                tracing::debug!(
                    request = id,
                    function = self.plan.function_name(head),
                    "the head function's queue is full; answered 503"
                );
                return Err(GatewayError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    ErrorSource::Function(self.plan.function_name(head).to_owned()),
                    "its queue is full (the function is behind or stuck); retry",
                )
                .with_header(header::RETRY_AFTER, "1"));
            }
            Err(e) => {
                tracing::warn!(
                    request = id,
                    function = self.plan.function_name(head),
                    "could not send the request to its head function: {e}; answered 503"
                );
                return Err(GatewayError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    ErrorSource::Transport,
                    format!("could not reach `{}`: {e}", self.plan.function_name(head)),
                ));
            }
        }
        self.stats.accepted.fetch_add(1, Ordering::Relaxed);
        let outcome = tokio::time::timeout(timeout, rx).await;
        // Whoever resolved the oneshot (`complete`, or dropping the table) took the entry out.
        guard.armed = outcome.is_err();
        if !matches!(outcome, Ok(Ok(Outcome::Done { .. }))) {
            // No answer: if the head never took the slot (the descriptor still waits in the
            // queue of a dead or stuck instance), it is still ours under the generation we
            // sent; take it back so it cannot leak. A slot anyone took is left alone.
            pool.revoke(sent.0, sent.1, Owner::party(self.party));
        }
        match outcome {
            Ok(Ok(Outcome::Done {
                slot,
                len,
                header,
                function,
            })) => self.reply(slot, len, &header, function),
            // Logged with the request where it failed (an instance's death, the receive
            // path).
            Ok(Ok(Outcome::Failed(e))) => Err(e),
            Ok(Err(_)) => {
                tracing::warn!(request = id, "dropped without an answer; answered 502");
                Err(GatewayError::new(
                    StatusCode::BAD_GATEWAY,
                    ErrorSource::Gateway,
                    "the request was dropped without an answer",
                ))
            }
            Err(_) => {
                tracing::warn!(
                    request = id,
                    route,
                    "no answer within {timeout:?} (timeout); answered 504",
                );
                Err(GatewayError::new(
                    StatusCode::GATEWAY_TIMEOUT,
                    ErrorSource::Gateway,
                    format!(
                        "chain '{}' did not answer within {timeout:?}",
                        self.plan.chain
                    ),
                ))
            }
        }
    }

    /// The one copy out: the reply's body from the slot; the slot is freed on return.
    /// `header` is the copy validated when the slot was taken.
    fn reply(
        &self,
        slot: OwnedSlot,
        len: u32,
        header: &SlotHeader,
        function: u8,
    ) -> Result<Reply, GatewayError> {
        let m = header.meta_len as usize;
        let body = Bytes::copy_from_slice(&slot.data()[m..m + len as usize]);
        drop(slot);
        let status = match header.status {
            0 => StatusCode::OK,
            s => match StatusCode::from_u16(s) {
                Ok(st) if answerable(st) => st,
                _ => {
                    tracing::warn!(
                        request = header.request,
                        function = self.plan.function_name(function),
                        "answered with status {s}, which has no body; answered 502"
                    );
                    return Err(GatewayError::new(
                        StatusCode::BAD_GATEWAY,
                        ErrorSource::Function(self.plan.function_name(function).to_owned()),
                        format!("answered with status {s}, which is not a final status with a body (200..=599 but 204, 205, 304)"),
                    ));
                }
            },
        };
        Ok(Reply {
            status,
            body,
            left: header.flags & SlotHeader::FLAG_DYNAMIC != 0,
        })
    }

    /// The metadata area's text: `name: value\n` lines, at most [`META_RESERVE`] bytes.
    fn meta<'m>(
        &self,
        pairs: impl IntoIterator<Item = (&'m str, &'m str)>,
    ) -> Result<String, GatewayError> {
        let mut meta = String::new();
        for (name, value) in pairs {
            if value.contains('\n') || value.contains('\r') {
                continue;
            }
            meta.push_str(name);
            meta.push_str(": ");
            meta.push_str(value);
            meta.push('\n');
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
        Ok(meta)
    }
}

impl Gateway {
    /// The pairs of `pairs` whose name a function of the chain asked for (its `headers`,
    /// case-insensitive): what a protocol without HTTP's headers hands to [`Gateway::submit`].
    pub(crate) fn asked<'a, 'm: 'a>(
        &'a self,
        pairs: impl IntoIterator<Item = (&'m str, &'m str)> + 'a,
    ) -> impl Iterator<Item = (&'m str, &'m str)> + 'a {
        let headers = &self.plan.headers;
        pairs
            .into_iter()
            .filter(move |(name, _)| headers.iter().any(|h| h.eq_ignore_ascii_case(name)))
    }
}

/// What the chain answered a request with: the last function's status and output, or a
/// function's error (status 4xx/5xx, its one-line message as the body).
#[derive(Debug)]
pub struct Reply {
    /// 200 unless the function set another final status.
    pub status: StatusCode,
    /// The output, copied out of the slot.
    pub body: Bytes,
    /// The request left its route's sequence before the end (dynamic routing, or a function
    /// that replied early).
    pub left: bool,
}

impl Reply {
    /// The HTTP answer: the body as it is, or a function's error as a `text/plain` line.
    fn into_http(self) -> Answer {
        if self.status.is_success() || self.status.is_redirection() {
            let mut r = Response::new(Full::new(self.body));
            *r.status_mut() = self.status;
            return r;
        }
        let mut text = String::from_utf8_lossy(&self.body).into_owned();
        text.push('\n');
        error_response(self.status, text, &[])
    }
}

/// A status a function may answer with: final (200..=599) and one that carries a body.
fn answerable(s: StatusCode) -> bool {
    (200..=599).contains(&s.as_u16())
        && s != StatusCode::NO_CONTENT
        && s != StatusCode::RESET_CONTENT
        && s != StatusCode::NOT_MODIFIED
}

/// Reads a whole body as hyper's chunks, refusing it as soon as it exceeds `max`.
async fn read_body(mut body: Incoming, max: u64) -> Result<Vec<Bytes>, GatewayError> {
    let mut chunks = Vec::new();
    let mut len = 0u64;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| {
            GatewayError::new(
                StatusCode::BAD_REQUEST,
                ErrorSource::Gateway,
                format!("malformed request body: {e}"),
            )
        })?;
        if let Ok(data) = frame.into_data() {
            len += data.len() as u64;
            if len > max {
                return Err(too_large(max));
            }
            chunks.push(data);
        }
    }
    Ok(chunks)
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
