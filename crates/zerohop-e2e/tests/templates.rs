//! `zerohop new --lang LANG NAME` end to end, as a user follows it: write the starter, build
//! it with the commands its README gives, bring its `chain.yaml` up with the real
//! `zerohop up` and send it a request over HTTP. Each starter upper-cases the body in place.
//!
//! The SDKs come from this checkout: the C SDK in `target/c-sdk` (C, Go), as `cargo xtask
//! test` leaves it; the Python and Node.js starters run the commands `zerohop new` printed,
//! exactly as printed, on a machine whose `python3` and `node` on PATH live in a folder under
//! /root that others cannot enter (pyenv, nvm, a virtualenv: a developer's machine), which
//! the chain's uid could not run. Instances run under the chain's own uid, so the starter's
//! folder is made readable by others.

mod common;

use std::ffi::OsString;
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{client, post};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
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
fn python_starter_builds_and_serves_as_printed() {
    let private = PrivateBin::new("python");
    let (tmp, dir, steps) = new_starter_as_printed("python", &private);
    assert!(
        steps
            .iter()
            .any(|s| s.contains(" -m pip install --target .packages ")),
        "{steps:?}"
    );
    // pip builds the package with maturin (its Rust part too), in the target folder `cargo
    // xtask test` built the SDK in (see `run_printed`): nothing to compile when it is warm.
    for step in &steps {
        run_printed(&dir, step, &private, Duration::from_secs(30 * 60));
    }
    serves(tmp, &dir, "python");
}

#[test]
fn node_starter_builds_and_serves_as_printed() {
    let private = PrivateBin::new("node");
    let (tmp, dir, steps) = new_starter_as_printed("node", &private);
    assert!(steps.iter().any(|s| s == "npm install"), "{steps:?}");
    for step in &steps {
        run_printed(&dir, step, &private, Duration::from_secs(20 * 60));
    }
    serves(tmp, &dir, "node");
}

/// A folder closed to others (mode 0700) in root's home (`$HOME` when not root), whose `bin`
/// holds `python3` and `node` linked to the ones on this test's PATH: put first on PATH, they
/// are what a developer's pyenv or nvm gives, interpreters the chain's uid cannot run.
/// Removed on drop.
struct PrivateBin {
    dir: PathBuf,
}

impl PrivateBin {
    fn new(tag: &str) -> Self {
        let home = if nix::unistd::geteuid().is_root() {
            PathBuf::from("/root")
        } else {
            PathBuf::from(std::env::var_os("HOME").expect("HOME"))
        };
        let dir = home.join(format!("zerohop-test-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("bin")).expect("create the private folder");
        let private = Self { dir };
        std::fs::set_permissions(&private.dir, std::fs::Permissions::from_mode(0o700))
            .expect("close the private folder");
        for name in ["python3", "node"] {
            let real = on_path(name).unwrap_or_else(|| panic!("no {name} on PATH"));
            std::os::unix::fs::symlink(&real, private.dir.join("bin").join(name))
                .expect("link into the private folder");
        }
        private
    }

    /// PATH with the private `bin` first.
    fn path(&self) -> OsString {
        let mut dirs = vec![self.dir.join("bin")];
        dirs.extend(std::env::split_paths(
            &std::env::var_os("PATH").unwrap_or_default(),
        ));
        std::env::join_paths(dirs).expect("PATH")
    }
}

impl Drop for PrivateBin {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The first executable `name` on PATH.
fn on_path(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(name))
        .find(|p| {
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// `zerohop new --lang LANG hi_LANG` (with the private PATH) in a fresh folder open to
/// others; (its guard, the starter's folder, the commands it printed before `zerohop up`).
fn new_starter_as_printed(lang: &str, private: &PrivateBin) -> (TempDir, PathBuf, Vec<String>) {
    let tmp = TempDir::new(&format!("new-{lang}"));
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755))
        .expect("open the folder");
    let dir = tmp.path().join(format!("hi_{lang}"));
    let out = Command::new(target_bin("zerohop"))
        .args(["new", "--lang", lang])
        .arg(&dir)
        .env("PATH", private.path())
        .output()
        .expect("run zerohop new");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "zerohop new: {stdout}{stderr}");
    // The commands between "next:" and `zerohop up`, as printed (indented by two spaces).
    let mut lines = stdout.lines();
    assert!(
        lines.by_ref().any(|l| l.ends_with("; next:")),
        "no next steps: {stdout}"
    );
    let steps: Vec<String> = lines
        .take_while(|l| l.trim() != "zerohop up chain.yaml")
        .map(|l| l.strip_prefix("  ").unwrap_or(l).to_owned())
        .collect();
    assert!(stdout.contains("\n  zerohop up chain.yaml\n"), "{stdout}");
    assert_eq!(
        steps.first(),
        Some(&format!("cd {}", dir.display())),
        "{stdout}"
    );
    // The interpreter it chose is one the chain's uid can run, not the private one.
    let spec = std::fs::read_to_string(dir.join("chain.yaml")).expect("read chain.yaml");
    assert!(spec.contains("interpreter: \"/"), "{spec}");
    if nix::unistd::geteuid().is_root() {
        assert!(
            !spec.contains(&private.dir.display().to_string()) && !spec.contains("/root/"),
            "{spec}\n{stderr}"
        );
    }
    (tmp, dir, steps)
}

/// Runs one printed command with `sh -c` in the starter's folder, with the private PATH;
/// fails the test with its output when it fails or outlasts `limit` (its process group is
/// killed then). Cargo's target folder is the checkout's, as a developer may set
/// `CARGO_TARGET_DIR`: the one `cargo xtask test` builds the SDKs in, so pip's build of the
/// Python SDK finds its Rust part built there.
fn run_printed(dir: &Path, line: &str, private: &PrivateBin, limit: Duration) {
    let mut child = Command::new("sh")
        .args(["-c", line])
        .current_dir(dir)
        .env("PATH", private.path())
        .env("CARGO_TARGET_DIR", root().join("target"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .unwrap_or_else(|e| panic!("`{line}`: cannot run it: {e}"));
    // Read on threads, handed over through a channel: a process left behind holding a pipe
    // must not hold the test up.
    let (tx, rx) = std::sync::mpsc::channel();
    for mut pipe in [
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    ]
    .into_iter()
    .flatten()
    {
        let tx = tx.clone();
        std::thread::spawn(move || {
            let mut out = Vec::new();
            let _ = pipe.read_to_end(&mut out);
            let _ = tx.send(String::from_utf8_lossy(&out).into_owned());
        });
    }
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break Some(status);
        }
        if Instant::now() >= deadline {
            // Before the leader is reaped, so the group's id is still its own.
            let group = Pid::from_raw(i32::try_from(child.id()).expect("pid"));
            let _ = killpg(group, Signal::SIGKILL);
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let output: String = (0..2)
        .filter_map(|_| rx.recv_timeout(Duration::from_secs(10)).ok())
        .collect();
    match status {
        Some(s) if s.success() => {}
        Some(s) => panic!("`{line}` failed ({s}):\n{output}"),
        None => panic!("`{line}` did not finish within {limit:?}:\n{output}"),
    }
}
