//! The daemon commands: each asks the admin API and prints the answer for people (or as
//! JSON with `--json`).

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use http::Method;
use tokio::signal::unix::{signal, SignalKind};
use zerohop_agent::api::{
    Applied, ApplyRequest, ApplyResponse, ChainStatus, ChainSummary, DownResponse, FunctionStatus,
    InvokeRequest, InvokeResponse, LogEntry, ScaleRequest,
};
use zerohop_agent::daemon::{default_socket, DaemonOptions};
use zerohop_agent::logs::{escape, terminal_line};

use crate::client::Client;
use crate::DaemonArgs;

/// Output options.
#[derive(Clone, Copy)]
pub struct Out {
    json: bool,
}

/// Runs a daemon command on a small runtime; errors print one line and exit 1.
pub fn run<F, Fut>(args: &DaemonArgs, f: F) -> ExitCode
where
    F: FnOnce(Client, Out) -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    let socket = args.socket.clone().unwrap_or_else(default_socket);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    match runtime.block_on(f(Client::new(&socket), Out { json: args.json })) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("zerohop: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn print_json<T: serde::Serialize>(v: &T) -> Result<()> {
    let mut out = std::io::stdout().lock();
    serde_json::to_writer_pretty(&mut out, v)?;
    writeln!(out)?;
    Ok(())
}

/// `3h04m`, `5m02s`, `12s`.
fn age(s: u64) -> String {
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
    }
}

/// `n` bytes in the largest binary unit that keeps it whole-ish (`64 MiB`, `1.5 GiB`).
fn bytes(n: u64) -> String {
    const UNITS: [(u64, &str); 3] = [(1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")];
    for (size, unit) in UNITS {
        if n >= size {
            let v = n as f64 / size as f64;
            return if v.fract() == 0.0 {
                format!("{v:.0} {unit}")
            } else {
                format!("{v:.1} {unit}")
            };
        }
    }
    format!("{n} B")
}

/// Rows with columns padded to their widest cell.
fn table(rows: &[Vec<String>]) -> String {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..cols)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for r in rows {
        let mut line = String::new();
        for (c, cell) in r.iter().enumerate() {
            if c + 1 == r.len() {
                line.push_str(cell);
            } else {
                line.push_str(&format!("{cell:<w$}  ", w = widths[c]));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// Installs SIGTERM and SIGINT handlers now (so an early signal is not lost) and returns
/// what resolves at the first of them; `None` (said on stderr) if they cannot be installed.
pub fn stop_signal() -> Option<impl std::future::Future<Output = ()>> {
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        eprintln!("zerohop: cannot install signal handlers");
        return None;
    };
    Some(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    })
}

/// `zerohop agent`.
pub async fn agent(
    opts: DaemonOptions,
    node: Option<(Option<PathBuf>, zerohop_kube::node::NodeOptions)>,
) -> ExitCode {
    let Some(stop) = stop_signal() else {
        return ExitCode::FAILURE;
    };
    let result = match node {
        None => zerohop_agent::daemon::run(opts, stop).await,
        Some((kubeconfig, node)) => {
            let client = match zerohop_kube::client(kubeconfig.as_deref()).await {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("zerohop: {e}");
                    return ExitCode::FAILURE;
                }
            };
            zerohop_agent::daemon::run_with(opts, stop, move |daemon, stopping| {
                zerohop_kube::node::run(client, daemon, node, stopping)
            })
            .await
        }
    };
    match result {
        Ok(()) => {
            eprintln!("zerohop: daemon stopped");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("zerohop: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `zerohop controller`.
pub async fn controller(
    kubeconfig: Option<PathBuf>,
    opts: zerohop_kube::controller::ControllerOptions,
) -> ExitCode {
    let Some(stop) = stop_signal() else {
        return ExitCode::FAILURE;
    };
    let client = match zerohop_kube::client(kubeconfig.as_deref()).await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("zerohop: {e}");
            return ExitCode::FAILURE;
        }
    };
    eprintln!("zerohop: controller {} starting", opts.identity);
    match zerohop_kube::controller::run(client, opts, stop).await {
        Ok(()) => {
            eprintln!("zerohop: controller stopped");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("zerohop: controller: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `zerohop apply FILE`.
pub async fn apply(
    c: Client,
    o: Out,
    spec: PathBuf,
    listen: Option<SocketAddr>,
    split: Option<zerohop_agent::api::SplitRequest>,
) -> Result<()> {
    let text = std::fs::read_to_string(&spec)
        .with_context(|| format!("cannot read {}", spec.display()))?;
    let path =
        std::path::absolute(&spec).with_context(|| format!("cannot resolve {}", spec.display()))?;
    let req = ApplyRequest {
        path: path.display().to_string(),
        text,
        listen: listen.map(|l| l.to_string()),
        split,
    };
    let r: ApplyResponse = c.call(Method::POST, "/chains", Some(&req)).await?;
    if o.json {
        return print_json(&r);
    }
    let what = match r.applied {
        Applied::Created => "created",
        Applied::Updated => "updated",
        Applied::Replaced => "replaced",
        Applied::Unchanged => "unchanged",
    };
    println!(
        "chain '{}' {what}: {}",
        r.status.name,
        r.status.listeners.join(", ")
    );
    for ch in &r.changes {
        println!("  {ch}");
    }
    Ok(())
}

/// `zerohop ls`.
pub async fn ls(c: Client, o: Out) -> Result<()> {
    let list: Vec<ChainSummary> = c.call(Method::GET, "/chains", None::<&()>).await?;
    if o.json {
        return print_json(&list);
    }
    if list.is_empty() {
        println!("no chains; `zerohop apply FILE` brings one up");
        return Ok(());
    }
    let mut rows = vec![[
        "NAME",
        "LISTENERS",
        "FUNCTIONS",
        "INSTANCES",
        "OK",
        "ERRORS",
        "UP",
    ]
    .map(String::from)
    .to_vec()];
    for s in &list {
        rows.push(vec![
            s.name.clone(),
            s.listeners.join(","),
            s.functions.to_string(),
            s.instances.to_string(),
            s.ok.to_string(),
            s.errors.to_string(),
            age(s.uptime_s),
        ]);
    }
    print!("{}", table(&rows));
    Ok(())
}

fn print_status(s: &ChainStatus) {
    println!("chain {} (from {}), up {}", s.name, s.spec, age(s.uptime_s));
    println!("  listeners: {}", s.listeners.join(", "));
    if let Some(m) = &s.metrics_url {
        println!("  metrics:   {m}");
    }
    println!("  transport: {}; {}", s.transport, s.confinement);
    let g = &s.gateway;
    println!(
        "  requests:  {} accepted, {} ok, {} errors, {} in flight, {} refused, {} late",
        g.accepted, g.ok, g.errors, g.inflight, g.refused, g.late
    );
    let sl = &s.slots;
    let large = if sl.large_total > 0 {
        format!(
            "; of them large (bodies over a slot, up to {}): {} of {}",
            bytes(sl.max_body),
            sl.large_in_use,
            sl.large_total
        )
    } else if sl.max_body > 0 {
        format!("; bodies up to {}", bytes(sl.max_body))
    } else {
        String::new()
    };
    println!("  slots:     {} of {} in use{large}", sl.in_use, sl.total);
    println!("  routes:");
    for r in &s.routes {
        println!(
            "    {} -> {}",
            r.triggers.join(" | "),
            r.sequence.join(" -> ")
        );
        if !r.guards.is_empty() {
            println!("      ({})", r.guards.join("; "));
        }
    }
    println!("  functions:");
    let mut rows = vec![[
        "NAME",
        "READY",
        "MIN",
        "MAX",
        "RESTARTS",
        "SLOTS",
        "INSTANCES",
    ]
    .map(|h| h.to_string())
    .to_vec()];
    for f in &s.functions {
        let inst = f
            .instances
            .iter()
            .map(|i| match i.pid {
                Some(pid) => format!("#{} pid {pid} {}", i.party, i.state),
                None => format!("#{} {}", i.party, i.state),
            })
            .collect::<Vec<_>>()
            .join(", ");
        rows.push(vec![
            if f.fused.is_empty() {
                f.name.clone()
            } else {
                format!("{} (fused {})", f.name, f.fused)
            },
            format!("{}/{}", f.ready, f.desired),
            f.min.to_string(),
            f.max.to_string(),
            f.restarts.to_string(),
            f.slots.to_string(),
            inst,
        ]);
    }
    for l in table(&rows).lines() {
        println!("    {l}");
    }
    if let Some(gk) = &s.gateway.kernel {
        // The sockmap transport's eBPF counters, only non-zero drops.
        println!("  in the kernel (descriptors in / out / refused):");
        let line = |name: &str, k: &zerohop_agent::api::KernelCounters| {
            let drops: Vec<String> = k
                .dropped
                .iter()
                .filter(|(_, &n)| n > 0)
                .map(|(r, n)| format!("{n} {r}"))
                .collect();
            let drops = if drops.is_empty() {
                "0".to_owned()
            } else {
                drops.join(", ")
            };
            println!("    {name}: {} / {} / {drops}", k.received, k.sent);
        };
        line("(gateway)", gk);
        for f in &s.functions {
            if let Some(k) = &f.kernel {
                line(&f.name, k);
            }
        }
    }
}

/// `zerohop status CHAIN`.
pub async fn status(c: Client, o: Out, chain: String) -> Result<()> {
    let s: ChainStatus = c
        .call(Method::GET, &format!("/chains/{chain}"), None::<&()>)
        .await?;
    if o.json {
        return print_json(&s);
    }
    print_status(&s);
    Ok(())
}

/// `zerohop scale CHAIN FN N`.
pub async fn scale(c: Client, o: Out, chain: String, function: String, n: u16) -> Result<()> {
    let s: ChainStatus = c
        .call(
            Method::POST,
            &format!("/chains/{chain}/scale"),
            Some(&ScaleRequest {
                function: function.clone(),
                instances: n,
            }),
        )
        .await?;
    if o.json {
        return print_json(&s);
    }
    let max = s
        .functions
        .iter()
        .find(|f| f.name == function)
        .map_or(n, |f| f.max);
    if n == 0 {
        println!(
            "chain '{chain}': function '{function}' now scales to zero when idle (min 0, max {max})"
        );
    } else {
        println!(
            "chain '{chain}': function '{function}' keeps at least {n} instance(s) serving (min {n}, max {max}; more under load)"
        );
    }
    Ok(())
}

/// `zerohop logs CHAIN [FN] [-f]`.
pub async fn logs(
    c: Client,
    o: Out,
    chain: String,
    function: Option<String>,
    follow: bool,
    lines: usize,
) -> Result<()> {
    let path = format!(
        "/chains/{chain}/logs?lines={lines}{}{}",
        function.map_or(String::new(), |f| format!("&function={f}")),
        if follow { "&follow=1" } else { "" }
    );
    let lines = c.stream(&path, |l: LogEntry| {
        let mut out = std::io::stdout().lock();
        // Function bytes never reach the terminal raw (the daemon escapes them as it stores
        // them; the tool does not count on it): see `zerohop_agent::logs::escape`.
        if o.json {
            let l = LogEntry {
                time: escape(&l.time).into_owned(),
                chain: escape(&l.chain).into_owned(),
                function: escape(&l.function).into_owned(),
                instance: l.instance,
                stream: escape(&l.stream).into_owned(),
                text: escape(&l.text).into_owned(),
            };
            serde_json::to_writer(&mut out, &l)?;
            writeln!(out)?;
        } else {
            out.write_all(
                terminal_line(&l.time, &l.function, l.instance, &l.stream, &l.text).as_bytes(),
            )?;
        }
        out.flush()?;
        Ok(())
    });
    tokio::select! {
        r = lines => r,
        _ = tokio::signal::ctrl_c() => Ok(()),
    }
}

/// `zerohop invoke CHAIN ROUTE --data D`: prints the body (control characters escaped, as
/// `zerohop logs` does); exit 1 on an error status.
pub async fn invoke(c: Client, o: Out, chain: String, route: String, data: String) -> Result<()> {
    let r: InvokeResponse = c
        .call(
            Method::POST,
            &format!("/chains/{chain}/invoke"),
            Some(&InvokeRequest { route, data }),
        )
        .await?;
    if o.json {
        return print_json(&r);
    }
    // The body is the function's: escape sequences in it must not reach the operator's
    // terminal (they could clear it or rewrite what it shows). Line by line, so a body of
    // several lines keeps them; `--json` gives the body exactly.
    if (200..400).contains(&r.status) {
        let mut out = String::with_capacity(r.body.len() + 1);
        for line in r.body.lines() {
            out.push_str(&escape(line));
            out.push('\n');
        }
        print!("{out}");
        Ok(())
    } else {
        anyhow::bail!(
            "the chain answered {}: {}",
            r.status,
            escape(r.body.trim_end())
        )
    }
}

/// `zerohop down CHAIN`.
pub async fn down(c: Client, o: Out, chain: String) -> Result<()> {
    let r: DownResponse = c
        .call(Method::DELETE, &format!("/chains/{chain}"), None::<&()>)
        .await?;
    if o.json {
        return print_json(&r);
    }
    println!(
        "chain '{}' stopped ({} requests answered)",
        r.name, r.answered
    );
    Ok(())
}

/// Microseconds as `850us`, `12.3ms`, `1.20s`.
fn micros(us: f64) -> String {
    if us < 1000.0 {
        format!("{us:.0}us")
    } else if us < 1e6 {
        format!("{:.1}ms", us / 1e3)
    } else {
        format!("{:.2}s", us / 1e6)
    }
}

/// One screen of `top`: per chain its gateway line, then per function rate, p50 and p99 of
/// handler time (over the last interval), in flight, instances, slots, restarts.
fn top_rows(
    now: &[ChainStatus],
    last: Option<&(std::time::Instant, Vec<ChainStatus>)>,
    at: std::time::Instant,
) -> Vec<Vec<String>> {
    let mut rows = vec![[
        "CHAIN",
        "FUNCTION",
        "REQ/S",
        "P50",
        "P99",
        "INFLIGHT",
        "INSTANCES",
        "SLOTS",
        "RESTARTS",
    ]
    .map(String::from)
    .to_vec()];
    for s in now {
        let prev = last.and_then(|(t, p)| {
            Some((
                at.duration_since(*t).as_secs_f64(),
                p.iter().find(|p| p.name == s.name)?,
            ))
        });
        let rate = |a: u64, b: u64, dt: f64| format!("{:.0}", a.saturating_sub(b) as f64 / dt);
        rows.push(vec![
            s.name.clone(),
            "(gateway)".into(),
            prev.map_or("-".into(), |(dt, p)| {
                rate(s.gateway.accepted, p.gateway.accepted, dt)
            }),
            String::new(),
            String::new(),
            s.gateway.inflight.to_string(),
            String::new(),
            format!("{}/{}", s.slots.in_use, s.slots.total),
            String::new(),
        ]);
        for f in &s.functions {
            let before =
                prev.and_then(|(dt, p)| Some((dt, p.functions.iter().find(|g| g.name == f.name)?)));
            let (req, p50, p99) = match before {
                Some((dt, b)) => {
                    let delta: Vec<u64> = f
                        .latency_buckets
                        .iter()
                        .zip(b.latency_buckets.iter().chain(std::iter::repeat(&0)))
                        .map(|(n, o)| n.saturating_sub(*o))
                        .collect();
                    let q = |q| FunctionStatus::quantile_us(&delta, q).map_or("-".into(), micros);
                    (rate(f.handled, b.handled, dt), q(0.5), q(0.99))
                }
                None => ("-".into(), "-".into(), "-".into()),
            };
            rows.push(vec![
                String::new(),
                f.name.clone(),
                req,
                p50,
                p99,
                f.busy.to_string(),
                format!("{}/{}", f.ready, f.desired),
                f.slots.to_string(),
                f.restarts.to_string(),
            ]);
        }
    }
    rows
}

/// `zerohop top`: the first screen has no rates (they need two readings); `--once` waits
/// one interval to have them.
pub async fn top(c: Client, o: Out, once: bool, interval: f64) -> Result<()> {
    let interval = std::time::Duration::from_secs_f64(interval.clamp(0.1, 3600.0));
    let mut last: Option<(std::time::Instant, Vec<ChainStatus>)> = None;
    if once && !o.json {
        let first: Vec<ChainStatus> = c.call(Method::GET, "/top", None::<&()>).await?;
        last = Some((std::time::Instant::now(), first));
        tokio::time::sleep(interval).await;
    }
    loop {
        let now: Vec<ChainStatus> = c.call(Method::GET, "/top", None::<&()>).await?;
        let at = std::time::Instant::now();
        if o.json {
            print_json(&now)?;
        } else {
            if !once {
                // Clear the screen and go home.
                print!("\x1b[2J\x1b[H");
            }
            print!("{}", table(&top_rows(&now, last.as_ref(), at)));
            std::io::stdout().flush()?;
        }
        if once {
            return Ok(());
        }
        last = Some((at, now));
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = tokio::signal::ctrl_c() => return Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_in_the_largest_unit() {
        assert_eq!(bytes(0), "0 B");
        assert_eq!(bytes(1023), "1023 B");
        assert_eq!(bytes(64 << 20), "64 MiB");
        assert_eq!(bytes(3 << 29), "1.5 GiB");
        assert_eq!(bytes((64 << 10) - 1), "64.0 KiB");
    }
}
