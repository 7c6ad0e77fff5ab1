//! Token buckets: `requests` per `per`, up to `burst` at once; one for a route, or one per
//! client of it, in a table of bounded size.
//!
//! [`take`] is the decision, a pure function of the bucket and the time, so it is tested
//! with tables; [`Limiter`] only keeps buckets and the clock.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use zerohop_spec::RateLimitSpec;

/// Most clients a per-client limit remembers at once. When full, the buckets that are full
/// again (their clients idle long enough to have their whole burst back) are dropped, which
/// forgets nothing that matters; if none is, the newcomer shares one overflow bucket.
pub(crate) const MAX_CLIENTS: usize = 65_536;

/// A bucket: tokens now (fractions count) and when they were counted.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Bucket {
    pub tokens: f64,
    pub at: Instant,
}

/// The rate of a bucket.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Rate {
    /// Tokens added per second.
    pub per_second: f64,
    /// Most tokens it holds.
    pub burst: f64,
}

impl Rate {
    pub(crate) fn of(spec: &RateLimitSpec) -> Self {
        Self {
            per_second: f64::from(spec.requests) / spec.per.as_secs_f64(),
            burst: f64::from(spec.burst),
        }
    }

    /// A bucket filled to its burst at `now`.
    pub(crate) fn full(&self, now: Instant) -> Bucket {
        Bucket {
            tokens: self.burst,
            at: now,
        }
    }
}

/// Takes one token from `bucket` at `now`: the bucket afterwards, or, when it is empty, how
/// long until it holds a token again (the bucket is refilled to `now` either way).
pub(crate) fn take(bucket: Bucket, now: Instant, rate: Rate) -> (Bucket, Result<(), Duration>) {
    let tokens = level(bucket, now, rate);
    if tokens >= 1.0 {
        return (
            Bucket {
                tokens: tokens - 1.0,
                at: now,
            },
            Ok(()),
        );
    }
    let wait = (1.0 - tokens) / rate.per_second;
    (
        Bucket { tokens, at: now },
        Err(Duration::from_secs_f64(wait)),
    )
}

/// The tokens `bucket` holds at `now` (a clock that went back adds none).
fn level(bucket: Bucket, now: Instant, rate: Rate) -> f64 {
    let elapsed = now.saturating_duration_since(bucket.at).as_secs_f64();
    (bucket.tokens + elapsed * rate.per_second).min(rate.burst)
}

/// The buckets of one route's limit.
pub(crate) struct Limiter {
    rate: Rate,
    per_client: bool,
    buckets: Mutex<Buckets>,
}

struct Buckets {
    route: Bucket,
    clients: HashMap<String, Bucket>,
    /// Shared by the clients that found the table full.
    overflow: Bucket,
    /// When the full table was last swept: at most once per [`SWEEP_EVERY`], so a stream of
    /// new clients costs a walk of the table a second, not one a request.
    swept: Option<Instant>,
}

/// How often a full client table may be swept.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

impl Limiter {
    pub(crate) fn new(spec: &RateLimitSpec) -> Self {
        let rate = Rate::of(spec);
        let now = Instant::now();
        Self {
            rate,
            per_client: spec.per_client,
            buckets: Mutex::new(Buckets {
                route: rate.full(now),
                clients: HashMap::new(),
                overflow: rate.full(now),
                swept: None,
            }),
        }
    }

    /// One request of `client` (its authenticated name, else its address): `Ok`, or how
    /// long until it may come back.
    pub(crate) fn admit(&self, client: &str) -> Result<(), Duration> {
        let now = Instant::now();
        let rate = self.rate;
        let mut b = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        let slot = if !self.per_client {
            &mut b.route
        } else {
            let due = b.swept.is_none_or(|t| now.duration_since(t) >= SWEEP_EVERY);
            if due && !b.clients.contains_key(client) && b.clients.len() >= MAX_CLIENTS {
                // Forget the clients that have their whole burst back: they lose nothing.
                b.clients.retain(|_, k| level(*k, now, rate) < rate.burst);
                b.swept = Some(now);
            }
            if b.clients.contains_key(client) || b.clients.len() < MAX_CLIENTS {
                b.clients
                    .entry(client.to_owned())
                    .or_insert_with(|| rate.full(now))
            } else {
                &mut b.overflow
            }
        };
        let (after, verdict) = take(*slot, now, rate);
        *slot = after;
        verdict
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rate(per_second: f64, burst: f64) -> Rate {
        Rate { per_second, burst }
    }

    #[test]
    fn a_bucket_gives_its_burst_then_one_token_per_interval() {
        let t0 = Instant::now();
        let r = rate(10.0, 3.0);
        let mut b = r.full(t0);
        for _ in 0..3 {
            let (next, v) = take(b, t0, r);
            assert_eq!(v, Ok(()));
            b = next;
        }
        let (next, v) = take(b, t0, r);
        let wait = v.unwrap_err();
        assert!((wait.as_secs_f64() - 0.1).abs() < 1e-9, "{wait:?}");
        b = next;
        // 50 ms later: half a token, still 50 ms to wait.
        let (next, v) = take(b, t0 + Duration::from_millis(50), r);
        assert!((v.unwrap_err().as_secs_f64() - 0.05).abs() < 1e-9);
        b = next;
        let (next, v) = take(b, t0 + Duration::from_millis(100), r);
        assert_eq!(v, Ok(()));
        // A long quiet time refills to the burst, no further.
        let (full, _) = take(next, t0 + Duration::from_secs(3600), r);
        assert!((full.tokens - 2.0).abs() < 1e-9, "{}", full.tokens);
    }

    #[test]
    fn a_clock_that_goes_back_adds_nothing() {
        let t0 = Instant::now() + Duration::from_secs(10);
        let r = rate(1.0, 1.0);
        let (b, v) = take(r.full(t0), t0, r);
        assert_eq!(v, Ok(()));
        let (_, v) = take(b, t0 - Duration::from_secs(5), r);
        assert!(v.is_err());
    }

    #[test]
    fn clients_have_buckets_of_their_own_and_a_route_limit_has_one() {
        let spec = |per_client| RateLimitSpec {
            requests: 1,
            per: Duration::from_secs(3600),
            burst: 2,
            per_client,
        };
        let l = Limiter::new(&spec(true));
        assert!(l.admit("a").is_ok() && l.admit("a").is_ok());
        let wait = l.admit("a").unwrap_err();
        assert!(wait > Duration::from_secs(3000), "{wait:?}");
        assert!(l.admit("b").is_ok(), "b has its own bucket");
        let l = Limiter::new(&spec(false));
        assert!(l.admit("a").is_ok() && l.admit("b").is_ok());
        assert!(l.admit("c").is_err(), "one bucket for the route");
    }

    #[test]
    fn a_full_client_table_forgets_idle_clients_and_shares_an_overflow_bucket() {
        let l = Limiter::new(&RateLimitSpec {
            requests: 1,
            per: Duration::from_secs(3600),
            burst: 1,
            per_client: true,
        });
        for i in 0..MAX_CLIENTS {
            assert!(l.admit(&format!("c{i}")).is_ok());
        }
        // Nobody is idle long enough: newcomers share the overflow bucket.
        assert!(l.admit("new1").is_ok());
        assert!(l.admit("new2").is_err());
        assert_eq!(
            l.buckets.lock().unwrap().clients.len(),
            MAX_CLIENTS,
            "the table stays bounded"
        );
    }
}
