//! The Online Boutique's own load generator, unchanged (`locust/locustfile.py`), run by
//! real Locust from PyPI against both deployments (the zerohop chain under the real
//! `zerohop up`, and `boutique-http`): every request it makes over the original frontend's
//! interface (the session cookie, form posts, redirects followed, `GET /product/{id}`) must
//! succeed, and it must make enough of them to have run every task.
//!
//! Locust and Faker (which the locustfile imports) are installed into a virtual
//! environment, `target/locust-venv` (`zerohop_test_support::locust`, which the benchmark
//! shares), made once and reused by later runs (`python3 -m venv`,
//! then `pip install`, which needs PyPI). Locust's users wait 1 to 10 s between tasks, so
//! the run uses many users for a short time. Every wait is bounded; every process is
//! stopped by a guard, also on failure; the two runs take turns (one Locust at a time on
//! the machine).

mod harness;

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use harness::{start_http, WAIT};
use zerohop_test_support::{locust, ChainProcess, Signal};

/// Locust's users, how many it starts per second, and how long it runs (seconds).
const USERS: u32 = 50;
const SPAWN_RATE: u32 = 25;
const RUN_TIME: u64 = 20;
/// Fewest requests a run must make: 50 users over 20 s make about 300.
const MIN_REQUESTS: u64 = 150;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Runs the locustfile against `url`; checks that nothing failed, that enough requests were
/// made, and that every route of its tasks was used.
fn run_locust(url: &str) {
    // One Locust at a time: two would share the machine's two cores with two deployments.
    static TURN: Mutex<()> = Mutex::new(());
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    let bin = locust::venv(&root()).unwrap_or_else(|e| panic!("{e}"));
    let run = locust::run(
        &bin,
        &root().join("apps/boutique/locust/locustfile.py"),
        url,
        USERS,
        SPAWN_RATE,
        RUN_TIME,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let failures = &run.failures;
    let total = run.total().expect("an Aggregated line");
    eprintln!(
        "locust against {url}: {} requests, {} failures",
        total.requests, total.failures
    );
    assert_eq!(total.failures, 0, "failures:\n{failures}");
    assert_eq!(
        run.code,
        Some(0),
        "locust's exit code; failures:\n{failures}"
    );
    assert!(
        total.requests >= MIN_REQUESTS,
        "{} requests, expected at least {MIN_REQUESTS}",
        total.requests
    );
    let stats = &run.stats;
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
