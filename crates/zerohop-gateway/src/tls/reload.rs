//! Reloading the certificates when their files change.
//!
//! inotify watches the folders that hold the files (not the files: tools replace a
//! certificate by writing a new file and renaming it over the old one, and Kubernetes swaps
//! a symlink in the folder), so the task sleeps in the kernel until something there
//! changes (a thread blocked in `read`). Then it waits for the folder to be quiet for [`SETTLE`] (a certificate and its
//! key are written one after the other) and reloads if a file's size, time or inode moved.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, WatchDescriptor};
use tokio::sync::{mpsc, watch};

use super::{CertFiles, Tls};

/// How long the folders must be quiet after a change before the files are read again.
const SETTLE: Duration = Duration::from_millis(200);

impl Tls {
    /// Reloads the certificates whenever their files change, until `shutdown` turns true.
    /// New handshakes use the new certificates; open connections keep theirs. A reload that
    /// fails (a half-written file, a key that does not match) keeps the certificates in use
    /// and logs why; the next change tries again.
    pub async fn watch(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        let watcher = match Watcher::new(self.files()) {
            Ok(w) => w,
            Err(e) => {
                tracing::warn!(
                    "tls: cannot watch the certificate files ({e}); they will not be reloaded \
                     when they change"
                );
                return;
            }
        };
        let mut seen = fingerprint(self.files());
        loop {
            tokio::select! {
                r = watcher.changed() => if let Err(e) = r {
                    tracing::warn!("tls: watching the certificate files failed ({e}); they \
                                    will not be reloaded any more");
                    return;
                },
                _ = shutdown.wait_for(|stop| *stop) => return,
            }
            while let Ok(Ok(())) = tokio::time::timeout(SETTLE, watcher.changed()).await {}
            let now = fingerprint(self.files());
            if now == seen {
                continue;
            }
            match self.reload() {
                Ok(()) => {
                    seen = now;
                    let names: Vec<String> = self
                        .files()
                        .iter()
                        .map(|f| f.cert.display().to_string())
                        .collect();
                    tracing::info!("tls: certificates reloaded ({})", names.join(", "));
                }
                Err(e) => tracing::warn!(
                    "tls: the certificate files changed but cannot be used, the previous \
                     certificates stay in use: {e}"
                ),
            }
        }
    }
}

/// What tells one version of a file from the next.
type Stamp = Option<(SystemTime, u64, u64)>;

fn fingerprint(files: &[CertFiles]) -> Vec<Stamp> {
    let stamp = |p: &Path| {
        use std::os::unix::fs::MetadataExt;
        // Follows symlinks: a swapped link to a new file is a change.
        let m = std::fs::metadata(p).ok()?;
        Some((m.modified().ok()?, m.len(), m.ino()))
    };
    files
        .iter()
        .flat_map(|f| [stamp(&f.cert), stamp(&f.key)])
        .collect()
}

/// Watches folders with inotify. A thread of its own blocks in `read` (tokio's readiness
/// would need an `unsafe` registration of the descriptor); dropping the watcher removes the
/// watches, whose `IN_IGNORED` events wake the thread to end.
struct Watcher {
    inotify: Arc<Inotify>,
    watches: Vec<WatchDescriptor>,
    stop: Arc<AtomicBool>,
    events: tokio::sync::Mutex<mpsc::Receiver<std::io::Result<()>>>,
}

impl Watcher {
    /// Watches the folders of `files`.
    fn new(files: &[CertFiles]) -> std::io::Result<Self> {
        let inotify = Arc::new(Inotify::init(InitFlags::IN_CLOEXEC)?);
        let folders: BTreeSet<PathBuf> = files
            .iter()
            .flat_map(|f| [&f.cert, &f.key])
            .map(|p| match p.parent() {
                Some(d) if !d.as_os_str().is_empty() => d.to_owned(),
                _ => PathBuf::from("."),
            })
            .collect();
        let what = AddWatchFlags::IN_CLOSE_WRITE
            | AddWatchFlags::IN_MOVED_TO
            | AddWatchFlags::IN_CREATE
            | AddWatchFlags::IN_DELETE
            | AddWatchFlags::IN_ATTRIB;
        let mut watches = Vec::new();
        for d in &folders {
            let wd = inotify.add_watch(d, what).map_err(|e| {
                std::io::Error::new(
                    std::io::Error::from(e).kind(),
                    format!("{}: {e}", d.display()),
                )
            })?;
            watches.push(wd);
        }
        let stop = Arc::new(AtomicBool::new(false));
        // One pending notice is enough: the reader looks at the files, not at the events.
        let (tx, rx) = mpsc::channel(1);
        let (reader, stopped) = (inotify.clone(), stop.clone());
        std::thread::Builder::new()
            .name("tls-reload".into())
            .spawn(move || loop {
                let got = reader.read_events();
                // Acquire: pairs with the Release store in `drop`, before the watches go.
                if stopped.load(Ordering::Acquire) {
                    return;
                }
                let notice = match got {
                    Ok(_) => Ok(()),
                    Err(nix::errno::Errno::EINTR) => continue,
                    Err(e) => Err(std::io::Error::from(e)),
                };
                let failed = notice.is_err();
                if let Err(mpsc::error::TrySendError::Closed(_)) = tx.try_send(notice) {
                    return;
                }
                if failed {
                    return;
                }
            })?;
        Ok(Self {
            inotify,
            watches,
            stop,
            events: tokio::sync::Mutex::new(rx),
        })
    }

    /// Resolves when something changed in a watched folder.
    async fn changed(&self) -> std::io::Result<()> {
        match self.events.lock().await.recv().await {
            Some(r) => r,
            None => Err(std::io::Error::other("the watching thread ended")),
        }
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        // Release: pairs with the Acquire load of the thread after its read returns.
        self.stop.store(true, Ordering::Release);
        for wd in self.watches.drain(..) {
            // Each removal queues an IN_IGNORED event, which ends the thread's read.
            let _ = self.inotify.rm_watch(wd);
        }
    }
}
