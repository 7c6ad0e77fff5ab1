//! Stages 4 and 5 of bringing a chain up: its listening sockets (HTTP on every gateway
//! thread, MQTT and CoAP where the spec has them, or those a replaced chain hands over), then
//! the gateway's threads serving them. Party 0 runs on the caller's runtime; parties 1.. each
//! on a thread of its own.

use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::sync::Arc;

use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::watch;
use zerohop_gateway::{CertFiles, Gateway, Gateways, MqttIngress, Tls, TlsError};
use zerohop_transport::Endpoint;

use super::{AgentError, UpOptions};
use crate::spec::{CertSpec, ChainSpec, MqttSpec, SpecError};

/// What [`bind_all`] bound.
pub(super) struct Bound {
    /// The HTTP address.
    pub addr: SocketAddr,
    /// Every way in, as URLs.
    pub listeners: Vec<String>,
    /// Per gateway thread, the HTTP sockets it accepts from.
    pub per_thread: Vec<Vec<std::net::TcpListener>>,
    /// Every HTTP socket, kept to hand over to a chain that replaces this one.
    pub http_sockets: Vec<std::net::TcpListener>,
    /// The MQTT ingress, if any.
    pub mqtt: Option<MqttIngress>,
    /// The CoAP socket, if any.
    pub coap: Option<tokio::net::UdpSocket>,
    /// A copy of the CoAP socket, kept to hand over to a chain that replaces this one.
    pub coap_socket: Option<std::net::UdpSocket>,
    /// The chain's certificates, if its HTTP listener (and MQTT's `listen_tls`) speak TLS.
    pub tls: Option<Arc<Tls>>,
}

/// Binds every listening socket of `spec`'s chain for `threads` gateway threads, taking over
/// the `http` and `coap` sockets a replaced chain hands over.
pub(super) fn bind_all(
    spec: &ChainSpec,
    opts: &UpOptions,
    http: Vec<std::net::TcpListener>,
    coap: Option<std::net::UdpSocket>,
    threads: u16,
) -> Result<Bound, AgentError> {
    // The files first: a bad certificate stops the chain before it listens anywhere.
    let tls = load_tls(spec)?;
    // Gateway thread `g` runs on the chain's core `cpus[g mod n]` (`cpus` in the spec).
    let cpu_of = |g: usize| (!spec.cpus.is_empty()).then(|| spec.cpus[g % spec.cpus.len()]);
    let (sockets, http_sockets, addr) = http_listeners(http, opts.listen, threads, &cpu_of)?;
    let scheme = if tls.is_some() { "https" } else { "http" };
    let mut listeners = vec![format!("{scheme}://{addr}")];
    let (mqtt, coap) = bind_others(spec, opts, tls.as_ref(), coap, &mut listeners)?;
    let coap_socket = match &coap {
        Some(c) => Some(
            c.as_fd()
                .try_clone_to_owned()
                .map(std::net::UdpSocket::from)
                .map_err(|source| AgentError::ListenOther {
                    protocol: "coap",
                    addr: c.local_addr().unwrap_or(addr),
                    source,
                })?,
        ),
        None => None,
    };
    // Per gateway thread the sockets it accepts from: socket i goes to thread i % threads,
    // and a thread left without one shares another's (inherited from a chain with fewer
    // gateway threads).
    let threads_n = usize::from(threads);
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
    Ok(Bound {
        addr,
        listeners,
        per_thread,
        http_sockets,
        mqtt,
        coap,
        coap_socket,
        tls,
    })
}

/// The certificates of the spec's `tls` section, read and checked; an error names the spec's
/// line and field, and the file and what is wrong with it.
fn load_tls(spec: &ChainSpec) -> Result<Option<Arc<Tls>>, AgentError> {
    let Some(section) = &spec.tls else {
        return Ok(None);
    };
    let files = section
        .certificates
        .iter()
        .map(|c| CertFiles {
            cert: c.cert.clone(),
            key: c.key.clone(),
        })
        .collect();
    Tls::load(files).map(Some).map_err(|e| {
        // Where the file the error is about was named: a field of the spec, or the flags
        // of `zerohop up --tls-cert F --tls-key F` (field `--tls`).
        let name = |c: &CertSpec, part: &str| match c.field.strip_prefix("--") {
            Some(flag) => format!("--{flag}-{part}"),
            None => format!("{}.{part}", c.field),
        };
        let at = section.certificates.iter().find_map(|c| match e.path() {
            Some(p) if p == c.key && !matches!(e, TlsError::KeyMismatch { .. }) => {
                Some((c.key_line, name(c, "key")))
            }
            Some(p) if p == c.cert => Some((c.cert_line, name(c, "cert"))),
            Some(p) if p == c.key => Some((c.key_line, name(c, "key"))),
            _ => None,
        });
        let (line, field) = at.unwrap_or((section.line, "tls".to_owned()));
        AgentError::Spec(SpecError {
            file: spec.file.display().to_string(),
            line,
            field,
            message: e.to_string(),
        })
    })
}

/// The gateway's parties once [`start_gateways`] has started them.
pub(super) struct GatewaysUp {
    /// Party 0's HTTP sockets, served on the caller's runtime once the chain is up.
    pub first_listeners: Vec<TcpListener>,
    /// Party 0's receiving (on the caller's runtime).
    pub receiving: Option<zerohop_gateway::Receiving>,
    /// Parties 1..'s threads.
    pub threads: Vec<std::thread::JoinHandle<()>>,
    /// Resolve when the HTTP serving of parties 1.. has ended.
    pub served: Vec<tokio::sync::oneshot::Receiver<()>>,
    /// Stops accepting and serving HTTP (and MQTT, CoAP).
    pub http_stop: watch::Sender<bool>,
    /// What every server watches for `http_stop`.
    pub http_rx: watch::Receiver<bool>,
    /// Stops receiving from instances, and every supervisor.
    pub instance_stop: watch::Sender<bool>,
    /// What every receiver and supervisor watches for `instance_stop`.
    pub stop_rx: watch::Receiver<bool>,
}

impl GatewaysUp {
    /// Stops all of it, for a chain that failed to come up.
    pub async fn abort(mut self) {
        if let Some(r) = self.receiving.take() {
            r.stop().await;
        }
        let _ = self.http_stop.send(true);
        let _ = self.instance_stop.send(true);
        join_threads(self.threads).await;
    }
}

/// Starts every party of `gateways`, each with its receiving `endpoints` entry and its
/// `per_thread` sockets (all bound to `addr`, speaking TLS with `tls`): parties 1.. on
/// threads of their own, party 0's receiving on the caller's runtime (its HTTP serving
/// starts with the chain).
pub(super) async fn start_gateways(
    gateways: &Gateways,
    endpoints: Vec<Endpoint>,
    per_thread: Vec<Vec<std::net::TcpListener>>,
    addr: SocketAddr,
    tls: Option<Arc<Tls>>,
) -> Result<GatewaysUp, AgentError> {
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
    let mut up = GatewaysUp {
        first_listeners,
        receiving: None,
        threads: Vec::new(),
        served: Vec::new(),
        http_stop,
        http_rx,
        instance_stop,
        stop_rx,
    };
    let plan = gateways.plan();
    for ((gw, endpoint), sockets) in gateways.iter().skip(1).zip(endpoints).zip(per_thread) {
        let started = spawn_gateway(
            gw.clone(),
            endpoint,
            sockets,
            addr,
            tls.clone(),
            up.http_rx.clone(),
            up.stop_rx.clone(),
            plan.cpu_of(gw.party_index()),
        );
        match started.await {
            Ok((t, s)) => {
                up.threads.push(t);
                up.served.push(s);
            }
            Err(e) => {
                up.abort().await;
                return Err(e);
            }
        }
    }
    // Party 0 serves on this thread: pinned with its lane (supervision threads started
    // later float, `cores::float`).
    super::cores::pin_or_warn(plan.cpu_of(0), "gateway thread 0");
    up.receiving = Some(gateways.iter().next().expect("one").start_receiving(first));
    Ok(up)
}

/// Waits for gateway threads to end (they end once both stop signals were sent).
pub(super) async fn join_threads(threads: Vec<std::thread::JoinHandle<()>>) {
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

/// A listening socket on `addr`; `shared` sets SO_REUSEPORT, so every gateway thread
/// listens on the same address and the kernel spreads connections over them, preferring
/// for a connection the socket whose `cpu` is the one its packets arrive on.
fn bind(addr: SocketAddr, shared: bool, cpu: Option<u16>) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    if shared {
        socket.set_reuseport(true)?;
    }
    if let Some(cpu) = cpu {
        socket2::SockRef::from(&socket).set_cpu_affinity(usize::from(cpu))?;
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
    cpu_of: &dyn Fn(usize) -> Option<u16>,
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
        let first = bind(listen, threads > 1, cpu_of(0)).map_err(failed(listen))?;
        let addr = first.local_addr().map_err(failed(listen))?;
        let mut list = vec![first.into_std().map_err(failed(addr))?];
        for g in 1..threads {
            list.push(
                bind(addr, true, cpu_of(g.into()))
                    .and_then(TcpListener::into_std)
                    .map_err(failed(addr))?,
            );
        }
        list
    } else {
        // Socket i goes to gateway thread i mod threads (see `bind_all`).
        let threads = usize::from(threads.max(1));
        for (i, l) in inherited.iter().enumerate() {
            l.set_nonblocking(true).map_err(failed(listen))?;
            if let Some(cpu) = cpu_of(i % threads) {
                socket2::SockRef::from(l)
                    .set_cpu_affinity(usize::from(cpu))
                    .map_err(failed(listen))?;
            }
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

/// Opens the MQTT listeners (in clear, and over TLS with `tls` where the spec says) and the
/// CoAP socket the spec asks for (addresses overridden by `opts`; the CoAP socket `coap`
/// when one was inherited), adding their URLs to `listeners`. They are served by gateway
/// thread 0.
fn bind_others(
    spec: &ChainSpec,
    opts: &UpOptions,
    tls: Option<&Arc<Tls>>,
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
            let l = bind(want, false, None).map_err(err)?;
            listeners.push(format!("mqtt://{}", l.local_addr().map_err(err)?));
            // The spec reader allows `listen_tls` only beside `listen` and with `tls`.
            let secure = match (spec.mqtt_tls, tls) {
                (Some(at), Some(tls)) => {
                    let err = |source| AgentError::ListenOther {
                        protocol: "mqtt",
                        addr: at,
                        source,
                    };
                    let l = bind(at, false, None).map_err(err)?;
                    listeners.push(format!("mqtts://{}", l.local_addr().map_err(err)?));
                    Some((l, tls.clone()))
                }
                _ => None,
            };
            Some(MqttIngress::Listen(l, secure))
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

/// Serves HTTP (over TLS with `tls`) on every one of `listeners` at once until `http` turns
/// true (see [`Gateway::serve`]).
pub(super) async fn serve_all(
    gw: Arc<Gateway>,
    listeners: Vec<TcpListener>,
    tls: Option<Arc<Tls>>,
    http: watch::Receiver<bool>,
) {
    let mut serving = tokio::task::JoinSet::new();
    for l in listeners {
        match &tls {
            Some(t) => serving.spawn(gw.clone().serve_tls(l, t.clone(), http.clone())),
            None => serving.spawn(gw.clone().serve(l, http.clone())),
        };
    }
    while serving.join_next().await.is_some() {}
}

/// Starts gateway party `gw` on a thread of its own with its own runtime: it accepts on
/// `sockets`, serves until `http` turns true (then `served` resolves), and receives answers
/// until `instances` turns true (instances may still answer while connections drain).
/// Returns once it listens. It runs on `cpu` when there is one.
#[allow(clippy::too_many_arguments)]
async fn spawn_gateway(
    gw: Arc<Gateway>,
    endpoint: Endpoint,
    sockets: Vec<std::net::TcpListener>,
    addr: SocketAddr,
    tls: Option<Arc<Tls>>,
    http: watch::Receiver<bool>,
    mut instances: watch::Receiver<bool>,
    cpu: Option<u16>,
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
            super::cores::pin_or_warn(cpu, &format!("gateway thread {}", gw.party_index()));
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
                    serve_all(gw.clone(), listeners, tls, http).await;
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
