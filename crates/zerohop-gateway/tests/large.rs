//! Bodies larger than a slot through a real gateway: a chain with a small pool and a large
//! pool, an echo "function" (a thread of this process that sends every request back in its
//! own slot), curl and raw sockets as clients. What comes back is byte-exact over HTTP/1.1
//! and h2c; limits answer 413, 503 and 408 and free the slot; a client that stops reading
//! holds its large slot at most `body_timeout`.

mod support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use bytes::Bytes;
use support::curl;
use zerohop_gateway::{Deferred, Gateway, GatewayConfig, Gateways, Receiving};
use zerohop_pool::{Descriptor, PartyState, Pool, Pools};
use zerohop_spec::{DeliverySpec, RouteSpec};
use zerohop_test_support::{wait_until, TempDir};
use zerohop_transport::{
    Backend, Endpoint, FunctionPlan, Plan, PlanExt, PoolPlan, RoutePlan, Sender, Stop, Transport,
    GATEWAY_FN,
};

/// A small slot: 64 KiB.
const SLOT: u32 = 64 * 1024;
/// The largest body, and (with header and metadata room, page-rounded) a large slot.
const MAX_BODY: u64 = 24 << 20;
const LARGE_SLOT: u32 = (MAX_BODY as u32 + 32 + 1024).next_multiple_of(4096);
/// What the echo makes of a request on `/grow`: its body repeated to this length.
const GROWN: usize = 1 << 20;
/// How long a body may take to arrive, and a write to the client stay blocked.
const BODY_TIMEOUT: Duration = Duration::from_secs(2);

/// A running echo chain with `large` large slots: `POST /echo`, and `POST /pkg.Echo/Say` as
/// a gRPC method. Stopped on drop.
struct LargeChain {
    gw: Arc<Gateway>,
    small: Arc<Pool>,
    large: Arc<Pool>,
    addr: SocketAddr,
    shutdown: tokio::sync::watch::Sender<bool>,
    server: Option<thread::JoinHandle<()>>,
    echo_stop: Arc<dyn Stop>,
    echo: Option<thread::JoinHandle<()>>,
    /// Requests the echo holds in a large slot (route `/grow-and-hold`).
    held: std::sync::mpsc::Receiver<u32>,
    _receiving: Receiving,
    _transport: Box<dyn Transport>,
}

impl Drop for LargeChain {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
        if let Some(s) = self.server.take() {
            let _ = s.join();
        }
        self.echo_stop.stop();
        if let Some(e) = self.echo.take() {
            let _ = e.join();
        }
    }
}

impl LargeChain {
    fn start(name: &str, large_slots: u32) -> Self {
        Self::start_in(name, large_slots, None)
    }

    /// [`LargeChain::start`], with its async requests (`POST /later`) queued in `queue`.
    fn start_in(name: &str, large_slots: u32, queue: Option<&Path>) -> Self {
        let plan = Plan {
            chain: name.into(),
            transport: "ring".into(),
            spin_us: 0,
            queue_capacity: 64,
            functions: vec![FunctionPlan {
                name: "echo".into(),
                concurrency: 1,
                ..Default::default()
            }],
            routes: vec![
                RoutePlan {
                    method: "POST".into(),
                    path: "/echo".into(),
                    sequence: vec![0],
                    ..Default::default()
                },
                RoutePlan {
                    method: "POST".into(),
                    path: "/pkg.Echo/Say".into(),
                    grpc: true,
                    sequence: vec![0],
                    ..Default::default()
                },
                RoutePlan {
                    method: "POST".into(),
                    path: "/grow".into(),
                    sequence: vec![0],
                    ..Default::default()
                },
                RoutePlan {
                    method: "POST".into(),
                    path: "/grow-and-hold".into(),
                    sequence: vec![0],
                    ..Default::default()
                },
                RoutePlan {
                    method: "POST".into(),
                    path: "/later".into(),
                    sequence: vec![0],
                    ..Default::default()
                },
            ],
            headers: vec![],
            party_function: vec![GATEWAY_FN, 0],
            cpus: Vec::new(),
            timeout_ms: 20_000,
            state: None,
            pool: PoolPlan {
                slots: 16,
                slot_size: SLOT,
                hugepages: false,
                large_slots,
                large_slot_size: LARGE_SLOT,
            },
        };
        let small = Arc::new(
            Pool::create(name, &plan.pool_geometry(0).expect("small pool geometry"))
                .expect("create the small pool"),
        );
        let large = Arc::new(
            Pool::create(
                name,
                &plan.large_pool_geometry(0).expect("large pool geometry"),
            )
            .expect("create the large pool"),
        );
        let pools = || Pools::new(vec![small.clone(), large.clone()]).expect("pools");
        let policy = Arc::new(plan.policy().expect("policy"));
        let transport = zerohop_transport::create(Backend::Ring, name, &policy, plan.options())
            .expect("create the transport");
        let routes = route_specs(&plan);
        let gateways = Gateways::new(
            pools(),
            vec![transport.sender(0).expect("gateway sender")],
            Arc::new(plan),
            GatewayConfig {
                max_body: MAX_BODY,
                timeout: Duration::from_secs(20),
                body_timeout: BODY_TIMEOUT,
                max_connections: 256,
                access: Default::default(),
            },
        );
        let deferred = queue.map(|dir| {
            let d = Deferred::open(dir, &routes).expect("open the async queue");
            d.attach(&gateways);
            d
        });
        let gw = gateways.iter().next().expect("one gateway").clone();
        let receiving = gw.start_receiving(Endpoint::new(
            pools(),
            policy.clone(),
            0,
            transport.receiver(0).expect("gateway receiver"),
        ));
        let mut echo = Endpoint::new(
            pools(),
            policy,
            1,
            transport.receiver(1).expect("echo receiver"),
        );
        let echo_stop = echo.stopper();
        let sender: Box<dyn Sender> = transport.sender(1).expect("echo sender");
        let (held_tx, held) = std::sync::mpsc::channel();
        let grow_into = large.clone();
        let echo = thread::spawn(move || {
            let mut kept = Vec::new();
            while let Some(d) = echo.recv() {
                let header = d.slot.header();
                let (slot, len) = if header.route == 2 || header.route == 3 {
                    // As the runtime does when an output outgrows its slot: the request
                    // moves into a large slot, the old one is freed.
                    let Some(mut big) = grow_into.alloc(zerohop_pool::Owner::party(1)) else {
                        continue;
                    };
                    big.set_header(&header);
                    let m = header.meta_len as usize;
                    let input = d.slot.data()[m..m + d.desc.len as usize].to_vec();
                    let out: Vec<u8> = input.iter().copied().cycle().take(GROWN).collect();
                    big.data_mut()[..m].copy_from_slice(&d.slot.data()[..m]);
                    big.data_mut()[m..m + GROWN].copy_from_slice(&out);
                    drop(d.slot);
                    (big, GROWN as u32)
                } else {
                    (d.slot, d.desc.len)
                };
                if header.route == 3 {
                    // Holds it until it "dies".
                    let _ = held_tx.send(header.request);
                    kept.push(slot);
                    continue;
                }
                let desc = slot.descriptor(d.desc.request, len, Descriptor::GATEWAY);
                if sender.send(0, desc).is_ok() {
                    slot.into_sent();
                }
            }
        });
        small
            .party(1)
            .expect("party 1")
            .set_state(PartyState::Ready);
        large
            .party(1)
            .expect("party 1")
            .set_state(PartyState::Ready);

        let http = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        http.set_nonblocking(true).unwrap();
        let addr = http.local_addr().unwrap();
        let (shutdown, rx) = tokio::sync::watch::channel(false);
        let g = gw.clone();
        let server = thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                if let Some(d) = &deferred {
                    d.start();
                }
                let l = tokio::net::TcpListener::from_std(http).unwrap();
                g.serve(l, rx).await;
                if let Some(d) = &deferred {
                    d.stop();
                }
            });
        });
        Self {
            gw,
            small,
            large,
            addr,
            shutdown,
            server: Some(server),
            echo_stop,
            echo: Some(echo),
            held,
            _receiving: receiving,
            _transport: transport,
        }
    }

    fn url(&self) -> String {
        format!("http://{}/echo", self.addr)
    }

    fn large_in_use(&self) -> u32 {
        self.large.owners().in_use()
    }

    /// Nothing in flight, no slot of either pool in use.
    fn quiet(&self) -> bool {
        self.gw.inflight() == 0
            && self.small.owners().in_use() == 0
            && self.large.owners().in_use() == 0
    }
}

/// The spec's routes of `plan` (what the async queue knows them by): `POST /later` is async.
fn route_specs(plan: &Plan) -> Vec<RouteSpec> {
    plan.routes
        .iter()
        .map(|r| RouteSpec {
            line: 0,
            method: r.method.clone(),
            path: r.path.clone(),
            grpc: String::new(),
            mqtt: String::new(),
            mqtt_reply: String::new(),
            coap: String::new(),
            content_type: String::new(),
            auth: None,
            rate_limit: None,
            delivery: DeliverySpec {
                is_async: r.path == "/later",
                ..Default::default()
            },
            sequence: vec!["echo".into()],
            relay_of: None,
        })
        .collect()
}

/// `n` bytes no two runs of which repeat soon (a body that is not all one byte).
fn pattern(n: usize, seed: u32) -> Vec<u8> {
    let mut x = seed.wrapping_mul(2_654_435_761) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

/// POSTs file `body` with curl (`extra` arguments first) and returns the status and the
/// answer as written to `out`.
fn post_file(chain: &LargeChain, extra: &[&str], body: &Path, out: &Path) -> (u16, Vec<u8>) {
    let data = format!("@{}", body.display());
    let mut args = extra.to_vec();
    args.extend([
        "--data-binary",
        &data,
        "-H",
        "content-type: application/octet-stream",
        "-o",
        out.to_str().unwrap(),
        "-w",
        "%{http_code}",
    ]);
    let url = chain.url();
    args.push(&url);
    let ran = curl(&args);
    assert!(ran.ok(), "curl failed: {}", ran.stderr);
    let status = ran.stdout.trim().parse().expect("a status");
    (status, std::fs::read(out).unwrap_or_default())
}

#[test]
fn bodies_of_any_size_up_to_max_body_come_back_byte_exact_over_http1_and_h2c() {
    let chain = LargeChain::start("large-exact", 4);
    let dir = TempDir::new("large-exact");
    for (size, seed) in [
        (10usize, 1),
        (60 * 1024, 2),
        (300 * 1024, 3),
        (5 << 20, 4),
        (MAX_BODY as usize, 5),
    ] {
        let body = pattern(size, seed);
        let file = dir.path().join("body");
        std::fs::write(&file, &body).unwrap();
        for extra in [&[][..], &["--http2-prior-knowledge"][..]] {
            let out = dir.path().join("out");
            let (status, got) = post_file(&chain, extra, &file, &out);
            assert_eq!(status, 200, "{size} bytes {extra:?}");
            assert!(
                got == body,
                "{size} bytes {extra:?}: {} bytes came back, not the same",
                got.len()
            );
        }
    }
    // A body sent without a length (chunked) grows into a large slot as it comes.
    let body = pattern(3 << 20, 6);
    let file = dir.path().join("chunked");
    std::fs::write(&file, &body).unwrap();
    let out = dir.path().join("out");
    let (status, got) = post_file(&chain, &["-H", "transfer-encoding: chunked"], &file, &out);
    assert_eq!(status, 200);
    assert!(got == body, "a chunked body came back different");
    assert!(
        wait_until(Duration::from_secs(5), || chain.quiet()),
        "every slot is freed once the answers are written"
    );
}

#[test]
fn over_max_body_is_413_and_with_every_large_slot_taken_503() {
    let chain = LargeChain::start("large-limits", 1);
    let dir = TempDir::new("large-limits");
    let file = dir.path().join("body");
    std::fs::write(&file, pattern(MAX_BODY as usize + 1, 7)).unwrap();
    let out = dir.path().join("out");
    // Announced by Content-Length, and found while a chunked body streams in.
    for extra in [&[][..], &["-H", "transfer-encoding: chunked"][..]] {
        let (status, text) = post_file(&chain, extra, &file, &out);
        assert_eq!(status, 413, "{extra:?}");
        let text = String::from_utf8_lossy(&text);
        assert_eq!(
            text,
            format!(
                "gateway: request body exceeds the chain's limit of {MAX_BODY} bytes (max_body)\n"
            )
        );
    }
    assert!(wait_until(Duration::from_secs(5), || chain.quiet()));

    // The one large slot held (as by a request in progress): a large body is told to retry,
    // a small one is still served.
    let held = chain
        .large
        .alloc(zerohop_pool::Owner::party(0))
        .expect("the large slot");
    std::fs::write(&file, pattern(1 << 20, 8)).unwrap();
    let ran = curl(&[
        "-i",
        "--data-binary",
        &format!("@{}", file.display()),
        &chain.url(),
    ]);
    assert!(
        ran.stdout.starts_with("HTTP/1.1 503"),
        "{}{}",
        ran.stdout,
        ran.stderr
    );
    assert!(
        ran.stdout.to_ascii_lowercase().contains("retry-after: 1"),
        "{}",
        ran.stdout
    );
    assert!(
        ran.stdout.contains(
            "gateway: all 1 large slots (for bodies larger than a slot) are in use; retry"
        ),
        "{}",
        ran.stdout
    );
    let small = curl(&["-d", "small", &chain.url()]);
    assert_eq!(small.stdout, "small");
    drop(held);
    let (status, _) = post_file(&chain, &[], &file, &out);
    assert_eq!(status, 200, "served once the slot is free");
    assert!(wait_until(Duration::from_secs(5), || chain.quiet()));
}

/// Sends the head of a POST of `len` bytes and `sent` bytes of its body.
fn start_post(addr: SocketAddr, len: usize, sent: &[u8]) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    write!(
        s,
        "POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: {len}\r\n\r\n"
    )
    .unwrap();
    s.write_all(sent).unwrap();
    s
}

#[test]
fn a_body_that_stops_arriving_is_408_and_frees_its_large_slot() {
    let chain = LargeChain::start("large-408", 2);
    let mut s = start_post(chain.addr, 8 << 20, &pattern(1 << 20, 9));
    assert!(
        wait_until(Duration::from_secs(5), || chain.large_in_use() == 1),
        "a large body is streamed into a large slot as it arrives"
    );
    s.set_read_timeout(Some(BODY_TIMEOUT * 5)).unwrap();
    let mut answer = Vec::new();
    let _ = s.read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("body_timeout"), "{answer}");
    assert!(wait_until(Duration::from_secs(5), || chain.quiet()));
}

#[test]
fn clients_that_stop_reading_hold_their_large_slot_at_most_body_timeout() {
    const N: usize = 3;
    let chain = LargeChain::start("large-stall", N as u32 + 1);
    let body = pattern(16 << 20, 10);
    // Each asks for a 16 MiB answer and reads nothing: far more than the socket buffers.
    let stalled: Vec<TcpStream> = (0..N)
        .map(|_| start_post(chain.addr, body.len(), &body))
        .collect();
    let all_stalled = Instant::now();
    assert!(
        wait_until(Duration::from_secs(10), || chain.large_in_use() == N as u32),
        "each stalled answer holds one large slot, got {}",
        chain.large_in_use()
    );
    // Meanwhile others are served, large ones too (one large slot is left).
    let served = curl(&["-d", "still here", &chain.url()]);
    assert_eq!(served.stdout, "still here");
    let dir = TempDir::new("large-stall");
    let file = dir.path().join("body");
    std::fs::write(&file, &body[..2 << 20]).unwrap();
    let (status, got) = post_file(&chain, &[], &file, &dir.path().join("out"));
    assert_eq!(status, 200);
    assert!(got == body[..2 << 20]);
    assert!(chain.large_in_use() <= N as u32);
    // The stalled writes fail after body_timeout: their connections close and the slots
    // are freed, though the clients still hold their sockets open.
    assert!(
        wait_until(BODY_TIMEOUT * 3 + Duration::from_secs(5), || chain.quiet()),
        "large slots still in use {:?} after the clients stalled",
        all_stalled.elapsed()
    );
    let freed = all_stalled.elapsed();
    assert!(
        freed >= BODY_TIMEOUT,
        "freed after {freed:?}, before the limit"
    );
    drop(stalled);
}

/// One gRPC call of `message` on a new h2c connection: the status, the answer's message
/// and its `grpc-status`.
async fn grpc_call(addr: SocketAddr, message: &[u8]) -> (u16, Vec<u8>, String) {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (send, conn) = h2::client::handshake(tcp).await.expect("handshake");
    let conn = tokio::spawn(conn);
    let mut send = send.ready().await.unwrap();
    let req = http::Request::post(format!("http://{addr}/pkg.Echo/Say"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap();
    let (answer, mut stream) = send.send_request(req, false).unwrap();
    let mut framed = vec![0u8];
    framed.extend_from_slice(&(message.len() as u32).to_be_bytes());
    framed.extend_from_slice(message);
    // In pieces the stream's window takes.
    let mut rest = Bytes::from(framed);
    while !rest.is_empty() {
        stream.reserve_capacity(rest.len().min(1 << 20));
        let got = std::future::poll_fn(|cx| stream.poll_capacity(cx))
            .await
            .expect("capacity")
            .unwrap();
        let piece = rest.split_to(got.min(rest.len()));
        stream.send_data(piece, rest.is_empty()).unwrap();
    }
    let answer = answer.await.expect("an answer");
    let status = answer.status().as_u16();
    let mut body = answer.into_body();
    let mut got = Vec::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.unwrap();
        let _ = body.flow_control().release_capacity(chunk.len());
        got.extend_from_slice(&chunk);
    }
    let trailers = body.trailers().await.unwrap().unwrap_or_default();
    let code = trailers
        .get("grpc-status")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    drop(send);
    conn.abort();
    (status, got, code)
}

#[test]
fn a_grpc_message_larger_than_a_slot_goes_through_without_its_prefix() {
    let chain = LargeChain::start("large-grpc", 2);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    for size in [100, 3 << 20] {
        let message = pattern(size, 11);
        let (status, got, code) = rt
            .block_on(async {
                tokio::time::timeout(Duration::from_secs(20), grpc_call(chain.addr, &message)).await
            })
            .expect("bounded");
        assert_eq!((status, code.as_str()), (200, "0"), "{size} bytes");
        assert_eq!(got.len(), message.len() + 5, "{size} bytes");
        assert_eq!(
            &got[..5],
            &[
                0,
                (size >> 24) as u8,
                (size >> 16) as u8,
                (size >> 8) as u8,
                size as u8
            ]
        );
        assert!(got[5..] == message[..], "{size} bytes: the message differs");
    }
    assert!(wait_until(Duration::from_secs(5), || chain.quiet()));
}

#[test]
fn an_http2_client_that_never_opens_its_window_holds_its_large_slot_at_most_body_timeout() {
    let chain = LargeChain::start("large-window", 2);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let body = Bytes::from(pattern(4 << 20, 12));
    let addr = chain.addr;
    let started = Instant::now();
    let held = rt.block_on(async {
        // The connection is driven (its socket read, so the gateway's writes never block),
        // but the answer's stream window is never opened past the default 64 KiB (the
        // connection's is wide, so other streams' answers can still move).
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (send, conn) = h2::client::Builder::new()
            .initial_connection_window_size(16 << 20)
            .handshake(tcp)
            .await
            .expect("handshake");
        let conn = tokio::spawn(conn);
        let mut send = send.ready().await.unwrap();
        let (answer, mut stream) = send
            .send_request(
                http::Request::post(format!("http://{addr}/echo"))
                    .body(())
                    .unwrap(),
                false,
            )
            .unwrap();
        let mut rest = body.clone();
        while !rest.is_empty() {
            stream.reserve_capacity(rest.len().min(1 << 20));
            let got = std::future::poll_fn(|cx| stream.poll_capacity(cx))
                .await
                .expect("capacity")
                .unwrap();
            let piece = rest.split_to(got.min(rest.len()));
            stream.send_data(piece, rest.is_empty()).unwrap();
        }
        let answer = tokio::time::timeout(Duration::from_secs(20), answer)
            .await
            .expect("bounded")
            .expect("an answer");
        assert_eq!(answer.status(), 200);
        assert_eq!(
            chain.large_in_use(),
            1,
            "the answer streams from its large slot"
        );
        // Meanwhile the client keeps asking small things on the same connection: others'
        // answers moving do not keep the stalled one alive.
        let deadline = Instant::now() + BODY_TIMEOUT * 3;
        let mut served = 0;
        while chain.large_in_use() > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(200)).await;
            match tokio::time::timeout(Duration::from_secs(5), small_h2(&mut send, addr)).await {
                Ok(Ok(b)) if b == "small" => served += 1,
                _ => break,
            }
        }
        (answer, send, conn, served)
    });
    // Cut within the limit (and a look of the driver), though the connection kept moving.
    let freed = wait_until(Duration::from_secs(1), || chain.quiet());
    let at = started.elapsed();
    assert!(
        freed && at < BODY_TIMEOUT * 2 + Duration::from_secs(1),
        "the large slot is still held {at:?} after the answer started"
    );
    let (_answer, _send, conn, served) = held;
    assert!(
        served > 0,
        "the connection served others while one answer waited"
    );
    conn.abort();
}

/// A small request on `send`'s connection: the answer's body, or why there is none.
async fn small_h2(
    send: &mut h2::client::SendRequest<Bytes>,
    addr: SocketAddr,
) -> Result<String, h2::Error> {
    *send = send.clone().ready().await?;
    let req = http::Request::post(format!("http://{addr}/echo"))
        .body(())
        .unwrap();
    let (answer, mut stream) = send.send_request(req, false)?;
    stream.send_data(Bytes::from_static(b"small"), true)?;
    let mut body = answer.await?.into_body();
    let mut got = Vec::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk?;
        let _ = body.flow_control().release_capacity(chunk.len());
        got.extend_from_slice(&chunk);
    }
    Ok(String::from_utf8_lossy(&got).into_owned())
}

#[test]
fn a_structured_cloudevent_larger_than_a_slot_is_413_asking_for_binary_mode() {
    let chain = LargeChain::start("large-ce", 1);
    let event = |data_len: usize| {
        format!(
            r#"{{"specversion":"1.0","id":"1","source":"/t","type":"t.big","datacontenttype":"text/plain","data":"{}"}}"#,
            "x".repeat(data_len)
        )
    };
    let post = |event: String| {
        curl(&[
            "-H",
            "content-type: application/cloudevents+json",
            "--data-binary",
            &event,
            "-w",
            "|%{http_code}",
            &chain.url(),
        ])
    };
    // An event that fits a slot is unwrapped and runs as ever.
    let small = post(event(1000));
    assert!(small.stdout.ends_with("|200"), "{}", small.stdout);
    // One that does not is refused before it is parsed, with what to do instead.
    let large = post(event(SLOT as usize));
    assert!(large.stdout.ends_with("|413"), "{}", large.stdout);
    assert!(
        large.stdout.contains("send a larger event in binary mode"),
        "{}",
        large.stdout
    );
    assert!(wait_until(Duration::from_secs(5), || chain.quiet()));
}

#[test]
fn an_answer_that_outgrew_its_slot_comes_back_from_the_large_slot_it_moved_to() {
    let chain = LargeChain::start("large-grow", 2);
    let url = format!("http://{}/grow", chain.addr);
    let out = curl(&["-d", "abc", "-w", "|%{http_code}", &url]);
    let (body, status) = out.stdout.rsplit_once('|').expect("a status");
    assert_eq!(status, "200", "{}", out.stdout.len());
    assert_eq!(body.len(), GROWN);
    assert!(body.as_bytes().chunks(3).all(|c| c == &b"abc"[..c.len()]));
    assert!(wait_until(Duration::from_secs(5), || chain.quiet()));
    // An instance that dies holding a moved request fails it at once (502), not at the
    // chain's timeout.
    let url = format!("http://{}/grow-and-hold", chain.addr);
    let client = thread::spawn(move || curl(&["-d", "abc", "-w", "|%{http_code}", &url]));
    chain
        .held
        .recv_timeout(Duration::from_secs(10))
        .expect("the echo holds the request");
    let started = Instant::now();
    assert_eq!(chain.gw.party_died(1, "was killed"), 1);
    let out = client.join().unwrap();
    assert!(out.stdout.ends_with("|502"), "{}", out.stdout);
    assert!(
        out.stdout.contains("instance 1 was killed"),
        "{}",
        out.stdout
    );
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[test]
fn an_async_request_larger_than_a_slot_is_queued_from_its_slot_and_answered_later() {
    let queue = TempDir::new("large-async");
    let chain = LargeChain::start_in("large-async", 2, Some(queue.path()));
    let dir = TempDir::new("large-async-body");
    let body = pattern(5 << 20, 13);
    let file = dir.path().join("body");
    std::fs::write(&file, &body).unwrap();
    let url = format!("http://{}/later", chain.addr);
    let ran = curl(&[
        "--data-binary",
        &format!("@{}", file.display()),
        "-w",
        "|%{http_code}",
        &url,
    ]);
    let (accepted, status) = ran.stdout.rsplit_once('|').expect("a status");
    assert_eq!(status, "202", "{}", ran.stdout);
    let location = accepted
        .split('"')
        .find(|s| s.starts_with("/_zerohop/async/"))
        .unwrap_or_else(|| panic!("a location in {accepted}"))
        .to_owned();
    let out = dir.path().join("out");
    let result = format!("http://{}{location}", chain.addr);
    let answered = wait_until(Duration::from_secs(20), || {
        let r = curl(&["-o", out.to_str().unwrap(), "-w", "%{http_code}", &result]);
        r.stdout == "200"
    });
    assert!(answered, "the result is there within 20 s");
    assert!(std::fs::read(&out).unwrap() == body, "the result differs");
    assert!(wait_until(Duration::from_secs(5), || chain.quiet()));
}
