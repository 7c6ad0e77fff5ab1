//! The answering end of the link: each CALL runs a [`Handler`].
//!
//! Server ([`serve`]): authenticates each connection, runs each CALL as a task of its own
//! and writes its ANSWER back with the CALL's stream; more than [`MAX_IN_FLIGHT`] calls at
//! once on a connection are answered 503 at once rather than queued (so the connection
//! keeps reading, and pings keep being answered). A bad frame, or nothing received for
//! [`SERVER_IDLE`], closes the connection. On shutdown it stops accepting and reading,
//! answers the calls it runs (for at most [`DRAIN`]) and closes.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::io::{AsyncRead, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};
use tracing::{debug, warn};

use crate::auth::{self, Role, Secret};
use crate::frame::{Answer, Call, Frame, MAX_FRAME};
use crate::wire::{read_frame, send_when_room, LinkLost, ReadError, Wire, READ_BUF};

/// A server closes a connection that sends nothing for this long (a client pings every
/// [`PING_INTERVAL`]).
///
/// [`PING_INTERVAL`]: crate::PING_INTERVAL
pub const SERVER_IDLE: Duration = Duration::from_secs(30);

/// The calls a server runs at once per connection.
pub const MAX_IN_FLIGHT: usize = 1024;

/// The handshakes a server runs at once (each bounded in time); more connections waiting to
/// prove themselves are closed at once.
pub const MAX_HANDSHAKES: usize = 64;

/// How long a server that shuts down waits for the calls it runs.
pub const DRAIN: Duration = Duration::from_secs(10);

/// A server closes a connection whose peer reads none of the bytes waiting for it for this
/// long ([`serve`]; a client gives up after [`LOST_AFTER_PINGS`] ping intervals).
///
/// [`LOST_AFTER_PINGS`]: crate::LOST_AFTER_PINGS
pub const WRITE_STALL: Duration = Duration::from_secs(15);

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
pub(crate) enum ReadEnd {
    Shutdown,
    Closed,
    Failed(LinkLost),
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

pub(crate) async fn server_reader<R: AsyncRead + Unpin>(
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
            Err(e) => return ReadEnd::Failed(e.into()),
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
                return ReadEnd::Failed(LinkLost::ClientSentAnswer)
            }
        };
        if let Err(reason) = wire.send(&reply) {
            return ReadEnd::Failed(LinkLost::Failed(reason));
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
