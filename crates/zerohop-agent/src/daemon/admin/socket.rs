//! The admin socket's file and folder: where the daemon may make it, and where the CLI may
//! talk through it.
//!
//! Whoever owns or can write the socket's folder can put a socket of their own in the daemon's
//! place, and the CLI would send them its specs and data. The fallback folder
//! `/tmp/zerohop-UID` is a name any local user can take first. So the daemon makes the folder
//! (mode 0700) or finds it, and refuses it unless it is a real folder of the daemon's own uid
//! that no one else may write ([`check_private_dir`]); the CLI refuses to connect unless the
//! folder is a real one that only its own user or root owns and may write
//! ([`check_trusted_dir`]). Each refusal is one line naming the folder, its owner and mode,
//! and what to do.
//!
//! Others may enter the folder (mode 0755): that lets them reach the socket, whose mode (0600)
//! and the daemon's peer-credential check already refuse them, but not replace it.

use std::fs::{File, Metadata};
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use tokio::net::UnixListener;

/// Why the admin socket cannot be made or used; each says what to do.
#[derive(Debug, thiserror::Error)]
pub enum AdminSocketError {
    /// The socket's folder is a symbolic link, which could lead to anyone's folder.
    #[error(
        "the admin socket's folder {} is a symbolic link (owner uid {uid}, mode {mode:04o}), which \
         could lead to a folder someone else controls; remove the link, or pass --socket in a \
         folder of your own",
        .dir.display()
    )]
    Symlink {
        /// The folder.
        dir: PathBuf,
        /// Its owner.
        uid: u32,
        /// Its permission bits.
        mode: u32,
    },
    /// The socket's folder is something else than a folder.
    #[error(
        "the admin socket's folder {} is not a folder (owner uid {uid}, mode {mode:04o}); remove \
         it, or pass --socket in a folder of your own",
        .dir.display()
    )]
    NotAFolder {
        /// The path.
        dir: PathBuf,
        /// Its owner.
        uid: u32,
        /// Its permission bits.
        mode: u32,
    },
    /// The daemon's socket folder belongs to another user, who could listen there instead.
    #[error(
        "the admin socket's folder {} belongs to uid {uid} (mode {mode:04o}), not to uid {euid} \
         the daemon runs as: its owner could listen there in the daemon's place; remove the \
         folder (its owner or root can) and start again, or pass --socket in a folder of your own",
        .dir.display()
    )]
    NotOwned {
        /// The folder.
        dir: PathBuf,
        /// Its owner.
        uid: u32,
        /// Its permission bits.
        mode: u32,
        /// The daemon's effective uid.
        euid: u32,
    },
    /// The CLI would talk through a folder that neither its user nor root owns.
    #[error(
        "the admin socket's folder {} belongs to uid {uid} (mode {mode:04o}), neither to you \
         (uid {euid}) nor to root: its owner could be listening there instead of the daemon and \
         read what zerohop sends; find out who made it and remove it, or pass --socket",
        .dir.display()
    )]
    Untrusted {
        /// The folder.
        dir: PathBuf,
        /// Its owner.
        uid: u32,
        /// Its permission bits.
        mode: u32,
        /// The CLI's effective uid.
        euid: u32,
    },
    /// The socket's folder may be written by other users, who could put a socket of theirs
    /// in the daemon's place.
    #[error(
        "the admin socket's folder {} (owner uid {uid}) has mode {mode:04o}: other users may write \
         it, so the socket there could be theirs instead of the daemon's and read what zerohop \
         sends; make it private (`chmod 700 {}`) and start the daemon again, or pass --socket in \
         a folder of your own",
        .dir.display(),
        .dir.display()
    )]
    Writable {
        /// The folder.
        dir: PathBuf,
        /// Its owner.
        uid: u32,
        /// Its permission bits.
        mode: u32,
    },
    /// The socket's path stopped leading to the folder that was checked while the socket was
    /// made.
    #[error(
        "the admin socket's folder {} was replaced while the daemon made its socket: another \
         process is trying to take the daemon's place; find it, or pass --socket in a folder \
         of your own",
        .dir.display()
    )]
    Replaced {
        /// The folder.
        dir: PathBuf,
    },
    /// Another daemon answers on the socket.
    #[error("another daemon answers on {}; stop it first or pass --socket", .path.display())]
    InUse {
        /// The socket.
        path: PathBuf,
    },
    /// The system refused to make the folder or the socket.
    #[error(
        "cannot listen on the admin socket {}: {source}; pass --socket in a folder you can write",
        .path.display()
    )]
    Io {
        /// The socket.
        path: PathBuf,
        /// What the system said.
        source: io::Error,
    },
}

/// What a path is, as far as the admin socket's folder is concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DirKind {
    /// A folder.
    Folder,
    /// A symbolic link (not followed).
    Symlink,
    /// Anything else.
    Other,
}

/// What `lstat(2)` (or `fstat(2)` of a descriptor) says of the admin socket's folder: enough to
/// decide whether it may be used, and to say why not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DirFacts {
    /// What it is.
    pub kind: DirKind,
    /// Its owner.
    pub uid: u32,
    /// Its permission bits, sticky bit included (`st_mode & 0o7777`).
    pub mode: u32,
}

impl DirFacts {
    /// The facts of `meta`, taken without following a link.
    pub fn of(meta: &Metadata) -> Self {
        let t = meta.file_type();
        let kind = if t.is_symlink() {
            DirKind::Symlink
        } else if t.is_dir() {
            DirKind::Folder
        } else {
            DirKind::Other
        };
        Self {
            kind,
            uid: meta.uid(),
            mode: meta.mode() & 0o7777,
        }
    }
}

/// Whether the daemon, running as `euid`, may make its socket in `dir`: a real folder (not a
/// link), owned by `euid`, that no one else may write (no group or other write bit, sticky or
/// not: in a sticky folder others still take a name first). Whoever owns or can write the
/// folder can put a socket of their own in the daemon's place, and the CLI would talk to them.
pub fn check_private_dir(dir: &Path, facts: DirFacts, euid: u32) -> Result<(), AdminSocketError> {
    check_dir(dir, facts, |uid| {
        (uid != euid).then(|| AdminSocketError::NotOwned {
            dir: dir.to_owned(),
            uid,
            mode: facts.mode,
            euid,
        })
    })
}

/// Whether the CLI, running as `euid`, may connect through `dir`: a real folder (not a link),
/// owned by `euid` or root, that no one else may write. Only who can write the folder can
/// have put the socket there, so only they can be listening on it. (A daemon of another
/// user would not serve this one anyway, but root's CLI is served by every daemon: it trusts
/// only its own folders.)
pub fn check_trusted_dir(dir: &Path, facts: DirFacts, euid: u32) -> Result<(), AdminSocketError> {
    check_dir(dir, facts, |uid| {
        (uid != euid && uid != 0).then(|| AdminSocketError::Untrusted {
            dir: dir.to_owned(),
            uid,
            mode: facts.mode,
            euid,
        })
    })
}

/// What both sides ask of the socket's folder: a real folder, whose owner `foreign` does not
/// refuse, that no one else may write.
fn check_dir(
    dir: &Path,
    facts: DirFacts,
    foreign: impl FnOnce(u32) -> Option<AdminSocketError>,
) -> Result<(), AdminSocketError> {
    let DirFacts { kind, uid, mode } = facts;
    let dir = || dir.to_owned();
    match kind {
        DirKind::Symlink => Err(AdminSocketError::Symlink {
            dir: dir(),
            uid,
            mode,
        }),
        DirKind::Other => Err(AdminSocketError::NotAFolder {
            dir: dir(),
            uid,
            mode,
        }),
        DirKind::Folder => match foreign(uid) {
            Some(refused) => Err(refused),
            None if mode & 0o022 != 0 => Err(AdminSocketError::Writable {
                dir: dir(),
                uid,
                mode,
            }),
            None => Ok(()),
        },
    }
}

/// The folder the socket at `path` lives in (`.` for a bare name).
fn socket_dir(path: &Path) -> PathBuf {
    match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_owned(),
        _ => PathBuf::from("."),
    }
}

/// Makes `dir` (mode 0700) if it is missing and opens it; refuses it unless
/// [`check_private_dir`] accepts what the descriptor shows. `socket` names the socket in
/// errors.
fn private_dir(dir: &Path, socket: &Path) -> Result<File, AdminSocketError> {
    let io = |source| AdminSocketError::Io {
        path: socket.to_owned(),
        source,
    };
    if let Some(up) = dir.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(up)
            .map_err(io)?;
    }
    // mkdir first and look after: a folder that exists, made by anyone at any time before
    // (also between a look and the mkdir), is judged below, never trusted for existing.
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io(e)),
    }
    let euid = nix::unistd::geteuid().as_raw();
    // O_NOFOLLOW | O_DIRECTORY: a link or a file in the folder's place fails the open instead
    // of being followed, so the facts checked are those of the folder this descriptor holds.
    let folder = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
        .open(dir)
    {
        Ok(f) => f,
        Err(e) => {
            // ELOOP or ENOTDIR (or EACCES on another user's folder): say what is there.
            if let Ok(meta) = std::fs::symlink_metadata(dir) {
                check_private_dir(dir, DirFacts::of(&meta), euid)?;
            }
            return Err(io(e));
        }
    };
    let meta = folder.metadata().map_err(io)?;
    check_private_dir(dir, DirFacts::of(&meta), euid)?;
    Ok(folder)
}

/// Binds the admin socket at `path`: creates its folder (0700) if missing and refuses a folder
/// that is not the daemon's alone ([`check_private_dir`]), refuses to take over a socket
/// another daemon still answers on, removes a stale one, and sets 0600.
pub fn bind(path: &Path) -> Result<UnixListener, AdminSocketError> {
    let io = |source| AdminSocketError::Io {
        path: path.to_owned(),
        source,
    };
    let dir = socket_dir(path);
    let folder = private_dir(&dir, path)?;
    if path.exists() {
        match std::os::unix::net::UnixStream::connect(path) {
            Ok(_) => {
                return Err(AdminSocketError::InUse {
                    path: path.to_owned(),
                })
            }
            Err(_) => std::fs::remove_file(path).map_err(io)?,
        }
    }
    let listener = UnixListener::bind(path).map_err(io)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(io)?;
    // The socket was made by path, the checks were of the descriptor: if the path no longer
    // leads to that folder, someone who can write its parent swapped it in between, and the
    // socket may sit in their folder.
    let checked = folder.metadata().map_err(io)?;
    let now = std::fs::symlink_metadata(&dir).map_err(io)?;
    if (now.dev(), now.ino()) != (checked.dev(), checked.ino()) {
        return Err(AdminSocketError::Replaced { dir });
    }
    Ok(listener)
}

/// Whether the CLI may connect to the admin socket at `socket`: its folder must pass
/// [`check_trusted_dir`] for the CLI's effective uid. A folder that cannot be looked at
/// (missing, or in a folder the CLI may not enter) passes: connecting fails there anyway, with
/// its own message.
pub fn check_socket_for_client(socket: &Path) -> Result<(), AdminSocketError> {
    let dir = socket_dir(socket);
    match std::fs::symlink_metadata(&dir) {
        Ok(meta) => check_trusted_dir(&dir, DirFacts::of(&meta), nix::unistd::geteuid().as_raw()),
        Err(_) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ME: u32 = 1000;

    fn folder(uid: u32, mode: u32) -> DirFacts {
        DirFacts {
            kind: DirKind::Folder,
            uid,
            mode,
        }
    }

    #[test]
    fn the_daemon_uses_only_a_private_folder_of_its_own() {
        let dir = Path::new("/tmp/zerohop-1000");
        let link = DirFacts {
            kind: DirKind::Symlink,
            uid: ME,
            mode: 0o777,
        };
        let file = DirFacts {
            kind: DirKind::Other,
            uid: ME,
            mode: 0o600,
        };
        let cases: &[(DirFacts, &str)] = &[
            (folder(ME, 0o700), "ok"),
            (folder(ME, 0o500), "ok"),
            // Others may enter: the socket's mode and the peer check keep them out.
            (folder(ME, 0o755), "ok"),
            (folder(ME, 0o711), "ok"),
            (folder(0, 0o700), "NotOwned"),
            (folder(65534, 0o700), "NotOwned"),
            (folder(ME, 0o720), "Writable"),
            (folder(ME, 0o702), "Writable"),
            (folder(ME, 0o777), "Writable"),
            (folder(ME, 0o1777), "Writable"),
            (link, "Symlink"),
            (file, "NotAFolder"),
        ];
        for (facts, want) in cases {
            let got = match check_private_dir(dir, *facts, ME) {
                Ok(()) => "ok",
                Err(AdminSocketError::NotOwned { .. }) => "NotOwned",
                Err(AdminSocketError::Writable { .. }) => "Writable",
                Err(AdminSocketError::Symlink { .. }) => "Symlink",
                Err(AdminSocketError::NotAFolder { .. }) => "NotAFolder",
                Err(e) => panic!("{facts:?}: unexpected {e}"),
            };
            assert_eq!(got, *want, "{facts:?}");
        }
        // Root's daemon is held to the same rule: its folder is root's, written by root only.
        assert!(check_private_dir(dir, folder(0, 0o755), 0).is_ok());
        assert!(check_private_dir(dir, folder(0, 0o1777), 0).is_err());
        assert!(check_private_dir(dir, folder(ME, 0o700), 0).is_err());
    }

    #[test]
    fn the_cli_trusts_only_folders_no_one_but_it_or_root_can_write() {
        let dir = Path::new("/tmp/zerohop-1000");
        let cases: &[(DirFacts, &str)] = &[
            (folder(ME, 0o700), "ok"),
            (folder(0, 0o700), "ok"),
            (folder(0, 0o755), "ok"),
            (folder(ME, 0o711), "ok"),
            (folder(65534, 0o700), "Untrusted"),
            (folder(65534, 0o755), "Untrusted"),
            (folder(ME, 0o770), "Writable"),
            (folder(ME, 0o707), "Writable"),
            (folder(0, 0o1777), "Writable"),
            (
                DirFacts {
                    kind: DirKind::Symlink,
                    uid: ME,
                    mode: 0o777,
                },
                "Symlink",
            ),
        ];
        for (facts, want) in cases {
            let got = match check_trusted_dir(dir, *facts, ME) {
                Ok(()) => "ok",
                Err(AdminSocketError::Untrusted { .. }) => "Untrusted",
                Err(AdminSocketError::Writable { .. }) => "Writable",
                Err(AdminSocketError::Symlink { .. }) => "Symlink",
                Err(e) => panic!("{facts:?}: unexpected {e}"),
            };
            assert_eq!(got, *want, "{facts:?}");
        }
    }

    #[test]
    fn every_refusal_is_one_line_naming_the_folder_its_owner_its_mode_and_what_to_do() {
        let dir = Path::new("/tmp/zerohop-1000");
        let refusals = [
            check_private_dir(dir, folder(65534, 0o755), ME),
            check_private_dir(dir, folder(ME, 0o777), ME),
            check_trusted_dir(dir, folder(65534, 0o755), ME),
            check_trusted_dir(dir, folder(ME, 0o1777), ME),
            check_private_dir(
                dir,
                DirFacts {
                    kind: DirKind::Symlink,
                    uid: 65534,
                    mode: 0o777,
                },
                ME,
            ),
        ];
        for r in refusals {
            let text = r.expect_err("refused").to_string();
            assert!(!text.contains('\n'), "{text}");
            assert!(text.contains("/tmp/zerohop-1000"), "{text}");
            assert!(
                text.contains("uid 65534") || text.contains("uid 1000"),
                "{text}"
            );
            assert!(
                ["0755", "0777", "1777"].iter().any(|m| text.contains(m)),
                "{text}"
            );
            assert!(text.contains("--socket"), "{text}");
        }
    }

    fn mode_of(p: &Path) -> u32 {
        std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
    }

    #[tokio::test]
    async fn bind_makes_a_missing_folder_private_and_listens_in_it() {
        // As under $XDG_RUNTIME_DIR: a private folder of the user's, without `zerohop` yet.
        let runtime_dir = tempfile::tempdir().unwrap();
        let socket = runtime_dir.path().join("zerohop/admin.sock");
        let listener = bind(&socket).expect("bind in a fresh folder");
        assert_eq!(mode_of(socket.parent().unwrap()), 0o700);
        assert_eq!(mode_of(&socket), 0o600);
        check_socket_for_client(&socket).expect("the CLI trusts it");
        let client = std::os::unix::net::UnixStream::connect(&socket).expect("connect");
        let (server, _) = listener.accept().await.expect("accept");
        assert_eq!(
            server.peer_cred().unwrap().uid(),
            nix::unistd::geteuid().as_raw()
        );
        drop(client);
        // A second start finds the folder it made and takes it again, the stale socket too.
        drop(listener);
        bind(&socket).expect("bind again in the same folder");
    }

    #[tokio::test]
    async fn bind_refuses_a_folder_of_its_own_that_everyone_may_write() {
        let top = tempfile::tempdir().unwrap();
        let dir = top.path().join("zerohop-1000");
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        let socket = dir.join("admin.sock");
        let text = bind(&socket).expect_err("refused").to_string();
        assert!(text.contains(&dir.display().to_string()), "{text}");
        assert!(text.contains("mode 0777"), "{text}");
        assert!(text.contains("chmod 700"), "{text}");
        assert!(!socket.exists(), "no socket was made");
        assert_eq!(mode_of(&dir), 0o777, "the folder is left as it was");
        let text = check_socket_for_client(&socket)
            .expect_err("the CLI refuses it too")
            .to_string();
        assert!(text.contains("mode 0777"), "{text}");
    }

    #[tokio::test]
    async fn bind_refuses_a_folder_another_user_made() {
        let top = tempfile::tempdir().unwrap();
        let euid = nix::unistd::geteuid();
        // Root makes one for nobody, as a local user would have made /tmp/zerohop-UID before
        // the daemon's user; anyone else finds such a folder in `/`, which root owns.
        let (dir, owner) = if euid.is_root() {
            let dir = top.path().join("zerohop-1000");
            std::fs::DirBuilder::new().mode(0o700).create(&dir).unwrap();
            std::os::unix::fs::chown(&dir, Some(65534), Some(65534)).unwrap();
            (dir, 65534)
        } else {
            (PathBuf::from("/"), 0)
        };
        let socket = dir.join("admin.sock");
        let err = bind(&socket).expect_err("refused");
        let text = err.to_string();
        assert!(
            matches!(err, AdminSocketError::NotOwned { uid, .. } if uid == owner),
            "{text}"
        );
        assert!(text.contains(&format!("uid {owner}")), "{text}");
        assert!(!socket.exists(), "no socket was made");
        if euid.is_root() {
            // Nobody could be listening there: the CLI sends nothing through it either.
            let err = check_socket_for_client(&socket).expect_err("refused");
            assert!(
                matches!(err, AdminSocketError::Untrusted { uid: 65534, .. }),
                "{err}"
            );
        }
    }

    #[tokio::test]
    async fn bind_refuses_a_link_in_place_of_its_folder() {
        let top = tempfile::tempdir().unwrap();
        let real = top.path().join("real");
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&real)
            .unwrap();
        let link = top.path().join("zerohop-1000");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let socket = link.join("admin.sock");
        let err = bind(&socket).expect_err("refused");
        assert!(matches!(err, AdminSocketError::Symlink { .. }), "{err}");
        assert!(!real.join("admin.sock").exists(), "no socket was made");
        let err = check_socket_for_client(&socket).expect_err("refused");
        assert!(matches!(err, AdminSocketError::Symlink { .. }), "{err}");
    }
}
