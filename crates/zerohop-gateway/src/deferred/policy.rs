//! The decisions of deferred delivery, as pure functions (tested with tables): how long to
//! wait before the next run, whether an outcome is an answer, worth another run or a dead
//! letter, and which kept results to drop.

use std::time::Duration;

use zerohop_spec::RetrySpec;

/// What to do with the outcome of one run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Keep it as the request's answer (2xx and 3xx, and client errors outside `statuses`:
    /// running the same request again would get the same 4xx).
    Answer,
    /// Run it again if the schedule allows ([`backoff`]).
    Retry,
    /// A server error outside `statuses`: straight to the dead-letter queue.
    DeadLetter,
}

/// The verdict on `status` for a route that retries the statuses in `statuses`.
pub(crate) fn classify(status: u16, statuses: &[u16]) -> Verdict {
    if statuses.contains(&status) {
        Verdict::Retry
    } else if status < 500 {
        Verdict::Answer
    } else {
        Verdict::DeadLetter
    }
}

/// The wait before run `runs + 1`, after `runs` runs (1 or more) failed with a retryable
/// status; `None`: give up (every attempt used, or the wait would reach the deadline, `left`
/// from now). Exponential with full jitter (AWS's "Exponential Backoff And Jitter"): the
/// ceiling is `backoff * 2^(runs-1)`, at most `max_backoff`, and the wait is drawn uniformly
/// from `0..=ceiling` with `rng`, so clients that failed together do not retry together.
pub(crate) fn backoff(retry: &RetrySpec, runs: u32, left: Duration, rng: u64) -> Option<Duration> {
    if runs == 0 || runs >= retry.attempts {
        return None;
    }
    let doublings = (runs - 1).min(32);
    let ceiling = retry
        .backoff
        .checked_mul(1u32 << doublings.min(31))
        .unwrap_or(retry.max_backoff)
        .min(retry.max_backoff);
    let ceiling_us = ceiling.as_micros() as u64;
    let wait = Duration::from_micros(rng % (ceiling_us + 1));
    // The next run needs time of its own after the wait.
    (wait < left).then_some(wait)
}

/// Which kept results to drop now: `finished` holds each result's finish time in ms (oldest
/// first); drops those older than `max_age_ms` at `now_ms`, then the oldest until at most
/// `max_count` remain. Returns how many to drop from the front.
pub(crate) fn expired(finished: &[u64], now_ms: u64, max_age_ms: u64, max_count: usize) -> usize {
    let old = finished
        .iter()
        .take_while(|&&t| now_ms.saturating_sub(t) > max_age_ms)
        .count();
    old.max(finished.len().saturating_sub(max_count))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn retry(attempts: u32, backoff_ms: u64, max_ms: u64) -> RetrySpec {
        RetrySpec {
            attempts,
            backoff: Duration::from_millis(backoff_ms),
            max_backoff: Duration::from_millis(max_ms),
            statuses: vec![502, 503, 504],
        }
    }

    #[test]
    fn classify_table() {
        let on = [502, 503, 504];
        for (status, want) in [
            (200, Verdict::Answer),
            (202, Verdict::Answer),
            (303, Verdict::Answer),
            (404, Verdict::Answer),
            (429, Verdict::Answer),
            (500, Verdict::DeadLetter),
            (501, Verdict::DeadLetter),
            (502, Verdict::Retry),
            (503, Verdict::Retry),
            (504, Verdict::Retry),
        ] {
            assert_eq!(classify(status, &on), want, "{status}");
        }
        // A route may retry client errors too (a 429 from a downstream limit).
        assert_eq!(classify(429, &[429]), Verdict::Retry);
        assert_eq!(classify(503, &[429]), Verdict::DeadLetter);
    }

    #[test]
    fn backoff_table() {
        let long = Duration::from_secs(3600);
        let max = u64::MAX;
        // (spec, runs so far, time left, rng, wait)
        for (r, runs, left, rng, want) in [
            // The highest draw is the ceiling: 100ms, 200ms, 400ms, ...
            (retry(5, 100, 10_000), 1, long, 100_000, Some(100_000)),
            (retry(5, 100, 10_000), 1, long, max, Some(max % 100_001)),
            (retry(5, 100, 10_000), 2, long, 200_000, Some(200_000)),
            (retry(5, 100, 10_000), 3, long, 400_000, Some(400_000)),
            // Full jitter: anything from zero.
            (retry(5, 100, 10_000), 3, long, 0, Some(0)),
            (retry(5, 100, 10_000), 3, long, 400_001, Some(0)),
            (retry(5, 100, 10_000), 3, long, 123, Some(123)),
            // Capped by max_backoff.
            (retry(20, 100, 1_000), 10, long, 1_000_000, Some(1_000_000)),
            (retry(20, 100, 1_000), 10, long, 1_000_001, Some(0)),
            // Huge run counts do not overflow.
            (retry(100, 3_600_000, 3_600_000), 99, long * 2, 5, Some(5)),
            // Every attempt used: give up.
            (retry(3, 100, 10_000), 3, long, 7, None),
            (retry(1, 100, 10_000), 1, long, 7, None),
            (retry(3, 100, 10_000), 0, long, 7, None),
            // The wait would reach the deadline: give up.
            (
                retry(5, 100, 10_000),
                1,
                Duration::from_millis(50),
                60_000,
                None,
            ),
            (
                retry(5, 100, 10_000),
                1,
                Duration::from_millis(50),
                40_000,
                Some(40_000),
            ),
            (retry(5, 100, 10_000), 1, Duration::ZERO, 0, None),
        ] {
            let got = backoff(&r, runs, left, rng).map(|d| d.as_micros() as u64);
            assert_eq!(got, want, "{r:?} runs {runs} left {left:?} rng {rng}");
        }
    }

    #[test]
    fn expired_table() {
        let hour = 3_600_000;
        for (finished, now, max_count, want) in [
            (vec![], 10 * hour, 3, 0),
            (vec![hour, 2 * hour, 3 * hour], 2 * hour, 3, 0),
            // Older than an hour.
            (vec![hour, 2 * hour, 3 * hour], 2 * hour + 1, 3, 1),
            (vec![hour, 2 * hour, 3 * hour], 5 * hour, 3, 3),
            // Over the count, oldest first.
            (vec![hour, 2 * hour, 3 * hour], 2 * hour, 1, 2),
            (vec![hour, 2 * hour, 3 * hour], 2 * hour, 0, 3),
            // Both: the larger wins.
            (vec![hour, 2 * hour, 3 * hour], 2 * hour + 1, 2, 1),
            (vec![hour, 2 * hour, 3 * hour], 3 * hour + 1, 2, 2),
        ] {
            assert_eq!(
                expired(&finished, now, hour, max_count),
                want,
                "{finished:?} at {now} keeping {max_count}"
            );
        }
    }
}
