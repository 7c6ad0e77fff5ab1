//! `cargo xtask test`, the README's test command: gathers the machine's facts, computes the
//! plan (`crate::plan::test`) and carries it out step by step, or prints it (`--plan`).
//!
//! The plan's stages decide how a step's failure counts: a setup step or a build stops the
//! task (the step built beside the builds, kube-apiserver, is waited for first); every test
//! suite runs even when one fails, and the task fails at the end naming each. Each step is a
//! row of the table of phases (each test binary one of its own), printed at the end.

use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};

use crate::cmd::{cargo, run, run_echoed, workspace_root};
use crate::phases::Phases;
use crate::plan::{self, Action, Stage, Step, TestOptions, TestPlan};
use crate::testrun::{self, TestBin};
use crate::{builds, image, kube, prereqs, sdk};

/// `cargo xtask test [--plan] [ARGS] [-- ARGS]`: installs what the tests need (or stops
/// before building, saying what is missing), builds everything once (the control plane from
/// Go beside the Rust builds), runs every test binary of the workspace (side by side where
/// they do not compete, see `testrun`), the doc tests, the Go, Node.js and Python SDKs'
/// tests, the pool's and transport's tests in debug and the loom model checks, and prints
/// where the time went.
pub fn test(extra: &[String]) -> Result<()> {
    let options = TestOptions::parse(extra);
    let missing = prereqs::missing(plan::TEST_NEEDS);
    let plan = plan::test(options, prereqs::this_machine(), &missing);
    if plan.options.print_plan {
        return print(&plan);
    }
    let mut phases = Phases::new(&workspace_root(), "test");
    let result = carry_out(&plan, &mut phases);
    phases.print();
    result
}

/// `--plan`: the plan, with the test binaries `cargo metadata` names (in the order they would
/// run), on standard output.
fn print(plan: &TestPlan) -> Result<()> {
    let names = testrun::workspace_names()?;
    let (solo, shared) = testrun::schedule(&names, testrun::SOLO);
    let bins: Vec<(String, bool)> = solo
        .iter()
        .map(|&i| (names[i].clone(), true))
        .chain(shared.iter().map(|&i| (names[i].clone(), false)))
        .collect();
    print!("{}", plan.render(&bins));
    if !plan.options.cargo_args.is_empty() {
        println!("(the ARGS to cargo may build fewer test binaries than these)");
    }
    Ok(())
}

fn carry_out(plan: &TestPlan, ph: &mut Phases) -> Result<()> {
    let mut bins = Vec::new();
    for step in plan.stage(Stage::Setup) {
        do_step(step, plan, ph, &mut bins)?;
    }
    std::thread::scope(|s| -> Result<()> {
        let beside: Vec<_> = plan
            .stage(Stage::Beside)
            .map(|step| {
                let thread = s.spawn(move || {
                    let started = Instant::now();
                    let r = act(step.action, plan, &mut Vec::new());
                    (started.elapsed(), r)
                });
                (step, thread)
            })
            .collect();
        let built = (|| -> Result<()> {
            for step in plan.stage(Stage::Build) {
                do_step(step, plan, ph, &mut bins)?;
            }
            Ok(())
        })();
        let mut beside_built = Vec::new();
        for (step, thread) in beside {
            let (took, r) = thread
                .join()
                .map_err(|_| anyhow::anyhow!("the {} build thread panicked", step.what))?;
            ph.record(step.phase.unwrap_or(step.what), took, r.is_ok());
            beside_built.push(r);
        }
        built?;
        beside_built.into_iter().collect()
    })?;
    // Every suite runs even when one fails; the run fails at the end naming each.
    let mut failed: Vec<&str> = Vec::new();
    for step in plan.stage(Stage::Suite) {
        if let Err(e) = do_step(step, plan, ph, &mut bins) {
            eprintln!("xtask: {} failed: {e:#}", step.what);
            failed.push(step.what);
        }
    }
    if !failed.is_empty() {
        bail!("failed: {}", failed.join("; "));
    }
    eprintln!("xtask: all tests passed");
    Ok(())
}

/// Carries out `step`, timed as its phase; `bins`: the test binaries, once named.
fn do_step(step: &Step, plan: &TestPlan, ph: &mut Phases, bins: &mut Vec<TestBin>) -> Result<()> {
    match (step.action, step.phase) {
        // Each binary is a phase of its own.
        (Action::RunTestBinaries, _) => testrun::run(bins, &plan.options.bin_args, ph),
        (action, Some(phase)) => ph.time(phase, || act(action, plan, bins)),
        (action, None) => act(action, plan, bins),
    }
}

/// What `action` does; [`Action::TestBinaries`] puts the binaries it named in `bins`.
fn act(action: Action, plan: &TestPlan, bins: &mut Vec<TestBin>) -> Result<()> {
    let cargo_args = &plan.options.cargo_args;
    match action {
        Action::Packages => prereqs::carry_out("cargo xtask test", &plan.packages, &plan.missing),
        Action::RequireRoot if !plan.machine.root => bail!("{}", plan::NOT_ROOT),
        Action::RequireRoot => Ok(()),
        Action::Kube => kube::kube(&[]),
        Action::Workspace => builds::build_workspace(plan.options.clippy),
        Action::Image => image::image(&[]),
        Action::Sdks => sdk::polyglot_build(),
        Action::TestBinaries => {
            *bins = testrun::build(cargo_args, plan.options.clippy)?;
            Ok(())
        }
        Action::RunTestBinaries => bail!("the test binaries run with the phases at hand"),
        Action::DocTests => run(
            "the workspace's doc tests",
            builds::with_clippy(&mut cargo(), plan.options.clippy)
                .args(["test", "--release", "--workspace", "--doc"])
                .args(cargo_args),
        ),
        Action::GoSdkTests => {
            let pkgconfig = workspace_root().join("target/c-sdk/lib/pkgconfig");
            run(
                "the Go SDK's tests (go test in sdk/go, over the C SDK just installed)",
                Command::new("go")
                    .args(["test", "-count=1", &sdk::go_sdk_stamp()?, "./..."])
                    .current_dir("sdk/go")
                    .env("PKG_CONFIG_PATH", &pkgconfig),
            )
            .context("the Go SDK's tests need Go 1.22 or newer (`go` on PATH)")
        }
        Action::NodeSdkTests => run(
            "the Node.js SDK's tests (npm test: node --test in sdk/node)",
            Command::new("npm")
                .args(["test", "--silent"])
                .current_dir("sdk/node"),
        ),
        Action::PythonSdkTests => {
            sdk::pip_install(
                "pytest for the tests of the Python SDK (into target/python-test)",
                "target/python-test",
                "pytest>=7",
            )?;
            run(
                "the Python SDK's tests (pytest in sdk/python/tests)",
                Command::new(sdk::python())
                    .args(["-m", "pytest", "-q", "sdk/python/tests"])
                    .env("PYTHONPATH", "target/python-sdk:target/python-test"),
            )
        }
        Action::DebugTests => run(
            "zerohop-pool's and zerohop-transport's tests in debug (debug_assert!, overflow \
             checks on)",
            cargo().args([
                "test",
                "-p",
                "zerohop-pool",
                "-p",
                "zerohop-transport",
                "--lib",
                "--tests",
            ]),
        ),
        Action::Loom => loom("loom"),
    }
}

/// The loom model checks of the slot allocator and the ring: the tests of zerohop-pool's and
/// zerohop-transport's libraries whose names contain `filter`, built with `--cfg loom`. Fails
/// when either library ran none (a filter that matches nothing passes in cargo).
fn loom(filter: &str) -> Result<()> {
    let out = run_echoed(
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
                filter,
            ])
            .env("RUSTFLAGS", "--cfg loom")
            .env("CARGO_TARGET_DIR", "target/loom"),
    )?;
    testrun::each_ran_tests(&testrun::passed_counts(&out), 2).with_context(|| {
        format!("the loom run filtered by `{filter}` (the tests are in `mod loom_tests`)")
    })
}
