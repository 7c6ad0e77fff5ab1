//! The SDKs and the polyglot example, built as a user builds them: the C SDK installed with
//! its header and pkg-config files (`cargo xtask c-sdk`), the Python SDK installed by pip, the
//! Node.js SDK's addon, and the five functions of `examples/polyglot` over them.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::builds::workspace_built;
use crate::cmd::{cargo, run, workspace_root};

/// `cargo xtask c-sdk [--prefix DIR]`.
pub fn c_sdk(args: &[String]) -> Result<()> {
    let prefix = match args {
        [] => workspace_root().join("target/c-sdk"),
        [flag, dir] if flag == "--prefix" => {
            let dir = PathBuf::from(dir);
            if dir.is_absolute() {
                dir
            } else {
                std::env::current_dir()?.join(dir)
            }
        }
        _ => bail!("usage: cargo xtask c-sdk [--prefix DIR]"),
    };
    if !workspace_built() {
        run(
            "building the C SDK (libzerohop.so, libzerohop.a)",
            cargo().args(["build", "--release", "-p", "zerohop-c"]),
        )?;
    }
    let (include, lib) = (prefix.join("include"), prefix.join("lib"));
    let pkgconfig = lib.join("pkgconfig");
    for d in [&include, &pkgconfig] {
        std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
    }
    let copy = |from: &str, to: &Path| -> Result<()> {
        std::fs::copy(from, to)
            .with_context(|| format!("copying {from} to {}", to.display()))
            .map(drop)
    };
    copy("sdk/c/include/zerohop.h", &include.join("zerohop.h"))?;
    copy("target/release/libzerohop.a", &lib.join("libzerohop.a"))?;
    copy("target/release/libzerohop.so", &lib.join("libzerohop.so"))?;
    for name in ["zerohop", "zerohop-static"] {
        let template = format!("sdk/c/{name}.pc.in");
        let pc = std::fs::read_to_string(&template)
            .context(template)?
            .replace("@PREFIX@", &prefix.display().to_string())
            .replace("@VERSION@", env!("CARGO_PKG_VERSION"));
        std::fs::write(pkgconfig.join(format!("{name}.pc")), pc)
            .with_context(|| format!("writing {name}.pc"))?;
    }
    eprintln!(
        "xtask: the C SDK is in {p}; build a function with\n  \
         PKG_CONFIG_PATH={p}/lib/pkgconfig cc f.c $(pkg-config --cflags --libs zerohop-static) -o f\n\
         (libzerohop.a linked in), or with `zerohop` instead of `zerohop-static` (libzerohop.so \
         from {p}/lib at run time)",
        p = prefix.display()
    );
    Ok(())
}

/// The Python the SDK is built and tested with: Debian's, which the chains' uids can run and
/// `zerohop new` picks for the Python starter (the same interpreter keeps pip's build of the
/// SDK in [`sdk_target_dir`] warm for both), else `python3` on PATH.
pub fn python() -> &'static str {
    if Path::new("/usr/bin/python3").is_file() {
        "/usr/bin/python3"
    } else {
        "python3"
    }
}

/// `pip install --upgrade --target FOLDER WHAT` with [`python`]: into a folder of its own (a
/// system Python, PEP 668, refuses installs into its own environment, not into a folder).
pub fn pip_install(step: &str, folder: &str, what: &str) -> Result<()> {
    run(step, &mut pip(folder, what))
}

fn pip(folder: &str, what: &str) -> Command {
    let mut c = Command::new(python());
    c.args([
        "-m",
        "pip",
        "install",
        "-q",
        "--upgrade",
        "--target",
        folder,
        what,
    ]);
    c
}

/// The cargo target folder of the SDK crates' builds (maturin's under pip for Python,
/// `build.js`'s for Node.js; both honour `CARGO_TARGET_DIR`): the workspace's, where `cargo
/// xtask lint` checks the same crates. The two SDKs are workspaces of their own with the same
/// runtime below them: in one folder the second build and the lint's checks reuse what they
/// agree on (the runtime's dependencies where their features agree, the proc-macro crates,
/// the build scripts) instead of each compiling all of it in a folder of its own (measured on
/// 2 cores: the Node.js addon after the Python module, 75 s of CPU instead of 112 s).
pub fn sdk_target_dir() -> PathBuf {
    workspace_root().join("target")
}

/// Installs the Python SDK into `target/python-sdk` (pip builds it with maturin).
pub fn python_sdk() -> Result<()> {
    run(
        "installing the Python SDK into target/python-sdk (pip builds it with maturin)",
        pip("target/python-sdk", "sdk/python").env("CARGO_TARGET_DIR", sdk_target_dir()),
    )
    .context("the Python SDK needs Python 3.11 or newer with pip (`python3` on PATH)")
}

/// Builds the Node.js SDK's native addon (`sdk/node/zerohop.node`, `npm run build`).
pub fn node_sdk() -> Result<()> {
    run(
        "building the Node.js SDK's addon (npm run build in sdk/node)",
        Command::new("npm")
            .args(["run", "--silent", "build"])
            .current_dir("sdk/node")
            .env("CARGO_TARGET_DIR", sdk_target_dir()),
    )
    .context("the Node.js SDK needs Node.js 18 or newer with npm (`npm` on PATH)")
}

/// Builds every SDK and the functions of `examples/polyglot` (after
/// [`crate::builds::build_bins`], which builds its Rust step): the C SDK, the C step (`target/polyglot/step-c`), the Go step
/// (`target/polyglot/step-go`), the Python SDK, the Node.js addon and the example's
/// `node_modules`.
pub fn polyglot_build() -> Result<()> {
    c_sdk(&[])?;
    let pkgconfig = workspace_root().join("target/c-sdk/lib/pkgconfig");
    let out = workspace_root().join("target/polyglot");
    std::fs::create_dir_all(&out)?;
    let flags = Command::new("pkg-config")
        .args(["--cflags", "--libs", "zerohop-static"])
        .env("PKG_CONFIG_PATH", &pkgconfig)
        .output()
        .context("running pkg-config (Debian: apt-get install pkg-config)")?;
    if !flags.status.success() {
        bail!(
            "pkg-config found no zerohop-static in {}",
            pkgconfig.display()
        );
    }
    let flags = String::from_utf8(flags.stdout)?;
    run(
        "compiling the C step of examples/polyglot",
        Command::new("cc")
            .args(["-O2", "-std=c11", "-Wall", "-Wextra", "-Werror"])
            .arg("examples/polyglot/step.c")
            .arg("-o")
            .arg(out.join("step-c"))
            .args(flags.split_whitespace()),
    )?;
    let stamp = go_sdk_stamp()?;
    run(
        "building the Go step of examples/polyglot",
        Command::new("go")
            .args(["build", "-buildvcs=false", &stamp, "-o"])
            .arg(out.join("step-go"))
            .arg(".")
            .current_dir("examples/polyglot/go")
            .env("PKG_CONFIG_PATH", &pkgconfig),
    )
    .context("the Go step needs Go 1.22 or newer (`go` on PATH)")?;
    python_sdk()?;
    node_sdk()?;
    run(
        "linking the Node.js SDK into examples/polyglot/node_modules",
        Command::new("npm")
            .args([
                "install",
                "--offline",
                "--no-audit",
                "--no-fund",
                "--silent",
            ])
            .current_dir("examples/polyglot"),
    )
}

/// The `-ldflags` argument for a `go build` or `go test` that links the C SDK's static
/// library: Go's build cache does not look at the contents of a library cgo links in, so a
/// stamp of it in the link flags makes Go link again when the SDK changed (else a stale
/// program, speaking an older protocol, comes from the cache).
pub fn go_sdk_stamp() -> Result<String> {
    let lib = std::fs::metadata(workspace_root().join("target/c-sdk/lib/libzerohop.a"))
        .context("the C SDK's libzerohop.a")?;
    Ok(format!(
        "-ldflags=-X=main.zerohopSDK={}-{}",
        lib.len(),
        lib.modified()?
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos()
    ))
}
