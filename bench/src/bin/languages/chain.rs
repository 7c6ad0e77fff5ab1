//! One language's chain: the real `zerohop up` in a process group of its own (pinned to a CPU
//! when asked), its instances, and its stop with everything it started.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::RecvTimeoutError;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, ensure, Context, Result};
use zerohop_bench::procstat::{pin_current_thread, ProcessId};
use zerohop_bench::systems::zerohop_functions;

use crate::prepare::tail;

/// Bound on the chain's start (Python and Node instances import their runtime first) and on
/// finding its instances.
pub(crate) const START_WAIT: Duration = Duration::from_secs(60);

/// `zerohop up` on one language's chain: stopped (SIGTERM, then SIGKILL; it stops every
/// instance) when dropped, also on errors.
pub(crate) struct Chain {
    pub(crate) child: Child,
    pub(crate) url: String,
    pub(crate) log: PathBuf,
}

impl Chain {
    /// Starts `zerohop up` on `spec`, on CPU `cpu` with all it starts when given.
    pub(crate) fn start(
        zerohop: &Path,
        spec: &Path,
        log: PathBuf,
        cpu: Option<usize>,
    ) -> Result<Self> {
        let mut cmd = Command::new(zerohop);
        cmd.arg("up")
            .arg(spec)
            .args(["--listen", "127.0.0.1:0"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log)?);
        // A child inherits the affinity of the thread that forks it: fork from a thread
        // pinned to `cpu` (this thread may be pinned elsewhere, for the load generator).
        let mut child = std::thread::scope(|s| {
            s.spawn(|| {
                if let Some(cpu) = cpu {
                    ensure!(pin_current_thread(cpu), "cannot pin a thread to CPU {cpu}");
                }
                cmd.spawn().context("starting zerohop up")
            })
            .join()
            .map_err(|_| anyhow!("the thread starting zerohop up panicked"))?
        })?;
        let stdout = child.stdout.take().context("stdout")?;
        let mut chain = Self {
            child,
            url: String::new(),
            log,
        };
        let line = match zerohop_bench::wait_line(stdout, "ready at ", START_WAIT) {
            Ok(line) => line,
            Err(RecvTimeoutError::Timeout) => bail!(
                "zerohop up was not ready within {START_WAIT:?}: {}",
                chain.log_tail()
            ),
            Err(RecvTimeoutError::Disconnected) => {
                bail!("zerohop up exited: {}", chain.log_tail())
            }
        };
        chain.url = zerohop_test_support::listener_in(&line, "http://")
            .map(|a| format!("http://{a}"))
            .ok_or_else(|| anyhow!("no URL in the ready line {line:?}"))?;
        Ok(chain)
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    pub(crate) fn log_tail(&self) -> String {
        tail(&std::fs::read_to_string(&self.log).unwrap_or_default(), 8)
    }

    /// The instances of `p1` .. `pK`, in that order (waits, bounded, until each has one).
    pub(crate) fn functions(&self, k: usize) -> Result<Vec<ProcessId>> {
        let deadline = Instant::now() + START_WAIT;
        loop {
            let found = zerohop_functions(self.pid());
            let pids: Vec<Option<ProcessId>> = (1..=k)
                .map(|i| {
                    let name = format!("p{i}");
                    found
                        .iter()
                        .find(|(n, _)| *n == name)
                        .and_then(|&(_, pid)| ProcessId::of(pid))
                })
                .collect();
            if pids.iter().all(Option::is_some) {
                return Ok(pids.into_iter().flatten().collect());
            }
            if Instant::now() >= deadline {
                bail!(
                    "found instances of only {:?} of p1..p{k} within {START_WAIT:?}: {}",
                    found.iter().map(|(n, _)| n).collect::<Vec<_>>(),
                    self.log_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Chain {
    fn drop(&mut self) {
        zerohop_bench::stop_child(&mut self.child, "zerohop-bench-languages: zerohop up");
    }
}
