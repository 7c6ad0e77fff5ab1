//! A system's resident memory while a point runs, sampled from `/proc` on a thread of its
//! own, with shared memory counted once.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use zerohop_bench::procstat::memory::Status;

/// How often the sampler reads `/proc`.
const SAMPLE_EVERY: Duration = Duration::from_millis(2);

/// Resident memory of a system in KiB: its processes' `VmRSS` less their shared memory,
/// plus the shared memory once, as the pages its memfds hold (`memfds`: one path per
/// memfd, `/proc/PID/fd/N`).
fn resident_kib(pids: &[u32], memfds: &[PathBuf]) -> u64 {
    let private: u64 = pids
        .iter()
        .filter_map(|&p| Status::read(p))
        .map(|s| s.vm_rss_kib.saturating_sub(s.rss_shmem_kib))
        .sum();
    // A memfd is shmem: its blocks are the pages it holds, whoever maps them.
    let shared: u64 = memfds
        .iter()
        .filter_map(|p| std::fs::metadata(p).ok())
        .map(|m| m.blocks() / 2)
        .sum();
    private + shared
}

/// One `/proc/PID/fd/N` path per memfd the processes `pids` hold (each region once).
fn memfd_paths(pids: &[u32]) -> Vec<PathBuf> {
    let mut seen = BTreeMap::new();
    for pid in pids {
        let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
            continue;
        };
        for entry in dir.flatten() {
            let path = entry.path();
            let is_memfd =
                std::fs::read_link(&path).is_ok_and(|t| t.to_string_lossy().starts_with("/memfd:"));
            if let (true, Ok(meta)) = (is_memfd, std::fs::metadata(&path)) {
                seen.entry((meta.dev(), meta.ino())).or_insert(path);
            }
        }
    }
    seen.into_values().collect()
}

/// Samples a system's memory on a thread of its own until stopped: the first sample and
/// the largest, KiB.
pub struct Sampler {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<(u64, u64, usize)>,
}

impl Sampler {
    pub fn start(pids: Vec<u32>) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let memfds = memfd_paths(&pids);
        let thread = std::thread::spawn(move || {
            let first = resident_kib(&pids, &memfds);
            let (mut peak, mut samples) = (first, 1);
            while !flag.load(Ordering::Relaxed) {
                std::thread::sleep(SAMPLE_EVERY);
                peak = peak.max(resident_kib(&pids, &memfds));
                samples += 1;
            }
            (first, peak, samples)
        });
        Self { stop, thread }
    }

    /// `(before, peak, samples)`.
    pub fn finish(self) -> (u64, u64, usize) {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap_or((0, 0, 0))
    }
}
