//! Real Locust from PyPI, for the tests and the benchmark that drive the Online Boutique with
//! its original `locustfile.py`.
//!
//! Locust and Faker (which the locustfile imports) live in a virtual environment,
//! `target/locust-venv` of the checkout, made once and reused by later runs
//! (`python3 -m venv`, then `pip install`, which needs PyPI). Every step is bounded in time;
//! a step that fails says which, with the tail of its log.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::{ChildGuard, TempDir};

/// Longest the venv's creation and `pip install` may take.
const INSTALL_WAIT: Duration = Duration::from_secs(600);
/// What is installed into the venv: Locust, and what the locustfile imports besides.
const PACKAGES: [&str; 2] = ["locust", "faker"];
/// Longest a Locust run may take beyond its run time: start-up, stopping, reports.
const RUN_SLACK: Duration = Duration::from_secs(90);

/// Runs `cmd` to its end within `timeout`, its output in `log`; on failure, what failed and
/// the log's tail.
fn run_logged(what: &str, cmd: &mut Command, log: &Path, timeout: Duration) -> Result<(), String> {
    let file = std::fs::File::create(log).map_err(|e| format!("{}: {e}", log.display()))?;
    let err = file.try_clone().map_err(|e| e.to_string())?;
    cmd.stdin(Stdio::null()).stdout(file).stderr(err);
    let mut guard = ChildGuard::new(
        cmd.spawn()
            .map_err(|e| format!("{what}: cannot start: {e}"))?,
    );
    let code = guard.try_wait_timeout(timeout);
    if code == Some(Some(0)) {
        return Ok(());
    }
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let tail = lines[lines.len().saturating_sub(30)..].join("\n");
    Err(match code {
        None => format!("{what} did not finish within {timeout:?}:\n{tail}"),
        Some(c) => format!("{what} failed ({c:?}):\n{tail}"),
    })
}

/// The `locust` of the checkout `root`'s venv, made and installed when missing or broken,
/// checked by running it.
pub fn venv(root: &Path) -> Result<PathBuf, String> {
    let venv = root.join("target/locust-venv");
    let locust = venv.join("bin/locust");
    let runs = |cmd: &mut Command| {
        cmd.stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    let ready = || {
        runs(Command::new(&locust).arg("--version"))
            && runs(Command::new(venv.join("bin/python")).args(["-c", "import faker"]))
    };
    if ready() {
        return Ok(locust);
    }
    if venv.exists() {
        std::fs::remove_dir_all(&venv)
            .map_err(|e| format!("removing the broken {}: {e}", venv.display()))?;
    }
    let logs = root.join("target");
    run_logged(
        "python3 -m venv target/locust-venv",
        Command::new("python3").arg("-m").arg("venv").arg(&venv),
        &logs.join("locust-venv.log"),
        INSTALL_WAIT,
    )?;
    run_logged(
        "pip install locust faker (from PyPI)",
        Command::new(venv.join("bin/pip"))
            .args(["install", "--disable-pip-version-check", "-q"])
            .args(PACKAGES),
        &logs.join("locust-pip.log"),
        INSTALL_WAIT,
    )?;
    if !ready() {
        return Err(format!(
            "{} does not run after pip install",
            locust.display()
        ));
    }
    Ok(locust)
}

/// One line of Locust's `_stats.csv`: a request type and name, its counts and times.
#[derive(Clone, Debug, PartialEq)]
pub struct Stat {
    /// `GET`, `POST`, or empty for the `Aggregated` line.
    pub method: String,
    /// The request's name (its path here), or `Aggregated`.
    pub name: String,
    /// Requests made.
    pub requests: u64,
    /// Of those, failed.
    pub failures: u64,
    /// Requests per second over the run.
    pub rps: f64,
    /// Median and 99th percentile response time, milliseconds (NaN when Locust has none).
    pub p50_ms: f64,
    /// See `p50_ms`.
    pub p99_ms: f64,
}

/// The lines of a `_stats.csv` text (the last, `Aggregated`, included).
pub fn parse_stats(text: &str) -> Result<Vec<Stat>, String> {
    let mut lines = text.lines();
    let header: Vec<&str> = lines
        .next()
        .ok_or("an empty stats file")?
        .split(',')
        .collect();
    let column = |name: &str| {
        header
            .iter()
            .position(|h| *h == name)
            .ok_or_else(|| format!("no column {name} in {header:?}"))
    };
    let (method, name) = (column("Type")?, column("Name")?);
    let (requests, failures) = (column("Request Count")?, column("Failure Count")?);
    let (rps, p50, p99) = (column("Requests/s")?, column("50%")?, column("99%")?);
    lines
        .map(|l| {
            // Names are paths of this site: no commas, no quotes.
            let f: Vec<&str> = l.split(',').collect();
            let field = |i: usize| f.get(i).copied().ok_or_else(|| format!("short line {l:?}"));
            let count = |i: usize| -> Result<u64, String> {
                field(i)?
                    .parse()
                    .map_err(|_| format!("not a count in {l:?}"))
            };
            let real =
                |i: usize| -> Result<f64, String> { Ok(field(i)?.parse().unwrap_or(f64::NAN)) };
            Ok(Stat {
                method: field(method)?.to_owned(),
                name: field(name)?.to_owned(),
                requests: count(requests)?,
                failures: count(failures)?,
                rps: real(rps)?,
                p50_ms: real(p50)?,
                p99_ms: real(p99)?,
            })
        })
        .collect()
}

/// What one headless Locust run came to.
#[derive(Debug)]
pub struct Run {
    /// Locust's exit code (`None`: killed by a signal).
    pub code: Option<i32>,
    /// Its `_stats.csv`, by request name.
    pub stats: Vec<Stat>,
    /// Its `_failures.csv` as written (empty when none).
    pub failures: String,
}

impl Run {
    /// The `Aggregated` line.
    pub fn total(&self) -> Option<&Stat> {
        self.stats.iter().find(|s| s.name == "Aggregated")
    }
}

/// Runs `locustfile` headless with `locust` against `url`: `users` users started
/// `spawn_rate` per second, for `seconds`; bounded by the run time and a slack.
pub fn run(
    locust: &Path,
    locustfile: &Path,
    url: &str,
    users: u32,
    spawn_rate: u32,
    seconds: u64,
) -> Result<Run, String> {
    let dir = TempDir::new("locust");
    let prefix = dir.path().join("run");
    let mut cmd = Command::new(locust);
    cmd.arg("-f")
        .arg(locustfile)
        .arg("--headless")
        .args(["-u", &users.to_string(), "-r", &spawn_rate.to_string()])
        .args(["-t", &format!("{seconds}s")])
        .args(["--host", url, "--only-summary", "--loglevel", "WARNING"])
        .arg("--csv")
        .arg(&prefix)
        .current_dir(dir.path())
        .stdin(Stdio::null())
        // Its summary table is for people: on stderr, so a report on stdout stays clean.
        .stdout(std::io::stderr());
    let mut guard = ChildGuard::new(cmd.spawn().map_err(|e| format!("starting locust: {e}"))?);
    let code = guard
        .try_wait_timeout(Duration::from_secs(seconds) + RUN_SLACK)
        .ok_or_else(|| format!("locust did not finish within {seconds} s and {RUN_SLACK:?}"))?;
    let csv = dir.path().join("run_stats.csv");
    let text = std::fs::read_to_string(&csv)
        .map_err(|e| format!("Locust wrote no {}: {e}", csv.display()))?;
    Ok(Run {
        code,
        stats: parse_stats(&text)?,
        failures: std::fs::read_to_string(dir.path().join("run_failures.csv")).unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_are_read_by_column_name_and_missing_times_are_nan() {
        let text =
            "Type,Name,Request Count,Failure Count,Median Response Time,Requests/s,50%,99%\n\
                    GET,/,10,1,3,2.5,3,9\n\
                    ,Aggregated,10,1,3,2.5,N/A,9\n";
        let s = parse_stats(text).unwrap();
        assert_eq!(s.len(), 2);
        assert_eq!((s[0].method.as_str(), s[0].name.as_str()), ("GET", "/"));
        assert_eq!((s[0].requests, s[0].failures), (10, 1));
        assert_eq!((s[0].rps, s[0].p50_ms, s[0].p99_ms), (2.5, 3.0, 9.0));
        assert!(s[1].p50_ms.is_nan());
        assert!(parse_stats("Type,Name\n").is_err(), "columns are required");
        assert!(parse_stats("").is_err());
    }
}
