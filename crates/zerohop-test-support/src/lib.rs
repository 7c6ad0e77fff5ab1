//! `zerohop-test-support`: what every multi-process test of zerohop needs.
//!
//! * [`ChildGuard`]: a child process that is killed and reaped when the guard drops, also
//!   when the test panics.
//! * [`spawn_self`]: re-runs the current test binary as a child executing one named test in
//!   a given role, with file descriptors mapped to fixed numbers (how tests hand a pool or a
//!   transport to another process, as the agent does).
//! * `/proc` readers for leak and idle checks: open fds, memfds, CPU ticks, descendants.
//! * [`wait_until`]: every wait in a test is bounded.
//!
//! `unsafe` only to take ownership of inherited descriptors in a child.

use std::os::fd::OwnedFd;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use command_fds::{CommandFdExt, FdMapping};

/// Environment variable naming the role a re-executed test binary plays.
pub const ROLE_ENV: &str = "ZEROHOP_TEST_ROLE";

/// A child process killed (SIGKILL) and reaped on drop.
pub struct ChildGuard {
    child: Option<Child>,
}

impl ChildGuard {
    /// Guards `child`.
    pub fn new(child: Child) -> Self {
        Self { child: Some(child) }
    }

    /// Pid of the child.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// Mutable access to the child (stdin/stdout handles).
    pub fn child_mut(&mut self) -> &mut Child {
        self.child.as_mut().expect("child present until drop")
    }

    /// Waits up to `timeout` for the child to exit; returns its exit code (`None` when it
    /// was killed by a signal). Panics when it does not exit in time (the guard still kills
    /// it on drop).
    pub fn wait_timeout(&mut self, timeout: Duration) -> Option<i32> {
        let child = self.child.as_mut().expect("child present until drop");
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = child.try_wait().expect("try_wait") {
                let code = status.code();
                self.child = None;
                return code;
            }
            assert!(
                Instant::now() < deadline,
                "child {} did not exit within {timeout:?}",
                child.id()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Sends `signal` (e.g. `"TERM"`, `"KILL"`) with kill(1).
    pub fn signal(&self, signal: &str) {
        signal_pid(self.pid(), signal);
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The lines a child prints on stdout, read on a thread so that every wait for one is
/// bounded.
pub struct ChildLines {
    rx: std::sync::mpsc::Receiver<String>,
}

impl ChildLines {
    /// Takes the child's piped stdout.
    pub fn new(child: &mut ChildGuard) -> Self {
        use std::io::BufRead;
        let out = child.child_mut().stdout.take().expect("piped stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Self { rx }
    }

    /// The next line, waiting at most `timeout` (zero: only what is already there); `None`
    /// when none came or stdout is closed.
    pub fn next_line(&self, timeout: Duration) -> Option<String> {
        self.rx.recv_timeout(timeout).ok()
    }

    /// Waits at most `timeout` for a line containing `marker`; returns what follows it.
    /// Panics naming `who` when none comes.
    pub fn wait_for(&self, who: &str, marker: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                // libtest may have printed "test NAME ... " on the same line first.
                Ok(line) => {
                    if let Some(at) = line.find(marker) {
                        return line[at + marker.len()..].trim().to_owned();
                    }
                }
                Err(e) => panic!("{who} printed no {marker:?} line: {e}"),
            }
        }
    }
}

/// Sends `signal` to `pid` with kill(1); panics when kill fails to run.
pub fn signal_pid(pid: u32, signal: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .stderr(Stdio::null())
        .status()
        .expect("run kill");
}

/// Runs `command` with `fds` mapped to descriptors 3, 4, ... in the child.
pub fn spawn_with_fds(mut command: Command, fds: Vec<OwnedFd>) -> ChildGuard {
    let mappings = fds
        .into_iter()
        .enumerate()
        .map(|(i, fd)| FdMapping {
            parent_fd: fd,
            child_fd: 3 + i as i32,
        })
        .collect();
    command
        .fd_mappings(mappings)
        .expect("fd mappings do not collide");
    ChildGuard::new(command.spawn().expect("spawn child"))
}

/// Re-runs this test binary as a child that executes only the test `test` (its full path,
/// e.g. `ring_ping_pong`), with [`ROLE_ENV`] set to `role`, extra `env`, and `fds` mapped to
/// 3, 4, ... The child's stdout is piped, stderr inherited.
pub fn spawn_self(test: &str, role: &str, env: &[(&str, String)], fds: Vec<OwnedFd>) -> ChildGuard {
    let exe = std::env::current_exe().expect("current_exe");
    let mut cmd = Command::new(exe);
    cmd.args([test, "--exact", "--nocapture", "--test-threads", "1"])
        .env(ROLE_ENV, role)
        .stdin(Stdio::null())
        .stdout(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    spawn_with_fds(cmd, fds)
}

/// The role this process plays, when re-executed by [`spawn_self`].
pub fn role() -> Option<String> {
    std::env::var(ROLE_ENV).ok()
}

/// Takes ownership of inherited descriptors 3 .. 3+n (in a child made by [`spawn_self`]).
/// Call it once per process.
pub fn inherited_fds(n: usize) -> Vec<OwnedFd> {
    use std::os::fd::FromRawFd;
    (0..n)
        .map(|i| {
            let raw = 3 + i as i32;
            assert!(
                Path::new(&format!("/proc/self/fd/{raw}")).exists(),
                "descriptor {raw} was not inherited"
            );
            // SAFETY: spawn_with_fds mapped these descriptors into this process for it to
            // own; nothing else in a test child claims them, and this runs once.
            unsafe { OwnedFd::from_raw_fd(raw) }
        })
        .collect()
}

/// A free TCP port on 127.0.0.1 (bound then released).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("bind an ephemeral port")
}

/// Waits until `cond` holds, checking every 10 ms, for at most `timeout`.
pub fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Number of open file descriptors of `pid` (0 when the process is gone).
pub fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

/// Targets of `pid`'s fds that are memfds (`/memfd:NAME (deleted)`).
pub fn memfds(pid: u32) -> Vec<String> {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return Vec::new();
    };
    dir.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .map(|p| p.to_string_lossy().into_owned())
        .filter(|p| p.contains("memfd:"))
        .collect()
}

/// Mappings of `pid` backed by memfds (from /proc/PID/maps).
pub fn memfd_mappings(pid: u32) -> usize {
    std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .map_or(0, |m| m.lines().filter(|l| l.contains("memfd:")).count())
}

/// Calls `f` with the fields of a stat file (`/proc/PID/stat`, `/proc/PID/task/TID/stat`)
/// from field 3 (the state) on: `fields[n - 3]` is field `n` of proc(5). `None` when the
/// file is gone or `f` says so.
pub fn stat_fields<T>(path: impl AsRef<Path>, f: impl FnOnce(&[&str]) -> Option<T>) -> Option<T> {
    let stat = std::fs::read_to_string(path).ok()?;
    // The command (field 2) may hold spaces and parentheses: fields resume after the last ')'.
    let rest = stat.get(stat.rfind(')')? + 2..)?;
    f(&rest.split_whitespace().collect::<Vec<_>>())
}

/// Field `n` (1-based, as in proc(5); `n` >= 3) of /proc/PID/stat.
pub fn stat_field(pid: u32, n: usize) -> Option<String> {
    stat_fields(format!("/proc/{pid}/stat"), |f| {
        f.get(n.checked_sub(3)?).map(|s| (*s).to_owned())
    })
}

/// utime + stime (fields 14 and 15) of a stat file, in clock ticks.
pub fn stat_cpu_ticks(path: impl AsRef<Path>) -> Option<u64> {
    stat_fields(path, |f| {
        Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
    })
}

/// Clock ticks per second of `/proc/PID/stat` (USER_HZ, 100 on Linux).
pub const TICKS_PER_SECOND: f64 = 100.0;

/// utime + stime of `pid` in clock ticks ([`TICKS_PER_SECOND`]), summed over its threads;
/// `None` when gone.
pub fn cpu_ticks(pid: u32) -> Option<u64> {
    stat_cpu_ticks(format!("/proc/{pid}/stat"))
}

/// Pids whose parent is `pid`.
pub fn children(pid: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&p| parent_of(p) == Some(pid))
        .collect()
}

/// `roots` and every live process below them, from one pass over `/proc`.
pub fn descendants(roots: &[u32]) -> Vec<u32> {
    let parents: Vec<(u32, u32)> = std::fs::read_dir("/proc")
        .map(|dir| {
            dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
                .filter_map(|p| Some((p, parent_of(p)?)))
                .collect()
        })
        .unwrap_or_default();
    let mut all = roots.to_vec();
    let mut i = 0;
    while i < all.len() {
        let parent = all[i];
        for &(p, _) in parents.iter().filter(|&&(_, pp)| pp == parent) {
            if !all.contains(&p) {
                all.push(p);
            }
        }
        i += 1;
    }
    all
}

/// The name (`comm`) of the agent's spawner process, its one child that is no instance.
pub const SPAWNER_NAME: &str = "zerohop-spawner";

/// The instances of the agent `pid`: its children but the spawner.
pub fn instances(pid: u32) -> Vec<u32> {
    children(pid)
        .into_iter()
        .filter(|&p| !is_spawner(p))
        .collect()
}

/// The agent `pid`'s spawner, if it runs.
pub fn spawner(pid: u32) -> Option<u32> {
    children(pid).into_iter().find(|&p| is_spawner(p))
}

fn is_spawner(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim_end() == SPAWNER_NAME)
}

/// Parent pid of `pid`.
pub fn parent_of(pid: u32) -> Option<u32> {
    stat_field(pid, 4)?.parse().ok()
}

/// Whether `pid` exists and is not a zombie.
pub fn alive(pid: u32) -> bool {
    stat_field(pid, 3).is_some_and(|s| !s.starts_with('Z'))
}

/// A binary built into this build's target folder (`target/<profile>/NAME`), next to the
/// running test's `deps` folder. Panics with what to run when it is missing.
pub fn target_bin(name: &str) -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("test binaries live in target/<profile>/deps");
    let bin = dir.join(name);
    assert!(
        bin.is_file(),
        "{} is missing: build the binaries first with `cargo build --release --workspace --bins` \
         (`cargo xtask test` does it)",
        bin.display()
    );
    bin
}

/// A scratch folder removed on drop.
pub struct TempDir {
    path: std::path::PathBuf,
}

impl TempDir {
    /// Creates a fresh folder under the system temp dir.
    pub fn new(tag: &str) -> Self {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let path = std::env::temp_dir().join(format!(
            "zerohop-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&path).expect("create temp dir");
        Self { path }
    }

    /// The folder.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// The address after `scheme` in a ready line (`... ready at http://A, mqtt://B (...)`).
pub fn listener_in(line: &str, scheme: &str) -> Option<String> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(scheme))
        .map(|a| a.trim_end_matches(',').to_owned())
}

/// A chain run by the real `zerohop up` command on a free port; stopped (SIGTERM, then
/// SIGKILL) and its folder removed on drop.
pub struct ChainProcess {
    guard: ChildGuard,
    /// Base URL of the gateway, from the ready line.
    pub url: String,
    /// The ready line as printed.
    pub ready_line: String,
    _dir: TempDir,
}

impl ChainProcess {
    /// Writes `spec` to a scratch folder and runs `zerohop up` on it with `args`; waits (at
    /// most 30 s) for the ready line.
    pub fn start(spec: &str, args: &[&str]) -> Self {
        let dir = TempDir::new("chain");
        let file = dir.path().join("chain.yaml");
        std::fs::write(&file, spec).expect("write spec");
        Self::start_file(&file, args, dir)
    }

    /// Runs `zerohop up` on an existing spec file; `dir` is removed when the chain drops.
    pub fn start_file(file: &Path, args: &[&str], dir: TempDir) -> Self {
        use std::io::BufRead;
        let mut cmd = Command::new(target_bin("zerohop"));
        cmd.arg("up")
            .arg(file)
            .args(["--listen", "127.0.0.1:0"])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped());
        let mut guard = ChildGuard::new(cmd.spawn().expect("spawn zerohop"));
        let stdout = guard.child_mut().stdout.take().expect("piped stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = std::io::BufReader::new(stdout).lines();
            if let Some(Ok(l)) = lines.next() {
                let _ = tx.send(l);
            }
            // Keep draining so the chain never blocks on a full pipe.
            for _ in lines {}
        });
        let line = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("zerohop up printed its ready line within 30 s");
        let url = listener_in(&line, "http://")
            .map(|a| format!("http://{a}"))
            .unwrap_or_else(|| panic!("no URL in ready line {line:?}"));
        Self {
            guard,
            url,
            ready_line: line,
            _dir: dir,
        }
    }

    /// Pid of the `zerohop` process.
    pub fn pid(&self) -> u32 {
        self.guard.pid()
    }

    /// The address (`IP:PORT`) of the listener with `scheme` (`"mqtt://"`, `"coap://"`) the
    /// ready line names.
    pub fn listener(&self, scheme: &str) -> Option<String> {
        listener_in(&self.ready_line, scheme)
    }

    /// Sends SIGTERM and waits (at most 30 s) for the exit code.
    pub fn stop(mut self) -> Option<i32> {
        self.guard.signal("TERM");
        self.guard.wait_timeout(Duration::from_secs(30))
    }
}
