//! The one place atomics come from. Under `cfg(loom)` they are loom's model-checked types, so
//! the allocator and the ring can be explored by `RUSTFLAGS="--cfg loom" cargo test`.
//!
//! Shared-memory code must never name `core::sync::atomic` directly: the region casts below
//! rely on the std types having the layout of the plain integer, which loom's do not, so the
//! mmap-backed parts are compiled only without loom.

#[cfg(loom)]
pub use loom::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
#[cfg(not(loom))]
pub use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

/// Spin-loop hint, a yield point under loom so that spinning models terminate.
#[inline]
pub fn spin_hint() {
    #[cfg(loom)]
    loom::thread::yield_now();
    #[cfg(not(loom))]
    std::hint::spin_loop();
}
