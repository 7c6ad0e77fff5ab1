//! Busy CPU work standing in for a function's real processing.
//!
//! [`burn`] runs a hash chain until this thread has used the asked CPU time, measured with
//! `CLOCK_THREAD_CPUTIME_ID`, so time spent preempted on a busy machine does not count: every
//! deployment pays the same CPU per request, whatever else runs. If the thread clock cannot be
//! read (never seen on Linux), it falls back to wall-clock time.

use std::time::{Duration, Instant};

use nix::time::{clock_gettime, ClockId};

/// Hash rounds between two looks at the clock (a few microseconds of work).
const ROUNDS_PER_CHECK: u32 = 512;

/// Burns `cpu` of this thread's CPU time mixing `seed`; returns the hash (so the work cannot
/// be optimised away). Zero returns at once.
pub fn burn(cpu: Duration, seed: u64) -> u64 {
    let mut h = seed ^ 0x9e37_79b9_7f4a_7c15;
    if cpu.is_zero() {
        return h;
    }
    let wall = Instant::now();
    let start = thread_cpu();
    loop {
        for _ in 0..ROUNDS_PER_CHECK {
            // splitmix64's finaliser: cheap, and the compiler cannot skip it.
            h = h.wrapping_add(0x9e37_79b9_7f4a_7c15);
            h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            h ^= h >> 31;
        }
        let used = match (start, thread_cpu()) {
            (Some(a), Some(b)) => b.saturating_sub(a),
            _ => wall.elapsed(),
        };
        if used >= cpu {
            return std::hint::black_box(h);
        }
    }
}

/// CPU time this thread has used.
fn thread_cpu() -> Option<Duration> {
    clock_gettime(ClockId::CLOCK_THREAD_CPUTIME_ID)
        .ok()
        .map(Duration::from)
}

/// A duration in microseconds from the environment variable `name`, or `default`; a value
/// that is not a number is an error naming the variable.
pub fn micros_from_env(name: &str, default: u64) -> Result<Duration, String> {
    from_env(name, default, Duration::from_micros, "microseconds")
}

/// A duration in milliseconds from the environment variable `name`, or `default`; a value
/// that is not a number is an error naming the variable.
pub fn millis_from_env(name: &str, default: u64) -> Result<Duration, String> {
    from_env(name, default, Duration::from_millis, "milliseconds")
}

fn from_env(
    name: &str,
    default: u64,
    unit: fn(u64) -> Duration,
    unit_name: &str,
) -> Result<Duration, String> {
    match std::env::var(name) {
        Err(_) => Ok(unit(default)),
        Ok(v) => v
            .trim()
            .parse::<u64>()
            .map(unit)
            .map_err(|_| format!("{name}={v:?} is not a number of {unit_name}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn burn_uses_at_least_the_asked_cpu_time() {
        let before = thread_cpu().expect("thread clock");
        burn(Duration::from_millis(3), 1);
        let used = thread_cpu().unwrap() - before;
        assert!(used >= Duration::from_millis(3), "{used:?}");
    }

    #[test]
    fn zero_work_returns_at_once_and_depends_on_the_seed() {
        assert_ne!(burn(Duration::ZERO, 1), burn(Duration::ZERO, 2));
    }
}
