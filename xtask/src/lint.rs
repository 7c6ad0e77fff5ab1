//! `cargo xtask lint [--no-workspace-clippy]`: what the build needs (clang for the eBPF
//! programs), then `cargo fmt --check` and `cargo clippy -D warnings` over the workspace and
//! the two SDK crates that live outside it, in the order of its plan (`crate::plan::lint`).
//! `--no-workspace-clippy` leaves the workspace's clippy to `cargo xtask test --clippy`, which
//! lints it in its build (CI).

use anyhow::{bail, Result};

use crate::cmd::{cargo, run, workspace_root};
use crate::phases::Phases;
use crate::{plan, prereqs};

pub fn lint(args: &[String]) -> Result<()> {
    let workspace_clippy = match args {
        [] => true,
        [a] if a == "--no-workspace-clippy" => false,
        _ => bail!(
            "usage: cargo xtask lint [--no-workspace-clippy] (got `{}`)",
            args.join(" ")
        ),
    };
    let mut ph = Phases::new(&workspace_root(), "lint");
    let result = (|| -> Result<()> {
        let missing = prereqs::missing(plan::LINT_NEEDS);
        let plan = plan::lint(prereqs::this_machine(), &missing, workspace_clippy);
        ph.time("system packages", || {
            prereqs::carry_out("cargo xtask lint", &plan.packages, &plan.missing)
        })?;
        for step in &plan.steps {
            ph.time(&step.phase, || {
                for (said, args) in &step.commands {
                    run(said, cargo().args(args))?;
                }
                Ok(())
            })?;
        }
        Ok(())
    })();
    ph.print();
    result
}
