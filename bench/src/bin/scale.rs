//! `zerohop-bench-scale`: how zerohop behaves with many warm instances in one chain.
//!
//! For each instance count N (`--instances 10,100,1000`) it writes a chain of
//! F = min(16, N) pass-through functions (`zerohop-bench-pass`) in one route, `POST /bench`,
//! with N instances spread evenly over them and `gateway_threads: 1`, runs
//! `zerohop up SPEC --listen 127.0.0.1:0` and measures:
//!
//! * ready time: from spawn to zerohop's `ready at` line, and when the instances were started
//!   (their start times in `/proc/PID/stat`, relative to zerohop's);
//! * memory: per instance (children of the zerohop process) `Private_Clean + Private_Dirty`,
//!   `Pss` and `Rss` of `/proc/PID/smaps_rollup`, page tables, and a per-mapping breakdown
//!   from `/proc/PID/smaps` (binary, libraries, heap, anonymous, pool, ring outboxes and
//!   inboxes); the same for the agent (the zerohop process); measured at ready and again
//!   after the load;
//! * shared memory: the memfds the agent holds (pool and ring regions, by their names, each
//!   counted once even where the agent holds it twice), their sizes, and how much of it is
//!   resident (sum of `Pss_Shmem` over the chain's processes; `Shmem` of `/proc/meminfo`
//!   before and after as a cross-check);
//! * idle CPU: utime + stime of the agent and every instance over an idle window, before and
//!   after the load;
//! * requests per second: a closed loop of 32 connections sending 100-byte bodies for 3 s,
//!   every answer checked (status 200, body unchanged) by the benchmark's load generator.
//!
//! Then zerohop is stopped with SIGTERM and every process it started must be gone before the
//! next N. Progress goes to stderr, a JSON document to stdout (plus a markdown table with
//! `--markdown`). Exit code 1 when any point failed (the reason is in its `error` field and
//! on stderr), 0 otherwise.
//!
//! Every wait is bounded. zerohop runs in a process group of its own; on an error, a panic,
//! SIGINT or SIGTERM the chain is stopped (SIGTERM, then SIGKILL) and every instance and
//! every member of zerohop's process group that is left is killed.

#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use clap::Parser;
use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;
use serde::Serialize;
use zerohop_bench::loadgen::{self, BodyMix, Load};
use zerohop_bench::passes;
use zerohop_bench::procstat::memory::{
    by_kind, meminfo_kib, smaps, KindStat, Mapping, Memfds, Rollup, Status,
};
use zerohop_bench::procstat::{
    environ_var, exe_path, process_group, ticks_to_seconds, ProcessId as Proc, TickSample,
};
use zerohop_bench::report::{self, Machine, Table};
use zerohop_bench::systems::{FUNCTION_ENV, ZEROHOP_PATH};
use zerohop_test_support::{children, instances, open_fds, wait_until};

/// Instances per function the spec allows.
const MAX_INSTANCES_PER_FUNCTION: usize = 64;
/// How long instances and zerohop's process group get to follow zerohop out.
const ORPHAN_GRACE: Duration = Duration::from_secs(5);

#[derive(Parser, Debug)]
#[command(
    name = "zerohop-bench-scale",
    about = "Measures ready time, memory, idle CPU and throughput of zerohop with many warm \
             instances in one chain"
)]
struct Args {
    /// Instance counts to measure, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "10,100,1000")]
    instances: Vec<usize>,
    /// Most functions in the chain (F = min(this, N)).
    #[arg(long, default_value_t = 16)]
    max_functions: usize,
    /// Length of each idle window, seconds.
    #[arg(long, default_value_t = 5.0)]
    idle_seconds: f64,
    /// Length of the measured load, seconds (after a 0.5 s warm-up).
    #[arg(long, default_value_t = 3.0)]
    load_seconds: f64,
    /// Connections of the closed-loop load.
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// Bound on waiting for the ready line and for zerohop to stop, seconds.
    #[arg(long, default_value_t = 60.0)]
    timeout: f64,
    /// Instances broken down per mapping in the JSON (one of the first, middle and last
    /// function each, up to this many).
    #[arg(long, default_value_t = 3)]
    detail: usize,
    /// Folder of the built binaries (`zerohop`, `zerohop-bench-pass`); default: this
    /// binary's folder.
    #[arg(long)]
    bin_dir: Option<PathBuf>,
    /// Also print a markdown table (after the JSON).
    #[arg(long)]
    markdown: bool,
    /// Keep the per-point folders (spec, zerohop's log) instead of removing them.
    #[arg(long)]
    keep: bool,
}

// ---------------------------------------------------------------------------------------
// Output.

/// The whole document.
#[derive(Serialize)]
struct Report {
    machine: Machine,
    settings: Settings,
    points: Vec<Point>,
    ok: bool,
}

#[derive(Serialize)]
struct Settings {
    idle_seconds: f64,
    load_seconds: f64,
    concurrency: usize,
    body_bytes: usize,
    gateway_threads: u32,
    pool: &'static str,
}

/// One instance count.
#[derive(Serialize, Default)]
struct Point {
    instances: usize,
    functions: usize,
    /// Instances of each function, in chain order.
    per_function: Vec<usize>,
    ok: bool,
    error: Option<String>,
    /// Spawn to the ready line, seconds.
    ready_s: Option<f64>,
    startup: Option<Startup>,
    memory_at_ready: Option<Memory>,
    memory_after_load: Option<Memory>,
    idle_before_load: Option<Idle>,
    idle_after_load: Option<Idle>,
    load: Option<LoadResult>,
    stop: Option<Stop>,
}

/// When things happened during startup (instance start times from /proc, 10 ms ticks).
#[derive(Serialize)]
struct Startup {
    /// First instance started, seconds after zerohop started.
    first_instance_s: f64,
    /// Last instance started, seconds after zerohop started (the spawn loop's length).
    last_instance_s: f64,
    /// From the last instance's start to the ready line, seconds (attach + wait loop).
    ready_after_last_spawn_s: f64,
    /// CPU the agent used until ready (all its threads), seconds.
    agent_cpu_s: f64,
    /// Of which in the kernel, seconds.
    agent_sys_s: f64,
    /// CPU of all instances until ready (fork child set-up, exec, attach), seconds.
    instances_cpu_s: f64,
    /// Of which in the kernel, seconds.
    instances_sys_s: f64,
}

/// Memory of the instances and of the agent at one moment.
#[derive(Serialize)]
struct Memory {
    instances_found: usize,
    private_kib_mean: f64,
    private_kib_max: u64,
    pss_kib_mean: f64,
    rss_kib_mean: f64,
    rss_kib_max: u64,
    /// Page tables (VmPTE), which smaps does not count.
    page_tables_kib_mean: f64,
    /// Private KiB per instance by kind of mapping (mean over instances).
    private_by_kind_kib_mean: BTreeMap<String, f64>,
    /// Rss KiB per instance by kind of mapping (mean over instances).
    rss_by_kind_kib_mean: BTreeMap<String, f64>,
    /// Mappings per instance by kind (mean over instances): how many ring regions each maps.
    mappings_by_kind_mean: BTreeMap<String, f64>,
    /// Mapped (virtual) KiB per instance by kind (mean over instances).
    mapped_by_kind_kib_mean: BTreeMap<String, f64>,
    /// Open descriptors per instance (mean).
    fds_mean: f64,
    agent: Agent,
    shared: Shared,
    /// A few instances broken down per mapping kind.
    samples: Vec<Sample>,
}

#[derive(Serialize)]
struct Agent {
    pid: u32,
    rss_kib: u64,
    private_kib: u64,
    pss_kib: u64,
    page_tables_kib: u64,
    fds: usize,
    mappings: usize,
    threads: u64,
    by_kind: BTreeMap<String, KindStat>,
}

/// The chain's shared memory: the memfds the agent holds.
#[derive(Serialize, Default)]
struct Shared {
    pool_memfds: usize,
    pool_kib: u64,
    ring_memfds: usize,
    ring_kib: u64,
    outbox_memfds: usize,
    outbox_kib: u64,
    inbox_memfds: usize,
    inbox_kib: u64,
    /// Largest outbox, KiB.
    outbox_kib_max: u64,
    other_memfds: usize,
    other_kib: u64,
    /// Descriptors of memfds the agent holds (each region has a read-write and a read-only
    /// one).
    memfd_fds: usize,
    /// Resident shared memory of the chain: sum of `Pss_Shmem` over the agent and every
    /// instance (each resident page counted once), KiB.
    resident_shmem_kib: u64,
    /// Resident pool memory: the agent maps every pool whole and writes every slot it
    /// hands out, so its Rss of the pool mappings, KiB.
    pool_resident_kib: u64,
    /// `resident_shmem_kib - pool_resident_kib`: the rings' resident memory, KiB.
    ring_resident_kib: u64,
    /// Rss of the ring mappings in the agent alone, KiB.
    agent_ring_rss_kib: u64,
    /// `Shmem` of /proc/meminfo now minus before zerohop started (whole machine), KiB.
    meminfo_shmem_delta_kib: i64,
}

#[derive(Serialize)]
struct Sample {
    pid: u32,
    function: String,
    private_kib: u64,
    rss_kib: u64,
    page_tables_kib: u64,
    by_kind: BTreeMap<String, KindStat>,
    /// The mappings with the most private memory (name, permissions, KiB).
    top_private: Vec<TopMapping>,
}

#[derive(Serialize)]
struct TopMapping {
    name: String,
    perms: String,
    size_kib: u64,
    rss_kib: u64,
    private_kib: u64,
}

#[derive(Serialize)]
struct Idle {
    seconds: f64,
    /// CPU seconds of the agent and every instance together.
    cpu_s: f64,
    agent_cpu_s: f64,
    instances_cpu_s: f64,
    /// Instances that used any CPU in the window.
    busy_instances: usize,
}

#[derive(Serialize)]
struct LoadResult {
    concurrency: usize,
    seconds: f64,
    rps: f64,
    requests: u64,
    errors: u64,
    wrong: u64,
    p50_us: f64,
    p99_us: f64,
    first_error: Option<String>,
    /// CPU seconds of the agent and the instances during the whole load (warm-up included).
    agent_cpu_s: f64,
    instances_cpu_s: f64,
}

#[derive(Serialize)]
struct Stop {
    /// SIGTERM to zerohop's exit, seconds.
    seconds: f64,
    exit: String,
    /// Instances or members of zerohop's process group still there after it exited (killed).
    leftovers: usize,
}

// ---------------------------------------------------------------------------------------
// Processes.

/// SIGKILL to `p` if it is still that very process.
fn sigkill(p: Proc) {
    if p.alive() {
        let _ = kill(Pid::from_raw(p.pid as i32), Signal::SIGKILL);
    }
}

/// What the SIGINT/SIGTERM handler must clean up: the running zerohop (its pid leads its
/// process group) and its instances.
struct Live {
    zerohop: Proc,
    instances: Vec<Proc>,
}

static LIVE: Mutex<Option<Live>> = Mutex::new(None);

fn live() -> std::sync::MutexGuard<'static, Option<Live>> {
    LIVE.lock().unwrap_or_else(|p| p.into_inner())
}

/// Stops whatever is registered in [`LIVE`]: SIGTERM to zerohop, SIGKILL after `grace`,
/// then SIGKILL to every instance and member of its group that is left. Returns how many
/// had to be killed after zerohop was gone.
fn kill_registered(grace: Duration) -> usize {
    let Some(l) = live().take() else {
        return 0;
    };
    kill_chain(l.zerohop, &l.instances, grace)
}

fn kill_chain(zerohop: Proc, instances: &[Proc], grace: Duration) -> usize {
    // Its instances are its children until it is gone: keep collecting them while waiting
    // (it may still be starting some).
    let mut all: Vec<Proc> = instances.to_vec();
    let collect = |all: &mut Vec<Proc>| {
        for p in children(zerohop.pid).into_iter().filter_map(Proc::of) {
            if !all.contains(&p) {
                all.push(p);
            }
        }
    };
    if zerohop.alive() {
        collect(&mut all);
        let _ = kill(Pid::from_raw(zerohop.pid as i32), Signal::SIGTERM);
        let deadline = Instant::now() + grace;
        while zerohop.alive() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
            collect(&mut all);
        }
        if zerohop.alive() {
            collect(&mut all);
            sigkill(zerohop);
        }
    }
    // zerohop's reaper and the instances' parent-death signals end the rest; make sure.
    let group = || process_group(zerohop.pid);
    wait_until(ORPHAN_GRACE, || {
        !all.iter().any(|p| p.alive()) && group().is_empty()
    });
    let mut left = 0;
    for p in all.iter().copied().chain(group()) {
        if p.alive() {
            left += 1;
            sigkill(p);
        }
    }
    if left > 0 {
        let _ = killpg(Pid::from_raw(zerohop.pid as i32), Signal::SIGKILL);
    }
    left
}

/// On SIGINT or SIGTERM: stop the chain, then exit 130.
fn install_signal_handler() -> Result<()> {
    let (tx, rx) = mpsc::channel::<std::io::Result<()>>();
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            use tokio::signal::unix::{signal, SignalKind};
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = tx.send(Err(e));
                    return;
                }
            };
            rt.block_on(async move {
                let (mut int, mut term) = match (
                    signal(SignalKind::interrupt()),
                    signal(SignalKind::terminate()),
                ) {
                    (Ok(i), Ok(t)) => (i, t),
                    (Err(e), _) | (_, Err(e)) => {
                        let _ = tx.send(Err(e));
                        return;
                    }
                };
                let _ = tx.send(Ok(()));
                tokio::select! {
                    _ = int.recv() => {}
                    _ = term.recv() => {}
                }
                eprintln!("scale: interrupted; stopping the chain");
                kill_registered(Duration::from_secs(5));
                std::process::exit(130);
            });
        })
        .context("starting the signal thread")?;
    rx.recv()
        .context("signal thread ended")?
        .context("installing signal handlers")
}

/// A running `zerohop up`; stopped, with everything it started, on drop.
struct Chain {
    child: Child,
    me: Proc,
    instances: Vec<Proc>,
    log: PathBuf,
}

impl Chain {
    fn register(&self) {
        *live() = Some(Live {
            zerohop: self.me,
            instances: self.instances.clone(),
        });
    }

    /// SIGTERM, bounded wait for zerohop, then its instances and process group.
    fn stop(&mut self, timeout: Duration) -> Stop {
        let t = Instant::now();
        let _ = kill(Pid::from_raw(self.me.pid as i32), Signal::SIGTERM);
        let mut exit = None;
        wait_until(timeout, || {
            exit = self.child.try_wait().ok().flatten();
            exit.is_some()
        });
        let seconds = t.elapsed().as_secs_f64();
        let exit = match exit {
            Some(s) => s.to_string(),
            None => {
                let _ = self.child.kill();
                let _ = self.child.wait();
                format!("did not exit within {timeout:?} of SIGTERM; killed")
            }
        };
        let leftovers = kill_chain(self.me, &self.instances, ORPHAN_GRACE);
        *live() = None;
        Stop {
            seconds,
            exit,
            leftovers,
        }
    }

    /// The last lines of zerohop's stderr.
    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let tail = lines[lines.len().saturating_sub(6)..].join("\n    ");
        if tail.is_empty() {
            String::new()
        } else {
            format!(
                "\n  zerohop's stderr ({}) ends:\n    {tail}",
                self.log.display()
            )
        }
    }
}

impl Drop for Chain {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            kill_chain(self.me, &self.instances, Duration::from_secs(10));
        } else {
            kill_chain(self.me, &self.instances, Duration::ZERO);
        }
        let _ = self.child.wait();
        *live() = None;
    }
}

// ---------------------------------------------------------------------------------------
// One point.

/// Instances per function: `n` spread evenly over `f` (the first ones get one more).
fn spread(n: usize, f: usize) -> Vec<usize> {
    (0..f).map(|i| n / f + usize::from(i < n % f)).collect()
}

/// The chain spec: `f` pass functions in one route, `counts[i]` instances of function i.
fn spec(counts: &[usize], program: &Path) -> Result<String> {
    let program = program
        .to_str()
        .ok_or_else(|| anyhow!("{} is not UTF-8", program.display()))?;
    let mut s = String::from(
        "# Generated by zerohop-bench-scale.\nname: scale\ngateway_threads: 1\nfunctions:\n",
    );
    let names: Vec<String> = (1..=counts.len()).map(|i| format!("pass{i}")).collect();
    for (name, n) in names.iter().zip(counts) {
        // JSON strings are YAML double-quoted scalars: any path is quoted safely.
        let _ = writeln!(
            s,
            "  {name}: {{ command: [{}], instances: {n}, env: {{ {FUNCTION_ENV}: {name} }} }}",
            serde_json::to_string(program)?
        );
    }
    let _ = writeln!(
        s,
        "routes:\n  - http: POST {ZEROHOP_PATH}\n    sequence: [{}]",
        names.join(", ")
    );
    Ok(s)
}

/// Memory of the chain now.
fn memory(zerohop: u32, instances: &[Proc], shmem_before: u64, detail: usize) -> Memory {
    let page_tables = |pid: u32| Status::read(pid).unwrap_or_default().vm_pte_kib;
    let mut private = Vec::new();
    let mut pss = Vec::new();
    let mut rss = Vec::new();
    let mut pte = Vec::new();
    let mut fds = Vec::new();
    let mut resident_shmem = 0;
    let mut private_by_kind: BTreeMap<String, f64> = BTreeMap::new();
    let mut rss_by_kind: BTreeMap<String, f64> = BTreeMap::new();
    let mut maps_by_kind: BTreeMap<String, f64> = BTreeMap::new();
    let mut size_by_kind: BTreeMap<String, f64> = BTreeMap::new();
    let mut per_instance = Vec::new();
    for p in instances.iter().filter(|p| p.alive()) {
        let Some(rollup) = Rollup::read(p.pid) else {
            continue;
        };
        let exe = exe_path(p.pid);
        let kinds = by_kind(&smaps(p.pid).unwrap_or_default(), &exe);
        for (k, s) in &kinds {
            *private_by_kind.entry(k.clone()).or_default() += s.private_kib as f64;
            *rss_by_kind.entry(k.clone()).or_default() += s.rss_kib as f64;
            *maps_by_kind.entry(k.clone()).or_default() += s.mappings as f64;
            *size_by_kind.entry(k.clone()).or_default() += s.size_kib as f64;
        }
        private.push(rollup.private_kib);
        pss.push(rollup.pss_kib);
        rss.push(rollup.rss_kib);
        pte.push(page_tables(p.pid));
        fds.push(open_fds(p.pid) as u64);
        resident_shmem += rollup.pss_shmem_kib;
        per_instance.push((*p, exe));
    }
    let found = private.len();
    let mean = |v: &[u64]| v.iter().sum::<u64>() as f64 / v.len().max(1) as f64;
    for m in [
        &mut private_by_kind,
        &mut rss_by_kind,
        &mut maps_by_kind,
        &mut size_by_kind,
    ] {
        for v in m.values_mut() {
            *v /= found.max(1) as f64;
        }
    }

    // The agent, and the chain's shared memory through it.
    let agent_exe = exe_path(zerohop);
    let agent_maps = smaps(zerohop).unwrap_or_default();
    let agent_kinds = by_kind(&agent_maps, &agent_exe);
    let agent_rollup = Rollup::read(zerohop).unwrap_or_default();
    resident_shmem += agent_rollup.pss_shmem_kib;
    let agent_status = Status::read(zerohop).unwrap_or_default();
    let memfds = Memfds::of(zerohop);
    let mut shared = Shared {
        memfd_fds: memfds.fds,
        resident_shmem_kib: resident_shmem,
        ..Shared::default()
    };
    for (name, bytes) in &memfds.regions {
        let kib = bytes.div_ceil(1024);
        if name.starts_with("zerohop-pool:") {
            shared.pool_memfds += 1;
            shared.pool_kib += kib;
        } else if name.starts_with("zerohop-outbox:") {
            shared.outbox_memfds += 1;
            shared.outbox_kib += kib;
            shared.outbox_kib_max = shared.outbox_kib_max.max(kib);
        } else if name.starts_with("zerohop-inbox:") {
            shared.inbox_memfds += 1;
            shared.inbox_kib += kib;
        } else {
            shared.other_memfds += 1;
            shared.other_kib += kib;
        }
    }
    shared.ring_memfds = shared.outbox_memfds + shared.inbox_memfds;
    shared.ring_kib = shared.outbox_kib + shared.inbox_kib;
    let kind_rss = |k: &str| agent_kinds.get(k).map_or(0, |s| s.rss_kib);
    shared.pool_resident_kib = kind_rss("pool");
    shared.agent_ring_rss_kib = kind_rss("outbox-own")
        + kind_rss("outbox-peer")
        + kind_rss("inbox-own")
        + kind_rss("inbox-peer");
    shared.ring_resident_kib = resident_shmem.saturating_sub(shared.pool_resident_kib);
    shared.meminfo_shmem_delta_kib = meminfo_kib("Shmem") as i64 - shmem_before as i64;

    // Samples: an instance of the first, the middle and the last function.
    let mut samples = Vec::new();
    if detail > 0 && !per_instance.is_empty() {
        let mut named: Vec<(String, Proc, String)> = per_instance
            .into_iter()
            .map(|(p, exe)| (environ_var(p.pid, FUNCTION_ENV).unwrap_or_default(), p, exe))
            .collect();
        let number = |f: &str| {
            f.trim_start_matches("pass")
                .parse::<usize>()
                .unwrap_or(usize::MAX)
        };
        named.sort_by_key(|(f, p, _)| (number(f), p.pid));
        let last = named.len() - 1;
        let mut picks = vec![0, last / 2, last];
        picks.dedup();
        picks.truncate(detail);
        for i in picks {
            let (function, p, exe) = &named[i];
            let Some(maps) = smaps(p.pid) else { continue };
            let rollup = Rollup::read(p.pid).unwrap_or_default();
            let mut top: Vec<&Mapping> = maps.iter().filter(|m| m.private > 0).collect();
            top.sort_by_key(|m| std::cmp::Reverse(m.private));
            samples.push(Sample {
                pid: p.pid,
                function: function.clone(),
                private_kib: rollup.private_kib,
                rss_kib: rollup.rss_kib,
                page_tables_kib: page_tables(p.pid),
                by_kind: by_kind(&maps, exe),
                top_private: top
                    .into_iter()
                    .take(10)
                    .map(|m| TopMapping {
                        name: if m.name.is_empty() {
                            "[anon]".into()
                        } else {
                            m.name.clone()
                        },
                        perms: m.perms.clone(),
                        size_kib: m.size,
                        rss_kib: m.rss,
                        private_kib: m.private,
                    })
                    .collect(),
            });
        }
    }

    Memory {
        instances_found: found,
        private_kib_mean: mean(&private),
        private_kib_max: private.iter().copied().max().unwrap_or(0),
        pss_kib_mean: mean(&pss),
        rss_kib_mean: mean(&rss),
        rss_kib_max: rss.iter().copied().max().unwrap_or(0),
        page_tables_kib_mean: mean(&pte),
        private_by_kind_kib_mean: private_by_kind,
        rss_by_kind_kib_mean: rss_by_kind,
        mappings_by_kind_mean: maps_by_kind,
        mapped_by_kind_kib_mean: size_by_kind,
        fds_mean: mean(&fds),
        agent: Agent {
            pid: zerohop,
            rss_kib: agent_rollup.rss_kib,
            private_kib: agent_rollup.private_kib,
            pss_kib: agent_rollup.pss_kib,
            page_tables_kib: agent_status.vm_pte_kib,
            fds: open_fds(zerohop),
            mappings: agent_maps.len(),
            threads: agent_status.threads,
            by_kind: agent_kinds,
        },
        shared,
        samples,
    }
}

/// CPU ticks of the agent and of every instance now.
fn ticks(zerohop: Proc, instances: &[Proc]) -> (TickSample, TickSample) {
    (TickSample::take(&[zerohop]), TickSample::take(instances))
}

fn idle(zerohop: Proc, instances: &[Proc], seconds: f64) -> Idle {
    let (a0, i0) = ticks(zerohop, instances);
    std::thread::sleep(Duration::from_secs_f64(seconds));
    let (a1, i1) = ticks(zerohop, instances);
    let per = i1.used_since(&i0);
    let agent = ticks_to_seconds(a1.total_since(&a0));
    let inst = ticks_to_seconds(per.iter().sum());
    Idle {
        seconds,
        cpu_s: agent + inst,
        agent_cpu_s: agent,
        instances_cpu_s: inst,
        busy_instances: per.iter().filter(|&&t| t > 0).count(),
    }
}

/// Runs one instance count; fills `point` as far as it gets.
fn run_point(args: &Args, bin_dir: &Path, root: &Path, point: &mut Point) -> Result<()> {
    let n = point.instances;
    let f = point.functions;
    if n == 0 {
        bail!("an instance count must be at least 1");
    }
    if point
        .per_function
        .iter()
        .any(|&c| c > MAX_INSTANCES_PER_FUNCTION)
    {
        bail!(
            "{n} instances over {f} functions is more than the {MAX_INSTANCES_PER_FUNCTION} \
             instances a function may have; raise --max-functions"
        );
    }
    let timeout = Duration::from_secs_f64(args.timeout);
    let dir = root.join(format!("n{n}"));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let spec_path = dir.join("chain.yaml");
    std::fs::write(
        &spec_path,
        spec(&point.per_function, &bin_dir.join("zerohop-bench-pass"))?,
    )
    .with_context(|| format!("writing {}", spec_path.display()))?;
    let log = dir.join("zerohop.log");
    let stderr =
        std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;

    let shmem_before = meminfo_kib("Shmem");
    let started = Instant::now();
    let mut child = Command::new(bin_dir.join("zerohop"))
        .arg("up")
        .arg(&spec_path)
        .args(["--listen", "127.0.0.1:0"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(stderr)
        .process_group(0)
        .spawn()
        .context("starting zerohop")?;
    let me = Proc::of(child.id()).unwrap_or(Proc {
        pid: child.id(),
        start: 0,
    });
    let stdout = child.stdout.take().context("zerohop's stdout")?;
    let mut chain = Chain {
        child,
        me,
        instances: Vec::new(),
        log,
    };
    chain.register();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(stdout).lines();
        if let Some(Ok(line)) = lines.next() {
            let _ = tx.send((Instant::now(), line));
        }
        // Keep draining so zerohop never blocks on a full pipe.
        for _ in lines {}
    });

    // Ready line, bounded, watching for an early exit.
    let deadline = started + timeout;
    let (ready_at, line) = loop {
        match rx.recv_timeout(Duration::from_millis(50)) {
            Ok(got) => break got,
            Err(RecvTimeoutError::Disconnected) | Err(RecvTimeoutError::Timeout) => {
                if let Ok(Some(status)) = chain.child.try_wait() {
                    bail!(
                        "zerohop exited ({status}) before it was ready{}",
                        chain.log_tail()
                    );
                }
                if Instant::now() >= deadline {
                    let found = instances(me.pid).len();
                    bail!(
                        "zerohop printed no ready line within {timeout:?} ({found} instance \
                         processes were running){}",
                        chain.log_tail()
                    );
                }
            }
        }
    };
    let ready_s = ready_at.duration_since(started).as_secs_f64();
    point.ready_s = Some(ready_s);
    let base = line
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .ok_or_else(|| anyhow!("no URL in zerohop's ready line {line:?}"))?;
    let url = format!("{base}{ZEROHOP_PATH}");
    let agent_cpu = me.cpu_split().unwrap_or_default();

    // The instances: the children of the zerohop process but its spawner.
    let mut pids = instances(me.pid);
    if pids.len() < n {
        wait_until(Duration::from_secs(2), || {
            pids = instances(me.pid);
            pids.len() >= n
        });
    }
    pids.sort_unstable();
    chain.instances = pids.iter().filter_map(|&p| Proc::of(p)).collect();
    chain.register();
    let inst_cpu = chain
        .instances
        .iter()
        .filter_map(|p| p.cpu_split())
        .fold((0, 0), |(u, s), (a, b)| (u + a, s + b));
    let starts: Vec<u64> = chain.instances.iter().map(|p| p.start).collect();
    let rel = |t: u64| ticks_to_seconds(t.saturating_sub(me.start));
    let first = starts.iter().copied().min().map_or(0.0, rel);
    let last = starts.iter().copied().max().map_or(0.0, rel);
    point.startup = Some(Startup {
        first_instance_s: first,
        last_instance_s: last,
        ready_after_last_spawn_s: (ready_s - last).max(0.0),
        agent_cpu_s: ticks_to_seconds(agent_cpu.0 + agent_cpu.1),
        agent_sys_s: ticks_to_seconds(agent_cpu.1),
        instances_cpu_s: ticks_to_seconds(inst_cpu.0 + inst_cpu.1),
        instances_sys_s: ticks_to_seconds(inst_cpu.1),
    });
    eprintln!(
        "scale: N={n}: ready in {ready_s:.2} s (instances started {first:.2}..{last:.2} s after \
         zerohop; {} instance processes)",
        chain.instances.len()
    );
    if chain.instances.len() != n {
        bail!(
            "zerohop (pid {}) has {} child processes, expected {n} instances",
            me.pid,
            chain.instances.len()
        );
    }

    let mem = memory(me.pid, &chain.instances, shmem_before, args.detail);
    eprintln!(
        "scale: N={n}: private {:.0} KiB/instance (max {}), Pss {:.0}, Rss {:.0}; agent Rss {} \
         KiB; rings {} memfds {:.1} MiB, {:.1} MiB resident; pool {:.1} MiB",
        mem.private_kib_mean,
        mem.private_kib_max,
        mem.pss_kib_mean,
        mem.rss_kib_mean,
        mem.agent.rss_kib,
        mem.shared.ring_memfds,
        mem.shared.ring_kib as f64 / 1024.0,
        mem.shared.ring_resident_kib as f64 / 1024.0,
        mem.shared.pool_kib as f64 / 1024.0,
    );
    point.memory_at_ready = Some(mem);

    let idle_before = idle(me, &chain.instances, args.idle_seconds);
    eprintln!(
        "scale: N={n}: idle {:.1} s: {:.2} CPU s ({} instances busy)",
        idle_before.seconds, idle_before.cpu_s, idle_before.busy_instances
    );
    point.idle_before_load = Some(idle_before);

    let (a0, i0) = ticks(me, &chain.instances);
    let result = loadgen::run(
        &url,
        &passes(f),
        &BodyMix::Fixed(100),
        &Load::Closed {
            concurrency: args.concurrency,
        },
        Duration::from_millis(500),
        Duration::from_secs_f64(args.load_seconds),
    )
    .context("load generator")?;
    let (a1, i1) = ticks(me, &chain.instances);
    let load = LoadResult {
        concurrency: args.concurrency,
        seconds: result.seconds,
        rps: result.rps,
        requests: result.requests,
        errors: result.errors,
        wrong: result.wrong,
        p50_us: result.latency.p50_us,
        p99_us: result.latency.p99_us,
        first_error: result.first_error.clone(),
        agent_cpu_s: ticks_to_seconds(a1.total_since(&a0)),
        instances_cpu_s: ticks_to_seconds(i1.total_since(&i0)),
    };
    eprintln!(
        "scale: N={n}: {:.0} requests/s at c={} (p50 {:.0} us, p99 {:.0} us), {} errors, {} wrong",
        load.rps, load.concurrency, load.p50_us, load.p99_us, load.errors, load.wrong
    );
    let load_problem = if load.errors > 0 || load.wrong > 0 || load.requests == 0 {
        Some(format!(
            "load: {} correct, {} errors, {} wrong answers (first: {})",
            load.requests,
            load.errors,
            load.wrong,
            load.first_error.as_deref().unwrap_or("none")
        ))
    } else {
        None
    };
    point.load = Some(load);

    std::thread::sleep(Duration::from_millis(500));
    let idle_after = idle(me, &chain.instances, args.idle_seconds);
    eprintln!(
        "scale: N={n}: idle after load {:.1} s: {:.2} CPU s ({} instances busy)",
        idle_after.seconds, idle_after.cpu_s, idle_after.busy_instances
    );
    point.idle_after_load = Some(idle_after);
    let mem = memory(me.pid, &chain.instances, shmem_before, args.detail);
    eprintln!(
        "scale: N={n}: after load: private {:.0} KiB/instance (max {}), rings {:.1} MiB resident",
        mem.private_kib_mean,
        mem.private_kib_max,
        mem.shared.ring_resident_kib as f64 / 1024.0
    );
    point.memory_after_load = Some(mem);

    let stop = chain.stop(timeout);
    eprintln!(
        "scale: N={n}: stopped in {:.2} s ({}), {} processes left behind",
        stop.seconds, stop.exit, stop.leftovers
    );
    let stop_problem = if !stop.exit.contains("exit status: 0") || stop.leftovers > 0 {
        Some(format!(
            "stop: zerohop {}, {} processes left behind (killed){}",
            stop.exit,
            stop.leftovers,
            chain.log_tail()
        ))
    } else {
        None
    };
    point.stop = Some(stop);
    drop(chain);
    match (load_problem, stop_problem) {
        (None, None) => {
            if !args.keep {
                let _ = std::fs::remove_dir_all(&dir);
            }
            Ok(())
        }
        (a, b) => Err(anyhow!(
            "{}",
            [a, b].into_iter().flatten().collect::<Vec<_>>().join("; ")
        )),
    }
}

// ---------------------------------------------------------------------------------------
// Markdown.

fn markdown(report: &Report) -> String {
    let mut s = String::new();
    let m = &report.machine;
    let _ = writeln!(
        s,
        "Machine: {} CPUs ({}), {:.1} GiB, kernel {}. Chain: F = min(16, N) pass functions, one \
         route, gateway_threads 1, default pool. Load: c={}, {} B bodies, {} s.\n",
        m.cores,
        m.cpu_model,
        m.mem_kib as f64 / (1 << 20) as f64,
        m.kernel,
        report.settings.concurrency,
        report.settings.body_bytes,
        report.settings.load_seconds
    );
    let mut table = Table::new(&[
        "N",
        "F",
        "ready s",
        "last spawn s",
        "private KiB/inst mean (max) ready",
        "after load",
        "Pss KiB/inst",
        "Rss KiB/inst",
        "page tables KiB/inst",
        "ring regions mapped/inst",
        "agent Rss / private MiB",
        "ring memfds: count, MiB",
        "ring resident MiB",
        "pool MiB (resident)",
        "idle CPU s before / after load",
        "RPS",
        "errors",
        "stop s",
        "ok",
    ]);
    let mib = |k: u64| k as f64 / 1024.0;
    for p in &report.points {
        let opt = |v: Option<String>| v.unwrap_or_else(|| "-".into());
        let r = p.memory_at_ready.as_ref();
        let l = p.memory_after_load.as_ref();
        let ring_maps = |m: &Memory| {
            ["outbox-own", "outbox-peer", "inbox-own", "inbox-peer"]
                .iter()
                .map(|k| m.mappings_by_kind_mean.get(*k).copied().unwrap_or(0.0))
                .sum::<f64>()
        };
        let idle = |i: &Option<Idle>| opt(i.as_ref().map(|i| format!("{:.2}", i.cpu_s)));
        table.row(&[
            p.instances.to_string(),
            p.functions.to_string(),
            opt(p.ready_s.map(|v| format!("{v:.2}"))),
            opt(p
                .startup
                .as_ref()
                .map(|v| format!("{:.2}", v.last_instance_s))),
            opt(r.map(|m| format!("{:.0} ({})", m.private_kib_mean, m.private_kib_max))),
            opt(l.map(|m| format!("{:.0} ({})", m.private_kib_mean, m.private_kib_max))),
            opt(r.map(|m| format!("{:.0}", m.pss_kib_mean))),
            opt(r.map(|m| format!("{:.0}", m.rss_kib_mean))),
            opt(r.map(|m| format!("{:.0}", m.page_tables_kib_mean))),
            opt(r.map(|m| format!("{:.1}", ring_maps(m)))),
            opt(l.map(|m| {
                format!(
                    "{:.1} / {:.1}",
                    mib(m.agent.rss_kib),
                    mib(m.agent.private_kib)
                )
            })),
            opt(l.map(|m| format!("{}, {:.1}", m.shared.ring_memfds, mib(m.shared.ring_kib)))),
            opt(l.map(|m| format!("{:.1}", mib(m.shared.ring_resident_kib)))),
            opt(l.map(|m| {
                format!(
                    "{:.0} ({:.1})",
                    mib(m.shared.pool_kib),
                    mib(m.shared.pool_resident_kib)
                )
            })),
            format!(
                "{} / {}",
                idle(&p.idle_before_load),
                idle(&p.idle_after_load)
            ),
            opt(p.load.as_ref().map(|v| format!("{:.0}", v.rps))),
            opt(p.load.as_ref().map(|v| format!("{}", v.errors + v.wrong))),
            opt(p.stop.as_ref().map(|v| format!("{:.2}", v.seconds))),
            (if p.ok { "yes" } else { "**no**" }).to_owned(),
        ]);
    }
    let _ = write!(s, "{table}");
    for p in report.points.iter().filter(|p| !p.ok) {
        let _ = writeln!(
            s,
            "\nN={} failed: {}",
            p.instances,
            p.error.as_deref().unwrap_or("?")
        );
    }
    s
}

// ---------------------------------------------------------------------------------------

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("scale: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn run(args: &Args) -> Result<bool> {
    if args.instances.is_empty() {
        bail!("--instances needs at least one count");
    }
    if args.max_functions == 0 || args.max_functions > 254 {
        bail!("--max-functions must be 1..=254");
    }
    if !(args.timeout > 0.0 && args.idle_seconds >= 0.0 && args.load_seconds > 0.0) {
        bail!("--timeout and --load-seconds must be positive, --idle-seconds not negative");
    }
    let bin_dir = zerohop_bench::bin_dir(args.bin_dir.as_deref())?;
    let bin_dir = bin_dir
        .canonicalize()
        .with_context(|| format!("binary folder {}", bin_dir.display()))?;
    for b in ["zerohop", "zerohop-bench-pass"] {
        if !bin_dir.join(b).is_file() {
            bail!(
                "{} is missing; build the binaries first: `cargo build --release --workspace --bins`",
                bin_dir.join(b).display()
            );
        }
    }
    install_signal_handler()?;
    let root = tempfile::Builder::new()
        .prefix("zerohop-scale-")
        .tempdir()
        .context("creating the scratch folder")?;

    let mut points = Vec::new();
    for &n in &args.instances {
        let f = args.max_functions.min(n).max(1);
        let mut point = Point {
            instances: n,
            functions: f,
            per_function: spread(n, f),
            ..Point::default()
        };
        eprintln!(
            "scale: N={n}: {f} functions x {}..{} instances",
            point.per_function.iter().min().unwrap_or(&0),
            point.per_function.iter().max().unwrap_or(&0)
        );
        match run_point(args, &bin_dir, root.path(), &mut point) {
            Ok(()) => point.ok = true,
            Err(e) => {
                let e = format!("{e:#}");
                eprintln!("scale: N={n}: FAILED: {e}");
                point.error = Some(e);
            }
        }
        // Whatever happened, nothing of this point may still run.
        let left = kill_registered(Duration::from_secs(5));
        if left > 0 {
            eprintln!("scale: N={n}: killed {left} leftover processes");
        }
        points.push(point);
    }
    let ok = points.iter().all(|p| p.ok);
    if args.keep || !ok {
        eprintln!("scale: specs and logs kept in {}", root.keep().display());
    }
    let report = Report {
        machine: Machine::read(),
        settings: Settings {
            idle_seconds: args.idle_seconds,
            load_seconds: args.load_seconds,
            concurrency: args.concurrency,
            body_bytes: 100,
            gateway_threads: 1,
            pool: "default (1024 slots x 64 KiB)",
        },
        points,
        ok,
    };
    report::print(&report, args.markdown.then(|| markdown(&report)).as_deref())?;
    Ok(ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spreads_evenly() {
        assert_eq!(spread(10, 10), vec![1; 10]);
        let s = spread(1000, 16);
        assert_eq!(s.iter().sum::<usize>(), 1000);
        assert_eq!((s[0], s[15]), (63, 62));
    }

    #[test]
    fn spec_lists_functions_and_route() {
        let s = spec(&[2, 1], Path::new("/opt/zerohop-bench-pass")).unwrap();
        assert!(s.contains("gateway_threads: 1"));
        assert!(s.contains(
            "  pass1: { command: [\"/opt/zerohop-bench-pass\"], instances: 2, env: { \
             BENCH_FUNCTION: pass1 } }"
        ));
        assert!(s.contains("sequence: [pass1, pass2]"));
        assert!(s.contains("POST /bench"));
    }
}
