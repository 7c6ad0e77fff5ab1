//! One point: start the chain for one instance count, and measure its start, memory, idle
//! CPU, throughput and stop.

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use zerohop_bench::loadgen::{self, BodyMix, Load};
use zerohop_bench::passes;
use zerohop_bench::procstat::memory::meminfo_kib;
use zerohop_bench::procstat::{ticks_to_seconds, ProcessId as Proc, TickSample};
use zerohop_bench::systems::ZEROHOP_PATH;
use zerohop_test_support::{instances, wait_until};

use crate::memory::memory;
use crate::output::{Idle, LoadResult, Point, Startup};
use crate::processes::Chain;
use crate::spec::{spec, MAX_INSTANCES_PER_FUNCTION};
use crate::Args;

/// CPU ticks of the agent and of every instance now.
pub(crate) fn ticks(zerohop: Proc, instances: &[Proc]) -> (TickSample, TickSample) {
    (TickSample::take(&[zerohop]), TickSample::take(instances))
}

pub(crate) fn idle(zerohop: Proc, instances: &[Proc], seconds: f64) -> Idle {
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
pub(crate) fn run_point(args: &Args, bin_dir: &Path, root: &Path, point: &mut Point) -> Result<()> {
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
