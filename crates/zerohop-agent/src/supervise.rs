//! Spawning and supervising one instance: restart with backoff after a crash, after the
//! gateway has reclaimed its slots and answered its requests.

use std::os::fd::OwnedFd;
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use command_fds::{CommandFdExt, FdMapping};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::process::{Child, Command};
use tokio::sync::watch;
use zerohop_gateway::Gateway;
use zerohop_pool::{PartyState, Pool};
use zerohop_transport::{handover, PartyId, Transport};

/// What all supervisors of a chain share.
pub(crate) struct Shared {
    pub pool: Arc<Pool>,
    pub transport: Box<dyn Transport>,
    pub gateway: Arc<Gateway>,
    pub plan_json: String,
}

/// One instance to keep running.
pub(crate) struct InstanceSpec {
    pub party: PartyId,
    pub function: String,
    pub command: Vec<String>,
    pub env: Vec<(String, String)>,
}

const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(5);
/// An instance that ran this long is considered healthy again: backoff resets.
const HEALTHY_AFTER: Duration = Duration::from_secs(10);
/// How long an instance gets to exit after SIGTERM before SIGKILL.
const TERM_GRACE: Duration = Duration::from_secs(2);

pub(crate) fn spawn(shared: &Shared, inst: &InstanceSpec) -> std::io::Result<Child> {
    let mut fds: Vec<OwnedFd> = vec![shared.pool.fd().try_clone_to_owned()?];
    let transport_fds = shared
        .transport
        .fds_for(inst.party)
        .map_err(std::io::Error::other)?;
    for fd in transport_fds {
        fds.push(fd.try_clone_to_owned()?);
    }
    let n = fds.len();
    let mappings = fds
        .into_iter()
        .enumerate()
        .map(|(i, fd)| FdMapping {
            parent_fd: fd,
            child_fd: handover::FIRST_FD + i as i32,
        })
        .collect();
    let mut cmd = Command::new(&inst.command[0]);
    cmd.args(&inst.command[1..])
        .envs(inst.env.iter().map(|(k, v)| (k, v)))
        .env(handover::PLAN, &shared.plan_json)
        .env(handover::PARTY, inst.party.to_string())
        .env(handover::FDS, n.to_string())
        .env(handover::AGENT_PID, std::process::id().to_string())
        .stdin(Stdio::null())
        .kill_on_drop(true);
    cmd.fd_mappings(mappings).map_err(std::io::Error::other)?;
    if let Some(rec) = shared.pool.party(inst.party) {
        rec.set_state(PartyState::Starting);
    }
    let child = cmd.spawn()?;
    if let Some(rec) = shared.pool.party(inst.party) {
        rec.set_pid(child.id().unwrap_or(0));
    }
    Ok(child)
}

fn describe(status: std::io::Result<ExitStatus>) -> String {
    use std::os::unix::process::ExitStatusExt;
    match status {
        Ok(s) => match (s.code(), s.signal()) {
            (Some(c), _) => format!("exited with status {c}"),
            (None, Some(sig)) => format!("was killed by signal {sig}"),
            _ => "ended".into(),
        },
        Err(e) => format!("could not be waited for ({e})"),
    }
}

/// Stops a child: SIGTERM, then SIGKILL after a grace period; always reaped.
pub(crate) async fn terminate(child: &mut Child) {
    if let Some(pid) = child.id() {
        let _ = kill(Pid::from_raw(pid as i32), Signal::SIGTERM);
        if tokio::time::timeout(TERM_GRACE, child.wait()).await.is_ok() {
            return;
        }
    }
    let _ = child.kill().await;
}

/// Resolves once `stop` turns true (or its sender is gone).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    loop {
        if *stop.borrow_and_update() {
            return;
        }
        if stop.changed().await.is_err() {
            return;
        }
    }
}

/// Keeps `inst` running until `stop` turns true, starting from an already spawned `child`.
pub(crate) async fn supervise(
    shared: Arc<Shared>,
    inst: InstanceSpec,
    mut child: Child,
    mut stop: watch::Receiver<bool>,
) {
    let mut backoff = BACKOFF_MIN;
    loop {
        let started = Instant::now();
        let status = tokio::select! {
            s = child.wait() => s,
            _ = stopped(&mut stop) => {
                terminate(&mut child).await;
                return;
            }
        };
        if *stop.borrow() {
            return;
        }
        let what = describe(status);
        let rec = shared.pool.party(inst.party);
        if let Some(rec) = rec {
            rec.set_state(PartyState::Dead);
            rec.count_restart();
        }
        let failed = shared.gateway.party_died(inst.party, &what);
        if started.elapsed() > HEALTHY_AFTER {
            backoff = BACKOFF_MIN;
        }
        tracing::warn!(
            function = %inst.function,
            instance = inst.party,
            "instance {what}; {failed} in-flight request(s) answered 502; restarting in {backoff:?}"
        );
        loop {
            tokio::select! {
                _ = tokio::time::sleep(backoff) => {}
                _ = stopped(&mut stop) => return,
            }
            backoff = (backoff * 2).min(BACKOFF_MAX);
            match spawn(&shared, &inst) {
                Ok(c) => {
                    child = c;
                    break;
                }
                Err(e) => tracing::error!(
                    function = %inst.function,
                    instance = inst.party,
                    "restart failed: {e}; retrying in {backoff:?}"
                ),
            }
        }
    }
}
