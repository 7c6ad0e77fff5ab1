//! `boutique-http`: starts the ten services as processes, wires them by URL, stops them.
//!
//! Services start in waves, callees before callers ([`start_waves`]), each child on a free
//! port it binds itself (no port is picked here and released, so none can be taken in
//! between), reporting `listening on URL` on its stdout. Once the frontend reports, the
//! supervisor prints `boutique-http: frontend at URL` and waits for SIGINT or SIGTERM, or
//! for a child to exit; then it sends every child SIGTERM, and SIGKILL to any still there
//! after [`STOP_GRACE`]. A killed supervisor takes its children along: each child asks for
//! SIGKILL when its parent dies (`PR_SET_PDEATHSIG`), and exits at once if the supervisor
//! was already gone when it asked.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::signal::unix::{signal, SignalKind};

use super::DeployError;
use crate::rpc::Service;

/// How long a service may take to report its address.
pub const READY_TIMEOUT: Duration = Duration::from_secs(15);
/// How long the children get to exit after SIGTERM.
pub const STOP_GRACE: Duration = Duration::from_secs(2);
/// Prefix of the line naming the frontend's URL.
pub const READY_PREFIX: &str = "boutique-http: frontend at ";

/// How to run the deployment.
#[derive(Clone, Debug)]
pub struct SuperviseOptions {
    /// The frontend's address (port 0: any free port); the other services take free ports.
    pub listen: SocketAddr,
}

/// The services in start order: each wave only calls services of earlier waves.
pub fn start_waves() -> Vec<Vec<Service>> {
    let mut waves: Vec<Vec<Service>> = Vec::new();
    let mut started: Vec<Service> = Vec::new();
    while started.len() < Service::ALL.len() {
        let wave: Vec<Service> = Service::ALL
            .into_iter()
            .filter(|s| !started.contains(s) && s.calls().iter().all(|c| started.contains(c)))
            .collect();
        assert!(!wave.is_empty(), "the calls graph has a cycle");
        started.extend(&wave);
        waves.push(wave);
    }
    waves
}

struct Running {
    service: Service,
    child: Child,
}

/// Runs the deployment until SIGINT, SIGTERM or a child's exit (an error).
pub fn supervise(opts: &SuperviseOptions) -> Result<(), DeployError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(DeployError::io("starting the runtime"))?;
    // Children are spawned from this (the main) thread: PR_SET_PDEATHSIG fires when the
    // thread that forked them ends, which is the process's end here.
    rt.block_on(run(opts))
}

async fn run(opts: &SuperviseOptions) -> Result<(), DeployError> {
    let mut sigterm =
        signal(SignalKind::terminate()).map_err(DeployError::io("SIGTERM handler"))?;
    let mut sigint = signal(SignalKind::interrupt()).map_err(DeployError::io("SIGINT handler"))?;
    let mut running: Vec<Running> = Vec::new();
    let started = start_all(opts, &mut running).await;
    let urls = match started {
        Ok(urls) => urls,
        Err(e) => {
            stop(&mut running).await;
            return Err(e);
        }
    };
    {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        writeln!(out, "{READY_PREFIX}{}", urls[&Service::Frontend])
            .and_then(|()| out.flush())
            .map_err(DeployError::io("writing the ready line"))?;
    }
    // One write, so that the list stays together on a shared terminal.
    let mut list: String = urls
        .iter()
        .map(|(service, url)| format!("boutique-http: {service:>14} {url}\n"))
        .collect();
    list.push_str("boutique-http: Ctrl-C or SIGTERM stops every service\n");
    eprint!("{list}");

    let mut tick = tokio::time::interval(Duration::from_millis(100));
    let exited = loop {
        tokio::select! {
            biased;
            _ = sigterm.recv() => break None,
            _ = sigint.recv() => break None,
            _ = tick.tick() => {
                let gone = running.iter_mut().find_map(|r| match r.child.try_wait() {
                    Ok(Some(status)) => Some((r.service, status.to_string())),
                    Ok(None) => None,
                    Err(e) => Some((r.service, e.to_string())),
                });
                if gone.is_some() {
                    break gone;
                }
            }
        }
    };
    stop(&mut running).await;
    match exited {
        Some((service, status)) => Err(DeployError::Exited { service, status }),
        None => Ok(()),
    }
}

async fn start_all(
    opts: &SuperviseOptions,
    running: &mut Vec<Running>,
) -> Result<BTreeMap<Service, String>, DeployError> {
    let exe = std::env::current_exe().map_err(DeployError::io("finding boutique-http"))?;
    let mut urls: BTreeMap<Service, String> = BTreeMap::new();
    for wave in start_waves() {
        let first = running.len();
        for service in wave {
            let listen = if service == Service::Frontend {
                opts.listen
            } else {
                SocketAddr::from(([127, 0, 0, 1], 0))
            };
            let mut cmd = Command::new(&exe);
            cmd.arg("serve")
                .arg(service.name())
                .arg("--listen")
                .arg(listen.to_string())
                .arg("--parent")
                .arg(std::process::id().to_string());
            for callee in service.calls() {
                cmd.arg("--peer").arg(format!("{callee}={}", urls[callee]));
            }
            // A process group of its own: Ctrl-C in a terminal reaches the supervisor only,
            // which then stops the services in order, instead of racing them.
            cmd.stdin(Stdio::null())
                .stdout(Stdio::piped())
                .process_group(0)
                .kill_on_drop(true);
            let child = cmd
                .spawn()
                .map_err(DeployError::io(format!("starting {service}")))?;
            running.push(Running { service, child });
        }
        for r in &mut running[first..] {
            let url = ready_url(r).await?;
            urls.insert(r.service, url);
        }
    }
    Ok(urls)
}

/// Reads the child's `listening on URL` line (bounded), then drains its stdout.
async fn ready_url(r: &mut Running) -> Result<String, DeployError> {
    let service = r.service;
    let not_ready = |detail: String| DeployError::NotReady { service, detail };
    let stdout = r
        .child
        .stdout
        .take()
        .ok_or_else(|| not_ready("stdout not piped".into()))?;
    let mut lines = BufReader::new(stdout).lines();
    let line = tokio::time::timeout(READY_TIMEOUT, lines.next_line())
        .await
        .map_err(|_| not_ready(format!("no address within {READY_TIMEOUT:?}")))?
        .map_err(|e| not_ready(e.to_string()))?
        .ok_or_else(|| not_ready("exited before listening".into()))?;
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    line.strip_prefix("listening on ")
        .filter(|u| u.starts_with("http://"))
        .map(str::to_owned)
        .ok_or_else(|| not_ready(format!("unexpected first line {line:?}")))
}

/// SIGTERM to every child, SIGKILL to those still there after [`STOP_GRACE`]; reaps all.
async fn stop(running: &mut Vec<Running>) {
    for r in running.iter() {
        if let Some(pid) = r.child.id() {
            crate::sys::terminate(pid);
        }
    }
    let deadline = tokio::time::Instant::now() + STOP_GRACE;
    for r in running.iter_mut() {
        if tokio::time::timeout_at(deadline, r.child.wait())
            .await
            .is_err()
        {
            eprintln!("boutique-http: {} ignored SIGTERM; killing it", r.service);
            let _ = r.child.kill().await;
        }
    }
    running.clear();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn callees_start_before_callers() {
        let waves = start_waves();
        let order: Vec<Service> = waves.concat();
        assert_eq!(order.len(), Service::ALL.len());
        for (i, s) in order.iter().enumerate() {
            for c in s.calls() {
                let at = order.iter().position(|x| x == c).unwrap();
                assert!(at < i, "{c} starts after its caller {s}");
            }
        }
        assert_eq!(waves.last().unwrap(), &vec![Service::Frontend]);
    }
}
