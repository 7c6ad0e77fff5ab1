//! The chain's parties as the agent holds them: per party, the pools of its function's
//! domains (where its records are) and the agent's own record of its instance
//! ([`PartyControl`]), never read back from shared memory. The supervisors write those
//! records; the scaler, the watchdog, the offence enforcer, updates and the status read
//! them.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::sync::watch;
use zerohop_pool::{PartyRecord, PartyState, Pool, Pools, Progress};
use zerohop_transport::{FunctionPlan, PartyId, Plan};

use crate::confine::UsageProbe;

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

/// Every party of a chain: the pools each maps and the agent's record of each.
pub(crate) struct Parties {
    /// Per party, the pools of its function's domains (all for the gateway's parties): what
    /// it is handed and where its party records are.
    pools: Vec<Pools>,
    /// Per party (index = party; the gateway's parties unused): the agent's own record of
    /// each instance.
    controls: Vec<PartyControl>,
    /// Per party, its function's handler threads (as the plan its instances get says).
    threads: Vec<usize>,
}

impl Parties {
    /// The parties of `plan`, each mapping its `pools`, none wanted yet.
    pub fn new(pools: Vec<Pools>, plan: &Plan) -> Self {
        let threads = plan
            .party_function
            .iter()
            .map(|&f| {
                plan.functions
                    .get(f as usize)
                    .map_or(1, FunctionPlan::handler_threads)
            })
            .collect();
        Self {
            pools,
            controls: (0..plan.parties())
                .map(|_| PartyControl::new(Want::Stop))
                .collect(),
            threads,
        }
    }

    /// The agent's record of `party` (none for a party that does not exist).
    pub fn get(&self, party: PartyId) -> Option<&PartyControl> {
        self.controls.get(usize::from(party))
    }

    /// Every party's record, in party order.
    pub fn iter(&self) -> impl Iterator<Item = (PartyId, &PartyControl)> {
        self.controls
            .iter()
            .enumerate()
            .map(|(p, c)| (p as PartyId, c))
    }

    /// Process group (= pid) of `party`'s running instance, 0 when none.
    pub fn pgid(&self, party: PartyId) -> u32 {
        self.get(party).map_or(0, PartyControl::pgid)
    }

    /// The pools of `party` (none for a party that does not exist).
    pub fn pools_of(&self, party: PartyId) -> &[Arc<Pool>] {
        self.pools
            .get(usize::from(party))
            .map_or(&[], Pools::as_slice)
    }

    /// The pools of `party` as a set (`None` for a party that does not exist).
    pub fn pools(&self, party: PartyId) -> Option<&Pools> {
        self.pools.get(usize::from(party))
    }

    /// `party`'s record in each of its pools (its counters are in the first).
    pub fn records(&self, party: PartyId) -> impl Iterator<Item = &PartyRecord> {
        self.pools
            .get(usize::from(party))
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
        let threads = self.threads.get(usize::from(party)).copied().unwrap_or(1);
        Progress::create(&format!("zerohop-progress-{party}"), threads)
            .map_err(std::io::Error::other)
    }

    /// Wants `party` serving, parked or stopped before its supervisor runs (as the chain
    /// comes up).
    pub fn init_want(&self, party: PartyId, want: Want) {
        if let Some(c) = self.get(party) {
            c.want.send_replace(want);
        }
    }

    /// Wants `party` serving, parked or stopped (its supervisor follows).
    pub fn set_want(&self, party: PartyId, want: Want) {
        if let Some(c) = self.get(party) {
            c.want.send_if_modified(|w| {
                let changed = *w != want;
                *w = want;
                changed
            });
        }
    }

    /// Makes `party`'s supervisor look again (its function has a new run).
    pub fn poke(&self, party: PartyId) {
        if let Some(c) = self.get(party) {
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
        if let Some(c) = self.get(party) {
            c.activations.fetch_add(1, Ordering::Relaxed);
        }
        true
    }

    /// What the scaler wants of `party` (`Stop` for a party that does not exist).
    pub fn want_of(&self, party: PartyId) -> Want {
        self.get(party).map_or(Want::Stop, PartyControl::wanted)
    }
}

/// What the agent knows about one party's current instance.
pub(crate) struct PartyControl {
    /// Process group (= pid) of the running instance, 0 when none. Written only with
    /// `group` held.
    pgid: AtomicU32,
    /// Held while `pgid` changes and while a signal goes to that group
    /// ([`signal_group`](Self::signal_group)).
    group: Mutex<()>,
    /// Set by the watchdog when it kills the instance for hanging, or by the offence
    /// enforcer for sending invalid descriptors: what to report.
    hung: Mutex<Option<String>>,
    /// The running instance's progress records (its handler threads' word about
    /// themselves, for the watchdog), with its process group; `None` when none runs.
    progress: Mutex<Option<(u32, Arc<Progress>)>>,
    /// Times the instance was restarted.
    restarts: AtomicU32,
    /// Reads the running instance's CPU and memory from its cgroups (`None` without one).
    usage: Mutex<Option<UsageProbe>>,
    /// What the scaler wants; the party's supervisor follows it.
    want: watch::Sender<Want>,
    /// Times a parked instance of this party was activated.
    activations: AtomicU64,
    /// Times this party was started cold (no parked instance) because the scaler wanted it.
    cold_starts: AtomicU64,
    /// The version (`FunctionRun::generation`) its instance runs, if it has one.
    generation: AtomicU64,
    /// When the scaler last decided to activate this party (`CLOCK_MONOTONIC` ns, 0 never)
    /// and whether it had to start it cold: for measuring activation.
    decided_ns: AtomicU64,
    decided_cold: AtomicBool,
}

impl PartyControl {
    fn new(want: Want) -> Self {
        Self {
            pgid: AtomicU32::new(0),
            group: Mutex::new(()),
            hung: Mutex::new(None),
            progress: Mutex::new(None),
            restarts: AtomicU32::new(0),
            usage: Mutex::new(None),
            want: watch::channel(want).0,
            activations: AtomicU64::new(0),
            cold_starts: AtomicU64::new(0),
            generation: AtomicU64::new(0),
            decided_ns: AtomicU64::new(0),
            decided_cold: AtomicBool::new(false),
        }
    }

    /// Process group (= pid) of the running instance, 0 when none.
    pub fn pgid(&self) -> u32 {
        // SYNC POINT: Acquire pairs with the Release stores of `pgid` in `started` and
        // `gone`: a pid seen is that of an instance whose records and cgroup are set.
        self.pgid.load(Ordering::Acquire)
    }

    /// An instance was started as process group `pid`, from run `generation`, with its
    /// `progress` records and its cgroup's `usage` probe.
    pub fn started(
        &self,
        pid: u32,
        generation: u64,
        progress: Arc<Progress>,
        usage: Option<UsageProbe>,
    ) {
        {
            let _group = self.group.lock().unwrap_or_else(|p| p.into_inner());
            // SYNC POINT: Release pairs with the Acquire in `PartyControl::pgid`.
            self.pgid.store(pid, Ordering::Release);
        }
        self.generation.store(generation, Ordering::Relaxed);
        *self.progress.lock().unwrap_or_else(|p| p.into_inner()) = Some((pid, progress));
        *self.usage.lock().unwrap_or_else(|p| p.into_inner()) = usage;
    }

    /// Its instance is gone (process group and cgroup killed). Its supervisor says so
    /// before it reaps the instance's leader: see [`signal_group`](Self::signal_group).
    pub fn gone(&self) {
        {
            let _group = self.group.lock().unwrap_or_else(|p| p.into_inner());
            // SYNC POINT: Release pairs with the Acquire in `PartyControl::pgid`.
            self.pgid.store(0, Ordering::Release);
        }
        *self.usage.lock().unwrap_or_else(|p| p.into_inner()) = None;
        *self.progress.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// Sends `sig` to process group `pgid` if that is still this party's running instance
    /// (the watchdog and the offence enforcer decide on a group they saw a moment ago);
    /// whether it was. Checked and sent under the lock [`gone`](Self::gone) takes, and the
    /// supervisor calls `gone` before it reaps the group's leader: until then the leader is
    /// at least a zombie, whose pid the kernel gives to no other process, so the signal
    /// reaches what is left of this instance and never a stranger that got the number.
    pub fn signal_group(&self, pgid: u32, sig: Signal) -> bool {
        let _group = self.group.lock().unwrap_or_else(|p| p.into_inner());
        if pgid == 0 || self.pgid.load(Ordering::Acquire) != pgid {
            return false;
        }
        let _ = killpg(Pid::from_raw(pgid as i32), sig);
        true
    }

    /// What the scaler wants now.
    pub fn wanted(&self) -> Want {
        *self.want.borrow()
    }

    /// Follows what the scaler wants (its supervisor).
    pub fn subscribe(&self) -> watch::Receiver<Want> {
        self.want.subscribe()
    }

    /// Says why its instance is being killed (hung, hostile): what its supervisor reports.
    pub fn condemn(&self, why: String) {
        *self.hung.lock().unwrap_or_else(|p| p.into_inner()) = Some(why);
    }

    /// Why its instance was killed, if it was (once).
    pub fn take_condemned(&self) -> Option<String> {
        self.hung.lock().unwrap_or_else(|p| p.into_inner()).take()
    }

    /// The running instance's progress records with its process group (`None` when none
    /// runs).
    pub fn progress(&self) -> Option<(u32, Arc<Progress>)> {
        self.progress
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Reads the running instance's CPU and memory (`None` without an instance or cgroup).
    pub fn usage(&self) -> Option<UsageProbe> {
        self.usage.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Times the instance was restarted.
    pub fn restarts(&self) -> u32 {
        self.restarts.load(Ordering::Relaxed)
    }

    /// Counts a restart.
    pub fn count_restart(&self) {
        self.restarts.fetch_add(1, Ordering::Relaxed);
    }

    /// Times a parked instance of this party was activated.
    pub fn activations(&self) -> u64 {
        self.activations.load(Ordering::Relaxed)
    }

    /// Times this party was started cold because the scaler wanted it.
    pub fn cold_starts(&self) -> u64 {
        self.cold_starts.load(Ordering::Relaxed)
    }

    /// Counts a cold start.
    pub fn count_cold_start(&self) {
        self.cold_starts.fetch_add(1, Ordering::Relaxed);
    }

    /// The version its instance runs (0 before the first).
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Relaxed)
    }

    /// The scaler decided now to activate this party, `cold` (no parked instance) or not.
    pub fn decided(&self, cold: bool) {
        self.decided_cold.store(cold, Ordering::Relaxed);
        self.decided_ns
            .store(zerohop_pool::monotonic_ns(), Ordering::Relaxed);
    }

    /// When the scaler last decided to activate this party (`CLOCK_MONOTONIC` ns, 0 never)
    /// and whether cold.
    pub fn last_decision(&self) -> (u64, bool) {
        let cold = self.decided_cold.load(Ordering::Relaxed);
        (self.decided_ns.load(Ordering::Relaxed), cold)
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::CommandExt;
    use std::time::{Duration, Instant};

    use super::*;

    #[test]
    fn a_group_is_signalled_only_while_it_is_the_party_s_running_instance() {
        let control = PartyControl::new(Want::Run);
        // A process group of its own, as an instance has.
        let mut leader = std::process::Command::new("sleep")
            .arg("60")
            .process_group(0)
            .spawn()
            .unwrap();
        let pgid = leader.id();
        assert!(
            !control.signal_group(pgid, Signal::SIGKILL),
            "not started: nothing is sent"
        );
        let progress = Arc::new(Progress::create("parties-test", 1).unwrap());
        control.started(pgid, 1, progress, None);
        assert!(
            !control.signal_group(pgid + 1, Signal::SIGKILL),
            "another group: nothing is sent"
        );
        assert!(!control.signal_group(0, Signal::SIGKILL));
        assert_eq!(leader.try_wait().unwrap(), None, "still running");
        control.gone();
        assert!(
            !control.signal_group(pgid, Signal::SIGKILL),
            "gone (its leader may be reaped): nothing is sent"
        );
        assert_eq!(leader.try_wait().unwrap(), None, "still running");
        control.started(
            pgid,
            2,
            Arc::new(Progress::create("parties-test", 1).unwrap()),
            None,
        );
        assert!(control.signal_group(pgid, Signal::SIGKILL));
        let deadline = Instant::now() + Duration::from_secs(10);
        let status = loop {
            if let Some(s) = leader.try_wait().unwrap() {
                break s;
            }
            assert!(Instant::now() < deadline, "SIGKILL did not arrive");
            std::thread::sleep(Duration::from_millis(10));
        };
        assert!(!status.success());
    }
}
