//! The Rust builds of the workspace: the release binaries alone (the demo, the image, the
//! benchmarks), or everything in one build (`cargo xtask test`), after which the other steps
//! build nothing of the workspace again.

use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Result;

use crate::cmd::{cargo, run};

/// Set once `cargo xtask test` has built every library, binary and test of the workspace in
/// one build ([`build_workspace`]): the steps after it (the image, the C SDK) use what it
/// built. A build of the binaries alone, or of one package, resolves the dependencies'
/// features otherwise (without the dev-dependencies, or without the other packages), and
/// cargo would compile much of the workspace a second time.
static WORKSPACE_BUILT: AtomicBool = AtomicBool::new(false);

/// Builds the release binaries (zerohop, the example functions), unless the whole workspace
/// was built already.
pub fn build_bins() -> Result<()> {
    if workspace_built() {
        return Ok(());
    }
    run(
        "building release binaries (zerohop, example functions)",
        cargo().args(["build", "--release", "--workspace", "--bins"]),
    )
}

/// Makes `cmd` (a cargo command over the workspace) compile the workspace's own crates with
/// clippy as the compiler (`RUSTC_WORKSPACE_WRAPPER`, as `cargo clippy` does for its check)
/// and its lints' warnings denied (`CLIPPY_ARGS`, how `cargo clippy -- -D warnings` hands
/// them to clippy-driver), when `clippy`; the dependencies are compiled by rustc as ever.
/// Every cargo command over the same build must say the same, or cargo compiles the
/// workspace's crates again: the wrapper is part of their fingerprints.
pub fn with_clippy(cmd: &mut Command, clippy: bool) -> &mut Command {
    if clippy {
        cmd.env("RUSTC_WORKSPACE_WRAPPER", "clippy-driver").env(
            "CLIPPY_ARGS",
            "-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__",
        );
    }
    cmd
}

/// Builds the libraries (the C SDK's among them), binaries and test binaries of the
/// workspace in one build, with one feature resolution; see [`WORKSPACE_BUILT`]. With
/// `clippy`, linted as it builds ([`with_clippy`]), the benches too (what `--all-targets`
/// lints).
pub fn build_workspace(clippy: bool) -> Result<()> {
    let mut cmd = cargo();
    cmd.args([
        "build",
        "--release",
        "--workspace",
        "--lib",
        "--bins",
        "--tests",
    ]);
    if clippy {
        cmd.arg("--benches");
    }
    run(
        if clippy {
            "building the workspace: libraries, binaries, tests and benches in one build, \
             linted by clippy (-D warnings) as it builds"
        } else {
            "building the workspace: libraries, binaries and tests in one build"
        },
        with_clippy(&mut cmd, clippy),
    )?;
    WORKSPACE_BUILT.store(true, Ordering::Relaxed);
    Ok(())
}

/// Whether [`build_workspace`] has built the whole workspace in this process.
pub fn workspace_built() -> bool {
    WORKSPACE_BUILT.load(Ordering::Relaxed)
}
