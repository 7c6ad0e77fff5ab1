//! `cargo xtask`: the one entry point for what plain cargo does not do in one step.
//!
//! * `cargo xtask demo`: builds the release binaries and runs the hello chain
//!   (`zerohop up examples/hello/chain.yaml`) until Ctrl-C.
//! * `cargo xtask polyglot`: builds the five functions of `examples/polyglot` (Python, Go,
//!   Rust, Node.js, C) and runs its chain until Ctrl-C.
//! * `cargo xtask kube`: builds kube-apiserver (the Kubernetes tests' control plane; the tests
//!   speak its REST API, no kubectl) from the Go module proxy into `target/kube/bin`
//!   (`xtask/kube` pins the version).
//! * `cargo xtask image`: builds the release binaries and the container image the Kubernetes
//!   manifests run, `zerohop:VERSION`, as an OCI image layout: `target/image/oci/` and the
//!   same as one archive, `target/image/zerohop-VERSION.oci.tar` (see `docs/kubernetes.md`).
//! * `cargo xtask test [--plan] [--clippy]`: installs the system packages the tests need (as root with apt;
//!   otherwise it names each missing program with the command that installs it and stops
//!   before building; see `prereqs`), builds the binaries the end-to-end tests start,
//!   kube-apiserver (`cargo xtask kube`, beside the Rust builds), the container
//!   image, every SDK (the C SDK in `target/c-sdk`, the Python SDK in `target/python-sdk`,
//!   the Node.js addon) and the polyglot example's functions, runs every test binary of the
//!   workspace (side by side where they do not compete, see `testrun`), the doc tests, the Go
//!   SDK's tests (`go test` in `sdk/go`), the Node.js SDK's (`node --test`) and the Python
//!   SDK's (pytest), zerohop-pool's and zerohop-transport's tests once more in debug (their
//!   `debug_assert!`s and overflow checks), then the loom model checks of the allocator and the
//!   ring (failing if the filter ran none), and prints where the time went (`phases`). The
//!   plan of all that is a value (`plan`), carried out by `testcmd`; `--plan` prints it and
//!   runs nothing.
//! * `cargo xtask lint`: installs what the build needs (clang and libbpf's headers for the
//!   eBPF programs), then `cargo fmt --check` and `cargo clippy -D warnings` over the
//!   workspace and the Python and Node.js SDK crates; `--no-workspace-clippy` leaves the
//!   workspace's to `cargo xtask test --clippy`, which lints it in its release build (CI).
//! * `cargo xtask phases`: prints the phases every task since `target/xtask/phases.tsv` was
//!   last emptied spent (`.ci/run` prints it at its end).
//! * `cargo xtask bench [--quick] [--no-scale] [--no-apps] [--no-activation] [--no-languages]
//!   [ARGS]`: builds everything, runs `zerohop-bench` (every system side by side, see
//!   `bench/README.md`) into `results/`, draws the plots, then runs the scale point
//!   (`zerohop-bench-scale`; `--no-scale` skips it), the applications beside their HTTP
//!   deployments (`zerohop-bench-apps`; `--no-apps` skips it), activation from zero, parked
//!   next to cold (`zerohop-bench-activation`; `--no-activation` skips it) and functions in
//!   each language (`zerohop-bench-languages`; `--no-languages` skips it).
//! * `cargo xtask c-sdk [--prefix DIR]`: builds the C SDK's library and installs it with its
//!   header and a pkg-config file under DIR (default `target/c-sdk`; see `docs/sdk-c.md`).
//! * `cargo xtask fuzz [--seconds N] [TARGET...]`: installs cargo-fuzz if it is missing, builds
//!   the fuzz targets of `fuzz/` and runs each (or the named ones) for N seconds (default 30),
//!   two at a time; fails naming the saved input if any target crashes (see `fuzz/README.md`).
//!
//! This file is the command line: the tasks' usage and which module carries each out.

#![forbid(unsafe_code)]

mod bench;
mod builds;
mod cmd;
mod demo;
mod fuzz;
mod image;
mod kube;
mod lint;
mod phases;
mod plan;
mod prereqs;
mod sdk;
mod testcmd;
mod testrun;

use anyhow::{bail, Context, Result};

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let root = cmd::workspace_root();
    std::env::set_current_dir(&root).context("cd to the workspace root")?;
    match args.first().map(String::as_str) {
        Some("demo") => demo::demo(&args[1..]),
        Some("test") => testcmd::test(&args[1..]),
        Some("lint") => lint::lint(&args[1..]),
        Some("phases") => phases::print_file(&root),
        Some("bench") => bench::bench(&args[1..]),
        Some("fuzz") => fuzz::fuzz(&args[1..]),
        Some("c-sdk") => sdk::c_sdk(&args[1..]),
        Some("polyglot") => demo::polyglot(&args[1..]),
        Some("kube") => kube::kube(&args[1..]),
        Some("image") => image::image(&args[1..]),
        _ => {
            eprintln!(
                "usage: cargo xtask <task>\n\n\
                 tasks:\n  \
                 demo [ARGS]   build and run the hello chain (extra ARGS go to `zerohop up`)\n  \
                 polyglot [ARGS]\n                \
                 build and run examples/polyglot (Python -> Go -> Rust -> Node.js -> C)\n  \
                 image         build the container image (an OCI layout) into target/image\n  \
                 kube          build kube-apiserver (the Kubernetes tests' control plane)\n                \
                 from the Go module proxy into target/kube/bin\n  \
                 test [ARGS]   install what the tests need, build, run all tests (ARGS go to\n                \
                 `cargo test`, ARGS after `--` to each test binary), then loom checks;\n                \
                 with --plan, print what it would install, build and run, in order;\n                \
                 with --clippy, clippy -D warnings lints the workspace as it builds\n  \
                 lint [--no-workspace-clippy]\n                \
                 install what the build needs, cargo fmt --check and clippy (of the\n                \
                 SDK crates only with --no-workspace-clippy: for `test --clippy`)\n  \
                 phases        print how long each phase of the last tasks took\n  \
                 bench [ARGS]  build, benchmark zerohop against the baselines (ARGS go to\n                \
                 zerohop-bench, e.g. --quick), write results/ and its plots, then the\n                \
                 scale point (--no-scale skips it), the applications (--no-apps),\n                \
                 activation from zero (--no-activation) and the languages (--no-languages)\n  \
                 fuzz [--seconds N] [TARGET...]\n                \
                 run the fuzz targets (all, or the named ones) for N seconds each (default 30)\n  \
                 c-sdk [--prefix DIR]\n                \
                 build the C SDK and install it (header, libraries, pkg-config file) under\n                \
                 DIR (default target/c-sdk)"
            );
            bail!("no task given");
        }
    }
}
