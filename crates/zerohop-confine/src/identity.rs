//! Who a chain's instances run as.
//!
//! * The agent is root: the chain gets a uid (and a gid of the same number) of its own from
//!   a range ([`UidRange`], default 100000..=165535). Agents on one host share the range;
//!   a uid belongs to the agent holding an exclusive `flock` on
//!   `/run/zerohop/uids/<uid>.lock` (0600), released when the agent exits, however it
//!   exits. The first uid whose lock is free is taken.
//! * Not root: every instance starts in a user namespace of its own that maps only the
//!   agent's uid and gid (setgroups denied), so it holds no capability outside it.
//! * Neither possible: `zerohop up` fails with one line saying what is missing.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};

/// Where the per-uid lock files live (root only).
pub const LOCK_DIR: &str = "/run/zerohop/uids";

/// The real gid instances run with as root: "nogroup". It differs from their effective gid
/// (the chain's), which is what keeps the kernel from making them dumpable again at
/// `execve` (an exec with real != effective ids is treated like a set-id program), so
/// `/proc/PID/{mem,fd,environ}` stay closed to other processes of the same uid.
pub const REAL_GID: u32 = 65534;

/// A range of uids chains may run under, inclusive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UidRange {
    /// First uid.
    pub start: u32,
    /// Last uid.
    pub end: u32,
}

impl Default for UidRange {
    fn default() -> Self {
        Self {
            start: 100_000,
            end: 165_535,
        }
    }
}

impl std::str::FromStr for UidRange {
    type Err = IdentityError;

    /// `START-END`, e.g. `100000-165535`.
    fn from_str(s: &str) -> Result<Self, IdentityError> {
        let bad = || IdentityError::NotARange { text: s.to_owned() };
        let (a, b) = s.split_once('-').ok_or_else(bad)?;
        let start: u32 = a.trim().parse().map_err(|_| bad())?;
        let end: u32 = b.trim().parse().map_err(|_| bad())?;
        if start == 0 || start > end || end >= u32::MAX - 1 {
            return Err(IdentityError::BadRange { text: s.to_owned() });
        }
        Ok(Self { start, end })
    }
}

/// Why no identity could be set up, or a uid range given for one is no range.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    /// `--uid-range` is not `START-END`.
    #[error("`{text}` is not a uid range; write START-END, e.g. 100000-165535")]
    NotARange {
        /// What was given.
        text: String,
    },
    /// `--uid-range` is empty, or holds root or the largest uid.
    #[error("`{text}`: the range must be non-empty and exclude 0 (root) and 4294967295")]
    BadRange {
        /// What was given.
        text: String,
    },
    /// Every uid of the range is taken by another agent.
    #[error(
        "cannot isolate the chain: every uid in {start}-{end} is taken by another zerohop agent \
         (locks in {LOCK_DIR}); give this one another range with --uid-range START-END"
    )]
    RangeExhausted {
        /// First uid.
        start: u32,
        /// Last uid.
        end: u32,
    },
    /// The lock folder or a lock file could not be used.
    #[error("cannot isolate the chain: {what} {path}: {source}")]
    Lock {
        /// What failed.
        what: &'static str,
        /// Which file.
        path: PathBuf,
        /// OS error.
        source: std::io::Error,
    },
    /// Not root, and user namespaces are unavailable.
    #[error("{}", no_userns_message(.0))]
    NoUserNamespaces(String),
}

/// The one line `zerohop up` prints when it can neither change uids nor use user
/// namespaces; `why` says what was found.
pub fn no_userns_message(why: &str) -> String {
    format!(
        "cannot isolate the chain's functions: not running as root and user namespaces are \
         unavailable ({why}); run `zerohop up` as root (each chain then gets a uid of its own) \
         or enable unprivileged user namespaces (sysctl user.max_user_namespaces=15000)"
    )
}

/// The identity of a chain's instances.
#[derive(Debug)]
pub(crate) enum Identity {
    /// Root: this uid and gid; the lock is held for as long as the chain runs.
    Uid {
        uid: u32,
        gid: u32,
        /// Holds the data folder of the chain running under the uid (one path, or
        /// nothing), so that the next holder can give it to root if this one could not.
        lock: Flock<File>,
        /// What the last holder's lock file named.
        last_data: Option<PathBuf>,
    },
    /// Not root: a user namespace per instance; the maps written into it.
    UserNs { uid_map: Vec<u8>, gid_map: Vec<u8> },
}

impl Identity {
    /// The uid the instances run as, seen from outside.
    pub fn uid(&self) -> u32 {
        match self {
            Identity::Uid { uid, .. } => *uid,
            Identity::UserNs { .. } => nix::unistd::geteuid().as_raw(),
        }
    }
}

impl Identity {
    /// Names `data` (the chain's data folder, or none) in the uid's lock file.
    pub fn record_data(&self, data: Option<&Path>) -> std::io::Result<()> {
        use std::os::unix::ffi::OsStrExt;
        use std::os::unix::fs::FileExt;
        let Identity::Uid { lock, .. } = self else {
            return Ok(());
        };
        let bytes = data.map_or(&[][..], |d| d.as_os_str().as_bytes());
        lock.set_len(0)?;
        lock.write_all_at(bytes, 0)
    }
}

/// Picks the identity for one chain.
pub(crate) fn acquire(range: UidRange) -> Result<Identity, IdentityError> {
    if nix::unistd::geteuid().is_root() {
        return lock_uid(range, Path::new(LOCK_DIR));
    }
    // std::fs, not procfs: procfs has no reader for these two sysctls (its value readers
    // are private), and each is one number in a file that may not exist.
    let max = std::fs::read_to_string("/proc/sys/user/max_user_namespaces")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok());
    if max == Some(0) {
        return Err(IdentityError::NoUserNamespaces(
            "/proc/sys/user/max_user_namespaces is 0".into(),
        ));
    }
    if std::fs::read_to_string("/proc/sys/kernel/unprivileged_userns_clone")
        .is_ok_and(|s| s.trim() == "0")
    {
        return Err(IdentityError::NoUserNamespaces(
            "/proc/sys/kernel/unprivileged_userns_clone is 0".into(),
        ));
    }
    let uid = nix::unistd::geteuid().as_raw();
    let gid = nix::unistd::getegid().as_raw();
    Ok(Identity::UserNs {
        uid_map: format!("{uid} {uid} 1\n").into_bytes(),
        gid_map: format!("{gid} {gid} 1\n").into_bytes(),
    })
}

/// Takes the first uid of `range` whose lock file in `dir` nobody holds.
pub(crate) fn lock_uid(range: UidRange, dir: &Path) -> Result<Identity, IdentityError> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|source| IdentityError::Lock {
            what: "creating",
            path: dir.to_owned(),
            source,
        })?;
    // Whoever could write this folder could swap a lock file for one of their own and take
    // a uid another agent holds: it must be a real folder of this user that no one else
    // may write (it is made 0700; one made by someone else, or opened up, is refused).
    let meta = std::fs::symlink_metadata(dir).map_err(|source| IdentityError::Lock {
        what: "checking",
        path: dir.to_owned(),
        source,
    })?;
    {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let euid = nix::unistd::geteuid().as_raw();
        if !meta.is_dir() || meta.uid() != euid || meta.permissions().mode() & 0o022 != 0 {
            return Err(IdentityError::Lock {
                what: "refusing the lock folder",
                path: dir.to_owned(),
                source: std::io::Error::other(format!(
                    "it must be a folder of uid {euid} that no one else may write, and it is {} \
                     of uid {} with mode {:o}; remove it (it is made again, mode 0700)",
                    if meta.file_type().is_symlink() {
                        "a symbolic link"
                    } else if meta.is_dir() {
                        "a folder"
                    } else {
                        "a file"
                    },
                    meta.uid(),
                    meta.permissions().mode() & 0o7777
                )),
            });
        }
    }
    for uid in range.start..=range.end {
        let path = dir.join(format!("{uid}.lock"));
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
            .open(&path)
            .map_err(|source| IdentityError::Lock {
                what: "opening",
                path: path.clone(),
                source,
            })?;
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(mut lock) => {
                let mut last = Vec::new();
                let _ = std::io::Read::read_to_end(&mut *lock, &mut last);
                let last_data = std::str::from_utf8(&last)
                    .ok()
                    .map(str::trim)
                    .filter(|p| p.starts_with('/'))
                    .map(PathBuf::from);
                return Ok(Identity::Uid {
                    uid,
                    gid: uid,
                    lock,
                    last_data,
                });
            }
            Err((_, nix::errno::Errno::EWOULDBLOCK)) => continue,
            Err((_, e)) => {
                return Err(IdentityError::Lock {
                    what: "locking",
                    path,
                    source: e.into(),
                })
            }
        }
    }
    Err(IdentityError::RangeExhausted {
        start: range.start,
        end: range.end,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_parse_or_say_how() {
        assert_eq!(
            "100-200".parse::<UidRange>().unwrap(),
            UidRange {
                start: 100,
                end: 200
            }
        );
        assert!(matches!(
            "200-100".parse::<UidRange>(),
            Err(IdentityError::BadRange { .. })
        ));
        assert!(matches!(
            "0-10".parse::<UidRange>(),
            Err(IdentityError::BadRange { .. })
        ));
        assert!("x"
            .parse::<UidRange>()
            .unwrap_err()
            .to_string()
            .contains("START-END"));
    }

    #[test]
    fn two_locks_never_share_a_uid_and_a_released_one_is_reused() {
        let tmp = tempfile::Builder::new()
            .prefix("zerohop-uids-")
            .tempdir()
            .unwrap();
        let dir = tmp.path();
        let range = UidRange {
            start: 500_000,
            end: 500_001,
        };
        let a = lock_uid(range, dir).unwrap();
        let b = lock_uid(range, dir).unwrap();
        assert_eq!((a.uid(), b.uid()), (500_000, 500_001));
        assert!(matches!(
            lock_uid(range, dir),
            Err(IdentityError::RangeExhausted { .. })
        ));
        drop(a);
        assert_eq!(lock_uid(range, dir).unwrap().uid(), 500_000);
    }

    #[test]
    fn a_lock_folder_others_may_write_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::Builder::new()
            .prefix("zerohop-uids-")
            .tempdir()
            .unwrap();
        let range = UidRange {
            start: 500_100,
            end: 500_101,
        };
        std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let msg = lock_uid(range, tmp.path()).unwrap_err().to_string();
        assert!(msg.contains("no one else may write"), "{msg}");
        assert!(msg.contains("mode 777"), "{msg}");
        assert!(!msg.contains('\n'), "{msg}");
        let link = tmp.path().with_extension("link");
        std::os::unix::fs::symlink(tmp.path(), &link).unwrap();
        std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        let msg = lock_uid(range, &link).unwrap_err().to_string();
        assert!(msg.contains("a symbolic link"), "{msg}");
        std::fs::remove_file(&link).unwrap();
        assert_eq!(lock_uid(range, tmp.path()).unwrap().uid(), 500_100);
    }

    #[test]
    fn the_no_userns_error_is_one_line_saying_what_to_do() {
        let msg = IdentityError::NoUserNamespaces("/proc/sys/user/max_user_namespaces is 0".into())
            .to_string();
        assert!(!msg.contains('\n'));
        assert!(msg.contains("not running as root"), "{msg}");
        assert!(msg.contains("max_user_namespaces is 0"), "{msg}");
        assert!(msg.contains("run `zerohop up` as root"), "{msg}");
    }
}
