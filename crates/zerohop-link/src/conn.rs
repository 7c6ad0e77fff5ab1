//! The peer connections: one persistent TCP connection per pair of nodes, authenticated
//! ([`crate::auth`]), carrying many calls at once ([`crate::frame`]).
//!
//! ```text
//!  Peers::call ──┐                                        ┌─► handler(call) ─┐ (a task each,
//!  Peers::call ──┼─► backlog ─► writer ══ TCP ══► reader ─┼─► handler(call) ─┤  at most
//!  Peers::call ──┘   (Wire)      task          (serve)    └─► handler(call) ─┘  MAX_IN_FLIGHT)
//!       ▲                                                                    │
//!       └── pending[stream] ◄── reader ◄══ TCP ══ writer ◄── backlog ◄───────┘
//! ```
//!
//! In the daemon all of it runs on one thread of its own (the peer runtime), so a call,
//! its frame and its answer never wake another thread, and the frames made in one turn of
//! that thread leave in one write.
//!
//! Client ([`Peers`]): the first call to an address connects (one caller does, the others
//! wait for it), later calls share the connection; each picks a fresh stream number and
//! waits for the ANSWER with it. Every call has exactly one outcome: its answer, or an
//! error. A call's own timeout fails that call only (a late answer is dropped); a lost
//! connection (closed, reset, a bad frame, or nothing received for [`LOST_AFTER_PINGS`] ping
//! intervals) fails every call pending on it at once, and the next call connects again. The
//! client pings when the connection has been quiet in either direction for half an interval,
//! so both ends see a frame at least once per interval.
//!
//! Server ([`serve`]): authenticates each connection, runs each CALL as a task of its own
//! and writes its ANSWER back with the CALL's stream; more than [`MAX_IN_FLIGHT`] calls at
//! once on a connection are answered 503 at once rather than queued (so the connection
//! keeps reading, and pings keep being answered). A bad frame, or nothing received for
//! [`SERVER_IDLE`], closes the connection. On shutdown it stops accepting and reading,
//! answers the calls it runs (for at most [`DRAIN`]) and closes.
//!
//! Both ends bound what waits to be written per connection ([`Wire`]): while more than
//! [`BACKLOG_ROOM`] bytes wait, a server reads no further frame (so a PING or a CALL beyond
//! the limit costs at most one small frame more) and answers and calls wait their turn. A
//! peer that reads nothing while bytes wait for it ([`WRITE_STALL`] for a server, the lost
//! interval for a client) loses the connection, and the log names it.
//!
//! Reading a frame never allocates more than it has received (growing to at most
//! [`MAX_FRAME`]) and refuses a bad announced length before reading the body.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot, watch, OwnedSemaphorePermit, Semaphore};
use tracing::{debug, warn};

use crate::auth::{self, AuthError, Role, Secret};
use crate::frame::{Answer, Call, Frame, FrameError, MAX_FRAME};

/// How often a client pings a quiet connection ([`Peers::new`]).
pub const PING_INTERVAL: Duration = Duration::from_secs(5);

/// A client declares its connection lost after this many ping intervals without a byte.
pub const LOST_AFTER_PINGS: u32 = 3;

/// How long a connection pinged every `interval` may stay silent before it counts as lost.
fn lost_after(interval: Duration) -> Duration {
    interval.saturating_mul(LOST_AFTER_PINGS)
}

/// A server closes a connection that sends nothing for this long (a client pings every
/// [`PING_INTERVAL`]).
pub const SERVER_IDLE: Duration = Duration::from_secs(30);

/// The calls a server runs at once per connection.
pub const MAX_IN_FLIGHT: usize = 1024;

/// The handshakes a server runs at once (each bounded in time); more connections waiting to
/// prove themselves are closed at once.
pub const MAX_HANDSHAKES: usize = 64;

/// How long a server that shuts down waits for the calls it runs.
pub const DRAIN: Duration = Duration::from_secs(10);

/// The bound on opening a TCP connection (the handshake has its own).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The buffer a connection reads through.
const READ_BUF: usize = 64 << 10;

/// A read buffer (or a write backlog) larger than this is not kept for the next frame.
const KEEP_BUF: usize = 1 << 20;

/// While more than this many bytes wait to be written on a connection, nothing more joins
/// them: a server reads no further frame, CALLs and ANSWERs wait (see [`Wire`]).
pub const BACKLOG_ROOM: usize = 1 << 20;

/// A server closes a connection whose peer reads none of the bytes waiting for it for this
/// long ([`serve`]; a client gives up after [`LOST_AFTER_PINGS`] ping intervals).
pub const WRITE_STALL: Duration = Duration::from_secs(15);

/// The first allocation for a frame's body; it then doubles as bytes arrive.
const FIRST_CHUNK: usize = 64 << 10;

/// What a server runs for each CALL: the future gives its ANSWER.
pub type Handler = Arc<dyn Fn(Call) -> Pin<Box<dyn Future<Output = Answer> + Send>> + Send + Sync>;

/// A [`Handler`] from an async closure.
pub fn handler<F, Fut>(f: F) -> Handler
where
    F: Fn(Call) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Answer> + Send + 'static,
{
    Arc::new(move |call| Box::pin(f(call)))
}

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    /// No TCP connection to the peer.
    #[error("peer {peer}: cannot connect: {source}")]
    Connect {
        /// The peer.
        peer: SocketAddr,
        /// What the connect (or setting up the socket) said.
        source: io::Error,
    },
    /// The handshake failed (it names the peer).
    #[error(transparent)]
    Auth(#[from] AuthError),
    /// The connection ended before the answer came.
    #[error("peer {peer}: connection lost ({reason})")]
    Lost {
        /// The peer.
        peer: SocketAddr,
        /// Why the connection ended.
        reason: Arc<str>,
    },
    /// No answer within the call's timeout.
    #[error("peer {peer}: no answer within {after:?}")]
    Timeout {
        /// The peer.
        peer: SocketAddr,
        /// The call's timeout.
        after: Duration,
    },
    /// The call does not fit in a frame; nothing was sent.
    #[error("peer {peer}: {what} of {size} bytes, more than a peer frame carries ({limit})")]
    TooLarge {
        /// The peer.
        peer: SocketAddr,
        /// The part too large.
        what: &'static str,
        /// Its size.
        size: usize,
        /// The most it may have.
        limit: usize,
    },
}

impl PeerError {
    /// The HTTP status the request gets: 502 when the peer could not be reached or was
    /// lost, 504 on timeout, 413 for a call too large to send.
    pub fn status(&self) -> u16 {
        match self {
            PeerError::Connect { .. } | PeerError::Auth(_) | PeerError::Lost { .. } => 502,
            PeerError::Timeout { .. } => 504,
            PeerError::TooLarge { .. } => 413,
        }
    }
}

/// Counters of a [`Peers`]; `calls - answered - failed` are in flight (or were dropped by
/// their caller before an outcome).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PeerStats {
    /// Calls made.
    pub calls: u64,
    /// Calls that got an answer (of any status).
    pub answered: u64,
    /// Calls that got a [`PeerError`].
    pub failed: u64,
    /// Connections opened (authenticated) so far.
    pub connections_opened: u64,
    /// Connections open now.
    pub connections_open: u64,
}

/// Every access is Relaxed: statistics, they order nothing.
#[derive(Default)]
struct Counters {
    calls: AtomicU64,
    answered: AtomicU64,
    failed: AtomicU64,
    opened: AtomicU64,
    open: AtomicU64,
}

/// The client side: one connection per peer address, opened on first use and again after
/// a loss. Share it behind an `Arc`; dropping it closes its connections once their calls
/// end.
pub struct Peers {
    secret: Arc<Secret>,
    ping_interval: Duration,
    slots: Mutex<HashMap<SocketAddr, Arc<tokio::sync::Mutex<Option<Conn>>>>>,
    counters: Arc<Counters>,
}

/// A connection as callers use it.
#[derive(Clone)]
struct Conn {
    /// Owned by the connection's task: the socket closes when the task ends.
    wire: Weak<Wire>,
    /// Held by every caller: when the last one goes, the connection closes.
    _users: mpsc::Sender<()>,
    shared: Arc<Shared>,
}

/// What callers and the connection's task share.
struct Shared {
    peer: SocketAddr,
    pending: Mutex<Pending>,
}

type Outcome = Result<Answer, Arc<str>>;

enum Pending {
    /// The calls waiting, by stream, and the next call's stream.
    Open(HashMap<u64, oneshot::Sender<Outcome>>, u64),
    Closed(Arc<str>),
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Nothing panics while holding these locks; a poisoned one is still consistent.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Shared {
    fn is_open(&self) -> bool {
        matches!(*lock(&self.pending), Pending::Open(..))
    }

    /// A fresh stream and where its outcome arrives, or why the connection is closed.
    fn register(&self) -> Result<(u64, oneshot::Receiver<Outcome>), Arc<str>> {
        match &mut *lock(&self.pending) {
            Pending::Open(map, next) => {
                let stream = *next;
                *next += 1;
                let (tx, rx) = oneshot::channel();
                map.insert(stream, tx);
                Ok((stream, rx))
            }
            Pending::Closed(reason) => Err(reason.clone()),
        }
    }

    /// Whoever takes a stream's sender gives the call its one outcome.
    fn take(&self, stream: u64) -> Option<oneshot::Sender<Outcome>> {
        match &mut *lock(&self.pending) {
            Pending::Open(map, _) => map.remove(&stream),
            Pending::Closed(_) => None,
        }
    }

    /// Closes the connection for callers: every pending call fails with `reason`.
    fn fail(&self, reason: Arc<str>) {
        let old = std::mem::replace(&mut *lock(&self.pending), Pending::Closed(reason.clone()));
        if let Pending::Open(map, _) = old {
            for (_, tx) in map {
                let _ = tx.send(Err(reason.clone()));
            }
        }
    }
}

/// Removes a call's stream when the call ends, however it ends (answer, timeout, its
/// caller dropping it), so a late answer finds no one and is dropped.
struct Unregister<'a> {
    shared: &'a Shared,
    stream: u64,
}

impl Drop for Unregister<'_> {
    fn drop(&mut self) {
        self.shared.take(self.stream);
    }
}

impl Peers {
    /// Peers authenticated with `secret`, pinged every [`PING_INTERVAL`].
    pub fn new(secret: Arc<Secret>) -> Self {
        Self::with_ping_interval(secret, PING_INTERVAL)
    }

    /// Peers pinged every `interval` (lost after [`LOST_AFTER_PINGS`] intervals without a
    /// byte; at least 10 ms). A server closes a connection quiet for [`SERVER_IDLE`], so keep
    /// it well below.
    pub fn with_ping_interval(secret: Arc<Secret>, interval: Duration) -> Self {
        Peers {
            secret,
            ping_interval: interval.max(Duration::from_millis(10)),
            slots: Mutex::new(HashMap::new()),
            counters: Arc::new(Counters::default()),
        }
    }

    /// Runs `call` on `peer` and returns its answer, all within `timeout` (connecting
    /// first if there is no connection to `peer`).
    pub async fn call(
        &self,
        peer: SocketAddr,
        call: Call,
        timeout: Duration,
    ) -> Result<Answer, PeerError> {
        self.counters.calls.fetch_add(1, Ordering::Relaxed);
        let outcome = match tokio::time::timeout(timeout, self.exchange(peer, call)).await {
            Ok(outcome) => outcome,
            Err(_) => Err(PeerError::Timeout {
                peer,
                after: timeout,
            }),
        };
        let counter = match outcome {
            Ok(_) => &self.counters.answered,
            Err(_) => &self.counters.failed,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        outcome
    }

    /// The counters so far.
    pub fn stats(&self) -> PeerStats {
        let c = &self.counters;
        PeerStats {
            calls: c.calls.load(Ordering::Relaxed),
            answered: c.answered.load(Ordering::Relaxed),
            failed: c.failed.load(Ordering::Relaxed),
            connections_opened: c.opened.load(Ordering::Relaxed),
            connections_open: c.open.load(Ordering::Relaxed),
        }
    }

    async fn exchange(&self, peer: SocketAddr, call: Call) -> Result<Answer, PeerError> {
        fits(peer, &call)?;
        let conn = self.conn(peer).await?;
        let (stream, outcome) = conn
            .shared
            .register()
            .map_err(|reason| PeerError::Lost { peer, reason })?;
        let _unregister = Unregister {
            shared: &conn.shared,
            stream,
        };
        let frame = Frame::Call(stream, call);
        send_when_room(&conn.wire, &frame)
            .await
            .map_err(|reason| PeerError::Lost { peer, reason })?;
        match outcome.await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(reason)) => Err(PeerError::Lost { peer, reason }),
            Err(_) => Err(PeerError::Lost {
                peer,
                reason: "the connection ended".into(),
            }),
        }
    }

    /// The open connection to `peer`, opened now if there is none: callers of one peer
    /// wait for each other here, so only one connects.
    async fn conn(&self, peer: SocketAddr) -> Result<Conn, PeerError> {
        let slot = lock(&self.slots).entry(peer).or_default().clone();
        // The usual case, an open connection, without queueing behind other callers.
        if let Ok(s) = slot.try_lock() {
            if let Some(conn) = s.as_ref().filter(|c| c.shared.is_open()) {
                return Ok(conn.clone());
            }
        }
        let mut slot = slot.lock().await;
        if let Some(conn) = slot.as_ref() {
            if conn.shared.is_open() {
                return Ok(conn.clone());
            }
        }
        *slot = None;
        let conn = self.open(peer).await?;
        *slot = Some(conn.clone());
        Ok(conn)
    }

    async fn open(&self, peer: SocketAddr) -> Result<Conn, PeerError> {
        let connect_error = |source| PeerError::Connect { peer, source };
        let mut stream = match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(peer)).await
        {
            Ok(connected) => connected.map_err(connect_error)?,
            Err(_) => {
                return Err(connect_error(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("no connection within {CONNECT_TIMEOUT:?}"),
                )))
            }
        };
        stream.set_nodelay(true).map_err(connect_error)?;
        auth::handshake(&mut stream, &self.secret, Role::Client, peer).await?;
        let (rd, wr) = stream.into_split();
        let stall = lost_after(self.ping_interval);
        let wire = Arc::new(Wire::new(wr, stall));
        let (users, rx) = mpsc::channel(1);
        let shared = Arc::new(Shared {
            peer,
            pending: Mutex::new(Pending::Open(HashMap::new(), 1)),
        });
        self.counters.opened.fetch_add(1, Ordering::Relaxed);
        self.counters.open.fetch_add(1, Ordering::Relaxed);
        debug!(%peer, "peer connection open");
        let weak = Arc::downgrade(&wire);
        tokio::spawn(run_client(
            rd,
            wire,
            rx,
            shared.clone(),
            self.ping_interval,
            self.counters.clone(),
        ));
        Ok(Conn {
            wire: weak,
            _users: users,
            shared,
        })
    }
}

/// Checks that `call` fits in a frame.
fn fits(peer: SocketAddr, call: &Call) -> Result<(), PeerError> {
    let too_large = |what, size, limit| PeerError::TooLarge {
        peer,
        what,
        size,
        limit,
    };
    let name_limit = u16::MAX as usize;
    if call.chain.len() > name_limit {
        return Err(too_large("a chain name", call.chain.len(), name_limit));
    }
    if call.function.len() > name_limit {
        return Err(too_large(
            "a function name",
            call.function.len(),
            name_limit,
        ));
    }
    let body = call.body_len();
    if body > MAX_FRAME {
        return Err(too_large("a call", body, MAX_FRAME));
    }
    Ok(())
}

/// A connection's task: reads answers, writes what callers could not write at once, and
/// pings, until either side ends (or no caller is left); then fails what is still pending.
async fn run_client(
    rd: OwnedReadHalf,
    wire: Arc<Wire>,
    users: mpsc::Receiver<()>,
    shared: Arc<Shared>,
    interval: Duration,
    counters: Arc<Counters>,
) {
    // However the task ends (also by a panic, or dropped with the runtime), what is still
    // pending fails at once and the connection counts as closed, so `conn` opens a new one.
    let mut close = Close {
        shared: shared.clone(),
        counters,
        reason: "the connection's task ended".into(),
    };
    // Written by the reader, read by the pinger: both run in this task (`select!`); the
    // atomic only makes the shared borrow `Send`, so Relaxed.
    let last_rx = AtomicU64::new(0);
    let ended = tokio::select! {
        r = client_reader(rd, &shared, interval, &last_rx, wire.epoch) => r,
        w = wire.flush_until_unused(users) => w,
        p = pinger(&wire, interval, &last_rx) => p,
    };
    let peer = shared.peer;
    close.reason = match ended {
        Ok(()) => {
            debug!(%peer, "peer connection closed: no caller left");
            "closed by this node".into()
        }
        Err(reason) => {
            warn!(%peer, "peer connection lost: {reason}");
            reason.into()
        }
    };
}

/// Closes a connection for its callers when dropped (see [`run_client`]).
struct Close {
    shared: Arc<Shared>,
    counters: Arc<Counters>,
    reason: Arc<str>,
}

impl Drop for Close {
    fn drop(&mut self) {
        self.shared.fail(self.reason.clone());
        self.counters.open.fetch_sub(1, Ordering::Relaxed);
    }
}

fn millis_since(epoch: Instant) -> u64 {
    u64::try_from(epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
}

async fn client_reader(
    rd: OwnedReadHalf,
    shared: &Shared,
    interval: Duration,
    last_rx: &AtomicU64,
    epoch: Instant,
) -> Result<(), String> {
    // Many small frames arrive in one read under load.
    let mut rd = BufReader::with_capacity(READ_BUF, rd);
    let mut buf = Vec::new();
    let quiet = lost_after(interval);
    loop {
        let frame = read_frame(&mut rd, &mut buf, quiet)
            .await
            .map_err(|e| e.to_string())?;
        last_rx.store(millis_since(epoch), Ordering::Relaxed);
        match frame {
            Frame::Answer(stream, answer) => match shared.take(stream) {
                Some(tx) => {
                    let _ = tx.send(Ok(answer));
                }
                None => debug!(peer = %shared.peer, stream, "late peer answer dropped"),
            },
            Frame::Pong(_) => {}
            Frame::Call(..) | Frame::Ping(_) => {
                return Err("the server sent a CALL or PING, which only clients send".into())
            }
        }
    }
}

/// Pings when the connection has been quiet in either direction for half an interval.
async fn pinger(wire: &Wire, interval: Duration, last_rx: &AtomicU64) -> Result<(), String> {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.reset();
    let quiet = u64::try_from((interval / 2).as_millis()).unwrap_or(u64::MAX);
    let mut pings = 0u64;
    loop {
        tick.tick().await;
        let now = millis_since(wire.epoch);
        let rx_quiet = now.saturating_sub(last_rx.load(Ordering::Relaxed)) >= quiet;
        let tx_quiet = now.saturating_sub(wire.last_tx.load(Ordering::Relaxed)) >= quiet;
        if rx_quiet || tx_quiet {
            pings += 1;
            wire.send(&Frame::Ping(pings)).map_err(|e| e.to_string())?;
        }
    }
}

/// The sending side of a connection, shared by all who send on it: frames wait in a
/// backlog, in order, that the connection's task ([`Wire::flush_until_unused`]) writes as
/// the socket takes it.
///
/// The backlog is bounded per connection, whatever the peer does: frames of any size
/// (CALLs, ANSWERs: [`send_when_room`]) join it only while at most [`BACKLOG_ROOM`] bytes
/// wait, and a server reads the peer's next frame (whose PONG or 503 joins it at once,
/// [`Wire::send`]) only then too ([`Wire::wait_for_room`]); so at most [`BACKLOG_ROOM`] +
/// [`MAX_FRAME`] + one small frame wait, and a peer that sends without reading meets TCP's
/// own back-pressure. A peer that reads nothing while frames wait for its `write_stall`
/// loses the connection (the log names it and says so).
struct Wire {
    sock: OwnedWriteHalf,
    state: Mutex<WireState>,
    /// The backlog has bytes, or the socket failed.
    wake: tokio::sync::Notify,
    /// The backlog fell to [`BACKLOG_ROOM`], or the connection failed or is gone (also
    /// notified when the `Wire` drops: who waits holds only a `Weak`).
    room: Arc<tokio::sync::Notify>,
    epoch: Instant,
    /// Milliseconds since `epoch` of the last frame sent (for pings; Relaxed: a hint).
    last_tx: AtomicU64,
    /// How long the peer may leave waiting bytes unread before the connection fails.
    write_stall: Duration,
}

#[derive(Default)]
struct WireState {
    /// Whole frames, in order; `backlog[written..]` is not written yet.
    backlog: Vec<u8>,
    written: usize,
    /// The most bytes that ever waited (`backlog.len() - written`).
    peak: usize,
    /// The socket failed: nothing more is sent.
    failed: Option<Arc<str>>,
}

impl WireState {
    /// Bytes waiting to be written.
    fn waiting(&self) -> usize {
        self.backlog.len() - self.written
    }
}

impl Wire {
    fn new(sock: OwnedWriteHalf, write_stall: Duration) -> Self {
        Wire {
            sock,
            state: Mutex::new(WireState::default()),
            wake: tokio::sync::Notify::new(),
            room: Arc::new(tokio::sync::Notify::new()),
            epoch: Instant::now(),
            last_tx: AtomicU64::new(0),
            write_stall,
        }
    }

    /// Sends one frame at once: encoded straight onto the backlog, which the connection's
    /// task writes once the frames made in the same turn of the peer thread are all in (one
    /// write, one TCP segment for many frames under load). Fails only when the connection
    /// failed before. For small frames whose number the caller bounds (a ping per interval,
    /// a PONG or 503 per frame read after [`Wire::wait_for_room`]); others go through
    /// [`send_when_room`].
    fn send(&self, frame: &Frame) -> Result<(), Arc<str>> {
        let mut st = lock(&self.state);
        self.append(&mut st, frame)
    }

    fn append(&self, st: &mut WireState, frame: &Frame) -> Result<(), Arc<str>> {
        if let Some(reason) = &st.failed {
            return Err(reason.clone());
        }
        if st.waiting() == 0 {
            self.wake.notify_one();
        }
        frame.encode(&mut st.backlog);
        st.peak = st.peak.max(st.waiting());
        self.last_tx
            .store(millis_since(self.epoch), Ordering::Relaxed);
        Ok(())
    }

    /// Resolves once at most [`BACKLOG_ROOM`] bytes wait (at once in the usual case), or
    /// with the reason the connection failed.
    async fn wait_for_room(&self) -> Result<(), Arc<str>> {
        loop {
            let notified = self.room.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let st = lock(&self.state);
                if let Some(reason) = &st.failed {
                    return Err(reason.clone());
                }
                if st.waiting() <= BACKLOG_ROOM {
                    return Ok(());
                }
            }
            notified.await;
        }
    }

    /// Marks the connection failed (nothing more is sent) and wakes whoever waits for room.
    fn fail(&self, reason: &str) {
        lock(&self.state)
            .failed
            .get_or_insert_with(|| reason.into());
        self.room.notify_waiters();
    }

    /// The most bytes that ever waited in the backlog.
    fn peak(&self) -> usize {
        lock(&self.state).peak
    }

    /// Writes the backlog whenever it has bytes, until the socket fails or the peer leaves
    /// bytes unread for `write_stall` (`Err`), or every sender of `users` is gone and the
    /// backlog is written (`Ok`).
    async fn flush_until_unused(&self, mut users: mpsc::Receiver<()>) -> Result<(), String> {
        let result = self.flush(&mut users).await;
        if let Err(reason) = &result {
            self.fail(reason);
        }
        result
    }

    async fn flush(&self, users: &mut mpsc::Receiver<()>) -> Result<(), String> {
        let mut unused = false;
        loop {
            if !unused {
                tokio::select! {
                    () = self.wake.notified() => {}
                    None = users.recv() => unused = true,
                }
            }
            // The last time the peer took a byte (or since when bytes wait).
            let mut progress = tokio::time::Instant::now();
            loop {
                {
                    let mut st = lock(&self.state);
                    if let Some(reason) = &st.failed {
                        return Err(reason.to_string());
                    }
                    if st.waiting() == 0 {
                        st.backlog.clear();
                        if st.backlog.capacity() > KEEP_BUF {
                            st.backlog = Vec::new();
                        }
                        st.written = 0;
                        break;
                    }
                    match self.sock.try_write(&st.backlog[st.written..]) {
                        Ok(n) => {
                            let before = st.waiting();
                            st.written += n;
                            progress = tokio::time::Instant::now();
                            // What is written goes once it is most of the backlog (not
                            // after every partial write of a large one).
                            if st.written > st.backlog.len() / 2 && st.written >= 1 << 20 {
                                let w = st.written;
                                st.backlog.drain(..w);
                                st.written = 0;
                            }
                            if before > BACKLOG_ROOM && st.waiting() <= BACKLOG_ROOM {
                                self.room.notify_waiters();
                            }
                            continue;
                        }
                        Err(e)
                            if matches!(
                                e.kind(),
                                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                            ) => {}
                        Err(e) => return Err(format!("writing failed: {e}")),
                    }
                }
                // (A stall too long to add is as good as none.)
                let stalled = progress
                    .checked_add(self.write_stall)
                    .unwrap_or_else(|| progress + Duration::from_secs(1 << 30));
                match tokio::time::timeout_at(stalled, self.sock.writable()).await {
                    Ok(ready) => ready.map_err(|e| format!("writing failed: {e}"))?,
                    Err(_) => {
                        let waiting = lock(&self.state).waiting();
                        return Err(format!(
                            "the peer does not read: {waiting} bytes unread for {:?}",
                            self.write_stall
                        ));
                    }
                }
            }
            if unused {
                // Dropping the write half (with the task) shuts the connection down.
                return Ok(());
            }
        }
    }
}

impl Drop for Wire {
    fn drop(&mut self) {
        // Whoever waits for room holds only a `Weak`: it finds the connection gone.
        self.room.notify_waiters();
    }
}

/// Sends a frame of any size on `wire` once at most [`BACKLOG_ROOM`] bytes wait before it
/// (so each connection's backlog stays bounded while the peer reads slowly), or fails when
/// the connection failed or is gone. Holds only a `Weak` while it waits, so a connection
/// whose task ended closes at once.
async fn send_when_room(wire: &Weak<Wire>, frame: &Frame) -> Result<(), Arc<str>> {
    loop {
        let Some(strong) = wire.upgrade() else {
            return Err("the connection's task ended".into());
        };
        let room = strong.room.clone();
        let notified = room.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        {
            let mut st = lock(&strong.state);
            if st.failed.is_some() || st.waiting() <= BACKLOG_ROOM {
                return strong.append(&mut st, frame);
            }
        }
        drop(strong);
        notified.await;
    }
}

/// Why reading a frame stopped.
#[derive(Debug, thiserror::Error)]
enum ReadError {
    /// The peer closed the connection (or it ended mid-frame).
    #[error("the peer closed the connection")]
    Closed,
    /// Nothing arrived for too long.
    #[error("nothing received for {0:?}")]
    Quiet(Duration),
    /// The socket failed.
    #[error("reading failed: {0}")]
    Io(#[from] io::Error),
    /// The bytes are no frame.
    #[error("bad frame: {0}")]
    Frame(#[from] FrameError),
    /// Sending on the connection failed (the peer does not read, or the socket failed).
    #[error("{0}")]
    Sending(Arc<str>),
}

/// Reads one frame; fails if no byte arrives for `quiet`. `buf` is reused between frames.
async fn read_frame<R: AsyncRead + Unpin>(
    r: &mut R,
    buf: &mut Vec<u8>,
    quiet: Duration,
) -> Result<Frame, ReadError> {
    let mut head = [0u8; 4];
    let mut got = 0;
    while got < head.len() {
        match tokio::time::timeout(quiet, r.read(&mut head[got..])).await {
            Err(_) => return Err(ReadError::Quiet(quiet)),
            Ok(Ok(0)) => return Err(ReadError::Closed),
            Ok(Ok(n)) => got += n,
            Ok(Err(e)) => return Err(e.into()),
        }
    }
    let n = Frame::announced(head)?;
    if buf.capacity() > KEEP_BUF {
        *buf = Vec::new();
    }
    buf.clear();
    while buf.len() < n {
        if buf.len() == buf.capacity() {
            // Grow with what arrives, never past the announced length.
            let grow = (n - buf.len()).min(buf.len().max(FIRST_CHUNK));
            buf.reserve_exact(grow);
        }
        let left = (n - buf.len()) as u64;
        match tokio::time::timeout(quiet, (&mut *r).take(left).read_buf(buf)).await {
            Err(_) => return Err(ReadError::Quiet(quiet)),
            Ok(Ok(0)) => return Err(ReadError::Closed),
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Err(e.into()),
        }
    }
    Ok(Frame::decode(buf)?)
}

/// Serves peer connections on `listener`: authenticates each with `secret` and answers its
/// calls with `handler`, until `shutdown` turns true (or its sender is dropped). Then it
/// stops accepting, lets each connection answer the calls it runs (for at most [`DRAIN`]),
/// and returns once all are closed. A peer that reads nothing for [`WRITE_STALL`] while
/// frames wait for it is dropped.
pub async fn serve(
    listener: TcpListener,
    secret: Arc<Secret>,
    handler: Handler,
    shutdown: watch::Receiver<bool>,
) {
    serve_with(listener, secret, handler, shutdown, WRITE_STALL).await;
}

/// [`serve`], dropping a peer that reads nothing for `write_stall` while frames wait.
pub async fn serve_with(
    listener: TcpListener,
    secret: Arc<Secret>,
    handler: Handler,
    mut shutdown: watch::Receiver<bool>,
    write_stall: Duration,
) {
    let mut conns = tokio::task::JoinSet::new();
    let handshakes = Arc::new(Semaphore::new(MAX_HANDSHAKES));
    let conn_shutdown = shutdown.clone();
    loop {
        tokio::select! {
            () = stopped(&mut shutdown) => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    // Unauthenticated connections are bounded: beyond the cap, a new one
                    // is closed at once (peers that hold the secret connect once and stay).
                    let Ok(unproven) = handshakes.clone().try_acquire_owned() else {
                        warn!(%peer, "peer connection refused: {MAX_HANDSHAKES} handshakes run already");
                        continue;
                    };
                    conns.spawn(serve_conn(
                        stream,
                        peer,
                        secret.clone(),
                        handler.clone(),
                        conn_shutdown.clone(),
                        unproven,
                        write_stall,
                    ));
                }
                Err(e) => {
                    // Out of descriptors, most likely: wait rather than spin.
                    warn!("peer listener: accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
    drop(listener);
    let all_closed = async { while conns.join_next().await.is_some() {} };
    if tokio::time::timeout(DRAIN + Duration::from_secs(1), all_closed)
        .await
        .is_err()
    {
        warn!("peer connections still open after {DRAIN:?}; closing them");
        conns.abort_all();
    }
}

/// Resolves once `shutdown` is true or its sender is gone (no one left to say otherwise).
async fn stopped(shutdown: &mut watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|stop| *stop).await;
}

/// How a server's reading of a connection ended.
enum ReadEnd {
    Shutdown,
    Closed,
    Failed(String),
}

async fn serve_conn(
    mut stream: TcpStream,
    peer: SocketAddr,
    secret: Arc<Secret>,
    handler: Handler,
    mut shutdown: watch::Receiver<bool>,
    unproven: OwnedSemaphorePermit,
    write_stall: Duration,
) {
    if let Err(e) = stream.set_nodelay(true) {
        debug!(%peer, "peer connection: TCP_NODELAY: {e}");
    }
    if let Err(e) = auth::handshake(&mut stream, &secret, Role::Server, peer).await {
        warn!("{e}");
        return;
    }
    drop(unproven);
    debug!(%peer, "peer connected");
    let (rd, wr) = stream.into_split();
    let wire = Arc::new(Wire::new(wr, write_stall));
    // Every running call holds a sender: the writer ends once the reader and all of them
    // are done and their answers written.
    let (users, unused) = mpsc::channel(1);
    let writer = wire.flush_until_unused(unused);
    tokio::pin!(writer);
    let ended = tokio::select! {
        end = server_reader(rd, peer, &handler, &wire, users, &mut shutdown) => end,
        w = &mut writer => match w {
            Ok(()) => ReadEnd::Closed,
            Err(e) => ReadEnd::Failed(e),
        },
    };
    match ended {
        ReadEnd::Shutdown => {
            // The reader's sender is gone; the writer ends when the last running call
            // has sent its answer.
            match tokio::time::timeout(DRAIN, &mut writer).await {
                Ok(Ok(())) => debug!(%peer, "peer connection closed for shutdown"),
                Ok(Err(e)) => warn!(%peer, "peer connection: {e}"),
                Err(_) => warn!(%peer, "peer calls still running after {DRAIN:?}; closing"),
            }
        }
        ReadEnd::Closed => debug!(%peer, "peer closed its connection"),
        ReadEnd::Failed(reason) => warn!(%peer, "closing the peer connection: {reason}"),
    }
    debug!(%peer, peak = wire.peak(), "peer connection: most bytes waiting to be sent");
}

async fn server_reader<R: AsyncRead + Unpin>(
    rd: R,
    peer: SocketAddr,
    handler: &Handler,
    wire: &Arc<Wire>,
    users: mpsc::Sender<()>,
    shutdown: &mut watch::Receiver<bool>,
) -> ReadEnd {
    let limit = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    // A call beyond the limit costs reading it and a short ANSWER (made once here).
    let busy =
        format!("the peer runs {MAX_IN_FLIGHT} calls of this connection already").into_bytes();
    let mut rd = BufReader::with_capacity(READ_BUF, rd);
    let mut buf = Vec::new();
    loop {
        // Back-pressure: the next frame (and the PONG or 503 it may cost) is read only
        // while the peer takes what is written to it; else its frames wait in TCP.
        let next = async {
            wire.wait_for_room().await.map_err(ReadError::Sending)?;
            read_frame(&mut rd, &mut buf, SERVER_IDLE).await
        };
        let frame = tokio::select! {
            () = stopped(shutdown) => return ReadEnd::Shutdown,
            frame = next => frame,
        };
        let reply = match frame {
            Err(ReadError::Closed) => return ReadEnd::Closed,
            Err(e) => return ReadEnd::Failed(e.to_string()),
            Ok(Frame::Ping(stream)) => Frame::Pong(stream),
            Ok(Frame::Call(stream, call)) => match limit.clone().try_acquire_owned() {
                Ok(permit) => {
                    tokio::spawn(answer(
                        peer,
                        stream,
                        call,
                        handler.clone(),
                        (Arc::downgrade(wire), users.clone()),
                        permit,
                    ));
                    continue;
                }
                Err(_) => Frame::Answer(
                    stream,
                    Answer {
                        status: 503,
                        flags: 0,
                        payload: busy.clone(),
                    },
                ),
            },
            Ok(Frame::Answer(..) | Frame::Pong(_)) => {
                return ReadEnd::Failed(
                    "the client sent an ANSWER or PONG, which only servers send".into(),
                )
            }
        };
        if let Err(reason) = wire.send(&reply) {
            return ReadEnd::Failed(reason.to_string());
        }
    }
}

/// Runs one call and sends its answer (on `wire`, owned by the connection's task so that an
/// aborted connection closes even while calls run; the sender keeps its writer going until
/// the answer is sent).
async fn answer(
    peer: SocketAddr,
    stream: u64,
    call: Call,
    handler: Handler,
    (wire, _user): (Weak<Wire>, mpsc::Sender<()>),
    _permit: OwnedSemaphorePermit,
) {
    // A handler that panics still gets its call an answer.
    let run = std::panic::AssertUnwindSafe(handler(call));
    let mut answer = match futures_util::FutureExt::catch_unwind(run).await {
        Ok(answer) => answer,
        Err(_) => {
            warn!(%peer, stream, "peer call handler panicked");
            Answer {
                status: 500,
                flags: 0,
                payload: b"the peer's handler failed".to_vec(),
            }
        }
    };
    let body = answer.body_len();
    if body > MAX_FRAME {
        warn!(%peer, stream, "peer answer of {body} bytes is more than a frame carries");
        answer = Answer {
            status: 502,
            flags: 0,
            payload: format!("the answer of {body} bytes is more than a peer frame carries")
                .into_bytes(),
        };
    }
    let frame = Frame::Answer(stream, answer);
    // The connection may be gone; then the answer has no one to go to.
    let _ = send_when_room(&wire, &frame).await;
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use tokio::io::AsyncWriteExt;
    use tokio::task::JoinHandle;
    use tokio::time::timeout;

    use super::*;

    const KEY: &[u8] = b"the cluster's peer secret, 32 B!";
    /// The bound on every wait of these tests.
    const BOUND: Duration = Duration::from_secs(10);

    fn secret() -> Arc<Secret> {
        Arc::new(Secret::new(KEY))
    }

    fn call(i: usize, payload: &str) -> Call {
        Call {
            chain: "default_hello_0".into(),
            function: format!("f{i}"),
            deadline_ms: 5_000,
            route: 1,
            hop: (i % 256) as u8,
            flags: 0,
            meta: Vec::new(),
            payload: payload.as_bytes().to_vec(),
        }
    }

    /// Uppercases the payload and adds what is specific to the call, after a delay that
    /// differs per call (so answers come back out of order).
    fn echo(runs: Arc<AtomicUsize>) -> Handler {
        handler(move |c: Call| {
            runs.fetch_add(1, Ordering::SeqCst);
            async move {
                tokio::time::sleep(Duration::from_millis(u64::from(c.hop % 7))).await;
                let mut out = c.payload.to_ascii_uppercase();
                out.extend_from_slice(format!("|{}|{}", c.function, c.hop).as_bytes());
                Answer {
                    status: 200,
                    flags: c.hop % 2,
                    payload: out,
                }
            }
        })
    }

    /// A handler's answer: the call's payload as it came.
    fn same(c: Call) -> Answer {
        Answer {
            status: 200,
            flags: 0,
            payload: c.payload,
        }
    }

    fn expected(i: usize, payload: &str) -> Answer {
        Answer {
            status: 200,
            flags: (i % 256 % 2) as u8,
            payload: format!("{}|f{i}|{}", payload.to_ascii_uppercase(), i % 256).into_bytes(),
        }
    }

    struct Server {
        addr: SocketAddr,
        stop: watch::Sender<bool>,
        task: JoinHandle<()>,
    }

    async fn start_on(addr: SocketAddr, secret: Arc<Secret>, handler: Handler) -> Server {
        let listener = TcpListener::bind(addr).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, rx) = watch::channel(false);
        let task = tokio::spawn(serve(listener, secret, handler, rx));
        Server { addr, stop, task }
    }

    async fn start(handler: Handler) -> Server {
        start_on("127.0.0.1:0".parse().unwrap(), secret(), handler).await
    }

    /// A server peer made by hand: takes one connection, authenticates it, then does `then`
    /// with it.
    async fn authenticated_server<F, Fut>(then: F) -> (SocketAddr, JoinHandle<Fut::Output>)
    where
        F: FnOnce(TcpStream) -> Fut + Send + 'static,
        Fut: Future + Send + 'static,
        Fut::Output: Send + 'static,
    {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let (mut s, peer) = listener.accept().await.unwrap();
            auth::handshake(&mut s, &Secret::new(KEY), Role::Server, peer)
                .await
                .unwrap();
            then(s).await
        });
        (addr, task)
    }

    /// Waits until `n` reaches `want`.
    async fn reach(n: &AtomicUsize, want: usize) {
        timeout(BOUND, async {
            while n.load(Ordering::SeqCst) < want {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("{} of {want}", n.load(Ordering::SeqCst)));
    }

    /// Whether the other end closes `s` (EOF or reset) within BOUND, reading whatever
    /// comes before.
    async fn closed_by_peer(s: &mut TcpStream) -> bool {
        let mut sink = [0u8; 4096];
        timeout(BOUND, async {
            loop {
                match s.read(&mut sink).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
            }
        })
        .await
        .is_ok()
    }

    /// Writes `frame` again and again, never reading, until the server stops taking bytes
    /// for good (it closed the connection, or nothing went for `BOUND`); returns the bytes
    /// it took.
    async fn flood_without_reading(s: &TcpStream, frame: &Frame) -> usize {
        let mut one = Vec::new();
        frame.encode(&mut one);
        let batch: Vec<u8> = one.iter().copied().cycle().take(one.len() * 4096).collect();
        let (mut sent, mut at) = (0usize, 0usize);
        loop {
            match timeout(BOUND, s.writable()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) | Err(_) => return sent,
            }
            match s.try_write(&batch[at..]) {
                Ok(n) => {
                    sent += n;
                    at = (at + n) % batch.len();
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(_) => return sent,
            }
        }
    }

    /// A peer that sends PINGs (or CALLs beyond the in-flight limit) and never reads what
    /// it is sent: the server stops reading once a bounded backlog waits (so the peer's
    /// own writes stop), then drops the connection; other peers are served throughout.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_peer_that_never_reads_is_dropped_at_a_bounded_backlog() {
        let hang = handler(|c: Call| async move {
            if c.payload == b"hang" {
                std::future::pending::<()>().await;
            }
            same(c)
        });
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (_stop, rx) = watch::channel(false);
        let stall = Duration::from_millis(500);
        let server = tokio::spawn(serve_with(listener, secret(), hang, rx, stall));
        let mut pinger = TcpStream::connect(addr).await.unwrap();
        auth::handshake(&mut pinger, &Secret::new(KEY), Role::Client, addr)
            .await
            .unwrap();
        let mut caller = TcpStream::connect(addr).await.unwrap();
        auth::handshake(&mut caller, &Secret::new(KEY), Role::Client, addr)
            .await
            .unwrap();
        let began = Instant::now();
        let (ping, hang) = (Frame::Ping(7), Frame::Call(1, call(1, "hang")));
        let (pings, calls) = tokio::join!(
            flood_without_reading(&pinger, &ping),
            flood_without_reading(&caller, &hang),
        );
        // Without the bound the server reads (and answers into memory) whatever comes, at
        // hundreds of MB/s, for the whole BOUND; with it, what it takes is its socket
        // buffers, its read buffer and BACKLOG_ROOM of answers' worth.
        for (what, sent) in [("PINGs", pings), ("CALLs", calls)] {
            assert!(sent < 48 << 20, "{what}: the server took {sent} bytes");
            assert!(sent > BACKLOG_ROOM, "{what}: only {sent} bytes sent");
        }
        assert!(began.elapsed() < BOUND, "{:?}", began.elapsed());
        for s in [&mut pinger, &mut caller] {
            assert!(closed_by_peer(s).await, "a peer that never reads was kept");
        }
        // The server goes on serving.
        let peers = Peers::new(secret());
        let answer = peers.call(addr, call(2, "in"), BOUND).await.unwrap();
        assert_eq!(answer.payload, b"in");
        assert!(!server.is_finished());
    }

    /// An endless stream of PINGs, as a reader.
    struct Pings {
        frame: Vec<u8>,
        at: usize,
        sent: Arc<AtomicUsize>,
    }

    impl AsyncRead for Pings {
        fn poll_read(
            mut self: Pin<&mut Self>,
            _cx: &mut std::task::Context<'_>,
            buf: &mut tokio::io::ReadBuf<'_>,
        ) -> std::task::Poll<io::Result<()>> {
            while buf.remaining() > 0 {
                let at = self.at;
                let n = buf.remaining().min(self.frame.len() - at);
                buf.put_slice(&self.frame[at..at + n]);
                self.at = (at + n) % self.frame.len();
                self.sent.fetch_add(n, Ordering::Relaxed);
            }
            std::task::Poll::Ready(Ok(()))
        }
    }

    /// The server's reading side against PINGs that never end (as fast as memory gives
    /// them) and a peer that never reads its PONGs: the backlog never holds more than
    /// BACKLOG_ROOM and one PONG, and the connection fails once the peer read nothing for
    /// the stall time.
    #[tokio::test]
    async fn the_server_reads_no_frame_while_its_backlog_is_full() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (_silent, accepted) = tokio::join!(TcpStream::connect(addr), listener.accept());
        let (_rd, wr) = accepted.unwrap().0.into_split();
        let stall = Duration::from_millis(300);
        let wire = Arc::new(Wire::new(wr, stall));
        let mut ping = Vec::new();
        Frame::Ping(1).encode(&mut ping);
        let sent = Arc::new(AtomicUsize::new(0));
        let pings = Pings {
            frame: ping.clone(),
            at: 0,
            sent: sent.clone(),
        };
        let (users, unused) = mpsc::channel(1);
        let (_stop, mut shutdown) = watch::channel(false);
        let never = handler(|c: Call| async move { same(c) });
        let peer: SocketAddr = "127.0.0.1:9".parse().unwrap();
        let reason = timeout(BOUND, async {
            tokio::select! {
                end = server_reader(pings, peer, &never, &wire, users, &mut shutdown) => match end {
                    ReadEnd::Failed(reason) => reason,
                    _ => panic!("the reader ended otherwise"),
                },
                w = wire.flush_until_unused(unused) => w.unwrap_err(),
            }
        })
        .await
        .expect("the connection fails in time");
        assert!(reason.contains("does not read"), "{reason}");
        let peak = wire.peak();
        assert!(peak <= BACKLOG_ROOM + ping.len(), "{peak} bytes waited");
        assert!(peak > BACKLOG_ROOM / 2, "{peak} bytes waited");
        // What the reader took: the PONGs that waited or went into the socket's buffers,
        // and what its read buffer holds.
        let read = sent.load(Ordering::Relaxed);
        assert!(read < 64 << 20, "{read} bytes of PINGs read");
    }

    /// Node A dials the attacker while the attacker dials A's server; the attacker gives
    /// each session A's hello of the other and forwards A's proofs between them. A's own
    /// `Peers` and server share one `Secret`, as in the daemon: both refuse, and A's
    /// handler never runs.
    #[tokio::test]
    async fn a_handshake_reflected_between_two_connections_of_one_node_fails() {
        let a = secret();
        let runs = Arc::new(AtomicUsize::new(0));
        let server = start_on(
            "127.0.0.1:0".parse().unwrap(),
            a.clone(),
            echo(runs.clone()),
        )
        .await;
        let a_server = server.addr;
        let trap = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let trap_addr = trap.local_addr().unwrap();
        let attacker = tokio::spawn(async move {
            let (mut s1, _) = trap.accept().await.unwrap();
            let mut s2 = TcpStream::connect(a_server).await.unwrap();
            let mut h1 = [0u8; auth::HELLO_LEN];
            let mut h2 = [0u8; auth::HELLO_LEN];
            s1.read_exact(&mut h1).await.unwrap();
            s2.read_exact(&mut h2).await.unwrap();
            let _ = s1.write_all(&h2).await;
            let _ = s2.write_all(&h1).await;
            let mut t1 = [0u8; auth::TAG_LEN];
            let mut t2 = [0u8; auth::TAG_LEN];
            let (r1, r2) = tokio::join!(s1.read_exact(&mut t1), s2.read_exact(&mut t2));
            if r1.is_ok() && r2.is_ok() {
                let _ = s2.write_all(&t1).await;
                let _ = s1.write_all(&t2).await;
                // Were it in, this would run on A.
                let mut c = Vec::new();
                Frame::Call(1, call(1, "stolen")).encode(&mut c);
                let _ = s2.write_all(&c).await;
            }
            closed_by_peer(&mut s2).await
        });
        let peers = Peers::new(a.clone());
        let e = peers
            .call(trap_addr, call(1, "x"), BOUND)
            .await
            .unwrap_err();
        assert!(
            matches!(&e, PeerError::Auth(x) if matches!(x.reason, auth::AuthFailure::Reflected)),
            "{e}"
        );
        assert!(
            attacker.await.unwrap(),
            "A's server kept the attacker's connection"
        );
        assert_eq!(runs.load(Ordering::SeqCst), 0);
        // A still serves real peers.
        let b = Peers::new(secret());
        assert_eq!(
            b.call(a_server, call(2, "y"), BOUND).await.unwrap(),
            expected(2, "y")
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn two_hundred_concurrent_calls_share_one_connection() {
        let runs = Arc::new(AtomicUsize::new(0));
        let server = start(echo(runs.clone())).await;
        let peers = Arc::new(Peers::new(secret()));
        let mut calls = tokio::task::JoinSet::new();
        for i in 0..200 {
            let peers = peers.clone();
            let addr = server.addr;
            calls.spawn(async move {
                let payload = format!("hello {i}");
                let answer = peers.call(addr, call(i, &payload), BOUND).await;
                (i, payload, answer)
            });
        }
        let mut answered = 0;
        while let Some(joined) = timeout(BOUND, calls.join_next()).await.unwrap() {
            let (i, payload, answer) = joined.unwrap();
            assert_eq!(answer.unwrap(), expected(i, &payload), "call {i}");
            answered += 1;
        }
        assert_eq!(answered, 200);
        assert_eq!(runs.load(Ordering::SeqCst), 200);
        assert_eq!(
            peers.stats(),
            PeerStats {
                calls: 200,
                answered: 200,
                failed: 0,
                connections_opened: 1,
                connections_open: 1,
            }
        );
    }

    /// Frames far larger than the sockets' buffers, many at once from both sides: senders
    /// write what the socket takes and the rest goes through the backlog, in order.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn large_frames_from_many_callers_arrive_whole_and_in_their_streams() {
        let server = start(handler(|c: Call| async move { same(c) })).await;
        let peers = Arc::new(Peers::new(secret()));
        let mut calls = tokio::task::JoinSet::new();
        for i in 0..24usize {
            let peers = peers.clone();
            let addr = server.addr;
            calls.spawn(async move {
                // 1 to 6 MiB, each byte naming its call and position.
                let payload: Vec<u8> = (0..(1 + i % 6) << 20)
                    .map(|j| (i * 31 + j / 4096) as u8)
                    .collect();
                let mut c = call(i, "");
                c.payload = payload.clone();
                (payload, peers.call(addr, c, BOUND).await)
            });
        }
        let mut whole = 0;
        while let Some(joined) = timeout(BOUND, calls.join_next()).await.unwrap() {
            let (sent, answer) = joined.unwrap();
            let answer = answer.unwrap();
            assert_eq!(answer.payload.len(), sent.len());
            assert!(
                answer.payload == sent,
                "an answer's bytes differ from its call's"
            );
            whole += 1;
        }
        assert_eq!(whole, 24);
        let stats = peers.stats();
        assert_eq!(
            (stats.answered, stats.connections_opened),
            (24, 1),
            "{stats:?}"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn handshakes_at_once_are_capped_and_the_silent_ones_time_out() {
        let server = start(handler(|c: Call| async move { same(c) })).await;
        let mut silent = Vec::new();
        for _ in 0..MAX_HANDSHAKES {
            silent.push(TcpStream::connect(server.addr).await.unwrap());
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        // One more is closed at once, long before the handshake timeout (5 s).
        let mut extra = TcpStream::connect(server.addr).await.unwrap();
        let mut byte = [0u8; 1];
        let closed = timeout(Duration::from_secs(2), extra.read(&mut byte)).await;
        assert!(
            matches!(closed, Ok(Ok(0) | Err(_))),
            "a connection beyond {MAX_HANDSHAKES} handshakes was kept: {closed:?}"
        );
        // The silent ones are closed by the handshake timeout; then a peer gets in.
        for s in &mut silent {
            assert!(closed_by_peer(s).await, "a silent connection was kept");
        }
        let peers = Peers::new(secret());
        let answer = peers.call(server.addr, call(1, "in"), BOUND).await.unwrap();
        assert_eq!(answer.payload, b"in");
    }

    #[tokio::test]
    async fn a_wrong_secret_is_refused_and_the_handler_never_runs() {
        let runs = Arc::new(AtomicUsize::new(0));
        let server = start(echo(runs.clone())).await;
        let intruder = Peers::new(Arc::new(Secret::new(b"not the cluster's secret at all")));
        let e = intruder
            .call(server.addr, call(1, "x"), BOUND)
            .await
            .unwrap_err();
        assert!(
            matches!(&e, PeerError::Auth(a)
            if matches!(a.reason, auth::AuthFailure::WrongSecret)),
            "{e}"
        );
        assert_eq!(e.status(), 502);
        assert!(e.to_string().contains(&server.addr.to_string()), "{e}");
        assert_eq!(intruder.stats().connections_opened, 0);
        assert_eq!(intruder.stats().failed, 1);
        // The server goes on serving peers that hold the secret.
        let peers = Peers::new(secret());
        assert_eq!(
            peers.call(server.addr, call(2, "y"), BOUND).await.unwrap(),
            expected(2, "y")
        );
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_call_never_answered_times_out_alone_and_a_late_answer_is_dropped() {
        let h = handler(|c: Call| async move {
            match c.payload.as_slice() {
                b"hang" => std::future::pending::<()>().await,
                b"slow" => tokio::time::sleep(Duration::from_millis(400)).await,
                _ => {}
            }
            same(c)
        });
        let server = start(h).await;
        let peers = Arc::new(Peers::new(secret()));
        let short = Duration::from_millis(200);
        let (hang, slow, quick) = tokio::join!(
            peers.call(server.addr, call(1, "hang"), short),
            peers.call(server.addr, call(2, "slow"), short),
            peers.call(server.addr, call(3, "quick"), short),
        );
        for e in [hang.unwrap_err(), slow.unwrap_err()] {
            assert!(
                matches!(e, PeerError::Timeout { after, .. } if after == short),
                "{e}"
            );
            assert_eq!(e.status(), 504);
        }
        assert_eq!(quick.unwrap().payload, b"quick");
        // The slow call's answer arrives now, for a stream no one waits on.
        tokio::time::sleep(Duration::from_millis(400)).await;
        for i in 0..5 {
            let payload = format!("after {i}");
            let answer = peers.call(server.addr, call(i, &payload), BOUND).await;
            assert_eq!(answer.unwrap().payload, payload.as_bytes());
        }
        let stats = peers.stats();
        assert_eq!(stats.connections_opened, 1, "{stats:?}");
        assert_eq!((stats.calls, stats.answered, stats.failed), (8, 6, 2));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_server_that_dies_fails_every_pending_call_then_the_next_call_reconnects() {
        let entered = Arc::new(AtomicUsize::new(0));
        let seen = entered.clone();
        let hang = handler(move |_c: Call| {
            seen.fetch_add(1, Ordering::SeqCst);
            std::future::pending::<Answer>()
        });
        let server = start(hang).await;
        let peers = Arc::new(Peers::new(secret()));
        let mut calls = tokio::task::JoinSet::new();
        for i in 0..50 {
            let peers = peers.clone();
            let addr = server.addr;
            calls.spawn(async move {
                peers
                    .call(addr, call(i, "x"), Duration::from_secs(60))
                    .await
            });
        }
        reach(&entered, 50).await;
        server.task.abort();
        assert!(server.task.await.unwrap_err().is_cancelled());
        let mut lost = 0;
        timeout(Duration::from_secs(5), async {
            while let Some(joined) = calls.join_next().await {
                let e = joined.unwrap().unwrap_err();
                assert!(matches!(e, PeerError::Lost { .. }), "{e}");
                assert_eq!(e.status(), 502);
                lost += 1;
            }
        })
        .await
        .expect("every pending call fails promptly");
        assert_eq!(lost, 50);
        // Let the connection's task finish its bookkeeping.
        timeout(BOUND, async {
            while peers.stats().connections_open != 0 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .unwrap();

        let runs = Arc::new(AtomicUsize::new(0));
        let _again = start_on(server.addr, secret(), echo(runs.clone())).await;
        assert_eq!(
            peers
                .call(server.addr, call(7, "back"), BOUND)
                .await
                .unwrap(),
            expected(7, "back")
        );
        let stats = peers.stats();
        assert_eq!((stats.connections_opened, stats.connections_open), (2, 1));
        assert_eq!((stats.calls, stats.answered, stats.failed), (51, 1, 50));
    }

    #[tokio::test]
    async fn shutdown_answers_running_calls_then_closes() {
        let entered = Arc::new(AtomicUsize::new(0));
        let seen = entered.clone();
        let slow = handler(move |c: Call| {
            seen.fetch_add(1, Ordering::SeqCst);
            async move {
                tokio::time::sleep(Duration::from_millis(300)).await;
                same(c)
            }
        });
        let server = start(slow).await;
        let peers = Arc::new(Peers::new(secret()));
        let mut calls = tokio::task::JoinSet::new();
        for i in 0..10 {
            let peers = peers.clone();
            let addr = server.addr;
            calls.spawn(async move { peers.call(addr, call(i, &format!("{i}")), BOUND).await });
        }
        reach(&entered, 10).await;
        server.stop.send(true).unwrap();
        let mut answered = 0;
        while let Some(joined) = timeout(BOUND, calls.join_next()).await.unwrap() {
            joined.unwrap().unwrap();
            answered += 1;
        }
        assert_eq!(answered, 10);
        timeout(BOUND, server.task).await.unwrap().unwrap();
        // Nothing listens any more.
        let e = peers
            .call(server.addr, call(1, "x"), BOUND)
            .await
            .unwrap_err();
        assert!(
            matches!(e, PeerError::Connect { .. } | PeerError::Lost { .. }),
            "{e}"
        );
        assert_eq!(e.status(), 502);
    }

    #[tokio::test]
    async fn pings_keep_a_quiet_connection_and_a_silent_peer_is_lost() {
        let server = start(echo(Arc::new(AtomicUsize::new(0)))).await;
        let interval = Duration::from_millis(100);
        let peers = Peers::with_ping_interval(secret(), interval);
        peers.call(server.addr, call(1, "a"), BOUND).await.unwrap();
        // Ten intervals without a call: only pings and pongs keep the connection.
        tokio::time::sleep(interval * 10).await;
        peers.call(server.addr, call(2, "b"), BOUND).await.unwrap();
        assert_eq!(peers.stats().connections_opened, 1);

        // A peer that authenticates, then neither reads nor writes.
        let (addr, silent) = authenticated_server(|s| async move {
            tokio::time::sleep(BOUND * 2).await;
            drop(s);
        })
        .await;
        let began = Instant::now();
        let e = peers.call(addr, call(3, "c"), BOUND).await.unwrap_err();
        assert!(
            matches!(&e, PeerError::Lost { reason, .. }
            if reason.contains("nothing received")),
            "{e}"
        );
        assert!(began.elapsed() < interval * 10, "{:?}", began.elapsed());
        silent.abort();
    }

    #[tokio::test]
    async fn a_server_that_sends_garbage_is_lost() {
        let (addr, liar) = authenticated_server(|mut s| async move {
            s.write_all(&u32::MAX.to_le_bytes()).await.unwrap();
            s
        })
        .await;
        let peers = Peers::new(secret());
        let e = peers.call(addr, call(1, "x"), BOUND).await.unwrap_err();
        assert!(
            matches!(&e, PeerError::Lost { reason, .. }
            if reason.contains("bad frame")),
            "{e}"
        );
        drop(liar.await.unwrap());
    }

    #[tokio::test]
    async fn garbage_from_a_client_closes_only_its_connection() {
        let runs = Arc::new(AtomicUsize::new(0));
        let server = start(echo(runs.clone())).await;
        let peers = Peers::new(secret());
        assert_eq!(
            peers.call(server.addr, call(1, "a"), BOUND).await.unwrap(),
            expected(1, "a")
        );
        let mut bad_kind = Vec::new();
        Frame::Ping(1).encode(&mut bad_kind);
        bad_kind[4] = 99;
        let mut answer_from_client = Vec::new();
        Frame::Answer(
            1,
            Answer {
                status: 200,
                flags: 0,
                payload: Vec::new(),
            },
        )
        .encode(&mut answer_from_client);
        let mut lying_field = Vec::new();
        Frame::Call(1, call(1, "x")).encode(&mut lying_field);
        let at = lying_field.len() - 1 - 4;
        lying_field[at..at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        let inputs: Vec<(&str, Vec<u8>)> = vec![
            (
                "4 GiB announced",
                [&u32::MAX.to_le_bytes()[..], b"junk"].concat(),
            ),
            (
                "MAX_FRAME + 1 announced",
                ((MAX_FRAME + 1) as u32).to_le_bytes().to_vec(),
            ),
            ("too short announced", 3u32.to_le_bytes().to_vec()),
            ("unknown kind", bad_kind),
            ("answer from a client", answer_from_client),
            ("a field past the frame", lying_field),
        ];
        for (what, bytes) in inputs {
            let mut s = TcpStream::connect(server.addr).await.unwrap();
            auth::handshake(&mut s, &Secret::new(KEY), Role::Client, server.addr)
                .await
                .unwrap();
            s.write_all(&bytes).await.unwrap();
            assert!(closed_by_peer(&mut s).await, "{what}: still open");
        }
        // Before the handshake: not even a preamble.
        let mut s = TcpStream::connect(server.addr).await.unwrap();
        let mut http = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec();
        http.resize(auth::HELLO_LEN, b'.');
        s.write_all(&http).await.unwrap();
        assert!(closed_by_peer(&mut s).await, "HTTP: still open");

        assert!(!server.task.is_finished());
        assert_eq!(
            peers.call(server.addr, call(2, "b"), BOUND).await.unwrap(),
            expected(2, "b")
        );
        assert_eq!(peers.stats().connections_opened, 1);
        assert_eq!(runs.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_call_too_large_for_a_frame_is_refused_before_connecting() {
        // Nothing listens there: the refusal comes first.
        let addr: SocketAddr = "127.0.0.1:9".parse().unwrap();
        let peers = Peers::new(secret());
        let mut big = call(1, "");
        big.payload = vec![0; MAX_FRAME];
        let e = peers.call(addr, big, BOUND).await.unwrap_err();
        assert!(
            matches!(e, PeerError::TooLarge { what: "a call", .. }),
            "{e}"
        );
        assert_eq!(e.status(), 413);
        let mut long = call(1, "");
        long.function = "f".repeat(70_000);
        let e = peers.call(addr, long, BOUND).await.unwrap_err();
        assert!(
            matches!(
                e,
                PeerError::TooLarge {
                    what: "a function name",
                    ..
                }
            ),
            "{e}"
        );
        assert_eq!(peers.stats().connections_opened, 0);
    }

    #[tokio::test]
    async fn a_panicking_handler_answers_500() {
        let h = handler(|c: Call| async move {
            if c.payload == b"boom" {
                panic!("handler bug");
            }
            same(c)
        });
        let server = start(h).await;
        let peers = Peers::new(secret());
        let a = peers
            .call(server.addr, call(1, "boom"), BOUND)
            .await
            .unwrap();
        assert_eq!(a.status, 500);
        let a = peers
            .call(server.addr, call(2, "fine"), BOUND)
            .await
            .unwrap();
        assert_eq!(a.payload, b"fine");
    }

    #[tokio::test]
    async fn frames_are_read_across_any_split_and_bad_lengths_before_the_body() {
        let mut bytes = Vec::new();
        Frame::Call(9, call(3, "split")).encode(&mut bytes);
        Frame::Ping(4).encode(&mut bytes);
        let (mut a, mut b) = tokio::io::duplex(64);
        let writer = tokio::spawn(async move {
            for byte in bytes {
                a.write_all(&[byte]).await.unwrap();
            }
            a
        });
        let mut buf = Vec::new();
        let first = read_frame(&mut b, &mut buf, BOUND).await.unwrap();
        assert_eq!(first, Frame::Call(9, call(3, "split")));
        assert_eq!(
            read_frame(&mut b, &mut buf, BOUND).await.unwrap(),
            Frame::Ping(4)
        );
        let mut a = writer.await.unwrap();
        // A length past MAX_FRAME is refused on its four bytes: nothing else is read
        // (there is nothing else) and nothing allocated.
        a.write_all(&((MAX_FRAME + 1) as u32).to_le_bytes())
            .await
            .unwrap();
        let mut fresh = Vec::new();
        let e = read_frame(&mut b, &mut fresh, BOUND).await.unwrap_err();
        assert!(matches!(e, ReadError::Frame(FrameError::Size(_))), "{e}");
        assert_eq!(fresh.capacity(), 0);
        // A frame announced but never sent: the allocation follows what arrived.
        a.write_all(&(MAX_FRAME as u32).to_le_bytes())
            .await
            .unwrap();
        a.write_all(&[0; 50]).await.unwrap();
        let e = read_frame(&mut b, &mut fresh, Duration::from_millis(100))
            .await
            .unwrap_err();
        assert!(matches!(e, ReadError::Quiet(_)), "{e}");
        assert!(fresh.capacity() <= FIRST_CHUNK, "{}", fresh.capacity());
        drop(a);
        let e = read_frame(&mut b, &mut fresh, BOUND).await.unwrap_err();
        assert!(matches!(e, ReadError::Closed), "{e}");
    }
}
