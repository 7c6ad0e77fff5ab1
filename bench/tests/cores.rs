//! The multi-core point of issue 33 in its smallest form (1 core against 1 core, 1 s points,
//! every system), its refusal of a core count the machine cannot hold, and the later steps'
//! targets judged into its report. Asserts that the table and every goal's row are there with
//! numbers (or a reason), never a time.
//!
//! Needs the binaries built (`cargo build --release --workspace --bins`), wrk (`apt-get
//! install wrk`, which `cargo xtask test` does) and Go on PATH (the Go baselines are built
//! with `go build` by zerohop-bench; a first build takes a minute).

use std::collections::BTreeSet;
use std::process::Command;

use serde_json::Value;
use zerohop_bench::cores::{GO, GO_CHAIN, HYPER, ZEROHOP};
use zerohop_bench::report::goals::{ACTIVATION, SCALE_READY, SCALE_RPS};
use zerohop_test_support::{target_bin, TempDir};

fn read_json(path: &std::path::Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).expect("readable"))
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn one_core_against_one_core_fills_the_table_and_a_row_per_goal() {
    if let Err(why) = zerohop_bench::wrk::available() {
        panic!("the cores point cannot be checked: {why}");
    }
    let dir = TempDir::new("bench-cores");
    let out = Command::new(target_bin("zerohop-bench"))
        .args(["--smoke", "--cores", "1", "--cores-only", "--out"])
        .arg(dir.path())
        .output()
        .expect("run zerohop-bench");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let json = read_json(&dir.path().join("results.json"));
    let cores = &json["cores"];
    assert_eq!(cores["counts"], serde_json::json!([1]), "{stderr}");
    assert!(
        cores["load_generator"].as_str().unwrap().starts_with("wrk"),
        "{}",
        cores["load_generator"]
    );
    assert_eq!(cores["failures"], serde_json::json!([]), "{stderr}");
    let systems = [ZEROHOP, HYPER, GO, GO_CHAIN];
    let runs = cores["runs"].as_array().expect("runs");
    let seen: BTreeSet<(&str, u64)> = runs
        .iter()
        .map(|r| {
            let what = format!("{} round {}", r["system"], r["round"]);
            assert_eq!(r["cores"], 1, "{what}");
            assert!(r["requests"].as_u64().unwrap() > 0, "{what}: answers");
            assert_eq!(r["errors"], 0, "{what}");
            assert!(r["rps"].as_f64().unwrap() > 0.0, "{what}");
            assert!(r["cpu_us_per_request"].as_f64().unwrap() > 0.0, "{what}");
            assert!(r["p99_us"].as_f64().unwrap() > 0.0, "{what}");
            (r["system"].as_str().unwrap(), r["round"].as_u64().unwrap())
        })
        .collect();
    let expected: BTreeSet<(&str, u64)> = systems.iter().flat_map(|s| [(*s, 1), (*s, 2)]).collect();
    assert_eq!(seen, expected, "every system in both rounds");
    let one: BTreeSet<&str> = cores["one_client"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| {
            assert!(o["p50_us"].as_f64().unwrap() > 0.0, "{o}");
            assert_eq!(o["errors"], 0, "{o}");
            o["system"].as_str().unwrap()
        })
        .collect();
    assert_eq!(one, systems.into_iter().collect());
    let rates = cores["rates"].as_array().unwrap();
    assert_eq!(rates.len(), 4, "5%, 25%, 50%, 100% of the peak");
    for r in rates {
        assert!(
            r["gateway_cpu_us_per_request"].as_f64().unwrap() > 0.0,
            "{r}"
        );
        assert!(
            r["system_cpu_us_per_request"].as_f64().unwrap() > 0.0,
            "{r}"
        );
    }

    let targets = json["targets"].as_array().unwrap();
    let row = |name: &str| -> &Value {
        targets
            .iter()
            .find(|t| t["name"].as_str().unwrap().starts_with(name))
            .unwrap_or_else(|| panic!("no target row {name:?}: {targets:#?}"))
    };
    for name in [
        "zerohop RPS / hyper monolith RPS on 1 core",
        "zerohop RPS / Go monolith RPS on 1 core",
        "zerohop CPU per request / hyper monolith's on 1 core",
        "one client: zerohop p50 / hyper monolith p50, on one core",
        "gateway CPU per request, most / least",
    ] {
        let t = row(name);
        assert_eq!(t["measured"], true, "{t}");
        assert!(t["value"].as_f64().unwrap() > 0.0, "{t}");
    }
    let online = zerohop_bench::procstat::online_cpus();
    for n in [2, 4, 8] {
        for name in [
            format!("zerohop RPS / hyper monolith RPS on {n} core"),
            format!("zerohop RPS / Go monolith RPS on {n} core"),
            format!("zerohop scaling: RPS on {n} cores"),
            format!("zerohop CPU per request / hyper monolith's on {n} core"),
        ] {
            let t = row(&name);
            // --cores 1: never measured here; the reason is the machine or the run.
            assert_eq!(t["measured"], false, "{t}");
            let why = t["note"].as_str().unwrap();
            if 2 * n > online {
                assert!(why.contains("needs"), "{t}");
            } else {
                assert!(why.contains("--cores stopped at 1"), "{t}");
            }
        }
    }
    row("one client: zerohop p50 / hyper monolith p50, idle cores");
    for name in [
        "ring p99 / monolith p99, open loop at 50%",
        "ring p99 / monolith p99, open loop at 80%",
        ACTIVATION,
        SCALE_RPS,
        SCALE_READY,
    ] {
        let t = row(name);
        assert_eq!(t["measured"], false, "{t}");
        assert!(t["note"].as_str().unwrap().starts_with("not run"), "{t}");
    }
    let summary = std::fs::read_to_string(dir.path().join("summary.md")).expect("summary.md");
    assert!(summary.contains(
        "| cores | zerohop RPS | hyper monolith | Go monolith | Go HTTP chain | zerohop / hyper | \
         zerohop / Go | scaling zerohop | scaling hyper | CPU per request / hyper |"
    ));
    let line = summary
        .lines()
        .find(|l| l.starts_with("| 1 (1 core against 1 core) |"))
        .unwrap_or_else(|| panic!("no row for 1 core: {summary}"));
    let cells: Vec<&str> = line.trim_matches('|').split(" | ").map(str::trim).collect();
    assert_eq!(cells.len(), 10, "{line}");
    for cell in &cells[1..] {
        let number = cell.split_whitespace().next().unwrap_or("");
        assert!(number.parse::<f64>().is_ok(), "not a number in {line}");
    }

    // The steps after the matrix, as `cargo xtask bench` runs them: their JSON, written
    // after the matrix started, is judged into its targets.
    let started = json["machine"]["started_unix"].as_u64().unwrap();
    let machine = serde_json::json!({ "started_unix": started + 1 });
    std::fs::write(
        dir.path().join("activation.json"),
        serde_json::json!({
            "machine": machine,
            "futex_floor": { "wake_median_us": 20.0 },
            "parked": { "activation_us": { "n": 10, "median": 25.0 } }
        })
        .to_string(),
    )
    .unwrap();
    let update = Command::new(target_bin("zerohop-bench"))
        .args(["--update-targets", "--out"])
        .arg(dir.path())
        .output()
        .expect("run zerohop-bench --update-targets");
    assert!(
        update.status.success(),
        "{}",
        String::from_utf8_lossy(&update.stderr)
    );
    let json = read_json(&dir.path().join("results.json"));
    let targets = json["targets"].as_array().unwrap();
    let activation = targets.iter().find(|t| t["name"] == ACTIVATION).unwrap();
    assert_eq!(activation["measured"], true, "{activation}");
    assert_eq!(activation["met"], true, "{activation}");
    assert!(targets
        .iter()
        .any(|t| t["name"] == SCALE_RPS && t["measured"] == false));
    let summary = std::fs::read_to_string(dir.path().join("summary.md")).unwrap();
    assert!(
        summary.contains(&format!("| {ACTIVATION} | 25.000 (us; futex wake floor")),
        "{summary}"
    );
    assert!(summary.contains("## Cores: every system on the same N cores"));
}

#[test]
fn a_core_count_the_machine_cannot_hold_twice_is_refused_in_one_line() {
    let online = zerohop_bench::procstat::online_cpus();
    let dir = TempDir::new("bench-cores-refused");
    let out = Command::new(target_bin("zerohop-bench"))
        .args(["--cores", &online.to_string(), "--out"])
        .arg(dir.path())
        .output()
        .expect("run zerohop-bench");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert_eq!(
        stderr.trim(),
        format!(
            "bench: --cores {online} needs {} CPUs ({online} for each system, {online} for the \
             load generator); this machine has {online}",
            2 * online
        )
    );
    assert!(
        !dir.path().join("results.json").exists(),
        "nothing ran before the refusal"
    );
}
