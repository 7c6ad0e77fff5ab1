//! Spawning and supervising one instance: every exit (crash, stop, hang) kills the whole
//! instance (its process group and cgroup) before the gateway reclaims its slots and
//! answers its requests; then the instance is restarted with backoff.

use std::os::fd::OwnedFd;
use std::process::ExitStatus;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::sync::watch;
use zerohop_gateway::Gateways;
use zerohop_pool::{PartyRecord, PartyState, Pool, Pools};
use zerohop_transport::{handover, PartyId, Transport};

use crate::confine::cgroup::InstanceCgroup;
use crate::confine::{self, Child, Domain, Program};

/// What all supervisors of a chain share.
pub(crate) struct Shared {
    /// Per party, the pools of its function's domains (all for the gateway's parties): what
    /// it is handed and where its party records are.
    pub party_pools: Vec<Pools>,
    pub transport: Box<dyn Transport>,
    pub gateways: Gateways,
    pub plan_json: String,
    pub domain: Domain,
    /// Per function, in spec order.
    pub programs: Vec<Program>,
    /// Per party (index = party; the gateway's parties unused): the agent's own record of each
    /// instance, never read back from shared memory.
    pub parties: Vec<PartyControl>,
    /// The chain's state store and, per function, whether it maps it.
    pub state: Option<zerohop_pool::State>,
    pub stateful: Vec<bool>,
    /// Every instance's standard output and error.
    pub logs: crate::logs::LogBook,
}

impl Shared {
    /// The pools of `party` (none for a party that does not exist).
    fn pools_of(&self, party: PartyId) -> &[Arc<Pool>] {
        self.party_pools
            .get(party as usize)
            .map_or(&[], Pools::as_slice)
    }

    /// `party`'s record in each of its pools (its counters are in the first).
    pub fn records(&self, party: PartyId) -> impl Iterator<Item = &PartyRecord> {
        self.party_pools
            .get(party as usize)
            .into_iter()
            .flat_map(move |p| p.records(party))
    }

    /// Whether `party` has attached: ready in each of its pools.
    pub fn ready(&self, party: PartyId) -> bool {
        !self.pools_of(party).is_empty()
            && self.records(party).all(|r| r.state() == PartyState::Ready)
    }
}

/// What the agent knows about one party's current instance.
#[derive(Default)]
pub(crate) struct PartyControl {
    /// Process group (= pid) of the running instance, 0 when none.
    pub pgid: AtomicU32,
    /// Set by the watchdog when it kills the instance for hanging: what to report.
    pub hung: Mutex<Option<String>>,
    /// Times the instance was restarted.
    pub restarts: AtomicU32,
    /// Reads the running instance's CPU and memory from its cgroups (`None` without one).
    pub usage: Mutex<Option<crate::confine::cgroup::UsageProbe>>,
}

/// One instance to keep running.
pub(crate) struct InstanceSpec {
    pub party: PartyId,
    /// Index of the function in the spec.
    pub index: usize,
    pub function: String,
    pub command: Vec<String>,
    pub env: Vec<(String, String)>,
    /// Limits of its cgroups (an instance that cannot have them is not started).
    pub resources: crate::spec::ResourceSpec,
}

/// A started instance: its leader process and its cgroup.
pub(crate) struct Instance {
    pub child: Child,
    pgid: u32,
    cgroup: Option<InstanceCgroup>,
}

const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(5);
/// An instance that ran this long is considered healthy again: backoff resets.
const HEALTHY_AFTER: Duration = Duration::from_secs(10);
/// How long an instance gets to exit after SIGTERM before SIGKILL.
const TERM_GRACE: Duration = Duration::from_secs(2);

pub(crate) fn spawn(shared: &Shared, inst: &InstanceSpec) -> std::io::Result<Instance> {
    // The pools of the instance's domains first (in domain order), then its transport ends.
    let mut fds: Vec<OwnedFd> = shared
        .pools_of(inst.party)
        .iter()
        .map(|p| p.fd().try_clone_to_owned())
        .collect::<Result<_, _>>()?;
    // Then the state store, for a function with `state`.
    if let (Some(state), true) = (&shared.state, shared.stateful[inst.index]) {
        fds.push(state.fd().try_clone_to_owned()?);
    }
    fds.extend(
        shared
            .transport
            .fds_for(inst.party)
            .map_err(std::io::Error::other)?,
    );
    let handover_env = [
        (handover::PLAN, shared.plan_json.clone()),
        (handover::PARTY, inst.party.to_string()),
        (handover::FDS, fds.len().to_string()),
        (handover::AGENT_PID, std::process::id().to_string()),
    ];
    let env = confine::environment(&inst.env, &handover_env);
    let cgroup = shared
        .domain
        .instance_cgroup(&inst.function, inst.party, &inst.resources)?;
    // Its standard output and error: pipes whose read ends only the agent keeps.
    let (out_r, out_w) = crate::logs::pipe()?;
    let (err_r, err_w) = crate::logs::pipe()?;
    shared
        .records(inst.party)
        .for_each(|r| r.set_state(PartyState::Starting));
    let child = confine::start(
        &shared.domain,
        &shared.programs[inst.index],
        &inst.command[1..],
        env,
        fds,
        Some([out_w, err_w]),
        cgroup.as_ref(),
    )
    .map_err(confine::explain)?;
    // Not read, its output would block it or fail: it goes (dropping `child` kills it).
    shared.logs.attach(inst.index, inst.party, out_r, err_r)?;
    let pid = child.id();
    shared.records(inst.party).for_each(|r| r.set_pid(pid));
    // The child leads its own group (process_group(0)): pgid = pid.
    shared.domain.started(pid);
    if let Some(c) = shared.parties.get(inst.party as usize) {
        c.pgid.store(pid, Ordering::Release);
        *c.usage.lock().unwrap_or_else(|p| p.into_inner()) =
            cgroup.as_ref().map(InstanceCgroup::usage_probe);
    }
    Ok(Instance {
        child,
        pgid: pid,
        cgroup,
    })
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

/// Kills whatever is left of an instance whose leader has exited (or is being stopped):
/// its process group, then its cgroup (which also catches anything that left the group),
/// removes the cgroup and tells the reaper the group is gone.
async fn kill_rest(shared: &Shared, party: PartyId, inst: &mut Instance) {
    if inst.pgid != 0 {
        let _ = killpg(Pid::from_raw(inst.pgid as i32), Signal::SIGKILL);
    }
    if let Some(cg) = inst.cgroup.take() {
        // Killing and removing a cgroup may wait for its members to go: off the runtime.
        let _ = tokio::task::spawn_blocking(move || drop(cg)).await;
    }
    if inst.pgid != 0 {
        shared.domain.gone(inst.pgid);
        inst.pgid = 0;
    }
    if let Some(c) = shared.parties.get(party as usize) {
        c.pgid.store(0, Ordering::Release);
        *c.usage.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }
}

/// Stops an instance: SIGTERM to its process group, then after a grace period SIGKILL to
/// the group and its cgroup; the leader is always reaped.
pub(crate) async fn terminate(shared: &Shared, party: PartyId, inst: &mut Instance) {
    if inst.pgid != 0 {
        let _ = killpg(Pid::from_raw(inst.pgid as i32), Signal::SIGTERM);
        let _ = tokio::time::timeout(TERM_GRACE, inst.child.wait()).await;
    }
    kill_rest(shared, party, inst).await;
    let _ = inst.child.kill().await;
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

/// Keeps `inst` running until `stop` turns true, starting from an already spawned
/// `instance`.
pub(crate) async fn supervise(
    shared: Arc<Shared>,
    inst: InstanceSpec,
    mut instance: Instance,
    mut stop: watch::Receiver<bool>,
) {
    let mut backoff = BACKOFF_MIN;
    loop {
        let started = Instant::now();
        let status = tokio::select! {
            s = instance.child.wait() => s,
            _ = stopped(&mut stop) => {
                terminate(&shared, inst.party, &mut instance).await;
                return;
            }
        };
        // Nothing of the instance may run on while its slots are reclaimed.
        kill_rest(&shared, inst.party, &mut instance).await;
        if *stop.borrow() {
            return;
        }
        let hung = shared
            .parties
            .get(inst.party as usize)
            .and_then(|c| c.hung.lock().unwrap_or_else(|p| p.into_inner()).take());
        let what = hung.unwrap_or_else(|| describe(status));
        shared.records(inst.party).for_each(|r| {
            r.set_state(PartyState::Dead);
            r.count_restart();
            // Its handlers are gone with it; the gateway answers what they held.
            r.clear_busy();
        });
        if let Some(c) = shared.parties.get(inst.party as usize) {
            c.restarts.fetch_add(1, Ordering::Relaxed);
        }
        let failed = shared.gateways.party_died(inst.party, &what);
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
                Ok(i) => {
                    instance = i;
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
