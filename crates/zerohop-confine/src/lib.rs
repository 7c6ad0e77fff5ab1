//! `zerohop-confine`: what makes an instance a jail. A chain is a security domain, enforced
//! by the agent when it starts an instance (the function itself is never trusted to do any
//! of it); this crate is how, and the agent (`zerohop-agent`) is its only user.
//!
//! Per chain (`Jail`): an identity (`identity`: a uid of its own when the agent is
//! root, a user namespace otherwise; as root, what the uid's last holder left in the host's
//! scratch folders and SysV IPC is removed first, `leftovers`), a cgroup folder where the host allows one
//! (`cgroup`), and a `reaper` that kills every instance's process group if the agent
//! dies, and a `spawner` that starts every instance as a child of the agent (forked before
//! the chain's shared memory exists, so starting an instance costs the same with a thousand
//! of them). Per function (`Program`): the program opened once by the agent (so the chain's
//! uid need not reach the folder it lives in) and its seccomp filter compiled once
//! (`seccomp`). Per instance, in the child between `fork` and `execve` (`sys`): join
//! its cgroup, an IPC namespace of its own, drop to the chain's ids (no supplementary
//! groups), arm the parent-death signal and check the agent is still there,
//! `no_new_privs`, not dumpable, a Landlock domain of its own where the kernel has scopes
//! (Linux 6.12: signals and abstract sockets reach only the instance and what it forks,
//! although every instance of the chain shares the uid), every
//! descriptor but 0-2 and the hand-over set close-on-exec, and the seccomp filter last. The
//! environment is rebuilt from an allow-list (`environment`), and the instance leads a
//! session and process group of its own, with no controlling terminal. Its standard input is `/dev/null`; its standard output and
//! error are pipes whose read ends the agent keeps (its `logs`).
//!
//! `unsafe` is denied everywhere except `sys`: the forks of the reaper and the spawner
//! processes, what a child runs between `fork` and `execve`, `close_range`, pidfds and
//! registering one with the async runtime. Needs Linux 5.3 for pidfds, 5.11 for
//! `close_range` (older kernels fall back to one `fcntl` per descriptor) and 5.14 for
//! `cgroup.kill` (else v1 or no cgroups); Landlock scopes (6.12) are used where present.

#![deny(unsafe_code)]
#![deny(missing_docs)]

pub(crate) mod cgroup;
pub mod data;
pub(crate) mod identity;
mod leftovers;
pub(crate) mod limits;
pub(crate) mod reaper;
pub mod seccomp;
mod spawner;
mod sys;

use std::ffi::OsString;
use std::fs::File;
use std::io::Read;
use std::os::fd::OwnedFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use cgroup::CgroupMode;
pub use cgroup::{InstanceCgroup, UsageProbe};
pub use data::DataError;
pub use identity::{no_userns_message, IdentityError, UidRange};
pub use limits::Usage;
pub use seccomp::SeccompError;

/// Puts the calling thread under `SCHED_BATCH`, as the agent does for every instance: a
/// woken task then does not preempt the running one, so processes sharing a core take
/// bursts of work per turn (see `docs/architecture.md`). `zerohop up` calls it for the
/// gateway's thread.
pub fn batch_scheduling() -> std::io::Result<()> {
    sys::sched_batch()
}

use self::cgroup::ChainCgroup;
use self::identity::Identity;
use self::limits::Version;
use self::reaper::Reaper;
use self::seccomp::Filters;
use self::spawner::{Request, Spawner};
use self::sys::ChildIds;
pub use spawner::Child;
pub use sys::async_fd;

/// Variables passed from the agent's environment when set (`LC_*` by prefix).
pub const ENV_ALLOWED: &[&str] = &[
    "PATH",
    "LANG",
    "LANGUAGE",
    "TZ",
    "RUST_LOG",
    "RUST_BACKTRACE",
];
/// `PATH` when the agent has none.
const DEFAULT_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// Why a chain's jail ([`Jail::new`]) or a function's program ([`Program::open`]) could not
/// be set up.
#[derive(Debug, thiserror::Error)]
pub enum ConfineError {
    /// No identity for the chain's instances (uid, or user namespace).
    #[error(transparent)]
    Identity(#[from] IdentityError),
    /// The chain's data folder could not be made ready.
    #[error(transparent)]
    Data(#[from] DataError),
    /// The agent could not be made non-dumpable (its instances keep its uid).
    #[error("cannot make the agent non-dumpable: {source}")]
    NotDumpable {
        /// The call that failed: `prctl(PR_SET_DUMPABLE)`.
        call: &'static str,
        /// What it said.
        source: nix::errno::Errno,
    },
    /// The chain's reaper or spawner process could not be started.
    #[error("cannot start the {process} process: {source}")]
    Helper {
        /// `reaper` or `spawner`.
        process: &'static str,
        /// What starting it said.
        source: std::io::Error,
    },
    /// The function's seccomp filter could not be built.
    #[error(transparent)]
    Seccomp(#[from] SeccompError),
    /// The function's program could not be opened.
    #[error("cannot open {}: {source}", path.display())]
    Open {
        /// The program.
        path: PathBuf,
        /// The call that failed: `open` (to read its first bytes) or `open(O_PATH)`.
        call: &'static str,
        /// What it said.
        source: std::io::Error,
    },
    /// The program is a `#!` script in a folder the chain's uid cannot search.
    #[error(
        "the chain's uid {uid} cannot reach the script {}: {} is not searchable by others \
         (o+x), and a `#!` script is reopened by name by its interpreter; move the script or \
         open up that folder",
        path.display(),
        blocked.display()
    )]
    ScriptUnreachable {
        /// The chain's uid.
        uid: u32,
        /// The script.
        path: PathBuf,
        /// The first folder on its path the uid cannot search.
        blocked: PathBuf,
    },
}

/// What confines every instance of one chain (its security domain): identity, cgroup folder,
/// reaper and spawner; lives as long as the chain.
#[derive(Debug)]
pub struct Jail {
    /// Shared with a chain replacing this one when the chain has a data folder (the folder
    /// belongs to one uid).
    identity: Arc<Identity>,
    /// The chain's data folder, if its spec asks for one.
    data: Option<Arc<data::DataDir>>,
    /// The chain's groups, or why it has none (told to each instance that needs limits).
    cgroup: Result<ChainCgroup, Arc<cgroup::CgroupError>>,
    reaper: Reaper,
    spawner: Spawner,
    agent_pid: i32,
    /// Whether each instance is alone with its signals (and what the log says about it).
    scope: String,
}

/// How [`describe`](Jail::describe) starts when instances are scoped.
const SCOPED: &str = "signals and abstract sockets scoped to each instance";

/// What the log says about signal scoping, given the kernel's Landlock ABI (or why there
/// is none). Without scopes the chain's instances, which share a uid, can signal each other.
fn signal_scope(abi: Result<i64, nix::errno::Errno>) -> String {
    let unscoped = "instances are not scoped: a function can signal every instance of its chain";
    match abi {
        Ok(abi) if abi >= sys::LANDLOCK_SCOPE_ABI => format!("{SCOPED} (Landlock ABI {abi})"),
        Ok(abi) => format!(
            "{unscoped} (Landlock ABI {abi}; scopes need ABI {}, Linux 6.12)",
            sys::LANDLOCK_SCOPE_ABI
        ),
        Err(nix::errno::Errno::EOPNOTSUPP) => format!(
            "{unscoped} (Landlock is off: add `landlock` to the kernel's `lsm=` boot parameter)"
        ),
        Err(e) => format!("{unscoped} (no Landlock: {e}; it needs Linux 6.12)"),
    }
}

impl Jail {
    /// Sets up the jail of chain `name`, with its data folder at `data` if it has one.
    /// `kept`: the data folder and identity of the chain this one replaces; kept when the
    /// folder stays the same (the new version's instances run under the same uid, which
    /// owns the folder).
    pub fn new(
        name: &str,
        uids: UidRange,
        cgroups: CgroupMode,
        data: Option<&Path>,
        kept: Option<KeptData>,
    ) -> Result<Jail, ConfineError> {
        let kept = kept.filter(|k| Some(k.dir.path()) == data);
        let fresh = kept.is_none();
        let identity = match &kept {
            Some(k) => k.identity.clone(),
            None => Arc::new(identity::acquire(uids)?),
        };
        let data = match (kept, data) {
            (Some(k), _) => Some(k.dir),
            (None, Some(path)) => {
                let owner = match &*identity {
                    Identity::Uid { uid, gid, .. } => Some((*uid, *gid)),
                    Identity::UserNs { .. } => None,
                };
                let dir = data::DataDir::open(name, path, owner)?;
                if let Some(blocked) = unreachable_by(dir.path(), &identity) {
                    return Err(DataError::Unreachable {
                        path: dir.path().to_owned(),
                        uid: identity.uid(),
                        blocked,
                    }
                    .into());
                }
                Some(Arc::new(dir))
            }
            (None, None) => None,
        };
        if let (true, Identity::Uid { uid, last_data, .. }) = (fresh, &*identity) {
            let places: Vec<&Path> = leftovers::PLACES.iter().map(Path::new).collect();
            let mine = data.as_deref().map(data::DataDir::path);
            let swept = leftovers::sweep(*uid, &places, mine, last_data.as_deref());
            if let Some(line) = swept.describe(*uid) {
                tracing::warn!(chain = name, "{line}");
            }
            if let Err(e) = identity.record_data(mine) {
                tracing::warn!(
                    chain = name,
                    "cannot name the data folder in the lock of uid {uid}: {e}; if this agent \
                     is killed, the next chain given the uid may enter the folder"
                );
            }
        }
        if let Identity::UserNs { .. } = *identity {
            // The instances keep the agent's uid outside their namespace: while the agent is
            // dumpable, any of them could open /proc/<agent>/mem and write into the agent
            // (which holds every pool and the gateway). Not dumpable, only root can.
            nix::sys::prctl::set_dumpable(false).map_err(|source| ConfineError::NotDumpable {
                call: "prctl(PR_SET_DUMPABLE)",
                source,
            })?;
        }
        let cgroup = ChainCgroup::create(name, cgroups).map_err(|why| {
            tracing::debug!("no cgroup for the instances ({why}); relying on process groups");
            Arc::new(why)
        });
        let helper = |process| move |source| ConfineError::Helper { process, source };
        let reaper = Reaper::start(
            &cgroup.as_ref().map(ChainCgroup::dirs).unwrap_or_default(),
            cgroup.as_ref().is_ok_and(|c| c.version() == Version::V2),
        )
        .map_err(helper("reaper"))?;
        let spawner = Spawner::start().map_err(helper("spawner"))?;
        let scope = signal_scope(sys::landlock_abi());
        if !scope.starts_with(SCOPED) {
            tracing::warn!(chain = name, "{scope}");
        }
        Ok(Jail {
            identity,
            data,
            cgroup,
            reaper,
            spawner,
            agent_pid: std::process::id() as i32,
            scope,
        })
    }

    /// The uid instances run as (seen from outside).
    pub fn uid(&self) -> u32 {
        self.identity.uid()
    }

    /// The chain's data folder, if it has one.
    pub fn data_dir(&self) -> Option<&Path> {
        self.data.as_deref().map(data::DataDir::path)
    }

    /// What a chain replacing this one keeps: the data folder and the uid that owns it.
    pub fn keep_data(&self) -> Option<KeptData> {
        self.data.as_ref().map(|dir| KeptData {
            identity: self.identity.clone(),
            dir: dir.clone(),
        })
    }

    /// One line for the log: who instances run as, and how they are grouped.
    pub fn describe(&self) -> String {
        let who = match &*self.identity {
            Identity::Uid { uid, gid, .. } => format!("uid {uid}, gid {gid}"),
            Identity::UserNs { .. } => format!("uid {} in a user namespace each", self.uid()),
        };
        let cg = match &self.cgroup {
            Ok(c) => c.describe(),
            Err(_) => "no cgroup (process groups only)".into(),
        };
        let ipc = match &*self.identity {
            Identity::Uid { .. } if !sys::ipc_namespaces() => {
                "the agent's IPC namespace (no CAP_SYS_ADMIN: POSIX message queues refused, \
                 the uid's SysV objects removed before its next chain)"
            }
            _ => "an IPC namespace each",
        };
        format!("instances run as {who}, {ipc}; {}; {cg}", self.scope)
    }

    /// The cgroups of one instance, with `limits` written in them. Without limits a cgroup
    /// is best effort (failures are logged at debug level; the process group still holds
    /// the instance together); with limits, no cgroup is an error that names the limit and
    /// why, and the instance must not start.
    pub fn instance_cgroup(
        &self,
        function: &str,
        party: u16,
        limits: &zerohop_spec::ResourceSpec,
    ) -> std::io::Result<Option<InstanceCgroup>> {
        let made = match &self.cgroup {
            Ok(c) => c.instance(function, party, limits),
            Err(why) => Err(cgroup::CgroupError::NoCgroup {
                limit: limits::needed(limits)
                    .first()
                    .map(|&c| limits::describe(limits, c))
                    .unwrap_or_default(),
                reason: why.clone(),
            }),
        };
        match made {
            Ok(g) => Ok(Some(g)),
            Err(e) if limits.any() => Err(std::io::Error::other(e.to_string())),
            Err(e) => {
                if self.cgroup.is_ok() {
                    tracing::debug!(function, party, "no cgroup for this instance: {e}");
                }
                Ok(None)
            }
        }
    }

    /// Records a started instance's process group with the reaper.
    pub fn started(&self, pgid: u32) {
        self.reaper.add(pgid);
    }

    /// The group is gone.
    pub fn gone(&self, pgid: u32) {
        self.reaper.remove(pgid);
    }
}

/// A chain's data folder and the identity that owns it, handed to the chain that replaces it
/// (see [`Jail::new`]).
#[derive(Debug, Clone)]
pub struct KeptData {
    identity: Arc<Identity>,
    dir: Arc<data::DataDir>,
}

/// A function's program, opened once, and its compiled filter.
#[derive(Debug)]
pub struct Program {
    /// The path as given (arg0, messages).
    pub path: PathBuf,
    /// `O_PATH` descriptor of the program file as opened (ELF only: a `#!` script's
    /// interpreter reopens the script by name).
    exec_fd: Option<OwnedFd>,
    /// Whether the chain's uid can reach the path. Reachable, the program is executed by
    /// path (the process then shows its own name in ps and top) as long as the path still
    /// names the file that was opened; otherwise (a folder the uid cannot search, or the
    /// file was replaced since, e.g. a rebuild after a live update this version was rolled
    /// back to) through `/proc/self/fd/N`, which runs exactly the opened file.
    reachable: bool,
    filters: Arc<Filters>,
}

impl Program {
    /// Opens `path` (as the agent) and compiles the filter widened by `syscalls`.
    pub fn open(path: &Path, syscalls: &[String], jail: &Jail) -> Result<Program, ConfineError> {
        let filters = seccomp::build(syscalls)?;
        let failed = |call| {
            move |source| ConfineError::Open {
                path: path.to_owned(),
                call,
                source,
            }
        };
        let mut head = [0u8; 2];
        let mut f = File::open(path).map_err(failed("open"))?;
        let script = f.read_exact(&mut head).is_ok() && head == *b"#!";
        let unreachable = unreachable_dir(path, jail);
        let exec_fd = match unreachable {
            None if script => None,
            Some(blocked) if script => {
                return Err(ConfineError::ScriptUnreachable {
                    uid: jail.uid(),
                    path: path.to_owned(),
                    blocked,
                });
            }
            _ => {
                let fd = std::fs::OpenOptions::new()
                    .read(true)
                    .custom_flags(libc::O_PATH | libc::O_CLOEXEC)
                    .open(path)
                    .map_err(failed("open(O_PATH)"))?;
                Some(OwnedFd::from(fd))
            }
        };
        Ok(Program {
            path: path.to_owned(),
            exec_fd,
            reachable: unreachable.is_none(),
            filters: Arc::new(filters),
        })
    }

    /// The opened file's descriptor, if it must be executed through it: the uid cannot reach
    /// the path, or the path no longer names the opened file.
    fn exec_through_fd(&self) -> Option<&OwnedFd> {
        let fd = self.exec_fd.as_ref()?;
        if !self.reachable {
            return Some(fd);
        }
        let same = match (nix::sys::stat::fstat(fd), std::fs::metadata(&self.path)) {
            // st_dev and st_ino are not u64 on every target.
            #[allow(clippy::unnecessary_cast)]
            (Ok(opened), Ok(now)) => {
                use std::os::unix::fs::MetadataExt;
                opened.st_dev as u64 == now.dev() && opened.st_ino as u64 == now.ino()
            }
            _ => false,
        };
        (!same).then_some(fd)
    }
}

/// The first ancestor folder of `path` that the chain's uid cannot search (only checked as
/// root: in a user namespace the instances keep the agent's uid).
fn unreachable_dir(path: &Path, jail: &Jail) -> Option<PathBuf> {
    unreachable_by(path, &jail.identity)
}

/// [`unreachable_dir`] for `identity`.
fn unreachable_by(path: &Path, identity: &Identity) -> Option<PathBuf> {
    let Identity::Uid { uid, gid, .. } = identity else {
        return None;
    };
    let abs = std::path::absolute(path).ok()?;
    abs.ancestors().skip(1).find_map(|dir| {
        let m = std::fs::metadata(dir).ok()?;
        let ok = if m.uid() == *uid {
            m.mode() & 0o100 != 0
        } else if m.gid() == *gid {
            m.mode() & 0o010 != 0
        } else {
            m.mode() & 0o001 != 0
        };
        (!ok).then(|| dir.to_owned())
    })
}

/// The environment an instance starts with: the allow-listed variables of the agent's
/// (`PATH`, `LANG`, `LANGUAGE`, `LC_*`, `TZ`, `RUST_LOG`, `RUST_BACKTRACE`), `HOME=/`, then
/// the spec's `env`, then `handover` (the `ZEROHOP_*` variables).
pub fn environment(
    spec_env: &[(String, String)],
    handover: &[(&str, String)],
) -> Vec<(OsString, OsString)> {
    let mut env: Vec<(OsString, OsString)> = std::env::vars_os()
        .filter(|(k, _)| {
            k.to_str()
                .is_some_and(|k| ENV_ALLOWED.contains(&k) || k.starts_with("LC_"))
        })
        .collect();
    if !env.iter().any(|(k, _)| k == "PATH") {
        env.push(("PATH".into(), DEFAULT_PATH.into()));
    }
    env.push(("HOME".into(), "/".into()));
    env.extend(spec_env.iter().map(|(k, v)| (k.into(), v.into())));
    env.extend(handover.iter().map(|(k, v)| ((*k).into(), v.into())));
    env
}

/// Starts one instance of `program` through the jail's spawner, confined: descriptors
/// `fds` at 3, 4, ..., then the program's own descriptor and each cgroup's `cgroup.procs`
/// above them (both closed at `execve`); `stdio` (write ends of the instance's output
/// pipes) at 1 and 2, or the agent's own standard output and error when `None`. Every
/// descriptor passed in is closed in the agent and in the spawner by the time this returns,
/// so the instance (and what it starts) holds the only write ends.
pub fn start(
    jail: &Jail,
    program: &Program,
    args: &[String],
    env: Vec<(OsString, OsString)>,
    fds: Vec<OwnedFd>,
    stdio: Option<[OwnedFd; 2]>,
    cgroup: Option<&InstanceCgroup>,
) -> std::io::Result<Child> {
    submit(jail, program, args, env, fds, stdio, cgroup)?.wait()
}

/// [`start`] without waiting for the instance's program to run: the request is on its way
/// to the spawner, which forks it while the caller prepares (and submits) the next ones;
/// [`Spawning::wait`] says how it went. Every descriptor passed in is closed in the agent
/// by the time this returns (in the spawner, once the child has its copies).
pub fn submit<'a>(
    jail: &'a Jail,
    program: &Program,
    args: &[String],
    env: Vec<(OsString, OsString)>,
    mut fds: Vec<OwnedFd>,
    stdio: Option<[OwnedFd; 2]>,
    cgroup: Option<&InstanceCgroup>,
) -> std::io::Result<Spawning<'a>> {
    let first = zerohop_spec::handover::FIRST_FD;
    let handed = fds.len() as i32;
    let mut next = first + handed;
    let exec_path = match program.exec_through_fd() {
        Some(fd) => {
            fds.push(fd.try_clone()?);
            next += 1;
            PathBuf::from(format!("/proc/self/fd/{}", next - 1))
        }
        None => program.path.clone(),
    };
    let mut cgroup_procs = Vec::new();
    for procs in cgroup.map_or(&[][..], InstanceCgroup::procs_fds) {
        fds.push(OwnedFd::from(procs.try_clone()?));
        cgroup_procs.push(next);
        next += 1;
    }
    let ids = match &*jail.identity {
        Identity::Uid { uid, gid, .. } => ChildIds::Uid {
            uid: *uid,
            gid: *gid,
            real_gid: identity::REAL_GID,
            ipc_ns: sys::ipc_namespaces(),
        },
        Identity::UserNs { uid_map, gid_map } => ChildIds::UserNs {
            uid_map: uid_map.clone(),
            gid_map: gid_map.clone(),
        },
    };
    let argv = std::iter::once(program.path.as_os_str())
        .chain(args.iter().map(std::ffi::OsStr::new))
        .collect();
    let pending = jail.spawner.submit(Request {
        program: &exec_path,
        argv,
        env: &env,
        fds,
        stdio,
        ids: &ids,
        cgroup_procs,
        agent_pid: jail.agent_pid,
        first_private_fd: (first + handed) as u32,
        filters: &program.filters,
    })?;
    Ok(Spawning(pending))
}

/// An instance [`submit`]ted to the jail's spawner, not yet known to run. Dropped without
/// [`wait`](Self::wait), it waits anyway and kills what started (nothing the agent does not
/// supervise keeps running).
#[derive(Debug)]
pub struct Spawning<'a>(spawner::Pending<'a>);

impl Spawning<'_> {
    /// Waits until the instance's program runs; a failed start's error names the step
    /// that failed after [`explain`].
    pub fn wait(self) -> std::io::Result<Child> {
        self.0.wait()
    }
}

/// Turns a spawn error into one that says which confinement step failed, when it was one.
pub fn explain(e: std::io::Error) -> std::io::Error {
    match e.raw_os_error().and_then(sys::decode) {
        Some((sys::Step::Unshare, what, os)) => std::io::Error::other(format!(
            "{what}: {os}; {}",
            no_userns_message("unshare(CLONE_NEWUSER) failed")
        )),
        Some((_, what, os)) => std::io::Error::new(os.kind(), format!("{what}: {os}")),
        None => e,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signal_scoping_is_reported_for_every_kernel() {
        assert!(signal_scope(Ok(7)).starts_with(SCOPED));
        assert!(signal_scope(Ok(6)).contains("ABI 6"));
        for (abi, why) in [
            (Ok(5), "ABI 5"),
            (Err(nix::errno::Errno::EOPNOTSUPP), "lsm="),
            (Err(nix::errno::Errno::ENOSYS), "Linux 6.12"),
        ] {
            let s = signal_scope(abi);
            assert!(!s.starts_with(SCOPED) && s.contains("not scoped"), "{s}");
            assert!(s.contains(why), "{s}");
        }
    }

    #[test]
    fn environment_is_the_allow_list_plus_spec_and_handover() {
        let env = environment(
            &[("MODE".into(), "x".into())],
            &[("ZEROHOP_PARTY", "1".into())],
        );
        let keys: Vec<String> = env
            .iter()
            .map(|(k, _)| k.to_string_lossy().into_owned())
            .collect();
        for k in &keys {
            assert!(
                ENV_ALLOWED.contains(&k.as_str())
                    || k.starts_with("LC_")
                    || ["HOME", "MODE", "ZEROHOP_PARTY"].contains(&k.as_str()),
                "{k} leaked"
            );
        }
        assert!(keys.contains(&"PATH".to_owned()));
        assert!(keys.contains(&"ZEROHOP_PARTY".to_owned()));
    }

    #[test]
    fn step_errors_decode() {
        let e = explain(std::io::Error::from_raw_os_error(
            sys::Step::Unshare as i32 * sys::STEP + libc::EPERM,
        ));
        let msg = e.to_string();
        assert!(msg.starts_with("unshare(CLONE_NEWUSER): "), "{msg}");
        assert!(msg.contains("not running as root"), "{msg}");
        let e = explain(std::io::Error::from_raw_os_error(
            sys::Step::Seccomp as i32 * sys::STEP + libc::EINVAL,
        ));
        assert!(e.to_string().starts_with("installing the seccomp filter"));
        assert_eq!(
            explain(std::io::Error::from_raw_os_error(libc::ENOENT)).kind(),
            std::io::ErrorKind::NotFound
        );
    }
}
