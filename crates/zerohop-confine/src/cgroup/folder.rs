//! A group folder on disk, whatever its version: the groups beneath it, the processes in
//! it, and removing it once they are gone.

use std::path::{Path, PathBuf};
use std::time::Duration;

/// The folders in `dir` (child groups).
pub(super) fn subdirs(dir: &Path) -> Vec<PathBuf> {
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
pub(super) fn procs(dir: &Path) -> Vec<i32> {
    std::fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// Removes a group folder once its last member is gone (an exiting process lingers a
/// moment), at most ~1 s.
pub(super) fn remove(dir: &Path) {
    for _ in 0..100 {
        match std::fs::remove_dir(dir) {
            Ok(()) => return,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
    tracing::debug!(dir = %dir.display(), "cgroup not removed: still busy");
}
