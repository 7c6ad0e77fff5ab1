//! The reaper: kills every instance's process group when the agent dies without shutting
//! down (SIGKILL, OOM kill, a crash).
//!
//! An instance dies with the agent through its parent-death signal, but that signal is not
//! inherited by what the instance forks, so a grandchild would outlive the agent. The reaper
//! is a small process detached from the agent (forked twice, so no test or supervisor sees
//! it as a child) that holds the read end of a pipe; the agent writes each instance's
//! process group into it as it starts, and its removal once it is gone. When the agent goes
//! away, however it goes, the kernel closes the write end, the reaper reads end of file,
//! SIGKILLs every group still listed (seccomp keeps instances from leaving their group),
//! kills the chain's v2 cgroup if there is one, removes the chain's cgroup folders (one per
//! hierarchy: the one instances are killed through and those of their limits), and exits. It blocks in `read` all along:
//! no CPU while the chain runs.

use std::fs::OpenOptions;
use std::io::Write;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::Mutex;

use nix::fcntl::OFlag;

/// The agent's end of the reaper's pipe. Dropping it lets the reaper kill what is left and
/// exit.
#[derive(Debug)]
pub(crate) struct Reaper {
    tx: Mutex<std::fs::File>,
}

impl Reaper {
    /// Starts a reaper for a chain with cgroup folders `dirs` (the first is the one its
    /// instances are killed through, with a v2 `cgroup.kill` in it when `v2`), if any.
    pub fn start(dirs: &[&Path], v2: bool) -> std::io::Result<Reaper> {
        let (rx, tx) = nix::unistd::pipe2(OFlag::O_CLOEXEC)?;
        let open_dir = |p: &Path| {
            OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
                .open(p)
                .ok()
                .map(OwnedFd::from)
        };
        let group = |dir: &Path| {
            Some(super::sys::ReaperGroup {
                dir: open_dir(dir)?,
                parent: open_dir(dir.parent()?)?,
                name: std::ffi::CString::new(dir.file_name()?.as_bytes()).ok()?,
            })
        };
        let kill = dirs
            .first()
            .filter(|_| v2)
            .and_then(|dir| {
                OpenOptions::new()
                    .write(true)
                    .custom_flags(libc::O_CLOEXEC)
                    .open(dir.join("cgroup.kill"))
                    .ok()
            })
            .map(OwnedFd::from);
        let groups: Vec<_> = dirs.iter().filter_map(|d| group(d)).collect();
        let cgroup = (!groups.is_empty()).then_some(super::sys::ReaperCgroup { kill, groups });
        super::sys::spawn_reaper(rx, cgroup)?;
        Ok(Reaper {
            tx: Mutex::new(std::fs::File::from(tx)),
        })
    }

    fn send(&self, v: i32) {
        // Four bytes are below PIPE_BUF: every write is atomic. The pipe holds 16 Ki of
        // them; the reaper drains it as they come.
        let mut tx = self.tx.lock().unwrap_or_else(|p| p.into_inner());
        if let Err(e) = tx.write_all(&v.to_ne_bytes()) {
            tracing::warn!("reaper unreachable ({e}); instances may outlive a killed agent");
        }
    }

    /// An instance's process group started.
    pub fn add(&self, pgid: u32) {
        self.send(pgid as i32);
    }

    /// That group is gone (killed and reaped).
    pub fn remove(&self, pgid: u32) {
        self.send(-(pgid as i32));
    }
}
