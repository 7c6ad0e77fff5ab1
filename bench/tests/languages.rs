//! `zerohop-bench-languages` end to end on the languages every CI machine can build: Rust and
//! C (`cc` against the C SDK that `cargo xtask test` installs first). Both rows are measured
//! with every answer right and positive numbers, and the report is written. Never asserts a
//! time beyond "positive".

use std::process::Command;

use serde_json::Value;
use zerohop_test_support::{target_bin, TempDir};

#[test]
fn rust_and_c_rows_are_measured_and_reported() {
    let dir = TempDir::new("bench-languages");
    let out = Command::new(target_bin("zerohop-bench-languages"))
        .args(["--quick", "--languages", "rust,c", "--seconds", "1"])
        .args(["--rounds", "1", "--idle-seconds", "0.5", "--out"])
        .arg(dir.path())
        .output()
        .expect("run zerohop-bench-languages");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let json: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("languages.json"))
            .expect("languages.json written"),
    )
    .expect("languages.json is JSON");
    assert_eq!(json["ok"], true);
    assert_eq!(json["reference"], "rust");
    assert!(json["machine"]["cores"].as_u64().unwrap() >= 1);
    assert!(json["disturbance"]["own_cores"].as_f64().unwrap() > 0.0);
    let rows = json["languages"].as_array().expect("languages");
    let names: Vec<&str> = rows
        .iter()
        .map(|r| r["language"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["rust", "c"]);
    for row in rows {
        let lang = row["language"].as_str().unwrap();
        // A C row not run names what is missing (`cargo xtask c-sdk`): say it, then fail.
        assert_eq!(row["status"], "measured", "{lang}: {}", row["reason"]);
        assert_eq!(row["errors"].as_array().unwrap().len(), 0, "{lang}: {row}");
        let m = &row["result"];
        for point in ["one", "chain"] {
            let p = &m[point];
            let what = format!("{lang} /{point}");
            assert!(p["requests"].as_u64().unwrap() > 0, "{what}: answers");
            assert_eq!(p["errors"], 0, "{what}: {}", p["first_error"]);
            assert_eq!(p["wrong"], 0, "{what}: {}", p["first_error"]);
            for f in ["p50_us", "mean_us", "p99_us", "rps"] {
                assert!(p[f].as_f64().unwrap() > 0.0, "{what}: {f}");
            }
        }
        assert_eq!(m["chain"]["functions"], 5);
        assert!(
            m["chain"]["fn_cpu_us_per_request"].as_f64().unwrap() > 0.0,
            "{lang}: the instances' CPU was counted"
        );
        assert!(m["per_hop_p50_us"].as_f64().unwrap().is_finite());
        assert_eq!(m["idle"]["instances"], 5);
        assert!(m["idle"]["cpu_ms_per_s"].as_f64().unwrap() >= 0.0);
        assert!(
            m["memory"]["vm_rss_kib"].as_u64().unwrap() > 0,
            "{lang}: RSS"
        );
        assert!(m["memory"]["threads"].as_u64().unwrap() >= 1, "{lang}");
        assert!(
            !row["function"]["built"].as_str().unwrap().is_empty(),
            "{lang}: says how it was built"
        );
    }
    let md = std::fs::read_to_string(dir.path().join("languages.md")).expect("languages.md");
    for needle in ["| Rust | **", "| C | **", "## How measured", "Machine: "] {
        assert!(md.contains(needle), "languages.md lacks {needle:?}:\n{md}");
    }
    let last = stdout.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("languages: per-hop p50 rust "),
        "summary line: {last:?}"
    );
}
