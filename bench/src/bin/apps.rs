//! `zerohop-bench-apps`: the applications of `apps/` on zerohop beside the same functions
//! deployed as HTTP microservices, in one run, reported as ratios.
//!
//! * **Online Boutique**: `zerohop up apps/boutique/chain.yaml` and `boutique-http` (one
//!   process per service, keep-alive HTTP between them), each driven by `boutique-load`
//!   (the original load generator's task mix, every answer checked) at the same number of
//!   users: requests per second, p50/p99, and CPU per request of the deployment (every
//!   process of it, from `/proc`; the load generator not included).
//! * **Online Boutique with Locust**: the original `locustfile.py`, unchanged, run by real
//!   Locust (installed into `target/locust-venv` when missing) against both deployments:
//!   requests per second, p50/p99, failures and CPU per request.
//! * **IoT motion**: `zerohop up apps/motion/chain.yaml` (the gateway is the devices' MQTT
//!   broker) and the baseline `motion-http up` (sensor and actuator HTTP servers behind an
//!   MQTT adapter at a `mosquitto` broker), each replaying the same synthesised trace with
//!   `motion-gen`: response time p50/p99 (publish to light command) and CPU of the
//!   deployment over the whole replay, idle gaps included.
//!
//! `--quick` shortens every run; `--out DIR` (default `results`) receives `apps.md` and
//! `apps.json`. Exits 1 when a run had errors or wrong answers, 2 when it could not run.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use serde_json::{json, Value};
use zerohop_bench::procstat::tree_ticks;
use zerohop_test_support::{free_port, listener_in, ticks_per_second};

/// A process of a deployment: SIGTERM on drop (its own children go with it), then SIGKILL.
struct Proc {
    child: Child,
    name: String,
}

impl Proc {
    fn start(name: &str, cmd: &mut Command) -> Result<(Self, std::process::ChildStdout)> {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {name}"))?;
        let out = child.stdout.take().context("stdout")?;
        Ok((
            Self {
                child,
                name: name.to_owned(),
            },
            out,
        ))
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        zerohop_bench::stop_child(
            &mut self.child,
            &format!("zerohop-bench-apps: {}", self.name),
        );
    }
}

/// The first line of `out` with `marker`, waiting at most `timeout`.
fn wait_line(out: std::process::ChildStdout, marker: &str, timeout: Duration) -> Result<String> {
    zerohop_bench::wait_line(out, marker, timeout)
        .map_err(|_| anyhow!("no line with {:?} within {timeout:?}", "ready"))
}

/// The address after `scheme` on a line (`... http://A, mqtt://B (...)`).
fn address(line: &str, scheme: &str) -> Result<String> {
    listener_in(line, scheme).ok_or_else(|| anyhow!("no {scheme} address in {line:?}"))
}

/// Where Debian's mosquitto package puts the broker.
const MOSQUITTO: &str = "/usr/sbin/mosquitto";

struct Ctx {
    root: PathBuf,
    bin: PathBuf,
    quick: bool,
    scratch: PathBuf,
}

impl Ctx {
    fn bin(&self, name: &str) -> Result<PathBuf> {
        zerohop_bench::need_bin(&self.bin, name)
    }
}

/// The Boutique on zerohop (`zerohop up apps/boutique/chain.yaml`) and its URL.
fn start_zerohop(cx: &Ctx) -> Result<(Proc, String)> {
    let (p, out) = Proc::start(
        "zerohop up apps/boutique/chain.yaml",
        Command::new(cx.bin("zerohop")?)
            .arg("up")
            .arg(cx.root.join("apps/boutique/chain.yaml"))
            .args(["--listen", "127.0.0.1:0"])
            .stderr(Stdio::null()),
    )?;
    let line = wait_line(out, "ready at", Duration::from_secs(60))?;
    Ok((p, format!("http://{}", address(&line, "http://")?)))
}

/// The Boutique as HTTP microservices (`boutique-http`) and its frontend's URL.
fn start_http(cx: &Ctx) -> Result<(Proc, String)> {
    let (p, out) = Proc::start(
        "boutique-http",
        Command::new(cx.bin("boutique-http")?)
            .args(["--listen", "127.0.0.1:0"])
            .stderr(Stdio::null()),
    )?;
    let line = wait_line(out, "frontend at", Duration::from_secs(60))?;
    Ok((p, format!("http://{}", address(&line, "http://")?)))
}

/// One boutique-load run against `url` with `users`; the deployment's CPU over the run.
fn boutique_run(cx: &Ctx, url: &str, users: usize, root_pid: u32) -> Result<Value> {
    let seconds = if cx.quick { 5 } else { 15 };
    let load = cx.bin("boutique-load")?;
    // Warm up (connections, caches), not measured.
    let warm = Command::new(&load)
        .args(["--url", url, "--duration", "2s", "--concurrency"])
        .arg(users.to_string())
        .args(["--seed", "7", "--json"])
        .stdout(Stdio::null())
        .status()?;
    if !warm.success() {
        bail!("boutique-load warm-up against {url} failed ({warm})");
    }
    let before = tree_ticks(root_pid);
    let out = Command::new(&load)
        .args([
            "--url",
            url,
            "--duration",
            &format!("{seconds}s"),
            "--concurrency",
        ])
        .arg(users.to_string())
        .args(["--seed", "1", "--json"])
        .output()?;
    let cpu_s = tree_ticks(root_pid).saturating_sub(before) as f64 / ticks_per_second();
    let mut report: Value = serde_json::from_slice(&out.stdout).with_context(|| {
        format!(
            "boutique-load printed no JSON: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })?;
    let requests = report["requests"].as_f64().unwrap_or(0.0);
    report["cpu_s"] = json!(cpu_s);
    report["cpu_ms_per_request"] = json!(if requests > 0.0 {
        cpu_s * 1000.0 / requests
    } else {
        0.0
    });
    report.as_object_mut().map(|o| o.remove("routes"));
    Ok(report)
}

/// One run of the original `locustfile.py` with real Locust against `url`: its request
/// rate and times, failures, and the deployment's CPU per request over the run. Locust's
/// users think 1 to 10 s between tasks, so this is the original's realism, not a
/// throughput test (that is `boutique-load`'s).
fn locust_run(cx: &Ctx, locust: &Path, url: &str, root_pid: u32) -> Result<Value> {
    let (users, seconds) = if cx.quick { (20, 10) } else { (100, 30) };
    let before = tree_ticks(root_pid);
    let run = zerohop_test_support::locust::run(
        locust,
        &cx.root.join("apps/boutique/locust/locustfile.py"),
        url,
        users,
        users.div_ceil(2),
        seconds,
    )
    .map_err(|e| anyhow!(e))?;
    let cpu_s = tree_ticks(root_pid).saturating_sub(before) as f64 / ticks_per_second();
    let total = run
        .total()
        .ok_or_else(|| anyhow!("Locust's stats have no Aggregated line"))?;
    let per_request = if total.requests > 0 {
        cpu_s * 1000.0 / total.requests as f64
    } else {
        0.0
    };
    Ok(json!({
        "users": users,
        "seconds": seconds,
        "requests": total.requests,
        "errors": total.failures,
        "exit_code": run.code,
        "rps": total.rps,
        "p50_ms": total.p50_ms,
        "p99_ms": total.p99_ms,
        "cpu_s": cpu_s,
        "cpu_ms_per_request": per_request,
    }))
}

/// The original locustfile against both deployments, one after the other.
fn boutique_locust(cx: &Ctx) -> Result<Value> {
    eprintln!("zerohop-bench-apps: boutique, Locust (installing it into target/ if missing)");
    let locust = zerohop_test_support::locust::venv(&cx.root).map_err(|e| anyhow!(e))?;
    eprintln!("zerohop-bench-apps: boutique, Locust: zerohop");
    let zerohop = {
        let (p, url) = start_zerohop(cx)?;
        locust_run(cx, &locust, &url, p.pid())?
    };
    eprintln!("zerohop-bench-apps: boutique, Locust: HTTP microservices");
    let http = {
        let (p, url) = start_http(cx)?;
        locust_run(cx, &locust, &url, p.pid())?
    };
    Ok(json!({ "zerohop": zerohop, "http": http }))
}

fn boutique(cx: &Ctx) -> Result<Value> {
    let users: &[usize] = if cx.quick { &[16] } else { &[4, 16, 64] };
    let mut rows = Vec::new();
    for &n in users {
        eprintln!("zerohop-bench-apps: boutique, {n} users: zerohop");
        let zerohop = {
            let (p, url) = start_zerohop(cx)?;
            boutique_run(cx, &url, n, p.pid())?
        };
        eprintln!("zerohop-bench-apps: boutique, {n} users: HTTP microservices");
        let http = {
            let (p, url) = start_http(cx)?;
            boutique_run(cx, &url, n, p.pid())?
        };
        rows.push(json!({ "users": n, "zerohop": zerohop, "http": http }));
    }
    Ok(Value::Array(rows))
}

/// Trace parameters of the motion runs: the same for both deployments.
fn trace_args(cx: &Ctx) -> Vec<String> {
    // Trace seconds replayed `scale` times faster; bursts and idle gaps shortened so a short
    // replay still holds several of each.
    let (duration, sensors) = if cx.quick {
        ("600", "16")
    } else {
        ("1800", "32")
    };
    [
        "--duration",
        duration,
        "--scale",
        "20",
        "--sensors",
        sensors,
        "--mean-idle",
        "120",
        "--seed",
        "3",
        "--drain",
        "10",
        "--json",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

fn motion_gen(cx: &Ctx, broker: &str, pids: &[u32]) -> Result<Value> {
    let mut cmd = Command::new(cx.bin("motion-gen")?);
    cmd.args(["--mqtt", broker]).args(trace_args(cx));
    for p in pids {
        cmd.args(["--cpu-pid", &p.to_string()]);
    }
    let out = cmd.output().context("running motion-gen")?;
    let mut report: Value = serde_json::from_slice(&out.stdout).with_context(|| {
        format!(
            "motion-gen printed no JSON: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })?;
    report.as_object_mut().map(|o| o.remove("samples"));
    Ok(report)
}

fn motion(cx: &Ctx) -> Result<Value> {
    eprintln!("zerohop-bench-apps: motion trace: zerohop");
    let zerohop = {
        let (p, out) = Proc::start(
            "zerohop up apps/motion/chain.yaml",
            Command::new(cx.bin("zerohop")?)
                .arg("up")
                .arg(cx.root.join("apps/motion/chain.yaml"))
                .args(["--listen", "127.0.0.1:0", "--mqtt", "127.0.0.1:0"])
                .stderr(Stdio::null()),
        )?;
        let line = wait_line(out, "ready at", Duration::from_secs(60))?;
        let broker = address(&line, "mqtt://")?;
        let r = motion_gen(cx, &broker, &[p.pid()])?;
        drop(p);
        r
    };
    eprintln!("zerohop-bench-apps: motion trace: mosquitto + adapter + HTTP microservices");
    let http = {
        let port = free_port();
        let conf = cx.scratch.join("mosquitto.conf");
        std::fs::write(
            &conf,
            // Without TCP_NODELAY (off by default) every publish waits out Nagle's delay.
            format!(
                "listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n\
                 set_tcp_nodelay true\n"
            ),
        )?;
        // Debian installs it outside a user's PATH.
        let mosquitto = if Path::new(MOSQUITTO).is_file() {
            MOSQUITTO
        } else {
            "mosquitto"
        };
        let (broker, _) = Proc::start(
            "mosquitto",
            Command::new(mosquitto)
                .arg("-c")
                .arg(&conf)
                .stderr(Stdio::null()),
        )?;
        let addr = format!("127.0.0.1:{port}");
        let up = Instant::now();
        while std::net::TcpStream::connect(&addr).is_err() {
            if up.elapsed() > Duration::from_secs(10) {
                bail!("mosquitto did not listen on {addr} within 10 s (is it installed?)");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let (p, out) = Proc::start(
            "motion-http up",
            Command::new(cx.bin("motion-http")?)
                .args(["up", "--broker", &addr])
                .stderr(Stdio::null()),
        )?;
        wait_line(out, "ready", Duration::from_secs(60))?;
        let r = motion_gen(cx, &addr, &[p.pid(), broker.pid()])?;
        drop(p);
        drop(broker);
        r
    };
    Ok(json!({ "zerohop": zerohop, "http": http }))
}

fn num(v: &Value, k: &str) -> f64 {
    v[k].as_f64().unwrap_or(f64::NAN)
}

fn ratio(a: f64, b: f64) -> String {
    if b > 0.0 && a.is_finite() && b.is_finite() {
        format!("{:.2}", a / b)
    } else {
        "-".into()
    }
}

fn markdown(boutique: &Value, locust: &Value, motion: &Value) -> String {
    let mut s = String::from("# Applications: zerohop beside HTTP microservices\n\n");
    s.push_str(
        "## Online Boutique (boutique-load, the original's task mix)\n\n\
         | users | deployment | RPS | p50 (ms) | p99 (ms) | CPU ms / request | errors |\n\
         |---|---|---|---|---|---|---|\n",
    );
    for row in boutique.as_array().into_iter().flatten() {
        for (name, key) in [("zerohop", "zerohop"), ("HTTP microservices", "http")] {
            let r = &row[key];
            s.push_str(&format!(
                "| {} | {name} | {:.0} | {:.2} | {:.2} | {:.3} | {} |\n",
                row["users"],
                num(r, "rps"),
                num(r, "p50_us") / 1000.0,
                num(r, "p99_us") / 1000.0,
                num(r, "cpu_ms_per_request"),
                r["errors"]
            ));
        }
        let (z, h) = (&row["zerohop"], &row["http"]);
        s.push_str(&format!(
            "| {} | **zerohop / HTTP** | **{}** | **{}** | **{}** | **{}** | |\n",
            row["users"],
            ratio(num(z, "rps"), num(h, "rps")),
            ratio(num(z, "p50_us"), num(h, "p50_us")),
            ratio(num(z, "p99_us"), num(h, "p99_us")),
            ratio(num(z, "cpu_ms_per_request"), num(h, "cpu_ms_per_request")),
        ));
    }
    s.push_str(
        "\n## Online Boutique (the original locustfile, real Locust)\n\n\
         | deployment | users | requests | RPS | p50 (ms) | p99 (ms) | CPU ms / request | failures |\n\
         |---|---|---|---|---|---|---|---|\n",
    );
    for (name, key) in [("zerohop", "zerohop"), ("HTTP microservices", "http")] {
        let r = &locust[key];
        s.push_str(&format!(
            "| {name} | {} | {} | {:.1} | {:.0} | {:.0} | {:.3} | {} |\n",
            r["users"],
            r["requests"],
            num(r, "rps"),
            num(r, "p50_ms"),
            num(r, "p99_ms"),
            num(r, "cpu_ms_per_request"),
            r["errors"]
        ));
    }
    let (z, h) = (&locust["zerohop"], &locust["http"]);
    s.push_str(&format!(
        "\nzerohop / HTTP: p50 {}, p99 {}, CPU per request {} (Locust's times are whole \
         milliseconds; its users think 1 to 10 s between tasks).\n",
        ratio(num(z, "p50_ms"), num(h, "p50_ms")),
        ratio(num(z, "p99_ms"), num(h, "p99_ms")),
        ratio(num(z, "cpu_ms_per_request"), num(h, "cpu_ms_per_request")),
    ));
    s.push_str(
        "\n## IoT motion (motion-gen, the same synthesised trace)\n\n\
         | deployment | events | answered | wrong/missing | p50 (ms) | p99 (ms) | CPU s | CPU % |\n\
         |---|---|---|---|---|---|---|---|\n",
    );
    for (name, key) in [
        ("zerohop (gateway is the broker)", "zerohop"),
        ("mosquitto + adapter + HTTP", "http"),
    ] {
        let r = &motion[key];
        s.push_str(&format!(
            "| {name} | {} | {} | {}/{} | {:.2} | {:.2} | {:.2} | {:.1} |\n",
            r["events"],
            r["answered"],
            r["wrong"],
            r["missing"],
            num(r, "p50_ms"),
            num(r, "p99_ms"),
            num(r, "cpu_s"),
            num(r, "cpu_pct"),
        ));
    }
    let (z, h) = (&motion["zerohop"], &motion["http"]);
    s.push_str(&format!(
        "\nzerohop / baseline: p50 {}, p99 {}, CPU {}.\n",
        ratio(num(z, "p50_ms"), num(h, "p50_ms")),
        ratio(num(z, "p99_ms"), num(h, "p99_ms")),
        ratio(num(z, "cpu_s"), num(h, "cpu_s")),
    ));
    s
}

fn clean(v: &Value, errors: &[&str]) -> bool {
    errors.iter().all(|k| v[*k].as_u64().unwrap_or(0) == 0)
}

fn run() -> Result<bool> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (quick, out) = zerohop_bench::report_args(&args);
    let bin = std::env::current_exe()?
        .parent()
        .context("binary folder")?
        .to_owned();
    // target/release/ -> the checkout.
    let root = bin
        .ancestors()
        .find(|p| p.join("apps/boutique/chain.yaml").is_file())
        .map(Path::to_owned)
        .or_else(|| std::env::current_dir().ok())
        .context("the checkout (apps/ next to target/)")?;
    // Holds mosquitto's config only; removed when this returns.
    let scratch = tempfile::Builder::new()
        .prefix("zerohop-bench-apps-")
        .tempdir()?;
    std::fs::create_dir_all(&out)?;
    let cx = Ctx {
        root,
        bin,
        quick,
        scratch: scratch.path().to_owned(),
    };
    let boutique = boutique(&cx)?;
    let locust = boutique_locust(&cx)?;
    let motion = motion(&cx)?;
    zerohop_bench::report::publish(
        &out,
        "apps",
        &json!({ "boutique": boutique, "locust": locust, "motion": motion }),
        &markdown(&boutique, &locust, &motion),
        None,
    )?;
    let ok = boutique
        .as_array()
        .into_iter()
        .flatten()
        .all(|r| clean(&r["zerohop"], &["errors"]) && clean(&r["http"], &["errors"]))
        && ["zerohop", "http"].iter().all(|k| {
            clean(&motion[*k], &["wrong", "missing", "errors"])
                && clean(&locust[*k], &["errors"])
                && locust[*k]["exit_code"] == json!(0)
        });
    Ok(ok)
}

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("zerohop-bench-apps: some runs had errors; see the tables");
            ExitCode::from(1)
        }
        Err(e) => {
            eprintln!("zerohop-bench-apps: {e:#}");
            ExitCode::from(2)
        }
    }
}
