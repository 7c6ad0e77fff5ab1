//! A cgroup per instance, where the host lets us make one, and the function's resource
//! limits in it.
//!
//! Groups are only ever created beneath the cgroup the agent itself is in, in each
//! hierarchy (from `/proc/self/cgroup` and `/proc/self/mountinfo`, read with `procfs`):
//! `<own>/zerohop-<agent pid>-<chain>/<function>-<party>-<n>`. Only folders created here
//! are ever written to, removed, or have controllers enabled; no process is moved but the
//! instance, which joins its groups itself before `execve` (writing `0` to each
//! `cgroup.procs` the agent opened), so nothing it forks can start outside them, and its
//! limits are in force before its program runs.
//!
//! Two jobs, each detected once per chain at run time:
//!
//! * **Killing** an instance as a whole, through the chain's first group: cgroup v2 (the
//!   unified hierarchy, also the `unified` mount of a hybrid host) with `cgroup.kill`,
//!   atomic; else a v1 hierarchy (`pids`, else `freezer`, else `cpu`), by signalling
//!   everything in `cgroup.procs` until it is empty (bounded).
//! * **Limits and usage**, per controller (`cpu`, `memory`, `pids`, and `cpuacct` for CPU
//!   usage in v1): in the unified hierarchy when the controller is available there
//!   (listed in the chain group's `cgroup.controllers`, which this then enables in the
//!   chain group's own `cgroup.subtree_control`), else in the v1 hierarchy that has the
//!   controller mounted (`CgroupMode::Auto` only; `V2` and `V1` keep to their version). A
//!   hybrid host thus kills through v2 and limits through v1. What each limit writes is in
//!   [`limits`](super::limits).
//!
//! When nothing works (not root and nothing delegated), an instance without limits relies
//! on its process group alone (logged at debug level); an instance with limits is not
//! started, and the error names the limit, the controller, and why it is not available.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use procfs::process::MountInfo;
use procfs::ProcessCGroup;

use super::limits::{self, Controller, Source, Usage, Version};
use zerohop_spec::ResourceSpec;

/// Which cgroup version to use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CgroupMode {
    /// v2 where it works, else v1 (per controller for limits), else none.
    #[default]
    Auto,
    /// Only the unified hierarchy.
    V2,
    /// Only v1 hierarchies.
    V1,
    /// No cgroups: the process group alone (functions with `resources` cannot start).
    Off,
}

impl CgroupMode {
    fn v2(self) -> bool {
        matches!(self, CgroupMode::Auto | CgroupMode::V2)
    }

    fn v1(self) -> bool {
        matches!(self, CgroupMode::Auto | CgroupMode::V1)
    }
}

/// Why the chain's groups, or an instance's group with the limits it needs, could not be
/// made.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CgroupError {
    /// Cgroups are turned off ([`CgroupMode::Off`]).
    #[error("cgroups are off (CgroupMode::Off)")]
    Off,
    /// The agent's own place in the hierarchies could not be read.
    #[error("cannot read {file}: {source}")]
    Proc {
        /// The file under `/proc/self`.
        file: &'static str,
        /// What procfs said.
        source: procfs::ProcError,
    },
    /// No hierarchy lets the chain have a group: every way tried failed.
    #[error(transparent)]
    NoGroup(Tried),
    /// No hierarchy offers the controller a limit needs.
    #[error("{limit} needs the {controller} cgroup controller, which is not available: {reason}")]
    Unavailable {
        /// The limit, as the spec says it.
        limit: String,
        /// The controller's name.
        controller: &'static str,
        /// What was tried, and what failed (shared by every instance that needs it).
        #[source]
        reason: Arc<Tried>,
    },
    /// The chain has no cgroup at all.
    #[error("{limit} needs a cgroup, and the chain has none: {reason}")]
    NoCgroup {
        /// The limit, as the spec says it.
        limit: String,
        /// Why the chain has no cgroup (shared by every instance of the chain).
        #[source]
        reason: Arc<CgroupError>,
    },
    /// A group folder could not be created.
    #[error("cannot create the cgroup {}: {source}", dir.display())]
    Create {
        /// The folder.
        dir: PathBuf,
        /// OS error.
        source: std::io::Error,
    },
    /// A limit could not be written.
    #[error("{limit}: cannot write {value:?} to {}: {source}", file.display())]
    Write {
        /// The limit, as the spec says it.
        limit: String,
        /// The file.
        file: PathBuf,
        /// What was written.
        value: String,
        /// OS error.
        source: std::io::Error,
    },
    /// A group's `cgroup.procs` could not be opened.
    #[error("cannot open {}: {source}", file.display())]
    Open {
        /// The file.
        file: PathBuf,
        /// OS error.
        source: std::io::Error,
    },
}

/// One way of giving the chain (or one controller) a group that did not work. Several are
/// tried in turn, and what they said is one reason ([`Tried`]), so they are not
/// [`CgroupError`]s themselves (a list of them would then hold lists).
#[derive(Debug, thiserror::Error)]
pub(crate) enum Attempt {
    /// No cgroup2 mount shows the agent's own group.
    #[error("no cgroup2 mount shows the agent's group")]
    NoV2Mount,
    /// No v1 hierarchy shows the agent's own group.
    #[error("no cgroup v1 hierarchy shows the agent's group")]
    NoV1Mount,
    /// The chain's group (the one it is killed through) could not be created.
    #[error("{}: {source}", dir.display())]
    Mkdir {
        /// The folder.
        dir: PathBuf,
        /// What `mkdir` said.
        source: std::io::Error,
    },
    /// The kernel's cgroup v2 has no `cgroup.kill`.
    #[error("{}: no cgroup.kill (kernel < 5.14)", dir.display())]
    NoKill {
        /// The group created (and removed again).
        dir: PathBuf,
    },
    /// The agent's own group does not pass the controller down to the chain's.
    #[error(
        "cgroup v2: `{controller}` is not in {} ({}): the agent's own cgroup {} does not \
         pass it down (its cgroup.subtree_control lacks `{controller}`, and that group is not \
         the agent's to change): enable `{controller}` there, or start the agent in a group \
         that has it",
        listed.display(),
        offered(available),
        parent.display()
    )]
    NotPassedDown {
        /// The controller's name.
        controller: &'static str,
        /// The chain group's `cgroup.controllers`.
        listed: PathBuf,
        /// What it lists (empty: nothing, or it could not be read).
        available: String,
        /// The agent's own group.
        parent: PathBuf,
    },
    /// Enabling the controller for the chain's group failed.
    #[error(
        "cgroup v2: cannot enable `{controller}` by writing +{controller} to {}: {source}",
        file.display()
    )]
    Enable {
        /// The controller's name.
        controller: &'static str,
        /// The `cgroup.subtree_control` written.
        file: PathBuf,
        /// What the write said.
        source: std::io::Error,
    },
    /// `CgroupMode::V2`, and the chain has no v2 group.
    #[error("no cgroup v2 group")]
    NoV2Group,
    /// No v1 hierarchy with the controller shows the agent's group.
    #[error(
        "cgroup v1: no hierarchy with `{controller}` is mounted where the agent's group shows \
         (/proc/self/cgroup, /proc/self/mountinfo)"
    )]
    NoV1Controller {
        /// The controller's name.
        controller: &'static str,
    },
    /// The chain's group in the controller's v1 hierarchy could not be created.
    #[error("cgroup v1: cannot create {}: {source}", dir.display())]
    V1Mkdir {
        /// The folder.
        dir: PathBuf,
        /// What `mkdir` said.
        source: std::io::Error,
    },
    /// `CgroupMode::V2` keeps away from v1.
    #[error("v1 hierarchies are not used in CgroupMode::V2")]
    V1Unused,
}

/// What a `cgroup.controllers` that lacks the one wanted offers, for [`Attempt`].
fn offered(available: &str) -> String {
    match available.trim() {
        "" => "none".to_owned(),
        a => format!("only {a}"),
    }
}

/// Every way tried, in order, and why each failed (`; ` between them).
#[derive(Debug, Default)]
pub(crate) struct Tried(Vec<Attempt>);

impl std::fmt::Display for Tried {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, a) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{a}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Tried {}

/// Where the agent sits in each mounted hierarchy.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Layout {
    /// The agent's own group in the unified hierarchy.
    v2: Option<PathBuf>,
    /// Per v1 hierarchy with controllers: the controllers, and the agent's own group in it.
    v1: Vec<(Vec<String>, PathBuf)>,
}

impl Layout {
    /// The calling process's layout.
    fn read() -> Result<Layout, CgroupError> {
        let failed = |file| move |source| CgroupError::Proc { file, source };
        let me = procfs::process::Process::myself().map_err(failed("/proc/self"))?;
        let own = me.cgroups().map_err(failed("/proc/self/cgroup"))?;
        let mounts = me.mountinfo().map_err(failed("/proc/self/mountinfo"))?;
        Ok(Layout::of(&own.0, &mounts.0))
    }

    /// The layout of a process whose `/proc/PID/cgroup` says `own`, with `mounts` mounted.
    /// A hierarchy counts when a mount of it shows the process's group: the group's path
    /// starts with the mount's root (a mount of a subtree, as in a container, shows only
    /// what is beneath its root).
    fn of(own: &[ProcessCGroup], mounts: &[MountInfo]) -> Layout {
        let place = |path: &str, m: &MountInfo| -> Option<PathBuf> {
            let root = m.root.trim_end_matches('/');
            let rel = path.strip_prefix(root)?;
            if !rel.is_empty() && !rel.starts_with('/') {
                return None;
            }
            Some(m.mount_point.join(rel.trim_start_matches('/')))
        };
        let mut layout = Layout::default();
        for g in own {
            if g.hierarchy == 0 && g.controllers.is_empty() {
                layout.v2 = mounts
                    .iter()
                    .filter(|m| m.fs_type == "cgroup2")
                    .find_map(|m| place(&g.pathname, m));
                continue;
            }
            let Some(first) = g.controllers.iter().find(|c| !c.starts_with("name=")) else {
                // A named hierarchy (name=systemd) has no controller.
                continue;
            };
            let dir = mounts
                .iter()
                .filter(|m| m.fs_type == "cgroup" && m.super_options.contains_key(first))
                .find_map(|m| place(&g.pathname, m));
            if let Some(dir) = dir {
                layout.v1.push((g.controllers.clone(), dir));
            }
        }
        layout
    }

    /// The v1 hierarchy with `controller`: its controllers and the agent's group in it.
    /// Whether a group `name` exists beside the agent's own in any hierarchy.
    fn taken(&self, name: &str) -> bool {
        self.v2
            .iter()
            .chain(self.v1.iter().map(|(_, own)| own))
            .any(|own| own.join(name).exists())
    }

    fn v1_with(&self, controller: &str) -> Option<&(Vec<String>, PathBuf)> {
        self.v1
            .iter()
            .find(|(c, _)| c.iter().any(|c| c == controller))
    }
}

/// One of the chain's groups (one per hierarchy it uses).
#[derive(Debug)]
struct ChainGroup {
    version: Version,
    /// The controllers of its hierarchy (v1; empty for v2).
    controllers: Vec<String>,
    dir: PathBuf,
}

/// The chain's own groups; instance groups go beneath them. Removed on drop (after their
/// instances' groups).
#[derive(Debug)]
pub(crate) struct ChainCgroup {
    /// The first is the one instances are killed through.
    groups: Vec<ChainGroup>,
    /// Per [`Controller`] (by index): which of `groups` has it, or why none does.
    placement: [Result<usize, Arc<Tried>>; 4],
    next: AtomicU32,
}

/// One instance's group in one hierarchy.
#[derive(Debug)]
struct InstanceGroup {
    version: Version,
    dir: PathBuf,
}

/// One instance's groups (the first is the one it is killed through). Killed and removed on
/// drop.
#[derive(Debug)]
pub struct InstanceCgroup {
    groups: Vec<InstanceGroup>,
    /// `cgroup.procs` of each group.
    procs: Vec<File>,
    usage: UsageProbe,
}

/// Reads an instance's [`Usage`] from its groups; cheap to clone, and valid as long as the
/// instance's groups exist (afterwards every figure is `None`).
#[derive(Clone, Debug, Default)]
pub struct UsageProbe {
    files: Vec<(Source, PathBuf)>,
}

impl UsageProbe {
    /// The instance's usage now.
    pub fn read(&self) -> Usage {
        let get = |want: &[Source]| {
            self.files
                .iter()
                .filter(|(s, _)| want.contains(s))
                .find_map(|(s, f)| s.parse(&std::fs::read_to_string(f).ok()?))
        };
        Usage {
            cpu_ns: get(&[Source::V1CpuacctUsage, Source::V2CpuStat]),
            memory_bytes: get(&[Source::V1MemoryUsage, Source::V2MemoryCurrent]),
            nr_throttled: get(&[Source::CpuStatThrottled]),
        }
    }
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

/// Enables `c` for the children of `dir`, a group this agent created.
fn enable(dir: &Path, c: Controller) -> Result<(), Attempt> {
    let listed = dir.join("cgroup.controllers");
    let available = std::fs::read_to_string(&listed).unwrap_or_default();
    if !available.split_whitespace().any(|a| a == c.name()) {
        let parent = dir.parent().unwrap_or(dir).to_owned();
        return Err(Attempt::NotPassedDown {
            controller: c.name(),
            listed,
            available,
            parent,
        });
    }
    let file = dir.join("cgroup.subtree_control");
    std::fs::write(&file, format!("+{}", c.name())).map_err(|source| Attempt::Enable {
        controller: c.name(),
        file,
        source,
    })
}

impl ChainCgroup {
    /// Creates the chain's groups: the one instances are killed through in the first
    /// hierarchy that lets us, and one per controller where the host has it. `Err` says
    /// why there is none at all.
    pub fn create(chain: &str, mode: CgroupMode) -> Result<ChainCgroup, CgroupError> {
        if mode == CgroupMode::Off {
            return Err(CgroupError::Off);
        }
        let layout = Layout::read()?;
        let base = format!("zerohop-{}-{}", std::process::id(), sanitize(chain));
        // A chain replacing one of the same name runs beside it for a while: `BASE.2`...
        let name = (1..)
            .map(|n| match n {
                1 => base.clone(),
                n => format!("{base}.{n}"),
            })
            .find(|name| !layout.taken(name))
            .expect("some name is free");
        ChainCgroup::create_in(&layout, &name, mode)
    }

    fn create_in(
        layout: &Layout,
        name: &str,
        mode: CgroupMode,
    ) -> Result<ChainCgroup, CgroupError> {
        let mut tried = Vec::new();
        let mut groups = Vec::new();
        if mode.v2() {
            match &layout.v2 {
                None => tried.push(Attempt::NoV2Mount),
                Some(own) => {
                    let dir = own.join(name);
                    match std::fs::create_dir(&dir) {
                        Err(source) => tried.push(Attempt::Mkdir { dir, source }),
                        Ok(()) if !dir.join("cgroup.kill").exists() => {
                            let _ = std::fs::remove_dir(&dir);
                            tried.push(Attempt::NoKill { dir });
                        }
                        Ok(()) => groups.push(ChainGroup {
                            version: Version::V2,
                            controllers: Vec::new(),
                            dir,
                        }),
                    }
                }
            }
        }
        if groups.is_empty() && mode.v1() {
            for want in ["pids", "freezer", "cpu"] {
                let Some((controllers, own)) = layout.v1_with(want) else {
                    continue;
                };
                let dir = own.join(name);
                match std::fs::create_dir(&dir) {
                    Ok(()) => {
                        groups.push(ChainGroup {
                            version: Version::V1,
                            controllers: controllers.clone(),
                            dir,
                        });
                        break;
                    }
                    Err(source) => tried.push(Attempt::Mkdir { dir, source }),
                }
            }
            if groups.is_empty() && layout.v1.is_empty() {
                tried.push(Attempt::NoV1Mount);
            }
        }
        if groups.is_empty() {
            return Err(CgroupError::NoGroup(Tried(tried)));
        }
        let mut chain = ChainCgroup {
            groups,
            placement: Controller::ALL.map(|_| Err(Arc::default())),
            next: AtomicU32::new(0),
        };
        for c in Controller::ALL {
            let placed = chain.place(c, layout, name, mode);
            if let Err(why) = &placed {
                // Only an error for functions with that limit (then with this reason).
                tracing::debug!(
                    controller = c.name(),
                    "no cgroup for this controller: {why}"
                );
            }
            chain.placement[c.index()] = placed.map_err(Arc::new);
        }
        Ok(chain)
    }

    /// Finds (or makes) the group of controller `c`.
    fn place(
        &mut self,
        c: Controller,
        layout: &Layout,
        name: &str,
        mode: CgroupMode,
    ) -> Result<usize, Tried> {
        let mut why = Vec::new();
        if let Some(i) = self.groups.iter().position(|g| g.version == Version::V2) {
            if c == Controller::Cpuacct {
                // v2 has no cpuacct: every group's cpu.stat has the usage.
                return Ok(i);
            }
            match enable(&self.groups[i].dir, c) {
                Ok(()) => return Ok(i),
                Err(e) => why.push(e),
            }
        } else if mode == CgroupMode::V2 {
            why.push(Attempt::NoV2Group);
        }
        if mode.v1() {
            match layout.v1_with(c.name()) {
                None => why.push(Attempt::NoV1Controller {
                    controller: c.name(),
                }),
                Some((controllers, own)) => {
                    if let Some(i) = self
                        .groups
                        .iter()
                        .position(|g| g.version == Version::V1 && &g.controllers == controllers)
                    {
                        return Ok(i);
                    }
                    let dir = own.join(name);
                    match std::fs::create_dir(&dir) {
                        Ok(()) => {
                            self.groups.push(ChainGroup {
                                version: Version::V1,
                                controllers: controllers.clone(),
                                dir,
                            });
                            return Ok(self.groups.len() - 1);
                        }
                        Err(source) => why.push(Attempt::V1Mkdir { dir, source }),
                    }
                }
            }
        } else if mode == CgroupMode::V2 {
            why.push(Attempt::V1Unused);
        }
        Err(Tried(why))
    }

    /// The folder instances are killed through (for logs).
    pub fn dir(&self) -> &Path {
        &self.groups[0].dir
    }

    /// Every folder of the chain, one per hierarchy, the one instances are killed through
    /// first (for the reaper).
    pub fn dirs(&self) -> Vec<&Path> {
        self.groups.iter().map(|g| g.dir.as_path()).collect()
    }

    /// The version of that folder's hierarchy.
    pub fn version(&self) -> Version {
        self.groups[0].version
    }

    /// One line for the log: the group instances are killed through (`cgroup V2 DIR`), then
    /// where each limit goes.
    pub fn describe(&self) -> String {
        let limits: Vec<String> = [Controller::Cpu, Controller::Memory, Controller::Pids]
            .iter()
            .map(|c| match &self.placement[c.index()] {
                Ok(i) => format!(
                    "{} {:?} {}",
                    c.name(),
                    self.groups[*i].version,
                    self.groups[*i].dir.display()
                ),
                Err(_) => format!("{} unavailable", c.name()),
            })
            .collect();
        format!(
            "cgroup {:?} {}; limits: {}",
            self.version(),
            self.dir().display(),
            limits.join(", ")
        )
    }

    /// Creates the groups of one instance of `function` (party `party`) with `limits`
    /// written in them: the group it is killed through, the group of each limited
    /// controller, and where they work, those that measure its CPU and memory.
    pub fn instance(
        &self,
        function: &str,
        party: u16,
        limits: &ResourceSpec,
    ) -> Result<InstanceCgroup, CgroupError> {
        let needed = limits::needed(limits);
        let mut required = vec![0];
        for &c in &needed {
            match &self.placement[c.index()] {
                Ok(i) => required.push(*i),
                Err(reason) => {
                    return Err(CgroupError::Unavailable {
                        limit: limits::describe(limits, c),
                        controller: c.name(),
                        reason: reason.clone(),
                    })
                }
            }
        }
        let measuring = [Controller::Cpuacct, Controller::Memory]
            .iter()
            .filter_map(|c| self.placement[c.index()].as_ref().ok().copied());
        let mut joined: Vec<usize> = Vec::new();
        for i in required.iter().copied().chain(measuring) {
            if !joined.contains(&i) {
                joined.push(i);
            }
        }
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let name = format!("{}-{party}-{n}", sanitize(function));
        // Dropped on error: whatever was created is removed again.
        let mut inst = InstanceCgroup {
            groups: Vec::new(),
            procs: Vec::new(),
            usage: UsageProbe::default(),
        };
        for i in joined {
            let g = &self.groups[i];
            let must = required.contains(&i);
            let dir = g.dir.join(&name);
            if let Err(source) = std::fs::create_dir(&dir) {
                if must {
                    return Err(CgroupError::Create { dir, source });
                }
                tracing::debug!(dir = %dir.display(), "no usage group for this instance: {source}");
                continue;
            }
            inst.groups.push(InstanceGroup {
                version: g.version,
                dir: dir.clone(),
            });
            let here = |c: Controller| self.placement[c.index()].as_ref().ok() == Some(&i);
            for f in limits::files(g.version, limits) {
                if !here(f.controller) {
                    continue;
                }
                let file = dir.join(f.file);
                std::fs::write(&file, &f.value).map_err(|source| CgroupError::Write {
                    limit: f.limit,
                    file,
                    value: f.value,
                    source,
                })?;
            }
            let file = dir.join("cgroup.procs");
            match OpenOptions::new()
                .write(true)
                .custom_flags(libc::O_CLOEXEC)
                .open(&file)
            {
                Ok(procs) => inst.procs.push(procs),
                Err(source) if must => return Err(CgroupError::Open { file, source }),
                Err(e) => {
                    tracing::debug!(file = %file.display(), "no usage group for this instance: {e}");
                    continue;
                }
            }
            for c in Controller::ALL.into_iter().filter(|&c| here(c)) {
                if let Some(s) = limits::Source::of(c, g.version) {
                    inst.usage.files.push((s, dir.join(s.file())));
                }
            }
        }
        Ok(inst)
    }

    /// Kills everything left in the chain's groups (v2: one write for the whole tree).
    pub fn kill_all(&self) {
        match self.version() {
            Version::V2 => {
                let _ = std::fs::write(self.dir().join("cgroup.kill"), "1");
            }
            Version::V1 => {
                for dir in subdirs(self.dir()) {
                    kill_v1(&dir);
                }
            }
        }
    }
}

impl Drop for ChainCgroup {
    fn drop(&mut self) {
        self.kill_all();
        for g in &self.groups {
            for dir in subdirs(&g.dir) {
                remove(&dir);
            }
            remove(&g.dir);
        }
    }
}

/// The folders in `dir` (child groups).
fn subdirs(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.is_dir())
                .collect()
        })
        .unwrap_or_default()
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
    /// The `cgroup.procs` of each group; the child writes `0` into each before `execve`.
    pub fn procs_fds(&self) -> &[File] {
        &self.procs
    }

    /// A handle that reads the instance's resource usage, without holding its groups.
    pub fn usage_probe(&self) -> UsageProbe {
        self.usage.clone()
    }

    /// The group folders, the one it is killed through first.
    #[cfg(test)]
    pub fn dirs(&self) -> impl Iterator<Item = &Path> {
        self.groups.iter().map(|g| g.dir.as_path())
    }

    /// Kills every process in the group; true when it is empty afterwards.
    pub fn kill(&self) -> bool {
        let Some(g) = self.groups.first() else {
            return true;
        };
        match g.version {
            Version::V2 => {
                let _ = std::fs::write(g.dir.join("cgroup.kill"), "1");
                for _ in 0..200 {
                    if procs(&g.dir).is_empty() {
                        return true;
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
                false
            }
            Version::V1 => kill_v1(&g.dir),
        }
    }
}

impl Drop for InstanceCgroup {
    fn drop(&mut self) {
        self.kill();
        for g in self.groups.iter().rev() {
            remove(&g.dir);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Cursor;
    use std::process::{Child, Command};

    use procfs::process::MountInfos;
    use procfs::{FromBufRead, ProcessCGroups};

    use super::*;

    /// This machine's shape: v1 hierarchies (cpu and cpuacct apart, the agent in a memory
    /// group of its own), and cgroup2 at /sys/fs/cgroup/unified.
    const HYBRID_CGROUP: &str = "9:name=systemd:/\n8:pids:/\n4:memory:/process_api/abc\n\
                                 2:cpuacct:/\n1:cpu:/\n0::/\n";
    const HYBRID_MOUNTS: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    fn layout(cgroup: &str, mounts: &str) -> Layout {
        let own = ProcessCGroups::from_buf_read(Cursor::new(cgroup)).unwrap();
        let mounts = MountInfos::from_buf_read(Cursor::new(mounts)).unwrap();
        Layout::of(&own.0, &mounts.0)
    }

    #[test]
    fn hybrid_layout() {
        let l = layout(HYBRID_CGROUP, HYBRID_MOUNTS);
        assert_eq!(l.v2, Some(PathBuf::from("/sys/fs/cgroup/unified")));
        assert_eq!(
            l.v1_with("memory").map(|(_, d)| d.clone()),
            Some(PathBuf::from("/sys/fs/cgroup/memory/process_api/abc"))
        );
        assert_eq!(
            l.v1_with("cpu").map(|(_, d)| d.clone()),
            Some(PathBuf::from("/sys/fs/cgroup/cpu"))
        );
        assert!(l.v1_with("cpuacct").is_some());
        assert!(l.v1_with("freezer").is_none());
        assert!(
            l.v1_with("name=systemd").is_none(),
            "named hierarchies hold no controller"
        );
    }

    #[test]
    fn unified_layout_and_co_mounted_v1() {
        let l = layout(
            "0::/user.slice/agent.service\n",
            "24 1 0:22 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate\n",
        );
        assert_eq!(
            l.v2,
            Some(PathBuf::from("/sys/fs/cgroup/user.slice/agent.service"))
        );
        assert!(l.v1.is_empty());
        let l = layout(
            "3:cpu,cpuacct:/a\n",
            "32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n",
        );
        let (ctl, dir) = l.v1_with("cpuacct").unwrap();
        assert_eq!(ctl, &["cpu", "cpuacct"]);
        assert_eq!(dir, Path::new("/sys/fs/cgroup/cpu,cpuacct/a"));
    }

    #[test]
    fn a_mount_of_a_subtree_shows_only_what_is_beneath_its_root() {
        // In a container: the hierarchy's /docker/x mounted at /sys/fs/cgroup.
        let mounts = "41 31 0:38 /docker/x /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        let l = layout("0::/docker/x/sub\n", mounts);
        assert_eq!(l.v2, Some(PathBuf::from("/sys/fs/cgroup/sub")));
        let l = layout("0::/docker/xy\n", mounts);
        assert_eq!(
            l.v2, None,
            "a sibling with a common prefix is not beneath the root"
        );
        let l = layout("0::/elsewhere\n", mounts);
        assert_eq!(l.v2, None);
    }

    fn is_root() -> bool {
        nix::unistd::geteuid().is_root()
    }

    /// A chain's groups as this process would make them, or why not (printed: a host that
    /// has no cgroup for us is told apart from a bug by the assertions as root).
    fn chain(tag: &str, mode: CgroupMode) -> Option<ChainCgroup> {
        match ChainCgroup::create(&format!("unit-{tag}"), mode) {
            Ok(c) => Some(c),
            Err(e) => {
                assert!(!is_root(), "{mode:?}: as root a cgroup can be made: {e}");
                eprintln!("{mode:?}: no cgroup here ({e}); nothing to check");
                None
            }
        }
    }

    /// A shell spinning the CPU, moved into `g`'s groups by this test (which started it).
    fn spinner(g: &InstanceCgroup) -> Child {
        let child = Command::new("sh")
            .args(["-c", "while :; do :; done"])
            .spawn()
            .unwrap();
        for dir in g.dirs() {
            std::fs::write(dir.join("cgroup.procs"), child.id().to_string()).unwrap();
        }
        child
    }

    fn read(dir: &Path, file: &str) -> String {
        std::fs::read_to_string(dir.join(file))
            .unwrap_or_else(|e| panic!("{}/{file}: {e}", dir.display()))
            .trim()
            .to_owned()
    }

    /// Every mode this host has: limits land in the files `limits` names, usage reads
    /// back, and every folder goes with the chain. A mode the host refuses is skipped with
    /// its reason printed; as root at least one mode must have been checked.
    #[test]
    fn limits_are_written_and_usage_read_on_this_host() {
        let limits = ResourceSpec {
            cpu_millis: Some(100),
            memory: Some(64 << 20),
            pids: Some(8),
        };
        let mut checked = Vec::new();
        let mut skipped = Vec::new();
        for mode in [CgroupMode::Auto, CgroupMode::V1, CgroupMode::V2] {
            let Some(c) = chain(&format!("{mode:?}"), mode) else {
                skipped.push((mode, "no cgroup for this user (why: above)".to_owned()));
                continue;
            };
            let chain_dirs: Vec<PathBuf> = c.groups.iter().map(|g| g.dir.clone()).collect();
            let g = match c.instance("f", 1, &limits) {
                Ok(g) => g,
                Err(e) => {
                    // Only a host without the controllers may refuse, and it must say which.
                    let msg = e.to_string();
                    assert!(
                        matches!(e, CgroupError::Unavailable { .. }),
                        "{mode:?}: {msg}"
                    );
                    assert!(msg.starts_with("resources.cpu 100m needs the cpu"), "{msg}");
                    skipped.push((mode, msg));
                    continue;
                }
            };
            for c2 in [Controller::Cpu, Controller::Memory, Controller::Pids] {
                let i = *c.placement[c2.index()].as_ref().unwrap();
                let dir = c.groups[i].dir.join(g.groups[0].dir.file_name().unwrap());
                assert!(
                    g.dirs().any(|d| d == dir),
                    "{mode:?}: joins {}",
                    dir.display()
                );
                for f in limits::files(c.groups[i].version, &limits) {
                    if f.controller == c2 {
                        assert_eq!(read(&dir, f.file), f.value, "{mode:?}: {}", f.file);
                    }
                }
            }
            let mut child = spinner(&g);
            // Bounded: a 100m quota over a few periods throttles within a second.
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            let mut u = g.usage.read();
            while u.nr_throttled.unwrap_or(0) == 0 && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
                u = g.usage.read();
            }
            assert!(u.cpu_ns.unwrap_or(0) > 0, "{mode:?}: {u:?}");
            assert!(u.memory_bytes.is_some(), "{mode:?}: {u:?}");
            assert!(u.nr_throttled.unwrap_or(0) > 0, "{mode:?}: {u:?}");
            let probe = g.usage_probe();
            drop(g);
            let _ = child.wait();
            assert_eq!(probe.read(), Usage::default(), "the groups are gone");
            drop(c);
            for d in chain_dirs {
                assert!(!d.exists(), "{mode:?}: {} left behind", d.display());
            }
            checked.push(mode);
        }
        eprintln!("checked: {checked:?}");
        for (mode, why) in &skipped {
            eprintln!("skipped {mode:?}: {why}");
        }
        if is_root() {
            assert!(
                !checked.is_empty(),
                "as root no cgroup mode could be checked on this host: {skipped:?}"
            );
        }
    }

    #[test]
    fn without_limits_an_instance_is_still_grouped_and_measured() {
        let Some(c) = chain("nolimits", CgroupMode::Auto) else {
            return;
        };
        let g = c.instance("f", 1, &ResourceSpec::default()).unwrap();
        assert_eq!(g.procs_fds().len(), g.dirs().count());
        let mut child = spinner(&g);
        assert!(
            wait(|| g.usage.read().cpu_ns.unwrap_or(0) > 0),
            "{:?}",
            g.usage.read()
        );
        drop(g);
        let _ = child.wait();
    }

    fn wait(mut cond: impl FnMut() -> bool) -> bool {
        for _ in 0..200 {
            if cond() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        false
    }

    #[test]
    fn off_and_missing_controllers_say_why() {
        let e = ChainCgroup::create("x", CgroupMode::Off).unwrap_err();
        assert!(matches!(e, CgroupError::Off), "{e}");
        let e = e.to_string();
        assert!(e.contains("off"), "{e}");
        // No hierarchy at all.
        let e = ChainCgroup::create_in(&Layout::default(), "zerohop-none", CgroupMode::Auto)
            .unwrap_err();
        assert!(matches!(e, CgroupError::NoGroup(_)), "{e}");
        let e = e.to_string();
        assert!(e.contains("no cgroup2 mount"), "{e}");
        assert!(e.contains("no cgroup v1 hierarchy"), "{e}");
    }
}
