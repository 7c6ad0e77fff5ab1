//! `zerohop-bench`: runs every system through the benchmark matrix and writes the report.
//! Thin: parse arguments, run the matrix ([`zerohop_bench`]), map errors to exit codes.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Parser;
use zerohop_bench::loadgen::{self, BodyMix, Load};
use zerohop_bench::procstat::{self, CpuSnapshot, LOADGEN};
use zerohop_bench::protocols::{self, Plan};
use zerohop_bench::report::matrix::{Idle, Memory, Results, Run};
use zerohop_bench::report::Machine;
use zerohop_bench::systems::{self, RunningSystem, StartOpts, SystemId};
use zerohop_bench::{cores, floors, passes, Step, HELLO};

#[derive(Parser, Debug)]
#[command(
    name = "zerohop-bench",
    about = "Benchmarks zerohop side by side with a monolith, an HTTP microservice chain and an nginx broker chain"
)]
struct Args {
    /// Reduced matrix (under 3 minutes).
    #[arg(long, conflicts_with = "smoke")]
    quick: bool,
    /// Tiny matrix for the test suite (seconds; numbers meaningless).
    #[arg(long)]
    smoke: bool,
    /// Folder for results.json, summary.md and the plots.
    #[arg(long, default_value = "results")]
    out: PathBuf,
    /// Only these systems (comma separated): zerohop-ring, zerohop-socket, zerohop-poll,
    /// zerohop-sockmap, monolith, http-chain, nginx-broker.
    #[arg(long, value_delimiter = ',')]
    systems: Option<Vec<String>>,
    /// Do not pin the load generator and the system under test to separate cores.
    #[arg(long)]
    no_pin: bool,
    /// Skip the physical floors and transport hop measurements.
    #[arg(long)]
    no_floors: bool,
    /// Skip the HTTPS and HTTP/2 rows (zerohop-ring over https, h2 and h2c against its
    /// clear HTTP/1.1, and nginx terminating TLS in front of the monolith; need h2load).
    #[arg(long)]
    no_protocols: bool,
    /// The multi-core point (issue 33) on 1, 2, 4, ... up to N cores: every system
    /// (zerohop-ring with N gateway threads and N instances per function, a hyper monolith
    /// on N worker threads, a Go monolith and a Go HTTP chain with GOMAXPROCS=N) on CPUs
    /// 0..N-1, wrk on the next N. Refused when the machine has fewer than 2N CPUs. Default:
    /// the largest of 8, 4, 2, 1 the machine holds twice (1 on 2 CPUs: 1 core against 1
    /// core); 0 skips it (the default of --smoke).
    #[arg(long)]
    cores: Option<usize>,
    /// Run only the multi-core point (and the targets), not the matrix.
    #[arg(long)]
    cores_only: bool,
    /// Only re-judge the targets of the steps run after the matrix (activation, scale) from
    /// their JSON in --out, when this run wrote them, and rewrite results.json and summary.md
    /// there (what `cargo xtask bench` does after those steps).
    #[arg(long)]
    update_targets: bool,
    /// Folder of the built binaries (default: this binary's folder).
    #[arg(long)]
    bin_dir: Option<PathBuf>,
}

/// The matrix of one run.
struct Matrix {
    name: &'static str,
    warmup: Duration,
    point: Duration,
    concurrency: Vec<usize>,
    bodies: Vec<(BodyMix, Vec<usize>)>,
    chain_lengths: Vec<usize>,
    chain_concurrency: usize,
    open_fractions: Vec<f64>,
    open_connections: usize,
    /// Runs per open-loop point; the one with the median p99 is reported (a single stall
    /// of the host decides a lone run's p99).
    open_repeats: usize,
    idle: Duration,
    /// The multi-core point.
    cores: cores::Settings,
    /// The HTTPS and HTTP/2 rows.
    protocols: Plan,
}

impl Matrix {
    fn new(args: &Args) -> Self {
        if args.smoke {
            return Self {
                name: "smoke",
                warmup: Duration::from_millis(100),
                point: Duration::from_millis(300),
                concurrency: vec![4],
                bodies: vec![(BodyMix::Spright, vec![4])],
                chain_lengths: vec![3],
                chain_concurrency: 4,
                open_fractions: vec![0.5],
                open_connections: 8,
                open_repeats: 1,
                idle: Duration::from_millis(500),
                cores: cores::Settings {
                    warmup: Duration::from_millis(100),
                    point: Duration::from_secs(1),
                    rounds: 2,
                },
                protocols: Plan {
                    warmup: Duration::from_millis(100),
                    duration: Duration::from_millis(300),
                    in_flight: 8,
                    h2_connections: 2,
                },
            };
        }
        if args.quick {
            return Self {
                name: "quick",
                warmup: Duration::from_millis(300),
                point: Duration::from_millis(1500),
                concurrency: vec![1, 32],
                bodies: vec![
                    (BodyMix::Fixed(10_000), vec![32]),
                    (BodyMix::Fixed(1 << 20), vec![8]),
                    (BodyMix::Spright, vec![32]),
                ],
                chain_lengths: vec![1, 4, 8],
                chain_concurrency: 32,
                open_fractions: vec![0.5, 0.8],
                open_connections: 64,
                open_repeats: 3,
                idle: Duration::from_secs(3),
                cores: cores::Settings {
                    warmup: Duration::from_millis(300),
                    point: Duration::from_secs(2),
                    rounds: 2,
                },
                protocols: Plan {
                    warmup: Duration::from_millis(300),
                    duration: Duration::from_millis(1500),
                    in_flight: 32,
                    h2_connections: 4,
                },
            };
        }
        let all = vec![1, 8, 32, 128];
        Self {
            name: "full",
            warmup: Duration::from_secs(1),
            point: Duration::from_secs(5),
            concurrency: all.clone(),
            bodies: vec![
                (BodyMix::Fixed(10_000), all.clone()),
                (BodyMix::Fixed(1 << 20), all.clone()),
                (BodyMix::Spright, all),
            ],
            chain_lengths: vec![1, 2, 4, 8],
            chain_concurrency: 32,
            open_fractions: vec![0.5, 0.8],
            open_connections: 128,
            open_repeats: 5,
            idle: Duration::from_secs(10),
            cores: cores::Settings {
                warmup: Duration::from_secs(1),
                point: Duration::from_secs(8),
                rounds: 2,
            },
            protocols: Plan {
                warmup: Duration::from_secs(1),
                duration: Duration::from_secs(5),
                in_flight: 32,
                h2_connections: 4,
            },
        }
    }

    /// Load points per system (for the ETA).
    fn points_per_system(&self) -> usize {
        self.concurrency.len()
            + self.bodies.iter().map(|(_, c)| c.len()).sum::<usize>()
            + self.chain_lengths.len()
            + self.open_fractions.len() * self.open_repeats
    }
}

/// Progress lines with an ETA.
struct Progress {
    start: Instant,
    done: usize,
    total: usize,
    point: Duration,
}

impl Progress {
    fn step(&mut self, what: &str) {
        self.done += 1;
        let left = self.total.saturating_sub(self.done);
        let per = if self.done > 1 {
            self.start.elapsed() / (self.done as u32 - 1)
        } else {
            self.point + Duration::from_millis(500)
        };
        let eta = per * left as u32;
        eprintln!(
            "bench: [{}/{}] {what} (elapsed {}, ETA {})",
            self.done,
            self.total,
            mmss(self.start.elapsed()),
            mmss(eta)
        );
    }
}

fn mmss(d: Duration) -> String {
    let s = d.as_secs();
    format!("{}:{:02}", s / 60, s % 60)
}

fn main() -> std::process::ExitCode {
    // A re-executed peer of the floor measurements never returns from here.
    floors::maybe_run_echo_role();
    let args = Args::parse();
    match run(&args) {
        Ok(true) => std::process::ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("bench: some systems answered wrongly or failed; see summary.md");
            std::process::ExitCode::from(1)
        }
        Err(e) => {
            eprintln!("bench: {e:#}");
            std::process::ExitCode::from(2)
        }
    }
}

/// Runs the matrix; `Ok(false)` when a system gave wrong answers or could not run.
fn run(args: &Args) -> Result<bool> {
    if args.update_targets {
        zerohop_bench::report::matrix::update_step_targets(&args.out)?;
        eprintln!(
            "bench: targets of the later steps updated in {}/results.json and summary.md",
            args.out.display()
        );
        return Ok(true);
    }
    let online = procstat::online_cpus();
    // Refused before anything runs: one line.
    let requested = args.cores.or(if args.smoke { Some(0) } else { None });
    let core_counts = cores::plan(requested, online).map_err(anyhow::Error::msg)?;
    if args.cores_only && core_counts.is_empty() {
        bail!("--cores-only with no core count to run (--cores 0, or a machine with one CPU)");
    }
    let matrix = Matrix::new(args);
    let bin_dir = zerohop_bench::bin_dir(args.bin_dir.as_deref())?;
    for b in [
        "zerohop",
        "upper",
        "exclaim",
        "zerohop-bench-fn",
        "zerohop-bench-pass",
    ] {
        if !bin_dir.join(b).is_file() {
            bail!(
                "{} is missing; build everything first: `cargo build --release --workspace --bins` \
                 (`cargo xtask bench` does it)",
                bin_dir.join(b).display()
            );
        }
    }
    let cores = procstat::online_cpus();
    let pin = !args.no_pin && cores >= 2;
    let pinning = if pin {
        procstat::pin_current_thread(0);
        "Load generator pinned to CPU 0, every process of the system under test to CPU 1 \
         (nginx and all functions share that core)"
            .to_owned()
    } else {
        format!("Nothing pinned ({cores} CPUs, --no-pin={})", args.no_pin)
    };
    let mut ids = SystemId::all();
    if let Some(only) = &args.systems {
        for name in only {
            if !ids.iter().any(|i| &i.name() == name) {
                bail!(
                    "unknown system `{name}`; known: {}",
                    ids.iter().map(|i| i.name()).collect::<Vec<_>>().join(", ")
                );
            }
        }
        ids.retain(|i| only.contains(&i.name()));
    }
    if args.cores_only {
        // The cores point has its own systems.
        ids.clear();
    }
    // The monolith first: its peak sets the open-loop rates of every system.
    ids.sort_by_key(|i| i.name() != "monolith");
    // Removed when this function returns, however it returns.
    let work = tempfile::Builder::new()
        .prefix("zerohop-bench-")
        .tempdir()
        .context("scratch folder")?;
    let opts = StartOpts {
        cpus: pin.then(|| "1".to_owned()),
        // The one-core matrix: one gateway thread, as the affinity gives it.
        gateway_threads: None,
        pipelines: false,
        instances: 1,
        bin_dir,
        work_dir: work.path().to_owned(),
        tls: None,
    };
    let cores_points = if core_counts.is_empty() {
        0
    } else {
        matrix.cores.rounds * core_counts.len() * cores::SYSTEMS.len() + cores::RATE_FRACTIONS.len()
    };
    let with_protocols = !args.no_protocols && ids.iter().any(|i| i.name() == "zerohop-ring");

    let mut results = Results {
        machine: Machine::read(),
        matrix: matrix.name.into(),
        pinning,
        cores: None,
        seconds_per_point: matrix.point.as_secs_f64(),
        floors: Vec::new(),
        runs: Vec::new(),
        idle: Vec::new(),
        memory: Vec::new(),
        targets: Vec::new(),
        failures: Vec::new(),
        protocols: Default::default(),
    };
    let mut progress = Progress {
        start: Instant::now(),
        done: 0,
        total: ids.len() * (matrix.points_per_system() + 1)
            + cores_points
            + if with_protocols { protocols::POINTS } else { 0 },
        point: matrix.warmup + matrix.point,
    };
    if args.cores_only {
        eprintln!(
            "bench: the cores point alone on {core_counts:?} core(s) ({} settings); results go \
             to {}",
            matrix.name,
            args.out.display()
        );
    } else {
        eprintln!(
            "bench: {} matrix, {} systems, {} load points each; results go to {}",
            matrix.name,
            ids.len(),
            matrix.points_per_system(),
            args.out.display()
        );
    }

    for &id in &ids {
        // zerohop's chains are held to the monolith's tail at the monolith's rates. The other
        // baselines cannot carry those rates (an HTTP chain overloaded at 50% of the
        // monolith's peak answers next to nothing in a point), so they keep their own.
        let monolith_peak = results
            .hello_point("monolith", results.target_concurrency())
            .map(|r| r.result.rps)
            .filter(|_| id.name().starts_with("zerohop-"));
        if let Err(e) = bench_hello(
            id,
            &matrix,
            &opts,
            monolith_peak,
            &mut results,
            &mut progress,
        ) {
            results.failures.push(format!("{}: {e:#}", id.name()));
            eprintln!("bench: {} failed: {e:#}", id.name());
        }
    }
    if !core_counts.is_empty() {
        let mut say = |what: &str| {
            if what.starts_with("  ") {
                eprintln!("bench: {what}");
            } else {
                progress.step(what);
            }
        };
        results.cores = Some(cores::run(&core_counts, &matrix.cores, &opts, &mut say));
    }
    for &n in &matrix.chain_lengths {
        let chain = passes(n);
        for &id in &ids {
            progress.step(&format!("{} chain of {n}", id.name()));
            let r = systems::start(id, &chain, &opts).and_then(|sys| {
                let run = measure(
                    &sys,
                    &chain,
                    "chain_length",
                    &BodyMix::Fixed(100),
                    &Load::Closed {
                        concurrency: matrix.chain_concurrency,
                    },
                    &matrix,
                );
                sys.stop();
                run
            });
            match r {
                Ok(run) => results.runs.push(run),
                Err(e) => results
                    .failures
                    .push(format!("{} chain of {n}: {e:#}", id.name())),
            }
        }
    }
    if with_protocols {
        let mut say = |what: &str| progress.step(what);
        results.protocols = protocols::run(
            &HELLO,
            &opts,
            &matrix.protocols,
            &mut say,
            &mut results.failures,
        );
        for r in &results.protocols.runs {
            eprintln!(
                "bench:   {} {}: {:.0} req/s, {:.1} CPU ms per 1,000",
                r.system, r.protocol, r.result.rps, r.sut_cpu_ms_per_1k
            );
        }
    }
    if !args.no_floors && !args.cores_only {
        let quick = args.quick || args.smoke;
        let mut say = |what: &str| eprintln!("bench: {what}");
        match floors::measure(quick, &mut say) {
            Ok(f) => results.floors = f,
            Err(e) => results.failures.push(format!("floors: {e:#}")),
        }
    }
    results.evaluate_targets();
    results.write(&args.out)?;
    eprintln!(
        "bench: done in {}; wrote {}/results.json and summary.md",
        mmss(progress.start.elapsed()),
        args.out.display()
    );
    for t in &results.targets {
        if t.measured {
            eprintln!(
                "bench: target {}: {:.3} (bound {:.3}) {}",
                t.name,
                t.value,
                t.target,
                if t.met { "met" } else { "MISSED" }
            );
        } else {
            eprintln!("bench: target {}: {}", t.name, t.note);
        }
    }
    let cores_clean = results.cores.as_ref().is_none_or(|c| {
        c.failures.iter().all(|f| f.starts_with("wrk:"))
            && c.runs.iter().all(|r| r.errors == 0 && r.requests > 0)
            && c.one_client.iter().all(|o| o.errors == 0 && o.requests > 0)
            && c.rates.iter().all(|r| r.errors == 0)
    });
    let clean = cores_clean
        && results.failures.is_empty()
        && results
            .runs
            .iter()
            .all(|r| r.result.errors == 0 && r.result.wrong == 0 && r.result.requests > 0);
    Ok(clean)
}

/// The hello chain on one system: concurrency sweep, body sizes, open loop, memory, idle.
/// The open loop runs at fractions of `monolith_peak` when given (so the system is compared
/// with the monolith at the same rates), else of the system's own peak.
fn bench_hello(
    id: SystemId,
    matrix: &Matrix,
    opts: &StartOpts,
    monolith_peak: Option<f64>,
    results: &mut Results,
    progress: &mut Progress,
) -> Result<()> {
    let sys = systems::start(id, &HELLO, opts)?;
    let name = id.name();
    let small = BodyMix::Fixed(100);
    let mut peak_c32: Option<f64> = None;
    for &c in &matrix.concurrency {
        progress.step(&format!("{name} hello 100B c={c}"));
        let run = measure(
            &sys,
            &HELLO,
            "concurrency",
            &small,
            &Load::Closed { concurrency: c },
            matrix,
        )?;
        if c == 32 || (peak_c32.is_none() && c == *matrix.concurrency.last().unwrap_or(&c)) {
            peak_c32 = Some(run.result.rps);
        }
        results.runs.push(run);
    }
    for (mix, cs) in &matrix.bodies {
        for &c in cs {
            progress.step(&format!("{name} hello {} c={c}", mix.label()));
            results.runs.push(measure(
                &sys,
                &HELLO,
                "body",
                mix,
                &Load::Closed { concurrency: c },
                matrix,
            )?);
        }
    }
    let peak = monolith_peak.or(peak_c32).unwrap_or(1000.0);
    for &f in &matrix.open_fractions {
        let rate = (peak * f).max(10.0);
        let mut repeats = Vec::with_capacity(matrix.open_repeats);
        for i in 0..matrix.open_repeats.max(1) {
            progress.step(&format!(
                "{name} open loop {rate:.0}/s (run {} of {})",
                i + 1,
                matrix.open_repeats.max(1)
            ));
            repeats.push(measure(
                &sys,
                &HELLO,
                "open_loop",
                &small,
                &Load::Open {
                    rate,
                    connections: matrix.open_connections,
                },
                matrix,
            )?);
        }
        results.runs.push(median_p99(repeats));
    }
    for c in &sys.components {
        if let Some((rss, shm)) = procstat::memory::rss_kib(c.pid) {
            results.memory.push(Memory {
                system: name.clone(),
                component: c.name.clone(),
                rss_kib: rss,
                shmem_kib: shm,
            });
        }
    }
    progress.step(&format!("{name} idle {:.0}s", matrix.idle.as_secs_f64()));
    // Let in-flight work and spin budgets settle, then watch.
    std::thread::sleep(Duration::from_millis(200));
    let before = CpuSnapshot::take(&sys.components);
    std::thread::sleep(matrix.idle);
    let mut cpu = CpuSnapshot::take(&sys.components).since(&before);
    cpu.remove(LOADGEN);
    let total: f64 = cpu.values().sum();
    results.idle.push(Idle {
        system: name,
        seconds: matrix.idle.as_secs_f64(),
        core_fraction: total / matrix.idle.as_secs_f64(),
        cpu_s: cpu,
    });
    sys.stop();
    Ok(())
}

/// One load point: drive the system, read CPU around it.
fn measure(
    sys: &RunningSystem,
    chain: &[Step],
    experiment: &str,
    mix: &BodyMix,
    load: &Load,
    matrix: &Matrix,
) -> Result<Run> {
    let before = CpuSnapshot::take(&sys.components);
    let result = loadgen::run(&sys.url, chain, mix, load, matrix.warmup, matrix.point)?;
    let cpu_s = CpuSnapshot::take(&sys.components).since(&before);
    // CPU covers warm-up and measured window; scale answers to the same span.
    let span = (matrix.warmup + matrix.point).as_secs_f64() / matrix.point.as_secs_f64();
    let answers = (result.requests as f64 * span).max(1.0);
    let cpu_ms_per_1k = cpu_s
        .iter()
        .map(|(k, v)| (k.clone(), v * 1e6 / answers))
        .collect::<std::collections::BTreeMap<_, _>>();
    let sut_cpu_ms_per_1k = cpu_ms_per_1k
        .iter()
        .filter(|(k, _)| k.as_str() != LOADGEN)
        .map(|(_, v)| v)
        .sum();
    let (mode, concurrency, rate) = match load {
        Load::Closed { concurrency } => ("closed", *concurrency, None),
        Load::Open { rate, connections } => ("open", *connections, Some(*rate)),
    };
    if result.errors > 0 || result.wrong > 0 {
        eprintln!(
            "bench:   {} errors, {} wrong answers; first: {}",
            result.errors,
            result.wrong,
            result.first_error.as_deref().unwrap_or("-")
        );
    } else {
        eprintln!(
            "bench:   {:.0} req/s, p50 {:.0} us, p99 {:.0} us",
            result.rps, result.latency.p50_us, result.latency.p99_us
        );
    }
    Ok(Run {
        system: sys.id.name(),
        experiment: experiment.into(),
        chain: chain.iter().map(|s| s.name().to_owned()).collect(),
        chain_len: chain.len(),
        body: mix.label(),
        mode: mode.into(),
        concurrency,
        rate,
        result,
        cpu_s,
        cpu_ms_per_1k,
        sut_cpu_ms_per_1k,
        p99_repeats_us: Vec::new(),
    })
}

/// The run with the median p99 of `runs` (not empty), carrying every run's p99.
fn median_p99(mut runs: Vec<Run>) -> Run {
    let p99s: Vec<f64> = runs.iter().map(|r| r.result.latency.p99_us).collect();
    runs.sort_by(|a, b| a.result.latency.p99_us.total_cmp(&b.result.latency.p99_us));
    let mut median = runs.swap_remove(runs.len() / 2);
    if p99s.len() > 1 {
        median.p99_repeats_us = p99s;
    }
    median
}
