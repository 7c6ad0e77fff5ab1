//! The benchmark harness end to end on a tiny matrix: every system answers correctly at every
//! point and the report has every field. Never asserts a time.

use std::collections::BTreeSet;
use std::process::Command;

use serde_json::Value;
use zerohop_test_support::{target_bin, TempDir};

const SYSTEMS: [&str; 7] = [
    "zerohop-ring",
    "zerohop-socket",
    "zerohop-poll",
    "zerohop-sockmap",
    "monolith",
    "http-chain",
    "nginx-broker",
];

#[test]
fn smoke_matrix_answers_correctly_and_reports_every_field() {
    // Every system, nginx-broker too: a green run must mean each was checked.
    if let Err(why) = zerohop_bench::systems::nginx_binary() {
        panic!(
            "the nginx-broker baseline cannot be checked: {why}; `cargo xtask test` installs \
             it (as root with apt)"
        );
    }
    // The HTTPS and HTTP/2 rows too.
    if let Err(why) = zerohop_bench::h2load::available() {
        panic!(
            "the HTTPS and HTTP/2 rows cannot be checked: {why}; `cargo xtask test` installs it"
        );
    }
    let dir = TempDir::new("bench-smoke");
    let out = Command::new(target_bin("zerohop-bench"))
        .arg("--smoke")
        .arg("--out")
        .arg(dir.path())
        .output()
        .expect("run zerohop-bench");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let json: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("results.json")).expect("results.json written"),
    )
    .expect("results.json is JSON");
    let failures: Vec<String> = json["failures"]
        .as_array()
        .expect("failures")
        .iter()
        .map(|f| f.as_str().unwrap_or_default().to_owned())
        .collect();
    assert!(failures.is_empty(), "failures: {failures:?}\n{stderr}");
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let expected = SYSTEMS.to_vec();

    let m = &json["machine"];
    assert!(m["cores"].as_u64().unwrap() >= 1);
    assert!(!m["kernel"].as_str().unwrap().is_empty());
    assert!(!m["cpu_model"].as_str().unwrap().is_empty());
    assert_eq!(json["matrix"], "smoke");
    assert!(!json["pinning"].as_str().unwrap().is_empty());

    let runs = json["runs"].as_array().expect("runs");
    for experiment in ["concurrency", "body", "chain_length", "open_loop"] {
        let seen: BTreeSet<&str> = runs
            .iter()
            .filter(|r| r["experiment"] == experiment)
            .map(|r| r["system"].as_str().unwrap())
            .collect();
        assert_eq!(
            seen,
            expected.iter().copied().collect(),
            "{experiment}: every system ran"
        );
    }
    for r in runs {
        let what = format!("{} {}", r["system"], r["experiment"]);
        let res = &r["result"];
        assert!(res["requests"].as_u64().unwrap() > 0, "{what}: answers");
        assert_eq!(res["errors"], 0, "{what}: {}", res["first_error"]);
        assert_eq!(res["wrong"], 0, "{what}: {}", res["first_error"]);
        for f in ["rps", "seconds"] {
            assert!(res[f].as_f64().unwrap() > 0.0, "{what}: {f}");
        }
        for f in ["p50_us", "p90_us", "p99_us", "p999_us", "max_us", "mean_us"] {
            assert!(res["latency"][f].as_f64().unwrap() > 0.0, "{what}: {f}");
        }
        assert!(res["cdf"].as_array().unwrap().len() > 5, "{what}: cdf");
        let cpu = r["cpu_ms_per_1k"].as_object().unwrap();
        assert!(cpu.contains_key("loadgen"), "{what}: load generator apart");
        assert!(cpu.len() >= 2, "{what}: components {cpu:?}");
        assert!(r["sut_cpu_ms_per_1k"].as_f64().is_some(), "{what}");
        assert!(r["chain_len"].as_u64().unwrap() >= 1);
        assert!(!r["body"].as_str().unwrap().is_empty());
    }
    let idle: BTreeSet<&str> = json["idle"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["system"].as_str().unwrap())
        .collect();
    assert_eq!(idle, expected.iter().copied().collect());
    let memory = json["memory"].as_array().unwrap();
    for s in &expected {
        assert!(
            memory
                .iter()
                .any(|m| m["system"] == *s && m["rss_kib"].as_u64().unwrap() > 0),
            "{s}: memory"
        );
    }
    let floors: BTreeSet<&str> = json["floors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["name"].as_str().unwrap())
        .collect();
    // The floors test checks the names themselves; here only that all were measured.
    for f in zerohop_bench::floors::names() {
        assert!(floors.contains(f.as_str()), "floor {f}");
    }
    let targets = json["targets"].as_array().unwrap();
    assert!(targets.len() >= 4, "targets: {targets:?}");
    let protocols = &json["protocols"];
    let rows: BTreeSet<(&str, &str, bool)> = protocols["runs"]
        .as_array()
        .expect("protocol runs")
        .iter()
        .map(|r| {
            let what = format!("{} {}", r["system"], r["protocol"]);
            assert!(r["result"]["requests"].as_u64().unwrap() > 0, "{what}");
            assert!(r["result"]["rps"].as_f64().unwrap() > 0.0, "{what}");
            assert!(r["fault"].is_null(), "{what}: {}", r["fault"]);
            assert!(r["sut_cpu_ms_per_1k"].as_f64().unwrap() > 0.0, "{what}");
            assert!(r["cpu_ms_per_1k"]["loadgen"].as_f64().is_some(), "{what}");
            let tls = r["result"]["tls_version"].as_str().unwrap();
            let over_tls = r["protocol"] == "https" || r["protocol"] == "h2";
            assert_eq!(tls.starts_with("TLSv1."), over_tls, "{what}: {tls}");
            (
                r["system"].as_str().unwrap(),
                r["protocol"].as_str().unwrap(),
                r["streams"].as_u64().unwrap() > 1,
            )
        })
        .collect();
    assert_eq!(
        rows,
        [
            ("nginx-tls", "h2", false),
            ("nginx-tls", "h2", true),
            ("nginx-tls", "https", false),
            ("zerohop-ring", "h2", false),
            ("zerohop-ring", "h2", true),
            ("zerohop-ring", "h2c", false),
            ("zerohop-ring", "h2c", true),
            ("zerohop-ring", "http/1.1", false),
            ("zerohop-ring", "https", false),
        ]
        .into_iter()
        .collect()
    );
    let ratios = protocols["ratios"].as_array().expect("protocol ratios");
    assert_eq!(ratios.len(), 8, "{ratios:?}");
    for r in ratios {
        assert!(r["rps"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["cpu_per_request"].as_f64().unwrap() > 0.0, "{r}");
    }
    let summary = std::fs::read_to_string(dir.path().join("summary.md")).expect("summary.md");
    for heading in [
        "## Targets",
        "## Hello chain",
        "## HTTPS and HTTP/2",
        "## Idle",
        "## Floors",
    ] {
        assert!(summary.contains(heading), "summary lacks {heading}");
    }
}

#[test]
fn scale_point_reports_memory_ready_time_and_answers() {
    let out = Command::new(target_bin("zerohop-bench-scale"))
        .args([
            "--instances",
            "3,20",
            "--idle-seconds",
            "0.5",
            "--load-seconds",
            "0.5",
            "--concurrency",
            "4",
        ])
        .output()
        .expect("run zerohop-bench-scale");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "scale point failed: {stderr}");
    let json: Value = serde_json::from_slice(&out.stdout).expect("the report is JSON");
    let points = json["points"].as_array().expect("points");
    assert_eq!(points.len(), 2, "{stderr}");
    for (p, n) in points.iter().zip([3, 20]) {
        assert_eq!(p["instances"], n);
        assert_eq!(p["ok"], true, "{p}");
        assert!(p["ready_s"].as_f64().is_some_and(|s| s > 0.0));
        let mem = &p["memory_at_ready"];
        assert_eq!(mem["instances_found"], n, "every instance found: {mem}");
        assert!(mem["private_kib_mean"].as_f64().is_some_and(|k| k > 0.0));
        let load = &p["load"];
        assert!(load["requests"].as_u64().is_some_and(|r| r > 0), "{load}");
        assert_eq!(load["errors"], 0, "{load}");
        assert_eq!(load["wrong"], 0, "{load}");
        assert_eq!(
            p["stop"]["leftovers"], 0,
            "nothing left after the stop: {p}"
        );
    }
}
