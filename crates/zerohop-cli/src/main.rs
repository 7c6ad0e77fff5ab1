//! `zerohop`: the command line of zerohop. Thin: parse arguments, set up logging, call the
//! agent (or the daemon's admin API, [`client`]), map errors to exit codes (0 ok, 1 runtime
//! failure, 2 invalid spec or usage).

#![forbid(unsafe_code)]

mod client;
mod commands;
mod dlq;
mod new;

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use zerohop_agent::{up, UidRange, UpOptions};
use zerohop_spec as spec;
use zerohop_transport::Backend;

#[derive(Parser)]
#[command(
    name = "zerohop",
    version,
    about = "Serverless function chains over shared memory"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// `zerohop agent` as a member of a Kubernetes cluster.
#[derive(Args)]
struct KubeNodeArgs {
    /// Take part in a Kubernetes cluster as this node: run the ChainParts the controller
    /// places on it (see docs/kubernetes.md).
    #[arg(long, env = "ZEROHOP_NODE")]
    kube_node: Option<String>,
    /// With --kube-node: the kubeconfig to use (default: $KUBECONFIG, ~/.kube/config, or the
    /// pod's service account).
    #[arg(long, requires = "kube_node")]
    kubeconfig: Option<PathBuf>,
    /// With --kube-node: zerohop's namespace (the node's heartbeat lease).
    #[arg(long, env = "ZEROHOP_NAMESPACE", default_value = "zerohop-system")]
    kube_namespace: String,
    /// With --kube-node: the node's IP, where its chains' gateways listen.
    #[arg(long, env = "ZEROHOP_NODE_ADDRESS", requires = "kube_node")]
    node_address: Option<std::net::IpAddr>,
    /// With --kube-node: the folder relative `command` paths of a Chain's functions resolve
    /// against.
    #[arg(long, default_value = "/opt/zerohop")]
    programs: PathBuf,
    /// With --kube-node: how long the node's heartbeat lasts without renewal, the time the
    /// controller takes to notice a lost node.
    #[arg(long, default_value = "10s")]
    heartbeat: String,
}

/// `FUNC=IP:PORT` of `zerohop apply --peer`.
fn parse_peer(s: &str) -> Result<(String, SocketAddr), String> {
    let (f, addr) = s
        .split_once('=')
        .ok_or_else(|| format!("`{s}` is not FUNC=IP:PORT"))?;
    let addr = addr
        .parse()
        .map_err(|_| format!("`{addr}` (in `{s}`) is not IP:PORT"))?;
    Ok((f.to_owned(), addr))
}

/// The port peer daemons connect to when `--peer-listen` names none.
const DEFAULT_PEER_PORT: u16 = 7090;

#[derive(Subcommand)]
enum Command {
    /// Runs a chain until Ctrl-C or SIGTERM, then stops it with nothing left behind.
    Up {
        /// The chain spec (YAML).
        spec: PathBuf,
        /// Address the gateway listens on, overriding the spec's `listen` (default
        /// 127.0.0.1:8080; port 0: any free port).
        #[arg(long)]
        listen: Option<SocketAddr>,
        /// Transport between functions, overriding the spec: ring, socket, poll or sockmap.
        #[arg(long)]
        transport: Option<Backend>,
        /// Ring transport: how long an idle receiver spins before it sleeps (microseconds).
        #[arg(long)]
        spin_us: Option<u32>,
        /// As root: the uids chains may run under, START-END (one per chain, never shared
        /// between agents).
        #[arg(long, default_value = "100000-165535")]
        uid_range: UidRange,
        /// Gateway threads, overriding the spec's `gateway_threads` (default: one per core
        /// this process may run on).
        #[arg(long, value_parser = clap::value_parser!(u16).range(1..=64))]
        gateway_threads: Option<u16>,
        /// Address the MQTT listener binds, overriding the spec's `mqtt.listen` (port 0: any
        /// free port).
        #[arg(long)]
        mqtt: Option<SocketAddr>,
        /// Address the CoAP socket binds, overriding the spec's `coap.listen` (port 0: any
        /// free port).
        #[arg(long)]
        coap: Option<SocketAddr>,
        /// Serve HTTPS (HTTP/2 and HTTP/1.1 by ALPN) with this certificate chain (PEM),
        /// instead of the spec's `tls`; with --tls-key.
        #[arg(long, requires = "tls_key")]
        tls_cert: Option<PathBuf>,
        /// The private key (PEM) of --tls-cert.
        #[arg(long, requires = "tls_cert")]
        tls_key: Option<PathBuf>,
    },
    /// Writes a starter function in a new folder: the handler, its build file, a chain.yaml
    /// that runs it, and a README with the commands.
    New {
        /// The language: rust, c, go, python or node.
        #[arg(long, value_enum, default_value = "rust")]
        lang: new::Lang,
        /// The zerohop checkout the SDK is taken from (default: the one this binary was built
        /// from).
        #[arg(long)]
        sdk: Option<PathBuf>,
        /// Python and Node.js: the interpreter to run the function with (default: the first
        /// of python3/node on PATH, /usr/bin's, /usr/local/bin's that the chain's uid can run).
        #[arg(long, value_name = "PATH")]
        interpreter: Option<PathBuf>,
        /// The folder to create; its name names the function, the chain and the route.
        name: PathBuf,
    },
    /// Validates a chain spec and exits (2 when invalid).
    Check {
        /// The chain spec (YAML).
        spec: PathBuf,
    },
    /// Runs the node daemon: hosts many chains, serves the admin API on a unix socket and
    /// Prometheus metrics, until Ctrl-C or SIGTERM.
    Agent {
        /// The admin socket (default: /run/zerohop/admin.sock as root, else in
        /// $XDG_RUNTIME_DIR or /tmp/zerohop-UID).
        #[arg(long, env = "ZEROHOP_SOCKET")]
        socket: Option<PathBuf>,
        /// Where Prometheus metrics are served (`none` to serve none).
        #[arg(long, default_value = "127.0.0.1:9464")]
        metrics: String,
        /// As root: the uids chains may run under, START-END (one per chain, never shared
        /// between agents).
        #[arg(long, default_value = "100000-165535")]
        uid_range: UidRange,
        /// The secret this daemon and its peers (the daemons of other nodes) authenticate
        /// each other with, a file of at least 16 bytes (a Kubernetes Secret mounted in the
        /// pod); enables chains split over nodes.
        #[arg(long, env = "ZEROHOP_PEER_SECRET")]
        peer_secret: Option<PathBuf>,
        /// With --peer-secret: where peer daemons connect (default: the --node-address, else
        /// 127.0.0.1, port 7090).
        #[arg(long, requires = "peer_secret")]
        peer_listen: Option<SocketAddr>,
        #[command(flatten)]
        kube: KubeNodeArgs,
    },
    /// Runs the Kubernetes controller: places each Chain's replicas on nodes, moves them off
    /// lost nodes, publishes each Chain's Service (see docs/kubernetes.md). Several copies
    /// may run; a lease elects the one that acts.
    Controller {
        /// The kubeconfig to use (default: $KUBECONFIG, ~/.kube/config, or the pod's service
        /// account).
        #[arg(long)]
        kubeconfig: Option<PathBuf>,
        /// zerohop's namespace: the leader lease and the nodes' heartbeats.
        #[arg(long, env = "ZEROHOP_NAMESPACE", default_value = "zerohop-system")]
        namespace: String,
        /// This copy's name in the leader lease (default: $POD_NAME, else the host name and
        /// pid).
        #[arg(long, env = "POD_NAME")]
        identity: Option<String>,
        /// Gateway ports for replicas of Chains that fix none, START-END.
        #[arg(long, default_value = "30100-30999")]
        ports: String,
        /// How long the leader's lease lasts without renewal (another copy takes over after
        /// it).
        #[arg(long, default_value = "15s")]
        lease: String,
    },
    /// Brings a chain up on the daemon, or changes the running one to match the spec.
    Apply {
        /// The chain spec (YAML).
        spec: PathBuf,
        /// Address the chain's gateway listens on, overriding the spec's `listen` (default:
        /// a free port on 127.0.0.1).
        #[arg(long)]
        listen: Option<SocketAddr>,
        /// Run only these functions here (a chain split over nodes, FUNC,...); every other
        /// one needs a --peer. The daemons need --peer-secret.
        #[arg(long, value_delimiter = ',', requires = "peer")]
        here: Vec<String>,
        /// Where a function of a split chain runs: FUNC=IP:PORT, the peer daemon's
        /// --peer-listen address (repeat for each function not --here).
        #[arg(long, value_parser = parse_peer, requires = "here")]
        peer: Vec<(String, SocketAddr)>,
        #[command(flatten)]
        daemon: DaemonArgs,
    },
    /// Lists the chains the daemon runs.
    Ls {
        #[command(flatten)]
        daemon: DaemonArgs,
    },
    /// Shows one chain: listeners, metrics URL, counters, functions and instances.
    Status {
        /// Chain name.
        chain: String,
        #[command(flatten)]
        daemon: DaemonArgs,
    },
    /// Sets how many instances of a function serve at least (its scale.min; under load the
    /// autoscaler still grows it up to scale.max).
    Scale {
        /// Chain name.
        chain: String,
        /// Function name.
        function: String,
        /// Instances that serve at least (0: scale to zero when idle).
        instances: u16,
        #[command(flatten)]
        daemon: DaemonArgs,
    },
    /// A chain's dead-letter queue: async requests that failed every retry.
    Dlq {
        #[command(subcommand)]
        command: dlq::DlqCommand,
    },
    /// Shows what a chain's instances printed (stdout and stderr).
    Logs {
        /// Chain name.
        chain: String,
        /// Only this function.
        function: Option<String>,
        /// Keep showing new lines until Ctrl-C.
        #[arg(short, long)]
        follow: bool,
        /// How many past lines to show.
        #[arg(short = 'n', long, default_value_t = 100)]
        lines: usize,
        #[command(flatten)]
        daemon: DaemonArgs,
    },
    /// Sends one request through a route of a chain and prints the answer.
    Invoke {
        /// Chain name.
        chain: String,
        /// The route: `POST /hello`, `/hello`, an MQTT topic, a CoAP path, or `#N`.
        route: String,
        /// The request body.
        #[arg(long, short, default_value = "")]
        data: String,
        #[command(flatten)]
        daemon: DaemonArgs,
    },
    /// Live view of every chain: per function rate, latency, in flight, instances, slots.
    Top {
        /// Print one screen and exit.
        #[arg(long)]
        once: bool,
        /// Seconds between screens.
        #[arg(long, default_value_t = 1.0)]
        interval: f64,
        #[command(flatten)]
        daemon: DaemonArgs,
    },
    /// Stops a chain on the daemon, with nothing left behind.
    Down {
        /// Chain name.
        chain: String,
        #[command(flatten)]
        daemon: DaemonArgs,
    },
}

/// How to reach the daemon, and how to print.
#[derive(Args, Clone)]
struct DaemonArgs {
    /// The daemon's admin socket.
    #[arg(long, env = "ZEROHOP_SOCKET")]
    socket: Option<PathBuf>,
    /// Print JSON instead of text, for programs.
    #[arg(long)]
    json: bool,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("ZEROHOP_LOG")
                // rustls warns for every client that sends an IP address as its SNI (as
                // mosquitto_pub -h 127.0.0.1 does); the handshake goes on with the default
                // certificate, so that is no news for the log.
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,rustls=error")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .init();
    match cli.command {
        Command::New {
            lang,
            sdk,
            interpreter,
            name,
        } => match new::new(lang, &name, sdk, interpreter) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("zerohop: {e:#}");
                ExitCode::from(2)
            }
        },
        Command::Check { spec: path } => match spec::load(&path) {
            Ok(s) => {
                println!(
                    "zerohop: {}: chain '{}' is valid ({} functions, {} routes)",
                    path.display(),
                    s.name,
                    s.functions.len(),
                    s.routes.len()
                );
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("{e}");
                ExitCode::from(2)
            }
        },
        Command::Controller {
            kubeconfig,
            namespace,
            identity,
            ports,
            lease,
        } => {
            let Some(lease) = spec::parse_duration(&lease).filter(|d| d.as_secs() >= 3) else {
                eprintln!("zerohop: --lease `{lease}` is not a duration of 3s or more (15s, 1m)");
                return ExitCode::from(2);
            };
            let Some(ports) = parse_port_range(&ports) else {
                eprintln!("zerohop: --ports `{ports}` is not START-END (30100-30999)");
                return ExitCode::from(2);
            };
            let opts = zerohop_kube::controller::ControllerOptions {
                namespace,
                identity: identity.unwrap_or_else(default_identity),
                lease_duration: lease,
                ports,
            };
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .expect("tokio runtime");
            runtime.block_on(commands::controller(kubeconfig, opts))
        }
        Command::Agent {
            socket,
            metrics,
            uid_range,
            peer_secret,
            peer_listen,
            kube,
        } => {
            let metrics = match metrics.as_str() {
                "none" | "" => None,
                m => match m.parse::<SocketAddr>() {
                    Ok(a) => Some(a),
                    Err(_) => {
                        eprintln!("zerohop: --metrics `{m}` is not IP:PORT or `none`");
                        return ExitCode::from(2);
                    }
                },
            };
            let peer = match peer_secret {
                None => None,
                Some(file) if !file.exists() => {
                    // The DaemonSet mounts the Secret optionally: without it, whole replicas
                    // still run here, and a split one fails naming this node's missing peer
                    // address.
                    eprintln!(
                        "zerohop: warning: no peer secret at {} (--peer-secret): chains split \
                         over nodes cannot run on this node",
                        file.display()
                    );
                    None
                }
                Some(file) => match zerohop_link::Secret::from_file(&file) {
                    Ok(secret) => Some(zerohop_agent::daemon::PeerOptions {
                        listen: peer_listen.unwrap_or_else(|| {
                            SocketAddr::new(
                                kube.node_address
                                    .unwrap_or(std::net::Ipv4Addr::LOCALHOST.into()),
                                DEFAULT_PEER_PORT,
                            )
                        }),
                        secret: std::sync::Arc::new(secret),
                    }),
                    Err(e) => {
                        eprintln!("zerohop: --peer-secret: {e}");
                        return ExitCode::from(2);
                    }
                },
            };
            let peer_addr = peer.as_ref().map(|p| p.listen);
            let opts = zerohop_agent::daemon::DaemonOptions {
                socket: socket.unwrap_or_else(zerohop_agent::daemon::default_socket),
                metrics,
                uid_range,
                cgroups: zerohop_agent::CgroupMode::Auto,
                peer,
            };
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .expect("tokio runtime");
            let node = match kube.kube_node {
                None => None,
                Some(node) => {
                    let Some(address) = kube.node_address else {
                        eprintln!(
                            "zerohop: --kube-node needs --node-address IP (the node's address, \
                             where its chains listen)"
                        );
                        return ExitCode::from(2);
                    };
                    let Some(heartbeat) =
                        spec::parse_duration(&kube.heartbeat).filter(|d| d.as_millis() >= 1000)
                    else {
                        eprintln!(
                            "zerohop: --heartbeat `{}` is not a duration of 1s or more (10s)",
                            kube.heartbeat
                        );
                        return ExitCode::from(2);
                    };
                    Some((
                        kube.kubeconfig,
                        zerohop_kube::node::NodeOptions {
                            node,
                            namespace: kube.kube_namespace,
                            address,
                            peer: peer_addr,
                            lease_duration: heartbeat,
                            programs: kube.programs,
                        },
                    ))
                }
            };
            runtime.block_on(commands::agent(opts, node))
        }
        Command::Apply {
            spec,
            listen,
            here,
            peer,
            daemon,
        } => {
            let split = (!here.is_empty()).then(|| zerohop_agent::api::SplitRequest {
                local: here,
                peers: peer.into_iter().collect(),
            });
            commands::run(&daemon, |c, o| commands::apply(c, o, spec, listen, split))
        }
        Command::Ls { daemon } => commands::run(&daemon, commands::ls),
        Command::Status { chain, daemon } => {
            commands::run(&daemon, |c, o| commands::status(c, o, chain))
        }
        Command::Scale {
            chain,
            function,
            instances,
            daemon,
        } => commands::run(&daemon, |c, o| {
            commands::scale(c, o, chain, function, instances)
        }),
        Command::Dlq { command } => {
            let daemon = command.daemon().clone();
            commands::run(&daemon, |c, _| dlq::run(c, command))
        }
        Command::Logs {
            chain,
            function,
            follow,
            lines,
            daemon,
        } => commands::run(&daemon, |c, o| {
            commands::logs(c, o, chain, function, follow, lines)
        }),
        Command::Invoke {
            chain,
            route,
            data,
            daemon,
        } => commands::run(&daemon, |c, o| commands::invoke(c, o, chain, route, data)),
        Command::Top {
            once,
            interval,
            daemon,
        } => commands::run(&daemon, |c, o| commands::top(c, o, once, interval)),
        Command::Down { chain, daemon } => {
            commands::run(&daemon, |c, o| commands::down(c, o, chain))
        }
        Command::Up {
            spec: path,
            listen,
            transport,
            spin_us,
            uid_range,
            gateway_threads,
            mqtt,
            coap,
            tls_cert,
            tls_key,
        } => {
            // The gateway's thread: a woken gateway waits for the instance running on its
            // core to block, rather than preempting it for every answer.
            let _ = zerohop_agent::confine::batch_scheduling();
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("tokio runtime");
            let opts = UpOptions {
                listen: listen.unwrap_or(UpOptions::default().listen),
                transport,
                spin_us,
                uid_range,
                gateway_threads,
                mqtt_listen: mqtt,
                coap_listen: coap,
                ..UpOptions::default()
            };
            let tls = tls_cert.zip(tls_key);
            runtime.block_on(run_up(path, opts, listen.is_some(), tls))
        }
    }
}

async fn run_up(
    path: PathBuf,
    mut opts: UpOptions,
    listen_given: bool,
    tls: Option<(PathBuf, PathBuf)>,
) -> ExitCode {
    let mut spec = match spec::load(&path) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    if let Some((cert, key)) = tls {
        // Relative to where `zerohop up` runs, as any path on its command line.
        let absolute = |p: PathBuf| std::path::absolute(&p).unwrap_or(p);
        spec.tls = Some(spec::TlsSpec {
            line: 0,
            certificates: vec![spec::CertSpec {
                field: "--tls".into(),
                cert: absolute(cert),
                cert_line: 0,
                key: absolute(key),
                key_line: 0,
            }],
        });
    }
    if let (false, Some(l)) = (listen_given, spec.listen) {
        opts.listen = l;
    }
    let name = spec.name.clone();
    // Install the handlers before anything starts, so an early Ctrl-C still cleans up.
    let Some(stop) = commands::stop_signal() else {
        return ExitCode::FAILURE;
    };
    let running = match up(spec, opts).await {
        Ok(r) => r,
        Err(e) => {
            eprintln!("zerohop: {e}");
            return ExitCode::from(e.exit_code() as u8);
        }
    };
    println!(
        "zerohop: chain '{name}' ready at {} ({})",
        running.listeners().join(", "),
        running.summary()
    );
    let _ = std::io::stdout().flush();
    stop.await;
    eprintln!("zerohop: stopping chain '{name}'");
    running.shutdown().await;
    eprintln!("zerohop: chain '{name}' stopped");
    ExitCode::SUCCESS
}

/// `START-END` of ports.
fn parse_port_range(s: &str) -> Option<std::ops::RangeInclusive<u16>> {
    let (a, b) = s.split_once('-')?;
    let (a, b): (u16, u16) = (a.trim().parse().ok()?, b.trim().parse().ok()?);
    (a >= 1 && a <= b).then_some(a..=b)
}

/// The controller's name in its lease without $POD_NAME: `HOST-PID`.
fn default_identity() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    format!("{}-{}", host.trim(), std::process::id())
}
