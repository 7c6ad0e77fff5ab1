//! Spawning and supervising one instance: every exit (crash, stop, hang) kills the whole
//! instance (its process group and cgroup) before the gateway reclaims its slots and
//! answers its requests; then the instance is restarted with backoff.

use std::os::fd::OwnedFd;
use std::process::ExitStatus;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::sync::watch;
use zerohop_gateway::Gateways;
use zerohop_pool::{Owner, PartyRecord, PartyState, Pool, Pools, Progress};
use zerohop_transport::{handover, FunctionPlan, PartyId, Transport};

use crate::confine::InstanceCgroup;
use crate::confine::{self, Child, Jail, Program};
use crate::spec::{ResourceSpec, ScaleSpec};

/// What all supervisors of a chain share.
pub(crate) struct Shared {
    /// Per party, the pools of its function's domains (all for the gateway's parties): what
    /// it is handed and where its party records are.
    pub party_pools: Vec<Pools>,
    pub transport: Box<dyn Transport>,
    pub gateways: Gateways,
    /// Invalid descriptors each party sent to the agent's own parties.
    pub offences: Arc<crate::offence::Offences>,
    pub plan_json: String,
    pub jail: Jail,
    /// Per function, in spec order: what its instances run (replaced by a live update).
    pub functions: Vec<RwLock<Arc<FunctionRun>>>,
    /// Per function: its scaling bounds now (`zerohop scale` and live updates change them).
    pub scale: Mutex<Vec<ScaleSpec>>,
    /// Told when `scale` changed.
    pub rescale: tokio::sync::Notify,
    /// Per party (index = party; the gateway's parties unused): the agent's own record of each
    /// instance, never read back from shared memory.
    pub parties: Vec<PartyControl>,
    /// The chain's state store and, per function, whether it maps it.
    pub state: Option<Arc<zerohop_pool::State>>,
    pub stateful: Vec<bool>,
    /// Duplicates of the chain's listening HTTP sockets and its CoAP socket, to hand over
    /// to a chain replacing this one ([`crate::ChainView::handover`]).
    pub http_sockets: Vec<std::net::TcpListener>,
    pub coap_socket: Option<std::net::UdpSocket>,
    /// Every instance's standard output and error.
    pub logs: crate::logs::LogBook,
    /// The chain's timeout: how long a drain may wait for an instance's last request.
    pub timeout: Duration,
    /// Per function: a live update is rolling its instances (the scaler does not scale it
    /// in meanwhile).
    pub rolling: Vec<std::sync::atomic::AtomicBool>,
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

    /// `party`'s state, from its first pool's record (where the handshake happens).
    pub fn state(&self, party: PartyId) -> PartyState {
        self.records(party)
            .next()
            .map_or(PartyState::Empty, PartyRecord::state)
    }

    /// Sets `party`'s state in every one of its pools.
    pub fn set_state(&self, party: PartyId, s: PartyState) {
        self.records(party).for_each(|r| r.set_state(s));
    }

    /// Whether `party` has attached: ready in each of its pools.
    pub fn ready(&self, party: PartyId) -> bool {
        !self.pools_of(party).is_empty()
            && self.records(party).all(|r| r.state() == PartyState::Ready)
    }

    /// New progress records for an instance of `party`: one per handler thread it runs (its
    /// function's concurrency, as the plan the instance gets says).
    pub fn progress_for(&self, party: PartyId) -> std::io::Result<Progress> {
        let plan = self.gateways.plan();
        let threads = plan
            .party_function
            .get(party as usize)
            .and_then(|&f| plan.functions.get(f as usize))
            .map_or(1, FunctionPlan::handler_threads);
        Progress::create(&format!("zerohop-progress-{party}"), threads)
            .map_err(std::io::Error::other)
    }

    /// The function's current run.
    pub fn function(&self, index: usize) -> Arc<FunctionRun> {
        self.functions[index]
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Puts a new run of function `index` in place.
    pub fn set_function(&self, index: usize, run: Arc<FunctionRun>) {
        *self.functions[index]
            .write()
            .unwrap_or_else(|p| p.into_inner()) = run;
    }

    /// Wants `party` serving, parked or stopped (its supervisor follows).
    pub fn set_want(&self, party: PartyId, want: Want) {
        if let Some(c) = self.parties.get(party as usize) {
            c.want.send_if_modified(|w| {
                let changed = *w != want;
                *w = want;
                changed
            });
        }
    }

    /// Makes `party`'s supervisor look again (its function has a new run).
    pub fn poke(&self, party: PartyId) {
        if let Some(c) = self.parties.get(party as usize) {
            c.want.send_modify(|_| {});
        }
    }

    /// Activates a parked instance of `party` (or one about to park): it serves from now
    /// on. Returns whether there was one to activate.
    pub fn activate(&self, party: PartyId) -> bool {
        let mut records = self.records(party);
        let Some(first) = records.next() else {
            return false;
        };
        if !first.activate() {
            return false;
        }
        let now = first.state();
        records.for_each(|r| r.set_state(now));
        if let Some(c) = self.parties.get(party as usize) {
            c.activations.fetch_add(1, Ordering::Relaxed);
        }
        true
    }

    /// What the scaler wants of `party` (`Stop` for a party that does not exist).
    pub fn want_of(&self, party: PartyId) -> Want {
        self.parties
            .get(party as usize)
            .map_or(Want::Stop, PartyControl::wanted)
    }

    /// Requests `party` is involved in: in its handlers, queued for it, slots it holds.
    fn involved(&self, party: PartyId) -> usize {
        let busy = self.records(party).next().map_or(0, |r| r.busy() as usize);
        busy + self.transport.queued(party)
            + self.gateways.pools().held_by(Owner::party(party)).len()
    }
}

/// What the scaler wants of a party.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Want {
    /// An instance serving.
    Run,
    /// An instance started and waiting, activated without `fork` or `exec`.
    Park,
    /// No process (what is sent to it stays queued).
    Stop,
}

/// What the agent knows about one party's current instance.
pub(crate) struct PartyControl {
    /// Process group (= pid) of the running instance, 0 when none.
    pub pgid: AtomicU32,
    /// Set by the watchdog when it kills the instance for hanging, or by the offence
    /// enforcer for sending invalid descriptors: what to report.
    pub hung: Mutex<Option<String>>,
    /// The running instance's progress records (its handler threads' word about
    /// themselves, for the watchdog), with its process group; `None` when none runs.
    pub progress: Mutex<Option<(u32, Arc<Progress>)>>,
    /// Times the instance was restarted.
    pub restarts: AtomicU32,
    /// Reads the running instance's CPU and memory from its cgroups (`None` without one).
    pub usage: Mutex<Option<crate::confine::UsageProbe>>,
    /// What the scaler wants; the party's supervisor follows it.
    pub want: watch::Sender<Want>,
    /// Times a parked instance of this party was activated.
    pub activations: AtomicU64,
    /// Times this party was started cold (no parked instance) because the scaler wanted it.
    pub cold_starts: AtomicU64,
    /// The version (`FunctionRun::generation`) its instance runs, if it has one.
    pub generation: AtomicU64,
    /// When the scaler last decided to activate this party (`CLOCK_MONOTONIC` ns, 0 never)
    /// and whether it had to start it cold: for measuring activation.
    pub decided_ns: AtomicU64,
    pub decided_cold: std::sync::atomic::AtomicBool,
}

impl PartyControl {
    pub fn new(want: Want) -> Self {
        Self {
            pgid: AtomicU32::new(0),
            hung: Mutex::new(None),
            progress: Mutex::new(None),
            restarts: AtomicU32::new(0),
            usage: Mutex::new(None),
            want: watch::channel(want).0,
            activations: AtomicU64::new(0),
            cold_starts: AtomicU64::new(0),
            generation: AtomicU64::new(0),
            decided_ns: AtomicU64::new(0),
            decided_cold: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Process group (= pid) of the running instance, 0 when none.
    pub fn pgid(&self) -> u32 {
        // SYNC POINT: Acquire pairs with the Release stores of `pgid` in `spawn` and
        // `kill_rest`: a pid seen is that of an instance whose records and cgroup are set.
        self.pgid.load(Ordering::Acquire)
    }

    /// What the scaler wants now.
    pub fn wanted(&self) -> Want {
        *self.want.borrow()
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
    shared: &Shared,
    inst: &InstanceSpec,
    progress: &Progress,
) -> std::io::Result<Vec<OwnedFd>> {
    // A pool's header is what the plan says again before the instance compares the two:
    // a party of the domain may have rewritten it.
    let mut fds: Vec<OwnedFd> = shared
        .pools_of(inst.party)
        .iter()
        .map(|p| {
            p.restore_header();
            p.fd().try_clone_to_owned()
        })
        .collect::<Result<_, _>>()?;
    if let (Some(state), true) = (&shared.state, shared.stateful[inst.index]) {
        fds.push(state.fd().try_clone_to_owned()?);
    }
    fds.push(progress.try_clone_fd()?);
    fds.extend(
        shared
            .transport
            .fds_for(inst.party)
            .map_err(std::io::Error::other)?,
    );
    Ok(fds)
}

/// Starts an instance of `inst`'s party from its function's current run; `park`: it waits
/// parked once attached.
pub(crate) fn spawn(shared: &Shared, inst: &InstanceSpec, park: bool) -> std::io::Result<Instance> {
    let run = shared.function(inst.index);
    // Records only this instance and the agent map: what the watchdog believes about it.
    let progress = Arc::new(shared.progress_for(inst.party)?);
    let fds = handover_fds(shared, inst, &progress)?;
    let mut handover_env = vec![
        (handover::PLAN, shared.plan_json.clone()),
        (handover::PARTY, inst.party.to_string()),
        (handover::FDS, fds.len().to_string()),
        (handover::AGENT_PID, std::process::id().to_string()),
    ];
    if let Some(dir) = shared.jail.data_dir() {
        handover_env.push((confine::data::ENV, dir.display().to_string()));
    }
    let env = confine::environment(&run.env, &handover_env);
    // The new instance answers for its own descriptors only, not for what its predecessor
    // left queued.
    shared.offences.forgive(inst.party);
    let cgroup = shared
        .jail
        .instance_cgroup(&inst.function, inst.party, &run.resources)?;
    // Its standard output and error: pipes whose read ends only the agent keeps.
    let (out_r, out_w) = crate::logs::pipe()?;
    let (err_r, err_w) = crate::logs::pipe()?;
    shared.set_state(
        inst.party,
        if park {
            PartyState::Parking
        } else {
            PartyState::Starting
        },
    );
    let child = confine::start(
        &shared.jail,
        &run.program,
        &run.command[1..],
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
    shared.jail.started(pid);
    if let Some(c) = shared.parties.get(inst.party as usize) {
        // SYNC POINT: Release pairs with the Acquire in `PartyControl::pgid`.
        c.pgid.store(pid, Ordering::Release);
        c.generation.store(run.generation, Ordering::Relaxed);
        *c.progress.lock().unwrap_or_else(|p| p.into_inner()) = Some((pid, progress));
        *c.usage.lock().unwrap_or_else(|p| p.into_inner()) =
            cgroup.as_ref().map(InstanceCgroup::usage_probe);
    }
    Ok(Instance {
        child,
        pgid: pid,
        cgroup,
        generation: run.generation,
        started: Instant::now(),
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
        shared.jail.gone(inst.pgid);
        inst.pgid = 0;
    }
    if let Some(c) = shared.parties.get(party as usize) {
        // SYNC POINT: Release pairs with the Acquire in `PartyControl::pgid`.
        c.pgid.store(0, Ordering::Release);
        *c.usage.lock().unwrap_or_else(|p| p.into_inner()) = None;
        *c.progress.lock().unwrap_or_else(|p| p.into_inner()) = None;
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

/// Lets an instance finish what it has: senders avoid it while it is `Draining`.
async fn drain(
    shared: &Shared,
    inst: &InstanceSpec,
    instance: &mut Instance,
    want: &mut watch::Receiver<Want>,
    stop: &mut watch::Receiver<bool>,
    called_off_by_run: bool,
) -> Drained {
    // An instance still starting goes back to starting when the drain is called off (it
    // attaches as usual); one that saw `Draining` at its start has left already.
    let back = match shared.state(inst.party) {
        PartyState::Starting => PartyState::Starting,
        _ => PartyState::Ready,
    };
    shared.set_state(inst.party, PartyState::Draining);
    let deadline = Instant::now() + shared.timeout + Duration::from_secs(1);
    let mut idle = 0;
    loop {
        if called_off_by_run && *want.borrow_and_update() == Want::Run {
            shared.set_state(inst.party, back);
            return Drained::Wanted;
        }
        if shared.involved(inst.party) == 0 {
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
            s = instance.child.wait() => return Drained::Exited(s),
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
    shared: &Shared,
    inst: &InstanceSpec,
    instance: &mut Instance,
    want: &mut watch::Receiver<Want>,
    stop: &mut watch::Receiver<bool>,
    why: &str,
) -> Result<bool, std::io::Result<ExitStatus>> {
    let state = shared.state(inst.party);
    if !matches!(state, PartyState::Parked | PartyState::Parking) {
        let called_off_by_run = why != REPLACED;
        match drain(shared, inst, instance, want, stop, called_off_by_run).await {
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
    terminate(shared, inst.party, instance).await;
    let failed = shared.gateways.party_died(inst.party, why);
    if failed > 0 {
        tracing::warn!(
            function = %inst.function,
            instance = inst.party,
            "{failed} request(s) it still held answered 502 ({why})"
        );
    }
    shared.records(inst.party).for_each(PartyRecord::clear_busy);
    Ok(true)
}

/// Keeps `inst`'s party as the scaler wants it (running, parked or stopped) until `stop`
/// turns true, starting from `instance` when one was spawned already. A running or parked
/// instance that dies is restarted with backoff; one whose function got a new run is
/// drained and replaced, one at a time per party.
pub(crate) async fn supervise(
    shared: Arc<Shared>,
    inst: InstanceSpec,
    mut instance: Option<Instance>,
    mut stop: watch::Receiver<bool>,
) {
    let Some(control) = shared.parties.get(inst.party as usize) else {
        return;
    };
    let mut want = control.want.subscribe();
    let mut backoff = BACKOFF_MIN;
    loop {
        if *stop.borrow() {
            if let Some(i) = &mut instance {
                terminate(&shared, inst.party, i).await;
            }
            return;
        }
        let wanted = *want.borrow_and_update();
        let Some(running) = &mut instance else {
            if wanted == Want::Stop {
                shared.set_state(inst.party, PartyState::Stopped);
                tokio::select! {
                    r = want.changed() => if r.is_err() { return },
                    _ = stopped(&mut stop) => return,
                }
                continue;
            }
            match spawn(&shared, &inst, wanted == Want::Park) {
                Ok(i) => {
                    if wanted == Want::Run {
                        control.cold_starts.fetch_add(1, Ordering::Relaxed);
                    }
                    instance = Some(i);
                }
                Err(e) => {
                    tracing::error!(
                        function = %inst.function,
                        instance = inst.party,
                        "start failed: {e}; retrying in {backoff:?}"
                    );
                    shared.set_state(inst.party, PartyState::Dead);
                    tokio::select! {
                        _ = tokio::time::sleep(backoff) => {}
                        _ = stopped(&mut stop) => return,
                    }
                    backoff = (backoff * 2).min(BACKOFF_MAX);
                }
            }
            continue;
        };
        let current = shared.function(inst.index).generation;
        let state = shared.state(inst.party);
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
            match retire(&shared, &inst, running, &mut want, &mut stop, why).await {
                Ok(true) => {
                    tracing::debug!(function = %inst.function, instance = inst.party, "{why}");
                    instance = None;
                }
                Ok(false) => {}
                Err(status) => {
                    let i = instance.take().expect("running");
                    backoff = crashed(&shared, &inst, i, status, backoff).await;
                }
            }
            continue;
        }
        if wanted == Want::Run && matches!(state, PartyState::Parked | PartyState::Parking) {
            shared.activate(inst.party);
        }
        tokio::select! {
            status = running.child.wait() => {
                let i = instance.take().expect("running");
                backoff = crashed(&shared, &inst, i, status, backoff).await;
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
    shared: &Shared,
    inst: &InstanceSpec,
    mut instance: Instance,
    status: std::io::Result<ExitStatus>,
    backoff: Duration,
) -> Duration {
    // An instance that had attached is not a crash loop at start: it restarts after the
    // shortest backoff (one that keeps dying before it attaches backs off up to 5 s).
    let attached = matches!(
        shared.state(inst.party),
        PartyState::Ready | PartyState::Draining | PartyState::Parked
    );
    // Nothing of the instance may run on while its slots are reclaimed.
    kill_rest(shared, inst.party, &mut instance).await;
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
