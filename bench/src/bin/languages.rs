//! `zerohop-bench-languages`: what a hop costs when the function is written in Rust, C, Go,
//! Python or Node.js, all over the same runtime (`crates/zerohop-runtime`, reached through
//! each language's SDK).
//!
//! For each language the real `zerohop up` (one gateway thread) runs one chain of `--hops`
//! (K, default 5) pass-through functions of that language, `p1` .. `pK`, with two routes of
//! the same shape: `POST /one` through `[p1]` and `POST /chain` through `[p1, .., pK]`. Every
//! function is the same program (`bench/languages/`): it reads the first byte of the body
//! where the gateway wrote it (no copy) and sends the body on unchanged, so what differs
//! between languages is the SDK's crossing into the handler and back, and the language's
//! own runtime. Measured, per language:
//!
//! * **per-hop cost**: closed loop at concurrency 1 (the bench's load generator, hyper
//!   keep-alive, 100-byte bodies, every answer checked) on `/one` and `/chain`; per-hop =
//!   (p50(K) - p50(1)) / (K - 1) from the medians over `--rounds` rounds, and the same with
//!   the means; RPS; p99; CPU of the function instances per request and per hop (`utime +
//!   stime` of `/proc/PID/stat`), and of the `zerohop up` process (gateway and agent);
//! * **idle CPU**: with every chain up and no traffic for `--idle-seconds`, CPU of the K
//!   instances (clock ticks, and nanoseconds from `/proc/PID/task/TID/schedstat`) and how
//!   often their threads were switched in;
//! * **idle RSS**: `VmRSS` of `p1` (which served both routes) from `/proc/PID/status`, `Pss`
//!   and private memory from `/proc/PID/smaps_rollup`, and its threads.
//!
//! Every language's chain is up at once and the languages take turns within each round (each
//! round starting with another one, the routes' order alternating), so that a disturbance of
//! the machine falls on all of them alike; the CPU that other processes and the host (steal)
//! took while the points ran is reported beside the numbers, and a run where they took more
//! than a tenth of a core is called disturbed. As in `zerohop-bench`, on 2 or more CPUs the
//! load generator runs on CPU 0 and every chain on CPU 1 (`--no-pin` turns that off): a hop
//! is then a wake-up on the same core, and the numbers do not depend on where the scheduler
//! put each process (unpinned, the same point ran at 32 us in one round and 70 us in the
//! next). Rust is the reference: per-hop cost, CPU per hop and RSS are also given as a ratio
//! to Rust's from the same run. Trust ratios within one run, not absolute numbers.
//!
//! The binary builds what it needs (C with `cc` and `pkg-config` against the installed C SDK,
//! Go with `go build`, into `target/bench-languages/`) and checks the rest; a language whose
//! toolchain or SDK is missing is reported as "not run" with the command that provides it,
//! and the others run. `--quick` runs shorter points; `--out DIR` (default `results`)
//! receives `languages.md` and `languages.json`; the last line of stdout is the summary.
//! Exits 1 when a language failed or a run had wrong or failed answers (the report is still
//! written), 2 when it could not run at all.

#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::mpsc::RecvTimeoutError;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, ensure, Context, Result};
use clap::{Parser, ValueEnum};
use serde::Serialize;
use zerohop_bench::loadgen::{self, BodyMix, Load, RunResult};
use zerohop_bench::percentile::median;
use zerohop_bench::procstat::disturbance::{Disturbance, MachineTicks};
use zerohop_bench::procstat::memory::{Rollup, Status as ProcStatus};
use zerohop_bench::procstat::{
    online_cpus, pin_current_thread, ticks_per_second, ticks_to_seconds, ProcessId, SchedStat,
    TickSample,
};
use zerohop_bench::report::{self, Machine, Table};
use zerohop_bench::systems::{zerohop_functions, FUNCTION_ENV};
use zerohop_bench::Step;

/// Bound on the chain's start (Python and Node instances import their runtime first) and on
/// finding its instances.
const START_WAIT: Duration = Duration::from_secs(60);
/// Bound on one build command (a first `go build` compiles the runtime's cgo parts).
const BUILD_WAIT: Duration = Duration::from_secs(600);
/// Bound on a toolchain's quick check (`python3 -c "import zerohop"`).
const CHECK_WAIT: Duration = Duration::from_secs(30);
/// Quiet time before the idle window: the instances' spin-before-sleep and the last
/// connection's close are over by then.
const SETTLE: Duration = Duration::from_millis(500);
/// Cores used by others (processes outside the benchmark, steal) past which the report says
/// the run was disturbed: on a quiet machine both stay near zero.
const DISTURBED: f64 = 0.1;
/// Connections of the load generator: one, so a point's latency is a request's path alone.
const CONCURRENCY: usize = 1;
/// Gateway threads of every chain.
const GATEWAY_THREADS: usize = 1;
/// The interpreters instances run with: instances run as the chain's own uid, which may not
/// be able to run an interpreter under `/root` (pyenv, nvm).
const PYTHON: &str = "/usr/bin/python3";
const NODE: &str = "/usr/bin/node";

#[derive(Parser, Debug)]
#[command(
    name = "zerohop-bench-languages",
    about = "Per-hop cost, idle CPU and idle memory of pass-through functions written in \
             Rust, C, Go, Python and Node.js, on the same runtime"
)]
struct Args {
    /// Shorter points (2 s, 2 rounds, 2 s idle) instead of 5 s, 3 rounds, 5 s idle.
    #[arg(long)]
    quick: bool,
    /// Where `languages.md` and `languages.json` go.
    #[arg(long, default_value = "results")]
    out: PathBuf,
    /// Languages to measure, comma separated (Rust, the reference, should be among them).
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = Language::ALL)]
    languages: Vec<Language>,
    /// Functions in the long chain (K); the short one has 1.
    #[arg(long, default_value_t = 5)]
    hops: usize,
    /// Measured seconds per point (overrides --quick's and the default).
    #[arg(long)]
    seconds: Option<f64>,
    /// Rounds of the two points per language, alternating (overrides --quick's and the
    /// default).
    #[arg(long)]
    rounds: Option<usize>,
    /// Seconds of the idle window (overrides --quick's and the default).
    #[arg(long)]
    idle_seconds: Option<f64>,
    /// Request body, bytes.
    #[arg(long, default_value_t = 100)]
    body: usize,
    /// Folder of the built binaries (`zerohop`, `zerohop-bench-lang-pass`); default: this
    /// binary's folder. Its parent holds the installed SDKs (`c-sdk`, `python-sdk`) and
    /// receives `bench-languages/`.
    #[arg(long)]
    bin_dir: Option<PathBuf>,
    /// The zerohop checkout (`bench/languages`, `sdk/go`, `sdk/node`); default: the one this
    /// binary was built from.
    #[arg(long)]
    root: Option<PathBuf>,
    /// Do not pin the load generator (CPU 0) and the chain (CPU 1) to separate cores.
    #[arg(long)]
    no_pin: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, ValueEnum)]
#[serde(rename_all = "lowercase")]
enum Language {
    Rust,
    C,
    Go,
    Python,
    Node,
}

impl Language {
    const ALL: [Language; 5] = [
        Language::Rust,
        Language::C,
        Language::Go,
        Language::Python,
        Language::Node,
    ];

    /// As on the command line and in the JSON.
    fn name(self) -> &'static str {
        match self {
            Language::Rust => "rust",
            Language::C => "c",
            Language::Go => "go",
            Language::Python => "python",
            Language::Node => "node",
        }
    }

    /// As in the report's tables.
    fn title(self) -> &'static str {
        match self {
            Language::Rust => "Rust",
            Language::C => "C",
            Language::Go => "Go",
            Language::Python => "Python",
            Language::Node => "Node.js",
        }
    }
}

// ---------------------------------------------------------------------------------------
// Output.

/// Settings of the run, as used.
#[derive(Serialize, Debug)]
struct Settings {
    hops: usize,
    seconds_per_point: f64,
    rounds: usize,
    idle_seconds: f64,
    body_bytes: usize,
    concurrency: usize,
    gateway_threads: usize,
    warmup_seconds_per_route: f64,
    /// What was pinned where.
    pinning: String,
}

/// One round of one route.
#[derive(Serialize, Debug, Clone, Copy)]
struct Round {
    p50_us: f64,
    mean_us: f64,
    p99_us: f64,
    rps: f64,
    requests: u64,
    /// CPU seconds of the route's function instances over the round.
    fn_cpu_s: f64,
    /// CPU seconds of the `zerohop up` process (gateway thread and agent) over the round.
    zerohop_cpu_s: f64,
}

/// One route of one language over every round.
#[derive(Serialize, Debug)]
struct Point {
    /// Functions the route runs through.
    functions: usize,
    /// Medians over the rounds of each round's p50, mean and p99.
    p50_us: f64,
    mean_us: f64,
    p99_us: f64,
    /// Correct answers per measured second, all rounds.
    rps: f64,
    requests: u64,
    errors: u64,
    wrong: u64,
    first_error: Option<String>,
    /// CPU of the route's function instances (all of them together) per request.
    fn_cpu_us_per_request: f64,
    /// CPU of the `zerohop up` process per request.
    zerohop_cpu_us_per_request: f64,
    rounds: Vec<Round>,
}

/// The K instances with no traffic.
#[derive(Serialize, Debug)]
struct Idle {
    seconds: f64,
    instances: usize,
    /// CPU of all K instances from `/proc/PID/stat` (clock ticks), milliseconds per second.
    cpu_ms_per_s: f64,
    /// The same from the threads' `schedstat` (nanoseconds), microseconds per second.
    sched_cpu_us_per_s: f64,
    /// Times any of their threads was switched in, per second.
    wakeups_per_s: f64,
}

/// What an [`Idle`] is the difference of: the K instances' counters at one moment.
struct IdleCounters {
    /// CPU clock ticks of each (`/proc/PID/stat`).
    ticks: TickSample,
    /// On-CPU nanoseconds and switches-in of their threads together (`schedstat`).
    sched: SchedStat,
}

impl Idle {
    /// The idle window of `instances` instances from the counters at its ends.
    fn between(
        before: &IdleCounters,
        after: &IdleCounters,
        seconds: f64,
        instances: usize,
    ) -> Self {
        let sched = after.sched.since(before.sched);
        Self {
            seconds,
            instances,
            cpu_ms_per_s: ticks_to_seconds(after.ticks.total_since(&before.ticks)) * 1e3 / seconds,
            sched_cpu_us_per_s: sched.run_ns as f64 / 1e3 / seconds,
            wakeups_per_s: sched.switches as f64 / seconds,
        }
    }
}

/// Memory of `p1` after the load and the idle window.
#[derive(Serialize, Debug)]
struct Memory {
    pid: u32,
    vm_rss_kib: u64,
    rss_anon_kib: u64,
    rss_file_kib: u64,
    /// Of `VmRSS`, the chain's shared memory (pool, rings) this instance touched.
    rss_shmem_kib: u64,
    /// From `smaps_rollup`, when readable.
    pss_kib: Option<u64>,
    private_kib: Option<u64>,
    threads: u64,
}

/// What one language measured.
#[derive(Serialize, Debug)]
struct Measured {
    one: Point,
    chain: Point,
    /// (p50(K) - p50(1)) / (K - 1), from the medians over the rounds.
    per_hop_p50_us: f64,
    /// The same with the means.
    per_hop_mean_us: f64,
    /// The same for each round (paired: the two points of one round).
    per_hop_p50_rounds_us: Vec<f64>,
    /// CPU of the K instances per request of `/chain`, divided by K.
    fn_cpu_us_per_hop: f64,
    idle: Idle,
    memory: Memory,
}

/// A language over Rust, from the same run.
#[derive(Serialize, Debug, Default)]
struct Ratios {
    per_hop_p50: Option<f64>,
    per_hop_mean: Option<f64>,
    fn_cpu_per_hop: Option<f64>,
    idle_rss: Option<f64>,
}

#[derive(Serialize, Debug, PartialEq, Eq, Clone, Copy)]
#[serde(rename_all = "snake_case")]
enum Status {
    /// Measured (see `errors` for wrong or failed answers).
    Measured,
    /// Its toolchain or SDK is missing; `reason` says which and what provides it.
    NotRun,
    /// It should have run and did not; `reason` says why.
    Failed,
}

/// How a language's function runs.
#[derive(Serialize, Debug, Clone)]
struct Function {
    /// The spec's `command`.
    command: Vec<String>,
    /// Extra environment of the spec (beyond the function's name).
    env: BTreeMap<String, String>,
    /// Source and how it was built.
    built: String,
}

#[derive(Serialize, Debug)]
struct Row {
    language: Language,
    status: Status,
    reason: Option<String>,
    function: Option<Function>,
    result: Option<Measured>,
    ratio_to_rust: Ratios,
    /// Wrong or failed answers, instances that restarted.
    errors: Vec<String>,
}

impl Row {
    /// `language`'s row before it is measured: its function when it could be made runnable
    /// (status `failed` until measured), else why not.
    fn prepared(language: Language, paths: &Paths) -> Self {
        let mut row = Row {
            language,
            status: Status::Failed,
            reason: None,
            function: None,
            result: None,
            ratio_to_rust: Ratios::default(),
            errors: Vec::new(),
        };
        let name = language.name();
        match prepare(language, paths) {
            Ok(f) => row.function = Some(f),
            Err(Skip::NotRun(why)) => {
                eprintln!("zerohop-bench-languages: {name}: not run: {why}");
                row.status = Status::NotRun;
                row.reason = Some(why);
            }
            Err(Skip::Failed(e)) => {
                eprintln!("zerohop-bench-languages: {name}: failed: {e:#}");
                row.reason = Some(format!("{e:#}"));
            }
        }
        row
    }
}

#[derive(Serialize, Debug)]
struct Report {
    machine: Machine,
    /// The load averages when the run began (a busy machine lengthens everything).
    loadavg_before: String,
    settings: Settings,
    reference: Language,
    languages: Vec<Row>,
    /// What else ran on the machine during the points.
    disturbance: Disturbance,
    ok: bool,
}

// ---------------------------------------------------------------------------------------
// Building each language's function.

/// Where things are.
struct Paths {
    /// The built binaries (`target/release`).
    bin: PathBuf,
    /// The target folder (`target`): installed SDKs.
    target: PathBuf,
    /// The checkout.
    root: PathBuf,
    /// Built functions and the Node module folder (`target/bench-languages`).
    work: PathBuf,
    /// Build logs and chain specs, removed at the end.
    scratch: PathBuf,
}

impl Paths {
    fn sources(&self) -> PathBuf {
        self.root.join("bench/languages")
    }

    fn pkg_config_path(&self) -> PathBuf {
        self.target.join("c-sdk/lib/pkgconfig")
    }
}

/// Why a language cannot be measured.
enum Skip {
    /// A toolchain or SDK is missing: reported, not an error.
    NotRun(String),
    /// Everything needed is there and it still failed.
    Failed(anyhow::Error),
}

impl From<anyhow::Error> for Skip {
    fn from(e: anyhow::Error) -> Self {
        Skip::Failed(e)
    }
}

fn not_run<T>(why: impl Into<String>) -> Result<T, Skip> {
    Err(Skip::NotRun(why.into()))
}

/// `name` on `PATH`.
fn on_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    })
}

/// Runs `cmd` (in a process group of its own, output into files of `scratch`) within
/// `limit`; its stdout, or an error with the tail of its stderr. At the limit the whole
/// group is killed (a build's compilers with it).
fn run_bounded(cmd: &mut Command, what: &str, scratch: &Path, limit: Duration) -> Result<String> {
    let tag = what.replace(|c: char| !c.is_ascii_alphanumeric(), "-");
    let (out_file, err_file) = (
        scratch.join(format!("{tag}.out")),
        scratch.join(format!("{tag}.err")),
    );
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_file)?)
        .stderr(std::fs::File::create(&err_file)?)
        .process_group(0)
        .spawn()
        .with_context(|| format!("starting {what}"))?;
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if Instant::now() >= deadline {
            // Its own group (process_group(0) above): the pgid is the child's pid.
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(child.id() as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
            let _ = child.wait();
            bail!("{what} did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let stdout = std::fs::read_to_string(&out_file).unwrap_or_default();
    if !status.success() {
        let stderr = std::fs::read_to_string(&err_file).unwrap_or_default();
        bail!("{what} failed ({status}): {}", tail(&stderr, 12));
    }
    Ok(stdout)
}

/// The last `n` lines of `text`, joined with " | " (one line in a report).
fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(n)..].join(" | ")
}

/// Makes `language`'s pass-through function runnable; how the spec runs it.
fn prepare(language: Language, p: &Paths) -> Result<Function, Skip> {
    let src = p.sources();
    match language {
        Language::Rust => {
            let bin = zerohop_bench::need_bin(&p.bin, "zerohop-bench-lang-pass")?;
            Ok(Function {
                command: vec![bin.display().to_string()],
                env: BTreeMap::new(),
                built: "bench/languages/pass.rs, cargo build --release (the Rust runtime)".into(),
            })
        }
        Language::C => {
            let cc = on_path("cc").or_else(|| on_path("gcc"));
            let Some(cc) = cc else {
                return not_run("no C compiler (`cc` or `gcc`) on PATH");
            };
            let flags = c_sdk_flags(p)?;
            let out = p.work.join("pass-c");
            eprintln!("zerohop-bench-languages: c: building {}", out.display());
            run_bounded(
                Command::new(&cc)
                    .arg("-O2")
                    .arg("-o")
                    .arg(&out)
                    .arg(src.join("pass.c"))
                    .args(&flags),
                "cc pass.c",
                &p.scratch,
                BUILD_WAIT,
            )?;
            Ok(Function {
                command: vec![out.display().to_string()],
                env: BTreeMap::new(),
                built: format!(
                    "bench/languages/pass.c, {} -O2 with pkg-config zerohop-static (libzerohop.a \
                     of target/c-sdk linked in)",
                    cc.display()
                ),
            })
        }
        Language::Go => {
            let Some(go) = on_path("go") else {
                return not_run("no Go toolchain (`go`) on PATH");
            };
            // Fails early, with the command to run, when the C SDK is missing.
            c_sdk_flags(p)?;
            let out = p.work.join("pass-go");
            eprintln!(
                "zerohop-bench-languages: go: building {} (the first build takes a while)",
                out.display()
            );
            run_bounded(
                Command::new(&go)
                    .args(["build", "-buildvcs=false", "-o"])
                    .arg(&out)
                    .arg(".")
                    .current_dir(src.join("go"))
                    .env("PKG_CONFIG_PATH", p.pkg_config_path()),
                "go build",
                &p.scratch,
                BUILD_WAIT,
            )?;
            let version = run_bounded(
                Command::new(&go).arg("version"),
                "go version",
                &p.scratch,
                CHECK_WAIT,
            )
            .unwrap_or_default();
            Ok(Function {
                command: vec![out.display().to_string()],
                env: BTreeMap::new(),
                built: format!(
                    "bench/languages/go/main.go, go build over sdk/go (cgo, libzerohop.a of \
                     target/c-sdk); {}",
                    version.trim()
                ),
            })
        }
        Language::Python => {
            if !Path::new(PYTHON).is_file() {
                return not_run(format!("{PYTHON} does not exist"));
            }
            let sdk = p.target.join("python-sdk");
            if !sdk.join("zerohop").is_dir() {
                return not_run(format!(
                    "the Python SDK is not installed in {0}: run `python3 -m pip install \
                     --target {0} sdk/python`",
                    sdk.display()
                ));
            }
            let version = run_bounded(
                Command::new(PYTHON)
                    .args(["-c", "import sys, zerohop; print(sys.version.split()[0])"])
                    .env("PYTHONPATH", &sdk),
                "python3 import zerohop",
                &p.scratch,
                CHECK_WAIT,
            )?;
            Ok(Function {
                command: vec![PYTHON.into(), src.join("pass.py").display().to_string()],
                env: BTreeMap::from([("PYTHONPATH".into(), sdk.display().to_string())]),
                built: format!(
                    "bench/languages/pass.py on Python {} with the SDK of target/python-sdk",
                    version.trim()
                ),
            })
        }
        Language::Node => {
            if !Path::new(NODE).is_file() {
                return not_run(format!("{NODE} does not exist"));
            }
            let sdk = p.root.join("sdk/node");
            if !sdk.join("package.json").is_file() {
                return not_run("the Node.js SDK (sdk/node) is not in this checkout yet");
            }
            if !sdk.join("zerohop.node").is_file() {
                return not_run(
                    "the Node.js SDK is not built (no sdk/node/zerohop.node): run `npm run \
                     build` in sdk/node",
                );
            }
            // `require('zerohop')` as in a user's project: the function beside a
            // `node_modules/zerohop` (here a link to sdk/node). NODE_PATH would not do:
            // instances run in glibc's secure mode, where Node ignores it.
            let modules = p.work.join("node_modules");
            std::fs::create_dir_all(&modules).map_err(anyhow::Error::from)?;
            let link = modules.join("zerohop");
            if link.symlink_metadata().is_ok() {
                std::fs::remove_file(&link).map_err(anyhow::Error::from)?;
            }
            std::os::unix::fs::symlink(&sdk, &link).map_err(anyhow::Error::from)?;
            let script = p.work.join("pass.js");
            std::fs::copy(src.join("pass.js"), &script).map_err(anyhow::Error::from)?;
            let version = run_bounded(
                Command::new(NODE)
                    .args(["-e", "require('zerohop'); console.log(process.version)"])
                    .current_dir(&p.work),
                "node require zerohop",
                &p.scratch,
                CHECK_WAIT,
            )?;
            Ok(Function {
                command: vec![NODE.into(), script.display().to_string()],
                env: BTreeMap::new(),
                built: format!(
                    "bench/languages/pass.js on Node.js {} with sdk/node (napi-rs addon), copied \
                     beside a node_modules/zerohop link to it",
                    version.trim()
                ),
            })
        }
    }
}

/// Compiler and linker flags of the installed C SDK (`pkg-config zerohop-static`).
fn c_sdk_flags(p: &Paths) -> Result<Vec<String>, Skip> {
    if on_path("pkg-config").is_none() {
        return not_run("no `pkg-config` on PATH (the C SDK is found through it)");
    }
    let pc = p.pkg_config_path();
    if !pc.join("zerohop-static.pc").is_file() {
        return not_run(format!(
            "the C SDK is not installed in {}: run `cargo xtask c-sdk`",
            pc.parent().and_then(Path::parent).unwrap_or(&pc).display()
        ));
    }
    let flags = run_bounded(
        Command::new("pkg-config")
            .args(["--cflags", "--libs", "zerohop-static"])
            .env("PKG_CONFIG_PATH", &pc),
        "pkg-config zerohop-static",
        &p.scratch,
        CHECK_WAIT,
    )?;
    Ok(flags.split_whitespace().map(str::to_owned).collect())
}

// ---------------------------------------------------------------------------------------
// The chain.

/// `zerohop up` on one language's chain: stopped (SIGTERM, then SIGKILL; it stops every
/// instance) when dropped, also on errors.
struct Chain {
    child: Child,
    url: String,
    log: PathBuf,
}

impl Chain {
    /// Starts `zerohop up` on `spec`, on CPU `cpu` with all it starts when given.
    fn start(zerohop: &Path, spec: &Path, log: PathBuf, cpu: Option<usize>) -> Result<Self> {
        let mut cmd = Command::new(zerohop);
        cmd.arg("up")
            .arg(spec)
            .args(["--listen", "127.0.0.1:0"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log)?);
        // A child inherits the affinity of the thread that forks it: fork from a thread
        // pinned to `cpu` (this thread may be pinned elsewhere, for the load generator).
        let mut child = std::thread::scope(|s| {
            s.spawn(|| {
                if let Some(cpu) = cpu {
                    ensure!(pin_current_thread(cpu), "cannot pin a thread to CPU {cpu}");
                }
                cmd.spawn().context("starting zerohop up")
            })
            .join()
            .map_err(|_| anyhow!("the thread starting zerohop up panicked"))?
        })?;
        let stdout = child.stdout.take().context("stdout")?;
        let mut chain = Self {
            child,
            url: String::new(),
            log,
        };
        let line = match zerohop_bench::wait_line(stdout, "ready at ", START_WAIT) {
            Ok(line) => line,
            Err(RecvTimeoutError::Timeout) => bail!(
                "zerohop up was not ready within {START_WAIT:?}: {}",
                chain.log_tail()
            ),
            Err(RecvTimeoutError::Disconnected) => {
                bail!("zerohop up exited: {}", chain.log_tail())
            }
        };
        chain.url = zerohop_test_support::listener_in(&line, "http://")
            .map(|a| format!("http://{a}"))
            .ok_or_else(|| anyhow!("no URL in the ready line {line:?}"))?;
        Ok(chain)
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn log_tail(&self) -> String {
        tail(&std::fs::read_to_string(&self.log).unwrap_or_default(), 8)
    }

    /// The instances of `p1` .. `pK`, in that order (waits, bounded, until each has one).
    fn functions(&self, k: usize) -> Result<Vec<ProcessId>> {
        let deadline = Instant::now() + START_WAIT;
        loop {
            let found = zerohop_functions(self.pid());
            let pids: Vec<Option<ProcessId>> = (1..=k)
                .map(|i| {
                    let name = format!("p{i}");
                    found
                        .iter()
                        .find(|(n, _)| *n == name)
                        .and_then(|&(_, pid)| ProcessId::of(pid))
                })
                .collect();
            if pids.iter().all(Option::is_some) {
                return Ok(pids.into_iter().flatten().collect());
            }
            if Instant::now() >= deadline {
                bail!(
                    "found instances of only {:?} of p1..p{k} within {START_WAIT:?}: {}",
                    found.iter().map(|(n, _)| n).collect::<Vec<_>>(),
                    self.log_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Chain {
    fn drop(&mut self) {
        zerohop_bench::stop_child(&mut self.child, "zerohop-bench-languages: zerohop up");
    }
}

fn spec(language: Language, f: &Function, k: usize) -> Result<String> {
    let q = |s: &str| serde_json::to_string(s);
    let command = f
        .command
        .iter()
        .map(|c| q(c))
        .collect::<Result<Vec<_>, _>>()?
        .join(", ");
    let mut s = format!(
        "name: lang-{}\ngateway_threads: {GATEWAY_THREADS}\ntimeout: 10s\nfunctions:\n",
        language.name()
    );
    let names: Vec<String> = (1..=k).map(|i| format!("p{i}")).collect();
    for name in &names {
        let mut env = format!("{FUNCTION_ENV}: {}", q(name)?);
        for (key, value) in &f.env {
            let _ = write!(env, ", {key}: {}", q(value)?);
        }
        let _ = writeln!(s, "  {name}: {{ command: [{command}], env: {{ {env} }} }}");
    }
    let _ = writeln!(
        s,
        "routes:\n  - http: POST /one\n    sequence: [p1]\n  - http: POST /chain\n    \
         sequence: [{}]",
        names.join(", ")
    );
    Ok(s)
}

// ---------------------------------------------------------------------------------------
// Measuring one language.

struct Plan {
    /// The chain's CPU when pinned (the load generator is on CPU 0).
    chain_cpu: Option<usize>,
    hops: usize,
    seconds: f64,
    rounds: usize,
    idle_seconds: f64,
    body: usize,
    warmup: f64,
}

fn memory(pid: u32) -> Result<Memory> {
    let s = ProcStatus::read(pid).ok_or_else(|| anyhow!("cannot read /proc/{pid}/status"))?;
    let rollup = Rollup::read(pid);
    Ok(Memory {
        pid,
        vm_rss_kib: s.vm_rss_kib,
        rss_anon_kib: s.rss_anon_kib,
        rss_file_kib: s.rss_file_kib,
        rss_shmem_kib: s.rss_shmem_kib,
        threads: s.threads,
        pss_kib: rollup.map(|r| r.pss_kib),
        private_kib: rollup.map(|r| r.private_kib),
    })
}

/// Folds the rounds of one route into a [`Point`].
fn point(functions: usize, runs: &[(RunResult, Round)]) -> Point {
    let pick = |f: fn(&Round) -> f64| median(&runs.iter().map(|(_, r)| f(r)).collect::<Vec<_>>());
    let requests: u64 = runs.iter().map(|(r, _)| r.requests).sum();
    let seconds: f64 = runs.iter().map(|(r, _)| r.seconds).sum();
    let per_request = |s: f64| {
        if requests > 0 {
            s * 1e6 / requests as f64
        } else {
            0.0
        }
    };
    Point {
        functions,
        p50_us: pick(|r| r.p50_us),
        mean_us: pick(|r| r.mean_us),
        p99_us: pick(|r| r.p99_us),
        rps: if seconds > 0.0 {
            requests as f64 / seconds
        } else {
            0.0
        },
        requests,
        errors: runs.iter().map(|(r, _)| r.errors).sum(),
        wrong: runs.iter().map(|(r, _)| r.wrong).sum(),
        first_error: runs.iter().find_map(|(r, _)| r.first_error.clone()),
        fn_cpu_us_per_request: per_request(runs.iter().map(|(_, r)| r.fn_cpu_s).sum()),
        zerohop_cpu_us_per_request: per_request(runs.iter().map(|(_, r)| r.zerohop_cpu_s).sum()),
        rounds: runs.iter().map(|(_, r)| *r).collect(),
    }
}

/// One language's chain, up and being measured.
struct Up {
    language: Language,
    /// `zerohop up` (gateway thread and agent) and all it started.
    chain: Chain,
    /// The `zerohop up` process.
    zerohop: ProcessId,
    /// The instances of `p1` .. `pK`.
    fns: Vec<ProcessId>,
    one: Vec<(RunResult, Round)>,
    long: Vec<(RunResult, Round)>,
    /// Wrong or failed answers, instances that did not live through the run.
    errors: Vec<String>,
}

impl Up {
    /// Brings `language`'s chain up and warms both routes (not recorded: first requests,
    /// the interpreters' and JITs' first passes).
    fn start(
        language: Language,
        f: &Function,
        plan: &Plan,
        zerohop: &Path,
        p: &Paths,
    ) -> Result<Self> {
        let name = language.name();
        let file = p.scratch.join(format!("{name}.yaml"));
        std::fs::write(&file, spec(language, f, plan.hops)?)?;
        let chain = Chain::start(
            zerohop,
            &file,
            p.scratch.join(format!("{name}.log")),
            plan.chain_cpu,
        )?;
        let fns = chain.functions(plan.hops)?;
        let zerohop = ProcessId::of(chain.pid())
            .ok_or_else(|| anyhow!("zerohop up (pid {}) is gone", chain.pid()))?;
        eprintln!(
            "zerohop-bench-languages: {name}: chain up at {} ({} instances)",
            chain.url, plan.hops
        );
        let up = Self {
            language,
            chain,
            zerohop,
            fns,
            one: Vec::new(),
            long: Vec::new(),
            errors: Vec::new(),
        };
        for long in [false, true] {
            let r = up.load(long, plan, plan.warmup)?;
            ensure!(
                r.requests > 0,
                "no correct answer during the warm-up of {}: {}",
                up.url(long),
                r.first_error.as_deref().unwrap_or("none")
            );
        }
        Ok(up)
    }

    fn url(&self, long: bool) -> String {
        format!("{}/{}", self.chain.url, if long { "chain" } else { "one" })
    }

    /// The instances of the route.
    fn instances(&self, long: bool) -> &[ProcessId] {
        if long {
            &self.fns
        } else {
            &self.fns[..1]
        }
    }

    fn load(&self, long: bool, plan: &Plan, seconds: f64) -> Result<RunResult> {
        loadgen::run(
            &self.url(long),
            &[Step::Pass],
            &BodyMix::Fixed(plan.body),
            &Load::Closed {
                concurrency: CONCURRENCY,
            },
            Duration::ZERO,
            Duration::from_secs_f64(seconds),
        )
    }

    /// One measured point of one route.
    fn point(&mut self, long: bool, plan: &Plan) -> Result<()> {
        // The route's instances, and `zerohop up`.
        let counters = || {
            (
                TickSample::take(self.instances(long)),
                TickSample::take(&[self.zerohop]),
            )
        };
        let (fn_before, me_before) = counters();
        let r = self.load(long, plan, plan.seconds)?;
        let (fn_after, me_after) = counters();
        let round = Round {
            p50_us: r.latency.p50_us,
            mean_us: r.latency.mean_us,
            p99_us: r.latency.p99_us,
            rps: r.rps,
            requests: r.requests,
            fn_cpu_s: ticks_to_seconds(fn_after.total_since(&fn_before)),
            zerohop_cpu_s: ticks_to_seconds(me_after.total_since(&me_before)),
        };
        if r.errors + r.wrong > 0 {
            self.errors.push(format!(
                "{}: {} failed and {} wrong answers (first: {})",
                self.url(long),
                r.errors,
                r.wrong,
                r.first_error.as_deref().unwrap_or("none")
            ));
        }
        if long {
            self.long.push((r, round));
        } else {
            self.one.push((r, round));
        }
        Ok(())
    }

    /// The K instances' counters now.
    fn idle_counters(&self) -> IdleCounters {
        IdleCounters {
            ticks: TickSample::take(&self.fns),
            sched: SchedStat::threads_of(&self.fns),
        }
    }

    /// Folds what was measured; stops the chain.
    fn finish(mut self, idle: Idle) -> Result<(Measured, Vec<String>)> {
        let k = self.fns.len();
        let memory = memory(self.fns[0].pid)?;
        for (i, p) in self.fns.iter().enumerate() {
            if !p.alive() {
                self.errors.push(format!(
                    "the instance of p{} (pid {}) did not live through the run",
                    i + 1,
                    p.pid
                ));
            }
        }
        let (one, chain) = (point(1, &self.one), point(k, &self.long));
        drop(self.chain);
        let per_hop = |long: f64, short: f64| (long - short) / (k - 1) as f64;
        let per_hop_p50_rounds_us = one
            .rounds
            .iter()
            .zip(&chain.rounds)
            .map(|(a, b)| per_hop(b.p50_us, a.p50_us))
            .collect();
        Ok((
            Measured {
                per_hop_p50_us: per_hop(chain.p50_us, one.p50_us),
                per_hop_mean_us: per_hop(chain.mean_us, one.mean_us),
                per_hop_p50_rounds_us,
                fn_cpu_us_per_hop: chain.fn_cpu_us_per_request / k as f64,
                one,
                chain,
                idle,
                memory,
            },
            self.errors,
        ))
    }
}

fn ratios(m: &Measured, rust: &Measured) -> Ratios {
    let over = |a: f64, b: f64| (b > 0.0).then(|| a / b);
    Ratios {
        per_hop_p50: over(m.per_hop_p50_us, rust.per_hop_p50_us),
        per_hop_mean: over(m.per_hop_mean_us, rust.per_hop_mean_us),
        fn_cpu_per_hop: over(m.fn_cpu_us_per_hop, rust.fn_cpu_us_per_hop),
        idle_rss: over(m.memory.vm_rss_kib as f64, rust.memory.vm_rss_kib as f64),
    }
}

// ---------------------------------------------------------------------------------------
// The report.

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

fn times(r: Option<f64>) -> String {
    r.map_or_else(|| "-".into(), |r| format!("{r:.2}"))
}

fn summary_line(r: &Report) -> String {
    let parts: Vec<String> = r
        .languages
        .iter()
        .map(|row| match (&row.status, &row.result) {
            (Status::Measured, Some(m)) => match row.ratio_to_rust.per_hop_p50 {
                Some(x) if row.language != Language::Rust => {
                    format!(
                        "{} {:.1} us ({x:.2}x)",
                        row.language.name(),
                        m.per_hop_p50_us
                    )
                }
                _ => format!("{} {:.1} us", row.language.name(), m.per_hop_p50_us),
            },
            (Status::NotRun, _) => format!("{} not run", row.language.name()),
            _ => format!("{} failed", row.language.name()),
        })
        .collect();
    format!("languages: per-hop p50 {}", parts.join(", "))
}

fn markdown(r: &Report) -> String {
    let k = r.settings.hops;
    let mut s = String::new();
    let _ = writeln!(s, "# Functions in each language: what a hop costs\n");
    let mut main = Table::new(&[
        "language".to_owned(),
        "per-hop p50 (us)".into(),
        "/ Rust".into(),
        "per-hop mean (us)".into(),
        format!("p99, 1 / {k} fns (us)"),
        "fn CPU per hop (us)".into(),
        "/ Rust".into(),
        format!("idle CPU, {k} instances (ms/s)"),
        "idle wakeups/s".into(),
        "idle RSS (MiB)".into(),
        "Pss / private (MiB)".into(),
        "threads".into(),
    ]);
    for row in &r.languages {
        let title = row.language.title();
        match (&row.status, &row.result) {
            (Status::Measured, Some(m)) => {
                let rollup = match (m.memory.pss_kib, m.memory.private_kib) {
                    (Some(pss), Some(private)) => format!("{:.1} / {:.1}", mib(pss), mib(private)),
                    _ => "unreadable".into(),
                };
                main.row(&[
                    title.to_owned(),
                    format!("**{:.1}**", m.per_hop_p50_us),
                    times(row.ratio_to_rust.per_hop_p50),
                    format!("{:.1}", m.per_hop_mean_us),
                    format!("{:.0} / {:.0}", m.one.p99_us, m.chain.p99_us),
                    format!("{:.1}", m.fn_cpu_us_per_hop),
                    times(row.ratio_to_rust.fn_cpu_per_hop),
                    format!("{:.2}", m.idle.cpu_ms_per_s),
                    format!("{:.1}", m.idle.wakeups_per_s),
                    format!("{:.1}", mib(m.memory.vm_rss_kib)),
                    rollup,
                    m.memory.threads.to_string(),
                ]);
            }
            (status, _) => {
                let what = if *status == Status::NotRun {
                    "not run"
                } else {
                    "failed"
                };
                let reason = row.reason.as_deref().unwrap_or("see errors");
                main.spanning_row(title, &format!("{what}: {reason}"));
            }
        }
    }
    let mut more = Table::new(&[
        "language".to_owned(),
        format!("p50, 1 / {k} fns (us)"),
        format!("mean, 1 / {k} fns (us)"),
        format!("RPS, 1 / {k} fns"),
        "per-hop p50 by round (us)".into(),
        format!("fn CPU per request, 1 / {k} fns (us)"),
        format!("zerohop up CPU per request, {k} fns (us)"),
        "idle CPU from schedstat (us/s)".into(),
    ]);
    for row in &r.languages {
        if let Some(m) = &row.result {
            let rounds: Vec<String> = m
                .per_hop_p50_rounds_us
                .iter()
                .map(|v| format!("{v:.1}"))
                .collect();
            more.row(&[
                row.language.title().to_owned(),
                format!("{:.1} / {:.1}", m.one.p50_us, m.chain.p50_us),
                format!("{:.1} / {:.1}", m.one.mean_us, m.chain.mean_us),
                format!("{:.0} / {:.0}", m.one.rps, m.chain.rps),
                rounds.join(", "),
                format!(
                    "{:.1} / {:.1}",
                    m.one.fn_cpu_us_per_request, m.chain.fn_cpu_us_per_request
                ),
                format!("{:.1}", m.chain.zerohop_cpu_us_per_request),
                format!("{:.1}", m.idle.sched_cpu_us_per_s),
            ]);
        }
    }
    let _ = write!(s, "{main}\n{more}");
    let st = &r.settings;
    let _ = writeln!(
        s,
        "\n## How measured\n\nFor each language, the real `zerohop up` (one gateway thread, \
         ring transport; {}) runs {k} pass-through functions of that language, \
         `p1`..`p{k}`, one instance each, with two routes of the same shape: `POST /one` \
         through `[p1]` and `POST /chain` through all {k}. Each function reads the first byte \
         of the body where the gateway wrote it (no copy) and sends the body on unchanged \
         (`bench/languages/`). The bench's load generator (hyper, keep-alive, {} B bodies, \
         every answer checked) drives each route in a closed loop at concurrency 1, {:.0} s \
         per point after a {:.1} s warm-up per route, in {} rounds; every language's chain \
         is up at once and the languages take turns within each round (each round starting \
         with another one, the routes' order alternating), so that a disturbance falls on \
         all alike. p50, mean and p99 are medians over the rounds. Per-hop = (p50({k}) - \
         p50(1)) / {}; the ratio is to Rust's from this run. CPU is `utime + stime` of the \
         instances' `/proc/PID/stat` over the points (clock ticks of {:.0} ms); per hop is \
         the {k} instances' CPU per request of `/chain` over {k}. Idle: {:.1} s with no \
         traffic after {:.1} s of quiet, every chain up, CPU of each language's {k} instances \
         (ticks; the second table has the same from the threads' `schedstat` in ns) and how often their threads were \
         switched in. RSS: `VmRSS` of `p1` after it served both routes and the idle window; \
         Pss and private memory from `smaps_rollup`. On a small VM with steal time, \
         compare ratios within one run, not absolute numbers across runs.\n",
        st.pinning,
        st.body_bytes,
        st.seconds_per_point,
        st.warmup_seconds_per_route,
        st.rounds,
        k - 1,
        1e3 / ticks_per_second(),
        st.idle_seconds,
        SETTLE.as_secs_f64()
    );
    let _ = writeln!(s, "Functions:\n");
    for row in &r.languages {
        if let Some(f) = &row.function {
            let _ = writeln!(
                s,
                "- {}: `{}`; {}",
                row.language.title(),
                f.command.join(" "),
                f.built
            );
        }
    }
    let m = &r.machine;
    let _ = writeln!(
        s,
        "\nMachine: {} cores, {}, {:.1} GiB, kernel {}; load average before the run: {}.",
        m.cores,
        m.cpu_model,
        m.mem_kib as f64 / (1024.0 * 1024.0),
        m.kernel,
        r.loadavg_before
    );
    let d = &r.disturbance;
    let _ = writeln!(
        s,
        "While the points ran ({:.0} s), this benchmark used {:.2} cores, other processes \
         {:.2} and the host took {:.2} from this VM (steal){}",
        d.seconds,
        d.own_cores,
        d.other_cores,
        d.steal_cores,
        if d.exceeds(DISTURBED) {
            ": **the run was disturbed**, its numbers are not to be trusted; run it on a quiet \
             machine."
        } else {
            "."
        }
    );
    let errors: Vec<String> = r
        .languages
        .iter()
        .flat_map(|row| {
            row.errors
                .iter()
                .map(move |e| format!("{}: {e}", row.language.title()))
        })
        .collect();
    if !errors.is_empty() {
        let _ = writeln!(s, "\nErrors:\n");
        for e in errors {
            let _ = writeln!(s, "- {e}");
        }
    }
    s
}

fn run(args: &Args) -> Result<bool> {
    ensure!(args.hops >= 2, "--hops must be at least 2");
    let bin = zerohop_bench::bin_dir(args.bin_dir.as_deref())?;
    let zerohop = zerohop_bench::need_bin(&bin, "zerohop")?;
    let target = bin
        .parent()
        .context("the binaries' folder has no parent")?
        .to_path_buf();
    let root = match &args.root {
        Some(r) => r.clone(),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join(".."),
    };
    let root = root
        .canonicalize()
        .with_context(|| format!("the checkout {}", root.display()))?;
    ensure!(
        root.join("bench/languages").is_dir(),
        "{} has no bench/languages: give the checkout with --root",
        root.display()
    );
    let work = target.join("bench-languages");
    std::fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
    let scratch = tempfile::Builder::new()
        .prefix("zerohop-bench-languages-")
        .tempdir()?;
    let paths = Paths {
        bin,
        target: target.canonicalize()?,
        root,
        work: work.canonicalize()?,
        scratch: scratch.path().to_path_buf(),
    };
    let cores = online_cpus();
    let pin = !args.no_pin && cores >= 2;
    let plan = Plan {
        chain_cpu: pin.then_some(1),
        hops: args.hops,
        seconds: args.seconds.unwrap_or(if args.quick { 2.0 } else { 5.0 }),
        rounds: args.rounds.unwrap_or(if args.quick { 2 } else { 3 }).max(1),
        idle_seconds: args
            .idle_seconds
            .unwrap_or(if args.quick { 2.0 } else { 5.0 }),
        body: args.body,
        warmup: if args.quick { 0.5 } else { 1.0 },
    };
    ensure!(
        plan.seconds > 0.0 && plan.idle_seconds > 0.0,
        "--seconds and --idle-seconds must be positive"
    );
    let machine = Machine::read();
    let loadavg_before = report::load_average();
    let mut languages: Vec<Language> = Vec::new();
    for l in &args.languages {
        if !languages.contains(l) {
            languages.push(*l);
        }
    }
    // Everything is built first, on every core; then the load generator (this thread) is
    // pinned and the languages are measured one after another.
    let mut rows: Vec<Row> = languages
        .iter()
        .map(|&language| Row::prepared(language, &paths))
        .collect();
    if plan.chain_cpu.is_some() {
        ensure!(
            pin_current_thread(0),
            "cannot pin the load generator to CPU 0 (--no-pin runs without pinning)"
        );
    }
    // Every chain up at once, so that the languages take turns within each round: a
    // disturbance of the machine (another build, the host) falls on all of them alike.
    let mut ups: Vec<(usize, Up)> = Vec::new();
    for (i, row) in rows.iter_mut().enumerate() {
        let Some(f) = &row.function else {
            continue;
        };
        match Up::start(row.language, f, &plan, &zerohop, &paths) {
            Ok(up) => ups.push((i, up)),
            Err(e) => {
                eprintln!(
                    "zerohop-bench-languages: {}: failed: {e:#}",
                    row.language.name()
                );
                row.reason = Some(format!("{e:#}"));
            }
        }
    }
    let before = MachineTicks::now();
    for round in 0..plan.rounds {
        // Each round starts with another language, and alternates the routes' order (ABBA).
        let order = if round % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        };
        let n = ups.len();
        for j in 0..n {
            let (_, up) = &mut ups[(j + round) % n];
            for long in order {
                if let Err(e) = up.point(long, &plan) {
                    up.errors.push(format!("{}: {e:#}", up.url(long)));
                }
            }
            let last = |v: &Vec<(RunResult, Round)>| v.last().map_or(0.0, |(_, r)| r.p50_us);
            eprintln!(
                "zerohop-bench-languages: round {}/{}, {}: p50 /one {:.1} us, /chain {:.1} us \
                 ({:.0} s)",
                round + 1,
                plan.rounds,
                up.language.name(),
                last(&up.one),
                last(&up.long),
                before.at().elapsed().as_secs_f64()
            );
        }
    }
    let disturbance = before.since();
    // Idle: every chain up, no traffic.
    eprintln!(
        "zerohop-bench-languages: idle window, {:.1} s",
        plan.idle_seconds
    );
    std::thread::sleep(SETTLE);
    let before: Vec<_> = ups.iter().map(|(_, up)| up.idle_counters()).collect();
    let idle_started = Instant::now();
    std::thread::sleep(Duration::from_secs_f64(plan.idle_seconds));
    let after: Vec<_> = ups.iter().map(|(_, up)| up.idle_counters()).collect();
    let idle_s = idle_started.elapsed().as_secs_f64();
    for (((i, up), b), a) in ups.into_iter().zip(before).zip(after) {
        let idle = Idle::between(&b, &a, idle_s, up.fns.len());
        let row = &mut rows[i];
        let name = up.language.name();
        match up.finish(idle) {
            Ok((m, errors)) => {
                eprintln!(
                    "zerohop-bench-languages: {name}: per-hop p50 {:.1} us, mean {:.1} us; fn \
                     CPU per hop {:.1} us; idle {:.2} ms/s; RSS {:.1} MiB",
                    m.per_hop_p50_us,
                    m.per_hop_mean_us,
                    m.fn_cpu_us_per_hop,
                    m.idle.cpu_ms_per_s,
                    mib(m.memory.vm_rss_kib),
                );
                row.status = Status::Measured;
                row.result = Some(m);
                row.errors = errors;
            }
            Err(e) => {
                eprintln!("zerohop-bench-languages: {name}: failed: {e:#}");
                row.reason = Some(format!("{e:#}"));
            }
        }
    }
    let rust = rows
        .iter()
        .find(|r| r.language == Language::Rust)
        .and_then(|r| r.result.as_ref());
    let to_rust: Vec<Ratios> = rows
        .iter()
        .map(|row| match (&row.result, rust) {
            (Some(m), Some(rust)) => ratios(m, rust),
            _ => Ratios::default(),
        })
        .collect();
    for (row, ratio) in rows.iter_mut().zip(to_rust) {
        row.ratio_to_rust = ratio;
    }
    let ok = rows
        .iter()
        .all(|r| r.status != Status::Failed && r.errors.is_empty());
    let report = Report {
        machine,
        loadavg_before,
        settings: Settings {
            hops: plan.hops,
            seconds_per_point: plan.seconds,
            rounds: plan.rounds,
            idle_seconds: plan.idle_seconds,
            body_bytes: plan.body,
            concurrency: CONCURRENCY,
            gateway_threads: GATEWAY_THREADS,
            warmup_seconds_per_route: plan.warmup,
            pinning: if pin {
                "load generator on CPU 0; zerohop up and every instance on CPU 1".into()
            } else {
                format!("nothing pinned ({cores} CPUs, --no-pin={})", args.no_pin)
            },
        },
        reference: Language::Rust,
        languages: rows,
        disturbance,
        ok,
    };
    report::publish(
        &args.out,
        "languages",
        &report,
        &markdown(&report),
        Some(&summary_line(&report)),
    )?;
    Ok(report.ok)
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("zerohop-bench-languages: a language failed or had errors; see the report");
            ExitCode::from(1)
        }
        Err(e) => {
            eprintln!("zerohop-bench-languages: {e:#}");
            ExitCode::from(2)
        }
    }
}
