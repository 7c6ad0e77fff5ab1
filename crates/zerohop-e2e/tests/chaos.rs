//! Chaos: `kill -9` of a random instance every 200 ms for 20 s while clients keep sending
//! requests over keep-alive connections.
//!
//! The chain runs on the real `zerohop agent` daemon (not `zerohop up`) because the daemon
//! shows what the test must check from outside: `zerohop status --json` has the slots in use,
//! every instance's pid and state, and the restarts. What must hold:
//!
//! * every request gets exactly one answer: 200 with the right body, or 502/503/504 whose
//!   one-line body says what happened (the instance that was killed and its function, the
//!   function whose queue is full, the chain that timed out); no transport error, no other
//!   status, no wait past the client's bound; the gateway's own counters agree;
//! * afterwards every function is back to its instance count, the restarts equal the kills,
//!   and a final burst is all 200;
//! * nothing is left: while the chain idles, no slot is in use, the daemon and its spawner
//!   hold as many descriptors as before, no zombie, one cgroup per live instance; after the
//!   daemon stops, no process it ever ran (instances, spawner, reaper, anything under the
//!   chain's uid) and no cgroup of the chain.
//!
//! Once per transport (`ring`, `socket`), each on a daemon of its own, side by side. The
//! killer's choices come from a PRNG whose seed is printed; `CHAOS_SEED=N` replays one.
//!
//! An instance killed after it attached is restarted after 100 ms (the backoff that doubles
//! to 5 s is for instances that die before they attach), so a kill every 200 ms leaves most
//! functions serving most of the time; a request that finds none waits for the restart (or
//! its timeout: 504).

mod common;

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::daemon::Daemon;
use common::func;
use procfs::process::{FDTarget, MountInfo, Process};
use serde_json::Value;
use zerohop_test_support::{
    alive, all_stats, descendants, instances, open_fds, signal_pid, spawner, ticks_per_second,
    wait_until, Signal,
};

const CHAIN: &str = "chaos";
/// The chain's functions in route order: name, `TESTFN_MODE`, instances.
const FUNCTIONS: [(&str, &str, usize); 3] = [
    ("upper", "upper", 3),
    ("bang1", "exclaim", 2),
    ("bang2", "exclaim", 2),
];
/// Two cores: three closed-loop clients keep the chain busy without starving the killer.
const CLIENTS: usize = 3;
const KILL_EVERY: Duration = Duration::from_millis(200);
const CHAOS_FOR: Duration = Duration::from_secs(20);
/// The chain's `timeout`: a request queued for an instance that is down for longer gets 504.
const CHAIN_TIMEOUT: &str = "5s";
/// Every request's bound on the client side: the chain's timeout plus room for a loaded host.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(15);
/// Restart backoff tops out at 5 s; a function is back well within this.
const RECOVERY: Duration = Duration::from_secs(20);
/// Descriptors the daemon may hold beyond its count before the chaos (a connection the
/// gateway has not seen closed yet).
const FD_SLACK: usize = 2;
/// Every `zerohop` call's bound: the daemon must answer its CLI promptly under the chaos too.
const CLI_BOUND: Duration = Duration::from_secs(10);

fn total_instances() -> usize {
    FUNCTIONS.iter().map(|f| f.2).sum()
}

fn spec(transport: &str) -> String {
    let mut s = format!(
        "name: {CHAIN}\ntransport: {transport}\npool: {{ slots: 64, slot_size: 16KiB }}\n\
         timeout: {CHAIN_TIMEOUT}\ngateway_threads: 2\nfunctions:\n"
    );
    for (name, mode, n) in FUNCTIONS {
        s.push_str(&func(name, mode, "", &format!(", instances: {n}")));
    }
    let seq: Vec<&str> = FUNCTIONS.iter().map(|f| f.0).collect();
    s.push_str(&format!(
        "routes:\n  - http: POST /go\n    sequence: [{}]\n",
        seq.join(", ")
    ));
    s
}

/// What the chain answers to a request with `body` when nothing goes wrong.
fn expected(body: &str) -> String {
    format!("{}!!", body.to_ascii_uppercase())
}

/// xorshift64*: deterministic for a seed, good enough to pick victims.
struct Prng(u64);

impl Prng {
    fn new(seed: u64) -> Self {
        Self(seed.max(1))
    }

    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) as usize % n
    }
}

/// One request as a client saw it.
struct Outcome {
    sent: String,
    /// Status and body, or why there was no answer.
    answer: Result<(u16, String), String>,
    took: Duration,
}

/// A keep-alive client whose every request is bounded.
fn http() -> ureq::Agent {
    ureq::AgentBuilder::new().timeout(CLIENT_TIMEOUT).build()
}

fn send(http: &ureq::Agent, url: &str, body: &str) -> Outcome {
    let t = Instant::now();
    let read = |r: ureq::Response| {
        let status = r.status();
        r.into_string()
            .map(|b| (status, b))
            .map_err(|e| format!("reading the body of a {status}: {e}"))
    };
    let answer = match http.post(url).send_string(body) {
        Ok(r) => read(r),
        Err(ureq::Error::Status(_, r)) => read(r),
        Err(e) => Err(e.to_string()),
    };
    Outcome {
        sent: body.to_owned(),
        answer,
        took: t.elapsed(),
    }
}

/// Client threads sending back to back until stopped; each hands back what it saw. Dropping
/// the load stops it (the threads end within one request's bound).
struct Load {
    stop: Arc<AtomicBool>,
    rx: Receiver<Vec<Outcome>>,
    clients: usize,
}

impl Load {
    fn start(url: &str, clients: usize, tag: &str) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = channel();
        for c in 0..clients {
            let (stop, tx, url, tag) = (stop.clone(), tx.clone(), url.to_owned(), tag.to_owned());
            std::thread::spawn(move || {
                let http = http();
                let mut seen = Vec::new();
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    seen.push(send(&http, &url, &format!("{tag} c{c} n{i}")));
                    i += 1;
                }
                let _ = tx.send(seen);
            });
        }
        Self { stop, rx, clients }
    }

    /// Stops the clients and collects what they saw (bounded: each is at most one request
    /// away from stopping).
    fn finish(self) -> Vec<Outcome> {
        self.stop.store(true, Ordering::Relaxed);
        let deadline = Instant::now() + CLIENT_TIMEOUT + Duration::from_secs(10);
        let mut all = Vec::new();
        for _ in 0..self.clients {
            let left = deadline.saturating_duration_since(Instant::now());
            all.extend(
                self.rx
                    .recv_timeout(left)
                    .expect("a client thread ended in time"),
            );
        }
        all
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Who is who in the chain, from its status: function of each party.
struct Parties(BTreeMap<u64, String>);

impl Parties {
    fn of(status: &Value) -> Self {
        let mut m = BTreeMap::new();
        for f in functions(status) {
            for i in f["instances"].as_array().expect("instances") {
                m.insert(
                    i["party"].as_u64().expect("party"),
                    f["name"].as_str().expect("name").to_owned(),
                );
            }
        }
        Self(m)
    }
}

fn functions(status: &Value) -> &Vec<Value> {
    status["functions"].as_array().expect("functions")
}

/// Sorts an answer into a kind, or says why it is not an acceptable one.
fn verdict(o: &Outcome, parties: &Parties) -> Result<&'static str, String> {
    let (status, body) = match &o.answer {
        Ok(a) => a,
        Err(e) => return Err(format!("no answer after {:?}: {e}", o.took)),
    };
    let line = body.strip_suffix('\n').unwrap_or(body);
    let bad = |why: &str| Err(format!("{why}: {status} {body:?} after {:?}", o.took));
    if line.is_empty() || line.contains('\n') {
        return bad("not a one-line body");
    }
    // `function 'F': REST` with F a function of the chain.
    let function_says = || -> Option<(&str, &str)> {
        let (f, rest) = line.strip_prefix("function '")?.split_once("': ")?;
        FUNCTIONS.iter().any(|x| x.0 == f).then_some((f, rest))
    };
    match status {
        200 if *body == expected(&o.sent) => Ok("200"),
        200 => bad("200 with the wrong body"),
        502 => {
            // The instance that died, its function, and how.
            let Some((f, rest)) = function_says() else {
                return bad("a 502 that names no function of the chain");
            };
            let Some((party, how)) = rest
                .strip_prefix("instance ")
                .and_then(|r| r.split_once(' '))
            else {
                return bad("a 502 that names no instance");
            };
            let party_function = parties.0.get(&party.parse().unwrap_or(u64::MAX));
            if party_function.map(String::as_str) != Some(f) {
                return bad(&format!(
                    "a 502 naming instance {party}, which is not one of '{f}'"
                ));
            }
            if how != "was killed by signal 9 while handling this request" {
                return bad("a 502 that is not a kill");
            }
            Ok("502 instance killed")
        }
        503 => match function_says() {
            Some((_, rest)) if rest.starts_with("its queue is full") => Ok("503 queue full"),
            _ if FUNCTIONS
                .iter()
                .any(|f| line.starts_with(&format!("transport: could not reach `{}`", f.0))) =>
            {
                Ok("503 unreachable")
            }
            _ => bad("a 503 that names no function"),
        },
        504 if line
            == format!("gateway: chain '{CHAIN}' did not answer within {CHAIN_TIMEOUT}") =>
        {
            Ok("504 timeout")
        }
        _ => bad("not 200 nor a 5xx that says what happened"),
    }
}

/// Live (not zombie) instance processes of the daemon `agent`.
fn live_instances(agent: u32) -> Vec<u32> {
    instances(agent).into_iter().filter(|&p| alive(p)).collect()
}

fn zombies(agent: u32) -> Vec<u32> {
    all_stats()
        .into_iter()
        .filter(|s| s.ppid as u32 == agent && s.state == 'Z')
        .map(|s| s.pid as u32)
        .collect()
}

fn pipes(pid: u32) -> HashSet<u64> {
    let Some(fds) = Process::new(pid as i32).ok().and_then(|p| p.fd().ok()) else {
        return HashSet::new();
    };
    fds.filter_map(|fd| match fd.ok()?.target {
        FDTarget::Pipe(inode) => Some(inode),
        _ => None,
    })
    .collect()
}

/// The chain's reaper: detached from the daemon (no descendant of it), found as the
/// `zerohop-reaper` reading from a pipe whose other end the daemon holds.
fn reapers(agent: u32) -> Vec<u32> {
    let ours = pipes(agent);
    all_stats()
        .into_iter()
        .filter(|s| s.comm == "zerohop-reaper")
        .map(|s| s.pid as u32)
        .filter(|&p| !pipes(p).is_disjoint(&ours))
        .collect()
}

fn euid(pid: u32) -> Option<u32> {
    Some(Process::new(pid as i32).ok()?.status().ok()?.euid)
}

/// Clock ticks since boot (the unit of `Stat::starttime`).
fn ticks_since_boot() -> u64 {
    let up = std::fs::read_to_string("/proc/uptime").expect("/proc/uptime");
    let secs: f64 = up
        .split_whitespace()
        .next()
        .and_then(|s| s.parse().ok())
        .expect("uptime seconds");
    (secs * ticks_per_second()) as u64
}

/// Processes running as `uid` that started before `ticks` (another agent may take the uid
/// once this one has let it go); zombies, which hold nothing but a pid, aside.
fn processes_of_uid(uid: u32, ticks: u64) -> Vec<u32> {
    all_stats()
        .into_iter()
        .filter(|s| s.state != 'Z' && s.starttime <= ticks && euid(s.pid as u32) == Some(uid))
        .map(|s| s.pid as u32)
        .collect()
}

fn mounts() -> Vec<MountInfo> {
    Process::myself().unwrap().mountinfo().unwrap().0
}

/// Every group the daemon `agent` made for the chain: `zerohop-<agent>-<chain>` beside its
/// own group (this process's, it being our child) in each mounted hierarchy; with whether
/// it is in the unified hierarchy.
fn chain_groups(agent: u32) -> Vec<(PathBuf, bool)> {
    let name = format!("zerohop-{agent}-{CHAIN}");
    let own = Process::myself().unwrap().cgroups().unwrap().0;
    let mut out = Vec::new();
    for m in mounts() {
        let v2 = m.fs_type == "cgroup2";
        if !v2 && m.fs_type != "cgroup" {
            continue;
        }
        for g in &own {
            let fits = if v2 {
                g.hierarchy == 0
            } else {
                g.hierarchy != 0
                    && g.controllers
                        .iter()
                        .any(|c| m.super_options.contains_key(c))
            };
            let Some(rel) = g.pathname.strip_prefix(m.root.trim_end_matches('/')) else {
                continue;
            };
            let dir = m.mount_point.join(rel.trim_start_matches('/')).join(&name);
            if fits && dir.is_dir() {
                out.push((dir, v2));
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

fn subgroups(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.path())
                .filter(|p| p.is_dir())
                .collect()
        })
        .unwrap_or_default()
}

fn members(group: &Path) -> Vec<u32> {
    std::fs::read_to_string(group.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// Whether the chain is whole again: every function has all its instances ready, their
/// pids are exactly the daemon's live instance processes, and no child is a zombie.
fn recovered(status: &Value, agent: u32) -> Result<(), String> {
    let mut pids = Vec::new();
    for ((want_name, _, want), f) in FUNCTIONS.iter().zip(functions(status)) {
        let (ready, desired) = (f["ready"].as_u64(), f["desired"].as_u64());
        if f["name"] != *want_name || ready != Some(*want as u64) || desired != ready {
            return Err(format!(
                "{want_name}: ready {ready:?}, desired {desired:?} of {want}"
            ));
        }
        for i in f["instances"].as_array().expect("instances") {
            if i["state"] != "ready" {
                return Err(format!("{want_name}: instance {i}"));
            }
            pids.push(i["pid"].as_u64().expect("a ready instance has a pid") as u32);
        }
    }
    pids.sort_unstable();
    let mut live = live_instances(agent);
    live.sort_unstable();
    if pids != live {
        return Err(format!(
            "status pids {pids:?}, live instance processes {live:?}"
        ));
    }
    let z = zombies(agent);
    if !z.is_empty() {
        return Err(format!("zombie children {z:?}"));
    }
    Ok(())
}

/// The descriptor count of `pid` once it has held still for 300 ms (at most 5 s).
fn settled_fds(pid: u32) -> usize {
    let mut last = open_fds(pid);
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(300));
        let now = open_fds(pid);
        if now == last {
            break;
        }
        last = now;
    }
    last
}

/// The daemon's world once the chain is up and idle, to compare with after the chaos.
struct Baseline {
    agent: u32,
    spawner: u32,
    reaper: u32,
    fds: usize,
    spawner_fds: usize,
    /// The uid the chain's instances run as.
    uid: u32,
    /// The chain's cgroups, and whether each is in the unified hierarchy.
    groups: Vec<(PathBuf, bool)>,
}

impl Baseline {
    fn take(agent: u32) -> Self {
        let spawner = spawner(agent).expect("the daemon's spawner runs");
        let reaper = reapers(agent);
        assert_eq!(reaper.len(), 1, "one reaper for the chain: {reaper:?}");
        let groups = chain_groups(agent);
        if groups.is_empty() {
            assert!(
                !nix::unistd::geteuid().is_root(),
                "as root the chain has cgroups"
            );
            eprintln!("not root and no delegated cgroup: the chain has no cgroup to check");
        }
        Self {
            agent,
            spawner,
            reaper: reaper[0],
            fds: settled_fds(agent),
            spawner_fds: open_fds(spawner),
            uid: euid(live_instances(agent)[0]).expect("an instance's uid"),
            groups,
        }
    }
}

/// What the killer did.
#[derive(Default)]
struct Kills {
    /// Instances signalled.
    killed: HashSet<u32>,
    /// Ticks at which every instance was down (restarting, with backoff).
    none_alive: u32,
    /// Every instance process seen, killed or not.
    seen: HashSet<u32>,
}

/// Every `KILL_EVERY` for `CHAOS_FOR`, SIGKILL one live instance of `agent` picked by `rng`.
fn kill_randomly(agent: u32, rng: &mut Prng) -> Kills {
    let mut k = Kills::default();
    let t0 = Instant::now();
    let ticks = (CHAOS_FOR.as_millis() / KILL_EVERY.as_millis()) as u32;
    for tick in 1..=ticks {
        if let Some(wait) = (t0 + KILL_EVERY * tick).checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        let live = live_instances(agent);
        k.seen.extend(live.iter().copied());
        // One signalled but not yet gone is no victim again: every kill is one death.
        let victims: Vec<u32> = live.into_iter().filter(|p| !k.killed.contains(p)).collect();
        if victims.is_empty() {
            k.none_alive += 1;
            continue;
        }
        let victim = victims[rng.below(victims.len())];
        signal_pid(victim, Signal::SIGKILL);
        k.killed.insert(victim);
    }
    k
}

/// Sorts every outcome into its kind; fails on any that is not acceptable.
fn tally(outcomes: &[Outcome], parties: &Parties) -> BTreeMap<&'static str, u64> {
    let mut kinds = BTreeMap::new();
    let mut wrong = Vec::new();
    for o in outcomes {
        match verdict(o, parties) {
            Ok(kind) => *kinds.entry(kind).or_default() += 1,
            Err(e) => wrong.push(e),
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {} requests got no acceptable answer ({kinds:?} did); the first ones:\n{}",
        wrong.len(),
        outcomes.len(),
        wrong[..wrong.len().min(10)].join("\n")
    );
    kinds
}

/// While the chain idles after the chaos: nothing held, and nothing piled up (descriptors,
/// processes, cgroups) compared with `base`. Returns the daemon's and the spawner's
/// descriptor counts.
fn assert_nothing_piled_up(daemon: &Daemon, base: &Baseline) -> (usize, usize) {
    let mut last = Value::Null;
    assert!(
        wait_until(Duration::from_secs(5), || {
            last = daemon.status(CHAIN);
            last["slots"]["in_use"] == 0
                && last["gateway"]["inflight"] == 0
                && functions(&last)
                    .iter()
                    .all(|f| f["slots"] == 0 && f["busy"] == 0)
        }),
        "slots or requests still held when idle: {last}"
    );
    // The daemon's descriptors (per-instance pipes, pidfds and cgroup files are replaced at
    // each restart, never piled up), and the spawner's (it hands each launch's on).
    let mut fds = open_fds(base.agent);
    assert!(
        wait_until(Duration::from_secs(10), || {
            fds = open_fds(base.agent);
            fds <= base.fds + FD_SLACK
        }),
        "daemon descriptors: {} before the chaos, {fds} after",
        base.fds
    );
    let spawner_fds = open_fds(base.spawner);
    assert_eq!(spawner_fds, base.spawner_fds, "the spawner's descriptors");
    // Processes: the spawner and one per instance, nothing else below the daemon.
    let live = live_instances(base.agent);
    let mut below = descendants(&[base.agent]);
    below.sort_unstable();
    let mut want = live.clone();
    want.extend([base.agent, base.spawner]);
    want.sort_unstable();
    assert_eq!(below, want, "processes below the daemon");
    // Cgroups: where instances have groups, one per live instance, none empty.
    for (dir, v2) in &base.groups {
        let subs = subgroups(dir);
        for s in &subs {
            let m = members(s);
            assert!(
                !m.is_empty() && m.iter().all(|p| live.contains(p)),
                "{} holds {m:?}, not a live instance (live: {live:?})",
                s.display()
            );
        }
        assert!(
            subs.is_empty() || subs.len() == live.len(),
            "{}: {} groups for {} instances: {subs:?}",
            dir.display(),
            subs.len(),
            live.len()
        );
        if *v2 {
            // Instances are killed through their unified group: each has one.
            assert_eq!(subs.len(), total_instances(), "{}", dir.display());
        }
    }
    (fds, spawner_fds)
}

/// After the daemon stopped: none of the processes `seen`, nor the reaper, nor anything else
/// under the chain's uid, nor any cgroup of the chain, is left; its log has no error.
fn assert_nothing_left(daemon: &Daemon, base: &Baseline, seen: &HashSet<u32>) {
    let stopped_at = ticks_since_boot();
    let mut left = Vec::new();
    assert!(
        wait_until(Duration::from_secs(10), || {
            left = seen
                .iter()
                .chain([&base.spawner, &base.reaper])
                .copied()
                .filter(|&p| alive(p))
                .collect();
            left.is_empty()
        }),
        "processes of the chain left after the daemon stopped: {left:?}"
    );
    // Not as root instances run as our own uid, which says nothing.
    if base.uid != nix::unistd::geteuid().as_raw() {
        assert!(
            wait_until(Duration::from_secs(5), || {
                left = processes_of_uid(base.uid, stopped_at);
                left.is_empty()
            }),
            "processes of the chain's uid {} left: {left:?}",
            base.uid
        );
    }
    let mut groups = Vec::new();
    assert!(
        wait_until(Duration::from_secs(10), || {
            groups = chain_groups(base.agent);
            groups.is_empty() && base.groups.iter().all(|(d, _)| !d.exists())
        }),
        "cgroups left: {groups:?}"
    );
    assert!(!daemon.socket().exists(), "the admin socket is removed");
    // Deaths are warnings; an error (a failed restart, the receive path) or a panic is not
    // what the daemon should meet here.
    let log = std::fs::read_to_string(daemon.log()).expect("the agent's log");
    let bad: Vec<&str> = log
        .lines()
        .filter(|l| l.contains(" ERROR ") || l.contains("panicked"))
        .collect();
    assert!(bad.is_empty(), "the agent logged:\n{}", bad.join("\n"));
}

#[test]
fn kill_9_under_load_over_ring_loses_no_answer_and_leaves_nothing() {
    chaos("ring");
}

#[test]
fn kill_9_under_load_over_socket_loses_no_answer_and_leaves_nothing() {
    chaos("socket");
}

#[test]
fn kill_9_under_load_over_sockmap_loses_no_answer_and_leaves_nothing() {
    chaos("sockmap");
}

/// The whole run on `transport`: one daemon of its own, so the two transports' runs may go
/// side by side (every check is by the daemon's pid, its chain's uid and cgroups).
fn chaos(transport: &str) {
    let seed = std::env::var("CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .expect("after 1970")
                .as_nanos() as u64
        });
    eprintln!("{transport}: chaos seed {seed} (replay with CHAOS_SEED={seed})");

    let mut daemon = Daemon::start().with_cli_bound(CLI_BOUND);
    let agent = daemon.pid();
    let applied = daemon.apply(CHAIN, &spec(transport));
    assert_eq!(applied["applied"], "created", "{applied}");
    let listener = applied["status"]["listeners"][0].as_str();
    let url = format!("{}/go", listener.expect("an http listener"));
    let mut last = Err(String::new());
    let up = wait_until(Duration::from_secs(10), || {
        last = recovered(&daemon.status(CHAIN), agent);
        last.is_ok()
    });
    assert!(up, "the chain came up whole: {last:?}");
    let parties = Parties::of(&daemon.status(CHAIN));

    // Warm-up; its connection then closes, so the baseline is of an idle daemon.
    let warm = http();
    for i in 0..20 {
        let o = send(&warm, &url, &format!("warm n{i}"));
        assert_eq!(verdict(&o, &parties), Ok("200"), "warm-up {i}");
    }
    drop(warm);
    let base = Baseline::take(agent);

    // The chaos: clients keep sending while this thread kills.
    let t0 = Instant::now();
    let load = Load::start(&url, CLIENTS, "chaos");
    let kills = kill_randomly(agent, &mut Prng::new(seed));
    let outcomes = load.finish();
    let chaos_took = t0.elapsed();
    let slowest = outcomes.iter().map(|o| o.took).max().unwrap_or_default();
    let kinds = tally(&outcomes, &parties);
    let chaos_ok = kinds.get("200").copied().unwrap_or(0);
    eprintln!(
        "{transport}: chaos: {} requests over {chaos_took:.1?} from {CLIENTS} clients (slowest {slowest:.1?}): \
         {kinds:?}; {} kills ({} ticks found every instance down)",
        outcomes.len(),
        kills.killed.len(),
        kills.none_alive
    );
    assert!(chaos_ok > 0, "no request got through the chaos");

    // The chain comes back whole, each killed instance restarted once.
    let t1 = Instant::now();
    let back = wait_until(RECOVERY, || {
        last = recovered(&daemon.status(CHAIN), agent);
        last.is_ok()
    });
    assert!(back, "not whole {RECOVERY:?} after the chaos: {last:?}");
    let recovery_took = t1.elapsed();
    let status = daemon.status(CHAIN);
    let restarts: u64 = functions(&status)
        .iter()
        .map(|f| f["restarts"].as_u64().expect("restarts"))
        .sum();
    assert_eq!(
        restarts,
        kills.killed.len() as u64,
        "every killed instance was restarted once, none else: {status}"
    );

    // A final burst through the recovered chain: all 200.
    let burst = Load::start(&url, CLIENTS, "after");
    std::thread::sleep(Duration::from_secs(2));
    let after = burst.finish();
    for o in &after {
        assert_eq!(
            verdict(o, &parties),
            Ok("200"),
            "after the chaos: {:?}",
            o.answer
        );
    }

    let (fds, spawner_fds) = assert_nothing_piled_up(&daemon, &base);
    // The gateway answered each request once: its counts are the clients' (warm-up, chaos,
    // burst).
    let gw = daemon.status(CHAIN)["gateway"].clone();
    let ok = 20 + chaos_ok + after.len() as u64;
    let errors = outcomes.len() as u64 - chaos_ok;
    assert_eq!(
        (gw["ok"].as_u64(), gw["errors"].as_u64()),
        (Some(ok), Some(errors)),
        "the gateway's counts of answers are the clients': {gw}"
    );
    assert_eq!(gw["refused"], 0, "no descriptor refused: {gw}");
    // Stale descriptors restarted instances dropped (their slot was reclaimed meanwhile).
    let rejected: u64 = functions(&status)
        .iter()
        .flat_map(|f| f["rejected"].as_array().expect("rejected").iter())
        .filter_map(Value::as_u64)
        .sum();

    let mut seen = kills.seen;
    seen.extend(live_instances(agent));
    assert_eq!(daemon.stop(), Some(0), "the daemon stops cleanly");
    assert_nothing_left(&daemon, &base, &seen);

    let fives: BTreeMap<_, _> = kinds.iter().filter(|(k, _)| **k != "200").collect();
    eprintln!(
        "{transport}: chaos summary: seed {seed}; {} requests: {chaos_ok} x 200, 5xx {fives:?}; {} kills, \
         {restarts} restarts; {} late answers, {rejected} stale descriptors dropped; whole \
         again after {recovery_took:.1?}; final burst {} x 200; daemon fds {} -> {fds}, \
         spawner fds {} -> {spawner_fds}; {} cgroup hierarchies checked",
        outcomes.len(),
        kills.killed.len(),
        gw["late"],
        after.len(),
        base.fds,
        base.spawner_fds,
        base.groups.len(),
    );
}
