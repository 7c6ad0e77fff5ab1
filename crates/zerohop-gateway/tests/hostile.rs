//! The gateway against functions that lie: a real gateway (HTTP on a free port, a real pool
//! and ring transport) and, in threads of this process, "functions" that answer with what a
//! buggy or hostile function could put in shared memory. Whatever comes back is input.
//!
//! The chain: route A (`POST /a`) is function `fa` (party 1), route B (`POST /b`) is function
//! `fb` (party 2).
//!
//! Each test here failed on the gateway of protocol version 1 (status passed through,
//! answers accepted by request id alone, `meta_len` re-read from shared memory, a blocking
//! send on the runtime thread, a slot taken before the body arrived, no connection cap).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::Duration;

use zerohop_gateway::{Gateway, GatewayConfig, Receiving};
use zerohop_pool::{Descriptor, Pool, PoolGeometry, SlotHeader};
use zerohop_test_support::wait_until;
use zerohop_transport::{
    Backend, Delivery, Endpoint, FunctionPlan, Plan, PlanExt, Policy, RoutePlan, Sender, Stop,
    Transport, GATEWAY_FN,
};

const SLOTS: u32 = 8;

struct Chain {
    gw: Arc<Gateway>,
    pool: Arc<Pool>,
    policy: Arc<Policy>,
    transport: Box<dyn Transport>,
    addr: SocketAddr,
    _receiving: Receiving,
    shutdown: tokio::sync::watch::Sender<bool>,
    server: Option<thread::JoinHandle<()>>,
}

impl Drop for Chain {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
        if let Some(s) = self.server.take() {
            let _ = s.join();
        }
    }
}

fn plan(queue_capacity: u32) -> Plan {
    let f = |name: &str| FunctionPlan {
        name: name.into(),
        concurrency: 1,
        next: vec![],
        calls: Vec::new(),
        ..Default::default()
    };
    let r = |path: &str, f: u8| RoutePlan {
        method: "POST".into(),
        path: path.into(),
        sequence: vec![f],
        ..Default::default()
    };
    Plan {
        chain: "hostile".into(),
        transport: "ring".into(),
        spin_us: 0,
        queue_capacity,
        functions: vec![f("fa"), f("fb")],
        routes: vec![r("/a", 0), r("/b", 1)],
        headers: vec![],
        party_function: vec![GATEWAY_FN, 0, 1],
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

fn start(config: GatewayConfig, queue_capacity: u32) -> Chain {
    let plan = plan(queue_capacity);
    let pool = Arc::new(
        Pool::create(
            "gw-hostile",
            &PoolGeometry {
                slots: SLOTS,
                first_slot: 0,
                slot_size: 4096,
                max_parties: 3,
                hugepages: false,
                release: false,
            },
        )
        .expect("pool"),
    );
    let policy = Arc::new(plan.policy().expect("policy"));
    let transport = zerohop_transport::create(Backend::Ring, "gw-hostile", &policy, plan.options())
        .expect("transport");
    let gw = Gateway::new(
        pool.clone(),
        transport.sender(0).expect("sender"),
        Arc::new(plan),
        config,
    );
    let receiving = gw.start_receiving(Endpoint::new(
        pool.clone(),
        policy.clone(),
        0,
        transport.receiver(0).expect("receiver"),
    ));
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().unwrap();
    listener.set_nonblocking(true).unwrap();
    let (shutdown, rx) = tokio::sync::watch::channel(false);
    let g = gw.clone();
    let server = thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let l = tokio::net::TcpListener::from_std(listener).unwrap();
            g.serve(l, rx).await
        });
    });
    Chain {
        gw,
        pool,
        policy,
        transport,
        addr,
        _receiving: receiving,
        shutdown,
        server: Some(server),
    }
}

fn config() -> GatewayConfig {
    GatewayConfig {
        max_body: 1024,
        timeout: Duration::from_secs(2),
        body_timeout: Duration::from_millis(500),
        max_connections: 64,
        access: Default::default(),
    }
}

/// A function's side of the chain: its endpoint and sender, in a thread of this process.
struct Function {
    sender: Box<dyn Sender>,
    stop: Arc<dyn Stop>,
    got: mpsc::Receiver<Delivery>,
}

impl Function {
    fn new(c: &Chain, party: u16) -> Self {
        let mut ep = Endpoint::new(
            c.pool.clone(),
            c.policy.clone(),
            party,
            c.transport.receiver(party).unwrap(),
        );
        let stop = ep.stopper();
        let (tx, got) = mpsc::channel();
        thread::spawn(move || {
            while let Some(d) = ep.recv() {
                if tx.send(d).is_err() {
                    return;
                }
            }
        });
        Self {
            sender: c.transport.sender(party).unwrap(),
            stop,
            got,
        }
    }

    fn next(&self) -> Delivery {
        self.got
            .recv_timeout(Duration::from_secs(10))
            .expect("a request reached the function")
    }

    /// Sends `d`'s slot back to the gateway with `header` written into it first.
    fn answer(&self, d: Delivery, header: SlotHeader, len: u32) {
        let mut slot = d.slot;
        slot.set_header(&header);
        let desc = slot.descriptor(header.request, len, Descriptor::GATEWAY);
        self.sender.send(0, desc).expect("send to the gateway");
        slot.into_sent();
    }
}

impl Drop for Function {
    fn drop(&mut self) {
        self.stop.stop();
    }
}

fn client() -> ureq::Agent {
    ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(15))
        .build()
}

fn post(addr: SocketAddr, path: &str, body: &str) -> (u16, String) {
    match client()
        .post(&format!("http://{addr}{path}"))
        .send_string(body)
    {
        Ok(r) => (r.status(), r.into_string().unwrap()),
        Err(ureq::Error::Status(s, r)) => (s, r.into_string().unwrap()),
        Err(e) => panic!("POST {path}: {e}"),
    }
}

fn spawn_post(
    addr: SocketAddr,
    path: &'static str,
    body: &'static str,
) -> thread::JoinHandle<(u16, String)> {
    thread::spawn(move || post(addr, path, body))
}

#[test]
fn statuses_outside_the_final_range_are_502_naming_the_function() {
    let c = start(config(), 64);
    let fa = Function::new(&c, 1);
    for (status, want) in [
        (101u16, 502u16),
        (204, 502),
        (700, 502),
        (0, 200),
        (201, 201),
        (422, 422),
    ] {
        let client = spawn_post(c.addr, "/a", "hello");
        let d = fa.next();
        let header = SlotHeader { status, ..d.header };
        let len = d.desc.len;
        fa.answer(d, header, len);
        let (got, body) = client.join().unwrap();
        assert_eq!(got, want, "status {status}: {body}");
        if want == 502 {
            assert_eq!(
                body,
                format!("function 'fa': answered with status {status}, which is not a final status with a body (200..=599 but 204, 205, 304)\n")
            );
        }
    }
    assert_eq!(c.pool.owners().in_use(), 0, "every slot freed");
}

#[test]
fn an_answer_in_another_requests_name_is_refused() {
    let c = start(config(), 64);
    let (fa, fb) = (Function::new(&c, 1), Function::new(&c, 2));
    let b_client = spawn_post(c.addr, "/b", "for b");
    let b = fb.next();
    let a_client = spawn_post(c.addr, "/a", "for a");
    let a = fa.next();
    // `fa` answers B's request from its own slot, in B's name and route: refused.
    let forged = SlotHeader {
        request: b.desc.request,
        route: 1,
        ..a.header
    };
    let mut slot = a.slot;
    slot.set_header(&forged);
    slot.data_mut()[..6].copy_from_slice(b"forged");
    let desc = Descriptor {
        request: b.desc.request,
        len: 6,
        ..slot.descriptor(b.desc.request, 6, Descriptor::GATEWAY)
    };
    fa.sender.send(0, desc).unwrap();
    slot.into_sent();
    assert!(
        wait_until(Duration::from_secs(5), || c
            .gw
            .stats()
            .refused
            .load(Ordering::Relaxed)
            == 1),
        "the forged answer is refused"
    );
    // B's genuine answer still reaches B's client.
    let len = b.desc.len;
    let header = b.header;
    fb.answer(b, header, len);
    assert_eq!(b_client.join().unwrap(), (200, "for b".into()));
    // A's own request was never answered: a clear timeout.
    let (status, body) = a_client.join().unwrap();
    assert_eq!(status, 504, "{body}");
    assert!(wait_until(Duration::from_secs(5), || c
        .pool
        .owners()
        .in_use()
        == 0));
}

#[test]
fn meta_len_rewritten_after_sending_cannot_hurt_the_gateway() {
    let c = start(config(), 64);
    let fa = Function::new(&c, 1);
    for i in 0..10 {
        let body: &'static str = if i % 2 == 0 { "even" } else { "odd" };
        let client = spawn_post(c.addr, "/a", body);
        let d = fa.next();
        let (slot_index, len, header) = (d.desc.slot, d.desc.len, d.header);
        fa.answer(d, header, len);
        // Keep scribbling a huge meta_len over the slot's header after sending it (a second
        // mapping of the pool, as a hostile process would have).
        let pool = Arc::new(
            Pool::attach(
                c.pool.fd().try_clone_to_owned().unwrap(),
                &c.pool.geometry(),
            )
            .unwrap(),
        );
        let scribbler = thread::spawn(move || {
            for _ in 0..20_000 {
                pool.scribble_header(slot_index, |h| h.meta_len = u16::MAX);
            }
        });
        let got = client.join().unwrap();
        scribbler.join().unwrap();
        // Scribbled before the gateway took the slot: the answer fails validation and the
        // request times out. After: the gateway uses the header it read at take. Never a
        // reset connection, a panic or another body.
        assert!(got == (200, body.to_owned()) || got.0 == 504, "{got:?}");
    }
}

#[test]
fn a_function_that_stops_draining_costs_503_not_the_gateway() {
    // Queues of two entries; `fa` never receives.
    let c = start(config(), 2);
    let fb = Function::new(&c, 2);
    let stuck: Vec<_> = (0..6).map(|_| spawn_post(c.addr, "/a", "x")).collect();
    // Route B keeps working while A's queue is full.
    for _ in 0..5 {
        let client = spawn_post(c.addr, "/b", "b");
        let d = fb.next();
        let (len, header) = (d.desc.len, d.header);
        fb.answer(d, header, len);
        assert_eq!(client.join().unwrap(), (200, "b".into()));
    }
    let answers: Vec<_> = stuck.into_iter().map(|h| h.join().unwrap()).collect();
    let full = answers.iter().filter(|(s, _)| *s == 503).count();
    let timed_out = answers.iter().filter(|(s, _)| *s == 504).count();
    assert_eq!((full, timed_out), (4, 2), "{answers:?}");
    assert!(answers
        .iter()
        .any(|(_, b)| b
            == "function 'fa': its queue is full (the function is behind or stuck); retry\n"));
}

#[test]
fn slow_bodies_hold_no_slot_and_get_408() {
    let c = start(config(), 64);
    let fb = Function::new(&c, 2);
    // More slow uploads than the pool has slots: headers sent, body never finished.
    let slow: Vec<TcpStream> = (0..SLOTS + 4)
        .map(|_| {
            let mut s = TcpStream::connect(c.addr).unwrap();
            s.write_all(b"POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\npartial")
                .unwrap();
            s
        })
        .collect();
    let client = spawn_post(c.addr, "/b", "still served");
    let d = fb.next();
    assert_eq!(
        c.pool.owners().in_use(),
        1,
        "only route B's request holds a slot"
    );
    let (len, header) = (d.desc.len, d.header);
    fb.answer(d, header, len);
    assert_eq!(client.join().unwrap(), (200, "still served".into()));
    for mut s in slow {
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        assert!(out.starts_with("HTTP/1.1 408"), "{out:?}");
    }
}

#[test]
fn connections_beyond_the_cap_wait_for_a_free_one() {
    let c = start(
        GatewayConfig {
            max_connections: 2,
            ..config()
        },
        64,
    );
    let fb = Function::new(&c, 2);
    // Two idle connections take both places.
    let idle: Vec<TcpStream> = (0..2)
        .map(|_| TcpStream::connect(c.addr).unwrap())
        .collect();
    let client = spawn_post(c.addr, "/b", "third");
    thread::sleep(Duration::from_millis(300));
    assert!(
        c.gw.stats().accepted.load(Ordering::Relaxed) == 0,
        "the third connection is not served while two are open"
    );
    drop(idle);
    let d = fb.next();
    let (len, header) = (d.desc.len, d.header);
    fb.answer(d, header, len);
    assert_eq!(client.join().unwrap(), (200, "third".into()));
}
