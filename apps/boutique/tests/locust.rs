//! The Online Boutique's own load generator, unchanged (`locust/locustfile.py`), run by
//! real Locust from PyPI against both deployments (the zerohop chain under the real
//! `zerohop up`, and `boutique-http`): every request it makes over the original frontend's
//! interface (the session cookie, form posts, redirects followed, `GET /product/{id}`) must
//! succeed, and it must make enough of them to have run every task.
//!
//! Locust and Faker (which the locustfile imports) are installed into a virtual
//! environment, `target/locust-venv`, made once and reused by later runs (`python3 -m venv`,
//! then `pip install`, which needs PyPI). Locust's users wait 1 to 10 s between tasks, so
//! the run uses many users for a short time. Every wait is bounded; every process is
//! stopped by a guard, also on failure; the two runs take turns (one Locust at a time on
//! the machine).

mod harness;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use harness::{start_http, WAIT};
use zerohop_test_support::{ChainProcess, ChildGuard, Signal, TempDir};

/// Longest the venv's creation and `pip install` may take.
const INSTALL_WAIT: Duration = Duration::from_secs(600);
/// What is installed into the venv: Locust, and what the locustfile imports besides.
const PACKAGES: [&str; 2] = ["locust", "faker"];
/// Locust's users, how many it starts per second, and how long it runs.
const USERS: &str = "50";
const SPAWN_RATE: &str = "25";
const RUN_TIME: &str = "20s";
/// Longest a Locust run may take, beyond its run time: start-up, stopping, reports.
const LOCUST_WAIT: Duration = Duration::from_secs(90);
/// Fewest requests a run must make: 50 users over 20 s make about 300.
const MIN_REQUESTS: u64 = 150;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Runs `cmd` to its end within `timeout`, its output in `log`; panics naming `what` with
/// the log's tail when it fails.
fn run_logged(what: &str, cmd: &mut Command, log: &Path, timeout: Duration) {
    let file = std::fs::File::create(log).expect("create the log");
    cmd.stdin(Stdio::null())
        .stdout(file.try_clone().expect("clone the log"))
        .stderr(file);
    let mut guard = ChildGuard::new(
        cmd.spawn()
            .unwrap_or_else(|e| panic!("{what}: cannot start: {e}")),
    );
    let code = guard.wait_timeout(timeout);
    if code != Some(0) {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(30).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        panic!("{what} failed ({code:?}):\n{}", tail.join("\n"));
    }
}

/// The venv's `locust`: made and installed once per checkout (kept in `target/`), checked
/// by running it.
fn locust() -> &'static Path {
    static LOCUST: OnceLock<PathBuf> = OnceLock::new();
    LOCUST.get_or_init(|| {
        let venv = root().join("target/locust-venv");
        let locust = venv.join("bin/locust");
        let logs = root().join("target");
        let works = |locust: &Path| {
            Command::new(locust)
                .arg("--version")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        };
        let faker = || {
            Command::new(venv.join("bin/python"))
                .args(["-c", "import faker"])
                .status()
                .is_ok_and(|s| s.success())
        };
        if works(&locust) && faker() {
            return locust;
        }
        if venv.exists() {
            std::fs::remove_dir_all(&venv).expect("remove the broken venv");
        }
        run_logged(
            "python3 -m venv target/locust-venv",
            Command::new("python3").arg("-m").arg("venv").arg(&venv),
            &logs.join("locust-venv.log"),
            INSTALL_WAIT,
        );
        run_logged(
            "pip install locust faker (from PyPI)",
            Command::new(venv.join("bin/pip"))
                .args(["install", "--disable-pip-version-check", "-q"])
                .args(PACKAGES),
            &logs.join("locust-pip.log"),
            INSTALL_WAIT,
        );
        assert!(works(&locust), "{} does not run", locust.display());
        locust
    })
}

/// One line of Locust's `_stats.csv`: a request type and name, its counts.
#[derive(Debug)]
struct Stat {
    method: String,
    name: String,
    requests: u64,
    failures: u64,
}

/// The lines of a `_stats.csv` (the last, `Aggregated`, included).
fn read_stats(csv: &Path) -> Vec<Stat> {
    let text = std::fs::read_to_string(csv)
        .unwrap_or_else(|e| panic!("Locust wrote no {}: {e}", csv.display()));
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().expect("a header").split(',').collect();
    let column = |name: &str| {
        header
            .iter()
            .position(|h| *h == name)
            .unwrap_or_else(|| panic!("no column {name} in {header:?}"))
    };
    let (method, name) = (column("Type"), column("Name"));
    let (requests, failures) = (column("Request Count"), column("Failure Count"));
    lines
        .map(|l| {
            // Names are paths of this site: no commas, no quotes.
            let f: Vec<&str> = l.split(',').collect();
            Stat {
                method: f[method].to_owned(),
                name: f[name].to_owned(),
                requests: f[requests].parse().expect("a count"),
                failures: f[failures].parse().expect("a count"),
            }
        })
        .collect()
}

/// Runs the locustfile against `url`; checks that nothing failed, that enough requests were
/// made, and that every route of its tasks was used. Locust's own summary goes to the
/// test's output.
fn run_locust(url: &str) {
    // One Locust at a time: two would share the machine's two cores with two deployments.
    static TURN: Mutex<()> = Mutex::new(());
    let locust = locust();
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    let dir = TempDir::new("locust");
    let prefix = dir.path().join("boutique");
    let mut cmd = Command::new(locust);
    cmd.arg("-f")
        .arg(root().join("apps/boutique/locust/locustfile.py"))
        .args(["--headless", "-u", USERS, "-r", SPAWN_RATE, "-t", RUN_TIME])
        .args(["--host", url, "--only-summary", "--loglevel", "WARNING"])
        .arg("--csv")
        .arg(&prefix)
        .current_dir(dir.path())
        .stdin(Stdio::null());
    let mut guard = ChildGuard::new(cmd.spawn().expect("spawn locust"));
    let run = Duration::from_secs(RUN_TIME.trim_end_matches('s').parse().unwrap());
    let code = guard.wait_timeout(run + LOCUST_WAIT);

    let stats = read_stats(&dir.path().join("boutique_stats.csv"));
    let failures =
        std::fs::read_to_string(dir.path().join("boutique_failures.csv")).unwrap_or_default();
    let total = stats
        .iter()
        .find(|s| s.name == "Aggregated")
        .expect("an Aggregated line");
    eprintln!(
        "locust against {url}: {} requests, {} failures",
        total.requests, total.failures
    );
    assert_eq!(total.failures, 0, "failures:\n{failures}");
    assert_eq!(code, Some(0), "locust's exit code; failures:\n{failures}");
    assert!(
        total.requests >= MIN_REQUESTS,
        "{} requests, expected at least {MIN_REQUESTS}",
        total.requests
    );
    let count = |method: &str, name: &dyn Fn(&str) -> bool| -> u64 {
        stats
            .iter()
            .filter(|s| s.method == method && name(&s.name))
            .map(|s| s.requests)
            .sum()
    };
    for (method, path) in [
        ("GET", "/"),
        ("POST", "/setCurrency"),
        ("GET", "/cart"),
        ("POST", "/cart"),
        ("POST", "/cart/checkout"),
    ] {
        assert!(
            count(method, &|n| n == path) > 0,
            "no {method} {path}: {stats:?}"
        );
    }
    assert!(
        count("GET", &|n| n.starts_with("/product/")) > 0,
        "no product page: {stats:?}"
    );
}

#[test]
fn the_original_locustfile_drives_the_zerohop_chain() {
    let chain = ChainProcess::start(&harness::chain_spec("chain.yaml", 10), &[]);
    run_locust(&chain.url);
    assert_eq!(chain.stop(), Some(0), "zerohop up exits cleanly on SIGTERM");
}

#[test]
fn the_original_locustfile_drives_the_http_deployment() {
    let mut http = start_http();
    run_locust(&http.url);
    http.guard.signal(Signal::SIGTERM);
    assert_eq!(http.guard.wait_timeout(WAIT), Some(0));
}
