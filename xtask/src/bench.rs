//! `cargo xtask bench`: builds everything, runs `zerohop-bench` (every system side by side,
//! see `bench/README.md`) into `results/`, draws the plots, then the benchmarks beside the
//! matrix: the scale point, the applications, activation from zero and the languages, each
//! skipped by its `--no-NAME` (all of them by `--smoke`); last, the targets of issue 33 that
//! those steps measure (parked activation, the hot path at 1,000 instances) are judged into
//! the matrix's `results.json` and `summary.md` (`zerohop-bench --update-targets`).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::builds::build_bins;
use crate::cmd::run;
use crate::sdk::{c_sdk, node_sdk, python_sdk};

pub fn bench(extra: &[String]) -> Result<()> {
    // zerohop-bench starts this path (bench/src/systems.rs), not an nginx found on PATH.
    if !Path::new("/usr/sbin/nginx").is_file() {
        eprintln!(
            "xtask: nginx is not installed; the nginx-broker baseline will be reported as not run \
             (install it with `apt-get install -y nginx-light`)"
        );
    }
    if Command::new("wrk")
        .arg("--version")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_err()
    {
        eprintln!(
            "xtask: wrk is not installed; the multi-core point (--cores) falls back to \
             zerohop-bench's own load generator (install it with `apt-get install -y wrk`)"
        );
    }
    build_bins()?;
    let out = extra
        .windows(2)
        .find(|w| w[0] == "--out")
        .map_or_else(|| PathBuf::from("results"), |w| PathBuf::from(&w[1]));
    // `--no-scale`, `--no-apps`, `--no-activation`, `--no-languages`, `--no-async` and
    // `--no-large` are ours (skip that step); the rest goes to zerohop-bench.
    let ours = [
        "--no-scale",
        "--no-apps",
        "--no-activation",
        "--no-languages",
        "--no-async",
        "--no-large",
    ];
    let status = Command::new("target/release/zerohop-bench")
        .args(extra.iter().filter(|a| !ours.contains(&a.as_str())))
        .status()
        .context("running target/release/zerohop-bench")?;
    // Exit code 1 means some system misbehaved: the report is still written and plotted.
    if !status.success() && status.code() != Some(1) {
        bail!("zerohop-bench failed ({status})");
    }
    // The plots draw the matrix, which `--cores-only` leaves out.
    if !extra.iter().any(|a| a == "--cores-only") {
        plot(&out)?;
    }
    // The steps after the matrix; whatever they end in, the targets they measure are judged
    // into the matrix's report (as "not run in this run" when they did not run).
    let steps = later_steps(extra, &out);
    update_targets(&out)?;
    steps?;
    if status.code() == Some(1) {
        bail!(
            "some systems failed or answered wrongly; see {}/summary.md",
            out.display()
        );
    }
    eprintln!("xtask: report in {}/summary.md", out.display());
    Ok(())
}

/// Re-judges the targets of the steps after the matrix in `out/results.json` and
/// `out/summary.md` from their JSON documents.
fn update_targets(out: &Path) -> Result<()> {
    let status = Command::new("target/release/zerohop-bench")
        .arg("--update-targets")
        .arg("--out")
        .arg(out)
        .status()
        .context("running target/release/zerohop-bench --update-targets")?;
    if !status.success() {
        bail!("zerohop-bench --update-targets failed ({status})");
    }
    Ok(())
}

/// The benchmarks after the matrix: scale, then the others, each skipped by `--smoke` or its
/// `--no-NAME`; the first that fails ends them.
fn later_steps(extra: &[String], out: &Path) -> Result<()> {
    let out = out.to_path_buf();
    let scale_ok = if extra.iter().any(|a| a == "--smoke" || a == "--no-scale") {
        true
    } else {
        scale(&out, extra.iter().any(|a| a == "--quick"))?
    };
    if !scale_ok {
        bail!("the scale point failed; see {}/scale.md", out.display());
    }
    // The benchmarks beside the matrix: each skipped by `--smoke` or its `--no-NAME`.
    let quick = extra.iter().any(|a| a == "--quick");
    type Extra = fn(&Path, bool) -> Result<bool>;
    let others: [(&str, Extra, &str); 5] = [
        ("apps", apps, "an application run had errors"),
        (
            "activation",
            activation,
            "the activation benchmark had errors",
        ),
        ("languages", languages, "a language failed or had errors"),
        (
            "async",
            deferred,
            "an async request failed or its callback did not come",
        ),
        (
            "large",
            large,
            "a large-body request failed or was answered wrongly",
        ),
    ];
    for (name, bench, failed) in others {
        let skip = format!("--no-{name}");
        if extra.iter().any(|a| a == "--smoke" || *a == skip) {
            continue;
        }
        if !bench(&out, quick)? {
            bail!("{failed}; see {}/{name}.md", out.display());
        }
    }
    Ok(())
}

/// The applications of `apps/` (Online Boutique mix, IoT motion trace) on zerohop beside
/// their HTTP-microservice deployments, written to `out/apps.md` and `out/apps.json`.
/// Returns whether every run was free of errors.
fn apps(out: &Path, quick: bool) -> Result<bool> {
    eprintln!("xtask: applications (Online Boutique, IoT motion) beside HTTP microservices");
    report_bench("zerohop-bench-apps", out, quick)
}

/// Activation of a function scaled to zero, a parked instance next to a cold start
/// (decision to first request taken, first request against warm ones), written to
/// `out/activation.md` and `out/activation.json`. Returns whether it ran without errors.
fn activation(out: &Path, quick: bool) -> Result<bool> {
    eprintln!("xtask: activation from zero (parked instance beside a cold start)");
    report_bench("zerohop-bench-activation", out, quick)
}

/// Async invocations beside synchronous ones on the hello chain (POST to 202, POST to the
/// callback, POST to 200), written to `out/async.md` and `out/async.json`.
fn deferred(out: &Path, quick: bool) -> Result<bool> {
    eprintln!("xtask: async invocations beside synchronous ones");
    report_bench("zerohop-bench-async", out, quick)
}

/// Bodies larger than a slot (1, 16, 256 MiB) through the hello chain on zerohop beside the
/// monolith and the HTTP chain (p50, MiB/s, CPU per request, peak memory, as ratios),
/// written to `out/large.md` and `out/large.json`.
fn large(out: &Path, quick: bool) -> Result<bool> {
    eprintln!("xtask: bodies larger than a slot beside the monolith and the HTTP chain");
    report_bench("zerohop-bench-large", out, quick)
}

/// Pass-through functions in Rust, C, Go, Python and Node.js on the same runtime (per-hop
/// cost against Rust's, CPU per hop, idle CPU, idle memory), written to `out/languages.md`
/// and `out/languages.json`. Returns whether it ran without errors; a language whose
/// toolchain is missing is reported as not run, not as an error.
fn languages(out: &Path, quick: bool) -> Result<bool> {
    // C and Go are built against the C SDK; Python and Node.js need theirs installed.
    c_sdk(&[])?;
    python_sdk()?;
    node_sdk()?;
    eprintln!("xtask: functions in each language (Rust, C, Go, Python, Node.js)");
    report_bench("zerohop-bench-languages", out, quick)
}

/// Runs the benchmark binary `name` writing into `out` (`--quick` if asked): `Ok(true)`
/// when it exits 0, `Ok(false)` when it exits 1 (some run had errors), else an error.
fn report_bench(name: &str, out: &Path, quick: bool) -> Result<bool> {
    let bin = format!("target/release/{name}");
    let mut cmd = Command::new(&bin);
    cmd.arg("--out").arg(out);
    if quick {
        cmd.arg("--quick");
    }
    let status = cmd.status().with_context(|| format!("running {bin}"))?;
    match status.code() {
        Some(0) => Ok(true),
        Some(1) => Ok(false),
        _ => bail!("{name} failed ({status})"),
    }
}

/// The scale point: 10, 100 and 1,000 warm instances in one chain (ready time, memory per
/// instance, ring memory, idle CPU, RPS), written to `out/scale.json` and `out/scale.md`.
/// Returns whether every point succeeded.
fn scale(out: &Path, quick: bool) -> Result<bool> {
    eprintln!("xtask: scale point (10, 100, 1000 instances in one chain)");
    let idle = if quick { "2" } else { "5" };
    let output = Command::new("target/release/zerohop-bench-scale")
        .args(["--markdown", "--idle-seconds", idle])
        .stderr(std::process::Stdio::inherit())
        .output()
        .context("running target/release/zerohop-bench-scale")?;
    let text = String::from_utf8_lossy(&output.stdout);
    // The JSON document first, then the markdown table after a blank line.
    let (json, table) = text.split_once("\n\n").unwrap_or((&text, ""));
    std::fs::create_dir_all(out)?;
    std::fs::write(out.join("scale.json"), json)?;
    std::fs::write(
        out.join("scale.md"),
        format!(
            "# Scale: many warm instances in one chain\n\n{table}\n\nGoals: 1,000 warm \
             instances at <= 1 MiB private memory each, ring memory proportional to the edges, \
             ready in <= 2 s, no idle CPU.\n"
        ),
    )?;
    Ok(output.status.success())
}

/// Draws the plots with matplotlib, installing it with pip when it is missing.
fn plot(out: &Path) -> Result<()> {
    let has_matplotlib = || {
        Command::new("python3")
            .args(["-c", "import matplotlib"])
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if !has_matplotlib() {
        eprintln!("xtask: installing matplotlib for the plots (pip install --user matplotlib)");
        let _ = Command::new("python3")
            .args(["-m", "pip", "install", "--quiet", "--user", "matplotlib"])
            .status();
        if !has_matplotlib() {
            bail!(
                "matplotlib is missing and could not be installed; the numbers are in {}/results.json, \
                 install it with `python3 -m pip install matplotlib` and run `python3 bench/plot.py {}`",
                out.display(),
                out.display()
            );
        }
    }
    run(
        "drawing the plots",
        Command::new("python3").arg("bench/plot.py").arg(out),
    )
}
