//! What the TLS and HTTP/2 tests share: an echo chain served by a real gateway (a real pool
//! and ring transport, the "function" a thread of this process that answers every request
//! with its own body), certificates made by the `openssl` command, and the `curl` command
//! bounded in time.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use zerohop_gateway::{Gateway, GatewayConfig, MqttIngress, Receiving, Tls};
use zerohop_pool::{Descriptor, PartyState, Pool, PoolGeometry};
use zerohop_transport::{
    Backend, Endpoint, FunctionPlan, Plan, PlanExt, RoutePlan, Sender, Stop, Transport, GATEWAY_FN,
};

/// Longest any one client command may take.
pub const CLIENT_WAIT: Duration = Duration::from_secs(20);

/// How the test chain listens.
#[derive(Default)]
pub struct Listen {
    /// HTTP over TLS with these certificates (clear text without).
    pub tls: Option<Arc<Tls>>,
    /// Also an MQTT broker: in clear, and over TLS when `tls` is set.
    pub mqtt: bool,
    /// The gateway's connection cap.
    pub max_connections: u32,
}

/// A running echo chain: `POST /echo` (and MQTT topic `in/+`, answered on `out`) answers
/// with the request's body. Stopped on drop.
pub struct EchoChain {
    pub gw: Arc<Gateway>,
    pub pool: Arc<Pool>,
    /// The HTTP listener.
    pub addr: SocketAddr,
    /// The MQTT listeners, in clear and over TLS.
    pub mqtt: Option<SocketAddr>,
    pub mqtts: Option<SocketAddr>,
    shutdown: tokio::sync::watch::Sender<bool>,
    server: Option<thread::JoinHandle<()>>,
    echo_stop: Arc<dyn Stop>,
    echo: Option<thread::JoinHandle<()>>,
    _receiving: Receiving,
    _transport: Box<dyn Transport>,
}

impl Drop for EchoChain {
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

fn plan(name: &str) -> Plan {
    Plan {
        chain: name.into(),
        transport: "ring".into(),
        spin_us: 0,
        queue_capacity: 64,
        functions: vec![FunctionPlan {
            name: "echo".into(),
            concurrency: 1,
            ..Default::default()
        }],
        routes: vec![RoutePlan {
            method: "POST".into(),
            path: "/echo".into(),
            mqtt: "in/+".into(),
            mqtt_reply: "out".into(),
            sequence: vec![0],
            ..Default::default()
        }],
        headers: vec![],
        party_function: vec![GATEWAY_FN, 0],
        cpus: Vec::new(),
        timeout_ms: 10_000,
        state: None,
        pool: zerohop_transport::PoolPlan {
            slots: 64,
            slot_size: 8192,
            hugepages: false,
            large_slots: 0,
            large_slot_size: 0,
        },
    }
}

impl EchoChain {
    /// Starts the chain named `name` (also its pool's name: one per test).
    pub fn start(name: &str, listen: Listen) -> Self {
        let plan = plan(name);
        let pool = Arc::new(
            Pool::create(
                name,
                &PoolGeometry {
                    slots: 64,
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
                max_body: 4096,
                timeout: Duration::from_secs(10),
                body_timeout: Duration::from_secs(5),
                max_connections: if listen.max_connections == 0 {
                    256
                } else {
                    listen.max_connections
                },
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
        let echo_stop = echo.stopper();
        let sender: Box<dyn Sender> = transport.sender(1).expect("echo sender");
        let echo = thread::spawn(move || {
            while let Some(d) = echo.recv() {
                let desc = d
                    .slot
                    .descriptor(d.desc.request, d.desc.len, Descriptor::GATEWAY);
                if sender.send(0, desc).is_ok() {
                    d.slot.into_sent();
                }
            }
        });
        pool.party(1).expect("party 1").set_state(PartyState::Ready);

        let bind = || {
            let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            l.set_nonblocking(true).unwrap();
            l
        };
        let http = bind();
        let addr = http.local_addr().unwrap();
        let (mut mqtt, mut mqtt_addr, mut mqtts_addr) = (None, None, None);
        if listen.mqtt {
            let clear = bind();
            let secure = listen.tls.as_ref().map(|_| bind());
            mqtt_addr = Some(clear.local_addr().unwrap());
            mqtts_addr = secure.as_ref().map(|l| l.local_addr().unwrap());
            mqtt = Some((clear, secure));
        }
        let (shutdown, rx) = tokio::sync::watch::channel(false);
        let g = gw.clone();
        let tls = listen.tls.clone();
        let server = thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let l = tokio::net::TcpListener::from_std(http).unwrap();
                let mut tasks = tokio::task::JoinSet::new();
                if let Some((clear, secure)) = mqtt {
                    let clear = tokio::net::TcpListener::from_std(clear).unwrap();
                    let secure = secure.map(|s| {
                        (
                            tokio::net::TcpListener::from_std(s).unwrap(),
                            tls.clone().expect("TLS certificates"),
                        )
                    });
                    tasks.spawn(
                        g.clone()
                            .serve_mqtt(MqttIngress::Listen(clear, secure), rx.clone()),
                    );
                }
                match tls {
                    Some(t) => {
                        tasks.spawn(t.clone().watch(rx.clone()));
                        tasks.spawn(g.serve_tls(l, t, rx));
                    }
                    None => {
                        tasks.spawn(g.serve(l, rx));
                    }
                }
                while tasks.join_next().await.is_some() {}
            });
        });
        Self {
            gw,
            pool,
            addr,
            mqtt: mqtt_addr,
            mqtts: mqtts_addr,
            shutdown,
            server: Some(server),
            echo_stop,
            echo: Some(echo),
            _receiving: receiving,
            _transport: transport,
        }
    }

    /// Nothing in flight, no slot in use.
    pub fn quiet(&self) -> bool {
        self.gw.inflight() == 0 && self.pool.owners().in_use() == 0
    }
}

/// A test certificate authority and server certificates it signed, made by `openssl` in a
/// folder of the test's own.
pub struct Certs {
    pub dir: PathBuf,
    _keep: zerohop_test_support::TempDir,
}

impl Certs {
    /// A new CA (`ca.pem`) in a new folder.
    pub fn new() -> Self {
        let keep = zerohop_test_support::TempDir::new("certs");
        let dir = keep.path().to_owned();
        openssl(
            &dir,
            &[
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-keyout",
                "ca.key",
                "-out",
                "ca.pem",
                "-days",
                "2",
                "-subj",
                "/CN=zerohop test CA",
            ],
        );
        Self { dir, _keep: keep }
    }

    pub fn ca(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    /// A server certificate `NAME.pem` and key `NAME.key` for the DNS names `dns` (and
    /// 127.0.0.1), subject `CN=cn`, signed by the CA; `rsa` for an RSA key, else ECDSA P-256.
    pub fn server(&self, name: &str, cn: &str, dns: &[&str], rsa: bool) -> (PathBuf, PathBuf) {
        let (key, csr, pem, ext) = (
            format!("{name}.key"),
            format!("{name}.csr"),
            format!("{name}.pem"),
            format!("{name}.ext"),
        );
        let mut alt: Vec<String> = dns.iter().map(|d| format!("DNS:{d}")).collect();
        alt.push("IP:127.0.0.1".into());
        std::fs::write(
            self.dir.join(&ext),
            format!("subjectAltName={}\n", alt.join(",")),
        )
        .unwrap();
        let subj = format!("/CN={cn}");
        let mut req = vec![
            "req", "-new", "-nodes", "-keyout", &key, "-out", &csr, "-subj", &subj,
        ];
        if rsa {
            req.extend(["-newkey", "rsa:2048"]);
        } else {
            req.extend(["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"]);
        }
        openssl(&self.dir, &req);
        openssl(
            &self.dir,
            &[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                &pem,
                "-days",
                "2",
                "-extfile",
                &ext,
            ],
        );
        (self.dir.join(pem), self.dir.join(key))
    }
}

/// What a command did.
#[derive(Debug)]
pub struct Ran {
    /// Its exit code (`None`: killed by a signal).
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Ran {
    pub fn ok(&self) -> bool {
        self.code == Some(0)
    }
}

/// Runs `openssl ARGS` in `dir`; panics with its output if it fails.
pub fn openssl(dir: &Path, args: &[&str]) {
    let out = bounded(Command::new("openssl").args(args).current_dir(dir));
    assert!(out.ok(), "openssl {args:?} failed: {}", out.stderr);
}

/// Runs `curl` with `args` (at most [`CLIENT_WAIT`]).
pub fn curl(args: &[&str]) -> Ran {
    let max = CLIENT_WAIT.as_secs().to_string();
    bounded(
        Command::new("curl")
            .args(["-sS", "--max-time", &max])
            .args(args),
    )
}

/// Runs `cmd` with no input; panics (and kills it) if it takes longer than [`CLIENT_WAIT`]
/// plus a little.
pub fn bounded(cmd: &mut Command) -> Ran {
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    let mut guard = zerohop_test_support::ChildGuard::new(child);
    let read = |pipe: Option<Box<dyn std::io::Read + Send>>| {
        thread::spawn(move || {
            let mut text = String::new();
            if let Some(mut p) = pipe {
                let _ = p.read_to_string(&mut text);
            }
            text
        })
    };
    let out = read(guard.child_mut().stdout.take().map(|p| Box::new(p) as _));
    let err = read(guard.child_mut().stderr.take().map(|p| Box::new(p) as _));
    let code = guard.wait_timeout(CLIENT_WAIT + Duration::from_secs(5));
    Ran {
        code,
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
    }
}

/// `curl` (run with `-w` [`WRITE_OUT`]) answered `body` with status 200 over HTTP version
/// `version` (`1.1`, `2`).
pub fn assert_answer(out: &Ran, body: &str, version: &str) {
    assert!(out.ok(), "curl failed: {}{}", out.stdout, out.stderr);
    assert_eq!(out.stdout, format!("{body}|200|{version}"), "curl's answer");
}

/// The `-w` format [`assert_answer`] reads.
pub const WRITE_OUT: &str = "|%{http_code}|%{http_version}";
