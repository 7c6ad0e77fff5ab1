//! The systems under test: starting each on loopback, knowing its processes, stopping it
//! with nothing left behind.
//!
//! Every system serves the same chain of [`Step`]s behind one URL on 127.0.0.1 and is
//! started on free ports (port 0, or a port picked by binding port 0 for nginx):
//!
//! * `zerohop-ring`, `zerohop-socket`: a generated chain spec run by `zerohop up` with that
//!   transport; each step is its own function and process (a step that repeats gets
//!   numbered names, `pass1`, `pass2`, ...). Components: `gateway` (the `zerohop` process,
//!   agent and gateway in one) and `fn:NAME` for each instance it spawned.
//! * `monolith`: one `zerohop-bench-fn` applying every step. Component: `monolith`.
//! * `http-chain`: one `zerohop-bench-fn` per step, each POSTing to the next over loopback
//!   HTTP with keep-alive; the first answers the client. Components: `fn:STEP#I` (I counts
//!   from 0 along the chain).
//! * `nginx-broker`: the same servers, but every hop goes through one nginx (client ->
//!   nginx -> fn 0 -> nginx -> fn 1 ...), as in SPRIGHT's Knative-like broker baseline.
//!   Components: `nginx` (master), `nginx-worker`, `fn:STEP#I`.
//! * `nginx-tls` (not in [`SystemId::all`]; the HTTPS and HTTP/2 rows): nginx terminating TLS
//!   (HTTP/1.1 and h2 by ALPN) in front of the monolith, see [`tls`]. Components: `nginx`,
//!   `nginx-worker`, `monolith`.
//! * The baselines of the multi-core point (not in [`SystemId::all`]), each told how many
//!   cores it has: `hyper-monolith` (the monolith on tokio's multi-threaded runtime with that
//!   many workers), `go-monolith` and `go-http-chain` (the same two shapes written in Go with
//!   the standard library, `GOMAXPROCS` set; see [`go`]). Components as for `monolith` and
//!   `http-chain`.
//!
//! With [`StartOpts::tls`], zerohop serves HTTPS (the spec's `tls`) and the URL is `https://`;
//! readiness is then checked with curl, trusting that certificate.
//!
//! [`start`] returns only once a test body gets exactly the expected answer through the
//! whole chain. Every process's stdout is drained and its stderr goes to a log in a
//! per-system folder under [`StartOpts::work_dir`]; errors quote the end of that log.
//! Stopping sends SIGTERM to every process this module started, SIGKILL after 5 s, reaps
//! them, and makes sure the processes they started (zerohop's functions, nginx's worker)
//! are gone too.

use std::fmt::Write as _;
use std::fs::File;
use std::io::Read;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc::RecvTimeoutError;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use zerohop_test_support::{children, instances, wait_until};
use zerohop_transport::Backend;

use crate::h2load::Protocol;
use crate::procstat::{environ_var, ProcessId};
use crate::{Component, Step};

pub mod go;
mod nginx;
pub mod tls;

/// How long a system may take to answer its first request correctly.
const READY_TIMEOUT: Duration = Duration::from_secs(20);
/// How long the started processes get to exit after SIGTERM before SIGKILL.
const TERM_GRACE: Duration = Duration::from_secs(5);
/// How long processes started by ours (functions, nginx worker) get to follow their parent.
const ORPHAN_GRACE: Duration = Duration::from_secs(2);
/// The body [`start`] sends to check a system answers correctly (lower case, so `upper`
/// shows).
const PROBE_BODY: &[u8] = b"zerohop bench probe: is every hop there?";
/// The route every zerohop chain of the benchmark serves.
pub const ZEROHOP_PATH: &str = "/bench";
/// Environment variable naming a zerohop function in its process: how the components of a
/// chain are told apart (`pass1` and `pass2` run the same program). Not `ZEROHOP_*`: those
/// are reserved for the agent.
pub const FUNCTION_ENV: &str = "BENCH_FUNCTION";
/// Where Debian's `nginx` and `nginx-light` packages install the binary.
const NGINX: &str = "/usr/sbin/nginx";

/// Which system.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SystemId {
    /// `zerohop up` with this transport.
    Zerohop(Backend),
    /// One HTTP server running every step in-process.
    Monolith,
    /// One HTTP server per step, each calling the next over loopback HTTP.
    HttpChain,
    /// Every hop through an nginx front proxy.
    NginxBroker,
    /// nginx terminating TLS in front of the monolith (needs [`StartOpts::tls`]).
    NginxTls,
    /// The monolith on tokio's multi-threaded runtime with this many worker threads.
    HyperMonolith(u16),
    /// The monolith written in Go (`net/http`), `GOMAXPROCS` this many.
    GoMonolith(u16),
    /// The HTTP microservice chain written in Go, every process with `GOMAXPROCS` this many.
    GoHttpChain(u16),
}

impl SystemId {
    /// Name in reports and on the command line: `zerohop-ring`, `zerohop-socket`, `zerohop-poll`,
    /// `zerohop-sockmap`, `monolith`, `http-chain`, `nginx-broker`.
    pub fn name(&self) -> String {
        match self {
            SystemId::Zerohop(b) => format!("zerohop-{}", b.name()),
            SystemId::Monolith => "monolith".into(),
            SystemId::HttpChain => "http-chain".into(),
            SystemId::NginxBroker => "nginx-broker".into(),
            SystemId::NginxTls => "nginx-tls".into(),
            SystemId::HyperMonolith(_) => "hyper-monolith".into(),
            SystemId::GoMonolith(_) => "go-monolith".into(),
            SystemId::GoHttpChain(_) => "go-http-chain".into(),
        }
    }

    /// Every system of the matrix: zerohop with each transport, then the baselines
    /// (`nginx-tls`, which only the HTTPS and HTTP/2 rows run, left out).
    pub fn all() -> Vec<SystemId> {
        Backend::ALL
            .iter()
            .map(|&b| SystemId::Zerohop(b))
            .chain([
                SystemId::Monolith,
                SystemId::HttpChain,
                SystemId::NginxBroker,
            ])
            .collect()
    }
}

/// How to start a system.
#[derive(Clone, Debug)]
pub struct StartOpts {
    /// Pin every process of the system to these CPUs, a `taskset -c` list such as `1` or
    /// `0-1` (None: no pinning).
    pub cpus: Option<String>,
    /// zerohop: `--gateway-threads` (None: the spec's default, one per allowed core).
    pub gateway_threads: Option<u16>,
    /// zerohop: with `cpus`, a core-affine pipeline per core (the spec's `cpus:` is the same
    /// list; `docs/pipelines.md`).
    pub pipelines: bool,
    /// zerohop: instances of each function.
    pub instances: u16,
    /// Folder holding the built binaries (`zerohop`, `zerohop-bench-fn`, `zerohop-bench-pass`,
    /// `upper`, `exclaim`).
    pub bin_dir: PathBuf,
    /// Scratch folder for specs and configs (removed by the caller).
    pub work_dir: PathBuf,
    /// Serve HTTPS with this certificate: zerohop through its spec's `tls`; `nginx-tls`
    /// needs it. Ignored by the other baselines.
    pub tls: Option<tls::Certificate>,
}

/// A running system; stopped (and every process reaped) on drop.
pub struct RunningSystem {
    /// Which system.
    pub id: SystemId,
    /// URL to POST requests to.
    pub url: String,
    /// Its processes.
    pub components: Vec<Component>,
    /// The processes this module started, in start order.
    children: Vec<Started>,
    /// Processes started by them (zerohop's functions, nginx's worker): they must be gone
    /// after a stop.
    descendants: Vec<ProcessId>,
    /// zerohop: the chain's function names, in chain order.
    functions: Vec<String>,
    /// The certificate an `https://` URL is checked against.
    ca: Option<PathBuf>,
}

/// Which function server a monolith or HTTP chain runs, and on how many threads.
#[derive(Clone, Copy, Debug)]
enum FnServer {
    /// `zerohop-bench-fn` (hyper), with this many runtime worker threads.
    Hyper(u16),
    /// `zerohop-bench-go` (`net/http`), with `GOMAXPROCS` this many.
    Go(u16),
}

/// One process this module started.
struct Started {
    child: Child,
    /// Its stderr log.
    log: PathBuf,
}

/// The nginx binary, or what to do when it is missing.
pub fn nginx_binary() -> Result<PathBuf, String> {
    let path = PathBuf::from(NGINX);
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!(
            "{NGINX} not found: the nginx-broker baseline needs nginx; install it with \
             `apt-get install -y nginx-light` (Debian/Ubuntu, as root)"
        ))
    }
}

/// Starts system `id` serving `chain` on 127.0.0.1 and waits (at most 20 s) until it
/// answers a test body correctly.
pub fn start(id: SystemId, chain: &[Step], opts: &StartOpts) -> Result<RunningSystem> {
    if chain.is_empty() {
        bail!("a chain needs at least one step");
    }
    let dir = system_dir(id, opts)?;
    let mut sys = RunningSystem {
        id,
        url: String::new(),
        components: Vec::new(),
        children: Vec::new(),
        descendants: Vec::new(),
        functions: Vec::new(),
        ca: None,
    };
    // On any error below `sys` drops and stops whatever had started.
    match id {
        SystemId::Zerohop(backend) => sys.start_zerohop(backend, chain, opts, &dir)?,
        SystemId::Monolith => sys.start_monolith(chain, opts, &dir, FnServer::Hyper(1))?,
        SystemId::HttpChain => sys.start_http_chain(chain, opts, &dir, FnServer::Hyper(1))?,
        SystemId::HyperMonolith(n) => sys.start_monolith(chain, opts, &dir, FnServer::Hyper(n))?,
        SystemId::GoMonolith(n) => sys.start_monolith(chain, opts, &dir, FnServer::Go(n))?,
        SystemId::GoHttpChain(n) => sys.start_http_chain(chain, opts, &dir, FnServer::Go(n))?,
        SystemId::NginxBroker => return nginx::start_nginx_broker(chain, opts, &dir),
        SystemId::NginxTls => return tls::start_nginx_tls(chain, opts, &dir),
    }
    Ok(sys)
}

impl RunningSystem {
    /// Stops the system: SIGTERM to every process it started, SIGKILL after 5 s, all reaped.
    pub fn stop(mut self) {
        self.shutdown();
    }

    /// Re-reads the processes started by the system's own (after zerohop restarted a
    /// function, its pid changed).
    pub fn refresh_components(&mut self) {
        match self.id {
            SystemId::Zerohop(_) => {
                let Some(gateway) = self.children.first().map(|s| s.child.id()) else {
                    return;
                };
                let found = zerohop_functions(gateway);
                self.components.retain(|c| c.name == "gateway");
                // In chain order; a function between two instances (restarting) is left out.
                for name in &self.functions {
                    for &(_, pid) in found.iter().filter(|(n, _)| n == name) {
                        self.components.push(Component {
                            name: format!("fn:{name}"),
                            pid,
                        });
                        if let Some(p) = ProcessId::of(pid) {
                            if !self.descendants.contains(&p) {
                                self.descendants.push(p);
                            }
                        }
                    }
                }
            }
            SystemId::NginxBroker | SystemId::NginxTls => {
                let Some(master) = self.children.last().map(|s| s.child.id()) else {
                    return;
                };
                let workers = children_of(master);
                self.components.retain(|c| c.name != "nginx-worker");
                for (i, pid) in workers.into_iter().enumerate() {
                    self.components.insert(
                        1 + i,
                        Component {
                            name: "nginx-worker".into(),
                            pid,
                        },
                    );
                    if let Some(p) = ProcessId::of(pid) {
                        if !self.descendants.contains(&p) {
                            self.descendants.push(p);
                        }
                    }
                }
            }
            SystemId::Monolith
            | SystemId::HttpChain
            | SystemId::HyperMonolith(_)
            | SystemId::GoMonolith(_)
            | SystemId::GoHttpChain(_) => {}
        }
    }

    fn start_zerohop(
        &mut self,
        backend: Backend,
        chain: &[Step],
        opts: &StartOpts,
        dir: &Path,
    ) -> Result<()> {
        self.functions = function_names(chain);
        let mut spec = zerohop_spec(chain, &self.functions, &bin_dir(opts)?, opts.instances)?;
        if let (true, Some(cpus)) = (opts.pipelines, &opts.cpus) {
            spec.push_str(&format!("cpus: \"{cpus}\"\n"));
        }
        if let Some(cert) = &opts.tls {
            spec.push_str(&cert.spec_line()?);
            self.ca = Some(cert.cert.clone());
        }
        let spec_path = dir.join("chain.yaml");
        std::fs::write(&spec_path, spec)
            .with_context(|| format!("writing {}", spec_path.display()))?;
        let zerohop = binary(opts, "zerohop")?;
        let mut args: Vec<std::ffi::OsString> = vec![
            "up".into(),
            spec_path.into_os_string(),
            "--listen".into(),
            "127.0.0.1:0".into(),
            "--transport".into(),
            backend.name().into(),
        ];
        if let Some(n) = opts.gateway_threads {
            args.push("--gateway-threads".into());
            args.push(n.to_string().into());
        }
        let i = self.spawn(opts, &zerohop, &args, &dir.join("zerohop.log"), true)?;
        let line = self.first_line(i)?;
        let scheme = if opts.tls.is_some() { "https" } else { "http" };
        let base = zerohop_test_support::listener_in(&line, &format!("{scheme}://"))
            .ok_or_else(|| anyhow!("no {scheme} URL in zerohop's ready line {line:?}"))?;
        self.url = format!("{scheme}://{base}{ZEROHOP_PATH}");
        self.wait_ready(chain)?;
        let gateway = self.children[i].child.id();
        self.components.push(Component {
            name: "gateway".into(),
            pid: gateway,
        });
        // Every function answered the probe, so each has exec'd and is listed; look a bit
        // longer anyway in case /proc lags.
        wait_until(ORPHAN_GRACE, || {
            zerohop_functions(gateway).len() >= self.functions.len()
        });
        self.refresh_components();
        for name in &self.functions {
            let fn_name = format!("fn:{name}");
            if !self.components.iter().any(|c| c.name == fn_name) {
                bail!("function `{name}` has no process under zerohop (pid {gateway})");
            }
        }
        Ok(())
    }

    fn start_monolith(
        &mut self,
        chain: &[Step],
        opts: &StartOpts,
        dir: &Path,
        server: FnServer,
    ) -> Result<()> {
        let pid = self.spawn_fn(opts, server, chain, None, &dir.join("monolith.log"))?;
        self.url = format!("{}/bench", self.fn_url(self.children.len() - 1)?);
        self.wait_ready(chain)?;
        self.components.push(Component {
            name: "monolith".into(),
            pid,
        });
        Ok(())
    }

    fn start_http_chain(
        &mut self,
        chain: &[Step],
        opts: &StartOpts,
        dir: &Path,
        server: FnServer,
    ) -> Result<()> {
        // From the last hop back, so each knows its successor's address.
        let mut next: Option<String> = None;
        let mut pids = Vec::new();
        for (i, step) in chain.iter().enumerate().rev() {
            let log = dir.join(format!("fn{i}.log"));
            pids.push(self.spawn_fn(opts, server, &[*step], next.as_deref(), &log)?);
            next = Some(format!("{}/bench", self.fn_url(self.children.len() - 1)?));
        }
        self.url = next.unwrap_or_default();
        self.wait_ready(chain)?;
        pids.reverse();
        for (i, (step, pid)) in chain.iter().zip(pids).enumerate() {
            self.components.push(Component {
                name: format!("fn:{}#{i}", step.name()),
                pid,
            });
        }
        Ok(())
    }

    /// Starts a function server (`zerohop-bench-fn`, or the Go one: the same arguments) on a
    /// free port; returns its pid.
    fn spawn_fn(
        &mut self,
        opts: &StartOpts,
        server: FnServer,
        steps: &[Step],
        next: Option<&str>,
        log: &Path,
    ) -> Result<u32> {
        let steps = steps.iter().map(|s| s.name()).collect::<Vec<_>>().join(",");
        let mut args: Vec<std::ffi::OsString> = vec![
            "--listen".into(),
            "127.0.0.1:0".into(),
            "--steps".into(),
            steps.into(),
        ];
        if let Some(next) = next {
            args.extend(["--next".into(), next.into()]);
        }
        let (program, env) = match server {
            FnServer::Hyper(threads) => {
                if threads > 1 {
                    args.extend(["--threads".into(), threads.to_string().into()]);
                }
                (binary(opts, "zerohop-bench-fn")?, None)
            }
            FnServer::Go(procs) => (
                go::binary(&bin_dir(opts)?)?,
                Some(("GOMAXPROCS", procs.max(1).to_string())),
            ),
        };
        let i = self.spawn_env(opts, &program, &args, env, log, true)?;
        Ok(self.children[i].child.id())
    }

    /// Base URL (`http://ADDR`) of the function server `children[i]`, from its first line.
    fn fn_url(&mut self, i: usize) -> Result<String> {
        let line = self.first_line(i)?;
        line.strip_prefix("listening on ")
            .filter(|u| u.starts_with("http://"))
            .map(str::to_owned)
            .ok_or_else(|| anyhow!("unexpected first line from zerohop-bench-fn: {line:?}"))
    }

    /// Spawns `program args` (behind `taskset` when pinning), stderr to `log`, stdout piped
    /// when `read_stdout` (else discarded); returns its index in `children`.
    fn spawn(
        &mut self,
        opts: &StartOpts,
        program: &Path,
        args: &[std::ffi::OsString],
        log: &Path,
        read_stdout: bool,
    ) -> Result<usize> {
        self.spawn_env(opts, program, args, None, log, read_stdout)
    }

    /// [`RunningSystem::spawn`] with one more environment variable.
    fn spawn_env(
        &mut self,
        opts: &StartOpts,
        program: &Path,
        args: &[std::ffi::OsString],
        env: Option<(&str, String)>,
        log: &Path,
        read_stdout: bool,
    ) -> Result<usize> {
        let mut cmd = match &opts.cpus {
            // taskset execs the program: the pid we hold is the program's, and everything
            // it starts inherits the affinity.
            Some(cpus) => {
                let mut c = Command::new("taskset");
                c.arg("-c").arg(cpus).arg(program);
                c
            }
            None => Command::new(program),
        };
        // Append: nginx writes its error log to the same file.
        let stderr = File::options()
            .create(true)
            .append(true)
            .open(log)
            .with_context(|| format!("creating {}", log.display()))?;
        if let Some((key, value)) = env {
            cmd.env(key, value);
        }
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(if read_stdout {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stderr(stderr);
        let child = cmd.spawn().with_context(|| {
            if opts.cpus.is_some() {
                format!(
                    "starting `taskset -c .. {}` (taskset comes with util-linux)",
                    program.display()
                )
            } else {
                format!("starting {}", program.display())
            }
        })?;
        self.children.push(Started {
            child,
            log: log.to_owned(),
        });
        Ok(self.children.len() - 1)
    }

    /// The first stdout line of `children[i]` (at most [`READY_TIMEOUT`]); the rest of its
    /// stdout is drained in the background so it never blocks on a full pipe.
    fn first_line(&mut self, i: usize) -> Result<String> {
        let started = &mut self.children[i];
        let stdout = started
            .child
            .stdout
            .take()
            .ok_or_else(|| anyhow!("stdout of process {} not piped", started.child.id()))?;
        crate::wait_line(stdout, "", READY_TIMEOUT).map_err(|e| {
            let what = match e {
                RecvTimeoutError::Timeout => format!("printed nothing within {READY_TIMEOUT:?}"),
                RecvTimeoutError::Disconnected => {
                    // Stdout closed: give the exit status a moment to show.
                    wait_until(Duration::from_secs(1), || {
                        !matches!(started.child.try_wait(), Ok(None))
                    });
                    match started.child.try_wait() {
                        Ok(Some(status)) => format!("exited ({status})"),
                        _ => "closed its stdout".into(),
                    }
                }
            };
            anyhow!(
                "process {} {what}{}",
                started.child.id(),
                failure_note(started)
            )
        })
    }

    /// Waits until a POST of [`PROBE_BODY`] to `url` gets exactly the chain's answer.
    fn wait_ready(&mut self, chain: &[Step]) -> Result<()> {
        let expected = Step::expected(chain, PROBE_BODY);
        let deadline = Instant::now() + READY_TIMEOUT;
        let mut last;
        loop {
            for s in &mut self.children {
                if let Ok(Some(status)) = s.child.try_wait() {
                    bail!(
                        "process {} exited ({status}) before {} was ready{}",
                        s.child.id(),
                        self.url,
                        failure_note(s)
                    );
                }
            }
            let answer = match &self.ca {
                Some(ca) => tls::probe(&self.url, Some(ca), Protocol::Https, PROBE_BODY),
                None => post(&self.url, PROBE_BODY, Duration::from_secs(2)),
            };
            match answer {
                Ok((200, body)) if body == expected => return Ok(()),
                Ok((status, body)) => {
                    last = format!(
                        "status {status}, body {:?}",
                        String::from_utf8_lossy(&body[..body.len().min(200)])
                    )
                }
                Err(e) => last = e.to_string(),
            }
            if Instant::now() >= deadline {
                let logs: String = self.children.iter().map(failure_note).collect();
                bail!(
                    "{} did not answer {:?} correctly within {READY_TIMEOUT:?} (last: {last}){logs}",
                    self.url,
                    String::from_utf8_lossy(&expected)
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn shutdown(&mut self) {
        for s in &mut self.children {
            if matches!(s.child.try_wait(), Ok(None)) {
                let _ = kill(Pid::from_raw(s.child.id() as i32), Signal::SIGTERM);
            }
        }
        wait_until(TERM_GRACE, || {
            self.children
                .iter_mut()
                .all(|s| !matches!(s.child.try_wait(), Ok(None)))
        });
        for s in &mut self.children {
            if matches!(s.child.try_wait(), Ok(None)) {
                eprintln!(
                    "bench: process {} ignored SIGTERM for {TERM_GRACE:?}; killing it",
                    s.child.id()
                );
                let _ = s.child.kill();
            }
            let _ = s.child.wait();
        }
        self.children.clear();
        // Their own children exit with them (zerohop stops its functions, nginx its worker;
        // both also die with a SIGKILLed parent); make sure.
        wait_until(ORPHAN_GRACE, || !self.descendants.iter().any(|p| p.alive()));
        for p in self.descendants.drain(..) {
            if p.alive() {
                eprintln!("bench: process {} outlived its parent; killing it", p.pid);
                let _ = kill(Pid::from_raw(p.pid as i32), Signal::SIGKILL);
            }
        }
    }
}

impl Drop for RunningSystem {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// zerohop function names for `chain`: the step's name, numbered from 1 when it repeats
/// (`[pass, pass]` -> `pass1`, `pass2`), so each position is its own process.
fn function_names(chain: &[Step]) -> Vec<String> {
    let mut seen = std::collections::HashMap::new();
    chain
        .iter()
        .map(|s| {
            if chain.iter().filter(|t| *t == s).count() == 1 {
                return s.name().to_owned();
            }
            let n = seen.entry(s.name()).or_insert(0);
            *n += 1;
            format!("{}{n}", s.name())
        })
        .collect()
}

/// The zerohop chain spec of the benchmark: route `POST /bench`, a pool whose slots hold
/// 1 MiB bodies (slot_size 2 MiB leaves max_body = 2 MiB - 32 - 1024), 30 s timeout.
fn zerohop_spec(
    chain: &[Step],
    names: &[String],
    bin_dir: &Path,
    instances: u16,
) -> Result<String> {
    let mut s = String::from(
        "# Generated by zerohop-bench.\n\
         name: bench\n\
         pool: { slots: 512, slot_size: 2MiB }\n\
         timeout: 30s\n\
         functions:\n",
    );
    let mut listed = std::collections::HashSet::new();
    for (step, name) in chain.iter().zip(names) {
        if !listed.insert(name) {
            continue;
        }
        let program = match step {
            Step::Upper => "upper",
            Step::Exclaim => "exclaim",
            Step::Pass => "zerohop-bench-pass",
        };
        let path = bin_dir.join(program);
        let path = path
            .to_str()
            .ok_or_else(|| anyhow!("{} is not UTF-8", path.display()))?;
        // JSON strings are YAML double-quoted scalars: any path is quoted safely.
        let _ = writeln!(
            s,
            "  {name}: {{ command: [{}], instances: {}, env: {{ {FUNCTION_ENV}: {name} }} }}",
            serde_json::to_string(path)?,
            instances.max(1)
        );
    }
    let _ = writeln!(
        s,
        "routes:\n  - http: POST {ZEROHOP_PATH}\n    sequence: [{}]",
        names.join(", ")
    );
    Ok(s)
}

/// `(function name, pid)` of every process under zerohop's `gateway` pid, named by
/// [`FUNCTION_ENV`], by pid.
pub fn zerohop_functions(gateway: u32) -> Vec<(String, u32)> {
    let mut pids = instances(gateway);
    pids.sort_unstable();
    pids.into_iter()
        .filter_map(|pid| Some((environ_var(pid, FUNCTION_ENV)?, pid)))
        .collect()
}

/// Pids whose parent is `pid`, sorted.
fn children_of(pid: u32) -> Vec<u32> {
    let mut pids = children(pid);
    pids.sort_unstable();
    pids
}

/// Effective uid of this process, from /proc/self/status (no `unsafe` needed).
fn effective_uid() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(2)?.parse().ok()
}

/// A per-start folder under the work dir: `NAME-N`.
fn system_dir(id: SystemId, opts: &StartOpts) -> Result<PathBuf> {
    static N: AtomicU32 = AtomicU32::new(0);
    let dir = opts.work_dir.join(format!(
        "{}-{}",
        id.name(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    // Absolute, as nginx's -p and the spec's resolution want it.
    dir.canonicalize()
        .with_context(|| format!("resolving {}", dir.display()))
}

fn bin_dir(opts: &StartOpts) -> Result<PathBuf> {
    opts.bin_dir
        .canonicalize()
        .with_context(|| format!("binary folder {}", opts.bin_dir.display()))
}

/// `bin_dir/name`, or what to build when it is missing.
fn binary(opts: &StartOpts, name: &str) -> Result<PathBuf> {
    let path = bin_dir(opts)?.join(name);
    if !path.is_file() {
        bail!(
            "{} is missing; build the binaries first: `cargo build --release --workspace --bins`",
            path.display()
        );
    }
    Ok(path)
}

/// A free TCP port on 127.0.0.1 (bound, then released for nginx to take).
fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .context("binding an ephemeral port")?
        .port())
}

/// The end of a process's stderr log, for error messages (empty when there is none).
fn failure_note(s: &Started) -> String {
    let Ok(text) = std::fs::read_to_string(&s.log) else {
        return String::new();
    };
    let lines: Vec<&str> = text.lines().collect();
    if lines.is_empty() {
        return String::new();
    }
    let tail = lines[lines.len().saturating_sub(8)..].join("\n  ");
    format!("\n  {} (end):\n  {tail}", s.log.display())
}

/// One POST for readiness checks (the load generator is the real client): status and body.
fn post(url: &str, body: &[u8], timeout: Duration) -> Result<(u16, Vec<u8>), String> {
    let agent = ureq::AgentBuilder::new().timeout(timeout).build();
    let resp = match agent.post(url).send_bytes(body) {
        Ok(r) | Err(ureq::Error::Status(_, r)) => r,
        Err(e) => return Err(e.to_string()),
    };
    let status = resp.status();
    let mut out = Vec::new();
    resp.into_reader()
        .read_to_end(&mut out)
        .map_err(|e| e.to_string())?;
    Ok((status, out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{passes, HELLO};

    #[test]
    fn names_match_the_interface() {
        let names: Vec<String> = SystemId::all().iter().map(SystemId::name).collect();
        assert_eq!(
            names,
            [
                "zerohop-ring",
                "zerohop-socket",
                "zerohop-poll",
                "zerohop-sockmap",
                "monolith",
                "http-chain",
                "nginx-broker"
            ]
        );
    }

    #[test]
    fn repeated_steps_get_numbered_functions() {
        assert_eq!(function_names(&HELLO), ["upper", "exclaim"]);
        assert_eq!(function_names(&passes(3)), ["pass1", "pass2", "pass3"]);
        assert_eq!(
            function_names(&[Step::Pass, Step::Upper, Step::Pass]),
            ["pass1", "upper", "pass2"]
        );
    }

    #[test]
    fn spec_lists_each_function_once_and_routes_the_chain() {
        let names = function_names(&passes(2));
        let spec = zerohop_spec(&passes(2), &names, Path::new("/opt/bin"), 1).unwrap();
        assert!(spec.contains(
            "  pass1: { command: [\"/opt/bin/zerohop-bench-pass\"], instances: 1, env: { BENCH_FUNCTION: pass1 } }"
        ));
        assert!(spec.contains("pass2: { command"));
        assert!(spec.contains("sequence: [pass1, pass2]"));
        assert!(spec.contains("slot_size: 2MiB"));
    }
}
