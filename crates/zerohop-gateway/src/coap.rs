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
//! * No amplification towards an address that has not shown it receives ([`reachability`]):
//!   until it presents an Echo value the gateway sent it, each of its datagrams is answered
//!   with at most as many bytes as it carried, a larger answer is replaced by a 4.01 Echo
//!   challenge (and kept for the repeated request), and it gets no early ACK and no
//!   separate response.
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
mod reachability;

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
use self::exchanges::{Exchanges, Key, Seen};
use self::message::{
    classify, code_for, codes, empty, method_name, Block, Exchange, Kind, Message, Request,
    Response,
};
use self::reachability::Reachability;
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

/// Most answers kept for the Echo repetition of their request, and their bytes.
const MAX_PENDING: usize = 256;
const MAX_PENDING_BYTES: usize = 16 << 20;

/// What the gateway keeps about CoAP exchanges; one lock, held briefly and never across an
/// await.
struct State {
    /// Messages of verified addresses.
    exchanges: Exchanges,
    /// Messages of the others: spoofed floods churn only this table.
    strangers: Exchanges,
    uploads: Uploads,
    held: Held,
    /// Answers to requests of unverified addresses that were too large to send, kept for
    /// the request's repetition with the Echo value, by (peer, digest of the request).
    pending: Held,
    reach: Reachability,
    /// Separate responses waiting for the client's ACK, by (peer, message id sent).
    confirms: HashMap<(SocketAddr, u16), oneshot::Sender<()>>,
}

impl Default for State {
    fn default() -> Self {
        Self {
            exchanges: Exchanges::default(),
            strangers: Exchanges::default(),
            uploads: Uploads::default(),
            held: Held::default(),
            pending: Held::new(MAX_PENDING, MAX_PENDING_BYTES),
            reach: Reachability::default(),
            confirms: HashMap::new(),
        }
    }
}

impl State {
    /// What became of message `key`, in whichever table holds it.
    fn seen(&mut self, key: &Key) -> Option<&mut Seen> {
        if self.exchanges.has(key) {
            self.exchanges.get_mut(key)
        } else {
            self.strangers.get_mut(key)
        }
    }

    /// The table for messages of a verified address, or of another.
    fn table(&mut self, verified: bool) -> &mut Exchanges {
        if verified {
            &mut self.exchanges
        } else {
            &mut self.strangers
        }
    }

    /// Sets what became of message `key`, in whichever table holds it.
    fn answer(&mut self, key: Key, bytes: Bytes, verified: bool, now: Instant) {
        if self.exchanges.has(&key) {
            self.exchanges.answer(key, bytes, now);
        } else if self.strangers.has(&key) {
            self.strangers.answer(key, bytes, now);
        } else {
            self.table(verified).answer(key, bytes, now);
        }
    }
}

/// `bytes`, the answer to a datagram from `peer`, when it fits the datagram's `budget`; else
/// the 4.01 Echo challenge for it when that fits (a NON one with message id `mid`); else
/// nothing (empty). The rule of [`reachability`]: at most as many bytes back as came in,
/// until the address proves it receives.
fn fit(
    reach: &Reachability,
    ex: &Exchange,
    bytes: Bytes,
    budget: Budget,
    peer: SocketAddr,
    now: Instant,
    mid: u16,
) -> Bytes {
    let Some(limit) = budget else {
        return bytes;
    };
    if bytes.len() <= limit {
        return bytes;
    }
    let mut r = Response::new(codes::UNAUTHORIZED);
    r.echo = Some(reach.echo(peer, now));
    let challenge = if ex.con {
        r.encode(Kind::Ack, ex.mid, &ex.token)
    } else {
        r.encode(Kind::Non, mid, &ex.token)
    };
    if challenge.len() <= limit {
        tracing::debug!(
            "coap: {peer} has not shown it receives; a {}-byte answer to its {limit}-byte message is replaced by an Echo challenge",
            bytes.len()
        );
        challenge
    } else {
        tracing::debug!(
            "coap: {peer} has not shown it receives; its {limit}-byte message is too small for any answer (the answer takes {} bytes, the Echo challenge {})",
            bytes.len(),
            challenge.len()
        );
        Bytes::new()
    }
}

/// The key of a pending answer in its [`Held`] table (which keys by peer and text).
fn pending_key(digest: u64) -> String {
    format!("{digest:016x}")
}

/// How many bytes may go to the sender of a datagram in reply to it: `None` when its address
/// is verified, else the datagram's length.
type Budget = Option<usize>;

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
    /// Digest of the request (method, path, query, options, payload): its answer is kept
    /// under it when it is too large for an unverified address.
    digest: u64,
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
        if bytes.is_empty() {
            return;
        }
        if let Err(e) = self.socket.send_to(bytes, peer).await {
            tracing::debug!("coap: sending to {peer} failed: {e}");
        }
    }

    fn expire(&self) {
        let now = Instant::now();
        let mut st = self.state();
        st.exchanges.expire(now);
        st.strangers.expire(now);
        st.uploads.expire(now);
        st.held.expire(now);
        st.pending.expire(now);
        st.reach.expire(now);
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
            Message::Request(ex, request) => self.request(ex, request, bytes, peer, tasks).await,
        }
    }

    /// Handles a request message: a duplicate is answered as before; a new one is answered
    /// at once or spawned into the chain. What goes back to an unverified address fits the
    /// datagram ([`fit`]).
    async fn request(
        self: &Arc<Self>,
        ex: Exchange,
        request: Result<Request, Response>,
        datagram: &[u8],
        peer: SocketAddr,
        tasks: &mut JoinSet<()>,
    ) {
        let key = (peer, ex.mid, self.random.hash_one(datagram));
        let now = Instant::now();
        let (budget, next) = {
            let mut st = self.state();
            if let Ok(Request { echo: Some(e), .. }) = &request {
                if st.reach.check(peer, e, now) {
                    st.reach.verify(peer, now);
                }
            }
            let budget = (!st.reach.is_verified(peer, now)).then_some(datagram.len());
            let next = match st.seen(&key) {
                Some(Seen::Answered(bytes)) => Next::Again(bytes.clone()),
                Some(Seen::Running { acked }) if ex.con && budget.is_none() => {
                    // The client is retransmitting: the chain is slow, so acknowledge now
                    // and answer separately.
                    *acked = true;
                    Next::Again(empty(Kind::Ack, ex.mid))
                }
                // A NON, or an unverified address's CON: its retransmissions fetch the
                // answer once there is one.
                Some(Seen::Running { .. }) => Next::Nothing,
                None => Next::Decided(match request {
                    Err(r) => Decision::Answer(r),
                    Ok(_) if self.draining.load(Ordering::Relaxed) => Decision::Answer(
                        Response::diagnostic(codes::UNAVAILABLE, "gateway: shutting down"),
                    ),
                    Ok(r) => self.decide(&mut st, peer, r, budget.is_none(), now),
                }),
            };
            (budget, next)
        };
        let decision = match next {
            Next::Again(bytes) => {
                let bytes = fit(
                    &self.state().reach,
                    &ex,
                    bytes,
                    budget,
                    peer,
                    now,
                    self.mid(),
                );
                return self.send(&bytes, peer).await;
            }
            Next::Nothing => return,
            Next::Decided(d) => d,
        };
        let answer = match decision {
            Decision::Run(job) => match self.in_flight.clone().try_acquire_owned() {
                Ok(permit) => {
                    self.state().table(budget.is_none()).insert(
                        key,
                        Seen::Running { acked: false },
                        now,
                    );
                    tasks.spawn(self.clone().run(ex, job, key, budget, permit));
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
        let bytes = {
            let mut st = self.state();
            let bytes = fit(
                &st.reach,
                &ex,
                self.encode(&ex, &answer),
                budget,
                peer,
                now,
                self.mid(),
            );
            st.table(budget.is_none())
                .insert(key, Seen::Answered(bytes.clone()), now);
            bytes
        };
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
    fn decide(
        &self,
        st: &mut State,
        peer: SocketAddr,
        r: Request,
        verified: bool,
        now: Instant,
    ) -> Decision {
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
        let szx = r
            .block2
            .map_or(Block::DEFAULT_SZX, |b| b.szx.min(Block::DEFAULT_SZX));
        let digest = self.random.hash_one((
            r.method,
            &path,
            &r.query,
            r.content_format,
            r.block1.map(|b| (b.num, b.more, b.szx)),
            r.block2.map(|b| (b.num, b.more, b.szx)),
            r.size1,
            &r.request_tag,
            &r.payload,
        ));
        if verified {
            if let Some(whole) = st.pending.take(&(peer, pending_key(digest)), now) {
                // The repetition, with the Echo value, of a request whose answer was too
                // large for the address before it proved it receives: that answer, and the
                // chain does not run again.
                let block1 = whole.block1;
                let mut r = self.first_block(st, (peer, path), whole, szx, now);
                r.block1 = block1;
                return Decision::Answer(r);
            }
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
            szx,
            digest,
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

    /// Runs a request through the chain and sends its response. For an unverified sender
    /// (`budget`), no early ACK goes out and the answer is sent only if it fits the request's
    /// datagram; otherwise the Echo challenge goes out and the answer is kept for the
    /// request's repetition.
    async fn run(
        self: Arc<Self>,
        ex: Exchange,
        job: Job,
        key: Key,
        budget: Budget,
        permit: OwnedSemaphorePermit,
    ) {
        let peer = key.0;
        let method = method_name(job.method);
        let meta = [
            ("coap-path", job.path.as_str()),
            ("coap-method", method.as_str()),
            ("coap-query", job.query.as_str()),
        ];
        let submit = self.gw.submit(job.route, self.gw.asked(meta), &job.chunks);
        tokio::pin!(submit);
        let result = if ex.con && budget.is_none() {
            tokio::select! {
                r = &mut submit => r,
                _ = tokio::time::sleep(ACK_DELAY) => {
                    self.ack_early(key, ex.mid).await;
                    submit.await
                }
            }
        } else {
            submit.await
        };
        drop(permit);
        let mut whole = self.response(result, job.content_format);
        whole.block1 = job.block1;
        let now = Instant::now();
        let (bytes, separate) = {
            let mut st = self.state();
            let mut response = self.first_block(
                &mut st,
                (peer, job.path.clone()),
                whole.clone(),
                job.szx,
                now,
            );
            response.block1 = job.block1;
            let acked = matches!(st.seen(&key), Some(Seen::Running { acked: true }));
            if ex.con && acked {
                let mid = self.mid();
                // Retransmitted until acknowledged, while there is room to wait for that.
                let confirm = self.unconfirmed.clone().try_acquire_owned().ok().map(|p| {
                    let (tx, rx) = oneshot::channel();
                    st.confirms.insert((peer, mid), tx);
                    (mid, rx, p)
                });
                st.answer(key, empty(Kind::Ack, ex.mid), budget.is_none(), now);
                (response.encode(Kind::Con, mid, &ex.token), confirm)
            } else {
                let mut bytes = self.encode(&ex, &response);
                let unverified = budget.filter(|_| !st.reach.is_verified(peer, now));
                if unverified.is_some_and(|limit| bytes.len() > limit) {
                    st.pending.hold((peer, pending_key(job.digest)), whole, now);
                    bytes = fit(&st.reach, &ex, bytes, unverified, peer, now, self.mid());
                }
                st.answer(key, bytes.clone(), budget.is_none(), now);
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
    async fn ack_early(&self, key: Key, mid: u16) {
        let send = match self.state().seen(&key) {
            Some(Seen::Running { acked }) if !*acked => {
                *acked = true;
                true
            }
            _ => false,
        };
        if send {
            self.send(&empty(Kind::Ack, mid), key.0).await;
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

/// The fuzz target `coap` (`fuzz/fuzz_targets/coap.rs`): `data` is a run of datagrams, each
/// `[peer, length, bytes...]` (peer: which of four client addresses sent it, its high bits
/// how many seconds passed before it), given to the pure parts of the server as
/// [`Server::datagram`] gives them: [`classify`], the Echo check, the deduplication tables,
/// Block1 assembly ([`Uploads`]) with a 4 KiB `max_body`, Block2 ([`Held`]) and the reply
/// limit ([`fit`]). Panics when a check fails:
///
/// * nothing panics; a request's token is at most 8 bytes;
/// * what an unverified address gets back for a datagram is at most the datagram's length;
/// * a Block option re-encodes to what it decoded from; an assembled body is at most
///   `max_body` and is exactly its blocks; the tables hold their bounds (entries, bytes,
///   per address);
/// * every response the gateway would send decodes (coap-lite) to the same message id,
///   token, code and payload; a block of a held response is a slice of it.
#[doc(hidden)]
pub fn fuzz_datagrams(data: &[u8]) {
    let peers: [SocketAddr; 4] = [
        SocketAddr::from(([192, 0, 2, 1], 5683)),
        SocketAddr::from(([192, 0, 2, 1], 40000)),
        SocketAddr::from(([198, 51, 100, 9], 5683)),
        SocketAddr::from(([0x2001, 0xdb8, 0, 0, 0, 0, 0, 1], 5683)),
    ];
    let limits = Limits {
        max_body: 4096,
        body_timeout: Duration::from_secs(10),
    };
    let random = RandomState::new();
    let reach = {
        let mut r = Reachability::new(2);
        r.verify(peers[3], Instant::now());
        r
    };
    let mut exchanges = Exchanges::new(8, 4, Duration::from_secs(30));
    let mut uploads = Uploads::new(2, 3000);
    let mut held = Held::new(2, 3000);
    let mut now = Instant::now();
    let mut rest = data;
    while rest.len() >= 2 {
        let (who, len) = (rest[0], usize::from(rest[1]));
        let Some(datagram) = rest.get(2..2 + len) else {
            break;
        };
        rest = &rest[2 + len..];
        let peer = peers[usize::from(who & 3)];
        now += Duration::from_secs(u64::from(who >> 4));
        let budget = (!reach.is_verified(peer, now)).then_some(datagram.len());
        let (ex, request) = match classify(datagram) {
            Message::Request(ex, request) => (ex, request),
            Message::Reset(_) | Message::Confirm(_) | Message::Drop => continue,
        };
        assert!(ex.token.len() <= 8);
        let key = (peer, ex.mid, random.hash_one(datagram));
        let response = match request {
            Err(r) => r,
            Ok(r) => {
                if let Some(e) = &r.echo {
                    let _ = reach.check(peer, e, now);
                }
                for b in [r.block1, r.block2].into_iter().flatten() {
                    assert_eq!(Block::decode(&b.encode()), Some(b));
                }
                let path = r.path.clone().unwrap_or_default();
                match (r.block1, r.block2) {
                    (_, Some(b)) if b.num > 0 => held.block(&(peer, path), b, now),
                    (Some(b), _) => {
                        let k = (peer, path, r.request_tag.clone());
                        let sent = r.payload.len();
                        match uploads.block(k, b, r.payload, r.size1, &limits, now) {
                            Step::Continue(c) => {
                                assert_eq!(c, b);
                                let mut cont = Response::new(codes::CONTINUE);
                                cont.block1 = Some(c);
                                cont
                            }
                            Step::Complete { chunks, block } => {
                                assert_eq!(block, b);
                                let body: Vec<u8> = chunks.concat();
                                assert!(body.len() as u64 <= limits.max_body);
                                assert!(body.len() >= sent);
                                let mut done = Response::new(codes::CHANGED);
                                done.payload = Bytes::from(body);
                                done.block1 = Some(block);
                                done
                            }
                            Step::Fail(e) => e,
                        }
                    }
                    _ => {
                        let mut whole = Response::new(codes::CHANGED);
                        whole.payload = Bytes::from(r.payload);
                        let szx = r.block2.map_or(Block::DEFAULT_SZX, |b| b.szx.min(6));
                        let first = Block {
                            num: 0,
                            more: false,
                            szx,
                        };
                        match whole.block(first) {
                            Some(b) if whole.payload.len() > first.size() => {
                                assert!(b.payload.len() == first.size());
                                held.hold((peer, path), whole, now);
                                b
                            }
                            _ => whole,
                        }
                    }
                }
            }
        };
        let encoded = response.encode(Kind::Ack, ex.mid, &ex.token);
        let p = coap_lite::Packet::from_bytes(&encoded)
            .unwrap_or_else(|e| panic!("{response:?} encoded does not decode: {e}"));
        assert_eq!(p.header.message_id, ex.mid);
        assert_eq!(p.get_token(), &ex.token[..]);
        assert_eq!(u8::from(p.header.code), response.code);
        assert_eq!(&p.payload[..], &response.payload[..]);
        let bytes = fit(&reach, &ex, encoded, budget, peer, now, 1);
        if let Some(limit) = budget {
            assert!(
                bytes.len() <= limit,
                "{} bytes for a {limit}-byte datagram",
                bytes.len()
            );
        }
        exchanges.insert(key, Seen::Answered(bytes), now);
        assert!(exchanges.len() <= 8);
        uploads.expire(now);
        held.expire(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exchange(con: bool) -> Exchange {
        Exchange {
            con,
            mid: 0x1234,
            token: b"tok".to_vec(),
        }
    }

    /// The review found separate responses retransmitted to any source address, so a
    /// spoofed 20-byte request drew up to five 1 KiB datagrams at its victim. Until an
    /// address proves it receives, what goes back to it fits what it sent.
    #[test]
    fn an_unverified_address_gets_at_most_what_it_sent() {
        let reach = Reachability::default();
        let peer = SocketAddr::from(([192, 0, 2, 7], 5683));
        let now = Instant::now();
        let big = Bytes::from(vec![0u8; 1100]);
        for con in [true, false] {
            let ex = exchange(con);
            // Verified: anything.
            assert_eq!(fit(&reach, &ex, big.clone(), None, peer, now, 9), big);
            // Fits the datagram: as it is.
            assert_eq!(fit(&reach, &ex, big.clone(), Some(1100), peer, now, 9), big);
            // Too large: the 4.01 challenge, whose Echo value proves the address.
            let c = fit(&reach, &ex, big.clone(), Some(40), peer, now, 9);
            assert!(c.len() <= 40, "{} bytes", c.len());
            let p = coap_lite::Packet::from_bytes(&c).unwrap();
            assert_eq!(u8::from(p.header.code), codes::UNAUTHORIZED);
            assert_eq!(p.header.message_id, if con { 0x1234 } else { 9 });
            assert_eq!(p.get_token(), b"tok");
            let echo = p
                .get_first_option(coap_lite::CoapOption::Unknown(252))
                .expect("an Echo option");
            assert!(reach.check(peer, echo, now));
            assert!(!reach.check(SocketAddr::from(([192, 0, 2, 8], 5683)), echo, now));
            // Too small even for that: nothing.
            assert!(fit(&reach, &ex, big.clone(), Some(c.len() - 1), peer, now, 9).is_empty());
        }
    }
}
