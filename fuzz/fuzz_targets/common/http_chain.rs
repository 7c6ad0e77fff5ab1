//! The one-function chain the HTTP fuzz targets (`http`, `http2`) serve their inputs to.
//!
//! Once per process: a pool, a ring transport for a one-function chain (`POST /echo`, function
//! `echo` as party 1, which copies the `x-trace` header into the slot's metadata), a gateway,
//! its receive thread, and an echo "function" thread that sends every slot straight back.
//! Per input: one connection over an in-memory duplex stream, served by
//! [`Gateway::serve_io`]. The input is written, the client waits until the server has
//! nothing left to do with it (everything answered, nothing in flight), shuts down its write
//! side and reads the answer to the end.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use zerohop_gateway::{Gateway, GatewayConfig, Receiving};
use zerohop_pool::{Descriptor, PartyState, Pool, PoolGeometry};
use zerohop_transport::{
    Backend, Endpoint, FunctionPlan, Plan, PlanExt, RoutePlan, Sender, Transport, GATEWAY_FN,
};

/// Largest request body the chain takes.
pub const MAX_BODY: usize = 4096;
/// Longest the client waits for the server to settle before it closes anyway.
pub const SETTLE_MAX: Duration = Duration::from_millis(300);
/// A connection that takes longer than this is a hang.
pub const CONNECTION_MAX: Duration = Duration::from_secs(5);

pub struct Chain {
    pub gw: Arc<Gateway>,
    pub pool: Arc<Pool>,
    pub rt: tokio::runtime::Runtime,
    _receiving: Receiving,
    _transport: Box<dyn Transport>,
}

fn plan(name: &str) -> Plan {
    Plan {
        chain: name.into(),
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
        cpus: Vec::new(),
        timeout_ms: 30_000,
        state: None,
        pool: zerohop_transport::PoolPlan {
            slots: 64,
            slot_size: 4096,
            hugepages: false,
            large_slots: 0,
            large_slot_size: 0,
        },
    }
}

impl Chain {
    /// The chain named `name` (each target its own, as two run at once); `check` is called
    /// once it is up, before any input.
    pub fn start(name: &str, check: fn()) -> Self {
        let plan = plan(name);
        let pool = Arc::new(
            Pool::create(
                name,
                &PoolGeometry {
                    slots: 8,
                    first_slot: 0,
                    slot_size: 8192,
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
        check();
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
    pub fn quiet(&self) -> bool {
        self.gw.inflight() == 0 && self.pool.owners().in_use() == 0
    }
}

/// What the server side of the connection has done so far.
#[derive(Default)]
pub struct IoStats {
    pub read: AtomicU64,
    pub written: AtomicU64,
    /// The server's last read found nothing and waits for more.
    pub waiting: AtomicBool,
}

/// The server's end of the duplex stream, counting what the server reads and writes.
pub struct Watched<I> {
    pub inner: I,
    pub stats: Arc<IoStats>,
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
pub async fn settle(c: &Chain, stats: &IoStats, closed: &AtomicBool) {
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

/// Serves one connection whose client writes `data`, settles, closes its write side and
/// reads the answer to the end; panics if it takes longer than [`CONNECTION_MAX`].
pub fn exchange(c: &Chain, data: &[u8]) -> Vec<u8> {
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
    answer.unwrap_or_else(|_| {
        panic!(
            "the connection did not end within {CONNECTION_MAX:?} (server read {} bytes, wrote {})",
            stats.read.load(Ordering::Relaxed),
            stats.written.load(Ordering::Relaxed)
        )
    })
}

/// Nothing outlives the connection. An answer still on its way back (a request whose
/// connection ended first) is dropped by the receive thread when it arrives: give it a
/// moment.
pub fn assert_quiet(c: &Chain) {
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
}
