//! `cargo xtask demo` and `cargo xtask polyglot`: build, then become `zerohop up` of the hello
//! chain or of `examples/polyglot` until Ctrl-C.

use std::os::unix::process::CommandExt;
use std::process::Command;

use anyhow::{Context, Result};

use crate::builds::build_bins;
use crate::sdk::polyglot_build;
use crate::{plan, prereqs};

/// `cargo xtask demo`: builds the release binaries and runs the hello chain until Ctrl-C.
pub fn demo(extra: &[String]) -> Result<()> {
    eprintln!("{}", plan::demo(&prereqs::missing(plan::TEST_NEEDS)).note());
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

/// `cargo xtask polyglot`: builds the polyglot example's five functions and runs its chain
/// until Ctrl-C.
pub fn polyglot(extra: &[String]) -> Result<()> {
    build_bins()?;
    polyglot_build()?;
    eprintln!("xtask: starting the polyglot chain; try it with:");
    eprintln!("  curl -s -X POST --data 'hello' http://127.0.0.1:8080/polyglot");
    let err = Command::new("target/release/zerohop")
        .args(["up", "examples/polyglot/chain.yaml"])
        .args(extra)
        .exec();
    Err(err).context("starting target/release/zerohop")
}
