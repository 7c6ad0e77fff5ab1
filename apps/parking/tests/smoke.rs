//! The parking workload end to end: the chain under the real `zerohop up` (confined
//! instances, a pinned uid owning the SQLite store), `parking-cam` sending compressed bursts
//! over HTTP and CoAP, every answer checked; then the chain is stopped and started again and
//! the plates it stored are still known. Every process is guarded, every wait bounded.
//!
//! Needs the release binaries (`cargo build --release --workspace`).

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use zerohop_app_parking::lot::{plates_per_burst, LotConfig};
use zerohop_app_parking::plates::PlateStore;
use zerohop_test_support::{target_bin, ChainProcess, ChildGuard, ChildLines, TempDir};

/// The lot the HTTP cameras watch: 30 spots, 3 bursts, a third of the cars replaced.
const SPOTS: u32 = 30;
const BURSTS: usize = 3;
const TURNOVER: f64 = 0.3;
const SEED: u64 = 11;

fn lot(spots: u32, turnover: f64, seed: u64) -> LotConfig {
    LotConfig {
        spots,
        turnover,
        seed,
        ..LotConfig::default()
    }
}

/// Plates first seen in each burst of `bursts` bursts of `cfg`.
fn new_per_burst(cfg: &LotConfig, bursts: usize) -> Vec<u64> {
    let mut seen = std::collections::HashSet::new();
    plates_per_burst(cfg, bursts)
        .into_iter()
        .map(|cars| cars.into_iter().filter(|p| seen.insert(p.clone())).count() as u64)
        .collect()
}

/// Two uids of their own for this test run, one per start of the chain (`--uid-range U-U`):
/// the second start runs under another uid than the first, as a restart may, and must still
/// find its store.
fn pinned_uids() -> (u32, u32) {
    let u = 171_000 + 2 * (std::process::id() % 1_000);
    (u, u + 1)
}

/// The chain with its data folder at `data` (the plate store is `plates.db` in it).
fn spec(data: &Path) -> String {
    let bin = |n: &str| target_bin(n).display().to_string();
    let data = data.display();
    format!(
        r#"name: parking
pool: {{ slots: 256, slot_size: 8KiB }}
max_body: 6KiB
timeout: 20s
data: {data}
functions:
  detection:
    command: ["{detection}"]
    instances: 2
    env: {{ DETECT_WORK_MS: "3" }}
  search:
    command: ["{search}"]
    next: [persist]
  persist:
    command: ["{persist}"]
    next: [charge]
  charge:
    command: ["{charge}"]
routes:
  - http: POST /snapshot
    coap: /snapshot
    sequence: [detection, search, charge]
coap: {{ listen: 127.0.0.1:0 }}
"#,
        detection = bin("parking-detection"),
        search = bin("parking-search"),
        persist = bin("parking-persist"),
        charge = bin("parking-charge"),
    )
}

/// Runs `parking-cam` with `args` plus `--json`; its report (it must exit 0: every snapshot
/// answered and checked).
fn cam(args: &[&str]) -> Value {
    let mut child = ChildGuard::new(
        Command::new(target_bin("parking-cam"))
            .args(args)
            .args(["--json", "--timeout", "15"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .expect("run parking-cam"),
    );
    let lines = ChildLines::new(&mut child);
    let line = lines
        .next_line(Duration::from_secs(25))
        .expect("parking-cam printed its report within 25 s");
    let code = child.wait_timeout(Duration::from_secs(5));
    let report: Value = serde_json::from_str(&line)
        .unwrap_or_else(|e| panic!("parking-cam's report is not JSON ({e}): {line}"));
    assert_eq!(code, Some(0), "parking-cam failed: {report}");
    report
}

fn n(report: &Value, key: &str) -> u64 {
    report[key]
        .as_u64()
        .unwrap_or_else(|| panic!("no {key} in {report}"))
}

fn owner(path: &Path) -> u32 {
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .uid()
}

#[test]
fn new_plates_take_the_long_chain_known_ones_the_short_and_the_store_survives_a_restart() {
    let root = nix_root();
    let (first, second) = pinned_uids();
    // Nobody makes the store's folder: the agent does (`data:`), and gives it to the uid.
    let tmp = TempDir::new("parking-data");
    // The chain's uid must be able to pass through the test's own folder to reach its own.
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let data = tmp.path().join("store");
    let db = data.join("plates.db");
    let spec = spec(&data);
    let uid_range = format!("{first}-{first}");
    let args = ["--uid-range", uid_range.as_str()];

    let chain = ChainProcess::start(&spec, &args);
    if root {
        assert_eq!(
            owner(&data),
            first,
            "the data folder belongs to the chain's uid"
        );
    }
    let url = format!("{}/snapshot", chain.url);

    // HTTP, an empty store: a plate's first snapshot goes through persist, later ones not.
    let spots = SPOTS.to_string();
    let bursts = BURSTS.to_string();
    let turnover = TURNOVER.to_string();
    let seed = SEED.to_string();
    let report = cam(&[
        "--http",
        &url,
        "--spots",
        &spots,
        "--bursts",
        &bursts,
        "--period",
        "1.5",
        "--turnover",
        &turnover,
        "--seed",
        &seed,
        "--fresh-db",
    ]);
    let sent = u64::from(SPOTS) * BURSTS as u64;
    let news = new_per_burst(&lot(SPOTS, TURNOVER, SEED), BURSTS);
    let distinct: u64 = news.iter().sum();
    assert!(distinct < sent, "some cars stay: {news:?}");
    assert_eq!(n(&report, "sent"), sent, "{report}");
    assert_eq!(n(&report, "ok"), sent, "{report}");
    assert_eq!(n(&report, "errors") + n(&report, "wrong"), 0, "{report}");
    assert_eq!(n(&report, "distinct_plates"), distinct, "{report}");
    assert_eq!(n(&report, "long_path"), distinct, "{report}");
    assert_eq!(n(&report, "short_path"), sent - distinct, "{report}");
    let per_burst: Vec<u64> = report["bursts"]
        .as_array()
        .expect("bursts")
        .iter()
        .map(|b| n(b, "long_path"))
        .collect();
    assert_eq!(
        per_burst, news,
        "plates new in each burst took persist: {report}"
    );

    // CoAP, block-wise (3 KB in 1 KiB blocks), other cars.
    let coap = chain
        .listener("coap://")
        .unwrap_or_else(|| panic!("no coap:// in {:?}", chain.ready_line));
    let report = cam(&[
        "--coap",
        &coap,
        "--spots",
        "8",
        "--bursts",
        "2",
        "--period",
        "1",
        "--turnover",
        "0.5",
        "--seed",
        "12",
        "--fresh-db",
    ]);
    let coap_distinct: u64 = new_per_burst(&lot(8, 0.5, 12), 2).iter().sum();
    assert_eq!(n(&report, "ok"), 16, "{report}");
    assert_eq!(n(&report, "errors") + n(&report, "wrong"), 0, "{report}");
    assert_eq!(n(&report, "long_path"), coap_distinct, "{report}");
    assert_eq!(chain.stop(), Some(0), "the chain stops cleanly");
    if root {
        assert_eq!(owner(&db), first, "the store was made by the chain's uid");
    }

    // Started again on the same store, under another uid: the agent gives it the folder and
    // the store, and the first burst's cars are all known.
    let uid_range = format!("{second}-{second}");
    let args = ["--uid-range", uid_range.as_str()];
    let chain = ChainProcess::start(&spec, &args);
    if root {
        assert_eq!(
            owner(&data),
            second,
            "the folder follows the chain's new uid"
        );
        assert_eq!(
            owner(&db),
            second,
            "and so does what the last run left in it"
        );
    }
    let report = cam(&[
        "--http",
        &format!("{}/snapshot", chain.url),
        "--spots",
        &spots,
        "--bursts",
        "1",
        "--seed",
        &seed,
        "--turnover",
        &turnover,
    ]);
    assert_eq!(n(&report, "ok"), u64::from(SPOTS), "{report}");
    assert_eq!(n(&report, "long_path"), 0, "{report}");
    assert_eq!(n(&report, "short_path"), u64::from(SPOTS), "{report}");
    assert_eq!(n(&report, "new_but_known"), u64::from(SPOTS), "{report}");
    assert_eq!(chain.stop(), Some(0));

    // The store holds every plate once, in the folder the agent made.
    let store = PlateStore::open(&db).expect("open the store");
    assert_eq!(store.count().unwrap(), distinct + coap_distinct);
}

/// Whether this test runs as root (then the chain runs under the pinned uids).
fn nix_root() -> bool {
    std::fs::metadata("/proc/self").map(|m| m.uid()).ok() == Some(0)
}
