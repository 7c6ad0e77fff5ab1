//! A running `zerohop agent` node daemon for a test, and the `zerohop` CLI driven against
//! its admin socket.
//!
//! Each [`Daemon`] has a temp folder of its own (socket, specs, log), so tests in one binary
//! may run side by side. Its stderr goes to `agent.log` in that folder; a test that panics
//! gets the log's tail on its stderr. Every CLI call is bounded: a hung CLI fails the test
//! instead of hanging it.

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Output, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::Value;
use zerohop_test_support::{
    alive, descendants, target_bin, wait_until, ChildGuard, ChildLines, Signal, TempDir,
};

/// How long one CLI call may take unless [`Daemon::with_cli_bound`] says otherwise.
pub const CLI_BOUND: Duration = Duration::from_secs(60);
/// How long a daemon dropped without [`Daemon::stop`] has to stop on SIGTERM before it is
/// killed.
const DROP_GRACE: Duration = Duration::from_secs(10);
/// How many lines of the agent's log a failing test prints.
const LOG_TAIL: usize = 60;

/// A `zerohop agent` on a socket of its own. Dropped while running (a test failed, or does
/// not stop it), it gets SIGTERM so that it takes its instances down, and SIGKILL when it has
/// not exited within 10 s.
pub struct Daemon {
    guard: ChildGuard,
    /// Holds the daemon's stdout open (it would die of SIGPIPE on its next line otherwise).
    _lines: ChildLines,
    socket: PathBuf,
    metrics: String,
    log: PathBuf,
    cli_bound: Duration,
    dir: TempDir,
}

impl Daemon {
    /// Starts the daemon, with metrics on a free port, and waits for its ready line. The temp
    /// folder is named after the test binary.
    pub fn start() -> Self {
        Self::start_with(|_| Vec::new())
    }

    /// [`Daemon::start`] with more arguments for `zerohop agent`, made from the daemon's temp
    /// folder (for files the daemon reads at start).
    pub fn start_with(args: impl FnOnce(&Path) -> Vec<String>) -> Self {
        Self::start_with_env(args, &[])
    }

    /// [`Daemon::start_with`] with more environment variables for the daemon.
    pub fn start_with_env(
        args: impl FnOnce(&Path) -> Vec<String>,
        env: &[(&str, &std::ffi::OsStr)],
    ) -> Self {
        let dir = TempDir::new(env!("CARGO_CRATE_NAME"));
        let extra = args(dir.path());
        let socket = dir.path().join("admin.sock");
        let log = dir.path().join("agent.log");
        let mut cmd = Command::new(target_bin("zerohop"));
        cmd.arg("agent")
            .arg("--socket")
            .arg(&socket)
            .args(["--metrics", "127.0.0.1:0"])
            .args(&extra)
            .env_remove("ZEROHOP_SOCKET")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(File::create(&log).expect("create the agent's log"));
        let mut guard = ChildGuard::new(cmd.spawn().expect("spawn zerohop agent"));
        let lines = ChildLines::new(&mut guard);
        let ready = lines.wait_for("zerohop agent", "daemon ready on ", Duration::from_secs(30));
        let metrics = ready
            .split_whitespace()
            .find(|w| w.starts_with("http://"))
            .expect("a metrics URL in the ready line")
            .to_owned();
        Self {
            guard,
            _lines: lines,
            socket,
            metrics,
            log,
            cli_bound: CLI_BOUND,
            dir,
        }
    }

    /// Bounds every later CLI call by `bound` instead of [`CLI_BOUND`].
    pub fn with_cli_bound(mut self, bound: Duration) -> Self {
        self.cli_bound = bound;
        self
    }

    /// The daemon's pid; 0 once it has been stopped and reaped.
    pub fn pid(&self) -> u32 {
        self.guard.pid()
    }

    /// The admin socket.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The daemon's temp folder (the socket and the specs are in it).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The metrics page's URL, from the ready line.
    pub fn metrics(&self) -> &str {
        &self.metrics
    }

    /// The agent's log (its stderr).
    pub fn log(&self) -> &Path {
        &self.log
    }

    /// Runs `zerohop ARGS --socket S`; returns its output whatever its exit status.
    pub fn cli(&self, args: &[&str]) -> Output {
        zerohop(&self.socket, args, self.cli_bound)
    }

    /// `zerohop ARGS --json`, which must succeed; its output parsed.
    pub fn json(&self, args: &[&str]) -> Value {
        let mut all = args.to_vec();
        all.push("--json");
        let out = self.cli(&all);
        assert!(
            out.status.success(),
            "zerohop {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "zerohop {args:?}: {e}: {}",
                String::from_utf8_lossy(&out.stdout)
            )
        })
    }

    /// `zerohop status CHAIN --json`.
    pub fn status(&self, chain: &str) -> Value {
        self.json(&["status", chain])
    }

    /// Writes `spec` to the daemon's folder as `NAME.yaml` (the same file each time, as an
    /// operator edits one spec); returns the file.
    pub fn write(&self, name: &str, spec: &str) -> PathBuf {
        let file = self.dir.path().join(format!("{name}.yaml"));
        std::fs::write(&file, spec).expect("write spec");
        file
    }

    /// Writes `spec` as `NAME.yaml` and runs `zerohop apply --json` on it, which must
    /// succeed; its output parsed.
    pub fn apply(&self, name: &str, spec: &str) -> Value {
        let file = self.write(name, spec);
        self.json(&["apply", file.to_str().expect("a UTF-8 temp path")])
    }

    /// SIGTERM; the exit code within 30 s (`None`: killed by a signal).
    #[must_use = "the exit code says whether the daemon stopped cleanly"]
    pub fn stop(&mut self) -> Option<i32> {
        self.guard.signal(Signal::SIGTERM);
        self.guard.wait_timeout(Duration::from_secs(30))
    }

    /// Stops the daemon (SIGTERM) and asserts that it exits cleanly and that nothing it
    /// started outlives it.
    pub fn stop_cleanly(mut self) {
        let below = descendants(&[self.pid()]);
        assert_eq!(self.stop(), Some(0), "the daemon exits cleanly");
        assert!(
            wait_until(Duration::from_secs(10), || !below.iter().any(|&p| alive(p))),
            "a process started by the daemon outlived it: {below:?}"
        );
    }

    fn print_log_tail(&self) {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        eprintln!(
            "--- last lines of the agent's log ({} in all) ---",
            lines.len()
        );
        for l in &lines[lines.len().saturating_sub(LOG_TAIL)..] {
            eprintln!("{l}");
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        // Not stopped: a clean stop first, so the daemon takes its instances down; the
        // guard's SIGKILL (when it drops, after this) otherwise. No `wait_timeout` here: it
        // panics, and a panic while unwinding aborts.
        if self.guard.pid() != 0 {
            self.guard.signal(Signal::SIGTERM);
            let deadline = Instant::now() + DROP_GRACE;
            while Instant::now() < deadline {
                if matches!(self.guard.child_mut().try_wait(), Ok(Some(_))) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        // After the stop, so the log has the daemon's last words.
        if std::thread::panicking() {
            self.print_log_tail();
        }
    }
}

/// The pids of every instance a `zerohop status --json` lists that has a process, in the
/// order listed.
pub fn instance_pids(status: &Value) -> Vec<u32> {
    status["functions"]
        .as_array()
        .expect("functions")
        .iter()
        .flat_map(|f| f["instances"].as_array().expect("instances").iter())
        .filter_map(|i| i["pid"].as_u64())
        .map(|p| p as u32)
        .collect()
}

/// Runs `zerohop ARGS --socket SOCKET` and returns its output whatever its exit status;
/// panics when it has not exited within `bound` (it is killed). A function of its own, not
/// only [`Daemon::cli`], so a test can run the CLI on another thread.
pub fn zerohop(socket: &Path, args: &[&str], bound: Duration) -> Output {
    let mut child = Command::new(target_bin("zerohop"))
        .args(args)
        .arg("--socket")
        .arg(socket)
        .env_remove("ZEROHOP_SOCKET")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run zerohop");
    // Both pipes drained on threads, so a full one never stalls the CLI.
    let stdout = drain(child.stdout.take().expect("piped stdout"));
    let stderr = drain(child.stderr.take().expect("piped stderr"));
    let status = exit_within(&mut child, bound)
        .unwrap_or_else(|| panic!("zerohop {args:?} did not exit within {bound:?}"));
    Output {
        status,
        stdout: stdout.join().expect("the stdout reader"),
        stderr: stderr.join().expect("the stderr reader"),
    }
}

fn drain(mut pipe: impl Read + Send + 'static) -> JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut all = Vec::new();
        let _ = pipe.read_to_end(&mut all);
        all
    })
}

/// The child's exit status within `bound`; `None` when it had not exited (it is then killed
/// and reaped).
fn exit_within(child: &mut std::process::Child, bound: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + bound;
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return Some(status);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}
