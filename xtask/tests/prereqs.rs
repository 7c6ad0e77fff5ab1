//! `cargo xtask test` on a machine that lacks a program: one line naming it and the command
//! that installs it, exit code 1, and nothing built. The machine is faked with a `PATH` that
//! holds every program the tests need but mosquitto (and no apt-get, so the task cannot
//! install it).

use std::path::PathBuf;
use std::process::Command;

/// The programs `xtask` looks for on `PATH` (its table), and what it itself runs first.
const PROGRAMS: &[&str] = &[
    "clang",
    "cc",
    "pkg-config",
    "make",
    "npm",
    "nginx",
    "mosquitto_pub",
    "coap-client-notls",
    "promtool",
    "etcd",
    "openssl",
    "curl",
    "h2load",
    "wrk",
    "ip",
    "nsenter",
    "strip",
    "runc",
    "go",
    "node",
];

fn find(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

#[test]
fn a_missing_program_stops_the_test_command_before_it_builds_anything() {
    let fake = tempfile::tempdir().expect("a temp dir");
    for p in PROGRAMS {
        let real = find(p).unwrap_or_else(|| {
            panic!("{p} is not on PATH: cargo xtask test installs it before this test runs")
        });
        std::os::unix::fs::symlink(&real, fake.path().join(p)).expect("link");
    }
    let out = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .arg("test")
        .env("PATH", fake.path())
        // Its failed phase belongs to this test, not to the record of the run around it.
        .env("XTASK_PHASES_FILE", fake.path().join("phases.tsv"))
        .output()
        .expect("run xtask");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let missing: Vec<&str> = stderr.lines().filter(|l| l.contains("missing")).collect();
    assert_eq!(
        missing,
        ["xtask: missing mosquitto (the MQTT tests' broker): install it with `apt-get install mosquitto`"],
        "{stderr}"
    );
    assert!(
        stderr.contains("nothing was built"),
        "the last line says so: {stderr}"
    );
    assert!(!stderr.contains("building"), "it built something: {stderr}");
    let phases = std::fs::read_to_string(fake.path().join("phases.tsv")).expect("its phases");
    assert!(phases.contains("system packages"), "{phases}");
}
