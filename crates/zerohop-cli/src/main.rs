//! `zerohop`: the command line of zerohop. Thin: parse arguments, set up logging, call the
//! agent, map errors to exit codes (0 ok, 1 runtime failure, 2 invalid spec or usage).

#![forbid(unsafe_code)]

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tokio::signal::unix::{signal, SignalKind};
use zerohop_agent::{spec, up, UidRange, UpOptions};
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

#[derive(Subcommand)]
enum Command {
    /// Runs a chain until Ctrl-C or SIGTERM, then stops it with nothing left behind.
    Up {
        /// The chain spec (YAML).
        spec: PathBuf,
        /// Address the gateway listens on (port 0: any free port).
        #[arg(long, default_value = "127.0.0.1:8080")]
        listen: SocketAddr,
        /// Transport between functions, overriding the spec: ring or socket.
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
    },
    /// Validates a chain spec and exits (2 when invalid).
    Check {
        /// The chain spec (YAML).
        spec: PathBuf,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("ZEROHOP_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_target(false)
        .init();
    match cli.command {
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
        Command::Up {
            spec: path,
            listen,
            transport,
            spin_us,
            uid_range,
            gateway_threads,
            mqtt,
            coap,
        } => {
            // The gateway's thread: a woken gateway waits for the instance running on its
            // core to block, rather than preempting it for every answer.
            let _ = zerohop_agent::confine::batch_scheduling();
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("tokio runtime");
            let opts = UpOptions {
                listen,
                transport,
                spin_us,
                uid_range,
                gateway_threads,
                mqtt_listen: mqtt,
                coap_listen: coap,
                ..UpOptions::default()
            };
            runtime.block_on(run_up(path, opts))
        }
    }
}

async fn run_up(path: PathBuf, opts: UpOptions) -> ExitCode {
    let spec = match spec::load(&path) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let name = spec.name.clone();
    // Install the handlers before anything starts, so an early Ctrl-C still cleans up.
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        eprintln!("zerohop: cannot install signal handlers");
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
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    eprintln!("zerohop: stopping chain '{name}'");
    running.shutdown().await;
    eprintln!("zerohop: chain '{name}' stopped");
    ExitCode::SUCCESS
}
