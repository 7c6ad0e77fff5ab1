//! The other process of a round trip: started by re-running this executable with
//! [`PEER_ENV`] set, guarded by a watchdog while it is timed, killed and reaped on every path.
//!
//! `PEER_ENV` is `"<parent pid> <pinning> <number of fds> <role> [role arguments]"`; the
//! descriptors come mapped to 3, 4, ... The peer dies with the thread that started it
//! (`PR_SET_PDEATHSIG`), and each echo loop gives up after [`PEER_IDLE`] without a message
//! where its wait can carry a timeout at no cost (cache line, futex, socket).

use std::os::fd::OwnedFd;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use command_fds::{CommandFdExt, FdMapping};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use zerohop_transport::Backend;

use super::{cacheline, eventfd, futex, hop, sys, unix_socket, Counts, Pinning};

/// Set in a peer process: what it echoes and how.
pub(super) const PEER_ENV: &str = "ZEROHOP_BENCH_FLOOR_PEER";
/// A peer silent this long (or gone) fails the measurement and is killed.
pub(super) const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);
/// A peer that hears nothing this long gives up by itself.
pub(super) const PEER_IDLE: Duration = Duration::from_secs(10);
/// How often the watchdog looks at progress and at the peer.
const WATCH_EVERY: Duration = Duration::from_millis(250);

/// What a peer echoes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Role {
    Cacheline,
    Futex,
    Eventfd,
    UnixSocket,
    Hop { backend: Backend, spin_us: u32 },
}

impl Role {
    fn encode(self) -> String {
        match self {
            Role::Cacheline => "cacheline".into(),
            Role::Futex => "futex".into(),
            Role::Eventfd => "eventfd".into(),
            Role::UnixSocket => "unix-socket".into(),
            Role::Hop { backend, spin_us } => format!("hop {backend} {spin_us}"),
        }
    }

    fn decode<'a>(mut words: impl Iterator<Item = &'a str>) -> Result<Self> {
        Ok(match words.next() {
            Some("cacheline") => Role::Cacheline,
            Some("futex") => Role::Futex,
            Some("eventfd") => Role::Eventfd,
            Some("unix-socket") => Role::UnixSocket,
            Some("hop") => Role::Hop {
                backend: words
                    .next()
                    .unwrap_or_default()
                    .parse()
                    .map_err(|e: String| anyhow!(e))?,
                spin_us: words.next().unwrap_or_default().parse()?,
            },
            other => bail!("unknown peer role {other:?}"),
        })
    }
}

/// In a peer process: runs the role named by [`PEER_ENV`] and returns the exit code; `None`
/// when this is not a peer. A second caller in the same process (another test thread) never
/// returns: the process exits when the first one is done.
pub(super) fn run_if_peer() -> Option<i32> {
    static STARTED: AtomicBool = AtomicBool::new(false);
    let spec = std::env::var(PEER_ENV).ok()?;
    if STARTED.swap(true, Ordering::SeqCst) {
        loop {
            std::thread::park();
        }
    }
    Some(match run(&spec) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("zerohop-bench floor peer ({spec}): {e:#}");
            2
        }
    })
}

fn run(spec: &str) -> Result<()> {
    let mut words = spec.split_whitespace();
    let parent: u32 = words.next().unwrap_or_default().parse()?;
    sys::die_with_parent(parent)?;
    let pinning = Pinning::decode(words.next().unwrap_or_default())?;
    let nfds: usize = words.next().unwrap_or_default().parse()?;
    let role = Role::decode(words)?;
    let fds = sys::take_inherited_fds(nfds)?;
    match role {
        Role::Cacheline => cacheline::echo(pinning, fds),
        Role::Futex => futex::echo(pinning, fds),
        Role::Eventfd => eventfd::echo(pinning, fds),
        Role::UnixSocket => unix_socket::echo(pinning, fds),
        Role::Hop { backend, spin_us } => hop::echo(pinning, fds, backend, spin_us),
    }
}

/// The one descriptor of `fds`.
pub(super) fn one_fd(fds: Vec<OwnedFd>) -> Result<OwnedFd> {
    let n = fds.len();
    let mut it = fds.into_iter();
    match (it.next(), it.next()) {
        (Some(fd), None) => Ok(fd),
        _ => bail!("expected 1 inherited descriptor, got {n}"),
    }
}

/// The two descriptors of `fds`.
pub(super) fn two_fds(fds: Vec<OwnedFd>) -> Result<(OwnedFd, OwnedFd)> {
    let n = fds.len();
    let mut it = fds.into_iter();
    match (it.next(), it.next(), it.next()) {
        (Some(a), Some(b), None) => Ok((a, b)),
        _ => bail!("expected 2 inherited descriptors, got {n}"),
    }
}

/// A running peer (parent side). Dropping it stops the watchdog, then kills and reaps the
/// peer.
pub(super) struct Peer {
    role: Role,
    child: Option<Child>,
    watchdog: Option<Watchdog>,
    alarm: Arc<Alarm>,
}

impl Peer {
    /// Starts the peer with `fds` mapped to 3, 4, ..., starts its watchdog (which on firing
    /// kills the peer, then calls `kick` to unblock a timed side waiting in the kernel), then
    /// pins the calling thread to the parent CPU.
    ///
    /// The peer inherits this thread's CPU mask, so call it while the thread may still run on
    /// both CPUs ([`Pinning::widen`]): a peer started on the parent's CPU would compete with a
    /// spinning parent until it pins itself.
    pub(super) fn spawn(
        role: Role,
        pinning: Pinning,
        fds: Vec<OwnedFd>,
        kick: impl Fn() + Send + 'static,
    ) -> Result<Self> {
        let exe = std::env::current_exe().context("finding this executable to run the peer")?;
        let spec = format!(
            "{} {} {} {}",
            std::process::id(),
            pinning.encode(),
            fds.len(),
            role.encode()
        );
        let mut cmd = Command::new(exe);
        cmd.env(PEER_ENV, spec)
            // When this is a test binary: one test at a time and output not captured, so its
            // first test dispatches the role (`maybe_run_echo_role`) and errors reach stderr.
            .env("RUST_TEST_THREADS", "1")
            .env("RUST_TEST_NOCAPTURE", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        let mappings = fds
            .into_iter()
            .zip(sys::FIRST_INHERITED_FD..)
            .map(|(parent_fd, child_fd)| FdMapping {
                parent_fd,
                child_fd,
            })
            .collect();
        cmd.fd_mappings(mappings)
            .map_err(|e| anyhow!("mapping the peer's descriptors: {e}"))?;
        let child = cmd
            .spawn()
            .with_context(|| format!("starting the {} peer", role.encode()))?;
        // Closes this process's copies of the peer's descriptors.
        drop(cmd);
        let alarm = Arc::new(Alarm::default());
        let mut peer = Peer {
            role,
            child: Some(child),
            watchdog: None,
            alarm: alarm.clone(),
        };
        // Started before pinning, so it may run on any CPU.
        peer.watchdog = Some(Watchdog::start(peer.pid(), alarm, Box::new(kick))?);
        pinning.pin_parent()?;
        Ok(peer)
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// Set once the watchdog fired; a timed side spinning in user space polls it.
    pub(super) fn fired(&self) -> Arc<Alarm> {
        self.alarm.clone()
    }

    /// Runs `counts.warmup + counts.samples` round trips, `pause` before each (not timed),
    /// and returns the timed ones in nanoseconds. `round_trip` fails when its wait was broken
    /// (the watchdog's kick, a hang-up, a wrong answer).
    pub(super) fn time(
        &mut self,
        counts: Counts,
        pause: Option<Duration>,
        mut round_trip: impl FnMut() -> Result<()>,
    ) -> Result<Vec<u64>> {
        let mut samples = Vec::with_capacity(counts.samples);
        for i in 0..counts.warmup + counts.samples {
            if let Some(p) = pause {
                std::thread::sleep(p);
            }
            let start = Instant::now();
            let done = round_trip();
            let ns = start.elapsed().as_nanos() as u64;
            if let Err(e) = done {
                return Err(self.failure(e));
            }
            if self.alarm.is_fired() {
                return Err(self.failure(anyhow!("interrupted")));
            }
            self.alarm.progress.store(i as u64 + 1, Ordering::Relaxed);
            if i >= counts.warmup {
                samples.push(ns);
            }
        }
        Ok(samples)
    }

    /// Builds the error of a failed round trip: the watchdog's reason when it fired, and how
    /// the peer ended (it is killed and reaped here).
    fn failure(&mut self, cause: anyhow::Error) -> anyhow::Error {
        self.stop_watchdog();
        let why = self
            .alarm
            .why
            .lock()
            .ok()
            .and_then(|w| w.clone())
            .unwrap_or_else(|| format!("{cause:#}"));
        let end = match self.child.take() {
            Some(mut c) => {
                let _ = c.kill();
                c.wait()
                    .map_or_else(|e| format!("wait failed: {e}"), |s| s.to_string())
            }
            None => "already reaped".into(),
        };
        anyhow!("{} peer: {why} (peer {end})", self.role.encode())
    }

    /// Tells the peer to quit with `quit` and waits (at most [`ANSWER_TIMEOUT`]) for a clean
    /// exit.
    pub(super) fn finish(mut self, quit: impl FnOnce()) -> Result<()> {
        // Stopped first: it must never signal a pid that was reaped (and maybe reused).
        self.stop_watchdog();
        quit();
        let deadline = Instant::now() + ANSWER_TIMEOUT;
        let role = self.role.encode();
        let Some(child) = self.child.as_mut() else {
            return Ok(());
        };
        loop {
            if let Some(status) = child.try_wait().context("waiting for the peer")? {
                self.child = None;
                if !status.success() {
                    bail!("{role} peer ended with {status} after being told to quit");
                }
                return Ok(());
            }
            if Instant::now() >= deadline {
                bail!("{role} peer did not quit within {ANSWER_TIMEOUT:?}");
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn stop_watchdog(&mut self) {
        if let Some(w) = self.watchdog.take() {
            w.stop();
        }
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        self.stop_watchdog();
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Shared between the timed thread and the watchdog.
#[derive(Default)]
pub(super) struct Alarm {
    /// Round trips done; the watchdog fires when it stops moving.
    progress: AtomicU64,
    fired: AtomicBool,
    why: Mutex<Option<String>>,
}

impl Alarm {
    /// Whether the watchdog fired (the peer is killed or being killed).
    pub(super) fn is_fired(&self) -> bool {
        // Acquire pairs with the Release store in `Watchdog::start`, so `why` is set.
        self.fired.load(Ordering::Acquire)
    }
}

/// Kills the peer when the timed side makes no progress for [`ANSWER_TIMEOUT`] or the peer
/// exits, then kicks the timed side out of its wait.
struct Watchdog {
    stop: mpsc::Sender<()>,
    thread: JoinHandle<()>,
}

impl Watchdog {
    fn start(pid: u32, alarm: Arc<Alarm>, kick: Box<dyn Fn() + Send>) -> Result<Self> {
        let (stop, stopped) = mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("zerohop-floors-watchdog".into())
            .spawn(move || {
                let mut seen = 0;
                let mut since = Instant::now();
                loop {
                    match stopped.recv_timeout(WATCH_EVERY) {
                        Err(RecvTimeoutError::Timeout) => {}
                        _ => return,
                    }
                    let now = alarm.progress.load(Ordering::Relaxed);
                    if now != seen {
                        seen = now;
                        since = Instant::now();
                    }
                    let why = if exited(pid) {
                        format!("exited after {seen} round trips")
                    } else if since.elapsed() >= ANSWER_TIMEOUT {
                        format!(
                            "did not answer within {} s (after {seen} round trips)",
                            ANSWER_TIMEOUT.as_secs()
                        )
                    } else {
                        continue;
                    };
                    if let Ok(mut w) = alarm.why.lock() {
                        *w = Some(why);
                    }
                    alarm.fired.store(true, Ordering::Release);
                    // The pid is still ours: the peer is reaped only after this thread is
                    // joined.
                    let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
                    kick();
                    return;
                }
            })
            .context("starting the watchdog thread")?;
        Ok(Self { stop, thread })
    }

    fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.thread.join();
    }
}

/// Whether `pid` is gone or a zombie (not reaped: its parent still holds it).
fn exited(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |s| {
        s.rfind(')')
            .and_then(|i| s.get(i + 2..))
            .and_then(|rest| rest.chars().next())
            .is_none_or(|state| state == 'Z' || state == 'X')
    })
}
