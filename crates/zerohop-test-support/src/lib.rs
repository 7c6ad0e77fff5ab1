//! `zerohop-test-support`: what every multi-process test of zerohop needs.
//!
//! * [`ChildGuard`]: a child process that is killed and reaped when the guard drops, also
//!   when the test panics.
//! * [`spawn_self`]: re-runs the current test binary as a child executing one named test in
//!   a given role, with file descriptors mapped to fixed numbers (how tests hand a pool or a
//!   transport to another process, as the agent does).
//! * `/proc` readers for leak and idle checks, through `procfs`: open fds, memfds, CPU
//!   ticks (and [`ticks_per_second`] from sysconf), process trees.
//! * [`signal_pid`]: kill(2) through `nix`, never pid 0 or -1.
//! * [`TempDir`]: a named scratch folder (`tempfile`), removed on drop.
//! * [`wait_until`]: every wait in a test is bounded.
//!
//! * [`netns`]: hosts as network namespaces on a bridge, for tests that cross a network.
//! * `kube` (feature `kube`): a real Kubernetes control plane (etcd and kube-apiserver) and
//!   a client of its API, for the cluster tests.
//! * [`locust`]: real Locust from PyPI in a venv of the checkout, its runs and their stats.
//!
//! `unsafe` only to take ownership of inherited descriptors in a child.

#[cfg(feature = "kube")]
pub mod kube;
pub mod locust;
pub mod netns;

use std::os::fd::OwnedFd;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use command_fds::{CommandFdExt, FdMapping};
pub use nix::sys::signal::Signal;
pub use procfs::process::Stat;
use procfs::process::{FDTarget, MMapPath, Process};

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
        let pid = self.pid();
        self.try_wait_timeout(timeout)
            .unwrap_or_else(|| panic!("child {pid} did not exit within {timeout:?}"))
    }

    /// [`wait_timeout`](Self::wait_timeout) that says `None` instead of panicking when the
    /// child does not exit in time (the guard still kills it on drop).
    pub fn try_wait_timeout(&mut self, timeout: Duration) -> Option<Option<i32>> {
        let child = self.child.as_mut().expect("child present until drop");
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = child.try_wait().expect("try_wait") {
                let code = status.code();
                self.child = None;
                return Some(code);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Sends `signal` to the child; nothing once it has been reaped (its pid may be
    /// another process's by then).
    pub fn signal(&self, signal: Signal) {
        if let Some(child) = &self.child {
            signal_pid(child.id(), signal);
        }
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

    /// Takes the child's piped stderr, and passes each line on to this process's own
    /// standard error too (unbuffered, as it went before it was piped).
    pub fn of_stderr(child: &mut ChildGuard) -> Self {
        use std::io::{BufRead, Write};
        let err = child.child_mut().stderr.take().expect("piped stderr");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            // Bytes, not `lines()`: a line that is not UTF-8 must not stop the reading (the
            // chain would block on a full pipe).
            for line in std::io::BufReader::new(err)
                .split(b'\n')
                .map_while(Result::ok)
            {
                let line = String::from_utf8_lossy(&line).into_owned();
                let _ = writeln!(std::io::stderr(), "{line}");
                // The test may have stopped listening; the chain's lines still go on.
                let _ = tx.send(line);
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

/// Sends `signal` to the process `pid` (kill(2)). A process already gone is no error;
/// panics on any other failure (no permission), and on a pid that kill(2) would read as a
/// process group or every process (0, or above `i32::MAX`).
pub fn signal_pid(pid: u32, signal: Signal) {
    let target = i32::try_from(pid)
        .ok()
        .filter(|&p| p > 0)
        .unwrap_or_else(|| panic!("signal_pid({pid}, {signal}): not a single process"));
    match nix::sys::signal::kill(nix::unistd::Pid::from_raw(target), signal) {
        Ok(()) | Err(nix::errno::Errno::ESRCH) => {}
        Err(e) => panic!("kill({pid}, {signal}): {e}"),
    }
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
                Process::myself().is_ok_and(|me| me.fd_from_fd(raw).is_ok()),
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

/// `/proc/PID` of `pid`, when it exists.
fn process(pid: u32) -> Option<Process> {
    Process::new(i32::try_from(pid).ok()?).ok()
}

/// Number of open file descriptors of `pid` (0 when the process is gone).
pub fn open_fds(pid: u32) -> usize {
    process(pid).and_then(|p| p.fd_count().ok()).unwrap_or(0)
}

/// Names of `pid`'s fds that are memfds (`NAME (deleted)` for `/memfd:NAME (deleted)`).
pub fn memfds(pid: u32) -> Vec<String> {
    let Some(fds) = process(pid).and_then(|p| p.fd().ok()) else {
        return Vec::new();
    };
    fds.filter_map(|fd| match fd.ok()?.target {
        FDTarget::MemFD(name) => Some(name),
        _ => None,
    })
    .collect()
}

/// Mappings of `pid` backed by memfds (from /proc/PID/maps).
pub fn memfd_mappings(pid: u32) -> usize {
    let Some(maps) = process(pid).and_then(|p| p.maps().ok()) else {
        return 0;
    };
    maps.into_iter()
        .filter(|m| match &m.pathname {
            // A string prefix: `Path::starts_with` compares whole components.
            MMapPath::Path(p) => p.as_os_str().as_encoded_bytes().starts_with(b"/memfd:"),
            _ => false,
        })
        .count()
}

/// `/proc/PID/stat` of `pid`, parsed (`None` when it is gone).
pub fn stat(pid: u32) -> Option<Stat> {
    process(pid)?.stat().ok()
}

/// `/proc/PID/task/TID/stat` of each thread of `pid` (`pid` field: the thread id, `comm`:
/// the thread's name); empty when the process is gone.
pub fn thread_stats(pid: u32) -> Vec<Stat> {
    let Some(tasks) = process(pid).and_then(|p| p.tasks().ok()) else {
        return Vec::new();
    };
    tasks.filter_map(|t| t.ok()?.stat().ok()).collect()
}

/// The stat of every process, from one pass over `/proc` (processes that exit meanwhile are
/// left out).
pub fn all_stats() -> Vec<Stat> {
    let Ok(all) = procfs::process::all_processes() else {
        return Vec::new();
    };
    all.filter_map(|p| p.ok()?.stat().ok()).collect()
}

/// Clock ticks per second of the CPU times in `/proc` (USER_HZ, from `sysconf(_SC_CLK_TCK)`).
pub fn ticks_per_second() -> f64 {
    procfs::ticks_per_second() as f64
}

/// utime + stime of `pid` in clock ticks ([`ticks_per_second`]), summed over its threads;
/// `None` when gone.
pub fn cpu_ticks(pid: u32) -> Option<u64> {
    stat(pid).map(|s| s.utime + s.stime)
}

/// Pids whose parent is `pid`.
pub fn children(pid: u32) -> Vec<u32> {
    child_stats(pid).map(|s| s.pid as u32).collect()
}

fn child_stats(pid: u32) -> impl Iterator<Item = Stat> {
    all_stats()
        .into_iter()
        .filter(move |s| u32::try_from(s.ppid) == Ok(pid))
}

/// `roots` and every live process below them, from one pass over `/proc`.
pub fn descendants(roots: &[u32]) -> Vec<u32> {
    let parents: Vec<(u32, u32)> = all_stats()
        .into_iter()
        .filter_map(|s| Some((u32::try_from(s.pid).ok()?, u32::try_from(s.ppid).ok()?)))
        .collect();
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
    child_stats(pid)
        .filter(|s| s.comm != SPAWNER_NAME)
        .map(|s| s.pid as u32)
        .collect()
}

/// The agent `pid`'s spawner, if it runs.
pub fn spawner(pid: u32) -> Option<u32> {
    child_stats(pid)
        .find(|s| s.comm == SPAWNER_NAME)
        .map(|s| s.pid as u32)
}

/// Parent pid of `pid`.
pub fn parent_of(pid: u32) -> Option<u32> {
    u32::try_from(stat(pid)?.ppid).ok()
}

/// Whether `pid` exists and is not a zombie.
pub fn alive(pid: u32) -> bool {
    stat(pid).is_some_and(|s| s.state != 'Z')
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

/// A scratch folder under the system temp dir, named `zerohop-TAG-XXXXXX` so a test's
/// leftovers say whose they are, removed on drop (`tempfile` makes the unique name and does
/// the removal).
pub struct TempDir(tempfile::TempDir);

impl TempDir {
    /// Creates a fresh folder; panics when the temp dir cannot be written.
    pub fn new(tag: &str) -> Self {
        let dir = tempfile::Builder::new()
            .prefix(&format!("zerohop-{tag}-"))
            .tempdir()
            .unwrap_or_else(|e| panic!("create a temp dir for {tag}: {e}"));
        Self(dir)
    }

    /// The folder.
    pub fn path(&self) -> &Path {
        self.0.path()
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
    /// Base URL of the gateway, from the ready line (`http://ADDR`, or `https://ADDR` for a
    /// chain with `tls`).
    pub url: String,
    /// The ready line as printed.
    pub ready_line: String,
    /// The lines of its standard error, for a chain started watched.
    output: Option<ChildLines>,
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
        Self::start_file_in(file, args, dir, None)
    }

    /// [`start_file`](Self::start_file) with `zerohop up` running in the folder `cwd` (for
    /// specs with paths relative to where they are run from, such as `env` values).
    pub fn start_file_in(file: &Path, args: &[&str], dir: TempDir, cwd: Option<&Path>) -> Self {
        Self::launch(file, args, dir, cwd, false)
    }

    /// [`start`](Self::start), and the test may wait for what the chain writes to standard
    /// error ([`wait_for_output`](Self::wait_for_output)): the agent's own messages and
    /// every instance's output, which `zerohop up` echoes as `[function/instance] text`.
    /// Every line is passed on to the test's standard error as well.
    pub fn start_watched(spec: &str, args: &[&str]) -> Self {
        let dir = TempDir::new("chain");
        let file = dir.path().join("chain.yaml");
        std::fs::write(&file, spec).expect("write spec");
        Self::launch(&file, args, dir, None, true)
    }

    /// [`start_file_in`](Self::start_file_in), watched as
    /// [`start_watched`](Self::start_watched) is.
    pub fn start_file_in_watched(
        file: &Path,
        args: &[&str],
        dir: TempDir,
        cwd: Option<&Path>,
    ) -> Self {
        Self::launch(file, args, dir, cwd, true)
    }

    fn launch(file: &Path, args: &[&str], dir: TempDir, cwd: Option<&Path>, watch: bool) -> Self {
        use std::io::BufRead;
        let mut cmd = Command::new(target_bin("zerohop"));
        if let Some(cwd) = cwd {
            cmd.current_dir(cwd);
        }
        cmd.arg("up")
            .arg(file)
            .args(["--listen", "127.0.0.1:0"])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped());
        if watch {
            cmd.stderr(Stdio::piped());
        }
        let mut guard = ChildGuard::new(cmd.spawn().expect("spawn zerohop"));
        let output = watch.then(|| ChildLines::of_stderr(&mut guard));
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
            .or_else(|| listener_in(&line, "https://").map(|a| format!("https://{a}")))
            .unwrap_or_else(|| panic!("no URL in ready line {line:?}"));
        Self {
            guard,
            url,
            ready_line: line,
            output,
            _dir: dir,
        }
    }

    /// Waits at most `guard` for a line of the chain's standard error that contains
    /// `marker` and returns it; lines before it are passed over, so each wait looks past
    /// the line the one before it found. Panics saying that `what` never happened when no
    /// such line comes (or the chain was not started watched).
    pub fn wait_for_output(&self, marker: &str, guard: Duration, what: &str) -> String {
        let lines = self.output.as_ref().unwrap_or_else(|| {
            panic!("waiting for {what}: the chain was not started watched (start_watched)")
        });
        let deadline = Instant::now() + guard;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match lines.rx.recv_timeout(left) {
                Ok(line) if line.contains(marker) => return line,
                Ok(_) => {}
                Err(e) => panic!(
                    "{what} never happened: the chain wrote no line with {marker:?} \
                     within {guard:?} ({e})"
                ),
            }
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
        self.guard.signal(Signal::SIGTERM);
        self.guard.wait_timeout(Duration::from_secs(30))
    }
}

/// The `-ldflags` argument for a `go build` of a program that links the C SDK's static
/// library `lib` (`target/c-sdk/lib/libzerohop.a`): Go's build cache does not look at the
/// contents of a library cgo links in, so without a stamp of it in the link flags a rebuilt
/// SDK leaves a stale program, speaking an older protocol, in the cache.
pub fn go_sdk_stamp(lib: &Path) -> String {
    let meta = std::fs::metadata(lib)
        .unwrap_or_else(|e| panic!("{}: {e} (`cargo xtask c-sdk` builds it)", lib.display()));
    let modified = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .unwrap_or_default();
    format!(
        "-ldflags=-X=main.zerohopSDK={}-{}",
        meta.len(),
        modified.as_nanos()
    )
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroUsize;

    use nix::sys::memfd::{memfd_create, MFdFlags};
    use nix::sys::mman::{mmap, munmap, MapFlags, ProtFlags};

    use super::*;

    #[test]
    fn a_mapped_memfd_is_seen_by_name_and_as_a_mapping() {
        let me = std::process::id();
        let (fds, maps) = (memfds(me).len(), memfd_mappings(me));
        let fd = memfd_create("zerohop-test-support", MFdFlags::MFD_CLOEXEC).unwrap();
        nix::unistd::ftruncate(&fd, 4096).unwrap();
        let len = NonZeroUsize::new(4096).unwrap();
        // SAFETY: a fresh shared mapping of our own memfd at an address the kernel picks;
        // nothing else refers to it and it is unmapped below.
        let at = unsafe {
            mmap(
                None,
                len,
                ProtFlags::PROT_READ,
                MapFlags::MAP_SHARED,
                &fd,
                0,
            )
        }
        .unwrap();
        assert!(
            memfds(me)
                .iter()
                .any(|n| n.starts_with("zerohop-test-support")),
            "{:?}",
            memfds(me)
        );
        assert_eq!(memfds(me).len(), fds + 1);
        assert_eq!(memfd_mappings(me), maps + 1);
        // SAFETY: `at` is the mapping made above, of `len` bytes, not used after this.
        unsafe { munmap(at, len.get()) }.unwrap();
        drop(fd);
        assert_eq!((memfds(me).len(), memfd_mappings(me)), (fds, maps));
        assert_eq!(memfds(u32::MAX), Vec::<String>::new());
    }

    #[test]
    fn a_child_is_found_below_us_and_killed_by_signal_pid() {
        let me = std::process::id();
        let mut child = ChildGuard::new(
            Command::new("sleep")
                .arg("30")
                .spawn()
                .expect("spawn sleep"),
        );
        let pid = child.pid();
        assert!(children(me).contains(&pid));
        assert!(descendants(&[me]).contains(&pid));
        assert_eq!(parent_of(pid), Some(me));
        assert!(alive(pid));
        assert!(
            open_fds(pid) >= 3,
            "stdin, stdout, stderr: {}",
            open_fds(pid)
        );
        assert_eq!(thread_stats(pid).len(), 1);
        assert!(cpu_ticks(pid).is_some());
        signal_pid(pid, Signal::SIGKILL);
        assert_eq!(child.wait_timeout(Duration::from_secs(10)), None, "killed");
        assert!(!alive(pid));
        assert_eq!(open_fds(pid), 0);
        // Reaped: the guard no longer names a pid to signal.
        child.signal(Signal::SIGKILL);
    }

    #[test]
    #[should_panic(expected = "not a single process")]
    fn pid_zero_is_never_signalled() {
        signal_pid(0, Signal::SIGCONT);
    }

    #[test]
    fn cpu_ticks_count_at_the_kernel_rate() {
        let hz = ticks_per_second();
        assert!((10.0..=10_000.0).contains(&hz), "{hz}");
        let me = std::process::id();
        // The scheduler's own count of this thread's time on a CPU, in nanoseconds: spin
        // until it says 0.3 s, however busy the machine is (bounded by a minute of waiting).
        let on_cpu = || -> u64 {
            std::fs::read_to_string("/proc/thread-self/schedstat")
                .ok()
                .and_then(|s| s.split_whitespace().next()?.parse().ok())
                .expect("schedstat")
        };
        let before = cpu_ticks(me).unwrap();
        let start = on_cpu();
        let t = Instant::now();
        let mut x = 0u64;
        while on_cpu() - start < 300_000_000 && t.elapsed() < Duration::from_secs(60) {
            for _ in 0..10_000 {
                x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
            }
        }
        let spun = (on_cpu() - start) as f64 / 1e9;
        let used = (cpu_ticks(me).unwrap() - before) as f64 / hz;
        assert!(
            spun >= 0.3 && (0.2..2.0).contains(&used),
            "{used} s of CPU counted for {spun} s spent spinning"
        );
        assert!(thread_stats(me).iter().any(|s| s.pid as u32 == me));
    }

    #[test]
    fn a_temp_dir_is_named_by_its_tag_and_removed_on_drop() {
        let dir = TempDir::new("support-test");
        let path = dir.path().to_owned();
        assert!(path.is_dir());
        let name = path.file_name().unwrap().to_str().unwrap();
        assert!(name.starts_with("zerohop-support-test-"), "{name}");
        std::fs::write(path.join("f"), "x").unwrap();
        drop(dir);
        assert!(!path.exists());
    }
}
