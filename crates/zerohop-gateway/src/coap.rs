//! CoAP ingress: confirmable and non-confirmable POST/PUT on a route's path run through the
//! chain; its output is the response (RFC 7252 over UDP, block-wise transfers of RFC 7959).
//!
//! One task owns the socket: it reads every datagram, answers what it can at once (errors,
//! 2.31 Continue for request blocks, later blocks of a held response, duplicates) and spawns
//! a task per request that enters the chain, so requests from one client run concurrently.
//!
//! * A CON request whose chain answers within [`ACK_DELAY`] gets its response piggy-backed
//!   on the ACK; otherwise an empty ACK goes out and the response follows as a separate CON,
//!   retransmitted with the protocol's back-off until the client acknowledges (or resets) it.
//!   A NON request gets a NON response.
//! * Every request message is remembered by (peer, message id) for the exchange lifetime
//!   ([`exchanges`]): a duplicate gets the same answer again (an empty ACK while its chain
//!   runs) and never runs the chain a second time.
//! * Bodies over one datagram arrive in Block1 blocks and are assembled before the chain
//!   runs; responses over one block (the client's Block2 size, else 1024 bytes) are held for
//!   the Block2 requests of their later blocks ([`blockwise`]).
//! * At most [`MAX_IN_FLIGHT`] requests run at once; more get 5.03 with Max-Age.
//!
//! Hostile input: whatever a datagram holds is classified without panicking
//! ([`message::classify`]); a CON that cannot be parsed is reset, anything else malformed is
//! dropped; every table is bounded in entries, bytes and time.
//!
//! Not supported: Observe, DTLS (`coaps://`), multicast, proxying (5.05), conditional
//! requests (If-Match, If-None-Match: 4.02), No-Response (ignored).

mod blockwise;
mod exchanges;
mod message;

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{header, StatusCode};
use tokio::net::UdpSocket;
use tokio::sync::{oneshot, watch, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;

use self::blockwise::{Held, Limits, Step, Uploads};
use self::exchanges::{Exchanges, Seen};
use self::message::{
    classify, code_for, codes, empty, method_name, Block, Exchange, Kind, Message, Request,
    Response,
};
use crate::ingress::Reply;
use crate::{Gateway, GatewayError};

/// How long a CON request's chain may take before the gateway acknowledges the request with
/// an empty ACK and sends the response separately (well under the client's first
/// retransmission, 2 to 3 s after sending).
const ACK_DELAY: Duration = Duration::from_secs(1);
/// ACK_TIMEOUT of RFC 7252 section 4.8 (ACK_RANDOM_FACTOR 1.5): a separate response is sent
/// again after 2 to 3 s, then after twice as long each time.
const ACK_TIMEOUT: Duration = Duration::from_secs(2);
/// MAX_RETRANSMIT of RFC 7252 section 4.8.
const MAX_RETRANSMIT: u32 = 4;
/// Most requests whose chain runs at once.
const MAX_IN_FLIGHT: usize = 1024;
/// Most separate responses retransmitted until acknowledged at once; past that one is sent
/// once only (the client may still retransmit its request, which gets the empty ACK again).
const MAX_UNCONFIRMED: usize = 1024;
/// Largest datagram read (the largest UDP payload fits).
const MAX_DATAGRAM: usize = 65536;
/// How often expired state is dropped.
const HOUSEKEEPING: Duration = Duration::from_secs(1);
const RECV_BACKOFF_MIN: Duration = Duration::from_millis(5);
const RECV_BACKOFF_MAX: Duration = Duration::from_secs(1);
/// The resource list of RFC 6690, served when no route takes the path.
const WELL_KNOWN_CORE: &str = "/.well-known/core";
/// Content-Format of the resource list: application/link-format.
const LINK_FORMAT: u16 = 40;

impl Gateway {
    /// Serves CoAP on `socket` until `shutdown` turns true, then lets requests in flight
    /// finish (up to the chain timeout) and returns.
    pub async fn serve_coap(
        self: Arc<Self>,
        socket: UdpSocket,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let timeout = self.config.timeout;
        let server = Arc::new(Server::new(self, socket, shutdown.clone()));
        let mut tasks = JoinSet::new();
        let mut buf = vec![0u8; MAX_DATAGRAM];
        let mut tick = tokio::time::interval(HOUSEKEEPING);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut backoff = RECV_BACKOFF_MIN;
        let mut running = !*shutdown.borrow_and_update();
        while running {
            tokio::select! {
                changed = shutdown.changed() => {
                    running = changed.is_ok() && !*shutdown.borrow_and_update();
                }
                received = server.socket.recv_from(&mut buf) => match received {
                    Ok((n, peer)) => {
                        backoff = RECV_BACKOFF_MIN;
                        server.datagram(&buf[..n], peer, &mut tasks).await;
                    }
                    Err(e) => {
                        // ENOMEM and the like: retrying at once would spin.
                        tracing::debug!("coap: receive failed: {e}; retrying in {backoff:?}");
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(RECV_BACKOFF_MAX);
                    }
                },
                Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
                _ = tick.tick() => server.expire(),
            }
        }
        // Drain: requests in flight finish and send their responses (separate ones once);
        // the socket is still read, so duplicates are answered and new requests get 5.03.
        server.draining.store(true, Ordering::Relaxed);
        let deadline = tokio::time::Instant::now() + timeout;
        while !tasks.is_empty() {
            tokio::select! {
                _ = tasks.join_next() => {}
                received = server.socket.recv_from(&mut buf) => {
                    if let Ok((n, peer)) = received {
                        server.datagram(&buf[..n], peer, &mut tasks).await;
                    }
                }
                _ = tokio::time::sleep_until(deadline) => break,
            }
        }
        tasks.abort_all();
    }
}

/// What the gateway keeps about CoAP exchanges; one lock, held briefly and never across an
/// await.
#[derive(Default)]
struct State {
    exchanges: Exchanges,
    uploads: Uploads,
    held: Held,
    /// Separate responses waiting for the client's ACK, by (peer, message id sent).
    confirms: HashMap<(SocketAddr, u16), oneshot::Sender<()>>,
}

/// A request that enters the chain.
struct Job {
    route: u16,
    method: u8,
    path: String,
    query: String,
    content_format: Option<u16>,
    chunks: Vec<Vec<u8>>,
    /// The Block1 option of the final response, when the body came in blocks.
    block1: Option<Block>,
    /// Block size exponent for the response's blocks.
    szx: u8,
}

/// What a request leads to.
enum Decision {
    Answer(Response),
    Run(Job),
}

/// What a request message leads to, duplicates included.
enum Next {
    /// A duplicate: this message again.
    Again(Bytes),
    /// A duplicate NON whose chain still runs: nothing.
    Nothing,
    /// A new request.
    Decided(Decision),
}

struct Server {
    gw: Arc<Gateway>,
    socket: UdpSocket,
    /// CoAP path to route index.
    routes: HashMap<String, u16>,
    limits: Limits,
    state: Mutex<State>,
    in_flight: Arc<Semaphore>,
    unconfirmed: Arc<Semaphore>,
    /// Turns true at shutdown: separate responses stop being retransmitted.
    shutdown: watch::Receiver<bool>,
    next_mid: AtomicU16,
    next_etag: AtomicU32,
    draining: AtomicBool,
    random: RandomState,
    nonce: AtomicU64,
}

impl Server {
    fn new(gw: Arc<Gateway>, socket: UdpSocket, shutdown: watch::Receiver<bool>) -> Self {
        let routes = gw
            .plan
            .routes
            .iter()
            .enumerate()
            .filter(|(_, r)| !r.coap.is_empty())
            .map(|(i, r)| (r.coap.clone(), i as u16))
            .collect();
        let random = RandomState::new();
        let limits = Limits {
            max_body: gw.config.max_body,
            body_timeout: gw.config.body_timeout,
        };
        Self {
            routes,
            limits,
            state: Mutex::new(State::default()),
            in_flight: Arc::new(Semaphore::new(MAX_IN_FLIGHT)),
            unconfirmed: Arc::new(Semaphore::new(MAX_UNCONFIRMED)),
            shutdown,
            // Message ids and ETags start anywhere, so a restarted gateway does not repeat
            // the ids a client still remembers.
            next_mid: AtomicU16::new(random.hash_one(1u8) as u16),
            next_etag: AtomicU32::new(random.hash_one(2u8) as u32),
            draining: AtomicBool::new(false),
            nonce: AtomicU64::new(3),
            random,
            gw,
            socket,
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn mid(&self) -> u16 {
        self.next_mid.fetch_add(1, Ordering::Relaxed)
    }

    /// A number in [0, 1) for the retransmission back-off.
    fn random_fraction(&self) -> f64 {
        let n = self.nonce.fetch_add(1, Ordering::Relaxed);
        (self.random.hash_one(n) >> 11) as f64 / (1u64 << 53) as f64
    }

    async fn send(&self, bytes: &[u8], peer: SocketAddr) {
        if let Err(e) = self.socket.send_to(bytes, peer).await {
            tracing::debug!("coap: sending to {peer} failed: {e}");
        }
    }

    fn expire(&self) {
        let now = Instant::now();
        let mut st = self.state();
        st.exchanges.expire(now);
        st.uploads.expire(now);
        st.held.expire(now);
    }

    /// Handles one datagram from `peer`.
    async fn datagram(self: &Arc<Self>, bytes: &[u8], peer: SocketAddr, tasks: &mut JoinSet<()>) {
        match classify(bytes) {
            Message::Drop => tracing::trace!("coap: dropped a datagram from {peer}"),
            Message::Reset(mid) => self.send(&empty(Kind::Rst, mid), peer).await,
            Message::Confirm(mid) => {
                if let Some(tx) = self.state().confirms.remove(&(peer, mid)) {
                    let _ = tx.send(());
                }
            }
            Message::Request(ex, request) => self.request(ex, request, peer, tasks).await,
        }
    }

    /// Handles a request message: a duplicate is answered as before; a new one is answered
    /// at once or spawned into the chain.
    async fn request(
        self: &Arc<Self>,
        ex: Exchange,
        request: Result<Request, Response>,
        peer: SocketAddr,
        tasks: &mut JoinSet<()>,
    ) {
        let key = (peer, ex.mid);
        let now = Instant::now();
        let next = {
            let mut st = self.state();
            match st.exchanges.get_mut(&key) {
                Some(Seen::Answered(bytes)) => Next::Again(bytes.clone()),
                Some(Seen::Running { acked }) if ex.con => {
                    // The client is retransmitting: the chain is slow, so acknowledge now
                    // and answer separately.
                    *acked = true;
                    Next::Again(empty(Kind::Ack, ex.mid))
                }
                Some(Seen::Running { .. }) => Next::Nothing,
                None => Next::Decided(match request {
                    Err(r) => Decision::Answer(r),
                    Ok(_) if self.draining.load(Ordering::Relaxed) => Decision::Answer(
                        Response::diagnostic(codes::UNAVAILABLE, "gateway: shutting down"),
                    ),
                    Ok(r) => self.decide(&mut st, peer, r, now),
                }),
            }
        };
        let decision = match next {
            Next::Again(bytes) => return self.send(&bytes, peer).await,
            Next::Nothing => return,
            Next::Decided(d) => d,
        };
        let answer = match decision {
            Decision::Run(job) => match self.in_flight.clone().try_acquire_owned() {
                Ok(permit) => {
                    self.state()
                        .exchanges
                        .insert(key, Seen::Running { acked: false }, now);
                    tasks.spawn(self.clone().run(ex, job, peer, permit));
                    return;
                }
                Err(_) => {
                    let mut r = Response::diagnostic(
                        codes::UNAVAILABLE,
                        format!("gateway: {MAX_IN_FLIGHT} CoAP requests are in flight; retry"),
                    );
                    r.max_age = Some(blockwise::RETRY_SECONDS);
                    r
                }
            },
            Decision::Answer(r) => r,
        };
        if answer.is_error() {
            self.gw.count_error();
        }
        let bytes = self.encode(&ex, &answer);
        self.state()
            .exchanges
            .insert(key, Seen::Answered(bytes.clone()), now);
        self.send(&bytes, peer).await;
    }

    /// The message answering `ex` with `r` at once: piggy-backed on the ACK of a CON, or a
    /// NON of its own.
    fn encode(&self, ex: &Exchange, r: &Response) -> Bytes {
        if ex.con {
            r.encode(Kind::Ack, ex.mid, &ex.token)
        } else {
            r.encode(Kind::Non, self.mid(), &ex.token)
        }
    }

    /// Routes a new request: an answer now, or a job for the chain.
    fn decide(&self, st: &mut State, peer: SocketAddr, r: Request, now: Instant) -> Decision {
        let method = method_name(r.method);
        let Some(path) = r.path else {
            return Decision::Answer(Response::diagnostic(
                codes::NOT_FOUND,
                format!("gateway: no route for {method} (a Uri-Path segment holds a '/')"),
            ));
        };
        let Some(&route) = self.routes.get(&path) else {
            if path == WELL_KNOWN_CORE {
                if r.method == codes::GET {
                    return Decision::Answer(self.resource_list(st, peer, &path, r.block2, now));
                }
                return Decision::Answer(Response::diagnostic(
                    codes::METHOD_NOT_ALLOWED,
                    format!("gateway: {path} does not accept {method}; allowed: GET"),
                ));
            }
            return Decision::Answer(Response::diagnostic(
                codes::NOT_FOUND,
                format!("gateway: no route for {method} {path}"),
            ));
        };
        if r.method != codes::POST && r.method != codes::PUT {
            return Decision::Answer(Response::diagnostic(
                codes::METHOD_NOT_ALLOWED,
                format!("gateway: {path} does not accept {method}; allowed: POST, PUT"),
            ));
        }
        if let Some(b) = r.block2.filter(|b| b.num > 0) {
            // A later block of a response already made (RFC 7959 section 2.4).
            return Decision::Answer(st.held.block(&(peer, path), b, now));
        }
        let (chunks, block1) = match r.block1 {
            Some(b) => {
                let key = (peer, path.clone(), r.request_tag);
                match st
                    .uploads
                    .block(key, b, r.payload, r.size1, &self.limits, now)
                {
                    Step::Continue(b) => {
                        let mut cont = Response::new(codes::CONTINUE);
                        cont.block1 = Some(b);
                        return Decision::Answer(cont);
                    }
                    Step::Fail(e) => return Decision::Answer(e),
                    Step::Complete { chunks, block } => (chunks, Some(block)),
                }
            }
            None => {
                if r.payload.len() as u64 > self.limits.max_body {
                    return Decision::Answer(self.limits.too_large());
                }
                (vec![r.payload], None)
            }
        };
        Decision::Run(Job {
            route,
            method: r.method,
            path,
            query: r.query,
            content_format: r.content_format,
            chunks,
            block1,
            szx: r
                .block2
                .map_or(Block::DEFAULT_SZX, |b| b.szx.min(Block::DEFAULT_SZX)),
        })
    }

    /// `/.well-known/core`: the routes' paths in link format (RFC 6690).
    fn resource_list(
        &self,
        st: &mut State,
        peer: SocketAddr,
        path: &str,
        block2: Option<Block>,
        now: Instant,
    ) -> Response {
        let key = (peer, path.to_owned());
        if let Some(b) = block2.filter(|b| b.num > 0) {
            return st.held.block(&key, b, now);
        }
        let mut paths: Vec<&str> = self.routes.keys().map(String::as_str).collect();
        paths.sort_unstable();
        let list = paths
            .iter()
            .map(|p| format!("<{p}>"))
            .collect::<Vec<_>>()
            .join(",");
        let mut r = Response::new(codes::CONTENT);
        r.payload = Bytes::from(list);
        r.content_format = Some(LINK_FORMAT);
        let szx = block2.map_or(Block::DEFAULT_SZX, |b| b.szx.min(Block::DEFAULT_SZX));
        self.first_block(st, key, r, szx, now)
    }

    /// `r` itself when it fits one block of `16 << szx` bytes; otherwise its first block,
    /// with an ETag, and the whole response held for the requests of the others.
    fn first_block(
        &self,
        st: &mut State,
        key: (SocketAddr, String),
        mut r: Response,
        szx: u8,
        now: Instant,
    ) -> Response {
        let first = Block {
            num: 0,
            more: false,
            szx,
        };
        if r.payload.len() <= first.size() {
            // A response held for an earlier request is no longer this path's answer.
            st.held.forget(&key);
            return r;
        }
        r.etag = Some(self.next_etag.fetch_add(1, Ordering::Relaxed));
        let block = r.block(first).unwrap_or_else(|| r.clone());
        if !st.held.hold(key, r, now) {
            tracing::warn!("coap: a response too large to hold; its later blocks get 4.08");
        }
        block
    }

    /// Runs a request through the chain and sends its response.
    async fn run(
        self: Arc<Self>,
        ex: Exchange,
        job: Job,
        peer: SocketAddr,
        permit: OwnedSemaphorePermit,
    ) {
        let key = (peer, ex.mid);
        let method = method_name(job.method);
        let meta = [
            ("coap-path", job.path.as_str()),
            ("coap-method", method.as_str()),
            ("coap-query", job.query.as_str()),
        ];
        let submit = self.gw.submit(job.route, self.gw.asked(meta), &job.chunks);
        tokio::pin!(submit);
        let result = if ex.con {
            tokio::select! {
                r = &mut submit => r,
                _ = tokio::time::sleep(ACK_DELAY) => {
                    self.ack_early(key).await;
                    submit.await
                }
            }
        } else {
            submit.await
        };
        drop(permit);
        let response = self.response(result, job.content_format);
        let now = Instant::now();
        let (bytes, separate) = {
            let mut st = self.state();
            let mut response =
                self.first_block(&mut st, (peer, job.path.clone()), response, job.szx, now);
            response.block1 = job.block1;
            let acked = matches!(
                st.exchanges.get_mut(&key),
                Some(Seen::Running { acked: true })
            );
            if ex.con && acked {
                let mid = self.mid();
                // Retransmitted until acknowledged, while there is room to wait for that.
                let confirm = self.unconfirmed.clone().try_acquire_owned().ok().map(|p| {
                    let (tx, rx) = oneshot::channel();
                    st.confirms.insert((peer, mid), tx);
                    (mid, rx, p)
                });
                st.exchanges.answer(key, empty(Kind::Ack, ex.mid), now);
                (response.encode(Kind::Con, mid, &ex.token), confirm)
            } else {
                let bytes = self.encode(&ex, &response);
                st.exchanges.answer(key, bytes.clone(), now);
                (bytes, None)
            }
        };
        self.send(&bytes, peer).await;
        if let Some((mid, rx, _permit)) = separate {
            self.confirm(bytes, peer, mid, rx).await;
        }
    }

    /// Sends the empty ACK of a CON request whose chain is slow (unless a retransmission
    /// already made it go out).
    async fn ack_early(&self, key: (SocketAddr, u16)) {
        let send = match self.state().exchanges.get_mut(&key) {
            Some(Seen::Running { acked }) if !*acked => {
                *acked = true;
                true
            }
            _ => false,
        };
        if send {
            self.send(&empty(Kind::Ack, key.1), key.0).await;
        }
    }

    /// Retransmits a separate response (a CON) until the client acknowledges or resets it,
    /// at most [`MAX_RETRANSMIT`] times with exponential back-off (RFC 7252 section 4.2).
    async fn confirm(
        &self,
        bytes: Bytes,
        peer: SocketAddr,
        mid: u16,
        mut rx: oneshot::Receiver<()>,
    ) {
        struct Forget<'a>(&'a Server, (SocketAddr, u16));
        impl Drop for Forget<'_> {
            fn drop(&mut self) {
                self.0.state().confirms.remove(&self.1);
            }
        }
        let _forget = Forget(self, (peer, mid));
        let mut shutdown = self.shutdown.clone();
        let mut wait = ACK_TIMEOUT.mul_f64(1.0 + 0.5 * self.random_fraction());
        for attempt in 0..=MAX_RETRANSMIT {
            if attempt > 0 {
                self.send(&bytes, peer).await;
            }
            tokio::select! {
                _ = &mut rx => return,
                // Shutting down: the response went out at least once.
                _ = shutdown.wait_for(|stop| *stop) => return,
                _ = tokio::time::sleep(wait) => wait *= 2,
            }
        }
        tracing::debug!("coap: {peer} never acknowledged separate response {mid}");
    }

    /// The response to a request that went through the chain (or failed on its way).
    fn response(
        &self,
        result: Result<Reply, GatewayError>,
        content_format: Option<u16>,
    ) -> Response {
        match result {
            Ok(r) if r.status.is_success() => Response {
                code: code_for(r.status),
                payload: r.body,
                // Functions cannot name their output's format (yet): the input's is passed on.
                content_format,
                ..Response::default()
            },
            Ok(r) if r.status.is_redirection() => Response::diagnostic(
                codes::BAD_GATEWAY,
                format!(
                    "gateway: the chain answered with status {}, which CoAP has no code for",
                    r.status.as_u16()
                ),
            ),
            Ok(r) => Response::diagnostic(
                code_for(r.status),
                String::from_utf8_lossy(&r.body).trim_end().to_owned(),
            ),
            Err(e) => {
                let mut r = Response::diagnostic(code_for(e.status), e.to_string());
                if e.status == StatusCode::PAYLOAD_TOO_LARGE {
                    r.size1 = self.limits.too_large().size1;
                }
                r.max_age = e
                    .headers
                    .iter()
                    .find(|(name, _)| name == header::RETRY_AFTER)
                    .and_then(|(_, v)| v.trim().parse().ok());
                r
            }
        }
    }
}
