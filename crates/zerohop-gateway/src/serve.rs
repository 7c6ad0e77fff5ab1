//! The HTTP server: listeners, connections, winding down; each request goes to
//! [`Gateway::handle`].
//!
//! One listener speaks HTTP/1.1 and HTTP/2 (hyper-util's automatic connection: in clear,
//! HTTP/2 with prior knowledge is told from HTTP/1.1 by its preface; over TLS, ALPN offers
//! `h2` and `http/1.1`). Both reach the same routes, limits and answers.
//!
//! What one client can hold, whatever it sends:
//!
//! | what | bound |
//! |---|---|
//! | connections | `max_connections` per gateway thread and listener; more wait in the backlog |
//! | a TLS handshake | [`HANDSHAKE_TIMEOUT`](crate::tls::HANDSHAKE_TIMEOUT) |
//! | request headers (HTTP/1.1) | [`HEADER_READ_TIMEOUT`]; hyper's 100 headers, 400 KiB buffer |
//! | a connection with no request running | [`IDLE_TIMEOUT`] (also one that never sends a byte) |
//! | streams of an HTTP/2 connection at once | [`H2_MAX_STREAMS`] |
//! | an HTTP/2 header list | [`H2_MAX_HEADER_LIST`] bytes |
//! | unread HTTP/2 body bytes | [`H2_STREAM_WINDOW`] per stream, [`H2_CONNECTION_WINDOW`] per connection |
//! | HTTP/2 streams reset by the client before they are served (rapid reset) | [`H2_MAX_PENDING_RESETS`], then the connection is closed (GOAWAY `ENHANCE_YOUR_CALM`) |
//! | HTTP/2 streams the server had to reset for errors of the client | [`H2_MAX_LOCAL_RESETS`], then the connection is closed |
//! | a request body | `max_body` and `body_timeout` (in [`Gateway::handle`]); one large slot while a body larger than a slot arrives |
//! | an answer the client does not read | `body_timeout` without progress of a write ([`Stall`]), then the connection is closed: one slot per request held at most that long; answers of a gateway thread hold at most a quarter of its share of the small pool (past that they are copied out) |
//!
//! So an HTTP/2 connection holds at most [`H2_MAX_STREAMS`] requests' bodies, where an
//! HTTP/1.1 connection holds one: in memory while a body fits a slot, in a large slot once it
//! does not (see `body`).

use std::convert::Infallible;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{header, Request, Response, Version};
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Notify, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::body::AnswerBody;
use crate::stall::{Progress, Stall, Watched};
use crate::tls::{Inside, Tls};
use crate::{grpc, Gateway};

/// How long a client may take to send a request's headers (HTTP/1.1).
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a connection may stay open with no request running (HTTP/2 between streams,
/// and any connection before its first byte), before it is closed gracefully.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// Streams one HTTP/2 connection may have open at once (nginx's default is 128).
pub const H2_MAX_STREAMS: u32 = 128;
/// Largest HTTP/2 header list (decoded names and values), as HTTP/1.1's header limits.
pub const H2_MAX_HEADER_LIST: u32 = 64 * 1024;
/// Body bytes a client may send on one HTTP/2 stream before the gateway has read them.
pub const H2_STREAM_WINDOW: u32 = 256 * 1024;
/// Body bytes a client may send on one HTTP/2 connection before the gateway has read them.
pub const H2_CONNECTION_WINDOW: u32 = 1024 * 1024;
/// Streams a client may reset before the gateway took them up; more close the connection
/// (the "rapid reset" attack, CVE-2023-44487, costs a bounded amount per connection).
pub const H2_MAX_PENDING_RESETS: usize = 20;
/// Streams the gateway may reset for a client's protocol errors before it closes the
/// connection (CVE-2025-8671, "MadeYouReset").
pub const H2_MAX_LOCAL_RESETS: usize = 256;
const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(5);
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);
/// After [`Gateway::close_connections`], how long connections get to close after their next
/// answer (a client between two requests sends its next one and is told to close) before
/// the rest are shut down gracefully (idle ones closed, busy ones after their answer).
const IDLE_GRACE: Duration = Duration::from_secs(1);
/// How often the winding down looks at the connections.
const CLOSE_POLL: Duration = Duration::from_millis(5);

/// What the serve loop tells its connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Serving,
    /// Another gateway took the listener over: HTTP/2 connections get a GOAWAY now (their
    /// client moves to a new connection for its next request); HTTP/1.1 ones close after
    /// their next answer.
    HandedOver,
    /// Every connection shuts down gracefully: idle ones now, busy ones after their answers.
    Stopping,
}

/// What a connection's driver learns from its requests.
struct ConnState {
    /// A request came over HTTP/2.
    h2: AtomicBool,
    /// Requests running now.
    busy: AtomicUsize,
    /// When the last request ended, in milliseconds after `born`.
    last: AtomicU64,
    born: Instant,
    /// At most one answer on this connection (the winding down's last connections).
    once: bool,
    /// Asks the driver to shut the connection down gracefully.
    kick: Notify,
    /// The client's address (what a per-client rate limit counts when it is not
    /// authenticated); `None` for [`Gateway::serve_io`].
    peer: Option<IpAddr>,
    /// Its answers being written (see `stall`).
    answers: Arc<Progress>,
}

impl ConnState {
    fn new(once: bool, peer: Option<IpAddr>) -> Self {
        Self {
            peer,
            h2: AtomicBool::new(false),
            busy: AtomicUsize::new(0),
            last: AtomicU64::new(0),
            born: Instant::now(),
            once,
            kick: Notify::new(),
            answers: Progress::new(),
        }
    }

    /// When the connection counts as idle if no request starts before.
    fn idle_at(&self) -> Instant {
        // Relaxed: a stale value moves the deadline by one request, and it is checked again.
        self.born + Duration::from_millis(self.last.load(Ordering::Relaxed)) + IDLE_TIMEOUT
    }
}

/// Counts one running request of a connection; the end is counted however the request
/// ends (answered, or dropped when its HTTP/2 stream is reset).
struct Busy(Arc<ConnState>);

impl Busy {
    fn enter(c: &Arc<ConnState>) -> Self {
        // Relaxed: only the driver of this connection reads it, to decide idleness.
        c.busy.fetch_add(1, Ordering::Relaxed);
        Self(c.clone())
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        let ms = self.0.born.elapsed().as_millis() as u64;
        self.0.last.store(ms, Ordering::Relaxed);
        self.0.busy.fetch_sub(1, Ordering::Relaxed);
    }
}

/// What the service answers: [`Gateway::handle`]'s (an answer the gateway made whole, or
/// the chain's reply in pieces), or a gRPC answer's message and trailers
/// ([`Gateway::handle_grpc`]); watched for a client that stops reading.
type Answer = Response<Watched<Either<Full<Bytes>, AnswerBody>>>;

/// The gateway as hyper's service, for one connection.
struct Service {
    gw: Arc<Gateway>,
    conn: Arc<ConnState>,
}

impl hyper::service::Service<Request<Incoming>> for Service {
    type Response = Answer;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Answer, Infallible>> + Send>>;

    fn call(&self, req: Request<Incoming>) -> Self::Future {
        let gw = self.gw.clone();
        let busy = Busy::enter(&self.conn);
        let peer = self.conn.peer;
        let answers = self.conn.answers.clone();
        let h1 = req.version() < Version::HTTP_2;
        if !h1 {
            self.conn.h2.store(true, Ordering::Relaxed);
            // Relaxed: a late sight of the flag costs one more request on this connection.
            if gw.closing.load(Ordering::Relaxed) || self.conn.once {
                // A GOAWAY: this stream and those before it are still served, the client
                // opens a new connection for the next.
                self.conn.kick.notify_one();
            }
        }
        Box::pin(async move {
            let _busy = busy;
            let mut answer = match grpc::Call::of(&req) {
                Ok(None) => gw.handle(req, peer).await,
                Ok(Some(call)) => gw.handle_grpc(req, peer, call).await.map(Either::Right),
                Err(e) => {
                    gw.count_error();
                    e.into_response().map(Either::Left)
                }
            };
            // Relaxed: a late sight of the flag costs one more keep-alive answer, no more.
            if h1 && gw.closing.load(Ordering::Relaxed) {
                // hyper closes the connection once this answer is written.
                answer.headers_mut().insert(
                    header::CONNECTION,
                    header::HeaderValue::from_static("close"),
                );
            }
            Ok(answer.map(|b| Watched::new(b, answers)))
        })
    }
}

impl Gateway {
    /// Serves HTTP/1.1 and HTTP/2 in clear on `listener` until `shutdown` turns true, then
    /// lets open requests finish (up to the chain timeout) and returns. At most
    /// `max_connections` connections are served at once; the next waits in the listen
    /// backlog until one closes.
    ///
    /// After [`Gateway::close_connections`] it first waits, once stopped, for its
    /// connections to close after their next answer (HTTP/2 ones are sent a GOAWAY): until
    /// none is left or [`IDLE_GRACE`] has passed; the graceful shutdown then closes the idle
    /// ones and lets busy ones finish their request.
    pub async fn serve(self: Arc<Self>, listener: TcpListener, shutdown: watch::Receiver<bool>) {
        self.serve_on(listener, None, shutdown).await
    }

    /// [`Gateway::serve`] over TLS with `tls`'s certificates: ALPN chooses HTTP/2 or
    /// HTTP/1.1. A handshake counts against `max_connections` and is bounded by
    /// [`HANDSHAKE_TIMEOUT`](crate::tls::HANDSHAKE_TIMEOUT).
    pub async fn serve_tls(
        self: Arc<Self>,
        listener: TcpListener,
        tls: Arc<Tls>,
        shutdown: watch::Receiver<bool>,
    ) {
        self.serve_on(listener, Some(tls), shutdown).await
    }

    async fn serve_on(
        self: Arc<Self>,
        listener: TcpListener,
        tls: Option<Arc<Tls>>,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let (phase_tx, phase) = watch::channel(Phase::Serving);
        let all = self.config.max_connections.max(1) as usize;
        let slots = Arc::new(Semaphore::new(all));
        let mut conns = JoinSet::new();
        let mut backoff = ACCEPT_BACKOFF_MIN;
        loop {
            while conns.try_join_next().is_some() {}
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
            conns.spawn(
                self.clone()
                    .accepted(stream, tls.clone(), false, phase.clone(), permit),
            );
        }
        // Relaxed: `close_connections` is called before the shutdown signal this loop was
        // stopped by, and the watch channel orders the two.
        let handed_over = self.closing.load(Ordering::Relaxed);
        // The last connections see no phase change before the end: each gets one answer
        // (HTTP/1.1 without keep-alive, HTTP/2 a GOAWAY after its first request).
        let (last_tx, last_phase) = watch::channel(Phase::Serving);
        if !handed_over {
            // Connections the kernel completed that nobody accepted yet would be reset when
            // the listener closes, though their clients already sent their requests: serve
            // them too. (Handed over, the listener lives on in the new chain, which takes
            // them.) `timeout(ZERO, ..)` polls the accept once: only what is waiting now.
            // (A graceful shutdown would close a connection whose request was not read yet.)
            while let Ok(Ok((stream, _))) =
                tokio::time::timeout(Duration::ZERO, listener.accept()).await
            {
                let Ok(permit) = slots.clone().try_acquire_owned() else {
                    break;
                };
                conns.spawn(self.clone().accepted(
                    stream,
                    tls.clone(),
                    true,
                    last_phase.clone(),
                    permit,
                ));
            }
        }
        drop(listener);
        if handed_over {
            phase_tx.send_replace(Phase::HandedOver);
            let started = Instant::now();
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
        phase_tx.send_replace(Phase::Stopping);
        // What is still open after the chain's timeout is cut (the set aborts its tasks).
        let _ = tokio::time::timeout(self.config.timeout, async {
            while conns.join_next().await.is_some() {}
        })
        .await;
        drop(last_tx);
    }

    /// One accepted connection: its TLS handshake if `tls`, then HTTP until it ends; holds
    /// `permit` throughout.
    async fn accepted(
        self: Arc<Self>,
        stream: TcpStream,
        tls: Option<Arc<Tls>>,
        once: bool,
        phase: watch::Receiver<Phase>,
        permit: OwnedSemaphorePermit,
    ) {
        let _permit = permit;
        let _ = stream.set_nodelay(true);
        let peer = stream.peer_addr().ok().map(|a| a.ip());
        // Under TLS too: what stalls is the socket.
        let stream = Stall::new(stream, self.config.body_timeout);
        let Some(tls) = tls else {
            return self.drive(stream, peer, once, phase).await;
        };
        let mut stopping = phase.clone();
        let secured = tokio::select! {
            s = tls.accept(stream, Inside::Http) => s,
            _ = stopping.wait_for(|p| *p == Phase::Stopping) => None,
        };
        if let Some(s) = secured {
            self.drive(s, peer, once, phase).await;
        }
    }

    /// Serves one connection over any byte stream (the fuzz targets of the HTTP ingress feed
    /// it arbitrary bytes this way: HTTP/1.1, or HTTP/2 when they start with its preface);
    /// returns when the connection ends.
    pub async fn serve_io<I>(self: &Arc<Self>, io: I)
    where
        I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let (_serving, phase) = watch::channel(Phase::Serving);
        self.clone().drive(io, None, false, phase).await;
    }

    /// Runs one HTTP/1.1 or HTTP/2 connection over `io` until it ends: shut down gracefully
    /// when the serve loop says so, when it is idle for [`IDLE_TIMEOUT`], or when a request
    /// asks for it (an HTTP/2 request while winding down).
    async fn drive<I>(
        self: Arc<Self>,
        io: I,
        peer: Option<IpAddr>,
        once: bool,
        mut phase: watch::Receiver<Phase>,
    ) where
        I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let state = Arc::new(ConnState::new(once, peer));
        let limit = self.config.body_timeout;
        let builder = builder(!once);
        let conn = builder.serve_connection(
            TokioIo::new(io),
            Service {
                gw: self,
                conn: state.clone(),
            },
        );
        tokio::pin!(conn);
        loop {
            // While a request runs the connection is not idle: look again a period later.
            let mut wake = if state.busy.load(Ordering::Relaxed) > 0 {
                Instant::now() + IDLE_TIMEOUT
            } else {
                state.idle_at()
            };
            if let Some(at) = state.answers.stalls_at(limit) {
                wake = wake.min(at);
            }
            tokio::select! {
                _ = conn.as_mut() => return,
                changed = phase.changed() => {
                    let now = if changed.is_err() {
                        Phase::Stopping
                    } else {
                        *phase.borrow_and_update()
                    };
                    match now {
                        Phase::Serving => {}
                        // HTTP/1.1 closes after its next answer (`Connection: close`).
                        Phase::HandedOver if !state.h2.load(Ordering::Relaxed) => {}
                        Phase::HandedOver | Phase::Stopping => break,
                    }
                }
                _ = state.kick.notified() => break,
                // An answer started: its stall is watched from the next look at the time.
                _ = state.answers.started.notified() => {}
                _ = tokio::time::sleep_until(wake) => {
                    if state.answers.stalled(limit) {
                        // Dropping the connection drops its answers and frees their slots.
                        tracing::debug!(
                            "gateway: closing a connection whose answers made no progress \
                             for {limit:?} (body_timeout)"
                        );
                        return;
                    }
                    if state.busy.load(Ordering::Relaxed) == 0 && Instant::now() >= state.idle_at() {
                        tracing::debug!("gateway: closing a connection idle for {IDLE_TIMEOUT:?}");
                        break;
                    }
                }
            }
        }
        conn.as_mut().graceful_shutdown();
        let _ = conn.await;
    }
}

/// The connection builder: HTTP/1.1 (with keep-alive if `keep_alive`) and HTTP/2, bounded
/// as the module's table says.
fn builder(keep_alive: bool) -> auto::Builder<TokioExecutor> {
    let mut b = auto::Builder::new(TokioExecutor::new());
    b.http1()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .keep_alive(keep_alive);
    b.http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(H2_MAX_STREAMS)
        .max_header_list_size(H2_MAX_HEADER_LIST)
        .initial_stream_window_size(H2_STREAM_WINDOW)
        .initial_connection_window_size(H2_CONNECTION_WINDOW)
        .max_pending_accept_reset_streams(H2_MAX_PENDING_RESETS)
        .max_local_error_reset_streams(H2_MAX_LOCAL_RESETS);
    b
}
