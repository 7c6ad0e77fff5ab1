//! Random numbers for ids (orders, transactions, tracking numbers), shuffles and ad picks,
//! and for the load generator's users: SplitMix64, small and fast. Nothing here is meant to
//! be unpredictable to an attacker; ids only need to be distinct.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;

/// A SplitMix64 generator.
#[derive(Clone, Debug)]
pub struct Rng(u64);

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Rng {
    /// A generator whose sequence is fixed by `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// A generator seeded from the process-wide sequence (different per process and call).
    pub fn from_entropy() -> Self {
        Self(random_u64())
    }

    /// The next number.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(GOLDEN);
        mix(self.0)
    }

    /// A number in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0, "below(0)");
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// One element of `items` (non-empty).
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }

    /// Shuffles `items` in place (Fisher-Yates).
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            items.swap(i, j);
        }
    }
}

/// A number from a process-wide sequence seeded by the time and the pid; callable from any
/// thread.
pub fn random_u64() -> u64 {
    static STATE: OnceLock<AtomicU64> = OnceLock::new();
    let state = STATE.get_or_init(|| {
        let t = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        AtomicU64::new(mix(t ^ u64::from(std::process::id()).rotate_left(32)))
    });
    mix(state
        .fetch_add(GOLDEN, Ordering::Relaxed)
        .wrapping_add(GOLDEN))
}

/// A random id in the textual form of a version 4 UUID.
pub fn uuid() -> String {
    let (a, b) = (random_u64(), random_u64());
    let a = (a & !0xf000) | 0x4000; // version 4
    let b = (b & !(0b11 << 62)) | (0b10 << 62); // variant 1
    format!(
        "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0xffff,
        b >> 48,
        b & 0xffff_ffff_ffff
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_sequence_and_bounds_hold() {
        let (mut a, mut b) = (Rng::new(7), Rng::new(7));
        for _ in 0..100 {
            assert_eq!(a.next_u64(), b.next_u64());
            assert!(a.below(10) < 10);
            b.below(10);
        }
        let mut v: Vec<u32> = (0..20).collect();
        a.shuffle(&mut v);
        let mut sorted = v.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..20).collect::<Vec<_>>());
    }

    #[test]
    fn uuids_look_like_v4_and_differ() {
        let (x, y) = (uuid(), uuid());
        assert_ne!(x, y);
        assert_eq!(x.len(), 36);
        assert_eq!(&x[14..15], "4");
        assert!(matches!(&x[19..20], "8" | "9" | "a" | "b"), "{x}");
    }
}
