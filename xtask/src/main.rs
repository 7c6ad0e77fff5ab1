//! `cargo xtask`: the one entry point for what plain cargo does not do in one step.
//!
//! * `cargo xtask demo`: builds the release binaries and runs the hello chain
//!   (`zerohop up examples/hello/chain.yaml`) until Ctrl-C.
//! * `cargo xtask test`: builds the binaries the end-to-end tests start, runs every test of
//!   the workspace, then the loom model checks of the allocator and the ring.
//! * `cargo xtask bench [--quick] [ARGS]`: builds everything, runs `zerohop-bench` (every
//!   system side by side, see `bench/README.md`) into `results/`, then draws the plots.

#![forbid(unsafe_code)]

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let root = workspace_root();
    std::env::set_current_dir(&root).context("cd to the workspace root")?;
    match args.first().map(String::as_str) {
        Some("demo") => demo(&args[1..]),
        Some("test") => test(&args[1..]),
        Some("bench") => bench(&args[1..]),
        _ => {
            eprintln!(
                "usage: cargo xtask <task>\n\n\
                 tasks:\n  \
                 demo [ARGS]   build and run the hello chain (extra ARGS go to `zerohop up`)\n  \
                 test [ARGS]   build, run all tests (extra ARGS go to `cargo test`), then loom checks\n  \
                 bench [ARGS]  build, benchmark zerohop against the baselines (ARGS go to\n                \
                 zerohop-bench, e.g. --quick), write results/ and its plots"
            );
            bail!("no task given");
        }
    }
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

fn cargo() -> Command {
    Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
}

fn run(step: &str, cmd: &mut Command) -> Result<()> {
    eprintln!("xtask: {step}");
    let status = cmd.status().with_context(|| format!("running {cmd:?}"))?;
    if !status.success() {
        bail!("{step} failed ({status})");
    }
    Ok(())
}

fn build_bins() -> Result<()> {
    run(
        "building release binaries (zerohop, example functions)",
        cargo().args(["build", "--release", "--workspace", "--bins"]),
    )
}

fn demo(extra: &[String]) -> Result<()> {
    build_bins()?;
    eprintln!("xtask: starting the hello chain; try it with:");
    eprintln!("  curl -s -X POST --data 'hello world' http://127.0.0.1:8080/hello");
    eprintln!("xtask: zerohop up examples/hello/chain.yaml");
    // Become the chain's agent, so Ctrl-C reaches exactly one process, which stops the chain
    // and everything it started.
    let err = Command::new("target/release/zerohop")
        .args(["up", "examples/hello/chain.yaml"])
        .args(extra)
        .exec();
    Err(err).context("starting target/release/zerohop")
}

fn test(extra: &[String]) -> Result<()> {
    build_bins()?;
    run(
        "running the workspace tests",
        cargo()
            .args(["test", "--release", "--workspace"])
            .args(extra),
    )?;
    run(
        "loom model checks of the slot allocator and the ring",
        cargo()
            .args([
                "test",
                "--release",
                "-p",
                "zerohop-pool",
                "-p",
                "zerohop-transport",
                "--lib",
                "loom",
            ])
            .env("RUSTFLAGS", "--cfg loom")
            .env("CARGO_TARGET_DIR", "target/loom"),
    )?;
    eprintln!("xtask: all tests passed");
    Ok(())
}

fn bench(extra: &[String]) -> Result<()> {
    if which("nginx").is_none() && !Path::new("/usr/sbin/nginx").is_file() {
        eprintln!(
            "xtask: nginx is not installed; the nginx-broker baseline will be reported as not run \
             (install it with `apt-get install -y nginx-light`)"
        );
    }
    build_bins()?;
    let out = extra
        .windows(2)
        .find(|w| w[0] == "--out")
        .map_or_else(|| PathBuf::from("results"), |w| PathBuf::from(&w[1]));
    let status = Command::new("target/release/zerohop-bench")
        .args(extra)
        .status()
        .context("running target/release/zerohop-bench")?;
    // Exit code 1 means some system misbehaved: the report is still written and plotted.
    if !status.success() && status.code() != Some(1) {
        bail!("zerohop-bench failed ({status})");
    }
    plot(&out)?;
    if status.code() == Some(1) {
        bail!(
            "some systems failed or answered wrongly; see {}/summary.md",
            out.display()
        );
    }
    eprintln!("xtask: report in {}/summary.md", out.display());
    Ok(())
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

fn which(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(program))
            .find(|p| p.is_file())
    })
}
