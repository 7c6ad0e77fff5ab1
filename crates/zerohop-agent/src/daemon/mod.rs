//! The node daemon (`zerohop agent`): hosts many chains at once, each in its own security
//! domain, and serves the admin API ([`admin`]) on a unix socket and Prometheus metrics
//! ([`metrics`]) on a TCP port.
//!
//! Each chain runs on a thread of its own (`chain-NAME`) with its own single-threaded
//! runtime: its gateway's first party, supervisors and watchdog live there, and the
//! parent-death signal of its reaper, spawner and instances follows that thread, which lives
//! exactly as long as the chain. Adding, changing or removing one chain therefore touches no
//! other: nothing is shared between chains but the daemon's table of them.

pub mod admin;
pub mod metrics;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::oneshot;

use crate::api::{Applied, ApplyRequest, ApplyResponse, ChainStatus, ChainSummary, DownResponse};
use crate::spec::{self, ChainSpec};
use crate::{up_with, AgentError, CgroupMode, ChainView, UidRange, UpOptions};

/// How the daemon runs.
#[derive(Clone, Debug)]
pub struct DaemonOptions {
    /// The admin socket.
    pub socket: PathBuf,
    /// Where Prometheus metrics are served (`None`: nowhere).
    pub metrics: Option<SocketAddr>,
    /// Uids chains may run under when the daemon is root (one per chain).
    pub uid_range: UidRange,
    /// Which cgroup hierarchy instances are put in.
    pub cgroups: CgroupMode,
    /// Where peer daemons reach this one, and the secret they share (chains split over
    /// nodes); `None`: no hops to or from other nodes.
    pub peer: Option<PeerOptions>,
}

/// How daemons of a cluster reach each other (see [`zerohop_link`]).
#[derive(Clone, Debug)]
pub struct PeerOptions {
    /// The address peer daemons connect to.
    pub listen: SocketAddr,
    /// What they authenticate each other with.
    pub secret: Arc<zerohop_link::Secret>,
}

/// The admin socket when none is given: `/run/zerohop/admin.sock` as root, else
/// `$XDG_RUNTIME_DIR/zerohop/admin.sock`, else `/tmp/zerohop-UID/admin.sock`. Anyone can make
/// `/tmp/zerohop-UID` first, so its folder is never trusted for its name: the daemon and the
/// CLI check who owns it and who may write it ([`admin::socket`]).
pub fn default_socket() -> PathBuf {
    if nix::unistd::geteuid().is_root() {
        return PathBuf::from("/run/zerohop/admin.sock");
    }
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(d) if !d.is_empty() => Path::new(&d).join("zerohop/admin.sock"),
        _ => PathBuf::from(format!(
            "/tmp/zerohop-{}/admin.sock",
            nix::unistd::geteuid()
        )),
    }
}

/// Why the daemon refused a request; maps to one HTTP status.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// The request was malformed (400).
    #[error("{0}")]
    BadRequest(String),
    /// The spec is invalid (422).
    #[error(transparent)]
    Spec(#[from] spec::SpecError),
    /// No chain of that name (404).
    #[error("no chain named '{0}' runs here; `zerohop ls` lists them")]
    NoChain(String),
    /// The request conflicts with what runs (409).
    #[error("{0}")]
    Conflict(String),
    /// The chain could not be brought up or changed (500).
    #[error("{0}")]
    Agent(#[from] AgentError),
    /// Something else failed (500).
    #[error("{0}")]
    Internal(String),
}

impl DaemonError {
    /// The HTTP status of this error.
    pub fn status(&self) -> u16 {
        match self {
            DaemonError::BadRequest(_) => 400,
            DaemonError::NoChain(_) => 404,
            DaemonError::Conflict(_) => 409,
            DaemonError::Spec(_) => 422,
            DaemonError::Agent(AgentError::Spec(_)) => 422,
            DaemonError::Agent(_) | DaemonError::Internal(_) => 500,
        }
    }
}

/// One chain the daemon runs.
struct Hosted {
    view: ChainView,
    spec: ChainSpec,
    /// The spec's text when it was applied (an identical re-apply changes nothing).
    text: String,
    /// Tells the chain's thread to shut the chain down: at once (`false`), or winding its
    /// connections down because another chain took its listeners over (`true`).
    stop: Option<oneshot::Sender<bool>>,
    /// Resolves when the chain is down.
    done: Option<oneshot::Receiver<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// The daemon's state: its chains.
pub struct Daemon {
    opts: DaemonOptions,
    chains: Mutex<BTreeMap<String, Hosted>>,
    /// One apply or down at a time (they are rare; status reads never wait for them).
    changing: tokio::sync::Mutex<()>,
    metrics_url: Mutex<Option<String>>,
    started: Instant,
    /// How its chains reach peer daemons (set by [`run_with`] when peers are configured).
    link: std::sync::OnceLock<crate::relay::Link>,
}

impl Daemon {
    /// A daemon with no chains yet.
    pub fn new(opts: DaemonOptions) -> Arc<Self> {
        Arc::new(Self {
            opts,
            chains: Mutex::new(BTreeMap::new()),
            changing: tokio::sync::Mutex::new(()),
            metrics_url: Mutex::new(None),
            started: Instant::now(),
            link: std::sync::OnceLock::new(),
        })
    }

    /// The options it runs with.
    pub fn options(&self) -> &DaemonOptions {
        &self.opts
    }

    /// Seconds since the daemon started.
    pub fn uptime_s(&self) -> u64 {
        self.started.elapsed().as_secs()
    }

    pub(crate) fn set_metrics_url(&self, url: Option<String>) {
        *self.metrics_url.lock().unwrap_or_else(|p| p.into_inner()) = url;
    }

    /// The Prometheus endpoint, once it listens.
    pub fn metrics_url(&self) -> Option<String> {
        self.metrics_url
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn table(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Hosted>> {
        self.chains.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Handles on every running chain, by name.
    pub fn views(&self) -> Vec<ChainView> {
        self.table().values().map(|h| h.view.clone()).collect()
    }

    /// The chain named `name`.
    pub fn view(&self, name: &str) -> Result<ChainView, DaemonError> {
        self.table()
            .get(name)
            .map(|h| h.view.clone())
            .ok_or_else(|| DaemonError::NoChain(name.to_owned()))
    }

    /// `zerohop ls`.
    pub fn list(&self) -> Vec<ChainSummary> {
        self.views()
            .iter()
            .map(|v| {
                let s = v.status();
                ChainSummary {
                    name: s.name,
                    listeners: s.listeners,
                    functions: s.functions.len(),
                    instances: s.functions.iter().map(|f| f.ready).sum(),
                    ok: s.gateway.ok,
                    errors: s.gateway.errors,
                    uptime_s: s.uptime_s,
                }
            })
            .collect()
    }

    /// `zerohop status NAME`.
    pub fn status(&self, name: &str) -> Result<ChainStatus, DaemonError> {
        let mut s = self.view(name)?.status();
        s.metrics_url = self.metrics_url();
        Ok(s)
    }

    /// `zerohop apply`: brings a new chain up, or changes a running one.
    pub async fn apply(&self, req: ApplyRequest) -> Result<ApplyResponse, DaemonError> {
        let path = PathBuf::from(&req.path);
        if !path.is_absolute() {
            return Err(DaemonError::BadRequest(format!(
                "the spec path `{}` must be absolute (the daemon resolves relative program paths \
                 against its folder)",
                req.path
            )));
        }
        let mut spec = spec::parse(&path, &req.text)?;
        if let Some(split) = &req.split {
            if self.link.get().is_none() {
                return Err(DaemonError::BadRequest(format!(
                    "chain '{}' is split over nodes, and this daemon has no peers (start it \
                     with --peer-secret)",
                    spec.name
                )));
            }
            spec = crate::split::split(&spec, &split.local, &split.peers).map_err(|e| {
                DaemonError::BadRequest(format!("chain '{}' cannot be split: {e}", spec.name))
            })?;
        }
        let listen =
            match &req.listen {
                Some(l) => Some(l.parse::<SocketAddr>().map_err(|_| {
                    DaemonError::BadRequest(format!("--listen `{l}` is not IP:PORT"))
                })?),
                None => None,
            };
        let _one = self.changing.lock().await;
        let name = spec.name.clone();
        let running = self
            .table()
            .get(&name)
            .map(|h| (h.view.clone(), h.spec.clone(), h.text.clone()));
        if let Some((view, old, old_text)) = running {
            if old.file != spec.file {
                return Err(DaemonError::Conflict(format!(
                    "chain '{name}' already runs from {}; apply that file, or `zerohop down                      {name}` first",
                    old.file.display()
                )));
            }
            let paths = spec
                .functions
                .iter()
                .map(|f| crate::chain::check_program(&spec, f))
                .collect::<Result<Vec<_>, _>>()?;
            let change = view.plan_update(&old, &spec, &paths).map_err(|why| {
                DaemonError::Conflict(format!(
                    "chain '{name}' cannot change while it runs: {why}; to apply this spec, \
                     `zerohop down {name}` and apply it again"
                ))
            })?;
            let plan = match change {
                crate::update::Change::InPlace(plan) => plan,
                crate::update::Change::Replace(why) => {
                    return self.replace(view, old, spec, req.text, listen, why).await;
                }
            };
            let changes = plan.changes.clone();
            let applied = if plan.is_empty() && old_text == req.text {
                Applied::Unchanged
            } else {
                for c in &changes {
                    tracing::info!(chain = %name, "updating: {c}");
                }
                view.update(&spec, plan)
                    .await
                    .map_err(|e| DaemonError::Conflict(e.to_string()))?;
                if let Some(h) = self.table().get_mut(&name) {
                    h.spec = spec;
                    h.text = req.text;
                }
                Applied::Updated
            };
            let mut status = view.status();
            status.metrics_url = self.metrics_url();
            return Ok(ApplyResponse {
                applied,
                changes,
                status,
            });
        }
        let opts = self.chain_options(listen.or(spec.listen));
        let hosted = host(spec, req.text, opts, crate::Inherit::default()).await?;
        let mut status = hosted.view.status();
        status.metrics_url = self.metrics_url();
        tracing::info!(chain = %name, "applied: {}", status.listeners.join(", "));
        self.table().insert(name, hosted);
        Ok(ApplyResponse {
            applied: Applied::Created,
            changes: Vec::new(),
            status,
        })
    }

    /// `zerohop down NAME`: stops the chain with nothing left behind.
    pub async fn down(&self, name: &str) -> Result<DownResponse, DaemonError> {
        let _one = self.changing.lock().await;
        let hosted = self
            .table()
            .remove(name)
            .ok_or_else(|| DaemonError::NoChain(name.to_owned()))?;
        let answered = {
            let s = hosted.view.status();
            s.gateway.ok + s.gateway.errors
        };
        stop(hosted, false).await;
        tracing::info!(chain = %name, "down");
        Ok(DownResponse {
            name: name.to_owned(),
            answered,
        })
    }

    /// Stops every chain (the daemon is shutting down).
    pub async fn down_all(&self) {
        let _one = self.changing.lock().await;
        let all: Vec<Hosted> = std::mem::take(&mut *self.table()).into_values().collect();
        for h in all {
            let name = h.view.name().to_owned();
            stop(h, false).await;
            tracing::info!(chain = %name, "down");
        }
    }
}

impl Daemon {
    /// How a chain of this daemon comes up: on `listen`, else a free port of 127.0.0.1,
    /// under the daemon's uid range and cgroup mode, its output kept in its log book only.
    fn chain_options(&self, listen: Option<SocketAddr>) -> UpOptions {
        UpOptions {
            listen: listen.unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 0))),
            uid_range: self.opts.uid_range,
            cgroups: self.opts.cgroups,
            echo_logs: false,
            link: self.link.get().cloned(),
            ..UpOptions::default()
        }
    }

    /// Answers a hop a peer daemon relays to chain `call.chain` of this node.
    async fn relayed(&self, call: zerohop_link::Call) -> zerohop_link::Answer {
        use zerohop_link::Answer;
        let view = self.table().get(&call.chain).map(|h| h.view.clone());
        let Some(view) = view else {
            return Answer {
                status: 503,
                flags: 0,
                payload: format!("chain '{}' does not run on this node", call.chain).into_bytes(),
            };
        };
        let timeout = std::time::Duration::from_millis(u64::from(call.deadline_ms));
        match view
            .relayed(
                call.route,
                &call.function,
                &call.meta,
                &call.payload,
                timeout,
            )
            .await
        {
            Ok(r) => Answer {
                status: r.status.as_u16(),
                flags: if r.left { Answer::LEFT } else { 0 },
                // The reply's own buffer (the gateway's one copy out), not a copy of it.
                payload: Vec::from(r.body),
            },
            Err((status, message)) => Answer {
                status,
                flags: 0,
                payload: message.into_bytes(),
            },
        }
    }

    /// Applies `spec` to the running chain `view` (running `old`) by replacing it: the new
    /// chain comes up beside it, taking its listeners over (see [`crate::update`]), then the
    /// old one winds down. If the new one does not come up, the old one serves on.
    async fn replace(
        &self,
        view: ChainView,
        old: ChainSpec,
        spec: ChainSpec,
        text: String,
        listen: Option<SocketAddr>,
        why: String,
    ) -> Result<ApplyResponse, DaemonError> {
        let name = spec.name.clone();
        tracing::info!(chain = %name, "replacing: {why}");
        let wanted = listen.or(spec.listen);
        let inherit = view.handover(&old, &spec, wanted).map_err(|e| {
            DaemonError::Internal(format!(
                "chain '{name}': cannot hand its sockets over to a new chain: {e}"
            ))
        })?;
        let kept_address = !inherit.http.is_empty();
        let opts = self.chain_options(wanted);
        let started = Instant::now();
        let new = host(spec, text, opts, inherit).await.map_err(|e| {
            DaemonError::Conflict(format!(
                "chain '{name}' was to be replaced ({why}), but the new chain did not come \
                 up: {e}; the running chain serves on unchanged"
            ))
        })?;
        let came_up = started.elapsed();
        let old_hosted = self.table().insert(name.clone(), new);
        if let Some(h) = old_hosted {
            stop(h, true).await;
        }
        let wound_down = started.elapsed() - came_up;
        let mut changes = vec![format!(
            "replaced: {why}; the new chain came up beside the old one in {} ms{}; the old one \
             finished what it had and stopped in {} ms",
            came_up.as_millis(),
            if kept_address {
                " on the same listening sockets"
            } else {
                ""
            },
            wound_down.as_millis()
        )];
        let status = self.status(&name)?;
        if !kept_address {
            changes.push(format!(
                "the chain now listens on {}",
                status.listeners.join(", ")
            ));
        }
        tracing::info!(chain = %name, "{}", changes.join("; "));
        Ok(ApplyResponse {
            applied: Applied::Replaced,
            changes,
            status,
        })
    }
}

/// Brings `spec` up on a thread of its own; returns once it serves.
async fn host(
    spec: ChainSpec,
    text: String,
    opts: UpOptions,
    inherit: crate::Inherit,
) -> Result<Hosted, DaemonError> {
    let (ready_tx, ready_rx) = oneshot::channel::<Result<ChainView, AgentError>>();
    let (stop_tx, stop_rx) = oneshot::channel::<bool>();
    let (done_tx, done_rx) = oneshot::channel::<()>();
    let kept = spec.clone();
    let thread = std::thread::Builder::new()
        .name(format!("chain-{}", spec.name))
        .spawn(move || {
            // As `zerohop up` does for its gateway thread.
            let _ = crate::confine::batch_scheduling();
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(r) => r,
                Err(e) => {
                    let _ = ready_tx.send(Err(AgentError::Runtime(e)));
                    return;
                }
            };
            runtime.block_on(async move {
                let running = match up_with(spec, opts, inherit).await {
                    Ok(r) => r,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                if ready_tx.send(Ok(running.view())).is_err() {
                    running.shutdown().await;
                    return;
                }
                // A dropped sender (the daemon is going away) stops the chain too.
                match stop_rx.await {
                    Ok(true) => running.wind_down().await,
                    _ => running.shutdown().await,
                }
                let _ = done_tx.send(());
            });
        })
        .map_err(|e| DaemonError::Internal(format!("cannot start the chain's thread: {e}")))?;
    match ready_rx.await {
        Ok(Ok(view)) => Ok(Hosted {
            view,
            spec: kept,
            text,
            stop: Some(stop_tx),
            done: Some(done_rx),
            thread: Some(thread),
        }),
        Ok(Err(e)) => {
            let _ = tokio::task::spawn_blocking(move || thread.join()).await;
            Err(e.into())
        }
        Err(_) => {
            let _ = tokio::task::spawn_blocking(move || thread.join()).await;
            Err(DaemonError::Internal(
                "the chain's thread ended before the chain came up".into(),
            ))
        }
    }
}

/// Shuts a hosted chain down and waits for its thread; `handed_over`: another chain took
/// its listeners over, so it winds its connections down first ([`Running::wind_down`]).
///
/// [`Running::wind_down`]: crate::Running::wind_down
async fn stop(mut h: Hosted, handed_over: bool) {
    if let Some(s) = h.stop.take() {
        let _ = s.send(handed_over);
    }
    if let Some(d) = h.done.take() {
        let _ = d.await;
    }
    if let Some(t) = h.thread.take() {
        let _ = tokio::task::spawn_blocking(move || t.join()).await;
    }
}

impl Daemon {
    /// `GET /v1/daemon`.
    pub fn describe(&self) -> crate::api::DaemonStatus {
        crate::api::DaemonStatus {
            pid: std::process::id(),
            version: env!("CARGO_PKG_VERSION").into(),
            socket: self.opts.socket.display().to_string(),
            metrics_url: self.metrics_url(),
            chains: self.table().len(),
        }
    }

    /// `zerohop scale NAME FUNCTION N`.
    pub async fn scale(
        &self,
        name: &str,
        function: &str,
        instances: u16,
    ) -> Result<ChainStatus, DaemonError> {
        let view = self.view(name)?;
        let b = view
            .scale(function, instances)
            .map_err(|e| DaemonError::BadRequest(e.to_string()))?;
        tracing::info!(
            chain = name,
            function,
            "scaled: min {} (max {}, target {} in flight per instance)",
            b.min,
            b.max,
            b.target
        );
        self.status(name)
    }

    /// `zerohop logs NAME [FUNCTION]`: the last `lines` lines (of `function`, or all), then
    /// with `follow` every new one until the client goes or the chain does; JSON lines on the
    /// returned channel. A follower too slow for the chain's output is told how many lines
    /// it missed, in a line of its own.
    pub fn logs(
        &self,
        name: &str,
        function: Option<&str>,
        lines: usize,
        follow: bool,
    ) -> Result<tokio::sync::mpsc::Receiver<bytes::Bytes>, DaemonError> {
        let view = self.view(name)?;
        let book = view.logs();
        if let Some(f) = function {
            if !book.functions().any(|n| n == f) {
                return Err(DaemonError::BadRequest(format!(
                    "chain '{name}' has no function '{f}'; its functions: {}",
                    book.functions().collect::<Vec<_>>().join(", ")
                )));
            }
        }
        // Subscribe before the snapshot, so no line falls between them (seq dedupes).
        let mut live = follow.then(|| book.follow());
        let past = book.snapshot(function, lines);
        let last_seq = past.last().map(|l| l.seq);
        let (tx, rx) = tokio::sync::mpsc::channel(256);
        let function = function.map(str::to_owned);
        let encode = |l: &crate::logs::LogLine| {
            let mut v = serde_json::to_vec(&crate::api::LogEntry {
                time: crate::logs::rfc3339(l.time),
                chain: l.chain.to_string(),
                function: l.function.to_string(),
                instance: l.instance,
                stream: l.stream.as_str().to_owned(),
                text: l.text.clone(),
            })
            .unwrap_or_default();
            v.push(b'\n');
            bytes::Bytes::from(v)
        };
        let chain = name.to_owned();
        tokio::spawn(async move {
            for l in &past {
                if tx.send(encode(l)).await.is_err() {
                    return;
                }
            }
            let Some(live) = live.as_mut() else { return };
            loop {
                let line = tokio::select! {
                    r = live.recv() => r,
                    _ = tx.closed() => return,
                };
                match line {
                    Ok(l) => {
                        if last_seq.is_some_and(|s| l.seq <= s)
                            || function.as_deref().is_some_and(|f| *l.function != *f)
                        {
                            continue;
                        }
                        if tx.send(encode(&l)).await.is_err() {
                            return;
                        }
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                        let note = crate::logs::LogLine {
                            seq: 0,
                            time: std::time::SystemTime::now(),
                            chain: chain.as_str().into(),
                            function: "zerohop".into(),
                            instance: 0,
                            stream: crate::logs::Stream::Stderr,
                            text: format!("[{n} lines skipped: this follower fell behind]"),
                            cut: false,
                        };
                        if tx.send(encode(&note)).await.is_err() {
                            return;
                        }
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                }
            }
        });
        Ok(rx)
    }
}

/// Runs the daemon until `shutdown` resolves: binds the metrics and peer ports and the admin socket,
/// prints one `ready` line on stdout, serves, then stops every chain and removes the socket.
pub async fn run(
    opts: DaemonOptions,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), DaemonError> {
    run_with(opts, shutdown, |_, _| async {}).await
}

/// [`run`], with `attach` running beside the admin API on the same daemon (a cluster
/// member's watch of what its node should run): it gets the daemon and a signal that turns
/// true at shutdown, and is awaited (at most 10 s) before the chains are stopped, so that it
/// can leave its cluster while every chain still answers.
pub async fn run_with<F, Fut>(
    opts: DaemonOptions,
    shutdown: impl std::future::Future<Output = ()>,
    attach: F,
) -> Result<(), DaemonError>
where
    F: FnOnce(Arc<Daemon>, tokio::sync::watch::Receiver<bool>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    // Every listener is bound before the ready line (and before the admin socket exists), so
    // whoever waits for either can use all of them, and a port in use leaves nothing behind.
    let peer_listener = match &opts.peer {
        Some(p) => Some(
            std::net::TcpListener::bind(p.listen)
                .and_then(|l| l.set_nonblocking(true).map(|()| l))
                .map_err(|e| {
                    DaemonError::Internal(format!(
                        "cannot listen for peer daemons on {}: {e}; pick another with --peer-listen",
                        p.listen
                    ))
                })?,
        ),
        None => None,
    };
    let metrics_listener = match opts.metrics {
        Some(addr) => Some(tokio::net::TcpListener::bind(addr).await.map_err(|e| {
            DaemonError::Internal(format!(
                "cannot listen for metrics on {addr}: {e}; pick another with --metrics"
            ))
        })?),
        None => None,
    };
    // Each of its errors names the socket or its folder and says what to do.
    let listener =
        admin::socket::bind(&opts.socket).map_err(|e| DaemonError::Internal(e.to_string()))?;
    let daemon = Daemon::new(opts.clone());
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stop_rx_attach = stop_rx.clone();
    let mut tasks = Vec::new();
    if let Some(l) = metrics_listener {
        let url = format!(
            "http://{}/metrics",
            l.local_addr()
                .map_err(|e| DaemonError::Internal(e.to_string()))?
        );
        daemon.set_metrics_url(Some(url));
        tasks.push(tokio::spawn(metrics::serve(
            daemon.clone(),
            l,
            stop_rx.clone(),
        )));
    }
    // Peer daemons: hops of split chains, both ways. It stops after the cluster watch (a
    // node leaving its cluster still answers its peers until its parts have moved).
    let (peer_stop, peer_stop_rx) = tokio::sync::watch::channel(false);
    let mut peer_server = None;
    let mut peer_runtime = None;
    if let (Some(p), Some(l)) = (&opts.peer, peer_listener) {
        let rt = PeerRuntime::start()
            .map_err(|e| DaemonError::Internal(format!("cannot start the peer thread: {e}")))?;
        let _ = daemon.link.set(crate::relay::Link::new(
            Arc::new(zerohop_link::Peers::new(p.secret.clone())),
            rt.handle.clone(),
        ));
        let d = daemon.clone();
        let handler = zerohop_link::handler(move |call| {
            let d = d.clone();
            async move { d.relayed(call).await }
        });
        let secret = p.secret.clone();
        peer_server = Some(rt.handle.spawn(async move {
            match tokio::net::TcpListener::from_std(l) {
                Ok(l) => zerohop_link::serve(l, secret, handler, peer_stop_rx).await,
                Err(e) => tracing::error!("peer listener: {e}"),
            }
        }));
        peer_runtime = Some(rt);
    }
    // The admin API last: a chain brought up through it finds the peer link in place.
    tasks.push(tokio::spawn(admin::serve(
        daemon.clone(),
        listener,
        stop_rx,
    )));
    {
        use std::io::Write;
        let mut out = std::io::stdout();
        let _ = writeln!(
            out,
            "zerohop: daemon ready on {}{}",
            opts.socket.display(),
            daemon
                .metrics_url()
                .map_or(String::new(), |u| format!(", metrics at {u}"))
        );
        let _ = out.flush();
    }
    let attached = tokio::spawn(attach(daemon.clone(), stop_rx_attach));
    shutdown.await;
    let _ = stop_tx.send(true);
    if tokio::time::timeout(std::time::Duration::from_secs(10), attached)
        .await
        .is_err()
    {
        tracing::warn!("the cluster watch did not stop within 10 s");
    }
    let _ = peer_stop.send(true);
    if let Some(p) = peer_server {
        let _ = p.await;
    }
    tracing::info!("stopping every chain");
    for t in tasks {
        let _ = t.await;
    }
    daemon.down_all().await;
    // Only now: the chains' relays used it until they stopped.
    drop(peer_runtime);
    let _ = std::fs::remove_file(&opts.socket);
    Ok(())
}

/// The runtime of the peer connections (both ways) and of the relays' calls: one thread of
/// its own, so a hop's frames, calls and answers never wait for (or wake) another worker
/// thread. Dropping it stops the thread; what still runs on it is dropped (a relayed
/// request still waiting is answered 500).
struct PeerRuntime {
    handle: tokio::runtime::Handle,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl PeerRuntime {
    fn start() -> std::io::Result<Self> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let handle = rt.handle().clone();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        std::thread::Builder::new()
            .name("peers".into())
            .spawn(move || {
                let _ = rt.block_on(stopped);
            })?;
        Ok(PeerRuntime {
            handle,
            stop: Some(stop),
        })
    }
}

impl Drop for PeerRuntime {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}
