//! The server ([`crate::serve`]): what a peer costs it is bounded (calls, handshakes, bytes
//! waiting for a peer that does not read), a bad peer loses only its own connection, and
//! shutdown answers what runs.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::time::timeout;

use super::*;
use crate::auth::Role;
use crate::server::{server_reader, ReadEnd};
use crate::wire::Wire;
use crate::{serve_with, BACKLOG_ROOM, MAX_FRAME, MAX_HANDSHAKES};

/// How [`flood_without_reading`] ended.
#[derive(Debug, PartialEq, Eq)]
enum FloodEnd {
    /// A write failed: the server closed the connection.
    Closed,
    /// Nothing went for `BOUND`: the server kept the connection without reading it.
    Stalled,
}

/// Writes `frame` again and again, never reading, until the server stops taking bytes
/// for good (it closed the connection, or nothing went for `BOUND`); returns the bytes
/// it took and which of the two it was.
async fn flood_without_reading(s: &TcpStream, frame: &Frame) -> (usize, FloodEnd) {
    let mut one = Vec::new();
    frame.encode(&mut one);
    let batch: Vec<u8> = one.iter().copied().cycle().take(one.len() * 4096).collect();
    let (mut sent, mut at) = (0usize, 0usize);
    loop {
        match timeout(BOUND, s.writable()).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => return (sent, FloodEnd::Closed),
            Err(_) => return (sent, FloodEnd::Stalled),
        }
        match s.try_write(&batch[at..]) {
            Ok(n) => {
                sent += n;
                at = (at + n) % batch.len();
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(_) => return (sent, FloodEnd::Closed),
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
    let (ping, hang) = (Frame::Ping(7), Frame::Call(1, call(1, "hang")));
    let (pings, calls) = tokio::join!(
        flood_without_reading(&pinger, &ping),
        flood_without_reading(&caller, &hang),
    );
    // Without the bound the server reads (and answers into memory) whatever comes, at
    // hundreds of MB/s, for the whole BOUND; with it, what it takes is its socket
    // buffers, its read buffer and BACKLOG_ROOM of answers' worth.
    // And the flood ends because the server drops the peer, not because its writes stall
    // for BOUND (the guard) on a connection the server keeps.
    for (what, (sent, end)) in [("PINGs", pings), ("CALLs", calls)] {
        assert!(sent < 48 << 20, "{what}: the server took {sent} bytes");
        assert!(sent > BACKLOG_ROOM, "{what}: only {sent} bytes sent");
        assert_eq!(
            end,
            FloodEnd::Closed,
            "{what}: the server never dropped a peer that does not read; nothing went for \
             {BOUND:?} with the connection open"
        );
    }
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
    .expect("the connection fails in time")
    .to_string();
    assert!(reason.contains("does not read"), "{reason}");
    let peak = wire.peak();
    assert!(peak <= BACKLOG_ROOM + ping.len(), "{peak} bytes waited");
    assert!(peak > BACKLOG_ROOM / 2, "{peak} bytes waited");
    // What the reader took: the PONGs that waited or went into the socket's buffers,
    // and what its read buffer holds.
    let read = sent.load(Ordering::Relaxed);
    assert!(read < 64 << 20, "{read} bytes of PINGs read");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handshakes_at_once_are_capped_and_the_silent_ones_time_out() {
    let server = start(handler(|c: Call| async move { same(c) })).await;
    let mut silent = Vec::new();
    for _ in 0..MAX_HANDSHAKES {
        silent.push(TcpStream::connect(server.addr).await.unwrap());
    }
    // Each is in its handshake once the server's hello comes (the server writes first).
    for (i, s) in silent.iter_mut().enumerate() {
        let mut hello = [0u8; auth::HELLO_LEN];
        timeout(BOUND, s.read_exact(&mut hello))
            .await
            .unwrap_or_else(|_| panic!("silent connection {i} got no hello: no handshake began"))
            .unwrap_or_else(|e| panic!("silent connection {i}: {e}"));
    }
    // One more is closed at once: before any hello, so not by the handshake timeout (5 s),
    // which comes after the hello; BOUND only guards against a connection kept silent.
    let mut extra = TcpStream::connect(server.addr).await.unwrap();
    let mut byte = [0u8; 1];
    let closed = timeout(BOUND, extra.read(&mut byte)).await;
    assert!(
        matches!(closed, Ok(Ok(0) | Err(_))),
        "a connection beyond {MAX_HANDSHAKES} handshakes was kept (it got a hello, or \
         nothing): {closed:?}"
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
async fn shutdown_answers_running_calls_then_closes() {
    let entered = Arc::new(AtomicUsize::new(0));
    let seen = entered.clone();
    // The calls run until the test lets them end: after the server stopped accepting.
    let (release, released) = watch::channel(false);
    let slow = handler(move |c: Call| {
        seen.fetch_add(1, Ordering::SeqCst);
        let mut released = released.clone();
        async move {
            let _ = released.wait_for(|go| *go).await;
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
    // The server stops accepting (its listener is gone) while the calls still run...
    timeout(BOUND, async {
        while TcpStream::connect(server.addr).await.is_ok() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the server went on accepting connections after it was told to stop");
    // ...and answers them when they end.
    release.send(true).unwrap();
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
