//! The plans whole: what `cargo xtask test` installs before what, refuses, builds before
//! which test, runs in which order (every test binary once); `lint`'s and `demo`'s plans.

use std::path::PathBuf;

use serde_json::json;

use super::*;
use crate::prereqs::{Plan, REQUIREMENTS};
use crate::testrun::{self, SOLO};

const ROOT_APT: Machine = Machine {
    root: true,
    apt: true,
};
const MACHINES: [Machine; 4] = [
    ROOT_APT,
    Machine {
        root: true,
        apt: false,
    },
    Machine {
        root: false,
        apt: true,
    },
    Machine {
        root: false,
        apt: false,
    },
];

fn all_missing() -> Vec<&'static Requirement> {
    REQUIREMENTS.iter().collect()
}

fn packaged_missing() -> Vec<&'static Requirement> {
    REQUIREMENTS
        .iter()
        .filter(|r| r.package.is_some())
        .collect()
}

fn requirement(probe: &Probe) -> Option<&'static Requirement> {
    REQUIREMENTS.iter().find(|r| r.probe == *probe)
}

fn index(action: Action) -> usize {
    TEST_STEPS
        .iter()
        .position(|s| s.action == action)
        .unwrap_or_else(|| panic!("no step {action:?}"))
}

#[test]
fn the_test_command_runs_these_steps_in_this_order() {
    let plan = test(TestOptions::default(), ROOT_APT, &[]);
    let steps: Vec<(&str, Stage)> = plan
        .steps
        .iter()
        .map(|s| (s.phase.unwrap_or(s.what), s.stage))
        .collect();
    assert_eq!(
        steps,
        [
            ("system packages", Stage::Setup),
            ("the check that it runs as root", Stage::Setup),
            ("build: kube-apiserver (beside the above)", Stage::Beside),
            (
                "build: the workspace (libraries, binaries, tests)",
                Stage::Build
            ),
            ("build: container image", Stage::Build),
            ("build: SDKs, polyglot example", Stage::Build),
            ("build: test binaries", Stage::Build),
            ("the workspace's test binaries", Stage::Suite),
            ("tests: doc tests", Stage::Suite),
            ("tests: Go SDK", Stage::Suite),
            ("tests: Node.js SDK", Stage::Suite),
            ("tests: Python SDK", Stage::Suite),
            ("tests: pool, transport in debug", Stage::Suite),
            ("tests: loom", Stage::Suite),
        ]
    );
    // Setup, then the builds (the one beside them among them), then the suites.
    let stages: Vec<Stage> = plan
        .steps
        .iter()
        .map(|s| match s.stage {
            Stage::Beside => Stage::Build,
            other => other,
        })
        .collect();
    let mut sorted = stages.clone();
    sorted.sort();
    assert_eq!(stages, sorted, "a stage out of order");
    // Each suite has a name of its own in the failure list.
    let mut whats: Vec<&str> = plan.stage(Stage::Suite).map(|s| s.what).collect();
    whats.sort_unstable();
    whats.dedup();
    assert_eq!(whats.len(), plan.stage(Stage::Suite).count());
}

#[test]
fn every_program_a_step_runs_is_checked_first_and_every_check_has_a_step() {
    assert_eq!(index(Action::Packages), 0, "the packages come first");
    for step in TEST_STEPS {
        for probe in step.runs {
            match requirement(probe) {
                Some(r) => assert!(
                    TEST_NEEDS.contains(&r.need),
                    "{}: {probe} is not checked by the test command",
                    step.what
                ),
                None => assert!(
                    BASE_PROGRAMS.contains(probe),
                    "{}: {probe} is neither a requirement nor the machine's own",
                    step.what
                ),
            }
        }
    }
    for r in REQUIREMENTS.iter().filter(|r| TEST_NEEDS.contains(&r.need)) {
        assert!(
            TEST_STEPS.iter().any(|s| s.runs.contains(&r.probe)),
            "no step runs {} ({}): a stale requirement",
            r.probe,
            r.why
        );
    }
    for p in BASE_PROGRAMS {
        assert!(requirement(p).is_none(), "{p} is both checked and assumed");
    }
}

#[test]
fn as_root_with_apt_the_first_step_installs_the_package_of_every_program_any_step_runs() {
    let plan = test(TestOptions::default(), ROOT_APT, &packaged_missing());
    let Plan::Install(packages) = &plan.packages else {
        panic!("not installed: {:?}", plan.packages)
    };
    assert_eq!(
        *packages,
        [
            "binutils",
            "clang",
            "curl",
            "etcd-server",
            "gcc",
            "iproute2",
            "libbpf-dev",
            "libc6-dev",
            "libcoap3-bin",
            "linux-libc-dev",
            "make",
            "mosquitto",
            "mosquitto-clients",
            "nghttp2-client",
            "nginx-light",
            "npm",
            "openssl",
            "pkg-config",
            "prometheus",
            "python3",
            "python3-pip",
            "python3-venv",
            "runc",
            "util-linux",
            "wrk",
        ]
    );
    for step in TEST_STEPS {
        for r in step.runs.iter().filter_map(requirement) {
            if let Some(p) = r.package {
                assert!(packages.contains(&p), "{}: {p} not installed", step.what);
            }
        }
    }
    assert!(plan.refusal().is_empty(), "{:?}", plan.refusal());
    // The image step's strip, say: installed by the first step, before the image.
    assert!(packages.contains(&"binutils") && index(Action::Packages) < index(Action::Image));
}

#[test]
fn a_missing_program_refuses_with_one_line_and_its_command_unless_root_with_apt_installs_it() {
    for r in REQUIREMENTS {
        for machine in MACHINES {
            let plan = test(TestOptions::default(), machine, &[r]);
            // No fact ever drops a step: a missing program installs or refuses.
            assert_eq!(plan.steps, TEST_STEPS);
            match (r.package, machine.root && machine.apt) {
                (Some(p), true) => {
                    assert_eq!(plan.packages, Plan::Install(vec![p]));
                    assert!(plan.refusal().is_empty());
                }
                (package, _) => {
                    let lines = plan.refusal();
                    assert_eq!(plan.packages, Plan::Refuse(lines.clone()));
                    assert_eq!(lines.len(), 1, "{lines:?}");
                    let line = &lines[0];
                    assert!(line.starts_with(&format!("missing {}", r.probe)), "{line}");
                    let command = match package {
                        Some(p) if machine.root => format!("with `apt-get install {p}`"),
                        Some(p) => format!("with `sudo apt-get install {p}`"),
                        None => "https://".to_owned(),
                    };
                    assert!(line.contains(&command), "{line} lacks {command}");
                }
            }
        }
    }
}

#[test]
fn without_root_every_missing_program_has_its_line_in_table_order() {
    let missing = all_missing();
    let plan = test(
        TestOptions::default(),
        Machine {
            root: false,
            apt: true,
        },
        &missing,
    );
    let lines = plan.refusal();
    assert_eq!(lines.len(), missing.len());
    for (line, r) in lines.iter().zip(&missing) {
        assert!(line.starts_with(&format!("missing {}", r.probe)), "{line}");
    }
    assert_eq!(
        lines[0],
        "missing clang (compiles the sockmap transport's eBPF programs): install it with `sudo \
         apt-get install clang`"
    );
    // With everything there it still refuses to run the tests but as root.
    let plan = test(
        TestOptions::default(),
        Machine {
            root: false,
            apt: false,
        },
        &[],
    );
    assert_eq!(plan.packages, Plan::Ready);
    assert_eq!(plan.refusal(), [NOT_ROOT]);
    // A toolchain apt cannot give refuses even as root with apt, naming the others too.
    let go_and_mqtt: Vec<_> = REQUIREMENTS
        .iter()
        .filter(|r| matches!(r.probe, Probe::Program("go" | "mosquitto")))
        .collect();
    let lines = test(TestOptions::default(), ROOT_APT, &go_and_mqtt).refusal();
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(
        lines[0].ends_with("`apt-get install mosquitto`"),
        "{lines:?}"
    );
    assert!(
        lines[1].starts_with("missing go: install Go 1.24"),
        "{lines:?}"
    );
}

#[test]
fn what_a_step_uses_is_made_before_it_and_what_is_built_beside_only_by_the_suites() {
    for (i, step) in TEST_STEPS.iter().enumerate() {
        for a in step.uses {
            let makers: Vec<usize> = (0..TEST_STEPS.len())
                .filter(|&m| TEST_STEPS[m].makes.contains(a))
                .collect();
            assert_eq!(makers.len(), 1, "{a:?} is made by {makers:?}");
            let m = makers[0];
            assert!(m < i, "{} uses {a:?} before it is made", step.what);
            if TEST_STEPS[m].stage == Stage::Beside {
                assert_eq!(
                    step.stage,
                    Stage::Suite,
                    "{} uses {a:?} before it is waited for",
                    step.what
                );
            }
        }
    }
    assert!(index(Action::Workspace) < index(Action::Image));
    assert!(index(Action::Image) < index(Action::RunTestBinaries));
    assert!(index(Action::Sdks) < index(Action::GoSdkTests));
    assert!(index(Action::TestBinaries) < index(Action::RunTestBinaries));
    assert_eq!(
        TEST_STEPS[index(Action::RunTestBinaries)].uses,
        [
            Artifact::TestBinaries,
            Artifact::Workspace,
            Artifact::Kube,
            Artifact::Image,
            Artifact::Sdks
        ]
    );
    assert_eq!(
        TEST_STEPS.last().map(|s| s.action),
        Some(Action::Loom),
        "the loom checks end it"
    );
}

#[test]
fn arguments_split_at_the_double_dash_and_plan_is_taken_only_before_it() {
    let args = |a: &[&str]| a.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    let o = TestOptions::parse(&args(&[
        "-p",
        "zerohop-pool",
        "--plan",
        "--",
        "--nocapture",
        "--plan",
    ]));
    assert_eq!(o.cargo_args, ["-p", "zerohop-pool"]);
    assert_eq!(o.bin_args, ["--nocapture", "--plan"]);
    assert!(o.print_plan);
    let o = TestOptions::parse(&args(&["--features", "x", "--", "t"]));
    assert_eq!(
        (o.cargo_args, o.bin_args, o.print_plan),
        (args(&["--features", "x"]), args(&["t"]), false)
    );
    assert_eq!(TestOptions::parse(&[]), TestOptions::default());
    // `--clippy` is the task's, not cargo's, and only before `--`.
    let o = TestOptions::parse(&args(&["--clippy", "-p", "x", "--", "--clippy"]));
    assert!(o.clippy);
    assert_eq!(o.cargo_args, ["-p", "x"]);
    assert_eq!(o.bin_args, ["--clippy"]);
    assert!(!TestOptions::parse(&args(&["--", "--clippy"])).clippy);
}

#[test]
fn lint_without_the_workspace_s_clippy_keeps_fmt_and_the_sdks_clippy() {
    let plan = lint(ROOT_APT, &[], false);
    let phases: Vec<&str> = plan.steps.iter().map(|s| s.phase.as_str()).collect();
    assert_eq!(
        phases,
        [
            "cargo fmt --check",
            "cargo clippy (sdk/python/Cargo.toml)",
            "cargo clippy (sdk/node/Cargo.toml)",
        ]
    );
    assert_eq!(
        plan.steps[0].commands.len(),
        3,
        "fmt still checks all three"
    );
}

/// One `compiler-artifact` message as cargo prints it, of the package `(folder, name)`.
fn artifact(package: (&str, &str), kind: &[&str], name: &str, test: bool, exe: bool) -> String {
    let (dir, package) = package;
    let id = if dir.ends_with(package) {
        format!("path+file:///w/{dir}#0.1.0")
    } else {
        format!("path+file:///w/{dir}#{package}@0.1.0")
    };
    let executable = exe.then(|| format!("/w/target/release/deps/{name}-{package}{}", test as u8));
    json!({
        "reason": "compiler-artifact",
        "package_id": id,
        "manifest_path": format!("/w/{dir}/Cargo.toml"),
        "target": { "kind": kind, "crate_types": kind, "name": name, "test": true },
        "profile": { "opt_level": "3", "test": test },
        "executable": executable,
        "fresh": true,
    })
    .to_string()
}

const POOL: (&str, &str) = ("crates/zerohop-pool", "zerohop-pool");
const TRANSPORT: (&str, &str) = ("crates/zerohop-transport", "zerohop-transport");
const C: (&str, &str) = ("crates/zerohop-c", "zerohop-c");
const CLI: (&str, &str) = ("crates/zerohop-cli", "zerohop-cli");
const BENCH: (&str, &str) = ("bench", "zerohop-bench");
const E2E: (&str, &str) = ("crates/zerohop-e2e", "zerohop-e2e");
const XTASK: (&str, &str) = ("xtask", "xtask");

/// A workspace as the build of its test binaries reports it: libraries (one a C library),
/// binaries, integration tests, with what is not a test binary (a library's own build, a
/// build script, a binary's release build, diagnostics) and one test reported twice.
fn fake_build_messages() -> String {
    let script = json!({
        "reason": "build-script-executed",
        "package_id": "path+file:///w/crates/zerohop-transport#0.1.0",
    });
    let warning = json!({"reason": "compiler-message", "message": {"rendered": "warning: x"}});
    let lines = [
        "not json at all".to_owned(),
        artifact(
            TRANSPORT,
            &["custom-build"],
            "build-script-build",
            false,
            true,
        ),
        script.to_string(),
        artifact(POOL, &["lib"], "zerohop_pool", false, false),
        artifact(POOL, &["lib"], "zerohop_pool", true, true),
        artifact(POOL, &["test"], "stress", true, true),
        artifact(POOL, &["test"], "state", true, true),
        artifact(TRANSPORT, &["lib"], "zerohop_transport", true, true),
        artifact(C, &["cdylib", "staticlib"], "zerohop", false, false),
        artifact(C, &["cdylib", "staticlib"], "zerohop", true, true),
        artifact(CLI, &["bin"], "zerohop", false, true),
        artifact(CLI, &["bin"], "zerohop", true, true),
        artifact(BENCH, &["lib"], "zerohop_bench", true, true),
        artifact(BENCH, &["bin"], "zerohop-bench", true, true),
        artifact(BENCH, &["test"], "smoke", true, true),
        artifact(E2E, &["test"], "kubernetes", true, true),
        artifact(E2E, &["test"], "http", true, true),
        warning.to_string(),
        artifact(E2E, &["test"], "http", true, true),
        artifact(XTASK, &["bin"], "xtask", true, true),
        artifact(XTASK, &["test"], "prereqs", true, true),
        json!({"reason": "build-finished", "success": true}).to_string(),
    ];
    lines.join("\n")
}

/// The same workspace as `cargo metadata --no-deps` gives it, with the targets no test
/// binary comes from (a benchmark, a build script, an example) and a package outside it.
fn fake_metadata() -> String {
    let t =
        |kind: &[&str], name: &str, test: bool| json!({"kind": kind, "name": name, "test": test});
    let package = |dir: &str, name: &str, targets: Vec<serde_json::Value>| {
        let id = format!("path+file:///w/{dir}#{name}@0.1.0");
        json!({"id": id, "name": name, "targets": targets})
    };
    let packages = vec![
        package(
            "crates/zerohop-pool",
            "zerohop-pool",
            vec![
                t(&["lib"], "zerohop_pool", true),
                t(&["test"], "stress", true),
                t(&["test"], "state", true),
                t(&["bench"], "alloc", false),
            ],
        ),
        package(
            "crates/zerohop-transport",
            "zerohop-transport",
            vec![
                t(&["lib"], "zerohop_transport", true),
                t(&["custom-build"], "build-script-build", false),
            ],
        ),
        package(
            "crates/zerohop-c",
            "zerohop-c",
            vec![t(&["cdylib", "staticlib"], "zerohop", true)],
        ),
        package(
            "crates/zerohop-cli",
            "zerohop-cli",
            vec![t(&["bin"], "zerohop", true)],
        ),
        package(
            "bench",
            "zerohop-bench",
            vec![
                t(&["lib"], "zerohop_bench", true),
                t(&["bin"], "zerohop-bench", true),
                t(&["test"], "smoke", true),
                t(&["example"], "demo", false),
            ],
        ),
        package(
            "crates/zerohop-e2e",
            "zerohop-e2e",
            vec![t(&["test"], "kubernetes", true), t(&["test"], "http", true)],
        ),
        package(
            "xtask",
            "xtask",
            vec![t(&["bin"], "xtask", true), t(&["test"], "prereqs", true)],
        ),
        package("registry/serde", "serde", vec![t(&["lib"], "serde", true)]),
    ];
    let members: Vec<&serde_json::Value> = packages
        .iter()
        .filter(|p| p["name"] != "serde")
        .map(|p| &p["id"])
        .collect();
    json!({"packages": packages, "workspace_members": members}).to_string()
}

const FAKE_BINARIES: [&str; 13] = [
    "xtask::prereqs",
    "xtask::xtask",
    "zerohop-bench::lib",
    "zerohop-bench::smoke",
    "zerohop-bench::zerohop-bench",
    "zerohop-c::zerohop",
    "zerohop-cli::zerohop",
    "zerohop-e2e::http",
    "zerohop-e2e::kubernetes",
    "zerohop-pool::lib",
    "zerohop-pool::state",
    "zerohop-pool::stress",
    "zerohop-transport::lib",
];

#[test]
fn every_test_binary_of_the_workspace_runs_exactly_once_those_that_measure_alone_first() {
    let bins = testrun::parse_artifacts(&fake_build_messages());
    let names: Vec<&str> = bins.iter().map(|b| b.name.as_str()).collect();
    assert_eq!(names, FAKE_BINARIES);
    let http = &bins[7];
    assert_eq!(
        http.exe,
        PathBuf::from("/w/target/release/deps/http-zerohop-e2e1")
    );
    assert_eq!(http.dir, PathBuf::from("/w/crates/zerohop-e2e"));
    // `cargo xtask test --plan` names them from cargo metadata before anything is built: the
    // same binaries.
    assert_eq!(
        testrun::names_from_metadata(&fake_metadata()).expect("metadata"),
        FAKE_BINARIES
    );
    let (alone, shared) = testrun::schedule(&names, SOLO);
    let order: Vec<&str> = alone.iter().chain(&shared).map(|&i| names[i]).collect();
    assert_eq!(
        order[..3],
        [
            "zerohop-bench::smoke",
            "zerohop-e2e::kubernetes",
            "zerohop-pool::stress"
        ]
    );
    let mut each = order.clone();
    each.sort_unstable();
    assert_eq!(each, FAKE_BINARIES, "each binary once in the run");
}

/// The real workspace: every binary that runs alone is one of its test binaries, and no two
/// share a name (each writes `target/xtask/test-logs/NAME.log`).
#[test]
fn the_workspace_s_test_binaries_have_names_of_their_own_and_include_the_solo_ones() {
    let names = testrun::workspace_names().expect("cargo metadata");
    let mut unique = names.clone();
    unique.dedup();
    assert_eq!(unique, names, "two test binaries share a name");
    for solo in SOLO {
        assert!(names.iter().any(|n| n == solo), "{solo} is no test binary");
    }
    for known in [
        "zerohop-pool::lib",
        "zerohop-c::zerohop",
        "xtask::xtask",
        "xtask::prereqs",
    ] {
        assert!(
            names.iter().any(|n| n == known),
            "{known} missing: {names:?}"
        );
    }
}

#[test]
fn the_printed_plan_names_the_installs_each_step_and_every_binary() {
    let missing: Vec<_> = REQUIREMENTS
        .iter()
        .filter(|r| matches!(r.probe, Probe::Program("mosquitto" | "clang")))
        .collect();
    let mut options = TestOptions::parse(&["--plan".to_owned(), "--".to_owned(), "x".to_owned()]);
    options.cargo_args.push("-p".to_owned());
    let plan = test(options, ROOT_APT, &missing);
    let bins = [
        ("a::solo".to_owned(), true),
        ("b::lib".to_owned(), false),
        ("c::t".to_owned(), false),
    ];
    let text = plan.render(&bins);
    for line in [
        "machine: root, apt-get on PATH",
        "ARGS to cargo: -p; to each test binary: x",
        "system packages: first installs clang mosquitto (apt-get update, apt-get install -y)",
        "   1. system packages [setup, stops on failure]",
        "   3. build: kube-apiserver (beside the above) [beside the builds, \
         waited for after them]",
        "      runs: go",
        "   8. the workspace's test binaries [suite, runs even if another failed]",
        "      3 test binaries: 1 alone, one after another, then 2 at most 2 at a time",
        "        alone  a::solo",
        "        shared c::t",
        "  14. tests: loom [suite, runs even if another failed]",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "no line {line:?} in:\n{text}"
        );
    }
    assert!(!text.contains("would stop"), "{text}");
    let refused = test(
        TestOptions::default(),
        Machine {
            root: false,
            apt: false,
        },
        &missing,
    )
    .render(&[]);
    assert!(
        refused.contains(
            "it would stop before building anything:\n  missing clang (compiles the sockmap \
             transport's eBPF programs): install it with `sudo apt-get install clang`\n  missing \
             mosquitto"
        ),
        "{refused}"
    );
}

#[test]
fn lint_installs_what_the_build_needs_then_formats_then_runs_clippy_on_each_manifest() {
    let plan = lint(ROOT_APT, &all_missing(), true);
    assert_eq!(
        plan.packages,
        Plan::Install(vec!["clang", "libbpf-dev", "linux-libc-dev"])
    );
    let phases: Vec<&str> = plan.steps.iter().map(|s| s.phase.as_str()).collect();
    assert_eq!(
        phases,
        [
            "cargo fmt --check",
            "cargo clippy (Cargo.toml)",
            "cargo clippy (sdk/python/Cargo.toml)",
            "cargo clippy (sdk/node/Cargo.toml)",
        ]
    );
    let command = |step: usize, i: usize| plan.steps[step].commands[i].1.join(" ");
    assert_eq!(plan.steps[0].commands.len(), 3);
    assert_eq!(
        command(0, 0),
        "fmt --manifest-path Cargo.toml --all -- --check"
    );
    assert_eq!(
        command(0, 2),
        "fmt --manifest-path sdk/node/Cargo.toml -- --check"
    );
    assert_eq!(
        command(1, 0),
        "clippy --manifest-path Cargo.toml --workspace --all-targets --release -- -D warnings"
    );
    assert_eq!(
        command(3, 0),
        "clippy --manifest-path sdk/node/Cargo.toml --target-dir target --all-targets --release -- -D warnings"
    );
    assert_eq!(
        plan.steps[2].commands[0].0,
        "cargo clippy (sdk/python/Cargo.toml)"
    );
    // Not root: it refuses, naming only the build's programs.
    let plan = lint(
        Machine {
            root: false,
            apt: true,
        },
        &all_missing(),
        true,
    );
    let Plan::Refuse(lines) = plan.packages else {
        panic!("not refused")
    };
    assert_eq!(lines.len(), 3, "{lines:?}");
}

#[test]
fn the_demo_installs_nothing_and_names_what_the_test_command_would_install() {
    assert_eq!(
        demo(&[]).note(),
        "xtask: the demo needs no system packages beyond the Rust toolchain"
    );
    let some: Vec<_> = REQUIREMENTS
        .iter()
        .filter(|r| matches!(r.probe, Probe::Program("clang" | "mosquitto" | "go")))
        .collect();
    assert_eq!(
        demo(&some).note(),
        "xtask: the demo needs no system packages beyond the Rust toolchain; `cargo xtask test` \
         would install clang mosquitto (the sockmap transport's eBPF programs and the tests' \
         programs)"
    );
    // Whatever is missing, the demo names exactly the packages the test command installs.
    let mut named = demo(&all_missing()).test_would_install;
    named.sort_unstable();
    let Plan::Install(installed) =
        test(TestOptions::default(), ROOT_APT, &packaged_missing()).packages
    else {
        panic!("not installed")
    };
    assert_eq!(named, installed);
}
