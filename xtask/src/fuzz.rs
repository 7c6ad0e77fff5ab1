//! `cargo xtask fuzz [--seconds N] [TARGET...]`: installs cargo-fuzz if it is missing, builds
//! the fuzz targets of `fuzz/` once and runs each (or the named ones) for N seconds (default
//! 30), [`AT_ONCE`] at a time, starting from the committed seeds in `fuzz/corpus/TARGET`
//! (read only; what a run finds goes to `fuzz/target/corpus/TARGET`). Fails if any target
//! crashed, naming the input libFuzzer saved.
//!
//! The targets build with `cargo fuzz build --dev`, whose profile `fuzz/Cargo.toml` sets to
//! `opt-level = 1`: measured on a 2-core machine, half the build of `--release` (which
//! cargo-fuzz builds as one codegen unit per crate, with debug information) at as many
//! executions per second.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{bail, Context, Result};

use crate::cmd::{cargo, run, workspace_root};
use crate::phases;

const USAGE: &str = "usage: cargo xtask fuzz [--seconds N] [TARGET...]";

/// Targets fuzzing at once: libFuzzer runs one thread per target, and the machines this runs
/// on have 2 cores.
const AT_ONCE: usize = 2;

/// How one target's run ended.
struct Outcome {
    target: String,
    took: Duration,
    status: ExitStatus,
    inputs: Vec<PathBuf>,
}

pub fn fuzz(args: &[String]) -> Result<()> {
    let (seconds, mut targets) = parse(args)?;
    ensure_cargo_fuzz()?;
    let known = fuzz_targets()?;
    if targets.is_empty() {
        targets = known;
    } else if let Some(t) = targets.iter().find(|t| !known.contains(t)) {
        bail!(
            "no fuzz target {t:?}; the targets are: {}",
            known.join(", ")
        );
    }

    let started = Instant::now();
    let mut ph = phases::Phases::new(&workspace_root(), "fuzz");
    ph.time("build (AddressSanitizer + libFuzzer, opt-level 1)", || {
        run(
            "building the fuzz targets (AddressSanitizer + libFuzzer; the first build takes minutes)",
            cargo_fuzz().args(["build", "--dev"]),
        )
    })?;
    let queue = Mutex::new(targets.iter().enumerate());
    let outcomes = Mutex::new(Vec::new());
    let total = targets.len();
    std::thread::scope(|s| {
        for _ in 0..AT_ONCE.min(total) {
            s.spawn(|| loop {
                let next = queue.lock().unwrap_or_else(|p| p.into_inner()).next();
                let Some((i, t)) = next else { break };
                eprintln!("xtask: fuzzing {t} for {seconds} s ({}/{total})", i + 1);
                let outcome = run_target(t, seconds);
                outcomes
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(outcome);
            });
        }
    });
    let mut failed = Vec::new();
    for outcome in outcomes.into_inner().unwrap_or_else(|p| p.into_inner()) {
        let outcome = outcome?;
        ph.record(&outcome.target, outcome.took, outcome.status.success());
        if outcome.status.success() {
            eprintln!("xtask: {}: no crash in {seconds} s", outcome.target);
        } else {
            failed.push(outcome);
        }
    }
    let took = started.elapsed().as_secs();
    ph.print();
    if failed.is_empty() {
        eprintln!(
            "xtask: {total} fuzz target(s) ran {seconds} s each without a crash ({took} s in all)"
        );
        return Ok(());
    }
    for f in &failed {
        if f.inputs.is_empty() {
            eprintln!(
                "xtask: {} failed ({}) without saving an input; see its output above",
                f.target, f.status
            );
        }
        for input in &f.inputs {
            eprintln!(
                "xtask: {t} crashed on {i}; reproduce with \
                 `RUSTC_BOOTSTRAP=1 cargo fuzz run --dev {t} {i}`, minimize with \
                 `cargo fuzz tmin --dev`",
                t = f.target,
                i = input.display()
            );
        }
    }
    let names: Vec<&str> = failed.iter().map(|f| f.target.as_str()).collect();
    bail!("fuzz target(s) failed: {}", names.join(", "))
}

/// `--seconds N` and the targets named.
fn parse(args: &[String]) -> Result<(u64, Vec<String>)> {
    let mut seconds: u64 = 30;
    let mut targets: Vec<String> = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let value = match a.as_str() {
            "--seconds" => Some(
                it.next()
                    .with_context(|| format!("--seconds needs a value; {USAGE}"))?
                    .as_str(),
            ),
            s => s.strip_prefix("--seconds="),
        };
        if let Some(v) = value {
            seconds = v.parse().ok().filter(|&n| n > 0).with_context(|| {
                format!("--seconds takes a whole number of seconds above 0, not {v:?}")
            })?;
        } else if a.starts_with('-') {
            bail!("unknown option {a}; {USAGE}");
        } else {
            targets.push(a.clone());
        }
    }
    Ok((seconds, targets))
}

/// Fuzzes `target` for `seconds`, passing on libFuzzer's progress with the target's name in
/// front (two run at once).
fn run_target(target: &str, seconds: u64) -> Result<Outcome> {
    let scratch = Path::new("fuzz/target/corpus").join(target);
    std::fs::create_dir_all(&scratch).with_context(|| format!("creating {}", scratch.display()))?;
    let since = SystemTime::now();
    let started = Instant::now();
    let mut child = cargo_fuzz()
        .args(["run", "--dev", target])
        .arg(&scratch)
        .arg(Path::new("fuzz/corpus").join(target))
        .arg("--")
        .arg(format!("-max_total_time={seconds}"))
        .arg("-print_final_stats=1")
        .stderr(Stdio::piped())
        .spawn()
        .context("running cargo fuzz")?;
    // libFuzzer reports every new input and ends with a dictionary of what it learned: pass
    // on its progress (INITED, pulse, DONE), its final stats and anything else.
    let stderr = child.stderr.take().expect("stderr is piped");
    let mut in_dictionary = false;
    for line in BufReader::new(stderr).lines() {
        let line = line.context("reading cargo fuzz's output")?;
        if line.starts_with("###### Recommended dictionary") {
            in_dictionary = true;
        }
        let new_input = line.starts_with('#')
            && matches!(line.split_whitespace().nth(1), Some("NEW" | "REDUCE"));
        if !new_input && !in_dictionary {
            eprintln!("[{target}] {line}");
        }
        if line.starts_with("###### End of recommended dictionary") {
            in_dictionary = false;
        }
    }
    let status = child.wait().context("waiting for cargo fuzz")?;
    Ok(Outcome {
        target: target.to_owned(),
        took: started.elapsed(),
        status,
        inputs: if status.success() {
            Vec::new()
        } else {
            crash_inputs(target, since)
        },
    })
}

/// `cargo fuzz` with what makes the stable toolchain accept its flags: the sanitizer runtimes
/// ship with stable rustc, only `-Zsanitizer` needs the bootstrap switch.
fn cargo_fuzz() -> Command {
    let mut c = cargo();
    c.arg("fuzz").env("RUSTC_BOOTSTRAP", "1");
    c
}

fn ensure_cargo_fuzz() -> Result<()> {
    let present = || {
        cargo()
            .args(["fuzz", "--version"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if present() {
        return Ok(());
    }
    run(
        "installing cargo-fuzz (cargo install cargo-fuzz --locked)",
        cargo().args(["install", "cargo-fuzz", "--locked"]),
    )?;
    if !present() {
        bail!("cargo-fuzz was installed but `cargo fuzz` does not run; is ~/.cargo/bin on PATH?");
    }
    Ok(())
}

/// The targets `fuzz/Cargo.toml` declares.
fn fuzz_targets() -> Result<Vec<String>> {
    let out = cargo_fuzz()
        .arg("list")
        .stderr(Stdio::inherit())
        .output()
        .context("running cargo fuzz list")?;
    if !out.status.success() {
        bail!("cargo fuzz list failed ({})", out.status);
    }
    let targets: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect();
    if targets.is_empty() {
        bail!("fuzz/Cargo.toml declares no fuzz target");
    }
    Ok(targets)
}

/// Inputs libFuzzer saved for `target` since `since` (crash-, leak-, timeout-, oom-).
fn crash_inputs(target: &str, since: SystemTime) -> Vec<PathBuf> {
    let dir = Path::new("fuzz/artifacts").join(target);
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut found: Vec<PathBuf> = entries
        .filter_map(|e| e.ok())
        .filter(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            ["crash-", "leak-", "timeout-", "oom-"]
                .iter()
                .any(|p| name.starts_with(p))
                && e.metadata()
                    .and_then(|m| m.modified())
                    .is_ok_and(|t| t >= since)
        })
        .map(|e| e.path())
        .collect();
    found.sort();
    found
}
