//! What both ends share ([`crate::wire`]): large frames through the backlog, and reading a
//! frame whatever its bytes.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::time::timeout;

use super::*;
use crate::wire::{read_frame, ReadError, FIRST_CHUNK};
use crate::{FrameError, MAX_FRAME};

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
