//! The end-to-end tests that run the agent in this process (`zerohop_agent::up`), so they can
//! read what only the agent knows (its pools' owner tables, its log book, its tasks) while
//! the functions run as real processes.
//!
//! They are one test binary, not one per file: each binary links and instantiates the whole
//! agent, and seven of them cost the build minutes. They count this process's children and
//! descriptors, so every test takes [`serial`] first: one at a time, whichever file it is in.

#[path = "../common/mod.rs"]
mod common;

mod coap;
mod flood;
mod graph;
mod hostile;
mod isolation;
mod limits;
mod logs;
mod supervision;
mod up;

use std::sync::{Mutex, MutexGuard};

/// Holds every other test of this binary off while the caller runs (a failed test does not
/// stop the next).
pub fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}
