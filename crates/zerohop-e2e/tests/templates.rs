//! `zerohop new --lang LANG NAME` end to end, as a user follows it: write the starter, build
//! it with the commands its README gives, bring its `chain.yaml` up with the real
//! `zerohop up` and send it a request over HTTP. Each starter upper-cases the body in place.
//!
//! The SDKs come from this checkout, as `cargo xtask test` leaves them: the C SDK in
//! `target/c-sdk` (C, Go), the Python package in `target/python-sdk`, the Node.js addon built
//! in `sdk/node`. Instances run under the chain's own uid, so the starter's folder is made
//! readable by others.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::{client, post};
use zerohop_test_support::{target_bin, ChainProcess, TempDir};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("the checkout")
}

/// Runs `cmd` in `dir`, failing the test with its output when it fails.
fn run(dir: &Path, what: &str, cmd: &mut Command) {
    let out = cmd
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot run it: {e}"));
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `zerohop new --lang LANG hi_LANG` in a fresh folder open to others; (its guard, the
/// starter's folder).
fn new_starter(lang: &str) -> (TempDir, PathBuf) {
    let tmp = TempDir::new(&format!("new-{lang}"));
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755))
        .expect("open the folder");
    let dir = tmp.path().join(format!("hi_{lang}"));
    let out = Command::new(target_bin("zerohop"))
        .args(["new", "--lang", lang])
        .arg(&dir)
        .output()
        .expect("run zerohop new");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "zerohop new: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("zerohop up chain.yaml"), "{stdout}");
    (tmp, dir)
}

/// Brings the starter's chain up and checks that it upper-cases a request.
fn serves(tmp: TempDir, dir: &Path, lang: &str) {
    let chain = ChainProcess::start_file(&dir.join("chain.yaml"), &[], tmp);
    let r = post(
        &client(),
        &format!("{}/hi_{lang}", chain.url),
        "hello, zerohop",
    );
    assert_eq!(
        (r.status, r.body.as_str()),
        (200, "HELLO, ZEROHOP"),
        "{lang}"
    );
    assert_eq!(chain.stop(), Some(0));
}

#[test]
fn rust_starter_builds_and_serves() {
    let (tmp, dir) = new_starter("rust");
    // Its own target folder under the checkout's, kept between runs (the dependencies are
    // built once), linked where the chain expects it.
    let target = root().join("target/templates");
    run(
        &dir,
        "cargo build --release",
        Command::new(env!("CARGO"))
            .args(["build", "--release", "--quiet"])
            .env("CARGO_TARGET_DIR", &target),
    );
    std::os::unix::fs::symlink(&target, dir.join("target")).expect("link target");
    serves(tmp, &dir, "rust");
}

#[test]
fn c_starter_builds_and_serves() {
    let (tmp, dir) = new_starter("c");
    assert!(
        root()
            .join("target/c-sdk/lib/pkgconfig/zerohop-static.pc")
            .exists(),
        "no C SDK in target/c-sdk: `cargo xtask c-sdk` (cargo xtask test runs it)"
    );
    run(&dir, "make", &mut Command::new("make"));
    serves(tmp, &dir, "c");
}

#[test]
fn go_starter_builds_and_serves() {
    let (tmp, dir) = new_starter("go");
    run(
        &dir,
        "go build",
        Command::new("go")
            .args(["build", "-o", "hi_go", "."])
            .env("PKG_CONFIG_PATH", root().join("target/c-sdk/lib/pkgconfig")),
    );
    serves(tmp, &dir, "go");
}

#[test]
fn python_starter_serves() {
    let (tmp, dir) = new_starter("python");
    // As the README says, the package goes into .packages; the one `cargo xtask test`
    // installed stands in for `pip install --target .packages` (same wheel, no rebuild).
    let installed = root().join("target/python-sdk");
    assert!(
        installed.join("zerohop/__init__.py").exists(),
        "no Python SDK in target/python-sdk (cargo xtask test installs it with pip)"
    );
    std::os::unix::fs::symlink(&installed, dir.join(".packages")).expect("link .packages");
    // Instances cannot run a python3 under /root: the system's, as the spec's comment says.
    let spec = dir.join("chain.yaml");
    let text = std::fs::read_to_string(&spec).expect("read chain.yaml");
    assert!(text.contains("interpreter: python3"), "{text}");
    std::fs::write(
        &spec,
        text.replace("interpreter: python3", "interpreter: /usr/bin/python3"),
    )
    .expect("write chain.yaml");
    serves(tmp, &dir, "python");
}

#[test]
fn node_starter_builds_and_serves() {
    let (tmp, dir) = new_starter("node");
    assert!(
        root().join("sdk/node/zerohop.node").exists(),
        "the Node.js addon is not built: `npm run build` in sdk/node (cargo xtask test does)"
    );
    run(
        &dir,
        "npm install",
        Command::new("npm").args(["install", "--offline", "--no-audit", "--no-fund"]),
    );
    serves(tmp, &dir, "node");
}
