//! The chain's groups (one per hierarchy it uses, beside the agent's own group): making
//! them, placing each controller, making an instance's groups beneath them with its limits
//! written, and killing and removing what is left.

use std::fs::OpenOptions;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use zerohop_spec::ResourceSpec;

use super::error::{Attempt, CgroupError, Tried};
use super::folder::{remove, subdirs};
use super::instance::{InstanceCgroup, InstanceGroup, UsageProbe};
use super::layout::Layout;
use super::version::{enable, kill_v1, CgroupMode};
use crate::limits::{self, Controller, Version};

/// One of the chain's groups (one per hierarchy it uses).
#[derive(Debug)]
pub(super) struct ChainGroup {
    pub(super) version: Version,
    /// The controllers of its hierarchy (v1; empty for v2).
    controllers: Vec<String>,
    pub(super) dir: PathBuf,
}

/// The chain's own groups; instance groups go beneath them. Removed on drop (after their
/// instances' groups).
#[derive(Debug)]
pub(crate) struct ChainCgroup {
    /// The first is the one instances are killed through.
    pub(super) groups: Vec<ChainGroup>,
    /// Per [`Controller`] (by index): which of `groups` has it, or why none does.
    pub(super) placement: [Result<usize, Arc<Tried>>; 4],
    next: AtomicU32,
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

    pub(super) fn create_in(
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
