//! A cgroup per instance, where the host lets us make one.
//!
//! Groups are only ever created beneath the cgroup the agent itself is in (from
//! `/proc/self/cgroup`): `<own>/zerohop-<agent pid>-<chain>/<function>-<party>-<n>`. The
//! child joins its group before `execve` (writing `0` to a `cgroup.procs` the agent opened),
//! so nothing it forks can start outside it.
//!
//! * cgroup v2 (the unified hierarchy, also the `unified` mount of a hybrid host): killed
//!   with `cgroup.kill`, atomic, no process escapes.
//! * cgroup v1 (the `pids`, else `freezer`, else `cpu` hierarchy): killed by signalling
//!   everything in `cgroup.procs` until it is empty (bounded).
//!
//! Detected once per chain; when neither works (not root and nothing delegated) the agent
//! logs it at debug level and relies on the process group alone.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Which cgroup version to use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CgroupMode {
    /// v2 where it works, else v1, else none.
    #[default]
    Auto,
    /// Only the unified hierarchy.
    V2,
    /// Only a v1 hierarchy.
    V1,
    /// No cgroups: the process group alone.
    Off,
}

/// How a group is killed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Version {
    /// `cgroup.kill`.
    V2,
    /// Signal every pid in `cgroup.procs`.
    V1,
}

/// The chain's own group; instance groups go beneath it. Removed on drop (after its
/// instances' groups).
#[derive(Debug)]
pub(crate) struct ChainCgroup {
    dir: PathBuf,
    version: Version,
    next: std::sync::atomic::AtomicU32,
}

/// One instance's group. Killed and removed on drop.
#[derive(Debug)]
pub(crate) struct InstanceCgroup {
    dir: PathBuf,
    version: Version,
    procs: File,
}

/// `(hierarchy id, controllers, path)` lines of `/proc/self/cgroup`.
fn own_groups() -> Vec<(String, String, String)> {
    std::fs::read_to_string("/proc/self/cgroup")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let mut it = l.splitn(3, ':');
            Some((
                it.next()?.to_owned(),
                it.next()?.to_owned(),
                it.next()?.to_owned(),
            ))
        })
        .collect()
}

/// Mount points of cgroup file systems: `(fstype, super options, mount point)`.
fn mounts() -> Vec<(String, String, PathBuf)> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let (pre, post) = l.split_once(" - ")?;
            let mount_point = pre.split_whitespace().nth(4)?;
            let mut post = post.split_whitespace();
            let fstype = post.next()?;
            let _source = post.next()?;
            let opts = post.next().unwrap_or("");
            fstype.starts_with("cgroup").then(|| {
                (
                    fstype.to_owned(),
                    opts.to_owned(),
                    PathBuf::from(mount_point),
                )
            })
        })
        .collect()
}

/// Candidate parent folders, best first.
fn candidates(mode: CgroupMode) -> Vec<(PathBuf, Version)> {
    let groups = own_groups();
    let mounts = mounts();
    let mut out = Vec::new();
    let rel = |p: &str| p.trim_start_matches('/').to_owned();
    if matches!(mode, CgroupMode::Auto | CgroupMode::V2) {
        if let (Some((_, _, path)), Some((_, _, mp))) = (
            groups.iter().find(|(id, c, _)| id == "0" && c.is_empty()),
            mounts.iter().find(|(t, _, _)| t == "cgroup2"),
        ) {
            out.push((mp.join(rel(path)), Version::V2));
        }
    }
    if matches!(mode, CgroupMode::Auto | CgroupMode::V1) {
        for want in ["pids", "freezer", "cpu"] {
            let group = groups
                .iter()
                .find(|(id, c, _)| id != "0" && c.split(',').any(|c| c == want));
            let mount = mounts
                .iter()
                .find(|(t, o, _)| t == "cgroup" && o.split(',').any(|o| o == want));
            if let (Some((_, _, path)), Some((_, _, mp))) = (group, mount) {
                out.push((mp.join(rel(path)), Version::V1));
            }
        }
    }
    out
}

fn sanitize(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

impl ChainCgroup {
    /// Creates the chain's group in the first hierarchy that lets us; `None` (logged at
    /// debug level) when none does.
    pub fn create(chain: &str, mode: CgroupMode) -> Option<ChainCgroup> {
        if mode == CgroupMode::Off {
            return None;
        }
        let name = format!("zerohop-{}-{}", std::process::id(), sanitize(chain));
        let mut tried = Vec::new();
        for (parent, version) in candidates(mode) {
            let dir = parent.join(&name);
            match std::fs::create_dir(&dir) {
                Ok(()) => {}
                Err(e) => {
                    tried.push(format!("{}: {e}", dir.display()));
                    continue;
                }
            }
            if version == Version::V2 && !dir.join("cgroup.kill").exists() {
                tried.push(format!("{}: no cgroup.kill (kernel < 5.14)", dir.display()));
                let _ = std::fs::remove_dir(&dir);
                continue;
            }
            tracing::debug!(dir = %dir.display(), ?version, "instances get a cgroup each");
            return Some(ChainCgroup {
                dir,
                version,
                next: 0.into(),
            });
        }
        tracing::debug!(
            "no cgroup for the instances ({}); relying on process groups",
            if tried.is_empty() {
                "no usable hierarchy".to_owned()
            } else {
                tried.join("; ")
            }
        );
        None
    }

    /// The folder (for tests and logs).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Which version it lives in.
    pub fn version(&self) -> Version {
        self.version
    }

    /// Creates a group for one instance of `function` (party `party`).
    pub fn instance(&self, function: &str, party: u16) -> std::io::Result<InstanceCgroup> {
        let n = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = self.dir.join(format!("{}-{party}-{n}", sanitize(function)));
        std::fs::create_dir(&dir)?;
        let procs = OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(dir.join("cgroup.procs"));
        match procs {
            Ok(procs) => Ok(InstanceCgroup {
                dir,
                version: self.version,
                procs,
            }),
            Err(e) => {
                let _ = std::fs::remove_dir(&dir);
                Err(e)
            }
        }
    }

    /// Kills everything left in the chain's groups (v2: one write for the whole tree).
    pub fn kill_all(&self) {
        match self.version {
            Version::V2 => {
                let _ = std::fs::write(self.dir.join("cgroup.kill"), "1");
            }
            Version::V1 => {
                if let Ok(entries) = std::fs::read_dir(&self.dir) {
                    for e in entries.flatten() {
                        if e.path().is_dir() {
                            kill_v1(&e.path());
                        }
                    }
                }
            }
        }
    }
}

impl Drop for ChainCgroup {
    fn drop(&mut self) {
        self.kill_all();
        if let Ok(entries) = std::fs::read_dir(&self.dir) {
            for e in entries.flatten() {
                if e.path().is_dir() {
                    remove(&e.path());
                }
            }
        }
        remove(&self.dir);
    }
}

/// Pids in a group's `cgroup.procs`.
fn procs(dir: &Path) -> Vec<i32> {
    std::fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// v1 has no `cgroup.kill`: SIGKILL every member until none is left (a member may fork
/// between the read and the kill, hence the loop), at most ~2 s.
fn kill_v1(dir: &Path) -> bool {
    for _ in 0..200 {
        let pids = procs(dir);
        if pids.is_empty() {
            return true;
        }
        for p in pids {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(p),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

/// Removes a group folder once its last member is gone (an exiting process lingers a
/// moment), at most ~1 s.
fn remove(dir: &Path) {
    for _ in 0..100 {
        match std::fs::remove_dir(dir) {
            Ok(()) => return,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
    tracing::debug!(dir = %dir.display(), "cgroup not removed: still busy");
}

impl InstanceCgroup {
    /// The `cgroup.procs` the child writes `0` into before `execve`.
    pub fn procs_fd(&self) -> &File {
        &self.procs
    }

    /// Kills every process in the group; true when it is empty afterwards.
    pub fn kill(&self) -> bool {
        match self.version {
            Version::V2 => {
                let _ = std::fs::write(self.dir.join("cgroup.kill"), "1");
                for _ in 0..200 {
                    if procs(&self.dir).is_empty() {
                        return true;
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
                false
            }
            Version::V1 => kill_v1(&self.dir),
        }
    }
}

impl Drop for InstanceCgroup {
    fn drop(&mut self) {
        self.kill();
        remove(&self.dir);
    }
}
