//! Making each language's function runnable: building it (C with `cc` and `pkg-config`, Go
//! with `go build`) or checking its toolchain and SDK, each command bounded in time; a
//! language whose toolchain or SDK is missing is not run, with the command that provides it.

use std::collections::BTreeMap;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::Serialize;

use crate::language::Language;

/// Bound on one build command (a first `go build` compiles the runtime's cgo parts).
pub(crate) const BUILD_WAIT: Duration = Duration::from_secs(600);

/// Bound on a toolchain's quick check (`python3 -c "import zerohop"`).
pub(crate) const CHECK_WAIT: Duration = Duration::from_secs(30);

/// The interpreters instances run with: instances run as the chain's own uid, which may not
/// be able to run an interpreter under `/root` (pyenv, nvm).
pub(crate) const PYTHON: &str = "/usr/bin/python3";

pub(crate) const NODE: &str = "/usr/bin/node";

/// How a language's function runs.
#[derive(Serialize, Debug, Clone)]
pub(crate) struct Function {
    /// The spec's `command`.
    pub(crate) command: Vec<String>,
    /// Extra environment of the spec (beyond the function's name).
    pub(crate) env: BTreeMap<String, String>,
    /// Source and how it was built.
    pub(crate) built: String,
}

/// Where things are.
pub(crate) struct Paths {
    /// The built binaries (`target/release`).
    pub(crate) bin: PathBuf,
    /// The target folder (`target`): installed SDKs.
    pub(crate) target: PathBuf,
    /// The checkout.
    pub(crate) root: PathBuf,
    /// Built functions and the Node module folder (`target/bench-languages`).
    pub(crate) work: PathBuf,
    /// Build logs and chain specs, removed at the end.
    pub(crate) scratch: PathBuf,
}

impl Paths {
    pub(crate) fn sources(&self) -> PathBuf {
        self.root.join("bench/languages")
    }

    pub(crate) fn pkg_config_path(&self) -> PathBuf {
        self.target.join("c-sdk/lib/pkgconfig")
    }
}

/// Why a language cannot be measured.
pub(crate) enum Skip {
    /// A toolchain or SDK is missing: reported, not an error.
    NotRun(String),
    /// Everything needed is there and it still failed.
    Failed(anyhow::Error),
}

impl From<anyhow::Error> for Skip {
    fn from(e: anyhow::Error) -> Self {
        Skip::Failed(e)
    }
}

pub(crate) fn not_run<T>(why: impl Into<String>) -> Result<T, Skip> {
    Err(Skip::NotRun(why.into()))
}

/// `name` on `PATH`.
pub(crate) fn on_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    })
}

/// Runs `cmd` (in a process group of its own, output into files of `scratch`) within
/// `limit`; its stdout, or an error with the tail of its stderr. At the limit the whole
/// group is killed (a build's compilers with it).
pub(crate) fn run_bounded(
    cmd: &mut Command,
    what: &str,
    scratch: &Path,
    limit: Duration,
) -> Result<String> {
    let tag = what.replace(|c: char| !c.is_ascii_alphanumeric(), "-");
    let (out_file, err_file) = (
        scratch.join(format!("{tag}.out")),
        scratch.join(format!("{tag}.err")),
    );
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_file)?)
        .stderr(std::fs::File::create(&err_file)?)
        .process_group(0)
        .spawn()
        .with_context(|| format!("starting {what}"))?;
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if Instant::now() >= deadline {
            // Its own group (process_group(0) above): the pgid is the child's pid.
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(child.id() as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
            let _ = child.wait();
            bail!("{what} did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let stdout = std::fs::read_to_string(&out_file).unwrap_or_default();
    if !status.success() {
        let stderr = std::fs::read_to_string(&err_file).unwrap_or_default();
        bail!("{what} failed ({status}): {}", tail(&stderr, 12));
    }
    Ok(stdout)
}

/// The last `n` lines of `text`, joined with " | " (one line in a report).
pub(crate) fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(n)..].join(" | ")
}

/// Makes `language`'s pass-through function runnable; how the spec runs it.
pub(crate) fn prepare(language: Language, p: &Paths) -> Result<Function, Skip> {
    let src = p.sources();
    match language {
        Language::Rust => {
            let bin = zerohop_bench::need_bin(&p.bin, "zerohop-bench-lang-pass")?;
            Ok(Function {
                command: vec![bin.display().to_string()],
                env: BTreeMap::new(),
                built: "bench/languages/pass.rs, cargo build --release (the Rust runtime)".into(),
            })
        }
        Language::C => {
            let cc = on_path("cc").or_else(|| on_path("gcc"));
            let Some(cc) = cc else {
                return not_run("no C compiler (`cc` or `gcc`) on PATH");
            };
            let flags = c_sdk_flags(p)?;
            let out = p.work.join("pass-c");
            eprintln!("zerohop-bench-languages: c: building {}", out.display());
            run_bounded(
                Command::new(&cc)
                    .arg("-O2")
                    .arg("-o")
                    .arg(&out)
                    .arg(src.join("pass.c"))
                    .args(&flags),
                "cc pass.c",
                &p.scratch,
                BUILD_WAIT,
            )?;
            Ok(Function {
                command: vec![out.display().to_string()],
                env: BTreeMap::new(),
                built: format!(
                    "bench/languages/pass.c, {} -O2 with pkg-config zerohop-static (libzerohop.a \
                     of target/c-sdk linked in)",
                    cc.display()
                ),
            })
        }
        Language::Go => {
            let Some(go) = on_path("go") else {
                return not_run("no Go toolchain (`go`) on PATH");
            };
            // Fails early, with the command to run, when the C SDK is missing.
            c_sdk_flags(p)?;
            let out = p.work.join("pass-go");
            eprintln!(
                "zerohop-bench-languages: go: building {} (the first build takes a while)",
                out.display()
            );
            run_bounded(
                Command::new(&go)
                    .args(["build", "-buildvcs=false", "-o"])
                    .arg(&out)
                    .arg(".")
                    .current_dir(src.join("go"))
                    .env("PKG_CONFIG_PATH", p.pkg_config_path()),
                "go build",
                &p.scratch,
                BUILD_WAIT,
            )?;
            let version = run_bounded(
                Command::new(&go).arg("version"),
                "go version",
                &p.scratch,
                CHECK_WAIT,
            )
            .unwrap_or_default();
            Ok(Function {
                command: vec![out.display().to_string()],
                env: BTreeMap::new(),
                built: format!(
                    "bench/languages/go/main.go, go build over sdk/go (cgo, libzerohop.a of \
                     target/c-sdk); {}",
                    version.trim()
                ),
            })
        }
        Language::Python => {
            if !Path::new(PYTHON).is_file() {
                return not_run(format!("{PYTHON} does not exist"));
            }
            let sdk = p.target.join("python-sdk");
            if !sdk.join("zerohop").is_dir() {
                return not_run(format!(
                    "the Python SDK is not installed in {0}: run `python3 -m pip install \
                     --target {0} sdk/python`",
                    sdk.display()
                ));
            }
            let version = run_bounded(
                Command::new(PYTHON)
                    .args(["-c", "import sys, zerohop; print(sys.version.split()[0])"])
                    .env("PYTHONPATH", &sdk),
                "python3 import zerohop",
                &p.scratch,
                CHECK_WAIT,
            )?;
            Ok(Function {
                command: vec![PYTHON.into(), src.join("pass.py").display().to_string()],
                env: BTreeMap::from([("PYTHONPATH".into(), sdk.display().to_string())]),
                built: format!(
                    "bench/languages/pass.py on Python {} with the SDK of target/python-sdk",
                    version.trim()
                ),
            })
        }
        Language::Node => {
            if !Path::new(NODE).is_file() {
                return not_run(format!("{NODE} does not exist"));
            }
            let sdk = p.root.join("sdk/node");
            if !sdk.join("package.json").is_file() {
                return not_run("the Node.js SDK (sdk/node) is not in this checkout yet");
            }
            if !sdk.join("zerohop.node").is_file() {
                return not_run(
                    "the Node.js SDK is not built (no sdk/node/zerohop.node): run `npm run \
                     build` in sdk/node",
                );
            }
            // `require('zerohop')` as in a user's project: the function beside a
            // `node_modules/zerohop` (here a link to sdk/node). NODE_PATH would not do:
            // instances run in glibc's secure mode, where Node ignores it.
            let modules = p.work.join("node_modules");
            std::fs::create_dir_all(&modules).map_err(anyhow::Error::from)?;
            let link = modules.join("zerohop");
            if link.symlink_metadata().is_ok() {
                std::fs::remove_file(&link).map_err(anyhow::Error::from)?;
            }
            std::os::unix::fs::symlink(&sdk, &link).map_err(anyhow::Error::from)?;
            let script = p.work.join("pass.js");
            std::fs::copy(src.join("pass.js"), &script).map_err(anyhow::Error::from)?;
            let version = run_bounded(
                Command::new(NODE)
                    .args(["-e", "require('zerohop'); console.log(process.version)"])
                    .current_dir(&p.work),
                "node require zerohop",
                &p.scratch,
                CHECK_WAIT,
            )?;
            Ok(Function {
                command: vec![NODE.into(), script.display().to_string()],
                env: BTreeMap::new(),
                built: format!(
                    "bench/languages/pass.js on Node.js {} with sdk/node (napi-rs addon), copied \
                     beside a node_modules/zerohop link to it",
                    version.trim()
                ),
            })
        }
    }
}

/// Compiler and linker flags of the installed C SDK (`pkg-config zerohop-static`).
pub(crate) fn c_sdk_flags(p: &Paths) -> Result<Vec<String>, Skip> {
    if on_path("pkg-config").is_none() {
        return not_run("no `pkg-config` on PATH (the C SDK is found through it)");
    }
    let pc = p.pkg_config_path();
    if !pc.join("zerohop-static.pc").is_file() {
        return not_run(format!(
            "the C SDK is not installed in {}: run `cargo xtask c-sdk`",
            pc.parent().and_then(Path::parent).unwrap_or(&pc).display()
        ));
    }
    let flags = run_bounded(
        Command::new("pkg-config")
            .args(["--cflags", "--libs", "zerohop-static"])
            .env("PKG_CONFIG_PATH", &pc),
        "pkg-config zerohop-static",
        &p.scratch,
        CHECK_WAIT,
    )?;
    Ok(flags.split_whitespace().map(str::to_owned).collect())
}
