//! The link's tests, over real sockets on the loopback: the harness (a server on a free
//! port, a call, handlers) and what holds for both ends of one node; each side's own in
//! `client`, `server` and `wire`.

mod client;
mod server;
mod wire;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::timeout;

use crate::auth::{self, Secret};
use crate::{handler, serve, Answer, Call, Frame, Handler, PeerError, Peers};

const KEY: &[u8] = b"the cluster's peer secret, 32 B!";
/// The bound on every wait of these tests.
const BOUND: Duration = Duration::from_secs(10);

fn secret() -> Arc<Secret> {
    Arc::new(Secret::new(KEY))
}

fn call(i: usize, payload: &str) -> Call {
    Call {
        chain: "default_hello_0".into(),
        function: format!("f{i}"),
        deadline_ms: 5_000,
        route: 1,
        hop: (i % 256) as u8,
        flags: 0,
        meta: Vec::new(),
        payload: payload.as_bytes().to_vec(),
    }
}

/// Uppercases the payload and adds what is specific to the call, after a delay that
/// differs per call (so answers come back out of order).
fn echo(runs: Arc<AtomicUsize>) -> Handler {
    handler(move |c: Call| {
        runs.fetch_add(1, Ordering::SeqCst);
        async move {
            tokio::time::sleep(Duration::from_millis(u64::from(c.hop % 7))).await;
            let mut out = c.payload.to_ascii_uppercase();
            out.extend_from_slice(format!("|{}|{}", c.function, c.hop).as_bytes());
            Answer {
                status: 200,
                flags: c.hop % 2,
                payload: out,
            }
        }
    })
}

/// A handler's answer: the call's payload as it came.
fn same(c: Call) -> Answer {
    Answer {
        status: 200,
        flags: 0,
        payload: c.payload,
    }
}

fn expected(i: usize, payload: &str) -> Answer {
    Answer {
        status: 200,
        flags: (i % 256 % 2) as u8,
        payload: format!("{}|f{i}|{}", payload.to_ascii_uppercase(), i % 256).into_bytes(),
    }
}

struct Server {
    addr: SocketAddr,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

async fn start_on(addr: SocketAddr, secret: Arc<Secret>, handler: Handler) -> Server {
    let listener = TcpListener::bind(addr).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, rx) = watch::channel(false);
    let task = tokio::spawn(serve(listener, secret, handler, rx));
    Server { addr, stop, task }
}

async fn start(handler: Handler) -> Server {
    start_on("127.0.0.1:0".parse().unwrap(), secret(), handler).await
}

/// Waits until `n` reaches `want`.
async fn reach(n: &AtomicUsize, want: usize) {
    timeout(BOUND, async {
        while n.load(Ordering::SeqCst) < want {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{} of {want}", n.load(Ordering::SeqCst)));
}

/// Whether the other end closes `s` (EOF or reset) within BOUND, reading whatever
/// comes before.
async fn closed_by_peer(s: &mut TcpStream) -> bool {
    let mut sink = [0u8; 4096];
    timeout(BOUND, async {
        loop {
            match s.read(&mut sink).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await
    .is_ok()
}

/// Node A dials the attacker while the attacker dials A's server; the attacker gives
/// each session A's hello of the other and forwards A's proofs between them. A's own
/// `Peers` and server share one `Secret`, as in the daemon: both refuse, and A's
/// handler never runs.
#[tokio::test]
async fn a_handshake_reflected_between_two_connections_of_one_node_fails() {
    let a = secret();
    let runs = Arc::new(AtomicUsize::new(0));
    let server = start_on(
        "127.0.0.1:0".parse().unwrap(),
        a.clone(),
        echo(runs.clone()),
    )
    .await;
    let a_server = server.addr;
    let trap = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let trap_addr = trap.local_addr().unwrap();
    let attacker = tokio::spawn(async move {
        let (mut s1, _) = trap.accept().await.unwrap();
        let mut s2 = TcpStream::connect(a_server).await.unwrap();
        let mut h1 = [0u8; auth::HELLO_LEN];
        let mut h2 = [0u8; auth::HELLO_LEN];
        s1.read_exact(&mut h1).await.unwrap();
        s2.read_exact(&mut h2).await.unwrap();
        let _ = s1.write_all(&h2).await;
        let _ = s2.write_all(&h1).await;
        let mut t1 = [0u8; auth::TAG_LEN];
        let mut t2 = [0u8; auth::TAG_LEN];
        let (r1, r2) = tokio::join!(s1.read_exact(&mut t1), s2.read_exact(&mut t2));
        if r1.is_ok() && r2.is_ok() {
            let _ = s2.write_all(&t1).await;
            let _ = s1.write_all(&t2).await;
            // Were it in, this would run on A.
            let mut c = Vec::new();
            Frame::Call(1, call(1, "stolen")).encode(&mut c);
            let _ = s2.write_all(&c).await;
        }
        closed_by_peer(&mut s2).await
    });
    let peers = Peers::new(a.clone());
    let e = peers
        .call(trap_addr, call(1, "x"), BOUND)
        .await
        .unwrap_err();
    assert!(
        matches!(&e, PeerError::Auth(x) if matches!(x.reason, auth::AuthFailure::Reflected)),
        "{e}"
    );
    assert!(
        attacker.await.unwrap(),
        "A's server kept the attacker's connection"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    // A still serves real peers.
    let b = Peers::new(secret());
    assert_eq!(
        b.call(a_server, call(2, "y"), BOUND).await.unwrap(),
        expected(2, "y")
    );
}
