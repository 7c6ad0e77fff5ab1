//! A chain's data folder: files its functions keep across restarts and replacements
//! (SQLite stores, caches, models), owned by the chain's uid and by nobody else.
//!
//! * Where: the spec's `data: PATH`, or with `data: true` `/var/lib/zerohop/chains/NAME` as
//!   root and `$XDG_DATA_HOME/zerohop/chains/NAME` (else `~/.local/share/...`) otherwise.
//!   Functions find it in `$ZEROHOP_DATA`.
//! * Who: as root, the folder and everything in it belongs to the chain's uid and gid, mode
//!   0700 on the folder: other chains (other uids) cannot enter it. The default parent
//!   `/var/lib/zerohop/chains` is root's, mode 0711 (enterable, not listable). The uid of a
//!   chain is taken at each start, so it may differ from the last run's: then everything
//!   the last run's uid left is handed to the new one (`lchown`, never following a symbolic
//!   link; root's entries and files with several hard links are left alone, so a link a
//!   hostile function planted to a file of root's or of a user's changes nobody's file). Not
//!   root, the instances keep the agent's uid and the folder is simply the agent's, mode 0700.
//! * Exclusive: one running chain (and its replacement, which inherits the folder and the
//!   uid) uses a folder at a time; a lock file beside it (`.NAME.lock`, `flock`, released
//!   with the process however it ends) makes a second agent's chain fail to start, naming
//!   the folder.

use std::fs::{File, OpenOptions};
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg, OFlag};
use nix::sys::stat::Mode;
use nix::unistd::{Gid, Uid};

/// The parent of every default data folder as root.
pub const ROOT_BASE: &str = "/var/lib/zerohop/chains";

/// The environment variable that names the folder to functions.
pub const ENV: &str = "ZEROHOP_DATA";

/// Deepest folder nesting handed over to a new uid; deeper entries are left (and logged).
const MAX_DEPTH: usize = 64;

/// Where a chain's data folder is when its spec says `data: true`; `root`: the agent runs
/// as root; `xdg` and `home`: `$XDG_DATA_HOME` and `$HOME`.
pub fn default_dir(chain: &str, root: bool, xdg: Option<&Path>, home: Option<&Path>) -> PathBuf {
    if root {
        return Path::new(ROOT_BASE).join(chain);
    }
    let base = match (xdg.filter(|p| p.is_absolute()), home) {
        (Some(x), _) => x.to_owned(),
        (None, Some(h)) => h.join(".local/share"),
        (None, None) => PathBuf::from("/tmp"),
    };
    base.join("zerohop/chains").join(chain)
}

/// Why a chain's data folder could not be made ready; each names the folder, and the step or
/// file that failed.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// The path could not be made absolute (`std::path::absolute`).
    #[error("data folder {}: {source}", path.display())]
    Absolute {
        /// The path as given.
        path: PathBuf,
        /// What it said.
        source: std::io::Error,
    },
    /// The path is `/`.
    #[error("data folder {}: name a folder below /, not / itself", path.display())]
    Root {
        /// The path.
        path: PathBuf,
    },
    /// The folder's parents could not be created.
    #[error("data folder {}: creating {}: {source}", path.display(), parent.display())]
    CreateParent {
        /// The folder.
        path: PathBuf,
        /// Its parent.
        parent: PathBuf,
        /// What `mkdir` said.
        source: std::io::Error,
    },
    /// The lock file beside the folder could not be opened.
    #[error("data folder {}: opening its lock {}: {source}", path.display(), lock.display())]
    OpenLock {
        /// The folder.
        path: PathBuf,
        /// The lock file.
        lock: PathBuf,
        /// What `open` said.
        source: std::io::Error,
    },
    /// Another running chain holds the folder's lock.
    #[error(
        "data folder {} is in use by another running chain (its lock {} is held); stop that \
         chain, or give chain '{chain}' another folder with `data: PATH`",
        path.display(),
        lock.display()
    )]
    InUse {
        /// The folder.
        path: PathBuf,
        /// The lock file.
        lock: PathBuf,
        /// The chain that asked for it.
        chain: String,
    },
    /// Taking the lock failed otherwise.
    #[error("data folder {}: locking {}: {source}", path.display(), lock.display())]
    Lock {
        /// The folder.
        path: PathBuf,
        /// The lock file.
        lock: PathBuf,
        /// What `flock` said.
        source: nix::errno::Errno,
    },
    /// The path is a symbolic link.
    #[error("data folder {} is a symbolic link; name the folder itself", path.display())]
    Symlink {
        /// The path.
        path: PathBuf,
    },
    /// The path is something other than a folder.
    #[error("data folder {} exists and is not a folder", path.display())]
    NotFolder {
        /// The path.
        path: PathBuf,
    },
    /// The folder could not be created.
    #[error("data folder {}: creating it: {source}", path.display())]
    Create {
        /// The folder.
        path: PathBuf,
        /// What `mkdir` said.
        source: std::io::Error,
    },
    /// The folder could not be opened (without following a symbolic link).
    #[error("data folder {}: opening it: {source}", path.display())]
    Open {
        /// The folder.
        path: PathBuf,
        /// What `open` said.
        source: nix::errno::Errno,
    },
    /// The folder and what it holds could not be given to the chain's uid.
    #[error("data folder {}: giving it to uid {uid}: {source}", path.display())]
    HandOver {
        /// The folder.
        path: PathBuf,
        /// The chain's uid.
        uid: u32,
        /// What the listing or `fchown` said.
        source: std::io::Error,
    },
    /// The folder's mode could not be set to 0700.
    #[error("data folder {}: chmod 0700: {source}", path.display())]
    Chmod {
        /// The folder.
        path: PathBuf,
        /// What `fchmod` said.
        source: nix::errno::Errno,
    },
    /// The chain's uid cannot search a folder on the way to the data folder (checked by
    /// [`Jail::new`](crate::Jail::new) once the uid is known).
    #[error(
        "data folder {}: the chain's uid {uid} cannot reach it: {} is not searchable by others \
         (o+x); open that folder up (chmod o+x) or name another place with `data: PATH`",
        path.display(),
        blocked.display()
    )]
    Unreachable {
        /// The folder.
        path: PathBuf,
        /// The chain's uid.
        uid: u32,
        /// The first folder on the way that the uid cannot search.
        blocked: PathBuf,
    },
}

/// A chain's data folder, held for as long as the chain (and a chain replacing it) runs.
#[derive(Debug)]
pub struct DataDir {
    path: PathBuf,
    /// As root: the folder belongs to the chain's uid while the chain runs, and to root
    /// once it has stopped (so the next chain given that uid cannot enter it).
    owned: bool,
    _lock: Flock<File>,
}

impl Drop for DataDir {
    fn drop(&mut self) {
        if self.owned {
            if let Err(e) = give_to_root(&self.path) {
                tracing::warn!(
                    "data folder {}: giving it back to root: {e}; the chain's uid can still \
                     enter it until the chain starts again",
                    self.path.display()
                );
            }
        }
    }
}

/// Gives folder `dir` itself (not what it holds) to root, mode 0700, without following a
/// symbolic link.
pub(crate) fn give_to_root(dir: &Path) -> std::io::Result<()> {
    let d = open_dir_nofollow(None, dir)?;
    nix::unistd::fchown(d.as_fd(), Some(Uid::from_raw(0)), Some(Gid::from_raw(0)))?;
    nix::sys::stat::fchmod(d.as_fd(), Mode::from_bits_truncate(0o700))?;
    Ok(())
}

impl DataDir {
    /// The folder.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Makes `path` the data folder of chain `chain`: creates it (and its parents), takes
    /// its lock, and as root (`owner` = the chain's uid and gid) gives it and what the last
    /// run left in it to that owner.
    pub fn open(chain: &str, path: &Path, owner: Option<(u32, u32)>) -> Result<DataDir, DataError> {
        let path = std::path::absolute(path).map_err(|source| DataError::Absolute {
            path: path.to_owned(),
            source,
        })?;
        let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
            return Err(DataError::Root { path });
        };
        let default_base = owner.is_some() && parent == Path::new(ROOT_BASE);
        let mut parents = std::fs::DirBuilder::new();
        parents.recursive(true).mode(0o755);
        parents
            .create(parent)
            .map_err(|source| DataError::CreateParent {
                path: path.clone(),
                parent: parent.to_owned(),
                source,
            })?;
        if default_base {
            // Enterable by every chain's uid, listable by none of them.
            let _ = std::fs::set_permissions(parent, std::fs::Permissions::from_mode(0o711));
        }
        let lock_path = parent.join(format!(".{}.lock", name.to_string_lossy()));
        let lock_file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
            .open(&lock_path)
            .map_err(|source| DataError::OpenLock {
                path: path.clone(),
                lock: lock_path.clone(),
                source,
            })?;
        let lock = match Flock::lock(lock_file, FlockArg::LockExclusiveNonblock) {
            Ok(l) => l,
            Err((_, nix::errno::Errno::EWOULDBLOCK)) => {
                return Err(DataError::InUse {
                    path,
                    lock: lock_path,
                    chain: chain.to_owned(),
                })
            }
            Err((_, source)) => {
                return Err(DataError::Lock {
                    path,
                    lock: lock_path,
                    source,
                })
            }
        };
        match std::fs::symlink_metadata(&path) {
            Ok(m) if m.file_type().is_symlink() => return Err(DataError::Symlink { path }),
            Ok(m) if !m.is_dir() => return Err(DataError::NotFolder { path }),
            Ok(_) => {}
            Err(_) => std::fs::DirBuilder::new()
                .mode(0o700)
                .create(&path)
                .map_err(|source| DataError::Create {
                    path: path.clone(),
                    source,
                })?,
        }
        let dir = open_dir_nofollow(None, &path).map_err(|source| DataError::Open {
            path: path.clone(),
            source,
        })?;
        if let Some((uid, gid)) = owner {
            hand_over(&dir, &path, uid, gid).map_err(|source| DataError::HandOver {
                path: path.clone(),
                uid,
                source,
            })?;
        }
        nix::sys::stat::fchmod(dir.as_fd(), Mode::from_bits_truncate(0o700)).map_err(|source| {
            DataError::Chmod {
                path: path.clone(),
                source,
            }
        })?;
        Ok(DataDir {
            path,
            owned: owner.is_some(),
            _lock: lock,
        })
    }
}

/// Opens folder `name` (relative to `at`, or a path when `at` is `None`) without following
/// a symbolic link in its last component.
fn open_dir_nofollow(at: Option<&File>, name: &Path) -> nix::Result<File> {
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let fd = match at {
        Some(d) => nix::fcntl::openat(d.as_fd(), name, flags, Mode::empty())?,
        None => nix::fcntl::open(name, flags, Mode::empty())?,
    };
    Ok(File::from(fd))
}

/// Gives the folder `dir` and every entry below it to `uid`:`gid`, without following
/// symbolic links. Root's entries and files with several hard links (a planted link to
/// somebody else's file) are left alone and logged.
fn hand_over(dir: &File, path: &Path, uid: u32, gid: u32) -> std::io::Result<()> {
    let chown_fd = |f: &File| {
        nix::unistd::fchown(
            f.as_fd(),
            Some(Uid::from_raw(uid)),
            Some(Gid::from_raw(gid)),
        )
    };
    // The folder itself: ours (the agent's) when just made, else whoever had it.
    chown_fd(dir)?;
    let mut stack: Vec<(File, PathBuf, usize)> = vec![(dir.try_clone()?, path.to_owned(), 0)];
    let mut left = 0usize;
    while let Some((d, at, depth)) = stack.pop() {
        // Listed through the open descriptor: a folder swapped for a link meanwhile is not
        // followed.
        let listing = Path::new("/proc/self/fd").join(d.as_raw_fd().to_string());
        let names: Vec<std::ffi::OsString> = std::fs::read_dir(listing)?
            .map(|e| e.map(|e| e.file_name()))
            .collect::<std::io::Result<_>>()?;
        for name in names {
            let st = nix::sys::stat::fstatat(
                d.as_fd(),
                name.as_os_str(),
                nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
            )?;
            let kind = nix::sys::stat::SFlag::from_bits_truncate(st.st_mode)
                & nix::sys::stat::SFlag::S_IFMT;
            let is_dir = kind == nix::sys::stat::SFlag::S_IFDIR;
            let owner = st.st_uid;
            let foreign = owner == 0;
            let linked = !is_dir && st.st_nlink > 1;
            if foreign || linked {
                left += 1;
                tracing::warn!(
                    "data folder: left {} as it is (owner uid {owner}{}); the chain's uid {uid} \
                     may not be able to use it",
                    at.join(&name).display(),
                    if linked { ", several hard links" } else { "" }
                );
                continue;
            }
            if owner != uid || st.st_gid != gid {
                nix::unistd::fchownat(
                    d.as_fd(),
                    name.as_os_str(),
                    Some(Uid::from_raw(uid)),
                    Some(Gid::from_raw(gid)),
                    nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
                )?;
            }
            if is_dir {
                if depth + 1 >= MAX_DEPTH {
                    tracing::warn!(
                        "data folder: not descending into {} (more than {MAX_DEPTH} levels)",
                        at.join(&name).display()
                    );
                    continue;
                }
                let sub = open_dir_nofollow(Some(&d), Path::new(&name))?;
                stack.push((sub, at.join(&name), depth + 1));
            }
        }
    }
    if left > 0 {
        tracing::warn!(
            "data folder {}: {left} entries kept their owner",
            path.display()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt;

    use super::*;

    #[test]
    fn the_default_folder_is_under_var_lib_as_root_and_xdg_otherwise() {
        assert_eq!(
            default_dir(
                "parking",
                true,
                Some(Path::new("/x")),
                Some(Path::new("/home/u"))
            ),
            Path::new("/var/lib/zerohop/chains/parking")
        );
        assert_eq!(
            default_dir(
                "parking",
                false,
                Some(Path::new("/x")),
                Some(Path::new("/home/u"))
            ),
            Path::new("/x/zerohop/chains/parking")
        );
        // A relative XDG_DATA_HOME is ignored, as the spec of that variable says.
        assert_eq!(
            default_dir(
                "p",
                false,
                Some(Path::new("rel")),
                Some(Path::new("/home/u"))
            ),
            Path::new("/home/u/.local/share/zerohop/chains/p")
        );
    }

    #[test]
    fn a_folder_in_use_is_refused_and_free_again_after() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("c");
        let a = DataDir::open("c", &path, None).unwrap();
        assert!(path.is_dir());
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        let e = DataDir::open("c", &path, None).unwrap_err();
        assert!(matches!(e, DataError::InUse { .. }), "{e}");
        let e = e.to_string();
        assert!(e.contains("is in use by another running chain"), "{e}");
        drop(a);
        DataDir::open("c", &path, None).unwrap();
    }

    #[test]
    fn a_symbolic_link_or_a_file_is_not_a_data_folder() {
        let tmp = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(tmp.path(), tmp.path().join("link")).unwrap();
        let e = DataDir::open("c", &tmp.path().join("link"), None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("is a symbolic link"), "{e}");
        std::fs::write(tmp.path().join("file"), "x").unwrap();
        let e = DataDir::open("c", &tmp.path().join("file"), None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("is not a folder"), "{e}");
    }

    /// As root: what the last run's uid (or an older one) left goes to the new uid; a planted
    /// symbolic or hard link and a file of root's stay as they are.
    #[test]
    fn as_root_the_last_runs_files_go_to_the_new_uid_and_nothing_else_moves() {
        if !nix::unistd::geteuid().is_root() {
            // Changing owners needs root; the CI and `cargo xtask test` run as root.
            panic!("this test needs root (cargo xtask test runs as root)");
        }
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("c");
        let (old, new) = (100_007u32, 100_008u32);
        std::fs::create_dir(&path).unwrap();
        std::fs::create_dir(path.join("sub")).unwrap();
        std::fs::write(path.join("sub/db"), "x").unwrap();
        std::fs::write(path.join("roots"), "x").unwrap();
        std::fs::write(path.join("twice"), "x").unwrap();
        std::fs::hard_link(path.join("twice"), tmp.path().join("elsewhere")).unwrap();
        std::fs::write(path.join("users"), "x").unwrap();
        let victim = tmp.path().join("victim");
        std::fs::write(&victim, "secret").unwrap();
        std::os::unix::fs::symlink(&victim, path.join("planted")).unwrap();
        std::os::unix::fs::chown(path.join("users"), Some(1000), Some(1000)).unwrap();
        std::os::unix::fs::chown(path.join("twice"), Some(old), Some(old)).unwrap();
        for p in [&path, &path.join("sub"), &path.join("sub/db")] {
            std::os::unix::fs::chown(p, Some(old), Some(old)).unwrap();
        }
        std::os::unix::fs::lchown(path.join("planted"), Some(old), Some(old)).unwrap();
        let d = DataDir::open("c", &path, Some((new, new))).unwrap();
        let owner = |p: &Path| std::fs::symlink_metadata(p).unwrap().uid();
        assert_eq!(owner(&path), new);
        assert_eq!(owner(&path.join("sub")), new);
        assert_eq!(owner(&path.join("sub/db")), new);
        assert_eq!(owner(&path.join("planted")), new, "the link itself");
        assert_eq!(owner(&victim), 0, "the link's target is not followed");
        assert_eq!(owner(&path.join("roots")), 0, "root's file stays root's");
        assert_eq!(
            owner(&path.join("twice")),
            old,
            "a file linked elsewhere stays"
        );
        assert_eq!(
            owner(&path.join("users")),
            new,
            "any uid's file moves (a chain wrote it)"
        );
        drop(d);
    }
}
