//! What a uid left behind. As root, each chain runs under a uid of the range that the last
//! chain to hold it may have used (another tenant's): before the new chain's instances
//! start, the agent removes what that uid still owns in the host's shared places, so
//! nothing of the last holder reaches the next one.
//!
//! * Files: every entry the uid owns in [`PLACES`] (`/tmp`, `/var/tmp`, `/dev/shm`), and
//!   below them in folders anyone may write to (sticky scratch folders of other owners);
//!   a folder the uid owns goes with all it holds. Nothing is followed through a symbolic
//!   link (`remove_dir_all` opens each level with `O_NOFOLLOW`). A folder that is a
//!   chain's data folder (its root-owned lock `.NAME.lock` beside it) is not removed but
//!   given to root, mode 0700: the chain it belongs to takes it back when it starts again.
//! * SysV shared memory, message queues and semaphores of the host's IPC namespace whose
//!   owner or creator is the uid. (Instances have an IPC namespace each where the agent may
//!   make them, so they leave none there; an agent without `CAP_SYS_ADMIN` runs them in
//!   its own, and these are what they left.)
//! * Data folders: the last holder's data folder, named in the uid's lock file, is given
//!   to root (mode 0700) if the uid still owns it (an agent that was killed could not do it
//!   when its chain stopped).
//!
//! Bounded: at most [`MAX_ENTRIES`] entries looked at and [`MAX_DEPTH`] levels per place;
//! what is left beyond is named in the log.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::sys::Ipc;

/// The host's shared scratch places a uid can leave files in.
pub(crate) const PLACES: &[&str] = &["/tmp", "/var/tmp", "/dev/shm"];

/// Most entries looked at per sweep (a scratch folder full of build trees stays cheap:
/// only folders anyone may write to are entered).
const MAX_ENTRIES: usize = 1_000_000;
/// Deepest level entered below a place.
const MAX_DEPTH: usize = 16;

/// What a sweep did.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Swept {
    /// Files and folders removed.
    pub removed: Vec<PathBuf>,
    /// Data folders of other runs given to root.
    pub secured: Vec<PathBuf>,
    /// SysV IPC objects removed.
    pub ipc: usize,
    /// What could not be done, one line each.
    pub problems: Vec<String>,
}

impl Swept {
    /// One line for the log, `None` when there was nothing to do.
    pub fn describe(&self, uid: u32) -> Option<String> {
        if self.removed.is_empty()
            && self.secured.is_empty()
            && self.ipc == 0
            && self.problems.is_empty()
        {
            return None;
        }
        let mut s = format!(
            "uid {uid} was used before: removed {} of its files ({}) and {} SysV IPC objects",
            self.removed.len(),
            names(&self.removed),
            self.ipc
        );
        if !self.secured.is_empty() {
            s.push_str(&format!(
                "; gave a data folder of an earlier run to root ({})",
                names(&self.secured)
            ));
        }
        if !self.problems.is_empty() {
            s.push_str(&format!("; left: {}", self.problems.join("; ")));
        }
        Some(s)
    }
}

/// At most three names, then how many more.
fn names(paths: &[PathBuf]) -> String {
    let mut s: Vec<String> = paths
        .iter()
        .take(3)
        .map(|p| p.display().to_string())
        .collect();
    if paths.len() > 3 {
        s.push(format!("{} more", paths.len() - 3));
    }
    s.join(", ")
}

/// Removes what `uid` owns in `places` and the host's SysV IPC, and gives `last_data` (the
/// last holder's data folder) to root if `uid` still owns it. `keep`: the data folder of
/// the chain taking the uid, left alone.
pub(crate) fn sweep(
    uid: u32,
    places: &[&Path],
    keep: Option<&Path>,
    last_data: Option<&Path>,
) -> Swept {
    let mut swept = Swept::default();
    let mut budget = MAX_ENTRIES;
    for place in places {
        walk(uid, place, 0, keep, &mut budget, &mut swept);
    }
    if let Some(d) = last_data.filter(|d| Some(*d) != keep) {
        if std::fs::symlink_metadata(d).is_ok_and(|m| m.is_dir() && m.uid() == uid) {
            secure(d, &mut swept);
        }
    }
    for (table, remove) in [
        ("/proc/sysvipc/shm", Ipc::Shm),
        ("/proc/sysvipc/msg", Ipc::Msg),
        ("/proc/sysvipc/sem", Ipc::Sem),
    ] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for id in owned_ids(&text, uid) {
            match super::sys::ipc_rmid(remove, id) {
                Ok(()) => swept.ipc += 1,
                Err(e) => swept.problems.push(format!("{table} id {id}: {e}")),
            }
        }
    }
    swept
}

fn walk(
    uid: u32,
    dir: &Path,
    depth: usize,
    keep: Option<&Path>,
    budget: &mut usize,
    swept: &mut Swept,
) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        if *budget == 0 {
            swept.problems.push(format!(
                "{}: more than {MAX_ENTRIES} entries, not all looked at",
                dir.display()
            ));
            return;
        }
        *budget -= 1;
        let path = entry.path();
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        let is_dir = meta.file_type().is_dir();
        if keep.is_some_and(|k| k.starts_with(&path)) {
            // The new chain's own data folder, or a folder on the way to it.
            if is_dir && Some(path.as_path()) != keep && depth < MAX_DEPTH {
                walk(uid, &path, depth + 1, keep, budget, swept);
            }
            continue;
        }
        if meta.uid() == uid {
            if is_dir && is_data_folder(&path) {
                secure(&path, swept);
                continue;
            }
            let gone = if is_dir {
                std::fs::remove_dir_all(&path)
            } else {
                std::fs::remove_file(&path)
            };
            match gone {
                Ok(()) => swept.removed.push(path),
                Err(e) => swept.problems.push(format!("{}: {e}", path.display())),
            }
        } else if is_dir && meta.permissions().mode() & 0o002 != 0 {
            if depth < MAX_DEPTH {
                walk(uid, &path, depth + 1, keep, budget, swept);
            } else {
                swept.problems.push(format!(
                    "{}: deeper than {MAX_DEPTH} levels",
                    path.display()
                ));
            }
        }
    }
}

/// Whether `dir` is a chain's data folder: the agent's lock for it (root's) is beside it.
fn is_data_folder(dir: &Path) -> bool {
    let (Some(parent), Some(name)) = (dir.parent(), dir.file_name()) else {
        return false;
    };
    let lock = parent.join(format!(".{}.lock", name.to_string_lossy()));
    std::fs::symlink_metadata(lock).is_ok_and(|m| m.file_type().is_file() && m.uid() == 0)
}

/// Gives the folder itself (not what it holds) to root, mode 0700, without following a
/// symbolic link: the uid can no longer enter it.
fn secure(dir: &Path, swept: &mut Swept) {
    let done = super::data::give_to_root(dir);
    match done {
        Ok(()) => swept.secured.push(dir.to_owned()),
        Err(e) => swept.problems.push(format!("{}: {e}", dir.display())),
    }
}

/// The ids in a `/proc/sysvipc/*` table whose owner (`uid`) or creator (`cuid`) is `uid`.
/// The columns are found by the header's names (they differ between the three tables);
/// the id is the second column.
pub(crate) fn owned_ids(table: &str, uid: u32) -> Vec<i32> {
    let mut lines = table.lines();
    let Some(header) = lines.next() else {
        return Vec::new();
    };
    let cols: Vec<&str> = header.split_whitespace().collect();
    let at = |name: &str| cols.iter().position(|c| *c == name);
    let (Some(u), Some(cu)) = (at("uid"), at("cuid")) else {
        return Vec::new();
    };
    lines
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let is = |i: usize| f.get(i).and_then(|v| v.parse::<u32>().ok()) == Some(uid);
            (is(u) || is(cu)).then(|| f.get(1)?.parse().ok()).flatten()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sysv_tables_name_what_a_uid_owns_or_made() {
        let shm = "       key      shmid perms                  size  cpid  lpid nattch   uid   gid  cuid  cgid      atime      dtime      ctime                   rss                  swap\n\
                            0         7   600                  4096   10    10      0  100000 100000 100000 100000 0 0 0 4096 0\n\
                            0         8   600                  4096   10    10      0  0 0 100000 0 0 0 0 4096 0\n\
                            0         9   600                  4096   10    10      0  100001 100001 100001 100001 0 0 0 4096 0\n";
        assert_eq!(owned_ids(shm, 100000), vec![7, 8]);
        let sem = "       key      semid perms      nsems   uid   gid  cuid  cgid      otime      ctime\n\
                            0        3   600          1 100000 100000 0 0 0 0\n";
        assert_eq!(owned_ids(sem, 100000), vec![3]);
        assert_eq!(owned_ids("", 1), Vec::<i32>::new());
        assert_eq!(owned_ids("key id perms\n0 1 600\n", 1), Vec::<i32>::new());
    }

    #[test]
    fn a_sweep_removes_the_uids_files_and_keeps_everything_else() {
        let tmp = tempfile::Builder::new()
            .prefix("zerohop-sweep-")
            .tempdir()
            .unwrap();
        let place = tmp.path();
        let uid = 470_001;
        let own = |p: &Path, u: u32| std::os::unix::fs::lchown(p, Some(u), Some(u)).unwrap();
        let file = |p: &Path, u: u32| {
            std::fs::write(p, b"x").unwrap();
            own(p, u);
        };
        // The uid's: a file, a folder with a tree (some of it another uid's), a symbolic
        // link to somebody else's file (the link goes, its target stays).
        file(&place.join("left.txt"), uid);
        std::fs::create_dir_all(place.join("tree/a/b")).unwrap();
        file(&place.join("tree/a/b/c"), 470_002);
        own(&place.join("tree"), uid);
        let target = place.join("not-theirs");
        file(&target, 470_002);
        std::os::unix::fs::symlink(&target, place.join("link")).unwrap();
        own(&place.join("link"), uid);
        // Deeper, in a folder anyone may write to: found; in a closed folder of another
        // uid: never entered (it cannot hold the uid's files).
        std::fs::create_dir(place.join("shared")).unwrap();
        std::fs::set_permissions(
            place.join("shared"),
            std::fs::Permissions::from_mode(0o1777),
        )
        .unwrap();
        file(&place.join("shared/deep"), uid);
        std::fs::create_dir(place.join("closed")).unwrap();
        file(&place.join("closed/theirs"), 470_002);
        // A data folder of a chain: given to root, kept whole.
        std::fs::create_dir(place.join("data")).unwrap();
        file(&place.join("data/db"), uid);
        own(&place.join("data"), uid);
        std::fs::write(place.join(".data.lock"), b"").unwrap();
        // The new chain's own data folder: left alone.
        std::fs::create_dir(place.join("mine")).unwrap();
        own(&place.join("mine"), uid);

        let swept = sweep(uid, &[place], Some(&place.join("mine")), None);
        let mut removed: Vec<String> = swept
            .removed
            .iter()
            .map(|p| p.strip_prefix(place).unwrap().display().to_string())
            .collect();
        removed.sort();
        assert_eq!(removed, ["left.txt", "link", "shared/deep", "tree"]);
        assert!(target.exists(), "a link's target is never touched");
        assert!(place.join("closed/theirs").exists());
        assert!(place.join("mine").exists());
        let data = std::fs::symlink_metadata(place.join("data")).unwrap();
        assert_eq!((data.uid(), data.mode() & 0o777), (0, 0o700));
        assert!(place.join("data/db").exists());
        assert_eq!(swept.secured, vec![place.join("data")]);
        assert!(swept.problems.is_empty(), "{:?}", swept.problems);
        let line = swept.describe(uid).unwrap();
        assert!(line.contains("removed 4 of its files"), "{line}");
        assert!(line.contains("1 more"), "{line}");
        assert_eq!(Swept::default().describe(uid), None);
    }
}
