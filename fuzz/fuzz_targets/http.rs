//! The gateway's HTTP ingress on arbitrary bytes from a client.
//!
//! Once per process: a pool, a ring transport for a one-function chain (`POST /echo`, function
//! `echo` as party 1, which copies the `x-trace` header into the slot's metadata), a gateway,
//! its receive thread, and an echo "function" thread that sends every slot straight back.
//! Per input: one connection over an in-memory duplex stream, served by
//! [`Gateway::serve_io`]. The input is written, the client waits until the server has
//! nothing left to do with it (everything answered, nothing in flight), shuts down its write
//! side and reads the answer to the end.
//!
//! Checked: the connection ends (no hang); what comes back is HTTP; the chain never answers
//! 502/503/504 (the echo function always answers, in time, with its own slot); a request the
//! gateway must accept, a plain `POST /echo` with a `Content-Length` body, gets 200 with the
//! same body back; and no slot or in-flight entry outlives its connection.

#![no_main]

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use libfuzzer_sys::fuzz_target;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use zerohop_gateway::{Gateway, GatewayConfig, Receiving};
use zerohop_pool::{Descriptor, PartyState, Pool, PoolGeometry};
use zerohop_transport::{
    Backend, Endpoint, FunctionPlan, Plan, PlanExt, RoutePlan, Sender, Transport, GATEWAY_FN,
};

const MAX_BODY: usize = 4096;
/// Longest the client waits for the server to settle before it closes anyway.
const SETTLE_MAX: Duration = Duration::from_millis(300);
/// A connection that takes longer than this is a hang.
const CONNECTION_MAX: Duration = Duration::from_secs(5);

struct Chain {
    gw: Arc<Gateway>,
    pool: Arc<Pool>,
    rt: tokio::runtime::Runtime,
    _receiving: Receiving,
    _transport: Box<dyn Transport>,
}

fn plan() -> Plan {
    Plan {
        chain: "fuzz-http".into(),
        transport: "ring".into(),
        spin_us: 20,
        queue_capacity: 8,
        functions: vec![FunctionPlan {
            name: "echo".into(),
            concurrency: 1,
            next: vec![],
            calls: Vec::new(),
            ..Default::default()
        }],
        routes: vec![RoutePlan {
            method: "POST".into(),
            path: "/echo".into(),
            sequence: vec![0],
            ..Default::default()
        }],
        headers: vec!["x-trace".into()],
        party_function: vec![GATEWAY_FN, 0],
        timeout_ms: 30_000,
        state: None,
        pool: zerohop_transport::PoolPlan {
            slots: 64,
            slot_size: 4096,
            hugepages: false,
        },
    }
}

impl Chain {
    fn start() -> Self {
        let plan = plan();
        let pool = Arc::new(
            Pool::create(
                "fuzz-http",
                &PoolGeometry {
                    slots: 8,
                    first_slot: 0,
                    slot_size: 8192,
                    max_parties: 2,
                    hugepages: false,
                },
            )
            .expect("create the pool"),
        );
        let policy = Arc::new(plan.policy().expect("policy"));
        let transport =
            zerohop_transport::create(Backend::Ring, "fuzz-http", &policy, plan.options())
                .expect("create the transport");
        let gw = Gateway::new(
            pool.clone(),
            transport.sender(0).expect("gateway sender"),
            Arc::new(plan),
            GatewayConfig {
                max_body: MAX_BODY as u64,
                // Never reached unless the chain loses an answer: the echo answers at once.
                timeout: Duration::from_secs(1),
                body_timeout: Duration::from_millis(100),
                max_connections: 16,
                access: Default::default(),
            },
        );
        let receiving = gw.start_receiving(Endpoint::new(
            pool.clone(),
            policy.clone(),
            0,
            transport.receiver(0).expect("gateway receiver"),
        ));
        let mut echo = Endpoint::new(
            pool.clone(),
            policy,
            1,
            transport.receiver(1).expect("echo receiver"),
        );
        let sender: Box<dyn Sender> = transport.sender(1).expect("echo sender");
        std::thread::Builder::new()
            .name("echo".into())
            .spawn(move || {
                while let Some(d) = echo.recv() {
                    let desc = d
                        .slot
                        .descriptor(d.desc.request, d.desc.len, Descriptor::GATEWAY);
                    if sender.send(0, desc).is_ok() {
                        d.slot.into_sent();
                    }
                }
            })
            .expect("spawn the echo thread");
        pool.party(1).expect("party 1").set_state(PartyState::Ready);
        // The echo oracle below must recognise the simplest request, or it checks nothing.
        assert_eq!(
            plain_echo(b"POST /echo HTTP/1.1\r\nContent-Length: 2\r\n\r\nhi"),
            Some(&b"hi"[..])
        );
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("tokio runtime");
        Self {
            gw,
            pool,
            rt,
            _receiving: receiving,
            _transport: transport,
        }
    }

    /// Nothing in flight, no slot in use.
    fn quiet(&self) -> bool {
        self.gw.inflight() == 0 && self.pool.owners().in_use() == 0
    }
}

fn chain() -> &'static Chain {
    static CHAIN: OnceLock<Chain> = OnceLock::new();
    CHAIN.get_or_init(Chain::start)
}

/// What the server side of the connection has done so far.
#[derive(Default)]
struct IoStats {
    read: AtomicU64,
    written: AtomicU64,
    /// The server's last read found nothing and waits for more.
    waiting: AtomicBool,
}

/// The server's end of the duplex stream, counting what the server reads and writes.
struct Watched<I> {
    inner: I,
    stats: Arc<IoStats>,
}

impl<I: AsyncRead + Unpin> AsyncRead for Watched<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        let got = (buf.filled().len() - before) as u64;
        self.stats.read.fetch_add(got, Ordering::Relaxed);
        self.stats.waiting.store(r.is_pending(), Ordering::Relaxed);
        r
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Watched<I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = r {
            self.stats.written.fetch_add(n as u64, Ordering::Relaxed);
        }
        r
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Waits until the server waits for more input with nothing in flight, unchanged over a few
/// scheduler rounds, or until it closed the connection. A client that closed right after
/// writing would get no answers: hyper drops a request whose client half-closed before the
/// answer (no half-close support), so the client waits for the server to be done first.
async fn settle(c: &Chain, stats: &IoStats, closed: &AtomicBool) {
    let start = Instant::now();
    let mut last = None;
    let mut stable = 0;
    while !closed.load(Ordering::Relaxed) && start.elapsed() < SETTLE_MAX {
        let snap = (
            stats.read.load(Ordering::Relaxed),
            stats.written.load(Ordering::Relaxed),
            stats.waiting.load(Ordering::Relaxed),
            c.quiet(),
        );
        if snap.2 && snap.3 && last == Some(snap) {
            stable += 1;
            if stable >= 3 {
                return;
            }
        } else {
            stable = 0;
        }
        last = Some(snap);
        tokio::task::yield_now().await;
    }
}

/// The body of `input` if it is one request the gateway must accept and echo: `POST /echo`
/// over HTTP/1.1 with a `Content-Length` body of at most `max_body` and only plain headers.
fn plain_echo(input: &[u8]) -> Option<&[u8]> {
    let mut headers = [httparse::EMPTY_HEADER; 16];
    let mut req = httparse::Request::new(&mut headers);
    let httparse::Status::Complete(head) = req.parse(input).ok()? else {
        return None;
    };
    if req.method != Some("POST") || req.path != Some("/echo") || req.version != Some(1) {
        return None;
    }
    let mut len = None;
    let mut traces = 0;
    for h in req.headers.iter() {
        match h.name.to_ascii_lowercase().as_str() {
            "content-length" => {
                let digits = h.value;
                if len.is_some()
                    || digits.is_empty()
                    || digits.len() > 6
                    || !digits.iter().all(u8::is_ascii_digit)
                {
                    return None;
                }
                len = std::str::from_utf8(digits).ok()?.parse::<usize>().ok();
            }
            "x-trace" if h.value.len() <= 256 && traces < 2 => traces += 1,
            "host" | "content-type" | "user-agent" | "accept" => {}
            _ => return None,
        }
    }
    let body = &input[head..];
    (len? == body.len() && body.len() <= MAX_BODY).then_some(body)
}

/// The first response of `answer`: status and (for a `Content-Length` response) body.
fn first_response(answer: &[u8]) -> (u16, Option<&[u8]>) {
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut resp = httparse::Response::new(&mut headers);
    let head = match resp.parse(answer) {
        Ok(httparse::Status::Complete(n)) => n,
        other => panic!(
            "the answer does not start with a complete HTTP response ({other:?}): {:?}",
            String::from_utf8_lossy(answer)
        ),
    };
    let code = resp.code.expect("a complete response has a status");
    let len = resp
        .headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case("content-length"))
        .and_then(|h| std::str::from_utf8(h.value).ok()?.parse::<usize>().ok());
    let body = len.and_then(|l| answer.get(head..head + l));
    (code, body)
}

fuzz_target!(|data: &[u8]| {
    let c = chain();
    let stats = Arc::new(IoStats::default());
    let answer = c.rt.block_on(async {
        let (client, server) = tokio::io::duplex(64 * 1024);
        let server = Watched {
            inner: server,
            stats: stats.clone(),
        };
        let closed = AtomicBool::new(false);
        let (mut rd, mut wr) = tokio::io::split(client);
        let serve = async {
            c.gw.serve_io(server).await;
            closed.store(true, Ordering::Relaxed);
        };
        let write = async {
            // Fails only when the server closed early (a framing error): that is an answer.
            let _ = wr.write_all(data).await;
            settle(c, &stats, &closed).await;
            let _ = wr.shutdown().await;
        };
        let read = async {
            let mut out = Vec::new();
            let _ = rd.read_to_end(&mut out).await;
            out
        };
        tokio::time::timeout(CONNECTION_MAX, async { tokio::join!(serve, write, read).2 }).await
    });
    let Ok(answer) = answer else {
        panic!(
            "the connection did not end within {CONNECTION_MAX:?} (server read {} bytes, wrote {})",
            stats.read.load(Ordering::Relaxed),
            stats.written.load(Ordering::Relaxed)
        );
    };

    if !answer.is_empty() {
        assert!(
            answer.starts_with(b"HTTP/1.1 ") || answer.starts_with(b"HTTP/1.0 "),
            "not an HTTP answer: {:?}",
            String::from_utf8_lossy(&answer)
        );
        let (code, body) = first_response(&answer);
        assert!(
            !matches!(code, 502..=504),
            "the chain failed ({code}) although its function always answers: {:?}",
            String::from_utf8_lossy(&answer)
        );
        if let Some(sent) = plain_echo(data) {
            assert_eq!(code, 200, "{:?}", String::from_utf8_lossy(&answer));
            assert_eq!(body, Some(sent), "the echo came back changed");
        }
    } else {
        assert!(
            plain_echo(data).is_none(),
            "a plain POST /echo got no answer"
        );
    }

    // Nothing outlives the connection. An answer still on its way back (a request whose
    // connection ended first) is dropped by the receive thread when it arrives: give it a
    // moment.
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut spins = 0u32;
    while !c.quiet() {
        assert!(
            Instant::now() < deadline,
            "after the connection ended: {} request(s) in flight, {} slot(s) in use",
            c.gw.inflight(),
            c.pool.owners().in_use()
        );
        spins += 1;
        if spins < 100 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(100));
        }
    }
});
