//! The Rust builds of the workspace: the release binaries alone (the demo, the image, the
//! benchmarks), or everything in one build (`cargo xtask test`), after which the other steps
//! build nothing of the workspace again.

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

/// Builds the libraries (the C SDK's among them), binaries and test binaries of the
/// workspace in one build, with one feature resolution; see [`WORKSPACE_BUILT`].
pub fn build_workspace() -> Result<()> {
    run(
        "building the workspace: libraries, binaries and tests in one build",
        cargo().args([
            "build",
            "--release",
            "--workspace",
            "--lib",
            "--bins",
            "--tests",
        ]),
    )?;
    WORKSPACE_BUILT.store(true, Ordering::Relaxed);
    Ok(())
}

/// Whether [`build_workspace`] has built the whole workspace in this process.
pub fn workspace_built() -> bool {
    WORKSPACE_BUILT.load(Ordering::Relaxed)
}
