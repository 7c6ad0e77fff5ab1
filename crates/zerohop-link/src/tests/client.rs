//! The client ([`crate::Peers`]): calls share one connection, each has one outcome, a lost
//! connection fails its calls and the next call connects again.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio::time::timeout;

use super::*;
use crate::auth::Role;
use crate::{PeerStats, MAX_FRAME};

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

#[tokio::test]
async fn a_call_never_answered_times_out_alone_and_a_late_answer_is_dropped() {
    // The slow call is answered once the test lets it, after its caller gave up: late
    // whatever the machine's pace.
    let release = Arc::new(tokio::sync::Notify::new());
    let answered_late = Arc::new(AtomicUsize::new(0));
    let (let_go, late) = (release.clone(), answered_late.clone());
    let h = handler(move |c: Call| {
        let (release, late) = (let_go.clone(), late.clone());
        async move {
            match c.payload.as_slice() {
                b"hang" => std::future::pending::<()>().await,
                b"slow" => {
                    release.notified().await;
                    late.fetch_add(1, Ordering::SeqCst);
                }
                _ => {}
            }
            same(c)
        }
    });
    let server = start(h).await;
    let peers = Arc::new(Peers::new(secret()));
    // The quick call has all of BOUND: it is answered while the other two time out.
    let short = Duration::from_millis(200);
    let (hang, slow, quick) = tokio::join!(
        peers.call(server.addr, call(1, "hang"), short),
        peers.call(server.addr, call(2, "slow"), short),
        peers.call(server.addr, call(3, "quick"), BOUND),
    );
    for e in [hang.unwrap_err(), slow.unwrap_err()] {
        assert!(
            matches!(e, PeerError::Timeout { after, .. } if after == short),
            "{e}"
        );
        assert_eq!(e.status(), 504);
    }
    assert_eq!(quick.unwrap().payload, b"quick");
    // The slow call's answer goes now, for a stream no one waits on. On this one-thread
    // runtime, by the time the test sees its handler returned, the answer is in the
    // connection's backlog, ahead of the answer to any call made after: the client reads
    // (and drops) it first.
    release.notify_one();
    reach(&answered_late, 1).await;
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
    // Lost with the connection, not by their own 60 s timeout (which BOUND guards against).
    let mut lost = 0;
    let drained = timeout(BOUND, async {
        while let Some(joined) = calls.join_next().await {
            let e = joined.unwrap().unwrap_err();
            assert!(matches!(e, PeerError::Lost { .. }), "{e}");
            assert_eq!(e.status(), 502);
            lost += 1;
        }
    })
    .await;
    assert!(
        drained.is_ok(),
        "only {lost} of 50 pending calls failed when their server died"
    );
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
    // Lost for its missing PONGs: "nothing received", not the call's own timeout (BOUND,
    // the guard, which the silent peer outlasts).
    let e = peers.call(addr, call(3, "c"), BOUND).await.unwrap_err();
    assert!(
        matches!(&e, PeerError::Lost { reason, .. }
        if reason.contains("nothing received")),
        "the silent peer was not found lost for want of PONGs: {e}"
    );
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
