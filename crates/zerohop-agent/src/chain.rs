//! Bringing a chain up and down.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use zerohop_gateway::{Gateway, GatewayConfig};
use zerohop_pool::{PartyState, Pool, PoolConfig, PoolError, Pools};
use zerohop_transport::{Backend, Endpoint, TransportError};

use crate::confine::{CgroupMode, Domain, Program, UidRange};
use crate::plan::plan_from_spec;
use crate::spec::{ChainSpec, SpecError};
use crate::supervise::{self, Instance, InstanceSpec, PartyControl, Shared};
use crate::watchdog;

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
        }
    }
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
    #[error(
        "function '{function}' (instance {party}) {what} before it was ready; see its output above"
    )]
    NotReady {
        /// Function name.
        function: String,
        /// Party index.
        party: u16,
        /// What happened.
        what: String,
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
    shared: Arc<Shared>,
    http_stop: watch::Sender<bool>,
    instance_stop: watch::Sender<bool>,
    server: JoinHandle<()>,
    supervisors: Vec<JoinHandle<()>>,
    watchdog: JoinHandle<()>,
    receiving: Option<zerohop_gateway::Receiving>,
    summary: String,
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

    /// One line describing the chain (transport, functions).
    pub fn summary(&self) -> &str {
        &self.summary
    }

    /// The gateway (stats, in-flight requests).
    pub fn gateway(&self) -> &Arc<Gateway> {
        &self.shared.gateway
    }

    /// The chain's pools, one per security domain (slot accounting).
    pub fn pools(&self) -> &Pools {
        self.shared.gateway.pools()
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
        self.shared.domain.uid()
    }

    /// Pid of party `party`'s running instance (it leads its own process group), from the
    /// agent's own records; `None` when it has none right now.
    pub fn instance_pid(&self, party: u16) -> Option<u32> {
        self.shared
            .parties
            .get(party as usize)
            .map(|c| c.pgid.load(std::sync::atomic::Ordering::Acquire))
            .filter(|&p| p != 0)
    }

    /// One line: who instances run as, and their cgroup.
    pub fn confinement(&self) -> String {
        self.shared.domain.describe()
    }

    /// Stops accepting, lets open requests finish (up to the chain timeout), stops every
    /// instance (SIGTERM, then SIGKILL), stops the receive thread and releases the pool.
    pub async fn shutdown(mut self) {
        let _ = self.http_stop.send(true);
        let _ = (&mut self.server).await;
        let _ = self.instance_stop.send(true);
        for s in self.supervisors.drain(..) {
            let _ = s.await;
        }
        let _ = (&mut self.watchdog).await;
        if let Some(r) = self.receiving.take() {
            r.stop().await;
        }
    }
}

/// Finds a function's program before anything is started: a path with a `/` as given, a
/// bare name in the agent's `PATH`.
fn check_program(
    spec: &ChainSpec,
    f: &crate::spec::FunctionSpec,
) -> Result<std::path::PathBuf, SpecError> {
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
    let mut paths = Vec::new();
    for f in &spec.functions {
        paths.push(check_program(&spec, f)?);
    }
    let domain =
        Domain::new(&spec.name, opts.uid_range, opts.cgroups).map_err(AgentError::Confine)?;
    let programs = spec
        .functions
        .iter()
        .zip(&paths)
        .map(|(f, path)| {
            Program::open(path, &f.syscalls, &domain).map_err(|message| AgentError::Program {
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
    let plan = plan_from_spec(&spec, backend.name(), spin_us);
    let parties = plan.parties();
    // One pool per security domain, numbered in disjoint slot ranges.
    let domains = plan.domains();
    if u64::from(spec.pool.slots) * domains.len() as u64 > 1 << 24 {
        return Err(AgentError::Spec(SpecError {
            file: spec.file.display().to_string(),
            line: 1,
            field: "pool.slots".into(),
            message: format!(
                "{} slots in each of the chain's {} security domains exceed the 16777216 \
                 slots a chain can number; lower pool.slots",
                spec.pool.slots,
                domains.len()
            ),
        }));
    }
    let mut list = Vec::new();
    for (i, _) in domains.iter().enumerate() {
        list.push(Arc::new(Pool::create(&PoolConfig {
            name: if domains.len() == 1 {
                spec.name.clone()
            } else {
                format!("{}:{i}", spec.name)
            },
            slots: spec.pool.slots,
            first_slot: i as u32 * spec.pool.slots,
            slot_size: spec.pool.slot_size,
            max_parties: parties,
            hugepages: spec.pool.hugepages,
        })?));
    }
    let pools = Pools::new(list.clone())?;
    let party_pools = plan
        .party_function
        .iter()
        .enumerate()
        .map(|(p, &f)| match p {
            0 => Ok(pools.clone()),
            _ => Pools::new(
                domains
                    .iter()
                    .zip(&list)
                    .filter(|(d, _)| d.functions.contains(&f))
                    .map(|(_, pool)| pool.clone())
                    .collect(),
            ),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let policy = Arc::new(
        plan.policy()
            .map_err(|e| TransportError::Layout(e.to_string()))?,
    );
    let transport = zerohop_transport::create(backend, &spec.name, &policy, plan.options())?;
    let endpoint = Endpoint::new(pools.clone(), policy, 0, transport.receiver(0)?);
    let plan_json = plan.to_json();
    let gateway = Gateway::new(
        pools.clone(),
        transport.sender(0)?,
        Arc::new(plan),
        GatewayConfig {
            max_body: spec.max_body,
            timeout: spec.timeout,
            body_timeout: spec.body_timeout,
            max_connections: spec.max_connections,
        },
    );
    pools.records(0).for_each(|r| {
        r.set_pid(std::process::id());
        r.set_state(PartyState::Ready);
    });
    let mut receiving = Some(gateway.start_receiving(endpoint));
    let listener = TcpListener::bind(opts.listen)
        .await
        .map_err(|source| AgentError::Listen {
            addr: opts.listen,
            source,
        })?;
    let addr = listener.local_addr().map_err(|source| AgentError::Listen {
        addr: opts.listen,
        source,
    })?;
    tracing::info!(chain = %spec.name, "{}", domain.describe());
    let shared = Arc::new(Shared {
        party_pools,
        transport,
        gateway,
        plan_json,
        domain,
        programs,
        parties: (0..parties).map(|_| PartyControl::default()).collect(),
    });

    // Start every instance, then wait until all have attached. On failure every instance
    // already started is stopped and reaped before the error is returned: nothing is left.
    let mut instances: Vec<(InstanceSpec, Instance)> = Vec::new();
    if let Err(e) = start_instances(&spec, &shared, &opts, &mut instances).await {
        for (inst, instance) in &mut instances {
            supervise::terminate(&shared, inst.party, instance).await;
        }
        if let Some(r) = receiving.take() {
            r.stop().await;
        }
        return Err(e);
    }

    let (instance_stop, stop_rx) = watch::channel(false);
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
    let watchdog = tokio::spawn(watchdog::watch(shared.clone(), spec.timeout, stop_rx));
    let (http_stop, http_rx) = watch::channel(false);
    let server = tokio::spawn(shared.gateway.clone().serve(listener, http_rx));
    let summary = format!(
        "transport {backend}; functions: {}",
        spec.functions
            .iter()
            .map(|f| format!("{} x{}", f.name, f.instances))
            .collect::<Vec<_>>()
            .join(", ")
    );
    Ok(Running {
        addr,
        shared,
        http_stop,
        instance_stop,
        server,
        supervisors,
        watchdog,
        receiving,
        summary,
    })
}

/// Spawns every instance of `spec` into `instances` and waits until all are ready.
async fn start_instances(
    spec: &ChainSpec,
    shared: &Arc<Shared>,
    opts: &UpOptions,
    instances: &mut Vec<(InstanceSpec, Instance)>,
) -> Result<(), AgentError> {
    let mut party = 1u16;
    for (index, f) in spec.functions.iter().enumerate() {
        for _ in 0..f.instances {
            let inst = InstanceSpec {
                party,
                index,
                function: f.name.clone(),
                command: f.command.clone(),
                env: f.env.clone(),
            };
            let child = supervise::spawn(shared, &inst).map_err(|source| AgentError::Spawn {
                function: f.name.clone(),
                program: f.command[0].clone(),
                source,
            })?;
            instances.push((inst, child));
            party += 1;
        }
    }
    let deadline = Instant::now() + opts.ready_timeout;
    loop {
        let mut all_ready = true;
        for (inst, instance) in instances.iter_mut() {
            if let Ok(Some(status)) = instance.child.try_wait() {
                return Err(AgentError::NotReady {
                    function: inst.function.clone(),
                    party: inst.party,
                    what: format!("exited ({status})"),
                });
            }
            all_ready &= shared.ready(inst.party);
        }
        if all_ready {
            return Ok(());
        }
        if Instant::now() > deadline {
            let (inst, _) = instances
                .iter()
                .find(|(i, _)| !shared.ready(i.party))
                .expect("some instance is not ready");
            return Err(AgentError::NotReady {
                function: inst.function.clone(),
                party: inst.party,
                what: format!("did not attach within {:?}", opts.ready_timeout),
            });
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
