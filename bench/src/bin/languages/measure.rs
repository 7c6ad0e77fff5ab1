//! Measuring one language's chain: the closed-loop points on `/one` and `/chain`, its idle
//! CPU and memory, and the ratios to Rust's.

use std::path::Path;
use std::time::Duration;

use anyhow::{anyhow, ensure, Result};
use serde::Serialize;
use zerohop_bench::loadgen::{self, BodyMix, Load, RunResult};
use zerohop_bench::percentile::median;
use zerohop_bench::procstat::memory::{Rollup, Status as ProcStatus};
use zerohop_bench::procstat::{ticks_to_seconds, ProcessId, SchedStat, TickSample};
use zerohop_bench::Step;

use crate::chain::Chain;
use crate::language::Language;
use crate::prepare::{Function, Paths};
use crate::spec::spec;

/// Quiet time before the idle window: the instances' spin-before-sleep and the last
/// connection's close are over by then.
pub(crate) const SETTLE: Duration = Duration::from_millis(500);

/// Connections of the load generator: one, so a point's latency is a request's path alone.
pub(crate) const CONCURRENCY: usize = 1;

/// One round of one route.
#[derive(Serialize, Debug, Clone, Copy)]
pub(crate) struct Round {
    pub(crate) p50_us: f64,
    pub(crate) mean_us: f64,
    pub(crate) p99_us: f64,
    pub(crate) rps: f64,
    pub(crate) requests: u64,
    /// CPU seconds of the route's function instances over the round.
    pub(crate) fn_cpu_s: f64,
    /// CPU seconds of the `zerohop up` process (gateway thread and agent) over the round.
    pub(crate) zerohop_cpu_s: f64,
}

/// One route of one language over every round.
#[derive(Serialize, Debug)]
pub(crate) struct Point {
    /// Functions the route runs through.
    pub(crate) functions: usize,
    /// Medians over the rounds of each round's p50, mean and p99.
    pub(crate) p50_us: f64,
    pub(crate) mean_us: f64,
    pub(crate) p99_us: f64,
    /// Correct answers per measured second, all rounds.
    pub(crate) rps: f64,
    pub(crate) requests: u64,
    pub(crate) errors: u64,
    pub(crate) wrong: u64,
    pub(crate) first_error: Option<String>,
    /// CPU of the route's function instances (all of them together) per request.
    pub(crate) fn_cpu_us_per_request: f64,
    /// CPU of the `zerohop up` process per request.
    pub(crate) zerohop_cpu_us_per_request: f64,
    pub(crate) rounds: Vec<Round>,
}

/// The K instances with no traffic.
#[derive(Serialize, Debug)]
pub(crate) struct Idle {
    pub(crate) seconds: f64,
    pub(crate) instances: usize,
    /// CPU of all K instances from `/proc/PID/stat` (clock ticks), milliseconds per second.
    pub(crate) cpu_ms_per_s: f64,
    /// The same from the threads' `schedstat` (nanoseconds), microseconds per second.
    pub(crate) sched_cpu_us_per_s: f64,
    /// Times any of their threads was switched in, per second.
    pub(crate) wakeups_per_s: f64,
}

/// What an [`Idle`] is the difference of: the K instances' counters at one moment.
pub(crate) struct IdleCounters {
    /// CPU clock ticks of each (`/proc/PID/stat`).
    pub(crate) ticks: TickSample,
    /// On-CPU nanoseconds and switches-in of their threads together (`schedstat`).
    pub(crate) sched: SchedStat,
}

impl Idle {
    /// The idle window of `instances` instances from the counters at its ends.
    pub(crate) fn between(
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
pub(crate) struct Memory {
    pub(crate) pid: u32,
    pub(crate) vm_rss_kib: u64,
    pub(crate) rss_anon_kib: u64,
    pub(crate) rss_file_kib: u64,
    /// Of `VmRSS`, the chain's shared memory (pool, rings) this instance touched.
    pub(crate) rss_shmem_kib: u64,
    /// From `smaps_rollup`, when readable.
    pub(crate) pss_kib: Option<u64>,
    pub(crate) private_kib: Option<u64>,
    pub(crate) threads: u64,
}

/// What one language measured.
#[derive(Serialize, Debug)]
pub(crate) struct Measured {
    pub(crate) one: Point,
    pub(crate) chain: Point,
    /// (p50(K) - p50(1)) / (K - 1), from the medians over the rounds.
    pub(crate) per_hop_p50_us: f64,
    /// The same with the means.
    pub(crate) per_hop_mean_us: f64,
    /// The same for each round (paired: the two points of one round).
    pub(crate) per_hop_p50_rounds_us: Vec<f64>,
    /// CPU of the K instances per request of `/chain`, divided by K.
    pub(crate) fn_cpu_us_per_hop: f64,
    pub(crate) idle: Idle,
    pub(crate) memory: Memory,
}

/// A language over Rust, from the same run.
#[derive(Serialize, Debug, Default)]
pub(crate) struct Ratios {
    pub(crate) per_hop_p50: Option<f64>,
    pub(crate) per_hop_mean: Option<f64>,
    pub(crate) fn_cpu_per_hop: Option<f64>,
    pub(crate) idle_rss: Option<f64>,
}

pub(crate) struct Plan {
    /// The chain's CPU when pinned (the load generator is on CPU 0).
    pub(crate) chain_cpu: Option<usize>,
    pub(crate) hops: usize,
    pub(crate) seconds: f64,
    pub(crate) rounds: usize,
    pub(crate) idle_seconds: f64,
    pub(crate) body: usize,
    pub(crate) warmup: f64,
}

pub(crate) fn memory(pid: u32) -> Result<Memory> {
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
pub(crate) fn point(functions: usize, runs: &[(RunResult, Round)]) -> Point {
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
pub(crate) struct Up {
    pub(crate) language: Language,
    /// `zerohop up` (gateway thread and agent) and all it started.
    pub(crate) chain: Chain,
    /// The `zerohop up` process.
    pub(crate) zerohop: ProcessId,
    /// The instances of `p1` .. `pK`.
    pub(crate) fns: Vec<ProcessId>,
    pub(crate) one: Vec<(RunResult, Round)>,
    pub(crate) long: Vec<(RunResult, Round)>,
    /// Wrong or failed answers, instances that did not live through the run.
    pub(crate) errors: Vec<String>,
}

impl Up {
    /// Brings `language`'s chain up and warms both routes (not recorded: first requests,
    /// the interpreters' and JITs' first passes).
    pub(crate) fn start(
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

    pub(crate) fn url(&self, long: bool) -> String {
        format!("{}/{}", self.chain.url, if long { "chain" } else { "one" })
    }

    /// The instances of the route.
    pub(crate) fn instances(&self, long: bool) -> &[ProcessId] {
        if long {
            &self.fns
        } else {
            &self.fns[..1]
        }
    }

    pub(crate) fn load(&self, long: bool, plan: &Plan, seconds: f64) -> Result<RunResult> {
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
    pub(crate) fn point(&mut self, long: bool, plan: &Plan) -> Result<()> {
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
    pub(crate) fn idle_counters(&self) -> IdleCounters {
        IdleCounters {
            ticks: TickSample::take(&self.fns),
            sched: SchedStat::threads_of(&self.fns),
        }
    }

    /// Folds what was measured; stops the chain.
    pub(crate) fn finish(mut self, idle: Idle) -> Result<(Measured, Vec<String>)> {
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

pub(crate) fn ratios(m: &Measured, rust: &Measured) -> Ratios {
    let over = |a: f64, b: f64| (b > 0.0).then(|| a / b);
    Ratios {
        per_hop_p50: over(m.per_hop_p50_us, rust.per_hop_p50_us),
        per_hop_mean: over(m.per_hop_mean_us, rust.per_hop_mean_us),
        fn_cpu_per_hop: over(m.fn_cpu_us_per_hop, rust.fn_cpu_us_per_hop),
        idle_rss: over(m.memory.vm_rss_kib as f64, rust.memory.vm_rss_kib as f64),
    }
}
