//! Runs the workspace's test binaries side by side: `cargo test --no-run` builds them once
//! (and names them), then up to [`PARALLEL`] run at a time, each in its package's folder as
//! `cargo test` runs them, in a process group of its own, bounded by [`LIMIT`]. The binaries
//! of [`SOLO`] measure time or CPU, or load the whole machine: each runs with nothing beside
//! it. Every binary runs even when one fails; the output of a failed one is printed whole,
//! and the run fails at the end naming each.
//!
//! Which binaries there are ([`parse_artifacts`], from cargo's messages) and which run alone
//! ([`schedule`]) are pure functions, tested as such; [`names_from_metadata`] names the same
//! binaries from `cargo metadata` before anything is built (`cargo xtask test --plan`).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::cmd::{cargo, workspace_root};
use crate::phases::Phases;

/// Test binaries running at once (the machines this runs on have 2 cores; most end-to-end
/// tests spend their time waiting on processes and sockets, not computing).
pub const PARALLEL: usize = 2;

/// The longest one test binary may run before it is killed and reported.
pub const LIMIT: Duration = Duration::from_secs(20 * 60);

/// Binaries (`package::target`) that run alone: they compare CPU time or throughput between
/// systems, count CPU ticks of idle processes, or start many processes at once.
pub const SOLO: &[&str] = &[
    "zerohop-e2e::kubernetes",
    "zerohop-e2e::scale",
    "zerohop-e2e::chaos",
    "zerohop-bench::smoke",
    "zerohop-bench::systems",
    "zerohop-bench::languages",
    "zerohop-bench::floors",
    "zerohop-transport::conformance",
    "zerohop-pool::stress",
];

/// One test binary.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TestBin {
    /// `package::target` (`zerohop-e2e::http`; a library's unit tests are `package::lib`).
    pub name: String,
    pub exe: PathBuf,
    /// The package's folder (the working directory `cargo test` gives it).
    pub dir: PathBuf,
}

/// Builds the test binaries of the workspace (`cargo test --release --workspace --no-run`,
/// plus `extra`; with clippy as the workspace's compiler when `clippy`, as the build before
/// it, see `crate::builds::with_clippy`) and returns them.
pub fn build(extra: &[String], clippy: bool) -> Result<Vec<TestBin>> {
    eprintln!("xtask: building the workspace's test binaries");
    let mut cmd = cargo();
    crate::builds::with_clippy(&mut cmd, clippy);
    let mut child = cmd
        .args([
            "test",
            "--release",
            "--workspace",
            "--no-run",
            "--message-format=json-render-diagnostics",
        ])
        .args(extra)
        .stdout(Stdio::piped())
        .spawn()
        .context("running cargo test --no-run")?;
    let mut out = String::new();
    child
        .stdout
        .take()
        .expect("piped")
        .read_to_string(&mut out)
        .context("reading cargo's messages")?;
    let status = child.wait()?;
    if !status.success() {
        bail!("building the test binaries failed ({status})");
    }
    Ok(parse_artifacts(&out))
}

/// The test binaries in cargo's JSON messages (`--message-format=json`, one a line): each
/// `compiler-artifact` of the test profile with an executable, once, in name order.
pub fn parse_artifacts(messages: &str) -> Vec<TestBin> {
    let mut bins = Vec::new();
    for line in messages.lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if msg["reason"] != "compiler-artifact" || msg["profile"]["test"] != true {
            continue;
        }
        let (Some(exe), Some(manifest)) =
            (msg["executable"].as_str(), msg["manifest_path"].as_str())
        else {
            continue;
        };
        let package = msg["package_id"]
            .as_str()
            .and_then(package_name)
            .unwrap_or("?");
        bins.push(TestBin {
            name: bin_name(package, &msg["target"]),
            exe: PathBuf::from(exe),
            dir: Path::new(manifest)
                .parent()
                .map(Path::to_owned)
                .unwrap_or_default(),
        });
    }
    bins.sort_by(|a, b| a.name.cmp(&b.name));
    bins.dedup_by(|a, b| a.exe == b.exe);
    bins
}

/// A test binary's name, `package::target`, from a cargo target (as both cargo's messages
/// and `cargo metadata` give it): a library's unit tests are `package::lib`.
fn bin_name(package: &str, target: &serde_json::Value) -> String {
    let kind = target["kind"][0].as_str().unwrap_or("");
    if kind == "lib" || kind == "proc-macro" {
        format!("{package}::lib")
    } else {
        format!("{package}::{}", target["name"].as_str().unwrap_or("?"))
    }
}

/// The names of the test binaries `cargo test --workspace` builds, from the output of `cargo
/// metadata --no-deps --format-version 1`: every target of a workspace member that is tested
/// (`"test": true`), named as [`parse_artifacts`] names it, in name order (a name twice if
/// two targets share it).
pub fn names_from_metadata(metadata: &str) -> Result<Vec<String>> {
    let m: serde_json::Value =
        serde_json::from_str(metadata).context("reading cargo metadata's output")?;
    let members: Vec<&str> = m["workspace_members"]
        .as_array()
        .context("cargo metadata gave no workspace_members")?
        .iter()
        .filter_map(|v| v.as_str())
        .collect();
    let mut names = Vec::new();
    for p in m["packages"].as_array().into_iter().flatten() {
        if !p["id"].as_str().is_some_and(|id| members.contains(&id)) {
            continue;
        }
        let package = p["name"].as_str().unwrap_or("?");
        for t in p["targets"].as_array().into_iter().flatten() {
            if t["test"] == true {
                names.push(bin_name(package, t));
            }
        }
    }
    names.sort();
    Ok(names)
}

/// The names of the workspace's test binaries, from `cargo metadata` (nothing is built).
pub fn workspace_names() -> Result<Vec<String>> {
    let out = cargo()
        .args(["metadata", "--no-deps", "--format-version", "1"])
        .stderr(Stdio::inherit())
        .output()
        .context("running cargo metadata")?;
    if !out.status.success() {
        bail!("cargo metadata failed ({})", out.status);
    }
    names_from_metadata(&String::from_utf8_lossy(&out.stdout))
}

/// The package name in a cargo package id: `path+file:///.../zerohop-e2e#0.1.0` or
/// `path+file:///.../xtask#xtask@0.1.0` (also the older `name 0.1.0 (path+...)`).
fn package_name(id: &str) -> Option<&str> {
    if let Some((url, frag)) = id.rsplit_once('#') {
        if let Some((name, _)) = frag.split_once('@') {
            return Some(name);
        }
        return url.rsplit('/').next();
    }
    id.split_whitespace().next()
}

/// Which of the binaries `names` run alone (those named in `solo`, first, one after another)
/// and which share the machine ([`PARALLEL`] at a time), as indices into `names`, each list
/// in the order of `names`.
pub fn schedule<S: AsRef<str>>(names: &[S], solo: &[&str]) -> (Vec<usize>, Vec<usize>) {
    (0..names.len()).partition(|&i| solo.contains(&names[i].as_ref()))
}

/// Runs `bins` (solo ones alone, the others [`PARALLEL`] at a time, a slot refilled as soon
/// as a binary ends), recording each in `phases`. Fails at the end if any failed.
pub fn run(bins: &[TestBin], extra_args: &[String], phases: &mut Phases) -> Result<()> {
    let logs = workspace_root().join("target/xtask/test-logs");
    std::fs::create_dir_all(&logs).context("creating target/xtask/test-logs")?;
    let names: Vec<&str> = bins.iter().map(|b| b.name.as_str()).collect();
    let (solo, shared) = schedule(&names, SOLO);
    let mut failed = Vec::new();
    let total = bins.len();
    let mut done = 0usize;
    let mut report = |b: &TestBin, r: Outcome, phases: &mut Phases| {
        done += 1;
        phases.record(&b.name, r.took, r.ok);
        let log = std::fs::read_to_string(&r.log).unwrap_or_default();
        let summary = log
            .lines()
            .rfind(|l| l.starts_with("test result:"))
            .unwrap_or("")
            .to_owned();
        if r.ok {
            eprintln!(
                "xtask: [{done}/{total}] ok      {:>6.1} s  {}  {summary}",
                r.took.as_secs_f64(),
                b.name
            );
        } else {
            eprintln!("{log}");
            eprintln!(
                "xtask: [{done}/{total}] FAILED  {:>6.1} s  {} ({}); its output is above and in {}",
                r.took.as_secs_f64(),
                b.name,
                r.why,
                r.log.display()
            );
            failed.push(b.name.clone());
        }
    };
    // The solo binaries, one after another.
    for &i in &solo {
        let r = start(&bins[i], extra_args, &logs)?.wait();
        report(&bins[i], r, phases);
    }
    // The rest, PARALLEL at a time.
    let mut queue = shared.into_iter();
    let mut running: Vec<(usize, Running)> = Vec::new();
    loop {
        while running.len() < PARALLEL {
            let Some(i) = queue.next() else { break };
            running.push((i, start(&bins[i], extra_args, &logs)?));
        }
        if running.is_empty() {
            break;
        }
        let mut k = 0;
        let mut ended = false;
        while k < running.len() {
            if let Some(r) = running[k].1.poll() {
                let (i, _) = running.remove(k);
                report(&bins[i], r, phases);
                ended = true;
            } else {
                k += 1;
            }
        }
        if !ended {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    if !failed.is_empty() {
        bail!(
            "{} test binaries failed: {}",
            failed.len(),
            failed.join(", ")
        );
    }
    Ok(())
}

/// How many tests each `test result:` line of a `cargo test` output says passed, in order
/// (one line per test binary that ran).
pub fn passed_counts(output: &str) -> Vec<u64> {
    output
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("test result:"))
        .map(|rest| {
            rest.split(';')
                .find_map(|part| part.trim().rsplit_once(' ').filter(|(_, w)| *w == "passed"))
                .and_then(|(n, _)| n.rsplit(' ').next()?.parse().ok())
                .unwrap_or(0)
        })
        .collect()
}

/// Whether `binaries` test binaries ran and each passed at least one test: a run whose name
/// filter matches nothing reports `ok. 0 passed`, which must not count as checked.
pub fn each_ran_tests(counts: &[u64], binaries: usize) -> Result<()> {
    if counts.len() != binaries || counts.contains(&0) {
        bail!(
            "expected {binaries} test binaries each passing at least one test, got {} with \
             {counts:?} passed: the filter matched no test (renamed?)",
            counts.len()
        );
    }
    Ok(())
}

/// How one binary ended.
struct Outcome {
    ok: bool,
    why: String,
    took: Duration,
    log: PathBuf,
}

/// A test binary running.
struct Running {
    child: std::process::Child,
    started: Instant,
    log: PathBuf,
}

fn start(b: &TestBin, extra_args: &[String], logs: &Path) -> Result<Running> {
    use std::os::unix::process::CommandExt;
    let log = logs.join(format!("{}.log", b.name.replace("::", "-")));
    let out = std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
    let err = out.try_clone()?;
    let child = Command::new(&b.exe)
        .args(extra_args)
        .current_dir(&b.dir)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        // Its own process group: a binary that overruns is killed with everything it started.
        .process_group(0)
        .spawn()
        .with_context(|| format!("starting {}", b.exe.display()))?;
    Ok(Running {
        child,
        started: Instant::now(),
        log,
    })
}

impl Running {
    /// The outcome once the binary ended (or was killed for running past [`LIMIT`]).
    fn poll(&mut self) -> Option<Outcome> {
        let took = self.started.elapsed();
        match self.child.try_wait() {
            Ok(Some(status)) => Some(Outcome {
                ok: status.success(),
                why: status.to_string(),
                took,
                log: self.log.clone(),
            }),
            Ok(None) if took > LIMIT => {
                // The binary leads a process group of its own: everything it started goes.
                if let Ok(pgid) = i32::try_from(self.child.id()) {
                    let _ = nix::sys::signal::killpg(
                        nix::unistd::Pid::from_raw(pgid),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                }
                let _ = self.child.wait();
                Some(Outcome {
                    ok: false,
                    why: format!("killed after {} s", LIMIT.as_secs()),
                    took,
                    log: self.log.clone(),
                })
            }
            Ok(None) => None,
            Err(e) => Some(Outcome {
                ok: false,
                why: format!("cannot wait for it: {e}"),
                took,
                log: self.log.clone(),
            }),
        }
    }

    fn wait(mut self) -> Outcome {
        loop {
            if let Some(o) = self.poll() {
                return o;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn solo_binaries_run_alone_and_the_rest_share() {
        let b = ["a::lib", "e2e::kube", "b::lib", "c::t", "bench::smoke"];
        let (solo, shared) = schedule(&b, &["e2e::kube", "bench::smoke", "not::built"]);
        assert_eq!(solo, vec![1, 4]);
        assert_eq!(shared, vec![0, 2, 3]);
        assert_eq!(schedule(&b, &[]), (vec![], vec![0, 1, 2, 3, 4]));
    }

    /// A name in [`SOLO`] that names no test target would let that binary share the machine
    /// unnoticed.
    #[test]
    fn every_solo_binary_exists() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        for name in SOLO {
            let (package, target) = name.split_once("::").expect("package::target");
            let dir = match package {
                "zerohop-bench" => "bench".to_owned(),
                p => format!("crates/{p}"),
            };
            let file = root.join(dir).join("tests").join(format!("{target}.rs"));
            assert!(file.is_file(), "{name}: no {}", file.display());
        }
    }

    #[test]
    fn a_filtered_run_counts_only_when_every_binary_ran_a_test() {
        let out = "running 2 tests\ntest a::loom_tests::x ... ok\n\n\
                   test result: ok. 2 passed; 0 failed; 0 ignored; 0 measured; 40 filtered out; \
                   finished in 3.10s\n\nrunning 0 tests\n\n\
                   test result: ok. 0 passed; 0 failed; 0 ignored; 0 measured; 12 filtered out; \
                   finished in 0.00s\n";
        assert_eq!(passed_counts(out), vec![2, 0]);
        assert!(
            each_ran_tests(&passed_counts(out), 2).is_err(),
            "0 ran in one"
        );
        assert!(each_ran_tests(&[2, 1], 2).is_ok());
        assert!(each_ran_tests(&[3], 2).is_err(), "one binary missing");
        assert!(each_ran_tests(&[], 2).is_err(), "nothing ran");
        assert_eq!(
            passed_counts("test result: FAILED. 1 passed; 1 failed; 0 ignored"),
            vec![1]
        );
    }

    #[test]
    fn package_names_come_from_both_id_forms() {
        assert_eq!(
            package_name("path+file:///work/main/crates/zerohop-e2e#0.1.0"),
            Some("zerohop-e2e")
        );
        assert_eq!(
            package_name("path+file:///work/main/xtask#xtask@0.1.0"),
            Some("xtask")
        );
        assert_eq!(
            package_name("zerohop-pool 0.1.0 (path+file:///w)"),
            Some("zerohop-pool")
        );
    }
}
