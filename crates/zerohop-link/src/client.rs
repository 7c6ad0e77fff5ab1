//! The calling end of the link.
//!
//! Client ([`Peers`]): the first call to an address connects (one caller does, the others
//! wait for it), later calls share the connection; each picks a fresh stream number and
//! waits for the ANSWER with it. Every call has exactly one outcome: its answer, or an
//! error. A call's own timeout fails that call only (a late answer is dropped); a lost
//! connection (closed, reset, a bad frame, or nothing received for [`LOST_AFTER_PINGS`] ping
//! intervals) fails every call pending on it at once, and the next call connects again. The
//! client pings when the connection has been quiet in either direction for half an interval,
//! so both ends see a frame at least once per interval.

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use tokio::io::BufReader;
use tokio::net::tcp::OwnedReadHalf;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, warn};

use crate::auth::{self, AuthError, Role, Secret};
use crate::frame::{Answer, Call, Frame, MAX_FRAME};
use crate::lock;
use crate::wire::{millis_since, read_frame, send_when_room, LinkLost, Wire, READ_BUF};

/// How often a client pings a quiet connection ([`Peers::new`]).
pub const PING_INTERVAL: Duration = Duration::from_secs(5);

/// A client declares its connection lost after this many ping intervals without a byte.
pub const LOST_AFTER_PINGS: u32 = 3;

/// How long a connection pinged every `interval` may stay silent before it counts as lost.
fn lost_after(interval: Duration) -> Duration {
    interval.saturating_mul(LOST_AFTER_PINGS)
}

/// The bound on opening a TCP connection (the handshake has its own).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

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
    ///
    /// [`SERVER_IDLE`]: crate::SERVER_IDLE
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
            reason.to_string().into()
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

async fn client_reader(
    rd: OwnedReadHalf,
    shared: &Shared,
    interval: Duration,
    last_rx: &AtomicU64,
    epoch: Instant,
) -> Result<(), LinkLost> {
    // Many small frames arrive in one read under load.
    let mut rd = BufReader::with_capacity(READ_BUF, rd);
    let mut buf = Vec::new();
    let quiet = lost_after(interval);
    loop {
        let frame = read_frame(&mut rd, &mut buf, quiet).await?;
        last_rx.store(millis_since(epoch), Ordering::Relaxed);
        match frame {
            Frame::Answer(stream, answer) => match shared.take(stream) {
                Some(tx) => {
                    let _ = tx.send(Ok(answer));
                }
                None => debug!(peer = %shared.peer, stream, "late peer answer dropped"),
            },
            Frame::Pong(_) => {}
            Frame::Call(..) | Frame::Ping(_) => return Err(LinkLost::ServerSentCall),
        }
    }
}

/// Pings when the connection has been quiet in either direction for half an interval.
async fn pinger(wire: &Wire, interval: Duration, last_rx: &AtomicU64) -> Result<(), LinkLost> {
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
            wire.send(&Frame::Ping(pings)).map_err(LinkLost::Failed)?;
        }
    }
}
