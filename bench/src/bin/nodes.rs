//! `zerohop-bench-nodes`: the benchmark's inter-node point. Two network namespaces joined by
//! a veth pair stand for two nodes; the hello chain (`upper` then `exclaim`) runs three ways,
//! one after the other, each loaded from node A:
//!
//! * `one-node`: the whole chain on node A (`zerohop agent`, `zerohop apply`);
//! * `split`: `upper` on A, `exclaim` on B, the hop between them over the daemons' peer
//!   connection (`zerohop apply --here ... --peer ...`);
//! * `http-chain`: the HTTP microservice chain across the same two nodes (a
//!   `zerohop-bench-fn` per function, `upper` on A POSTing to `exclaim` on B).
//!
//! Per system: p50/p99 at one client, requests/s at 32 clients, and CPU per request (every
//! process of the system, from `/proc`), with ratios to `one-node`. Needs root (`ip netns`).
//! `zerohop-bench-nodes [--seconds N] [--out DIR]`; writes `DIR/nodes.json` and prints a
//! Markdown table.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use zerohop_bench::loadgen::{run, BodyMix, Load, RunResult};
use zerohop_bench::procstat::{ticks_per_second, tree_ticks};
use zerohop_bench::HELLO;
use zerohop_bench::{bin_dir, need_bin, wait_line};
use zerohop_test_support::{ChildGuard, TempDir};

/// A binary of this build (beside this one, in `target/release`), or an error saying how to
/// build it.
fn target_bin(name: &str) -> Result<PathBuf> {
    need_bin(&bin_dir(None)?, name)
}

/// Starts `cmd` with its standard error in `log` and waits for the stdout line with `marker`
/// (the rest of its output is drained).
fn spawn_ready(mut cmd: Command, log: &Path, marker: &str) -> Result<ChildGuard> {
    let mut child = ChildGuard::new(
        cmd.stdout(Stdio::piped())
            .stderr(std::fs::File::create(log)?)
            .spawn()
            .with_context(|| format!("starting {cmd:?}"))?,
    );
    let stdout = child.child_mut().stdout.take().context("piped stdout")?;
    wait_line(stdout, marker, Duration::from_secs(20)).map_err(|e| {
        anyhow::anyhow!(
            "{cmd:?} printed no {marker:?} line ({e}); see {}",
            log.display()
        )
    })?;
    Ok(child)
}

/// The two nodes.
struct Net {
    a: String,
    b: String,
    ip_a: String,
    ip_b: String,
}

impl Net {
    fn create() -> Result<Net> {
        let tag = std::process::id() % 10_000;
        let sub = 1 + std::process::id() % 250;
        let net = Net {
            a: format!("zhna{tag}"),
            b: format!("zhnb{tag}"),
            ip_a: format!("10.249.{sub}.1"),
            ip_b: format!("10.249.{sub}.2"),
        };
        let (va, vb) = (format!("zva{tag}"), format!("zvb{tag}"));
        let steps: Vec<Vec<String>> = vec![
            vec!["netns".into(), "add".into(), net.a.clone()],
            vec!["netns".into(), "add".into(), net.b.clone()],
            vec![
                "link".into(),
                "add".into(),
                va.clone(),
                "netns".into(),
                net.a.clone(),
                "type".into(),
                "veth".into(),
                "peer".into(),
                "name".into(),
                vb.clone(),
                "netns".into(),
                net.b.clone(),
            ],
        ];
        for s in &steps {
            ip(s)?;
        }
        for (ns, dev, addr) in [(&net.a, &va, &net.ip_a), (&net.b, &vb, &net.ip_b)] {
            ip(&["-n", ns, "addr", "add", &format!("{addr}/24"), "dev", dev])?;
            ip(&["-n", ns, "link", "set", dev, "up"])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
        }
        Ok(net)
    }

    /// `program args` inside namespace `ns`.
    fn command(ns: &str, program: &Path) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", ns]).arg(program);
        c
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for ns in [&self.a, &self.b] {
            let _ = Command::new("ip")
                .args(["netns", "del", ns])
                .stderr(Stdio::null())
                .status();
        }
    }
}

fn ip<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> Result<()> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .context("running `ip` (iproute2)")?;
    if !out.status.success() {
        bail!(
            "ip {}: {}",
            args.iter()
                .map(|a| a.as_ref().to_string_lossy().into_owned())
                .collect::<Vec<_>>()
                .join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// One system while it runs: its processes (stopped on drop) and where to send requests.
struct System {
    name: &'static str,
    url: String,
    children: Vec<ChildGuard>,
}

impl System {
    fn cpu_ticks(&self) -> u64 {
        self.children.iter().map(|c| tree_ticks(c.pid())).sum()
    }
}

fn spec(dir: &Path) -> Result<PathBuf> {
    let path = dir.join("hello.yaml");
    let text = format!(
        "name: hello\ntimeout: 10s\ngateway_threads: 1\nfunctions:\n  upper: {{ command: [{}], concurrency: 8 }}\n  exclaim: {{ command: [{}], concurrency: 8 }}\nroutes:\n  - http: POST /hello\n    sequence: [upper, exclaim]\n",
        target_bin("upper")?.display(),
        target_bin("exclaim")?.display()
    );
    std::fs::write(&path, text)?;
    Ok(path)
}

fn agent(net_ns: &str, dir: &Path, name: &str, peer: Option<&str>) -> Result<ChildGuard> {
    let mut c = Net::command(net_ns, &target_bin("zerohop")?);
    c.arg("agent")
        .arg("--socket")
        .arg(dir.join(format!("{name}.sock")))
        .args(["--metrics", "none"]);
    if let Some(addr) = peer {
        c.arg("--peer-secret")
            .arg(dir.join("secret"))
            .args(["--peer-listen", addr]);
    }
    spawn_ready(c, &dir.join(format!("{name}.log")), "daemon ready")
}

fn apply(dir: &Path, name: &str, spec: &Path, extra: &[String]) -> Result<()> {
    let out = Command::new(target_bin("zerohop")?)
        .arg("apply")
        .arg(spec)
        .arg("--socket")
        .arg(dir.join(format!("{name}.sock")))
        .args(extra)
        .output()?;
    if !out.status.success() {
        bail!(
            "zerohop apply on {name}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

fn one_node(net: &Net, dir: &Path) -> Result<System> {
    let a = agent(&net.a, dir, "one", None)?;
    let listen = format!("{}:18080", net.ip_a);
    apply(
        dir,
        "one",
        &spec(dir)?,
        &["--listen".into(), listen.clone()],
    )?;
    Ok(System {
        name: "one-node",
        url: format!("http://{listen}/hello"),
        children: vec![a],
    })
}

fn split(net: &Net, dir: &Path) -> Result<System> {
    std::fs::write(dir.join("secret"), "the benchmark's shared secret\n")?;
    let (pa, pb) = (format!("{}:7090", net.ip_a), format!("{}:7090", net.ip_b));
    let a = agent(&net.a, dir, "a", Some(&pa))?;
    let b = agent(&net.b, dir, "b", Some(&pb))?;
    let spec = spec(dir)?;
    apply(
        dir,
        "b",
        &spec,
        &[
            "--here".into(),
            "exclaim".into(),
            "--peer".into(),
            format!("upper={pa}"),
        ],
    )?;
    let listen = format!("{}:18081", net.ip_a);
    apply(
        dir,
        "a",
        &spec,
        &[
            "--listen".into(),
            listen.clone(),
            "--here".into(),
            "upper".into(),
            "--peer".into(),
            format!("exclaim={pb}"),
        ],
    )?;
    Ok(System {
        name: "split",
        url: format!("http://{listen}/hello"),
        children: vec![a, b],
    })
}

fn http_chain(net: &Net, dir: &Path) -> Result<System> {
    let start = |ns: &str, listen: &str, step: &str, next: Option<&str>| -> Result<ChildGuard> {
        let mut c = Net::command(ns, &target_bin("zerohop-bench-fn")?);
        c.args(["--listen", listen, "--steps", step]);
        if let Some(n) = next {
            c.args(["--next", n]);
        }
        spawn_ready(c, &dir.join(format!("fn-{step}.log")), "listening on")
    };
    let b = start(&net.b, &format!("{}:18082", net.ip_b), "exclaim", None)?;
    let next = format!("http://{}:18082/hello", net.ip_b);
    let listen = format!("{}:18083", net.ip_a);
    let a = start(&net.a, &listen, "upper", Some(&next))?;
    Ok(System {
        name: "http-chain",
        url: format!("http://{listen}/hello"),
        children: vec![a, b],
    })
}

#[derive(serde::Serialize)]
struct Point {
    system: &'static str,
    p50_us: f64,
    p99_us: f64,
    rps: f64,
    cpu_us_per_request: f64,
    latency_run: RunResult,
    throughput_run: RunResult,
}

fn measure(s: &System, seconds: f64) -> Result<Point> {
    let load = |c: usize| {
        run(
            &s.url,
            &HELLO,
            &BodyMix::Fixed(100),
            &Load::Closed { concurrency: c },
            Duration::from_millis(500),
            Duration::from_secs_f64(seconds),
        )
    };
    let one = load(1)?;
    let before = s.cpu_ticks();
    let many = load(32)?;
    let ticks = s.cpu_ticks().saturating_sub(before);
    for r in [&one, &many] {
        if r.errors > 0 || r.wrong > 0 || r.requests == 0 {
            bail!(
                "{}: {} requests, {} errors, {} wrong answers (first: {:?})",
                s.name,
                r.requests,
                r.errors,
                r.wrong,
                r.first_error
            );
        }
    }
    let cpu_us = ticks as f64 / ticks_per_second() as f64 * 1e6 / many.requests as f64;
    eprintln!(
        "zerohop-bench-nodes: {:<10} p50 {:>7.1} us  p99 {:>7.1} us  {:>8.0} requests/s  {:>6.1} us CPU/request",
        s.name, one.latency.p50_us, one.latency.p99_us, many.rps, cpu_us
    );
    Ok(Point {
        system: s.name,
        p50_us: one.latency.p50_us,
        p99_us: one.latency.p99_us,
        rps: many.rps,
        cpu_us_per_request: cpu_us,
        latency_run: one,
        throughput_run: many,
    })
}

fn main() -> Result<()> {
    let mut seconds = 5.0;
    let mut out = PathBuf::from("target/bench-nodes");
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--seconds" => {
                seconds = args
                    .next()
                    .and_then(|s| s.parse().ok())
                    .context("--seconds N")?
            }
            "--out" => out = args.next().context("--out DIR")?.into(),
            _ => bail!("usage: zerohop-bench-nodes [--seconds N] [--out DIR]"),
        }
    }
    let net = Net::create().context("creating the two nodes (needs root and iproute2)")?;
    // The load generator runs on node A (this thread's sockets are made there).
    let ns = std::fs::File::open(format!("/run/netns/{}", net.a)).context("node A's namespace")?;
    nix::sched::setns(ns, nix::sched::CloneFlags::CLONE_NEWNET).context("entering node A")?;
    let dir = TempDir::new("bench-nodes");
    let mut points = Vec::new();
    type Start = fn(&Net, &Path) -> Result<System>;
    for start in [one_node as Start, split, http_chain] {
        let system = start(&net, dir.path())?;
        points.push(measure(&system, seconds)?);
        drop(system);
        std::thread::sleep(Duration::from_millis(300));
    }
    let base = &points[0];
    let mut table = String::from(
        "| system | p50 (c=1) | p99 (c=1) | requests/s (c=32) | CPU per request |\n|---|---|---|---|---|\n",
    );
    for p in &points {
        table.push_str(&format!(
            "| {} | {:.0} µs ({:.2}x) | {:.0} µs ({:.2}x) | {:.0} ({:.2}x) | {:.1} µs ({:.2}x) |\n",
            p.system,
            p.p50_us,
            p.p50_us / base.p50_us,
            p.p99_us,
            p.p99_us / base.p99_us,
            p.rps,
            p.rps / base.rps,
            p.cpu_us_per_request,
            p.cpu_us_per_request / base.cpu_us_per_request
        ));
    }
    std::fs::create_dir_all(&out)?;
    std::fs::write(
        out.join("nodes.json"),
        serde_json::to_string_pretty(&serde_json::json!({
            "seconds": seconds,
            "points": points,
        }))?,
    )?;
    let mut stdout = std::io::stdout();
    writeln!(stdout, "{table}")?;
    Ok(())
}
