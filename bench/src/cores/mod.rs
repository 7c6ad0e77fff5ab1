//! The multi-core point (issue 33): the hello chain on N cores for N = 1, 2, 4, ... up to what
//! `--cores` asks, every system on CPUs `0..N` and the load generator on cores of its own.
//!
//! * Systems, each on the same N cores: `zerohop-ring` (`gateway_threads: N`, N instances of
//!   each function, `cpus: 0-(N-1)`: a core-affine pipeline per core), `hyper-monolith` (the monolith on tokio's multi-threaded runtime with N
//!   workers: one process, as a team would deploy it), `go-monolith` and `go-http-chain`
//!   (`net/http`, upper -> exclaim over loopback HTTP keep-alive, `GOMAXPROCS=N`).
//! * Load: wrk with one thread per load-generator core and 32·N connections (each answer
//!   checked by its script), on the CPUs after the largest N (the same cores for every N, as
//!   in the issue); without wrk, the benchmark's own load generator with one thread per core
//!   ([`loadgen::run_on`]), which the report names.
//! * Two interleaved rounds (round 2 visits the systems in the other order); the table gives
//!   the mean of the rounds, `results.json` every round.
//! * One client: one connection, our load generator on one core of its own, each system on
//!   one core (and, where the machine has the cores, on the largest N: "idle cores").
//! * Gateway CPU against the rate: zerohop on the largest N at 5%, 25%, 50% and 100% of its
//!   peak (the mean of its closed-loop rounds there), open loop: CPU per request of the
//!   gateway process and of the whole system at each.
//!
//! CPU is read from `/proc/PID/task/*/schedstat` (nanoseconds, every living thread of each
//! process), so a light point is not lost in 10 ms ticks. [`plan`] refuses a count the
//! machine cannot hold (fewer than 2N CPUs). The table and the ratios are [`table`].

pub mod table;

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{bail, Result};

use crate::loadgen::{self, BodyMix, Load};
use crate::procstat::{ProcessId, SchedStat};
use crate::systems::{self, go, RunningSystem, StartOpts, SystemId};
use crate::{wrk, Step, HELLO};

/// zerohop with the ring transport.
pub const ZEROHOP: &str = "zerohop-ring";
/// The hyper monolith on N worker threads.
pub const HYPER: &str = "hyper-monolith";
/// The Go `net/http` monolith.
pub const GO: &str = "go-monolith";
/// The Go HTTP microservice chain.
pub const GO_CHAIN: &str = "go-http-chain";
/// Every system of the point, in the order of the table.
pub const SYSTEMS: [&str; 4] = [ZEROHOP, HYPER, GO, GO_CHAIN];
/// Closed-loop connections per core of the system (the 32·N).
pub const CONNECTIONS_PER_CORE: usize = 32;
/// Fractions of zerohop's peak the gateway's CPU is read at.
pub const RATE_FRACTIONS: [f64; 4] = [0.05, 0.25, 0.5, 1.0];
/// The counts the goals are stated for.
pub const GOAL_COUNTS: [usize; 4] = [1, 2, 4, 8];

/// The core counts to run for `--cores requested` on a machine with `online` CPUs: 1, 2, 4, ...
/// doubling up to N, and N itself. `None` (no `--cores`): the largest of 8, 4, 2, 1 the
/// machine holds twice. `Some(0)`: none. An N the machine cannot hold twice (N for each system,
/// N for the load generator) is refused with one line.
pub fn plan(requested: Option<usize>, online: usize) -> Result<Vec<usize>, String> {
    let n = match requested {
        Some(0) => return Ok(Vec::new()),
        Some(n) if n.saturating_mul(2) > online => {
            return Err(format!(
                "--cores {n} needs {} CPUs ({n} for each system, {n} for the load generator); \
                 this machine has {online}",
                n.saturating_mul(2)
            ))
        }
        Some(n) => n,
        None => match GOAL_COUNTS.iter().rev().find(|&&c| 2 * c <= online) {
            Some(&c) => c,
            None => return Ok(Vec::new()),
        },
    };
    let mut counts = Vec::new();
    let mut c = 1;
    while c < n {
        counts.push(c);
        c *= 2;
    }
    counts.push(n);
    Ok(counts)
}

/// A `taskset -c` list of `cpus` (consecutive): `3` or `0-3`.
pub fn cpu_list(cpus: &[usize]) -> String {
    match (cpus.first(), cpus.last()) {
        (Some(a), Some(b)) if a == b => a.to_string(),
        (Some(a), Some(b)) => format!("{a}-{b}"),
        _ => String::new(),
    }
}

/// How long and how often.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Load before each measured point (not measured).
    pub warmup: Duration,
    /// Each measured point (wrk counts whole seconds, at least one).
    pub point: Duration,
    /// Interleaved rounds of the closed-loop table.
    pub rounds: usize,
}

/// One closed-loop point of one system on `cores` cores in one round.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct CoresRun {
    /// [`SYSTEMS`].
    pub system: String,
    /// Cores the system had.
    pub cores: usize,
    /// Round, from 1.
    pub round: usize,
    /// Connections.
    pub connections: usize,
    /// Right answers per second.
    pub rps: f64,
    /// Right answers.
    pub requests: u64,
    /// Wrong answers and errors.
    pub errors: u64,
    /// Latency under this load, microseconds.
    pub p50_us: f64,
    /// Latency under this load, microseconds.
    pub p99_us: f64,
    /// On-CPU seconds per component during the measured window.
    pub cpu_s: BTreeMap<String, f64>,
    /// Every component together, microseconds per right answer.
    pub cpu_us_per_request: f64,
    /// The load generator's CPU seconds (wrk's; 0 when not known).
    pub loadgen_cpu_s: f64,
}

/// One connection, one request at a time.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct OneClient {
    /// [`SYSTEMS`].
    pub system: String,
    /// Cores the system had (1: on one core; more: a machine with idle cores).
    pub cores: usize,
    /// Median, microseconds.
    pub p50_us: f64,
    /// 99th percentile, microseconds.
    pub p99_us: f64,
    /// Right answers.
    pub requests: u64,
    /// Wrong answers and errors.
    pub errors: u64,
}

/// zerohop at a fraction of its peak, open loop.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct RatePoint {
    /// Of zerohop's peak on these cores.
    pub fraction: f64,
    /// Requests per second asked for.
    pub rate: f64,
    /// Right answers per second.
    pub rps: f64,
    /// Wrong answers and errors.
    pub errors: u64,
    /// Latency from the intended send time, microseconds.
    pub p50_us: f64,
    /// Latency from the intended send time, microseconds.
    pub p99_us: f64,
    /// The gateway process (agent and gateway threads), microseconds per right answer.
    pub gateway_cpu_us_per_request: f64,
    /// Every process of the chain, microseconds per right answer.
    pub system_cpu_us_per_request: f64,
}

/// Everything the point measured.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct Cores {
    /// The core counts run.
    pub counts: Vec<usize>,
    /// CPUs of the machine.
    pub online: usize,
    /// What ran where, said plainly.
    pub pinning: String,
    /// Which load generator drove the closed-loop table.
    pub load_generator: String,
    /// Interleaved rounds.
    pub rounds: usize,
    /// Seconds per measured point.
    pub seconds_per_point: f64,
    /// The closed-loop points, every round.
    pub runs: Vec<CoresRun>,
    /// One client.
    pub one_client: Vec<OneClient>,
    /// Cores of the rate points (the largest count).
    pub rate_cores: usize,
    /// Gateway CPU against the rate.
    pub rates: Vec<RatePoint>,
    /// Systems or points that could not run, and why.
    pub failures: Vec<String>,
}

/// Runs the point for `counts` (from [`plan`]); `say` hears progress. Failures are recorded
/// in [`Cores::failures`], the other systems go on.
pub fn run(
    counts: &[usize],
    settings: &Settings,
    opts: &StartOpts,
    say: &mut dyn FnMut(&str),
) -> Cores {
    let online = crate::procstat::online_cpus();
    let largest = counts.iter().copied().max().unwrap_or(1);
    // The load generator's cores: after the largest system, the same for every count.
    let lg_cpus: Vec<usize> = (largest..(2 * largest).min(online)).collect();
    let mut cores = Cores {
        counts: counts.to_vec(),
        online,
        rounds: settings.rounds.max(1),
        seconds_per_point: settings.point.as_secs_f64().ceil().max(1.0),
        rate_cores: largest,
        ..Cores::default()
    };
    let use_wrk = match wrk::available() {
        Ok(()) => true,
        Err(why) => {
            cores.failures.push(format!(
                "wrk: {why}; the closed-loop table used zerohop-bench's own load generator"
            ));
            false
        }
    };
    cores.load_generator = if use_wrk {
        format!(
            "wrk, {} thread(s) on CPU(s) {}, {CONNECTIONS_PER_CORE}·N connections, every answer \
             checked by its Lua script",
            lg_cpus.len(),
            cpu_list(&lg_cpus)
        )
    } else {
        format!(
            "zerohop-bench's load generator (hyper client), {} thread(s) on CPU(s) {}, \
             {CONNECTIONS_PER_CORE}·N connections",
            lg_cpus.len(),
            cpu_list(&lg_cpus)
        )
    };
    cores.pinning = if largest == 1 {
        format!(
            "1 core against 1 core: every system on CPU 0 (zerohop's gateway and both functions \
             share it), the load generator on CPU 1. This machine has {online} CPUs, so it shows \
             no scaling: the other rows need 2N CPUs."
        )
    } else {
        format!(
            "Each system on CPUs 0..N-1 (zerohop: N gateway threads, N instances of each \
             function), the load generator on CPUs {} for every N. {online} CPUs.",
            cpu_list(&lg_cpus)
        )
    };
    let go_ok = match go::build(&opts.bin_dir) {
        Ok(_) => true,
        Err(e) => {
            cores
                .failures
                .push(format!("{GO}, {GO_CHAIN}: not run: {e:#}"));
            false
        }
    };
    let body = loadgen::payload(100);
    let expected = Step::expected(&HELLO, &body);
    for round in 1..=cores.rounds {
        for &n in counts {
            let mut order: Vec<&str> = SYSTEMS
                .iter()
                .copied()
                .filter(|s| go_ok || !s.starts_with("go-"))
                .collect();
            if round % 2 == 0 {
                order.reverse();
            }
            for system in order {
                say(&format!("{system} on {n} core(s), round {round}"));
                let r = point(
                    system,
                    n,
                    round,
                    settings,
                    opts,
                    &lg_cpus,
                    use_wrk,
                    (&body, &expected),
                    &mut cores,
                    say,
                );
                if let Err(e) = r {
                    cores
                        .failures
                        .push(format!("{system} on {n} core(s), round {round}: {e:#}"));
                }
            }
        }
    }
    cores
}

/// The system of `name` on `n` cores.
fn system_id(name: &str, n: usize) -> Result<SystemId> {
    let threads = u16::try_from(n)?;
    Ok(match name {
        ZEROHOP => SystemId::Zerohop(zerohop_transport::Backend::Ring),
        HYPER => SystemId::HyperMonolith(threads),
        GO => SystemId::GoMonolith(threads),
        GO_CHAIN => SystemId::GoHttpChain(threads),
        other => bail!("unknown system {other}"),
    })
}

/// One system on `n` cores in one round: the closed-loop point; in round 1 the one-client
/// point (on one core, and on the largest count); zerohop's rate points in the last round on
/// the largest count.
#[allow(clippy::too_many_arguments)]
fn point(
    system: &str,
    n: usize,
    round: usize,
    settings: &Settings,
    opts: &StartOpts,
    lg_cpus: &[usize],
    use_wrk: bool,
    (body, expected): (&[u8], &[u8]),
    cores: &mut Cores,
    say: &mut dyn FnMut(&str),
) -> Result<()> {
    let system_cpus: Vec<usize> = (0..n).collect();
    let threads = u16::try_from(n)?;
    let opts = StartOpts {
        cpus: Some(cpu_list(&system_cpus)),
        gateway_threads: Some(threads),
        pipelines: true,
        instances: threads,
        ..opts.clone()
    };
    let sys = systems::start(system_id(system, n)?, &HELLO, &opts)?;
    let connections = CONNECTIONS_PER_CORE * n;
    let mix = BodyMix::Fixed(body.len());
    if !settings.warmup.is_zero() {
        loadgen::run_on(
            &sys.url,
            &HELLO,
            &mix,
            &Load::Closed {
                concurrency: connections,
            },
            Duration::ZERO,
            settings.warmup,
            lg_cpus,
        )?;
    }
    let before = on_cpu(&sys);
    let (rps, requests, errors, p50_us, p99_us, loadgen_cpu_s) = if use_wrk {
        let w = wrk::run(
            &sys.url,
            body,
            expected,
            lg_cpus.len(),
            connections,
            settings.point,
            Some(&cpu_list(lg_cpus)),
            &opts.work_dir,
        )?;
        (
            w.rps,
            w.requests,
            w.wrong + w.errors,
            w.p50_us,
            w.p99_us,
            w.cpu_s,
        )
    } else {
        let r = loadgen::run_on(
            &sys.url,
            &HELLO,
            &mix,
            &Load::Closed {
                concurrency: connections,
            },
            Duration::ZERO,
            settings.point,
            lg_cpus,
        )?;
        (
            r.rps,
            r.requests,
            r.errors + r.wrong,
            r.latency.p50_us,
            r.latency.p99_us,
            0.0,
        )
    };
    let cpu_s = used(&before, &on_cpu(&sys));
    let total: f64 = cpu_s.values().sum();
    say(&format!(
        "  {rps:.0} req/s, p50 {p50_us:.0} us, p99 {p99_us:.0} us, {:.1} us CPU per request{}",
        total * 1e6 / requests.max(1) as f64,
        if errors > 0 {
            format!(", {errors} errors")
        } else {
            String::new()
        }
    ));
    cores.runs.push(CoresRun {
        system: system.to_owned(),
        cores: n,
        round,
        connections,
        rps,
        requests,
        errors,
        p50_us,
        p99_us,
        cpu_us_per_request: total * 1e6 / requests.max(1) as f64,
        cpu_s,
        loadgen_cpu_s,
    });
    let largest = cores.counts.iter().copied().max().unwrap_or(1);
    if round == 1 && (n == 1 || n == largest) {
        let one = loadgen::run_on(
            &sys.url,
            &HELLO,
            &mix,
            &Load::Closed { concurrency: 1 },
            settings.warmup,
            settings.point,
            &lg_cpus[..1.min(lg_cpus.len())],
        )?;
        say(&format!(
            "  one client: p50 {:.0} us, p99 {:.0} us",
            one.latency.p50_us, one.latency.p99_us
        ));
        cores.one_client.push(OneClient {
            system: system.to_owned(),
            cores: n,
            p50_us: one.latency.p50_us,
            p99_us: one.latency.p99_us,
            requests: one.requests,
            errors: one.errors + one.wrong,
        });
    }
    if system == ZEROHOP && n == largest && round == cores.rounds {
        rate_points(&sys, n, settings, lg_cpus, cores, say)?;
    }
    sys.stop();
    Ok(())
}

/// zerohop at [`RATE_FRACTIONS`] of its peak on `n` cores (the mean of its closed-loop
/// rounds there), open loop over as many connections as the closed loop.
fn rate_points(
    sys: &RunningSystem,
    n: usize,
    settings: &Settings,
    lg_cpus: &[usize],
    cores: &mut Cores,
    say: &mut dyn FnMut(&str),
) -> Result<()> {
    let peaks: Vec<f64> = cores
        .runs
        .iter()
        .filter(|r| r.system == ZEROHOP && r.cores == n)
        .map(|r| r.rps)
        .collect();
    let peak = peaks.iter().sum::<f64>() / peaks.len().max(1) as f64;
    if peak <= 0.0 {
        bail!("zerohop answered nothing on {n} cores: no peak to take fractions of");
    }
    for fraction in RATE_FRACTIONS {
        let rate = (peak * fraction).max(10.0);
        say(&format!(
            "zerohop-ring on {n} core(s), open loop at {:.0}% of its peak: {rate:.0}/s",
            fraction * 100.0
        ));
        let before = on_cpu(sys);
        let r = loadgen::run_on(
            &sys.url,
            &HELLO,
            &BodyMix::Fixed(100),
            &Load::Open {
                rate,
                connections: CONNECTIONS_PER_CORE * n,
            },
            settings.warmup,
            settings.point,
            lg_cpus,
        )?;
        let cpu = used(&before, &on_cpu(sys));
        // The CPU covers the warm-up too: count its answers at the same rate.
        let span = (settings.warmup + settings.point).as_secs_f64() / settings.point.as_secs_f64();
        let answers = (r.requests as f64 * span).max(1.0);
        let gateway = cpu.get("gateway").copied().unwrap_or(0.0);
        let system: f64 = cpu.values().sum();
        say(&format!(
            "  {:.0} req/s, gateway {:.1} us and system {:.1} us CPU per request",
            r.rps,
            gateway * 1e6 / answers,
            system * 1e6 / answers
        ));
        cores.rates.push(RatePoint {
            fraction,
            rate,
            rps: r.rps,
            errors: r.errors + r.wrong,
            p50_us: r.latency.p50_us,
            p99_us: r.latency.p99_us,
            gateway_cpu_us_per_request: gateway * 1e6 / answers,
            system_cpu_us_per_request: system * 1e6 / answers,
        });
    }
    Ok(())
}

/// On-CPU nanoseconds of every living thread of each component, by component name.
fn on_cpu(sys: &RunningSystem) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for c in &sys.components {
        let ns = ProcessId::of(c.pid)
            .map(|p| SchedStat::threads_of(&[p]).run_ns)
            .unwrap_or(0);
        *out.entry(c.name.clone()).or_insert(0) += ns;
    }
    out
}

/// Seconds each component ran from `before` to `after`.
fn used(before: &BTreeMap<String, u64>, after: &BTreeMap<String, u64>) -> BTreeMap<String, f64> {
    after
        .iter()
        .map(|(k, &a)| {
            let b = before.get(k).copied().unwrap_or(0);
            (k.clone(), a.saturating_sub(b) as f64 / 1e9)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_double_up_to_n_and_a_machine_without_2n_cpus_is_refused() {
        assert_eq!(plan(Some(1), 2), Ok(vec![1]));
        assert_eq!(plan(Some(4), 8), Ok(vec![1, 2, 4]));
        assert_eq!(plan(Some(8), 16), Ok(vec![1, 2, 4, 8]));
        assert_eq!(plan(Some(6), 12), Ok(vec![1, 2, 4, 6]));
        assert_eq!(plan(Some(0), 64), Ok(vec![]));
        assert_eq!(
            plan(Some(2), 2),
            Err(
                "--cores 2 needs 4 CPUs (2 for each system, 2 for the load generator); this \
                 machine has 2"
                    .into()
            )
        );
        assert!(plan(Some(4), 7).is_err());
        assert!(plan(Some(usize::MAX), 64).is_err());
        // Without --cores: the largest of 1, 2, 4, 8 the machine holds twice.
        assert_eq!(plan(None, 1), Ok(vec![]));
        assert_eq!(plan(None, 2), Ok(vec![1]));
        assert_eq!(plan(None, 3), Ok(vec![1]));
        assert_eq!(plan(None, 4), Ok(vec![1, 2]));
        assert_eq!(plan(None, 12), Ok(vec![1, 2, 4]));
        assert_eq!(plan(None, 64), Ok(vec![1, 2, 4, 8]));
    }

    #[test]
    fn cpu_lists_are_what_taskset_takes() {
        assert_eq!(cpu_list(&[0]), "0");
        assert_eq!(cpu_list(&[0, 1, 2, 3]), "0-3");
        assert_eq!(cpu_list(&[8, 9]), "8-9");
        assert_eq!(cpu_list(&[]), "");
    }
}
