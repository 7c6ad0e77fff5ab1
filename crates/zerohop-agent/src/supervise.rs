//! Spawning and supervising one instance: every exit (crash, stop, hang) kills the whole
//! instance (its process group and cgroup) before the gateway reclaims its slots and
//! answers its requests; then the instance is restarted with backoff.

use std::os::fd::OwnedFd;
use std::process::ExitStatus;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::sync::watch;
use zerohop_gateway::Gateways;
use zerohop_pool::{Owner, PartyRecord, PartyState, Progress};
use zerohop_transport::{handover, PartyId, Transport};

use crate::confine::InstanceCgroup;
use crate::confine::{self, Child, Jail, Program};
use crate::logs::LogBook;
use crate::offence::Offences;
use crate::parties::{Parties, Want};
use crate::spec::ResourceSpec;

/// What an instance is started from: per function its current run (a live update puts a
/// new one in place) and whether it maps the chain's state store, and the chain's jail, the
/// plan every instance is handed, where instances' output goes, and the chain's timeout.
pub(crate) struct Launch {
    /// Per function, in spec order: what its instances run.
    runs: Vec<RwLock<Arc<FunctionRun>>>,
    /// Per function: whether it maps the state store.
    stateful: Vec<bool>,
    /// The chain's state store.
    state: Option<Arc<zerohop_pool::State>>,
    /// The plan as every instance is handed it.
    plan_json: String,
    jail: Jail,
    /// Every instance's standard output and error.
    logs: LogBook,
    /// The chain's timeout: how long a drain may wait for an instance's last request.
    timeout: Duration,
}

impl Launch {
    /// Instances started from `runs` (per function, with whether it is `stateful`), in
    /// `jail`, handed `plan_json` and `state`, their output in `logs`.
    pub fn new(
        runs: Vec<FunctionRun>,
        stateful: Vec<bool>,
        state: Option<Arc<zerohop_pool::State>>,
        plan_json: String,
        jail: Jail,
        logs: LogBook,
        timeout: Duration,
    ) -> Self {
        Self {
            runs: runs.into_iter().map(|r| RwLock::new(Arc::new(r))).collect(),
            stateful,
            state,
            plan_json,
            jail,
            logs,
            timeout,
        }
    }

    /// The function's current run.
    pub fn run(&self, index: usize) -> Arc<FunctionRun> {
        self.runs[index]
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Puts a new run of function `index` in place.
    pub fn set_run(&self, index: usize, run: Arc<FunctionRun>) {
        *self.runs[index].write().unwrap_or_else(|p| p.into_inner()) = run;
    }

    /// The chain's security domain.
    pub fn jail(&self) -> &Jail {
        &self.jail
    }

    /// Every instance's standard output and error.
    pub fn logs(&self) -> &LogBook {
        &self.logs
    }

    /// The chain's timeout.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The chain's state store, if it has one.
    pub fn state(&self) -> Option<&Arc<zerohop_pool::State>> {
        self.state.as_ref()
    }
}

/// What supervising one party's instances touches, borrowed from the chain's parts: the
/// parties' records, what instances are started from, the transport (their ends and
/// queues), the gateways (which answer what a dead instance held) and the offence counts
/// (forgiven for a new instance). A relay, played by the agent, is handed the same.
#[derive(Clone, Copy)]
pub(crate) struct Supervision<'a> {
    pub parties: &'a Parties,
    pub launch: &'a Launch,
    pub transport: &'a dyn Transport,
    pub gateways: &'a Gateways,
    pub offences: &'a Arc<Offences>,
}

/// What one function's instances run: its program and how it is started. A live update
/// puts a new one in place (a higher `generation`); each instance remembers the one it was
/// started from.
pub(crate) struct FunctionRun {
    pub generation: u64,
    pub program: Program,
    pub command: Vec<String>,
    pub env: Vec<(String, String)>,
    /// Limits of its cgroups (an instance that cannot have them is not started).
    pub resources: ResourceSpec,
    /// The program file as it was when opened: a rebuilt binary at the same path is a new
    /// version.
    pub fingerprint: Option<Fingerprint>,
}

/// What identifies one build of a program file: device, inode, size, modification time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Fingerprint {
    dev: u64,
    ino: u64,
    size: u64,
    mtime_ns: i128,
}

impl Fingerprint {
    /// The file at `path` now (`None` if it cannot be read).
    pub fn of(path: &std::path::Path) -> Option<Self> {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(path).ok()?;
        Some(Self {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime_ns: i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
        })
    }
}

/// One party to keep in the state the scaler wants.
pub(crate) struct InstanceSpec {
    pub party: PartyId,
    /// Index of the function in the spec.
    pub index: usize,
    pub function: String,
}

/// A started instance: its leader process, its cgroup, and the run it was started from.
pub(crate) struct Instance {
    pub child: Child,
    pgid: u32,
    cgroup: Option<InstanceCgroup>,
    generation: u64,
    started: Instant,
}

const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(5);
/// An instance that ran this long is considered healthy again: backoff resets.
const HEALTHY_AFTER: Duration = Duration::from_secs(10);
/// How long an instance gets to exit after SIGTERM before SIGKILL.
const TERM_GRACE: Duration = Duration::from_secs(2);

/// What an instance of `inst`'s party is handed (in this order): the pools of its domains
/// (in domain order), the state store for a function with `state`, its `progress` records,
/// its transport ends.
pub(crate) fn handover_fds(
    parties: &Parties,
    launch: &Launch,
    transport: &dyn Transport,
    inst: &InstanceSpec,
    progress: &Progress,
) -> std::io::Result<Vec<OwnedFd>> {
    // A pool's header is what the plan says again before the instance compares the two:
    // a party of the domain may have rewritten it.
    let mut fds: Vec<OwnedFd> = parties
        .pools_of(inst.party)
        .iter()
        .map(|p| {
            p.restore_header();
            p.fd().try_clone_to_owned()
        })
        .collect::<Result<_, _>>()?;
    if let (Some(state), true) = (&launch.state, launch.stateful[inst.index]) {
        fds.push(state.fd().try_clone_to_owned()?);
    }
    fds.push(progress.try_clone_fd()?);
    fds.extend(
        transport
            .fds_for(inst.party)
            .map_err(std::io::Error::other)?,
    );
    Ok(fds)
}

/// Gives back the pages of the large pools' free slots after a party's slots were freed
/// without a punch (reclaimed from a dead or stopped party; `docs/protocol.md`, "Large
/// pools"). Claimed as gateway party 0 for the instant of the punch: the agent is the
/// gateway's process, so nothing outlives it holding them.
fn release_large(gateways: &Gateways) {
    for pool in gateways.pools().iter().filter(|p| p.releases()) {
        pool.release_free(Owner::party(0));
    }
}

/// Starts an instance of `inst`'s party from its function's current run; `park`: it waits
/// parked once attached.
pub(crate) fn spawn(
    s: Supervision<'_>,
    inst: &InstanceSpec,
    park: bool,
) -> std::io::Result<Instance> {
    submit(s, inst, park)?.finish(s, inst)
}

/// An instance whose start was sent to the chain's spawner ([`submit`]) and is not yet
/// known to run ([`Submitted::finish`]). Dropped unfinished, it kills what started.
pub(crate) struct Submitted<'a> {
    spawning: confine::Spawning<'a>,
    out_r: OwnedFd,
    err_r: OwnedFd,
    progress: Arc<Progress>,
    cgroup: Option<InstanceCgroup>,
    generation: u64,
}

/// [`spawn`]'s first half: everything the instance is handed made ready and its start sent
/// to the spawner, which forks it while the caller goes on (the chain's start submits the
/// next instances before it finishes this one).
pub(crate) fn submit<'a>(
    s: Supervision<'a>,
    inst: &InstanceSpec,
    park: bool,
) -> std::io::Result<Submitted<'a>> {
    let Supervision {
        parties,
        launch,
        transport,
        offences,
        ..
    } = s;
    let run = launch.run(inst.index);
    // Records only this instance and the agent map: what the watchdog believes about it.
    let progress = Arc::new(parties.progress_for(inst.party)?);
    let fds = handover_fds(parties, launch, transport, inst, &progress)?;
    let mut handover_env = vec![
        (handover::PLAN, launch.plan_json.clone()),
        (handover::PARTY, inst.party.to_string()),
        (handover::FDS, fds.len().to_string()),
        (handover::AGENT_PID, std::process::id().to_string()),
    ];
    if let Some(dir) = launch.jail.data_dir() {
        handover_env.push((confine::data::ENV, dir.display().to_string()));
    }
    let env = confine::environment(&run.env, &handover_env);
    // The new instance answers for its own descriptors only, not for what its predecessor
    // left queued.
    offences.forgive(inst.party);
    let cgroup = launch
        .jail
        .instance_cgroup(&inst.function, inst.party, &run.resources)?;
    // Its standard output and error: pipes whose read ends only the agent keeps.
    let (out_r, out_w) = crate::logs::pipe()?;
    let (err_r, err_w) = crate::logs::pipe()?;
    parties.set_state(
        inst.party,
        if park {
            PartyState::Parking
        } else {
            PartyState::Starting
        },
    );
    let spawning = confine::submit(
        &launch.jail,
        &run.program,
        &run.command[1..],
        env,
        fds,
        Some([out_w, err_w]),
        cgroup.as_ref(),
    )?;
    Ok(Submitted {
        spawning,
        out_r,
        err_r,
        progress,
        cgroup,
        generation: run.generation,
    })
}

impl Submitted<'_> {
    /// [`spawn`]'s second half: waits until the instance's program runs, then reads its
    /// output and records it as the party's instance.
    pub(crate) fn finish(
        self,
        s: Supervision<'_>,
        inst: &InstanceSpec,
    ) -> std::io::Result<Instance> {
        let Submitted {
            spawning,
            out_r,
            err_r,
            progress,
            cgroup,
            generation,
        } = self;
        let (parties, launch) = (s.parties, s.launch);
        let child = spawning.wait().map_err(confine::explain)?;
        // Not read, its output would block it or fail: it goes (dropping `child` kills it).
        launch.logs.attach(inst.index, inst.party, out_r, err_r)?;
        let pid = child.id();
        parties.records(inst.party).for_each(|r| r.set_pid(pid));
        // The child leads its own group (process_group(0)): pgid = pid.
        launch.jail.started(pid);
        if let Some(c) = parties.get(inst.party) {
            let usage = cgroup.as_ref().map(InstanceCgroup::usage_probe);
            c.started(pid, generation, progress, usage);
        }
        Ok(Instance {
            child,
            pgid: pid,
            cgroup,
            generation,
            started: Instant::now(),
        })
    }
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
/// removes the cgroup and tells the reaper the group is gone; then reaps the leader. Its
/// leader must not have been reaped before (`Child::exited` leaves it a zombie): the group's
/// id is the leader's pid, which the kernel gives to no other process until then.
async fn kill_rest(parties: &Parties, jail: &Jail, party: PartyId, inst: &mut Instance) {
    let control = parties.get(party);
    if inst.pgid != 0 {
        match control {
            Some(c) => {
                c.signal_group(inst.pgid, Signal::SIGKILL);
            }
            None => signal_unreaped(inst, Signal::SIGKILL),
        }
    }
    if let Some(cg) = inst.cgroup.take() {
        // Killing and removing a cgroup may wait for its members to go: off the runtime.
        let _ = tokio::task::spawn_blocking(move || drop(cg)).await;
    }
    if inst.pgid != 0 {
        jail.gone(inst.pgid);
        inst.pgid = 0;
    }
    if let Some(c) = control {
        c.gone();
    }
    let _ = inst.child.kill().await;
}

/// Signals `inst`'s process group while its leader is not reaped (so its id is still the
/// group's, see `kill_rest`).
fn signal_unreaped(inst: &Instance, sig: Signal) {
    if inst.pgid != 0 && !inst.child.reaped() {
        let _ = killpg(Pid::from_raw(inst.pgid as i32), sig);
    }
}

/// Stops an instance: SIGTERM to its process group, then after a grace period SIGKILL to
/// the group and its cgroup; the leader is always reaped, last.
pub(crate) async fn terminate(parties: &Parties, jail: &Jail, party: PartyId, inst: &mut Instance) {
    if inst.pgid != 0 {
        match parties.get(party) {
            Some(c) => {
                c.signal_group(inst.pgid, Signal::SIGTERM);
            }
            None => signal_unreaped(inst, Signal::SIGTERM),
        }
        let _ = tokio::time::timeout(TERM_GRACE, inst.child.exited()).await;
    }
    kill_rest(parties, jail, party, inst).await;
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

/// How often a drain looks whether the instance is done.
const DRAIN_POLL: Duration = Duration::from_millis(5);

/// Why an instance is retired when its function has a new version.
const REPLACED: &str = "replaced by a new version";

/// How a drain ended.
enum Drained {
    /// Nothing in its handlers, queued for it or held by it (twice in a row).
    Idle,
    /// The scaler wants it to serve again: it is `Ready` again (`Starting`, if it was).
    Wanted,
    /// Its process ended while draining.
    Exited(std::io::Result<ExitStatus>),
    /// It still had work when the chain's timeout (plus a second) ran out.
    TimedOut,
    /// The chain stops.
    Stopping,
}

/// Requests `party` is involved in: in its handlers, queued for it, slots it holds.
fn involved(s: Supervision<'_>, party: PartyId) -> usize {
    let busy = s
        .parties
        .records(party)
        .next()
        .map_or(0, |r| r.busy() as usize);
    busy + s.transport.queued(party) + s.gateways.pools().held_by(Owner::party(party)).len()
}

/// Lets an instance finish what it has: senders avoid it while it is `Draining`.
async fn drain(
    s: Supervision<'_>,
    inst: &InstanceSpec,
    instance: &mut Instance,
    want: &mut watch::Receiver<Want>,
    stop: &mut watch::Receiver<bool>,
    called_off_by_run: bool,
) -> Drained {
    // An instance still starting goes back to starting when the drain is called off (it
    // attaches as usual); one that saw `Draining` at its start has left already.
    let back = match s.parties.state(inst.party) {
        PartyState::Starting => PartyState::Starting,
        _ => PartyState::Ready,
    };
    s.parties.set_state(inst.party, PartyState::Draining);
    let deadline = Instant::now() + s.launch.timeout + Duration::from_secs(1);
    let mut idle = 0;
    loop {
        if called_off_by_run && *want.borrow_and_update() == Want::Run {
            s.parties.set_state(inst.party, back);
            return Drained::Wanted;
        }
        if involved(s, inst.party) == 0 {
            idle += 1;
            // Twice, a poll apart: a sender that chose it just before it turned `Draining`
            // has sent by then.
            if idle >= 2 {
                return Drained::Idle;
            }
        } else {
            idle = 0;
        }
        if Instant::now() > deadline {
            return Drained::TimedOut;
        }
        tokio::select! {
            s = instance.child.exited() => return Drained::Exited(s),
            _ = tokio::time::sleep(DRAIN_POLL) => {}
            _ = stopped(stop) => return Drained::Stopping,
        }
    }
}

/// Ends an instance the scaler or an update no longer wants: drains it if it serves (a
/// parked one has nothing), stops it, and answers whatever it still held (nothing, when the
/// drain finished). Returns `Err` with the exit status when it died by itself meanwhile,
/// `Ok(false)` when the drain was called off (it serves again).
async fn retire(
    s: Supervision<'_>,
    inst: &InstanceSpec,
    instance: &mut Instance,
    want: &mut watch::Receiver<Want>,
    stop: &mut watch::Receiver<bool>,
    why: &str,
) -> Result<bool, std::io::Result<ExitStatus>> {
    let state = s.parties.state(inst.party);
    if !matches!(state, PartyState::Parked | PartyState::Parking) {
        let called_off_by_run = why != REPLACED;
        match drain(s, inst, instance, want, stop, called_off_by_run).await {
            Drained::Wanted => return Ok(false),
            // It had not attached yet: it saw `Draining` at its start and left, as asked
            // (it took nothing from its queue).
            Drained::Exited(Ok(s)) if state == PartyState::Starting && s.success() => {}
            Drained::Exited(s) => return Err(s),
            Drained::Idle | Drained::Stopping => {}
            Drained::TimedOut => tracing::warn!(
                function = %inst.function,
                instance = inst.party,
                "instance still busy after the chain timeout; stopping it anyway ({why})"
            ),
        }
    }
    terminate(s.parties, &s.launch.jail, inst.party, instance).await;
    let failed = s.gateways.party_died(inst.party, why);
    release_large(s.gateways);
    if failed > 0 {
        tracing::warn!(
            function = %inst.function,
            instance = inst.party,
            "{failed} request(s) it still held answered 502 ({why})"
        );
    }
    s.parties
        .records(inst.party)
        .for_each(PartyRecord::clear_busy);
    Ok(true)
}

/// Keeps `inst`'s party as the scaler wants it (running, parked or stopped) until `stop`
/// turns true, starting from `instance` when one was spawned already. A running or parked
/// instance that dies is restarted with backoff; one whose function got a new run is
/// drained and replaced, one at a time per party.
pub(crate) async fn supervise(
    s: Supervision<'_>,
    inst: InstanceSpec,
    mut instance: Option<Instance>,
    mut stop: watch::Receiver<bool>,
) {
    let parties = s.parties;
    let Some(control) = parties.get(inst.party) else {
        return;
    };
    let mut want = control.subscribe();
    let mut backoff = BACKOFF_MIN;
    loop {
        if *stop.borrow() {
            if let Some(i) = &mut instance {
                terminate(parties, &s.launch.jail, inst.party, i).await;
            }
            return;
        }
        let wanted = *want.borrow_and_update();
        let Some(running) = &mut instance else {
            if wanted == Want::Stop {
                parties.set_state(inst.party, PartyState::Stopped);
                tokio::select! {
                    r = want.changed() => if r.is_err() { return },
                    _ = stopped(&mut stop) => return,
                }
                continue;
            }
            match spawn(s, &inst, wanted == Want::Park) {
                Ok(i) => {
                    if wanted == Want::Run {
                        control.count_cold_start();
                    }
                    instance = Some(i);
                }
                Err(e) => {
                    tracing::error!(
                        function = %inst.function,
                        instance = inst.party,
                        "start failed: {e}; retrying in {backoff:?}"
                    );
                    parties.set_state(inst.party, PartyState::Dead);
                    tokio::select! {
                        _ = tokio::time::sleep(backoff) => {}
                        _ = stopped(&mut stop) => return,
                    }
                    backoff = (backoff * 2).min(BACKOFF_MAX);
                }
            }
            continue;
        };
        let current = s.launch.run(inst.index).generation;
        let state = parties.state(inst.party);
        // A serving instance of an older version is replaced by the update that made the
        // new one (a new instance first, then this one is stopped); a parked one at once.
        let parked = matches!(state, PartyState::Parked | PartyState::Parking);
        let retire_why = if wanted == Want::Stop {
            Some("scaled in")
        } else if running.generation != current && parked {
            Some(REPLACED)
        } else if wanted == Want::Park && !matches!(state, PartyState::Parked | PartyState::Parking)
        {
            // A serving instance cannot go back to waiting: it stops, a new one parks.
            Some("parked")
        } else {
            None
        };
        if let Some(why) = retire_why {
            match retire(s, &inst, running, &mut want, &mut stop, why).await {
                Ok(true) => {
                    tracing::debug!(function = %inst.function, instance = inst.party, "{why}");
                    instance = None;
                }
                Ok(false) => {}
                Err(status) => {
                    let i = instance.take().expect("running");
                    backoff = crashed(s, &inst, i, status, backoff).await;
                }
            }
            continue;
        }
        if wanted == Want::Run && matches!(state, PartyState::Parked | PartyState::Parking) {
            parties.activate(inst.party);
        }
        tokio::select! {
            status = running.child.exited() => {
                let i = instance.take().expect("running");
                backoff = crashed(s, &inst, i, status, backoff).await;
                if *stop.borrow() {
                    return;
                }
                // Restarted after the backoff (unless the scaler changes its mind first).
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = stopped(&mut stop) => return,
                }
                backoff = (backoff * 2).min(BACKOFF_MAX);
            }
            r = want.changed() => if r.is_err() { return },
            _ = stopped(&mut stop) => {}
        }
    }
}

/// After an instance ended by itself (crash, exit, killed by the watchdog): everything of
/// it is killed, its requests are answered, its record counts a restart. Returns the
/// backoff before the next start.
async fn crashed(
    s: Supervision<'_>,
    inst: &InstanceSpec,
    mut instance: Instance,
    status: std::io::Result<ExitStatus>,
    backoff: Duration,
) -> Duration {
    // An instance that had attached is not a crash loop at start: it restarts after the
    // shortest backoff (one that keeps dying before it attaches backs off up to 5 s).
    let attached = matches!(
        s.parties.state(inst.party),
        PartyState::Ready | PartyState::Draining | PartyState::Parked
    );
    // Nothing of the instance may run on while its slots are reclaimed.
    kill_rest(s.parties, &s.launch.jail, inst.party, &mut instance).await;
    let hung = s.parties.get(inst.party).and_then(|c| c.take_condemned());
    let what = hung.unwrap_or_else(|| describe(status));
    s.parties.records(inst.party).for_each(|r| {
        r.set_state(PartyState::Dead);
        r.count_restart();
        // Its handlers are gone with it; the gateway answers what they held.
        r.clear_busy();
    });
    if let Some(c) = s.parties.get(inst.party) {
        c.count_restart();
    }
    let failed = s.gateways.party_died(inst.party, &what);
    release_large(s.gateways);
    let backoff = if attached || instance.started.elapsed() > HEALTHY_AFTER {
        BACKOFF_MIN
    } else {
        backoff
    };
    tracing::warn!(
        function = %inst.function,
        instance = inst.party,
        "instance {what}; {failed} in-flight request(s) answered 502; restarting in {backoff:?}"
    );
    backoff
}
