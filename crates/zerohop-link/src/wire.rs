//! What both ends of a connection share: the sending side ([`Wire`], its bounded backlog)
//! and reading one frame ([`read_frame`]).
//!
//! Both ends bound what waits to be written per connection ([`Wire`]): while more than
//! [`BACKLOG_ROOM`] bytes wait, a server reads no further frame (so a PING or a CALL beyond
//! the limit costs at most one small frame more) and answers and calls wait their turn. A
//! peer that reads nothing while bytes wait for it ([`WRITE_STALL`] for a server, the lost
//! interval for a client) loses the connection, and the log names it.
//!
//! Reading a frame never allocates more than it has received (growing to at most
//! [`MAX_FRAME`]) and refuses a bad announced length before reading the body.
//!
//! [`WRITE_STALL`]: crate::WRITE_STALL
//! [`MAX_FRAME`]: crate::MAX_FRAME

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::sync::mpsc;

use crate::frame::{Frame, FrameError};
use crate::lock;

/// The buffer a connection reads through.
pub(crate) const READ_BUF: usize = 64 << 10;

/// A read buffer (or a write backlog) larger than this is not kept for the next frame.
const KEEP_BUF: usize = 1 << 20;

/// While more than this many bytes wait to be written on a connection, nothing more joins
/// them: a server reads no further frame, CALLs and ANSWERs wait (see the module docs).
pub const BACKLOG_ROOM: usize = 1 << 20;

/// The first allocation for a frame's body; it then doubles as bytes arrive.
pub(crate) const FIRST_CHUNK: usize = 64 << 10;

pub(crate) fn millis_since(epoch: Instant) -> u64 {
    u64::try_from(epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
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
///
/// [`MAX_FRAME`]: crate::MAX_FRAME
pub(crate) struct Wire {
    sock: OwnedWriteHalf,
    state: Mutex<WireState>,
    /// The backlog has bytes, or the socket failed.
    wake: tokio::sync::Notify,
    /// The backlog fell to [`BACKLOG_ROOM`], or the connection failed or is gone (also
    /// notified when the `Wire` drops: who waits holds only a `Weak`).
    room: Arc<tokio::sync::Notify>,
    pub(crate) epoch: Instant,
    /// Milliseconds since `epoch` of the last frame sent (for pings; Relaxed: a hint).
    pub(crate) last_tx: AtomicU64,
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
    pub(crate) fn new(sock: OwnedWriteHalf, write_stall: Duration) -> Self {
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
    pub(crate) fn send(&self, frame: &Frame) -> Result<(), Arc<str>> {
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
    pub(crate) async fn wait_for_room(&self) -> Result<(), Arc<str>> {
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
    pub(crate) fn peak(&self) -> usize {
        lock(&self.state).peak
    }

    /// Writes the backlog whenever it has bytes, until the socket fails or the peer leaves
    /// bytes unread for `write_stall` (`Err`), or every sender of `users` is gone and the
    /// backlog is written (`Ok`).
    pub(crate) async fn flush_until_unused(
        &self,
        mut users: mpsc::Receiver<()>,
    ) -> Result<(), LinkLost> {
        let result = self.flush(&mut users).await;
        if let Err(reason) = &result {
            self.fail(&reason.to_string());
        }
        result
    }

    async fn flush(&self, users: &mut mpsc::Receiver<()>) -> Result<(), LinkLost> {
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
                        return Err(LinkLost::Failed(reason.clone()));
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
                        Err(e) => return Err(LinkLost::Write(e)),
                    }
                }
                // (A stall too long to add is as good as none.)
                let stalled = progress
                    .checked_add(self.write_stall)
                    .unwrap_or_else(|| progress + Duration::from_secs(1 << 30));
                match tokio::time::timeout_at(stalled, self.sock.writable()).await {
                    Ok(ready) => ready.map_err(LinkLost::Write)?,
                    Err(_) => {
                        return Err(LinkLost::Stalled {
                            waiting: lock(&self.state).waiting(),
                            stall: self.write_stall,
                        });
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
pub(crate) async fn send_when_room(wire: &Weak<Wire>, frame: &Frame) -> Result<(), Arc<str>> {
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
pub(crate) enum ReadError {
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

/// Why a connection ended: what the log says, and (as text) what the calls still waiting
/// on it are told. Reading a frame has reasons of its own ([`ReadError`]), kept apart
/// because [`read_frame`] can fail only in those ways.
#[derive(Debug, thiserror::Error)]
pub(crate) enum LinkLost {
    /// Reading the next frame stopped.
    #[error(transparent)]
    Read(#[from] ReadError),
    /// Writing to the socket (or waiting until it takes bytes) failed.
    #[error("writing failed: {0}")]
    Write(#[source] io::Error),
    /// The peer left bytes unread for the connection's write stall.
    #[error("the peer does not read: {waiting} bytes unread for {stall:?}")]
    Stalled {
        /// Bytes waiting to be written.
        waiting: usize,
        /// How long the peer read none of them.
        stall: Duration,
    },
    /// The server sent a frame only clients send.
    #[error("the server sent a CALL or PING, which only clients send")]
    ServerSentCall,
    /// The client sent a frame only servers send.
    #[error("the client sent an ANSWER or PONG, which only servers send")]
    ClientSentAnswer,
    /// The connection had failed already, for this reason.
    #[error("{0}")]
    Failed(Arc<str>),
}

/// Reads one frame; fails if no byte arrives for `quiet`. `buf` is reused between frames.
pub(crate) async fn read_frame<R: AsyncRead + Unpin>(
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
