//! HTTP/2 on the gateway's clear-text listener (h2c with prior knowledge, beside HTTP/1.1),
//! with real clients: curl, h2load (nghttp2) for a stream flood, and the `h2` crate for what
//! those cannot send: a rapid-reset flood and a connection held across a hand-over.

mod support;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use support::{assert_answer, curl, EchoChain, Listen, WRITE_OUT};
use zerohop_gateway::H2_MAX_STREAMS;
use zerohop_test_support::wait_until;

fn url(addr: SocketAddr, path: &str) -> String {
    format!("http://{addr}{path}")
}

#[test]
fn h2c_and_http1_share_the_clear_listener_with_the_same_answers() {
    let chain = EchoChain::start("h2-clear", Listen::default());
    let echo = url(chain.addr, "/echo");
    assert_answer(
        &curl(&[
            "--http2-prior-knowledge",
            "-d",
            "hi",
            "-w",
            WRITE_OUT,
            &echo,
        ]),
        "hi",
        "2",
    );
    assert_answer(
        &curl(&["--http1.1", "-d", "hi", "-w", WRITE_OUT, &echo]),
        "hi",
        "1.1",
    );
    // Errors are the same answers over both: status and body. (Without a request body:
    // an answer given before the body is read ends the HTTP/2 stream with RST_STREAM
    // NO_ERROR, which RFC 9113 8.1 allows and curl 7.88 reports as error 92.)
    for (method, path) in [("POST", "/nowhere"), ("GET", "/echo")] {
        let target = url(chain.addr, path);
        let ask = |version: &str| {
            let out = curl(&[version, "-X", method, "-w", "|%{http_code}", &target]);
            assert!(out.ok(), "{version} {method} {path}: curl failed: {out:?}");
            out.stdout
        };
        let (one, two) = (ask("--http1.1"), ask("--http2-prior-knowledge"));
        assert_eq!(
            one, two,
            "{method} {path}: HTTP/1.1 and HTTP/2 answer differently"
        );
        assert!(!one.ends_with("|200"), "{one}");
    }
    // A body over `max_body`, with the h2 crate (which takes the early answer as it is).
    let big = "x".repeat(5000);
    let one = curl(&["--http1.1", "-d", &big, "-w", "|%{http_code}", &echo]);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let two = rt.block_on(async {
        let (mut send, _conn) = h2_connect(chain.addr).await;
        echo_h2(&mut send, chain.addr, &big).await
    });
    assert_eq!(
        one.stdout,
        format!("{}|{}", two.1, two.0),
        "413 over HTTP/1.1 and HTTP/2"
    );
    assert_eq!(two.0, 413);
    assert!(wait_until(Duration::from_secs(5), || chain.quiet()));
}

#[test]
fn a_stream_flood_from_h2load_is_served_within_the_stream_limit() {
    let chain = EchoChain::start("h2-flood", Listen::default());
    let body = zerohop_test_support::TempDir::new("h2load");
    let data = body.path().join("body");
    std::fs::write(&data, "flood").unwrap();
    // More streams at once than the gateway allows: h2load keeps to the advertised limit.
    let streams = (H2_MAX_STREAMS * 2).to_string();
    let out = support::bounded(std::process::Command::new("h2load").args([
        "-n",
        "4000",
        "-c",
        "4",
        "-m",
        &streams,
        "-d",
        data.to_str().unwrap(),
        &url(chain.addr, "/echo"),
    ]));
    assert!(out.ok(), "h2load failed: {out:?}");
    // Every request is answered: served, or 503 when the chain's 64 slots are all taken
    // (the flood asks for more at once); none is lost or left waiting.
    let line = |prefix: &str| {
        out.stdout
            .lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no {prefix} line: {}", out.stdout))
            .to_owned()
    };
    let requests = line("requests:");
    assert!(
        requests.contains("4000 done") && requests.contains("0 errored, 0 timeout"),
        "{requests}\n{}",
        out.stdout
    );
    let codes = line("status codes:");
    let count = |what: &str| -> u32 {
        codes
            .split(',')
            .find_map(|c| {
                c.trim()
                    .trim_start_matches("status codes: ")
                    .strip_suffix(what)
            })
            .map(|n| n.trim().parse().unwrap())
            .unwrap_or_else(|| panic!("no {what} in {codes}"))
    };
    assert_eq!(count("2xx") + count("5xx"), 4000, "{codes}");
    assert!(count("2xx") > 0, "{codes}");
    // And still serving.
    assert_answer(
        &curl(&[
            "--http2-prior-knowledge",
            "-d",
            "after",
            "-w",
            WRITE_OUT,
            &url(chain.addr, "/echo"),
        ]),
        "after",
        "2",
    );
    assert!(wait_until(Duration::from_secs(5), || chain.quiet()));
}

/// An HTTP/2 connection of the `h2` crate to `addr`, driven on `rt`.
async fn h2_connect(
    addr: SocketAddr,
) -> (
    h2::client::SendRequest<Bytes>,
    tokio::task::JoinHandle<Result<(), h2::Error>>,
) {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (send, conn) = h2::client::handshake(tcp)
        .await
        .expect("the HTTP/2 handshake");
    (send, tokio::spawn(conn))
}

fn post(addr: SocketAddr) -> http::Request<()> {
    http::Request::post(format!("http://{addr}/echo"))
        .body(())
        .unwrap()
}

/// One request with `body` on `send`; the answer's status and body.
async fn echo_h2(
    send: &mut h2::client::SendRequest<Bytes>,
    addr: SocketAddr,
    body: &str,
) -> (u16, String) {
    let ready = send.clone().ready().await.expect("a stream");
    *send = ready;
    let (answer, mut stream) = send.send_request(post(addr), false).unwrap();
    stream
        .send_data(Bytes::from(body.to_owned()), true)
        .unwrap();
    let answer = answer.await.expect("an answer");
    let status = answer.status().as_u16();
    let mut body = answer.into_body();
    let mut got = Vec::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.unwrap();
        let _ = body.flow_control().release_capacity(chunk.len());
        got.extend_from_slice(&chunk);
    }
    (status, String::from_utf8(got).unwrap())
}

#[test]
fn rapid_reset_floods_cost_their_connection_and_others_are_served() {
    let chain = EchoChain::start("h2-reset", Listen::default());
    let addr = chain.addr;
    let done = Arc::new(AtomicBool::new(false));
    let served = Arc::new(AtomicUsize::new(0));
    // A well-behaved client all along.
    let (d, s) = (done.clone(), served.clone());
    let bystander = std::thread::spawn(move || {
        while !d.load(Ordering::Relaxed) {
            let out = curl(&[
                "--http2-prior-knowledge",
                "-d",
                "calm",
                "-w",
                WRITE_OUT,
                &url(addr, "/echo"),
            ]);
            assert_answer(&out, "calm", "2");
            s.fetch_add(1, Ordering::Relaxed);
        }
    });
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (opened, ended) = rt.block_on(async {
        let mut opened = 0;
        let mut ended = None;
        // Several attacking connections, one after the other: each opens streams and resets
        // them at once, as fast as it can.
        for _ in 0..4 {
            let (mut send, conn) = h2_connect(addr).await;
            let flood = async {
                for _ in 0..5000 {
                    send = match send.clone().ready().await {
                        Ok(s) => s,
                        Err(e) => return Some(e),
                    };
                    match send.send_request(post(addr), false) {
                        Ok((_, mut stream)) => stream.send_reset(h2::Reason::CANCEL),
                        Err(e) => return Some(e),
                    }
                    opened += 1;
                }
                None
            };
            let cut = tokio::time::timeout(Duration::from_secs(30), flood)
                .await
                .expect("the flood ran out of time");
            drop(send);
            let conn_end = tokio::time::timeout(Duration::from_secs(30), conn).await;
            ended = Some(format!("{cut:?} / {conn_end:?}"));
        }
        (opened, ended)
    });
    done.store(true, Ordering::Relaxed);
    bystander
        .join()
        .expect("the well-behaved client was always served");
    assert!(opened > 0, "no stream was opened");
    assert!(
        served.load(Ordering::Relaxed) > 0,
        "nobody else was served during the flood"
    );
    eprintln!("rapid reset: {opened} streams opened; last connection: {ended:?}");
    // Still serving, and nothing held: no request in flight, no slot taken.
    assert_answer(
        &curl(&[
            "--http2-prior-knowledge",
            "-d",
            "after",
            "-w",
            WRITE_OUT,
            &url(addr, "/echo"),
        ]),
        "after",
        "2",
    );
    assert!(
        wait_until(Duration::from_secs(10), || chain.quiet()),
        "{} in flight, {} slots in use after the flood",
        chain.gw.inflight(),
        chain.pool.owners().in_use()
    );
}

#[test]
fn an_http2_client_is_sent_a_goaway_when_the_gateway_hands_over() {
    let chain = EchoChain::start("h2-handover", Listen::default());
    let addr = chain.addr;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (mut send, conn) = h2_connect(addr).await;
        assert_eq!(echo_h2(&mut send, addr, "one").await, (200, "one".into()));
        chain.gw.close_connections();
        // The request after the hand-over is still answered, then the gateway says GOAWAY
        // and the connection ends (the client moves to a new one for its next request).
        assert_eq!(echo_h2(&mut send, addr, "two").await, (200, "two".into()));
        // The client keeps its handle: only the gateway can end the connection.
        let end = tokio::time::timeout(Duration::from_secs(5), conn)
            .await
            .expect("the gateway closed the HTTP/2 connection after its GOAWAY");
        assert!(matches!(end, Ok(Ok(()))), "{end:?}");
        assert!(
            send.ready().await.is_err(),
            "the connection still takes requests"
        );
    });
}

#[test]
fn idle_connections_are_closed_after_the_idle_timeout_whatever_they_speak() {
    use std::io::Read;
    use std::time::Instant;

    use zerohop_gateway::IDLE_TIMEOUT;

    let chain = EchoChain::start("h2-idle", Listen::default());
    let addr = chain.addr;
    let started = Instant::now();
    // A client that connects and never sends a byte (no preface, no request line).
    let silent = std::thread::spawn(move || {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(IDLE_TIMEOUT + Duration::from_secs(15)))
            .unwrap();
        let mut buf = [0u8; 16];
        matches!(s.read(&mut buf), Ok(0))
    });
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let h2_closed_after = rt.block_on(async {
        let (mut send, conn) = h2_connect(addr).await;
        assert_eq!(echo_h2(&mut send, addr, "once").await, (200, "once".into()));
        let asked = Instant::now();
        // The client keeps its handle: only the gateway can end the connection.
        let end = tokio::time::timeout(IDLE_TIMEOUT + Duration::from_secs(15), conn)
            .await
            .expect("the idle HTTP/2 connection was closed");
        assert!(matches!(end, Ok(Ok(()))), "{end:?}");
        asked.elapsed()
    });
    assert!(
        h2_closed_after >= IDLE_TIMEOUT - Duration::from_secs(1),
        "closed after {h2_closed_after:?}, before the idle timeout"
    );
    assert!(
        silent.join().unwrap(),
        "the silent connection was not closed"
    );
    let silent_after = started.elapsed();
    assert!(
        silent_after >= IDLE_TIMEOUT - Duration::from_secs(1),
        "closed after {silent_after:?}"
    );
}
