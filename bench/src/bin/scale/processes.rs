//! The processes of a running chain: `zerohop up` ([`Chain`]), stopped with everything it
//! started on drop, on an error, a panic, SIGINT or SIGTERM; every wait bounded.

use std::path::PathBuf;
use std::process::Child;
use std::sync::{mpsc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;
use zerohop_bench::procstat::{process_group, ProcessId as Proc};
use zerohop_test_support::{children, wait_until};

use crate::output::Stop;

/// How long instances and zerohop's process group get to follow zerohop out.
pub(crate) const ORPHAN_GRACE: Duration = Duration::from_secs(5);

/// SIGKILL to `p` if it is still that very process.
pub(crate) fn sigkill(p: Proc) {
    if p.alive() {
        let _ = kill(Pid::from_raw(p.pid as i32), Signal::SIGKILL);
    }
}

/// What the SIGINT/SIGTERM handler must clean up: the running zerohop (its pid leads its
/// process group) and its instances.
pub(crate) struct Live {
    pub(crate) zerohop: Proc,
    pub(crate) instances: Vec<Proc>,
}

pub(crate) static LIVE: Mutex<Option<Live>> = Mutex::new(None);

pub(crate) fn live() -> std::sync::MutexGuard<'static, Option<Live>> {
    LIVE.lock().unwrap_or_else(|p| p.into_inner())
}

/// Stops whatever is registered in [`LIVE`]: SIGTERM to zerohop, SIGKILL after `grace`,
/// then SIGKILL to every instance and member of its group that is left. Returns how many
/// had to be killed after zerohop was gone.
pub(crate) fn kill_registered(grace: Duration) -> usize {
    let Some(l) = live().take() else {
        return 0;
    };
    kill_chain(l.zerohop, &l.instances, grace)
}

pub(crate) fn kill_chain(zerohop: Proc, instances: &[Proc], grace: Duration) -> usize {
    // Its instances are its children until it is gone: keep collecting them while waiting
    // (it may still be starting some).
    let mut all: Vec<Proc> = instances.to_vec();
    let collect = |all: &mut Vec<Proc>| {
        for p in children(zerohop.pid).into_iter().filter_map(Proc::of) {
            if !all.contains(&p) {
                all.push(p);
            }
        }
    };
    if zerohop.alive() {
        collect(&mut all);
        let _ = kill(Pid::from_raw(zerohop.pid as i32), Signal::SIGTERM);
        let deadline = Instant::now() + grace;
        while zerohop.alive() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
            collect(&mut all);
        }
        if zerohop.alive() {
            collect(&mut all);
            sigkill(zerohop);
        }
    }
    // zerohop's reaper and the instances' parent-death signals end the rest; make sure.
    let group = || process_group(zerohop.pid);
    wait_until(ORPHAN_GRACE, || {
        !all.iter().any(|p| p.alive()) && group().is_empty()
    });
    let mut left = 0;
    for p in all.iter().copied().chain(group()) {
        if p.alive() {
            left += 1;
            sigkill(p);
        }
    }
    if left > 0 {
        let _ = killpg(Pid::from_raw(zerohop.pid as i32), Signal::SIGKILL);
    }
    left
}

/// On SIGINT or SIGTERM: stop the chain, then exit 130.
pub(crate) fn install_signal_handler() -> Result<()> {
    let (tx, rx) = mpsc::channel::<std::io::Result<()>>();
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            use tokio::signal::unix::{signal, SignalKind};
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = tx.send(Err(e));
                    return;
                }
            };
            rt.block_on(async move {
                let (mut int, mut term) = match (
                    signal(SignalKind::interrupt()),
                    signal(SignalKind::terminate()),
                ) {
                    (Ok(i), Ok(t)) => (i, t),
                    (Err(e), _) | (_, Err(e)) => {
                        let _ = tx.send(Err(e));
                        return;
                    }
                };
                let _ = tx.send(Ok(()));
                tokio::select! {
                    _ = int.recv() => {}
                    _ = term.recv() => {}
                }
                eprintln!("scale: interrupted; stopping the chain");
                kill_registered(Duration::from_secs(5));
                std::process::exit(130);
            });
        })
        .context("starting the signal thread")?;
    rx.recv()
        .context("signal thread ended")?
        .context("installing signal handlers")
}

/// A running `zerohop up`; stopped, with everything it started, on drop.
pub(crate) struct Chain {
    pub(crate) child: Child,
    pub(crate) me: Proc,
    pub(crate) instances: Vec<Proc>,
    pub(crate) log: PathBuf,
}

impl Chain {
    pub(crate) fn register(&self) {
        *live() = Some(Live {
            zerohop: self.me,
            instances: self.instances.clone(),
        });
    }

    /// SIGTERM, bounded wait for zerohop, then its instances and process group.
    pub(crate) fn stop(&mut self, timeout: Duration) -> Stop {
        let t = Instant::now();
        let _ = kill(Pid::from_raw(self.me.pid as i32), Signal::SIGTERM);
        let mut exit = None;
        wait_until(timeout, || {
            exit = self.child.try_wait().ok().flatten();
            exit.is_some()
        });
        let seconds = t.elapsed().as_secs_f64();
        let exit = match exit {
            Some(s) => s.to_string(),
            None => {
                let _ = self.child.kill();
                let _ = self.child.wait();
                format!("did not exit within {timeout:?} of SIGTERM; killed")
            }
        };
        let leftovers = kill_chain(self.me, &self.instances, ORPHAN_GRACE);
        *live() = None;
        Stop {
            seconds,
            exit,
            leftovers,
        }
    }

    /// The last lines of zerohop's stderr.
    pub(crate) fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let tail = lines[lines.len().saturating_sub(6)..].join("\n    ");
        if tail.is_empty() {
            String::new()
        } else {
            format!(
                "\n  zerohop's stderr ({}) ends:\n    {tail}",
                self.log.display()
            )
        }
    }
}

impl Drop for Chain {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            kill_chain(self.me, &self.instances, Duration::from_secs(10));
        } else {
            kill_chain(self.me, &self.instances, Duration::ZERO);
        }
        let _ = self.child.wait();
        *live() = None;
    }
}
