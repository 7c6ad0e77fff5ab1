//! Bringing a chain up and down.

use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use zerohop_gateway::{Gateway, GatewayConfig, Gateways, MqttIngress};
use zerohop_pool::{PartyState, Pool, PoolError, Pools};
use zerohop_transport::{Backend, Endpoint, TransportError};

use crate::confine::{CgroupMode, Jail, Program, UidRange};
use crate::logs::LogBook;
use crate::spec::plan_from_spec;
use crate::spec::{ChainSpec, MqttSpec, SpecError, MAX_GATEWAY_THREADS, MAX_PARTIES};
use crate::supervise::{
    self, Fingerprint, FunctionRun, Instance, InstanceSpec, PartyControl, Shared, Want,
};
use crate::watchdog;
use zerohop_transport::PlanExt;

/// How to bring a chain up.
#[derive(Clone, Debug)]
pub struct UpOptions {
    /// Where the gateway listens (port 0 picks a free port; see [`Running::url`]).
    pub listen: SocketAddr,
    /// Overrides the spec's transport.
    pub transport: Option<Backend>,
    /// How long instances get to attach.
    pub ready_timeout: Duration,
    /// Ring receiver spin budget in microseconds (default: the transport's).
    pub spin_us: Option<u32>,
    /// Uids chains may run under when the agent is root (one per chain, locked).
    pub uid_range: UidRange,
    /// Which cgroup hierarchy instances are put in.
    pub cgroups: CgroupMode,
    /// Overrides the spec's `gateway_threads`.
    pub gateway_threads: Option<u16>,
    /// Overrides the address of the spec's `mqtt.listen` (the chain must have MQTT routes).
    pub mqtt_listen: Option<SocketAddr>,
    /// Overrides the address of the spec's `coap.listen` (the chain must have CoAP routes).
    pub coap_listen: Option<SocketAddr>,
    /// Also write every line the instances print to the agent's standard error as
    /// `[function/instance] text` (foreground `zerohop up`; a daemon turns it off). The
    /// lines are in [`Running::logs`] either way.
    pub echo_logs: bool,
    /// How functions placed on peer nodes are reached (`FunctionSpec::relay`); a chain with
    /// such functions is refused without it.
    pub link: Option<crate::relay::Link>,
}

impl Default for UpOptions {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            transport: None,
            ready_timeout: Duration::from_secs(10),
            spin_us: None,
            uid_range: UidRange::default(),
            cgroups: CgroupMode::Auto,
            gateway_threads: None,
            mqtt_listen: None,
            coap_listen: None,
            echo_logs: true,
            link: None,
        }
    }
}

/// What a chain being replaced hands over to the chain that replaces it ([`up_with`]):
/// its listening sockets, so that no connection waiting to be accepted is lost and the
/// address stays the same, and its state store, so that no state is lost.
#[derive(Default)]
pub struct Inherit {
    /// Every listening HTTP socket of the old chain (empty: bind `UpOptions::listen`).
    pub http: Vec<std::net::TcpListener>,
    /// The old chain's CoAP socket (`None`: bind as the spec says).
    pub coap: Option<std::net::UdpSocket>,
    /// The old chain's state store; it must have the geometry the new spec asks for.
    pub state: Option<Arc<zerohop_pool::State>>,
    /// The old chain's data folder and the uid that owns it (kept if the new spec names the
    /// same folder).
    pub data: Option<crate::confine::KeptData>,
}

/// Why a chain could not come up.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The spec is invalid.
    #[error(transparent)]
    Spec(#[from] SpecError),
    /// The pool could not be created.
    #[error("creating the pool: {0}")]
    Pool(#[from] PoolError),
    /// The transport could not be created.
    #[error("creating the transport: {0}")]
    Transport(#[from] TransportError),
    /// The gateway could not listen.
    #[error("cannot listen on {addr}: {source}; pick another address with --listen")]
    Listen {
        /// Address asked for.
        addr: SocketAddr,
        /// OS error.
        source: std::io::Error,
    },
    /// The gateway could not listen for MQTT or CoAP.
    #[error("cannot listen for {protocol} on {addr}: {source}; pick another address in the spec's `{protocol}.listen` or with --{protocol}")]
    ListenOther {
        /// `mqtt` or `coap`.
        protocol: &'static str,
        /// Address asked for.
        addr: SocketAddr,
        /// OS error.
        source: std::io::Error,
    },
    /// The chain's security domain could not be set up.
    #[error("{0}")]
    Confine(String),
    /// A function's program could not be prepared.
    #[error("function '{function}': {message}")]
    Program {
        /// Function name.
        function: String,
        /// What is wrong.
        message: String,
    },
    /// An instance could not be started.
    #[error("starting function '{function}' ({program}): {source}")]
    Spawn {
        /// Function name.
        function: String,
        /// Program.
        program: String,
        /// OS error.
        source: std::io::Error,
    },
    /// An instance did not become ready.
    #[error("function '{function}' (instance {party}) {what} before it was ready{output}")]
    NotReady {
        /// Function name.
        function: String,
        /// Party index.
        party: u16,
        /// What happened.
        what: String,
        /// The last lines it printed, as `; its last output: ...` (empty without any).
        output: String,
    },
}

impl AgentError {
    /// Process exit code for the CLI: 2 for an invalid spec, 1 otherwise.
    pub fn exit_code(&self) -> i32 {
        match self {
            AgentError::Spec(_) => 2,
            _ => 1,
        }
    }
}

/// A running chain.
pub struct Running {
    addr: SocketAddr,
    /// Every way in, as URLs: `http://`, then `mqtt://`, `coap://` when the chain has them.
    listeners: Vec<String>,
    /// Where the CoAP socket is bound, if the chain has one.
    coap: Option<SocketAddr>,
    /// The MQTT and CoAP servers (on the caller's runtime, stopped with HTTP).
    others: Vec<JoinHandle<()>>,
    shared: Arc<Shared>,
    http_stop: watch::Sender<bool>,
    instance_stop: watch::Sender<bool>,
    server: JoinHandle<()>,
    supervisors: Vec<JoinHandle<()>>,
    watchdog: JoinHandle<()>,
    /// Kills instances that send invalid descriptors ([`crate::offence`]).
    enforcer: JoinHandle<()>,
    scaler: JoinHandle<()>,
    /// Wake the scaler when a function sends to a party with no ready instance.
    wakers: Option<crate::scale::Wakers>,
    receiving: Option<zerohop_gateway::Receiving>,
    /// The instances of functions on peer nodes, played in this process.
    relays: Vec<crate::relay::RelayParty>,
    /// Gateway parties 1.. (party 0 runs on the caller's runtime).
    gateway_threads: Vec<std::thread::JoinHandle<()>>,
    /// Resolve when the HTTP serving of gateway parties 1.. has ended.
    served: Vec<tokio::sync::oneshot::Receiver<()>>,
    summary: String,
    view: crate::status::ChainView,
}

impl Running {
    /// The gateway's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Base URL of the gateway.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every way into the chain as a URL: `http://ADDR`, then `mqtt://ADDR` (the gateway is
    /// the broker), `mqtt://HOST:PORT (subscribing)` (it subscribes at a broker) and
    /// `coap://ADDR` when the spec has them; real ports, also when 0 was asked for.
    pub fn listeners(&self) -> &[String] {
        &self.listeners
    }

    /// The port the gateway's CoAP socket is bound to, if it has one.
    pub fn coap_port(&self) -> Option<u16> {
        self.coap.map(|a| a.port())
    }

    /// A cheap handle for status and metrics (it does not keep the chain running); see
    /// [`ChainView`](crate::ChainView).
    pub fn view(&self) -> crate::status::ChainView {
        self.view.clone()
    }

    /// One line describing the chain (transport, functions).
    pub fn summary(&self) -> &str {
        &self.summary
    }

    /// The gateway's threads (stats, in-flight requests).
    pub fn gateways(&self) -> &Gateways {
        &self.shared.gateways
    }

    /// The chain's state store, if it has one (the agent's own mapping; for tests and
    /// diagnostics).
    pub fn state(&self) -> Option<&zerohop_pool::State> {
        self.shared.state.as_deref()
    }

    /// The chain's pools, one per security domain (slot accounting).
    pub fn pools(&self) -> &Pools {
        self.shared.gateways.pools()
    }

    /// The parties of function `function` the scaler wants serving now (empty for an unknown
    /// name); the plan reserves more (see [`Running::reserved_parties`]).
    pub fn parties_of(&self, function: &str) -> Vec<u16> {
        self.reserved_parties(function)
            .into_iter()
            .filter(|&p| self.shared.want_of(p) == Want::Run)
            .collect()
    }

    /// Every party the plan reserves for function `function`: one per instance it may scale
    /// to, and one for rolling updates.
    pub fn reserved_parties(&self, function: &str) -> Vec<u16> {
        let plan = self.shared.gateways.plan();
        plan.function_index(function)
            .map_or_else(Vec::new, |f| plan.parties_of(f))
    }

    /// Times party `party` was restarted, from the agent's own records.
    pub fn restarts(&self, party: u16) -> u32 {
        self.shared
            .parties
            .get(party as usize)
            .map_or(0, |c| c.restarts.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// The uid the chain's instances run as (seen from outside their namespace).
    pub fn uid(&self) -> u32 {
        self.shared.jail.uid()
    }

    /// Pid of party `party`'s running instance (it leads its own process group), from the
    /// agent's own records; `None` when it has none right now.
    pub fn instance_pid(&self, party: u16) -> Option<u32> {
        self.shared
            .parties
            .get(party as usize)
            .map(PartyControl::pgid)
            .filter(|&p| p != 0)
    }

    /// CPU time, memory and CPU throttling of party `party`'s running instance, from its
    /// cgroups; `None` when it has no instance or no cgroup right now.
    pub fn instance_usage(&self, party: u16) -> Option<crate::confine::Usage> {
        let c = self.shared.parties.get(party as usize)?;
        let probe = c.usage.lock().unwrap_or_else(|p| p.into_inner()).clone();
        probe.map(|p| p.read())
    }

    /// What the instances print: see [`LogBook`].
    pub fn logs(&self) -> &LogBook {
        &self.shared.logs
    }

    /// One line: who instances run as, and their cgroup.
    pub fn confinement(&self) -> String {
        self.shared.jail.describe()
    }

    /// Stops accepting, lets open requests finish (up to the chain timeout), stops every
    /// instance (SIGTERM, then SIGKILL), stops the receive thread and releases the pool.
    pub async fn shutdown(self) {
        self.shutdown_inner(false).await;
    }

    /// Shuts down a chain whose listeners another chain took over ([`ChainView::handover`]
    /// gave them, [`up_with`] serves them): it stops accepting (the new chain accepts from
    /// the same sockets), answers what its connections still send with `Connection: close`
    /// until they are closed, then shuts down as [`Running::shutdown`] does. No accepted
    /// request goes unanswered, and a keep-alive client is moved to the new chain between
    /// two requests.
    ///
    /// [`ChainView::handover`]: crate::ChainView::handover
    pub async fn wind_down(self) {
        self.shutdown_inner(true).await;
    }

    async fn shutdown_inner(mut self, handed_over: bool) {
        if handed_over {
            for g in self.shared.gateways.iter() {
                g.close_connections();
            }
        }
        let _ = self.http_stop.send(true);
        let _ = (&mut self.server).await;
        for s in self.served.drain(..) {
            let _ = s.await;
        }
        for s in self.others.drain(..) {
            let _ = s.await;
        }
        let _ = self.instance_stop.send(true);
        for s in self.supervisors.drain(..) {
            let _ = s.await;
        }
        join_threads(self.relays.drain(..).map(|r| r.stop()).collect()).await;
        self.shared.logs.close().await;
        let _ = (&mut self.watchdog).await;
        let _ = (&mut self.enforcer).await;
        let _ = (&mut self.scaler).await;
        if let Some(w) = self.wakers.take() {
            w.stop().await;
        }
        if let Some(r) = self.receiving.take() {
            r.stop().await;
        }
        join_threads(std::mem::take(&mut self.gateway_threads)).await;
    }
}

/// Waits for gateway threads to end (they end once both stop signals were sent).
async fn join_threads(threads: Vec<std::thread::JoinHandle<()>>) {
    if threads.is_empty() {
        return;
    }
    let _ = tokio::task::spawn_blocking(move || {
        for t in threads {
            let _ = t.join();
        }
    })
    .await;
}

/// The gateway threads a chain gets when the spec says `auto`: one per core the agent may
/// run on, at most [`MAX_GATEWAY_THREADS`].
pub fn auto_gateway_threads() -> u16 {
    std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(MAX_GATEWAY_THREADS.into()) as u16
}

/// A listening socket on `addr`; `shared` sets SO_REUSEPORT, so every gateway thread
/// listens on the same address and the kernel spreads connections over them.
fn bind(addr: SocketAddr, shared: bool) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    if shared {
        socket.set_reuseport(true)?;
    }
    socket.bind(addr)?;
    socket.listen(1024)
}

/// The chain's HTTP listening sockets: the inherited ones, else one per gateway thread on
/// `opts.listen` (SO_REUSEPORT when there are several); with a duplicate of each to hand
/// over later.
#[allow(clippy::type_complexity)]
fn http_listeners(
    inherited: Vec<std::net::TcpListener>,
    listen: SocketAddr,
    threads: u16,
) -> Result<
    (
        Vec<std::net::TcpListener>,
        Vec<std::net::TcpListener>,
        SocketAddr,
    ),
    AgentError,
> {
    let failed = |addr| move |source| AgentError::Listen { addr, source };
    let sockets = if inherited.is_empty() {
        let first = bind(listen, threads > 1).map_err(failed(listen))?;
        let addr = first.local_addr().map_err(failed(listen))?;
        let mut list = vec![first.into_std().map_err(failed(addr))?];
        for _ in 1..threads {
            list.push(
                bind(addr, true)
                    .and_then(TcpListener::into_std)
                    .map_err(failed(addr))?,
            );
        }
        list
    } else {
        for l in &inherited {
            l.set_nonblocking(true).map_err(failed(listen))?;
        }
        inherited
    };
    let addr = sockets[0].local_addr().map_err(failed(listen))?;
    let dups = sockets
        .iter()
        .map(std::net::TcpListener::try_clone)
        .collect::<Result<Vec<_>, _>>()
        .map_err(failed(addr))?;
    Ok((sockets, dups, addr))
}

/// Opens the MQTT listener and the CoAP socket the spec asks for (addresses overridden by
/// `opts`; the CoAP socket `coap` when one was inherited), adding their URLs to
/// `listeners`. They are served by gateway thread 0.
fn bind_others(
    spec: &ChainSpec,
    opts: &UpOptions,
    inherited_coap: Option<std::net::UdpSocket>,
    listeners: &mut Vec<String>,
) -> Result<(Option<MqttIngress>, Option<tokio::net::UdpSocket>), AgentError> {
    let override_without = |protocol: &str| {
        AgentError::Spec(SpecError {
            file: spec.file.display().to_string(),
            line: 1,
            field: protocol.to_owned(),
            message: format!(
                "--{protocol} was given but the chain has no `{protocol}` section with `listen` \
                 (and no route with a `{protocol}` trigger)"
            ),
        })
    };
    let mqtt = match (&spec.mqtt, opts.mqtt_listen) {
        (None, Some(_)) | (Some(MqttSpec::Broker { .. }), Some(_)) => {
            return Err(override_without("mqtt"))
        }
        (None, None) => None,
        (Some(MqttSpec::Broker { addr, client_id }), None) => {
            listeners.push(format!("mqtt://{addr} (subscribing)"));
            Some(MqttIngress::Broker {
                addr: addr.clone(),
                client_id: client_id.clone(),
            })
        }
        (Some(MqttSpec::Listen(a)), over) => {
            let want = over.unwrap_or(*a);
            let err = |source| AgentError::ListenOther {
                protocol: "mqtt",
                addr: want,
                source,
            };
            let l = bind(want, false).map_err(err)?;
            listeners.push(format!("mqtt://{}", l.local_addr().map_err(err)?));
            Some(MqttIngress::Listen(l))
        }
    };
    let coap = match (spec.coap, opts.coap_listen) {
        (None, Some(_)) => return Err(override_without("coap")),
        (None, None) => None,
        (Some(a), over) => {
            let want = over.unwrap_or(a);
            let err = |source| AgentError::ListenOther {
                protocol: "coap",
                addr: want,
                source,
            };
            let s = match inherited_coap {
                Some(s) => s,
                None => std::net::UdpSocket::bind(want).map_err(err)?,
            };
            s.set_nonblocking(true).map_err(err)?;
            let s = tokio::net::UdpSocket::from_std(s).map_err(err)?;
            listeners.push(format!("coap://{}", s.local_addr().map_err(err)?));
            Some(s)
        }
    };
    Ok((mqtt, coap))
}

/// Serves HTTP on every one of `listeners` at once until `http` turns true (see
/// [`Gateway::serve`]).
async fn serve_all(gw: Arc<Gateway>, listeners: Vec<TcpListener>, http: watch::Receiver<bool>) {
    let mut serving = tokio::task::JoinSet::new();
    for l in listeners {
        serving.spawn(gw.clone().serve(l, http.clone()));
    }
    while serving.join_next().await.is_some() {}
}

/// Starts gateway party `gw` on a thread of its own with its own runtime: it accepts on
/// `sockets`, serves until `http` turns true (then `served` resolves), and receives answers
/// until `instances` turns true (instances may still answer while connections drain).
/// Returns once it listens.
async fn spawn_gateway(
    gw: Arc<Gateway>,
    endpoint: Endpoint,
    sockets: Vec<std::net::TcpListener>,
    addr: SocketAddr,
    http: watch::Receiver<bool>,
    mut instances: watch::Receiver<bool>,
) -> Result<
    (
        std::thread::JoinHandle<()>,
        tokio::sync::oneshot::Receiver<()>,
    ),
    AgentError,
> {
    let (listening_tx, listening) = tokio::sync::oneshot::channel();
    let (served_tx, served) = tokio::sync::oneshot::channel();
    let listen_err = |source| AgentError::Listen { addr, source };
    let thread = std::thread::Builder::new()
        .name(format!("gateway-{}", gw.party_index()))
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(r) => r,
                Err(e) => {
                    let _ = listening_tx.send(Err(e));
                    return;
                }
            };
            runtime.block_on(async move {
                // Registered with this thread's runtime.
                let listeners = match sockets
                    .into_iter()
                    .map(TcpListener::from_std)
                    .collect::<std::io::Result<Vec<_>>>()
                {
                    Ok(l) => l,
                    Err(e) => {
                        let _ = listening_tx.send(Err(e));
                        return;
                    }
                };
                let receiving = gw.start_receiving(endpoint);
                let _ = listening_tx.send(Ok(()));
                // Stopped before it started (a failed `up`): nothing to drain.
                if !*http.borrow() {
                    serve_all(gw.clone(), listeners, http).await;
                }
                let _ = served_tx.send(());
                while !*instances.borrow_and_update() {
                    if instances.changed().await.is_err() {
                        break;
                    }
                }
                receiving.stop().await;
            });
        })
        .map_err(listen_err)?;
    match listening.await {
        Ok(Ok(())) => Ok((thread, served)),
        Ok(Err(e)) => {
            let _ = thread.join();
            Err(listen_err(e))
        }
        Err(_) => {
            let _ = thread.join();
            Err(listen_err(std::io::Error::other(
                "the gateway thread ended",
            )))
        }
    }
}

/// Finds a function's program before anything is started: a path with a `/` as given, a
/// bare name in the agent's `PATH`.
pub(crate) fn check_program(
    spec: &ChainSpec,
    f: &crate::spec::FunctionSpec,
) -> Result<std::path::PathBuf, SpecError> {
    if f.command.get(1).map(String::as_str) == Some("-e")
        && f.command.get(2).map(String::as_str) == Some(crate::spec::NODE_LOADER)
    {
        // `runtime: node`: the handler file too.
        let file = &f.command[3];
        if !Path::new(file).is_file() {
            return Err(SpecError {
                file: spec.file.display().to_string(),
                line: f.line,
                field: format!("functions.{}.handler", f.name),
                message: format!(
                    "`{file}` not found (relative paths are resolved against the spec's folder)"
                ),
            });
        }
    }
    let prog = &f.command[0];
    let found = if prog.contains('/') {
        Some(Path::new(prog).to_owned()).filter(|p| p.is_file())
    } else {
        std::env::var_os("PATH").and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|d| d.join(prog))
                .find(|p| p.is_file())
        })
    };
    if let Some(path) = found {
        return Ok(path);
    }
    Err(SpecError {
        file: spec.file.display().to_string(),
        line: f.line,
        field: format!("functions.{}.command", f.name),
        message: format!(
            "program `{prog}` not found; build it first (e.g. `cargo build --release`) or fix the path (relative paths are resolved against the spec's folder)"
        ),
    })
}

/// Brings `spec` up: pool, transport, gateway, instances; returns once every instance is
/// attached and the gateway listens.
pub async fn up(spec: ChainSpec, opts: UpOptions) -> Result<Running, AgentError> {
    up_with(spec, opts, Inherit::default()).await
}

/// [`up`], taking over what a chain being replaced hands over: its listening sockets and its
/// state store (see [`Inherit`]).
pub async fn up_with(
    spec: ChainSpec,
    opts: UpOptions,
    inherit: Inherit,
) -> Result<Running, AgentError> {
    let mut paths = Vec::new();
    for f in &spec.functions {
        paths.push(check_program(&spec, f)?);
    }
    let data_path = spec.data.as_ref().map(|d| match d {
        crate::spec::DataSpec::At(p) => p.clone(),
        crate::spec::DataSpec::Default => crate::confine::data::default_dir(
            &spec.name,
            nix::unistd::geteuid().is_root(),
            std::env::var_os("XDG_DATA_HOME").as_deref().map(Path::new),
            std::env::var_os("HOME").as_deref().map(Path::new),
        ),
    });
    let jail = Jail::new(
        &spec.name,
        opts.uid_range,
        opts.cgroups,
        data_path.as_deref(),
        inherit.data,
    )
    .map_err(AgentError::Confine)?;
    let programs = spec
        .functions
        .iter()
        .zip(&paths)
        .map(|(f, path)| {
            Program::open(path, &f.syscalls, &jail).map_err(|message| AgentError::Program {
                function: f.name.clone(),
                message,
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let backend = match opts.transport {
        Some(b) => b,
        None => spec.transport.parse().map_err(|message| SpecError {
            file: spec.file.display().to_string(),
            line: 1,
            field: "transport".into(),
            message,
        })?,
    };
    let spin_us = opts
        .spin_us
        .unwrap_or(zerohop_transport::Options::default().spin_us);
    let gateway_threads = opts
        .gateway_threads
        .or(spec.gateway_threads)
        .unwrap_or_else(auto_gateway_threads)
        .clamp(1, MAX_GATEWAY_THREADS);
    let instances: usize = spec.functions.iter().map(crate::spec::reserved).sum();
    if usize::from(gateway_threads) + instances > MAX_PARTIES {
        return Err(AgentError::Spec(SpecError {
            file: spec.file.display().to_string(),
            line: 1,
            field: "gateway_threads".into(),
            message: format!(
                "{gateway_threads} gateway threads and {instances} instances exceed the \
                 {MAX_PARTIES} parties of a chain; set gateway_threads lower"
            ),
        }));
    }
    let plan = plan_from_spec(&spec, backend.name(), spin_us, gateway_threads);
    let parties = plan.parties();
    // One pool per security domain, numbered in disjoint slot ranges.
    let domains = plan.domains().len();
    if u64::from(spec.pool.slots) * domains as u64 > 1 << 24 {
        return Err(AgentError::Spec(SpecError {
            file: spec.file.display().to_string(),
            line: 1,
            field: "pool.slots".into(),
            message: format!(
                "{} slots in each of the chain's {} security domains exceed the 16777216 \
                 slots a chain can number; lower pool.slots",
                spec.pool.slots, domains
            ),
        }));
    }
    let mut list = Vec::new();
    for i in 0..domains {
        // The shape every party is told through the plan (checked above: it fits).
        let geometry = plan.pool_geometry(i).ok_or_else(|| {
            AgentError::Pool(PoolError::Geometry(format!(
                "security domain {i}'s slots do not fit a descriptor"
            )))
        })?;
        let name = if domains == 1 {
            spec.name.clone()
        } else {
            format!("{}:{i}", spec.name)
        };
        list.push(Arc::new(Pool::create(&name, &geometry)?));
    }
    let pools = Pools::new(list.clone())?;
    // Per function the pools of its domains, once; every instance of it shares that set.
    let function_pools = (0..plan.functions.len())
        .map(|f| {
            Pools::new(
                plan.domains_of(f as u8)
                    .into_iter()
                    .map(|d| list[d].clone())
                    .collect(),
            )
        })
        .collect::<Result<Vec<_>, _>>()?;
    let party_pools: Vec<Pools> = plan
        .party_function
        .iter()
        .enumerate()
        .map(|(p, &f)| {
            if p < usize::from(gateway_threads) {
                pools.clone()
            } else {
                function_pools[f as usize].clone()
            }
        })
        .collect();
    let policy = Arc::new(
        plan.policy()
            .map_err(|e| TransportError::Layout(e.to_string()))?,
    );
    let mut transport = zerohop_transport::create(backend, &spec.name, &policy, plan.options())?;
    // The agent is only the gateway's parties; it keeps the rest as bare descriptors.
    transport.act_only_as(&(0..gateway_threads).collect::<Vec<_>>())?;
    // What the agent's own parties (gateway threads, relays) see of each sender's invalid
    // descriptors: the only counts the agent kills for.
    let receivers =
        usize::from(gateway_threads) + spec.functions.iter().filter(|f| f.relay.is_some()).count();
    let offences = Arc::new(crate::offence::Offences::new(
        usize::from(parties),
        crate::offence::limit(plan.queue_capacity, receivers),
    ));
    let mut senders = Vec::new();
    let mut endpoints = Vec::new();
    for g in 0..gateway_threads {
        senders.push(transport.sender(g)?);
        endpoints.push(
            Endpoint::new(pools.clone(), policy.clone(), g, transport.receiver(g)?)
                .with_blame(offences.clone()),
        );
    }
    let plan_json = plan.to_json();
    let state = match (spec.state, inherit.state) {
        (Some(g), Some(old)) => {
            if (old.capacity(), old.value_size()) != (g.entries as usize, g.value_size as usize) {
                return Err(AgentError::Confine(format!(
                    "the state store handed over holds {} entries of {} bytes, the spec asks \
                     for {} of {}",
                    old.capacity(),
                    old.value_size(),
                    g.entries,
                    g.value_size
                )));
            }
            Some(old)
        }
        (Some(g), None) => Some(Arc::new(zerohop_pool::State::create(
            &spec.name,
            zerohop_pool::StateConfig {
                entries: g.entries,
                value_size: g.value_size,
            },
        )?)),
        (None, _) => None,
    };
    let gateways = Gateways::new(
        pools.clone(),
        senders,
        Arc::new(plan),
        GatewayConfig {
            max_body: spec.max_body,
            timeout: spec.timeout,
            body_timeout: spec.body_timeout,
            max_connections: spec.max_connections,
        },
    );
    for g in 0..gateway_threads {
        pools.records(g).for_each(|r| {
            r.set_pid(std::process::id());
            r.set_state(PartyState::Ready);
        });
    }
    let (sockets, http_sockets, addr) = http_listeners(inherit.http, opts.listen, gateway_threads)?;
    let mut listeners = vec![format!("http://{addr}")];
    let (mqtt, coap) = bind_others(&spec, &opts, inherit.coap, &mut listeners)?;
    let coap_addr = coap.as_ref().and_then(|s| s.local_addr().ok());
    let coap_socket = match &coap {
        Some(c) => Some(
            c.as_fd()
                .try_clone_to_owned()
                .map(std::net::UdpSocket::from)
                .map_err(|source| AgentError::ListenOther {
                    protocol: "coap",
                    addr: coap_addr.unwrap_or(addr),
                    source,
                })?,
        ),
        None => None,
    };
    // Per gateway thread the sockets it accepts from: socket i goes to thread i % threads,
    // and a thread left without one shares another's (inherited from a chain with fewer
    // gateway threads).
    let threads_n = usize::from(gateway_threads);
    let mut per_thread: Vec<Vec<std::net::TcpListener>> =
        (0..threads_n).map(|_| Vec::new()).collect();
    for (g, mine) in per_thread.iter_mut().enumerate().skip(sockets.len()) {
        mine.push(
            sockets[g % sockets.len()]
                .try_clone()
                .map_err(|source| AgentError::Listen { addr, source })?,
        );
    }
    for (i, s) in sockets.into_iter().enumerate() {
        per_thread[i % threads_n].push(s);
    }
    let (http_stop, http_rx) = watch::channel(false);
    let (instance_stop, stop_rx) = watch::channel(false);
    let mut endpoints = endpoints.into_iter();
    let first = endpoints.next().expect("at least one gateway");
    let mut per_thread = per_thread.into_iter();
    let first_listeners = per_thread
        .next()
        .expect("at least one gateway")
        .into_iter()
        .map(TcpListener::from_std)
        .collect::<std::io::Result<Vec<_>>>()
        .map_err(|source| AgentError::Listen { addr, source })?;
    let mut threads = Vec::new();
    let mut served = Vec::new();
    for ((gw, endpoint), sockets) in gateways.iter().skip(1).zip(endpoints).zip(per_thread) {
        let started = spawn_gateway(
            gw.clone(),
            endpoint,
            sockets,
            addr,
            http_rx.clone(),
            stop_rx.clone(),
        );
        match started.await {
            Ok((t, s)) => {
                threads.push(t);
                served.push(s);
            }
            Err(e) => {
                let _ = http_stop.send(true);
                let _ = instance_stop.send(true);
                join_threads(threads).await;
                return Err(e);
            }
        }
    }
    let mut receiving = Some(gateways.iter().next().expect("one").start_receiving(first));
    tracing::info!(chain = %spec.name, "{}", jail.describe());
    let shared = Arc::new(Shared {
        party_pools,
        transport,
        gateways,
        offences,
        plan_json,
        jail,
        functions: spec
            .functions
            .iter()
            .zip(programs)
            .zip(&paths)
            .map(|((f, program), path)| {
                std::sync::RwLock::new(Arc::new(FunctionRun {
                    generation: 0,
                    program,
                    command: f.command.clone(),
                    env: f.env.clone(),
                    resources: f.resources,
                    fingerprint: Fingerprint::of(path),
                }))
            })
            .collect(),
        rolling: spec
            .functions
            .iter()
            .map(|_| std::sync::atomic::AtomicBool::new(false))
            .collect(),
        scale: std::sync::Mutex::new(spec.functions.iter().map(|f| f.scale).collect()),
        rescale: tokio::sync::Notify::new(),
        timeout: spec.timeout,
        parties: (0..parties)
            .map(|_| PartyControl::new(Want::Stop))
            .collect(),
        state,
        http_sockets,
        coap_socket,
        stateful: spec.functions.iter().map(|f| f.state).collect(),
        logs: {
            let names: Vec<&str> = spec.functions.iter().map(|f| f.name.as_str()).collect();
            let book = LogBook::new(&spec.name, &names, crate::logs::DEFAULT_CAPACITY);
            if opts.echo_logs {
                book.with_echo()
            } else {
                book
            }
        },
    });

    // Start every instance, then wait until all have attached. On failure every instance
    // already started is stopped and reaped before the error is returned: nothing is left.
    let mut instances: Vec<(InstanceSpec, Option<Instance>)> = Vec::new();
    let mut relays = Vec::new();
    if let Err(e) = start_instances(&spec, &shared, &opts, &mut instances, &mut relays).await {
        for (inst, instance) in &mut instances {
            if let Some(i) = instance {
                supervise::terminate(&shared, inst.party, i).await;
            }
        }
        join_threads(relays.into_iter().map(|r| r.stop()).collect()).await;
        // What they printed (why they failed) is read and echoed before the error returns,
        // and its last lines go into the error (a daemon has no terminal to echo to).
        shared.logs.close().await;
        let e = match e {
            AgentError::NotReady {
                function,
                party,
                what,
                ..
            } => {
                let lines: Vec<String> = shared
                    .logs
                    .snapshot(Some(&function), 50)
                    .into_iter()
                    .filter(|l| l.instance == party)
                    .map(|l| l.text)
                    .collect();
                let last = &lines[lines.len().saturating_sub(5)..];
                AgentError::NotReady {
                    function,
                    party,
                    what,
                    output: if last.is_empty() {
                        String::new()
                    } else {
                        format!("; its last output: {}", last.join(" | "))
                    },
                }
            }
            e => e,
        };
        if let Some(r) = receiving.take() {
            r.stop().await;
        }
        let _ = http_stop.send(true);
        let _ = instance_stop.send(true);
        join_threads(threads).await;
        return Err(e);
    }

    let supervisors = instances
        .into_iter()
        .map(|(inst, instance)| {
            tokio::spawn(supervise::supervise(
                shared.clone(),
                inst,
                instance,
                stop_rx.clone(),
            ))
        })
        .collect();
    let scaler = tokio::spawn(crate::scale::run(shared.clone(), stop_rx.clone()));
    let wakers = match crate::scale::Wakers::start(&shared) {
        Ok(w) => Some(w),
        Err(e) => {
            tracing::warn!(
                "cannot start the scaler's waker thread: {e}; a function sending to another \
                 with no ready instance waits for the scaler's next look (10 ms)"
            );
            None
        }
    };
    let enforcer = tokio::spawn(crate::offence::enforce(shared.clone(), stop_rx.clone()));
    let watchdog = tokio::spawn(watchdog::watch(shared.clone(), spec.timeout, stop_rx));
    let first = shared.gateways.iter().next().expect("one").clone();
    let mut others = Vec::new();
    if let Some(m) = mqtt {
        others.push(tokio::spawn(first.clone().serve_mqtt(m, http_rx.clone())));
    }
    if let Some(c) = coap {
        others.push(tokio::spawn(first.clone().serve_coap(c, http_rx.clone())));
    }
    let server = tokio::spawn(serve_all(first, first_listeners, http_rx));
    let summary = format!(
        "transport {backend}; gateway threads: {gateway_threads}; functions: {}",
        spec.functions
            .iter()
            .map(|f| format!("{} x{}", f.name, f.instances))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let view = crate::status::ChainView {
        shared: shared.clone(),
        name: spec.name.clone(),
        spec_file: spec.file.display().to_string(),
        listeners: listeners.clone(),
        started: Instant::now(),
    };
    Ok(Running {
        view,
        addr,
        listeners,
        coap: coap_addr,
        others,
        shared,
        http_stop,
        instance_stop,
        server,
        supervisors,
        watchdog,
        enforcer,
        scaler,
        wakers,
        receiving,
        relays,
        gateway_threads: threads,
        served,
        summary,
    })
}

/// Starts every party of `spec` as the chain comes up: per function its `initial`
/// instances serving, then up to `parked` more waiting parked, the rest without a process;
/// waits until every started one has attached (serving or parked).
async fn start_instances(
    spec: &ChainSpec,
    shared: &Arc<Shared>,
    opts: &UpOptions,
    instances: &mut Vec<(InstanceSpec, Option<Instance>)>,
    relays: &mut Vec<crate::relay::RelayParty>,
) -> Result<(), AgentError> {
    let plan = shared.gateways.plan().clone();
    let mut relaying = Vec::new();
    for (index, f) in spec.functions.iter().enumerate() {
        let parties = plan.parties_of(index as u8);
        if let Some(peer) = f.relay {
            // Played here: its first party relays, the spare one stays unused.
            let spawn_err = |source: std::io::Error| AgentError::Spawn {
                function: f.name.clone(),
                program: format!("relay to {peer}"),
                source,
            };
            let link = opts.link.as_ref().ok_or_else(|| {
                spawn_err(std::io::Error::other(
                    "the function runs on a peer node, and this agent has no peer link",
                ))
            })?;
            for (k, party) in parties.into_iter().enumerate() {
                let want = if k == 0 { Want::Run } else { Want::Stop };
                if let Some(c) = shared.parties.get(party as usize) {
                    c.want.send_replace(want);
                }
                if want == Want::Stop {
                    shared.set_state(party, PartyState::Stopped);
                    continue;
                }
                shared.set_state(party, PartyState::Starting);
                let inst = InstanceSpec {
                    party,
                    index,
                    function: f.name.clone(),
                };
                relays.push(crate::relay::start(shared, &inst, peer, link).map_err(spawn_err)?);
                relaying.push((f.name.clone(), party));
            }
            continue;
        }
        let serving = usize::from(f.scale.initial);
        let parked = usize::from(f.scale.parked).min(parties.len().saturating_sub(serving));
        for (k, party) in parties.into_iter().enumerate() {
            let want = if k < serving {
                Want::Run
            } else if k < serving + parked {
                Want::Park
            } else {
                Want::Stop
            };
            if let Some(c) = shared.parties.get(party as usize) {
                c.want.send_replace(want);
            }
            let inst = InstanceSpec {
                party,
                index,
                function: f.name.clone(),
            };
            if want == Want::Stop {
                shared.set_state(party, PartyState::Stopped);
                instances.push((inst, None));
                continue;
            }
            let child = supervise::spawn(shared, &inst, want == Want::Park).map_err(|source| {
                AgentError::Spawn {
                    function: f.name.clone(),
                    program: f.command[0].clone(),
                    source,
                }
            })?;
            instances.push((inst, Some(child)));
        }
    }
    let attached = |party: u16| match shared.want_of(party) {
        Want::Run => shared.ready(party),
        Want::Park => shared.state(party) == PartyState::Parked,
        Want::Stop => true,
    };
    let deadline = Instant::now() + opts.ready_timeout;
    loop {
        let mut all_ready = true;
        for (inst, instance) in instances.iter_mut() {
            let Some(instance) = instance else { continue };
            if let Ok(Some(status)) = instance.child.try_wait() {
                return Err(AgentError::NotReady {
                    function: inst.function.clone(),
                    party: inst.party,
                    what: format!("exited ({status})"),
                    output: String::new(),
                });
            }
            all_ready &= attached(inst.party);
        }
        if let Some((function, party)) = relaying.iter().find(|(_, p)| !shared.ready(*p)) {
            all_ready = false;
            if Instant::now() > deadline {
                return Err(AgentError::NotReady {
                    function: function.clone(),
                    party: *party,
                    what: format!("(relaying) did not attach within {:?}", opts.ready_timeout),
                    output: String::new(),
                });
            }
        }
        if all_ready {
            return Ok(());
        }
        if Instant::now() > deadline {
            let (inst, _) = instances
                .iter()
                .find(|(i, _)| !attached(i.party))
                .expect("some instance is not ready");
            return Err(AgentError::NotReady {
                function: inst.function.clone(),
                party: inst.party,
                what: format!("did not attach within {:?}", opts.ready_timeout),
                output: String::new(),
            });
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
