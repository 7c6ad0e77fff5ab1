//! Why the chain's groups, or an instance's group with the limits it needs, could not be
//! made: [`CgroupError`], and the ways tried on the way ([`Attempt`], [`Tried`]).

use std::path::PathBuf;
use std::sync::Arc;

/// Why the chain's groups, or an instance's group with the limits it needs, could not be
/// made.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CgroupError {
    /// Cgroups are turned off ([`CgroupMode::Off`](super::CgroupMode::Off)).
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
pub(crate) struct Tried(pub(super) Vec<Attempt>);

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
