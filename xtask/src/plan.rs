//! The plans of `cargo xtask test`, `lint` and `demo`, as values: what each installs (or which
//! missing programs stop it before it builds anything), then its steps in order, each with the
//! system programs it runs, what it uses of the steps before it and what it makes.
//!
//! A plan is a pure function of the task's options and the machine's facts (root, apt, which
//! requirements of `prereqs::REQUIREMENTS` are unmet): [`test`], [`lint`], [`demo`]. `testcmd`
//! and `lint` carry their plan out step by step, in its order and under its phase names;
//! `cargo xtask test --plan` prints it ([`TestPlan::render`]); `plan/tests.rs` checks the
//! plans whole. Which test binaries run, and which of them alone, is `testrun`'s part: the
//! build names them, so the plan holds the step that runs them.

use crate::prereqs::{self, Machine, Need, Probe, Requirement};

/// What `cargo xtask test` needs of the machine: the build's programs and the tests'.
pub const TEST_NEEDS: &[Need] = &[Need::Build, Need::Tests];
/// What `cargo xtask lint` needs: the build's programs (clippy compiles the eBPF programs).
pub const LINT_NEEDS: &[Need] = &[Need::Build];

/// Programs the steps run that `prereqs::REQUIREMENTS` does not check, because the machine
/// has them before anything is installed: the Rust toolchain (rustup, with its linker and
/// rustfmt and clippy) and `ldd` (libc-bin, an essential Debian package).
pub const BASE_PROGRAMS: &[Probe] = &[Probe::Program("cargo"), Probe::Program("ldd")];

/// The message `cargo xtask test` stops with when it does not run as root.
pub const NOT_ROOT: &str = "cargo xtask test runs as root: its tests run chains under uids of \
     their own, load eBPF programs and make network namespaces (try `sudo -E cargo xtask test`)";

/// What a step of `cargo xtask test` does; `testcmd` carries each out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Installs the missing system packages, or stops naming each missing program.
    Packages,
    /// Stops unless it runs as root ([`NOT_ROOT`]).
    RequireRoot,
    /// `cargo xtask kube`.
    Kube,
    /// One release build of the workspace's libraries, binaries and tests.
    Workspace,
    /// `cargo xtask image`.
    Image,
    /// Every SDK and the polyglot example's functions.
    Sdks,
    /// `cargo test --release --workspace --no-run` (compiles nothing again), naming the
    /// binaries.
    TestBinaries,
    /// Every test binary the build named, those that measure alone (see `testrun`).
    RunTestBinaries,
    DocTests,
    GoSdkTests,
    NodeSdkTests,
    PythonSdkTests,
    /// zerohop-pool's and zerohop-transport's tests in the dev profile.
    DebugTests,
    /// The loom model checks of the slot allocator and the ring.
    Loom,
}

/// When a step runs and what its failure does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Stage {
    /// Before anything is built; a failure stops the task.
    Setup,
    /// The builds, one after another; a failure stops the task (after the [`Stage::Beside`]
    /// steps ended).
    Build,
    /// Started with the first build, beside the builds, and waited for after the last: only
    /// the [`Stage::Suite`] steps may use what it makes.
    Beside,
    /// The tests: every suite runs even when one fails; the task fails at the end naming each.
    Suite,
}

/// Something a step makes that a later step uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Artifact {
    /// `target/release`: the workspace's libraries (the C SDK's among them), binaries and
    /// compiled tests.
    Workspace,
    /// `target/kube/bin`: kube-apiserver.
    Kube,
    /// `target/image`: the container image.
    Image,
    /// `target/c-sdk`, `target/python-sdk`, the Node.js addon, `target/polyglot`.
    Sdks,
    /// The named list of the workspace's test binaries.
    TestBinaries,
}

/// One step of a plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Step {
    pub action: Action,
    pub stage: Stage,
    /// Its row in the table of phases; `None`: untimed (a check), or its parts are rows of
    /// their own (each test binary).
    pub phase: Option<&'static str>,
    /// What it is, said when it fails (and in the printed plan).
    pub what: &'static str,
    /// The system programs (and headers) it runs or reads.
    pub runs: &'static [Probe],
    pub uses: &'static [Artifact],
    pub makes: &'static [Artifact],
}

const CARGO: Probe = Probe::Program("cargo");
const CC: Probe = Probe::Program("cc");
const GO: Probe = Probe::Program("go");
const NODE: Probe = Probe::Program("node");
const NPM: Probe = Probe::Program("npm");
const PKG_CONFIG: Probe = Probe::Program("pkg-config");
const PYTHON: Probe = Probe::File("/usr/bin/python3");
/// Debian's `python3 -m venv` needs ensurepip (the Locust and grpcio tests make venvs).
const VENV: Probe = Probe::File("/usr/lib/python3.11/ensurepip/__init__.py");
const PIP: Probe = Probe::Pip("/usr/bin/python3");
const C_HEADERS: Probe = Probe::File("/usr/include/stdio.h");
/// What compiles the sockmap transport's eBPF programs (its build script).
const EBPF: &[Probe] = &[
    CARGO,
    Probe::Program("clang"),
    Probe::File("/usr/include/bpf/bpf_helpers.h"),
    Probe::File("/usr/include/linux/bpf.h"),
];

/// The steps of `cargo xtask test`, in the order they run.
pub const TEST_STEPS: &[Step] = &[
    Step {
        action: Action::Packages,
        stage: Stage::Setup,
        phase: Some("system packages"),
        what: "the system packages",
        runs: &[],
        uses: &[],
        makes: &[],
    },
    Step {
        action: Action::RequireRoot,
        stage: Stage::Setup,
        phase: None,
        what: "the check that it runs as root",
        runs: &[],
        uses: &[],
        makes: &[],
    },
    // The Kubernetes tests' control plane builds from Go beside the Rust builds: each leaves
    // a core idle now and then (linking, the last crates of a build), the other fills it.
    Step {
        action: Action::Kube,
        stage: Stage::Beside,
        phase: Some("build: kube-apiserver (beside the above)"),
        what: "kube-apiserver",
        runs: &[GO],
        uses: &[],
        makes: &[Artifact::Kube],
    },
    Step {
        action: Action::Workspace,
        stage: Stage::Build,
        phase: Some("build: the workspace (libraries, binaries, tests)"),
        what: "the workspace's build",
        runs: EBPF,
        uses: &[],
        makes: &[Artifact::Workspace],
    },
    // The image test runs the container image.
    Step {
        action: Action::Image,
        stage: Stage::Build,
        phase: Some("build: container image"),
        what: "the container image",
        runs: &[Probe::Program("ldd"), Probe::Program("strip")],
        uses: &[Artifact::Workspace],
        makes: &[Artifact::Image],
    },
    // The C functions of the tests are built against the C SDK, as a user builds them; the
    // end-to-end tests (starters, the polyglot chain) use every SDK.
    Step {
        action: Action::Sdks,
        stage: Stage::Build,
        phase: Some("build: SDKs, polyglot example"),
        what: "the SDKs and the polyglot example",
        runs: &[CARGO, PKG_CONFIG, CC, C_HEADERS, GO, PYTHON, PIP, NPM, NODE],
        uses: &[Artifact::Workspace],
        makes: &[Artifact::Sdks],
    },
    // Names the test binaries (the workspace's build made them: nothing is compiled again).
    Step {
        action: Action::TestBinaries,
        stage: Stage::Build,
        phase: Some("build: test binaries"),
        what: "the test binaries' build",
        runs: &[CARGO],
        uses: &[Artifact::Workspace],
        makes: &[Artifact::TestBinaries],
    },
    Step {
        action: Action::RunTestBinaries,
        stage: Stage::Suite,
        phase: None,
        what: "the workspace's test binaries",
        runs: &[
            CC,
            C_HEADERS,
            PKG_CONFIG,
            Probe::Program("make"),
            PYTHON,
            NPM,
            NODE,
            GO,
            Probe::File("/usr/sbin/nginx"),
            Probe::Program("wrk"),
            Probe::Program("mosquitto"),
            Probe::Program("mosquitto_pub"),
            Probe::Program("coap-client-notls"),
            Probe::Program("promtool"),
            Probe::Program("etcd"),
            Probe::Program("openssl"),
            Probe::Program("curl"),
            Probe::Program("h2load"),
            VENV,
            Probe::Program("ip"),
            Probe::Program("nsenter"),
            Probe::Program("runc"),
        ],
        uses: &[
            Artifact::TestBinaries,
            Artifact::Workspace,
            Artifact::Kube,
            Artifact::Image,
            Artifact::Sdks,
        ],
        makes: &[],
    },
    Step {
        action: Action::DocTests,
        stage: Stage::Suite,
        phase: Some("tests: doc tests"),
        what: "the doc tests",
        runs: &[CARGO],
        uses: &[],
        makes: &[],
    },
    Step {
        action: Action::GoSdkTests,
        stage: Stage::Suite,
        phase: Some("tests: Go SDK"),
        what: "the Go SDK's tests",
        runs: &[GO, PKG_CONFIG, CC],
        uses: &[Artifact::Sdks],
        makes: &[],
    },
    Step {
        action: Action::NodeSdkTests,
        stage: Stage::Suite,
        phase: Some("tests: Node.js SDK"),
        what: "the Node.js SDK's tests",
        runs: &[NPM, NODE],
        uses: &[Artifact::Sdks],
        makes: &[],
    },
    Step {
        action: Action::PythonSdkTests,
        stage: Stage::Suite,
        phase: Some("tests: Python SDK"),
        what: "the Python SDK's tests",
        runs: &[PYTHON, PIP],
        uses: &[Artifact::Sdks],
        makes: &[],
    },
    // Every run above is a release build, without debug_assert! and overflow checks: the two
    // crates whose unsafe shared-memory code states its invariants in them run their library
    // and integration tests once more in debug, where those checks are on.
    Step {
        action: Action::DebugTests,
        stage: Stage::Suite,
        phase: Some("tests: pool, transport in debug"),
        what: "the debug tests of zerohop-pool and zerohop-transport",
        runs: &[CARGO],
        uses: &[],
        makes: &[],
    },
    Step {
        action: Action::Loom,
        stage: Stage::Suite,
        phase: Some("tests: loom"),
        what: "the loom checks",
        runs: &[CARGO],
        uses: &[],
        makes: &[],
    },
];

/// The arguments of `cargo xtask test`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TestOptions {
    /// ARGS: to cargo (which packages, features), for the test binaries' build and the doc
    /// tests.
    pub cargo_args: Vec<String>,
    /// ARGS after `--`: to every test binary.
    pub bin_args: Vec<String>,
    /// `--plan` (before `--`): print the plan, run nothing.
    pub print_plan: bool,
    /// `--clippy` (before `--`): the release builds of the workspace (its libraries, binaries,
    /// tests and benches) run clippy as the workspace's compiler wrapper, with `-D warnings`
    /// (`crate::builds::with_clippy`): the lints of `cargo clippy --workspace --all-targets
    /// -- -D warnings` in the build itself. CI runs this with `cargo xtask lint
    /// --no-workspace-clippy`, instead of a clippy of its own that checks every dependency
    /// before the build compiles them all again.
    pub clippy: bool,
}

impl TestOptions {
    pub fn parse(extra: &[String]) -> Self {
        let (cargo_args, bin_args) = match extra.iter().position(|a| a == "--") {
            Some(i) => (&extra[..i], &extra[i + 1..]),
            None => (extra, &[][..]),
        };
        Self {
            cargo_args: cargo_args
                .iter()
                .filter(|a| *a != "--plan" && *a != "--clippy")
                .cloned()
                .collect(),
            bin_args: bin_args.to_vec(),
            print_plan: cargo_args.iter().any(|a| a == "--plan"),
            clippy: cargo_args.iter().any(|a| a == "--clippy"),
        }
    }
}

/// The plan of `cargo xtask test`.
#[derive(Debug)]
pub struct TestPlan {
    pub options: TestOptions,
    pub machine: Machine,
    /// The requirements of [`TEST_NEEDS`] the machine does not meet.
    pub missing: Vec<&'static Requirement>,
    /// What its first step does about them.
    pub packages: prereqs::Plan,
    pub steps: &'static [Step],
}

/// The plan of `cargo xtask test` with `options` on `machine`, where the requirements
/// `missing` are not met (those outside [`TEST_NEEDS`] are not its concern).
pub fn test(options: TestOptions, machine: Machine, missing: &[&'static Requirement]) -> TestPlan {
    let missing: Vec<&'static Requirement> = missing
        .iter()
        .copied()
        .filter(|r| TEST_NEEDS.contains(&r.need))
        .collect();
    TestPlan {
        packages: prereqs::plan(&missing, machine),
        options,
        machine,
        missing,
        steps: TEST_STEPS,
    }
}

impl TestPlan {
    /// What it stops with before building anything: one line per missing program, or
    /// [`NOT_ROOT`]; empty when it starts.
    pub fn refusal(&self) -> Vec<String> {
        match &self.packages {
            prereqs::Plan::Refuse(lines) => lines.clone(),
            _ if !self.machine.root => vec![NOT_ROOT.to_owned()],
            _ => Vec::new(),
        }
    }

    /// Its steps of `stage`, in order.
    pub fn stage(&self, stage: Stage) -> impl Iterator<Item = &'static Step> {
        self.steps.iter().filter(move |s| s.stage == stage)
    }

    /// The plan as `cargo xtask test --plan` prints it; `bins`: the test binaries (names) in
    /// the order they would run, each with whether it runs alone.
    pub fn render(&self, bins: &[(String, bool)]) -> String {
        let mut out = String::from("cargo xtask test: the plan (nothing was run)\n");
        out.push_str(&format!(
            "machine: {}, {}\n",
            if self.machine.root {
                "root"
            } else {
                "not root"
            },
            if self.machine.apt {
                "apt-get on PATH"
            } else {
                "no apt-get"
            }
        ));
        let args = |a: &[String]| {
            if a.is_empty() {
                "(none)".to_owned()
            } else {
                a.join(" ")
            }
        };
        out.push_str(&format!(
            "ARGS to cargo: {}; to each test binary: {}\n",
            args(&self.options.cargo_args),
            args(&self.options.bin_args)
        ));
        if self.options.clippy {
            out.push_str(
                "clippy -D warnings: in the workspace's build (--clippy), benches built too\n",
            );
        }
        match &self.packages {
            prereqs::Plan::Ready => out.push_str("system packages: all there\n"),
            prereqs::Plan::Install(p) => out.push_str(&format!(
                "system packages: first installs {} (apt-get update, apt-get install -y)\n",
                p.join(" ")
            )),
            prereqs::Plan::Refuse(_) => {}
        }
        let refusal = self.refusal();
        if !refusal.is_empty() {
            out.push_str("it would stop before building anything:\n");
            for l in &refusal {
                out.push_str(&format!("  {l}\n"));
            }
        }
        let base: Vec<String> = BASE_PROGRAMS.iter().map(ToString::to_string).collect();
        out.push_str(&format!(
            "not checked (the machine has them): {}\n",
            base.join(", ")
        ));
        out.push_str("steps, in order:\n");
        for (i, s) in self.steps.iter().enumerate() {
            let stage = match s.stage {
                Stage::Setup => "setup, stops on failure",
                Stage::Build => "build, stops on failure",
                Stage::Beside => "beside the builds, waited for after them",
                Stage::Suite => "suite, runs even if another failed",
            };
            out.push_str(&format!(
                "  {:>2}. {} [{stage}]\n",
                i + 1,
                s.phase.unwrap_or(s.what)
            ));
            if !s.runs.is_empty() {
                let runs: Vec<String> = s.runs.iter().map(ToString::to_string).collect();
                out.push_str(&format!("      runs: {}\n", runs.join(", ")));
            }
            if s.action == Action::RunTestBinaries {
                let alone = bins.iter().filter(|b| b.1).count();
                out.push_str(&format!(
                    "      {} test binaries: {alone} alone, one after another, then {} at most {} \
                     at a time\n",
                    bins.len(),
                    bins.len() - alone,
                    crate::testrun::PARALLEL
                ));
                for (name, solo) in bins {
                    let how = if *solo { "alone " } else { "shared" };
                    out.push_str(&format!("        {how} {name}\n"));
                }
            }
        }
        out
    }
}

/// A step of `cargo xtask lint`: its phase and the cargo commands it runs, each with what it
/// says first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LintStep {
    pub phase: String,
    pub commands: Vec<(String, Vec<String>)>,
}

/// The plan of `cargo xtask lint`.
#[derive(Debug)]
pub struct LintPlan {
    /// The requirements of [`LINT_NEEDS`] the machine does not meet.
    pub missing: Vec<&'static Requirement>,
    /// What its first phase, "system packages", does about them.
    pub packages: prereqs::Plan,
    /// The rest, in order: `cargo fmt --check` of each manifest, then clippy of each.
    pub steps: Vec<LintStep>,
}

/// The manifests `cargo xtask lint` checks: the workspace and the two SDK crates outside it.
pub const LINT_MANIFESTS: [&str; 3] =
    ["Cargo.toml", "sdk/python/Cargo.toml", "sdk/node/Cargo.toml"];

/// The plan of `cargo xtask lint` on `machine`, where the requirements `missing` are not met;
/// without the workspace's clippy when `workspace_clippy` is false (`--no-workspace-clippy`:
/// `cargo xtask test --clippy` lints the workspace in its build).
pub fn lint(
    machine: Machine,
    missing: &[&'static Requirement],
    workspace_clippy: bool,
) -> LintPlan {
    let missing: Vec<&'static Requirement> = missing
        .iter()
        .copied()
        .filter(|r| LINT_NEEDS.contains(&r.need))
        .collect();
    let words = |w: &[&str]| w.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    let fmt = LINT_MANIFESTS
        .iter()
        .map(|m| {
            let all: &[&str] = if *m == "Cargo.toml" { &["--all"] } else { &[] };
            let args = [&["fmt", "--manifest-path", m][..], all, &["--", "--check"]].concat();
            (format!("cargo fmt --check ({m})"), words(&args))
        })
        .collect();
    let mut steps = vec![LintStep {
        phase: "cargo fmt --check".to_owned(),
        commands: fmt,
    }];
    for m in LINT_MANIFESTS {
        if m == "Cargo.toml" && !workspace_clippy {
            continue;
        }
        // The SDK crates are workspaces of their own; in the workspace's target folder
        // they reuse what the workspace's clippy checked where versions and features agree
        // (and each other's), instead of checking every dependency again in a folder each.
        let workspace: &[&str] = if m == "Cargo.toml" {
            &["--workspace"]
        } else {
            &["--target-dir", "target"]
        };
        let args = [
            &["clippy", "--manifest-path", m][..],
            workspace,
            &["--all-targets", "--release", "--", "-D", "warnings"],
        ]
        .concat();
        steps.push(LintStep {
            phase: format!("cargo clippy ({m})"),
            commands: vec![(format!("cargo clippy ({m})"), words(&args))],
        });
    }
    LintPlan {
        packages: prereqs::plan(&missing, machine),
        missing,
        steps,
    }
}

/// The plan of `cargo xtask demo`: it installs nothing, whatever is missing (the Rust
/// toolchain is all it needs; `demo` never calls apt), builds the release binaries and runs
/// the hello chain. What it says first names the packages `cargo xtask test` would install.
#[derive(Debug, PartialEq, Eq)]
pub struct DemoPlan {
    /// The packages of the requirements `cargo xtask test` finds missing, in table order.
    pub test_would_install: Vec<&'static str>,
}

/// The plan of `cargo xtask demo` where the requirements `missing` are not met.
pub fn demo(missing: &[&'static Requirement]) -> DemoPlan {
    DemoPlan {
        test_would_install: missing
            .iter()
            .filter(|r| TEST_NEEDS.contains(&r.need))
            .filter_map(|r| r.package)
            .collect(),
    }
}

impl DemoPlan {
    /// What the demo says before it builds.
    pub fn note(&self) -> String {
        if self.test_would_install.is_empty() {
            "xtask: the demo needs no system packages beyond the Rust toolchain".to_owned()
        } else {
            format!(
                "xtask: the demo needs no system packages beyond the Rust toolchain; `cargo \
                 xtask test` would install {} (the sockmap transport's eBPF programs and the \
                 tests' programs)",
                self.test_would_install.join(" ")
            )
        }
    }
}

#[cfg(test)]
mod tests;
