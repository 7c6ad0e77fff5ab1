//! `motion-http`: the HTTP-microservice baseline of the motion workload (see
//! `zerohop_app_motion::baseline`). `sensor`, `actuator` and `adapter` run one process each;
//! `up` starts all three as its children, wired together, and stops them on SIGTERM/SIGINT
//! (they also die with it: parent-death signal).

#![forbid(unsafe_code)]

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use clap::{Parser, Subcommand};
use http::Uri;
use nix::sys::signal::Signal;
use tokio::signal::unix::{signal, SignalKind};
use zerohop_app_motion::actuator::Actuator;
use zerohop_app_motion::baseline::{self, AdapterConfig};
use zerohop_app_motion::sensor::Sensor;

#[derive(Parser)]
#[command(
    name = "motion-http",
    about = "HTTP-microservice baseline of the motion workload"
)]
struct Cli {
    #[command(subcommand)]
    command: Role,
}

#[derive(Subcommand)]
enum Role {
    /// The sensor server: POST an event (header `mqtt-topic`), get the actuator's command.
    Sensor {
        /// Address to listen on (port 0: any free port; printed as `listening on URL`).
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: SocketAddr,
        /// The actuator's URL.
        #[arg(long)]
        actuator: Uri,
    },
    /// The actuator server: POST a reading, get the light command.
    Actuator {
        /// Address to listen on (port 0: any free port).
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: SocketAddr,
    },
    /// The MQTT adapter: subscribes at the broker, POSTs each event to the sensor and
    /// publishes the answer.
    Adapter {
        #[command(flatten)]
        mqtt: MqttArgs,
        /// The sensor's URL.
        #[arg(long)]
        sensor: Uri,
    },
    /// Starts actuator, sensor and adapter wired together; prints one `ready` line with
    /// their pids once the adapter is subscribed.
    Up {
        #[command(flatten)]
        mqtt: MqttArgs,
    },
}

#[derive(clap::Args, Clone)]
struct MqttArgs {
    /// The broker (mosquitto), HOST:PORT.
    #[arg(long)]
    broker: String,
    /// Topic filter of the sensor events.
    #[arg(long, default_value = "motion/+/event")]
    filter: String,
    /// Topic the light commands are published to.
    #[arg(long, default_value = "motion/lights")]
    reply_topic: String,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("motion-http: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(role: Role) -> Result<()> {
    if let Role::Up { mqtt } = role {
        return up(mqtt);
    }
    // Started by `up`: go when it goes.
    if std::env::var_os("MOTION_HTTP_CHILD").is_some() {
        nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).context("prctl(PR_SET_PDEATHSIG)")?;
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("tokio runtime")?;
    runtime.block_on(async move {
        match role {
            Role::Sensor { listen, actuator } => {
                let sensor = Sensor::from_env().map_err(|e| anyhow!(e))?;
                Ok(baseline::serve_sensor(listen, sensor, actuator).await?)
            }
            Role::Actuator { listen } => {
                let actuator = Actuator::from_env().map_err(|e| anyhow!(e))?;
                Ok(baseline::serve_actuator(listen, actuator).await?)
            }
            Role::Adapter { mqtt, sensor } => Ok(baseline::run_adapter(AdapterConfig {
                broker: mqtt.broker,
                filter: mqtt.filter,
                reply_topic: mqtt.reply_topic,
                sensor,
            })
            .await?),
            Role::Up { .. } => unreachable!("handled above"),
        }
    })
}

/// A child killed on drop.
struct Guarded(Child);

impl Drop for Guarded {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `motion-http ARGS` and returns it with its first stdout line (read on a thread,
/// waited for at most 10 s).
fn start(args: &[String]) -> Result<(Guarded, String)> {
    let exe = std::env::current_exe().context("current_exe")?;
    let mut child = Guarded(
        Command::new(exe)
            .args(args)
            .env("MOTION_HTTP_CHILD", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .with_context(|| format!("start motion-http {}", args[0]))?,
    );
    let stdout = child.0.stdout.take().expect("piped stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(stdout).lines();
        if let Some(Ok(l)) = lines.next() {
            let _ = tx.send(l);
        }
        for _ in lines {}
    });
    let line = rx
        .recv_timeout(Duration::from_secs(10))
        .map_err(|_| anyhow!("motion-http {} printed nothing within 10 s", args[0]))?;
    Ok((child, line))
}

fn url_of(line: &str) -> Result<String> {
    line.strip_prefix("listening on ")
        .map(str::to_owned)
        .ok_or_else(|| anyhow!("unexpected first line {line:?}"))
}

fn up(mqtt: MqttArgs) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("tokio runtime")?;
    runtime.block_on(async move {
        // Before anything starts, so an early signal still stops what did.
        let (mut term, mut int) = (
            signal(SignalKind::terminate())?,
            signal(SignalKind::interrupt())?,
        );
        let (actuator, line) = start(&["actuator".into()])?;
        let actuator_url = url_of(&line)?;
        let (sensor, line) = start(&[
            "sensor".into(),
            "--actuator".into(),
            format!("{actuator_url}/actuate"),
        ])?;
        let sensor_url = url_of(&line)?;
        let (adapter, line) = start(&[
            "adapter".into(),
            "--broker".into(),
            mqtt.broker.clone(),
            "--filter".into(),
            mqtt.filter.clone(),
            "--reply-topic".into(),
            mqtt.reply_topic.clone(),
            "--sensor".into(),
            format!("{sensor_url}/sense"),
        ])?;
        if !line.starts_with("subscribed") {
            bail!("adapter: unexpected first line {line:?}");
        }
        let mut children = [("actuator", actuator), ("sensor", sensor), ("adapter", adapter)];
        println!(
            "ready: sensor {sensor_url} (pid {}), actuator {actuator_url} (pid {}), adapter (pid {}) on mqtt://{} {} -> {}",
            children[1].1 .0.id(),
            children[0].1 .0.id(),
            children[2].1 .0.id(),
            mqtt.broker,
            mqtt.filter,
            mqtt.reply_topic
        );
        std::io::stdout().flush()?;
        loop {
            tokio::select! {
                _ = term.recv() => return Ok(()),
                _ = int.recv() => return Ok(()),
                _ = tokio::time::sleep(Duration::from_millis(200)) => {}
            }
            for (name, c) in children.iter_mut() {
                if let Some(status) = c.0.try_wait()? {
                    bail!("{name} exited: {status}");
                }
            }
        }
    })
}
