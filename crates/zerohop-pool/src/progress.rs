//! An instance's word about itself: one record per handler thread, in a memfd that only the
//! instance and the agent map.
//!
//! The hang watchdog needs to know which instance is stuck in a request. Owner words cannot
//! tell it: every party of a domain can write every owner word of its pool, so a hostile
//! function could name another instance as the holder of a slot and have it killed. This
//! region is handed to exactly one instance (a memfd no other process of the chain holds,
//! and instances are not dumpable, so `/proc/PID/fd` does not reach it either): what it says
//! can only be a lie about the instance itself, which costs only that instance's own
//! requests (the gateway answers them 504 at the chain's timeout anyway).
//!
//! ```text
//!  offset 0          64          128                      threads*64     len (page multiple)
//!  +----------------+-----------+--- ... ---+------------+--------------+
//!  | thread 0: seq  | thread 1  |           | thread T-1 | (unused)     |
//!  | u64, 56 B pad  |           |           |            |              |
//!  +----------------+-----------+--- ... ---+------------+--------------+
//! ```
//!
//! A record's `seq` is written only by its handler thread: odd while the thread works on a
//! request, even between requests, one more at each change. The agent reads it: a record
//! that stays odd and unchanged past the chain's limit is a thread stuck in one request.
//! The geometry (how many threads) comes from the plan on both sides; the instance checks
//! that the memfd is at least that long before it maps it.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use crate::region::Region;
use crate::sync::{AtomicU64, Ordering};
use crate::PoolError;

/// Bytes per thread record: a cache line, so handler threads do not share one.
pub const PROGRESS_RECORD_LEN: usize = 64;

/// Most handler threads one instance can have records for (the spec's `concurrency`
/// limit, which is a `u16`).
const MAX_THREADS: usize = u16::MAX as usize;

/// One instance's progress records (see the module docs).
pub struct Progress {
    region: Region,
    threads: usize,
}

impl Progress {
    /// Bytes of the region for `threads` records: whole pages.
    pub fn len_for(threads: usize) -> usize {
        (threads.clamp(1, MAX_THREADS) * PROGRESS_RECORD_LEN).next_multiple_of(4096)
    }

    /// Creates the records of an instance with `threads` handler threads, all idle (the
    /// agent, once per instance start).
    pub fn create(name: &str, threads: usize) -> Result<Self, PoolError> {
        let threads = Self::check(threads)?;
        let region = Region::create(name, Self::len_for(threads), false)?;
        Ok(Self { region, threads })
    }

    /// Maps the records handed over as `fd` for `threads` handler threads (the number the
    /// plan gives). Refuses a region that is too short or not writable.
    pub fn attach(fd: OwnedFd, threads: usize) -> Result<Self, PoolError> {
        let threads = Self::check(threads)?;
        let region = Region::attach(fd)?;
        if region.len() < threads * PROGRESS_RECORD_LEN || !region.writable() {
            return Err(PoolError::Geometry(format!(
                "the progress region ({} bytes, {}) does not hold {threads} writable thread \
                 records",
                region.len(),
                if region.writable() {
                    "writable"
                } else {
                    "read-only"
                }
            )));
        }
        Ok(Self { region, threads })
    }

    fn check(threads: usize) -> Result<usize, PoolError> {
        if (1..=MAX_THREADS).contains(&threads) {
            Ok(threads)
        } else {
            Err(PoolError::Geometry(format!(
                "{threads} handler threads: between 1 and {MAX_THREADS}"
            )))
        }
    }

    /// The memfd, to hand to the instance.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.region.fd()
    }

    /// The memfd, owned (for a child's hand-over set).
    pub fn try_clone_fd(&self) -> std::io::Result<OwnedFd> {
        self.region.fd().try_clone_to_owned()
    }

    /// How many thread records.
    pub fn threads(&self) -> usize {
        self.threads
    }

    fn record(&self, thread: usize) -> Option<&AtomicU64> {
        if thread >= self.threads {
            return None;
        }
        // SAFETY: `thread < threads` and the region holds at least `threads` records of
        // PROGRESS_RECORD_LEN bytes (checked at create and attach), so the 8 bytes at this
        // page-aligned base plus a multiple of 64 are inside the mapping and aligned for a
        // u64; the mapping lives as long as `self`, and every access to it is atomic.
        Some(unsafe {
            &*self
                .region
                .base()
                .add(thread * PROGRESS_RECORD_LEN)
                .cast::<AtomicU64>()
        })
    }

    /// Handler thread `thread` starts on a request (its record turns odd). Out-of-range
    /// threads are not recorded.
    pub fn begin(&self, thread: usize) {
        if let Some(r) = self.record(thread) {
            // Only this thread writes the record.
            let s = r.load(Ordering::Relaxed);
            // SYNC POINT: pairs with the Acquire load in `seq` (the agent's watchdog).
            r.store((s + 1) | 1, Ordering::Release);
        }
    }

    /// Handler thread `thread` is done with its request (its record turns even).
    pub fn end(&self, thread: usize) {
        if let Some(r) = self.record(thread) {
            let s = r.load(Ordering::Relaxed);
            // SYNC POINT: pairs with the Acquire load in `seq`.
            r.store((s | 1) + 1, Ordering::Release);
        }
    }

    /// Marks `thread` busy until the guard drops (also when the handler panics).
    pub fn busy(&self, thread: usize) -> Busy<'_> {
        self.begin(thread);
        Busy {
            progress: self,
            thread,
        }
    }

    /// The record of `thread` (0 for an out-of-range thread): odd while it is in a request.
    pub fn seq(&self, thread: usize) -> u64 {
        // SYNC POINT: pairs with the Release stores in `begin` and `end`.
        self.record(thread).map_or(0, |r| r.load(Ordering::Acquire))
    }
}

impl AsFd for Progress {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd()
    }
}

/// A handler thread's request in progress; see [`Progress::busy`].
pub struct Busy<'a> {
    progress: &'a Progress,
    thread: usize,
}

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.progress.end(self.thread);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_is_odd_while_busy_and_each_request_moves_it_on() {
        let p = Progress::create("progress-test", 3).unwrap();
        assert_eq!(p.seq(1), 0);
        {
            let _b = p.busy(1);
            assert_eq!(p.seq(1), 1);
            assert_eq!(p.seq(0), 0, "other threads' records stay");
        }
        assert_eq!(p.seq(1), 2);
        p.begin(1);
        p.begin(1); // an unmatched begin (a thread that lost its end) stays odd, moves on
        assert_eq!(p.seq(1), 5);
        p.end(1);
        p.end(1);
        assert_eq!(p.seq(1), 8);
        p.begin(9); // out of range: ignored
        assert_eq!(p.seq(9), 0);
    }

    #[test]
    fn the_instance_sees_what_it_writes_through_its_own_mapping() {
        let agent = Progress::create("progress-test", 2).unwrap();
        let instance = Progress::attach(agent.try_clone_fd().unwrap(), 2).unwrap();
        instance.begin(1);
        assert_eq!(agent.seq(1), 1);
        instance.end(1);
        assert_eq!(agent.seq(1), 2);
    }

    #[test]
    fn attach_refuses_a_region_shorter_than_the_plan_says() {
        let agent = Progress::create("progress-test", 64).unwrap();
        let e = Progress::attach(agent.try_clone_fd().unwrap(), 65)
            .err()
            .expect("65 records do not fit one page");
        assert!(e.to_string().contains("does not hold 65"), "{e}");
        assert!(Progress::create("progress-test", 0).is_err());
    }
}
