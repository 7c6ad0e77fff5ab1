//! Discovering the hierarchies: where the agent sits in each mounted one, from
//! `/proc/self/cgroup` and `/proc/self/mountinfo` (read with `procfs`).

use std::path::PathBuf;

use procfs::process::MountInfo;
use procfs::ProcessCGroup;

use super::error::CgroupError;

/// Where the agent sits in each mounted hierarchy.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Layout {
    /// The agent's own group in the unified hierarchy.
    pub(super) v2: Option<PathBuf>,
    /// Per v1 hierarchy with controllers: the controllers, and the agent's own group in it.
    pub(super) v1: Vec<(Vec<String>, PathBuf)>,
}

impl Layout {
    /// The calling process's layout.
    pub(super) fn read() -> Result<Layout, CgroupError> {
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
    pub(super) fn of(own: &[ProcessCGroup], mounts: &[MountInfo]) -> Layout {
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

    /// Whether a group `name` exists beside the agent's own in any hierarchy.
    pub(super) fn taken(&self, name: &str) -> bool {
        self.v2
            .iter()
            .chain(self.v1.iter().map(|(_, own)| own))
            .any(|own| own.join(name).exists())
    }

    /// The v1 hierarchy with `controller`: its controllers and the agent's group in it.
    pub(super) fn v1_with(&self, controller: &str) -> Option<&(Vec<String>, PathBuf)> {
        self.v1
            .iter()
            .find(|(c, _)| c.iter().any(|c| c == controller))
    }
}
