//! Bringing a chain up and down.
//!
//! [`up_with`] is a sequence of stages, each returning what it owns:
//!
//! ```text
//! validate ─► confine ─► wire ─────────► bind ─► start gateways ─► share ─► start instances ─► supervise
//! (programs,  (jail,     (pools,          (HTTP,   (gateway          (Shared) (spawn, relay,      (supervisors,
//!  transport,  programs)  transport,       MQTT,    threads,                   wait until every   scaler, enforcer,
//!  threads,               gateway's        CoAP)    receiving)                 one attached)      watchdog, servers)
//!  plan)                  parties, state)
//! ```
//!
//! A stage that fails undoes what the stages before it started (the gateway's threads, the
//! instances already spawned); memory, descriptors and sockets go with their owners.
//! [`Running::shutdown`] takes a chain down in the reverse order.

mod cores;
mod deferred;
mod instances;
mod jail;
mod listen;
mod validate;
mod wire;

pub(crate) use validate::check_program;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use zerohop_gateway::Gateways;
use zerohop_pool::{PoolError, Pools};
use zerohop_transport::{Backend, TransportError};

use self::listen::join_threads;
use crate::confine::{CgroupMode, ConfineError, UidRange};
use crate::logs::LogBook;
use crate::parties::{Parties, PartyControl, Want};
use crate::shared::{Listeners, Scaling, Shared};
use crate::spec::{ChainSpec, SpecError};
use crate::supervise::{Fingerprint, FunctionRun, Launch};

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
    /// The folder of async requests cannot be used.
    #[error("the chain's async requests: {0}")]
    Deferred(#[from] zerohop_gateway::DeferredError),
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
    #[error(transparent)]
    Confine(#[from] ConfineError),
    /// A function's program could not be prepared.
    #[error("function '{function}': {source}")]
    Program {
        /// Function name.
        function: String,
        /// What is wrong.
        source: ConfineError,
    },
    /// The state store handed over by the chain this one replaces has another shape than
    /// the spec asks for.
    #[error(
        "the state store handed over holds {entries} entries of {value_size} bytes, the spec \
         asks for {want_entries} of {want_value_size}"
    )]
    StateShape {
        /// Entries of the store handed over.
        entries: usize,
        /// Its value size.
        value_size: usize,
        /// Entries the spec asks for.
        want_entries: u32,
        /// Value size the spec asks for.
        want_value_size: u32,
    },
    /// The chain's own async runtime (its thread in a daemon) could not be started.
    #[error("cannot start the chain's runtime: {0}")]
    Runtime(#[source] std::io::Error),
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

    /// Base URL of the gateway: `http://ADDR`, or `https://ADDR` when the spec has `tls`.
    pub fn url(&self) -> String {
        self.listeners[0].clone()
    }

    /// Every way into the chain as a URL: `http://ADDR` (`https://ADDR` with `tls`), then
    /// `mqtt://ADDR` (the gateway is the broker) and `mqtts://ADDR` (its TLS listener),
    /// `mqtt://HOST:PORT (subscribing)` (it subscribes at a broker) and `coap://ADDR` when
    /// the spec has them; real ports, also when 0 was asked for.
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
        self.shared.launch.state().map(Arc::as_ref)
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
            .filter(|&p| self.shared.parties.want_of(p) == Want::Run)
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
            .get(party)
            .map_or(0, PartyControl::restarts)
    }

    /// The uid the chain's instances run as (seen from outside their namespace).
    pub fn uid(&self) -> u32 {
        self.shared.launch.jail().uid()
    }

    /// Pid of party `party`'s running instance (it leads its own process group), from the
    /// agent's own records; `None` when it has none right now.
    pub fn instance_pid(&self, party: u16) -> Option<u32> {
        Some(self.shared.parties.pgid(party)).filter(|&p| p != 0)
    }

    /// CPU time, memory and CPU throttling of party `party`'s running instance, from its
    /// cgroups; `None` when it has no instance or no cgroup right now.
    pub fn instance_usage(&self, party: u16) -> Option<crate::confine::Usage> {
        let probe = self.shared.parties.get(party)?.usage();
        probe.map(|p| p.read())
    }

    /// What the instances print: see [`LogBook`].
    pub fn logs(&self) -> &LogBook {
        self.shared.launch.logs()
    }

    /// One line: who instances run as, and their cgroup.
    pub fn confinement(&self) -> String {
        self.shared.launch.jail().describe()
    }

    /// Stops accepting, lets open requests finish (up to the chain timeout), stops every
    /// instance (SIGTERM, then SIGKILL), stops the receive thread and releases the pool.
    pub async fn shutdown(self) {
        self.shutdown_inner(false).await;
    }

    /// Shuts down a chain whose listeners another chain took over (`ChainView::handover`
    /// gave them, [`up_with`] serves them): it stops accepting (the new chain accepts from
    /// the same sockets), answers what its connections still send with `Connection: close`
    /// until they are closed, then shuts down as [`Running::shutdown`] does. No accepted
    /// request goes unanswered, and a keep-alive client is moved to the new chain between
    /// two requests.
    ///
    pub async fn wind_down(self) {
        self.shutdown_inner(true).await;
    }

    async fn shutdown_inner(mut self, handed_over: bool) {
        deferred::stop(&self.shared.gateways);
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
        self.shared.launch.logs().close().await;
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
    let validate::Validated {
        paths,
        backend,
        gateway_threads,
        plan,
    } = validate::validate(&spec, &opts)?;
    let (jail, programs) = jail::confine(&spec, &opts, inherit.data, &paths)?;
    let wired = wire::wire(&spec, backend, gateway_threads, plan, inherit.state)?;
    let mut bound = listen::bind_all(&spec, &opts, inherit.http, inherit.coap, gateway_threads)?;
    let per_thread = std::mem::take(&mut bound.per_thread);
    let gateways = listen::start_gateways(
        &wired.gateways,
        wired.endpoints,
        per_thread,
        bound.addr,
        bound.tls.clone(),
    )
    .await?;
    tracing::info!(chain = %spec.name, "{}", jail.describe());
    let runs = spec
        .functions
        .iter()
        .zip(programs)
        .zip(&paths)
        .map(|((f, program), path)| FunctionRun {
            generation: 0,
            program,
            command: f.command.clone(),
            env: f.env.clone(),
            resources: f.resources,
            fingerprint: Fingerprint::of(path),
        })
        .collect();
    let logs = {
        let names: Vec<&str> = spec.functions.iter().map(|f| f.name.as_str()).collect();
        let book = LogBook::new(&spec.name, &names, crate::logs::DEFAULT_CAPACITY);
        if opts.echo_logs {
            book.with_echo()
        } else {
            book
        }
    };
    let shared = Arc::new(Shared {
        parties: Parties::new(wired.party_pools, wired.gateways.plan()),
        launch: Launch::new(
            runs,
            spec.functions.iter().map(|f| f.state).collect(),
            wired.state,
            wired.plan_json,
            jail,
            logs,
            spec.timeout,
        ),
        scaling: Arc::new(Scaling::new(
            spec.functions.iter().map(|f| f.scale).collect(),
        )),
        listeners: Listeners::new(
            std::mem::take(&mut bound.http_sockets),
            bound.coap_socket.take(),
        ),
        gateways: wired.gateways,
        transport: wired.transport,
        offences: wired.offences,
    });
    let (instances, relays, gateways) =
        instances::start_all(&spec, &shared, &opts, gateways).await?;
    let summary = format!(
        "transport {backend}; gateway threads: {gateway_threads}; functions: {}",
        spec.functions
            .iter()
            // A fused group is one set of instances: `upper+exclaim x2`.
            .filter(|f| f.fused_into.is_none())
            .map(|f| {
                let names = std::iter::once(&f.name).chain(&f.fused_with);
                let names: Vec<&str> = names.map(String::as_str).collect();
                format!("{} x{}", names.join("+"), f.instances)
            })
            .collect::<Vec<_>>()
            .join(", ")
    );
    deferred::start(&shared.gateways);
    Ok(instances::supervise_all(
        &spec, summary, shared, instances, relays, gateways, bound,
    ))
}
