//! `cargo xtask`: the one entry point for what plain cargo does not do in one step.
//!
//! * `cargo xtask demo`: builds the release binaries and runs the hello chain
//!   (`zerohop up examples/hello/chain.yaml`) until Ctrl-C.
//! * `cargo xtask test`: builds the binaries the end-to-end tests start, runs every test of
//!   the workspace, then the loom model checks of the allocator and the ring.

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
        _ => {
            eprintln!(
                "usage: cargo xtask <task>\n\n\
                 tasks:\n  \
                 demo [ARGS]   build and run the hello chain (extra ARGS go to `zerohop up`)\n  \
                 test [ARGS]   build, run all tests (extra ARGS go to `cargo test`), then loom checks"
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
