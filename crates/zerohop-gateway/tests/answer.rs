//! The one copy out: an answer in a slot of the chain's (small) pool reaches the client
//! byte-exact whatever its size, over HTTP/1.1 and h2c, and its slot is freed exactly when it
//! should be, however the answer ends: written, the client gone mid-answer, its HTTP/2
//! stream reset, or a client that stops reading cut at `body_timeout`. Slots are counted with
//! the pool's owner words; every wait is bounded.
//!
//! The "function" is a thread of this process: on `POST /fill` it reads a decimal length `n`
//! from the request body and answers with `n` bytes of a pattern written in place into the
//! request's own slot (as `upper` does), so a request of a few bytes gets an answer of up to
//! a whole slot.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use bytes::Bytes;
use zerohop_gateway::{Gateway, GatewayConfig, Receiving};
use zerohop_pool::{Descriptor, PartyState, Pool, PoolGeometry};
use zerohop_test_support::wait_until;
use zerohop_transport::{
    Backend, Endpoint, FunctionPlan, Plan, PlanExt, PoolPlan, RoutePlan, Sender, Stop, Transport,
    GATEWAY_FN,
};

/// A slot of the chain's pool.
const SLOT: u32 = 64 * 1024;
/// The largest answer the tests ask for: nearly a whole slot.
const FULL: usize = 60 * 1024;

/// A running chain of one "function" that fills its answers in place. Stopped on drop.
struct FillChain {
    gw: Arc<Gateway>,
    pool: Arc<Pool>,
    addr: SocketAddr,
    shutdown: tokio::sync::watch::Sender<bool>,
    server: Option<thread::JoinHandle<()>>,
    fill_stop: Arc<dyn Stop>,
    fill: Option<thread::JoinHandle<()>>,
    _receiving: Receiving,
    _transport: Box<dyn Transport>,
}

impl Drop for FillChain {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
        if let Some(s) = self.server.take() {
            let _ = s.join();
        }
        self.fill_stop.stop();
        if let Some(f) = self.fill.take() {
            let _ = f.join();
        }
    }
}

/// Byte `i` of every answer.
fn pattern(i: usize) -> u8 {
    (i as u8).wrapping_mul(31) ^ (i >> 8) as u8
}

fn expected(n: usize) -> Vec<u8> {
    (0..n).map(pattern).collect()
}

impl FillChain {
    /// The chain named `name` (also its pool's), cutting answers that make no progress after
    /// `body_timeout`.
    fn start(name: &str, body_timeout: Duration) -> Self {
        let plan = Plan {
            chain: name.into(),
            transport: "ring".into(),
            spin_us: 0,
            queue_capacity: 64,
            functions: vec![FunctionPlan {
                name: "fill".into(),
                concurrency: 1,
                ..Default::default()
            }],
            routes: vec![RoutePlan {
                method: "POST".into(),
                path: "/fill".into(),
                sequence: vec![0],
                ..Default::default()
            }],
            headers: vec![],
            party_function: vec![GATEWAY_FN, 0],
            cpus: Vec::new(),
            timeout_ms: 10_000,
            state: None,
            pool: PoolPlan {
                slots: 16,
                slot_size: SLOT,
                hugepages: false,
                large_slots: 0,
                large_slot_size: 0,
            },
        };
        let pool = Arc::new(
            Pool::create(
                name,
                &PoolGeometry {
                    slots: 16,
                    first_slot: 0,
                    slot_size: SLOT,
                    max_parties: 2,
                    hugepages: false,
                    release: false,
                },
            )
            .expect("create the pool"),
        );
        let policy = Arc::new(plan.policy().expect("policy"));
        let transport = zerohop_transport::create(Backend::Ring, name, &policy, plan.options())
            .expect("create the transport");
        let gw = Gateway::new(
            pool.clone(),
            transport.sender(0).expect("gateway sender"),
            Arc::new(plan),
            GatewayConfig {
                max_body: 64,
                timeout: Duration::from_secs(10),
                body_timeout,
                max_connections: 64,
                access: Default::default(),
            },
        );
        let receiving = gw.start_receiving(Endpoint::new(
            pool.clone(),
            policy.clone(),
            0,
            transport.receiver(0).expect("gateway receiver"),
        ));
        let mut fill = Endpoint::new(
            pool.clone(),
            policy,
            1,
            transport.receiver(1).expect("fill receiver"),
        );
        let fill_stop = fill.stopper();
        let sender: Box<dyn Sender> = transport.sender(1).expect("fill sender");
        let fill = thread::spawn(move || {
            while let Some(d) = fill.recv() {
                let mut slot = d.slot;
                let m = slot.header().meta_len as usize;
                let asked = std::str::from_utf8(&slot.data()[m..m + d.desc.len as usize])
                    .ok()
                    .and_then(|s| s.trim().parse::<usize>().ok())
                    .unwrap_or(0);
                let n = asked.min(slot.data().len() - m);
                for (i, b) in slot.data_mut()[m..m + n].iter_mut().enumerate() {
                    *b = pattern(i);
                }
                let desc = slot.descriptor(d.desc.request, n as u32, Descriptor::GATEWAY);
                if sender.send(0, desc).is_ok() {
                    slot.into_sent();
                }
            }
        });
        pool.party(1).expect("party 1").set_state(PartyState::Ready);

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
                let l = tokio::net::TcpListener::from_std(http).unwrap();
                g.serve(l, rx).await;
            });
        });
        Self {
            gw,
            pool,
            addr,
            shutdown,
            server: Some(server),
            fill_stop,
            fill: Some(fill),
            _receiving: receiving,
            _transport: transport,
        }
    }

    fn in_use(&self) -> u32 {
        self.pool.owners().in_use()
    }

    /// Nothing in flight, no slot in use.
    fn quiet(&self) -> bool {
        self.gw.inflight() == 0 && self.in_use() == 0
    }
}

/// `POST /fill` asking for `n` bytes, as HTTP/1.1 bytes.
fn fill_request(n: usize) -> Vec<u8> {
    let body = n.to_string();
    format!(
        "POST /fill HTTP/1.1\r\nhost: t\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Reads one HTTP/1.1 answer with a `content-length` from `s`: its status and body.
fn read_answer(s: &mut TcpStream) -> (u16, Vec<u8>) {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        s.read_exact(&mut byte).expect("the answer's head");
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
    let status = head[9..12].parse().expect("a status");
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length: "))
        .and_then(|v| v.trim().parse().ok())
        .expect("a content-length");
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).expect("the answer's body");
    (status, body)
}

/// A connection whose receive buffer is small, so that answers pile up on the gateway's
/// side as soon as the client stops reading.
fn narrow_connection(addr: SocketAddr) -> TcpStream {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_recv_buffer_size(4096).unwrap();
        let s = socket.connect(addr).await.expect("connect");
        let s = s.into_std().unwrap();
        s.set_nonblocking(false).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        s
    })
}

/// Answers of `PIPELINED` full slots asked for at once on one connection: many megabytes,
/// more than the socket buffers of both sides hold.
const PIPELINED: usize = 400;

/// Sends [`PIPELINED`] requests for full-slot answers on a narrow connection and reads none;
/// returns once one of those answers holds a slot (the gateway's write is blocked).
fn stall(chain: &FillChain) -> TcpStream {
    let mut s = narrow_connection(chain.addr);
    let all: Vec<u8> = (0..PIPELINED).flat_map(|_| fill_request(FULL)).collect();
    s.write_all(&all).expect("send the requests");
    assert!(
        wait_until(Duration::from_secs(10), || chain.in_use() == 1
            && chain.gw.inflight() == 0),
        "an answer the client does not read holds its slot (in use: {})",
        chain.in_use()
    );
    s
}

#[test]
fn answers_of_any_size_up_to_a_slot_come_back_byte_exact_and_free_their_slot() {
    let chain = FillChain::start("answer-exact", Duration::from_secs(5));
    let mut s = TcpStream::connect(chain.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let sizes = [
        0, 1, 11, 1023, 1024, 1025, 4096, 8191, 8192, 8193, 16384, 32768, FULL,
    ];
    for &n in &sizes {
        s.write_all(&fill_request(n)).unwrap();
        let (status, body) = read_answer(&mut s);
        assert_eq!(status, 200, "{n} bytes");
        assert!(body == expected(n), "{n} bytes: the answer differs");
    }
    assert!(wait_until(Duration::from_secs(5), || chain.quiet()));

    // The same over h2c, several streams at once.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let addr = chain.addr;
    rt.block_on(async {
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (send, conn) = h2::client::handshake(tcp).await.expect("handshake");
        let conn = tokio::spawn(conn);
        let mut asked = Vec::new();
        for &n in &sizes {
            let mut send = send.clone().ready().await.unwrap();
            let req = http::Request::post(format!("http://{addr}/fill"))
                .body(())
                .unwrap();
            let (answer, mut stream) = send.send_request(req, false).unwrap();
            stream.send_data(Bytes::from(n.to_string()), true).unwrap();
            asked.push((n, answer));
        }
        for (n, answer) in asked {
            let answer = tokio::time::timeout(Duration::from_secs(20), answer)
                .await
                .expect("bounded")
                .expect("an answer");
            assert_eq!(answer.status(), 200);
            let mut body = answer.into_body();
            let mut got = Vec::new();
            while let Some(chunk) = body.data().await {
                let chunk = chunk.unwrap();
                let _ = body.flow_control().release_capacity(chunk.len());
                got.extend_from_slice(&chunk);
            }
            assert!(got == expected(n), "{n} bytes over h2c: the answer differs");
        }
        conn.abort();
    });
    assert!(wait_until(Duration::from_secs(5), || chain.quiet()));
}

#[test]
fn a_client_gone_mid_answer_frees_the_slot_at_once() {
    // A body_timeout far past the wait below: only the client's going frees the slot.
    let chain = FillChain::start("answer-gone", Duration::from_secs(60));
    let mut s = stall(&chain);
    // Some of it read, then gone.
    let (status, body) = read_answer(&mut s);
    assert_eq!(status, 200);
    assert!(body == expected(FULL));
    drop(s);
    assert!(
        wait_until(Duration::from_secs(10), || chain.quiet()),
        "the slot of an answer whose client left is still in use ({})",
        chain.in_use()
    );
}

#[test]
fn a_client_that_stops_reading_holds_its_slot_until_body_timeout() {
    const BODY_TIMEOUT: Duration = Duration::from_secs(1);
    let chain = FillChain::start("answer-stall", BODY_TIMEOUT);
    let started = Instant::now();
    let s = stall(&chain);
    // The client keeps its socket open and reads nothing: the stalled write is cut.
    assert!(
        wait_until(BODY_TIMEOUT * 3 + Duration::from_secs(5), || chain.quiet()),
        "a stalled answer still holds its slot after {:?}",
        started.elapsed()
    );
    assert!(
        started.elapsed() >= BODY_TIMEOUT,
        "freed before body_timeout, so it was not the stall watch"
    );
    // Others are served meanwhile and after.
    let mut other = TcpStream::connect(chain.addr).unwrap();
    other
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    other.write_all(&fill_request(FULL)).unwrap();
    let (status, body) = read_answer(&mut other);
    assert_eq!(status, 200);
    assert!(body == expected(FULL));
    drop(s);
    assert!(wait_until(Duration::from_secs(5), || chain.quiet()));
}

#[test]
fn an_http2_stream_reset_mid_answer_frees_its_slot() {
    // A body_timeout far past the wait below: only the reset frees the slot.
    let chain = FillChain::start("answer-reset", Duration::from_secs(60));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let addr = chain.addr;
    rt.block_on(async {
        // Streams get a window of 1 KiB that the client never opens: a full-slot answer
        // waits in its slot after its first KiB.
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (send, conn) = h2::client::Builder::new()
            .initial_window_size(1024)
            .handshake(tcp)
            .await
            .expect("handshake");
        let conn = tokio::spawn(conn);
        let mut send = send.ready().await.unwrap();
        let req = http::Request::post(format!("http://{addr}/fill"))
            .body(())
            .unwrap();
        let (answer, mut stream) = send.send_request(req, false).unwrap();
        stream
            .send_data(Bytes::from(FULL.to_string()), true)
            .unwrap();
        let answer = tokio::time::timeout(Duration::from_secs(20), answer)
            .await
            .expect("bounded")
            .expect("an answer");
        assert_eq!(answer.status(), 200);
        let held = tokio::time::timeout(Duration::from_secs(10), async {
            while !(chain.in_use() == 1 && chain.gw.inflight() == 0) {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await;
        assert!(held.is_ok(), "the waiting answer holds its slot");
        stream.send_reset(h2::Reason::CANCEL);
        let freed = tokio::time::timeout(Duration::from_secs(10), async {
            while !chain.quiet() {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await;
        assert!(
            freed.is_ok(),
            "the slot of a reset stream is still in use ({})",
            chain.in_use()
        );
        // The connection lives on: another stream is answered.
        let mut send = send.ready().await.unwrap();
        let req = http::Request::post(format!("http://{addr}/fill"))
            .body(())
            .unwrap();
        let (answer, mut stream) = send.send_request(req, false).unwrap();
        stream.send_data(Bytes::from_static(b"5"), true).unwrap();
        let answer = tokio::time::timeout(Duration::from_secs(20), answer)
            .await
            .expect("bounded")
            .expect("an answer");
        let mut body = answer.into_body();
        let chunk = body.data().await.expect("data").unwrap();
        assert_eq!(&chunk[..], &expected(5)[..]);
        conn.abort();
    });
    assert!(wait_until(Duration::from_secs(5), || chain.quiet()));
}

#[test]
fn clients_that_stop_reading_hold_at_most_a_quarter_of_the_pool() {
    // 16 slots and one gateway thread: answers may hold 4 while they are written.
    const HELD_AT_MOST: u32 = 4;
    let chain = FillChain::start("answer-budget", Duration::from_secs(60));
    let all: Vec<u8> = (0..PIPELINED).flat_map(|_| fill_request(FULL)).collect();
    let stalled: Vec<TcpStream> = (0..HELD_AT_MOST + 2)
        .map(|_| {
            let mut s = narrow_connection(chain.addr);
            s.write_all(&all).expect("send the requests");
            s
        })
        .collect();
    assert!(
        wait_until(Duration::from_secs(10), || chain.in_use() == HELD_AT_MOST
            && chain.gw.inflight() == 0),
        "stalled answers hold {} slots",
        chain.in_use()
    );
    // The stalled connections past the budget hold copies, not slots: the rest of the pool
    // serves others.
    thread::sleep(Duration::from_millis(200));
    assert_eq!(chain.in_use(), HELD_AT_MOST);
    let mut other = TcpStream::connect(chain.addr).unwrap();
    other
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    for _ in 0..20 {
        other.write_all(&fill_request(FULL)).unwrap();
        let (status, body) = read_answer(&mut other);
        assert_eq!(status, 200);
        assert!(body == expected(FULL));
    }
    assert!(chain.in_use() <= HELD_AT_MOST);
    drop(stalled);
    assert!(
        wait_until(Duration::from_secs(10), || chain.quiet()),
        "slots still in use ({}) after the clients left",
        chain.in_use()
    );
}
