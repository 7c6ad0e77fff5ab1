//! What a load run counts (per route: requests, errors, an HDR histogram of latencies in
//! microseconds) and how it is reported: a text table or one JSON object.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use crate::services::frontend::Route;

/// Error messages kept for the report.
const ERROR_SAMPLES: usize = 10;

/// Counters of one route.
#[derive(Clone, Debug)]
pub struct RouteStats {
    /// Requests sent (answered or not).
    pub requests: u64,
    /// Requests that failed: no answer, a status other than 200, or an answer that did not
    /// check out.
    pub errors: u64,
    /// Latency of every answered request, microseconds.
    pub latency_us: Histogram<u64>,
}

impl Default for RouteStats {
    fn default() -> Self {
        Self {
            requests: 0,
            errors: 0,
            // 1 us to 1 min, 3 significant digits.
            latency_us: Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid bounds"),
        }
    }
}

/// Everything a run counts.
#[derive(Clone, Debug, Default)]
pub struct Stats {
    /// Per route.
    pub routes: BTreeMap<Route, RouteStats>,
    /// Tasks (the locust user's actions) run, by name.
    pub tasks: BTreeMap<&'static str, u64>,
    /// The first few error messages.
    pub error_samples: Vec<String>,
}

impl Stats {
    /// Counts a request on `route`, answered after `latency` (`None`: no answer).
    pub fn request(&mut self, route: Route, latency: Option<Duration>) {
        let r = self.routes.entry(route).or_default();
        r.requests += 1;
        if let Some(l) = latency {
            r.latency_us.saturating_record(l.as_micros().max(1) as u64);
        }
    }

    /// Counts a failed request on `route`.
    pub fn error(&mut self, route: Route, message: String) {
        self.routes.entry(route).or_default().errors += 1;
        if self.error_samples.len() < ERROR_SAMPLES {
            self.error_samples.push(format!("{route}: {message}"));
        }
    }

    /// Requests so far.
    pub fn requests(&self) -> u64 {
        self.routes.values().map(|r| r.requests).sum()
    }

    /// Errors so far.
    pub fn errors(&self) -> u64 {
        self.routes.values().map(|r| r.errors).sum()
    }
}

/// One route's line of the report.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RouteReport {
    /// `METHOD /path`.
    pub route: String,
    /// Requests sent.
    pub requests: u64,
    /// Requests failed.
    pub errors: u64,
    /// Requests per second.
    pub rps: f64,
    /// Median latency, microseconds.
    pub p50_us: u64,
    /// 99th percentile latency, microseconds.
    pub p99_us: u64,
    /// Slowest answer, microseconds.
    pub max_us: u64,
}

/// A run's results.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// Base URL driven.
    pub url: String,
    /// Measured length of the run, seconds.
    pub duration_s: f64,
    /// Users (each one request at a time).
    pub concurrency: usize,
    /// Seed of the users' choices.
    pub seed: u64,
    /// Requests sent.
    pub requests: u64,
    /// Requests failed.
    pub errors: u64,
    /// Requests per second.
    pub rps: f64,
    /// Median latency over all routes, microseconds.
    pub p50_us: u64,
    /// 99th percentile latency over all routes, microseconds.
    pub p99_us: u64,
    /// Per route.
    pub routes: Vec<RouteReport>,
    /// Tasks run, by name.
    pub tasks: BTreeMap<String, u64>,
    /// The first few errors.
    pub error_samples: Vec<String>,
}

impl Report {
    /// The report of `stats` over `elapsed`.
    pub fn new(url: &str, elapsed: Duration, concurrency: usize, seed: u64, stats: &Stats) -> Self {
        let secs = elapsed.as_secs_f64().max(1e-9);
        let mut all = RouteStats::default().latency_us;
        let routes = stats
            .routes
            .iter()
            .map(|(route, r)| {
                all.add(&r.latency_us).expect("same bounds");
                RouteReport {
                    route: route.to_string(),
                    requests: r.requests,
                    errors: r.errors,
                    rps: r.requests as f64 / secs,
                    p50_us: r.latency_us.value_at_quantile(0.5),
                    p99_us: r.latency_us.value_at_quantile(0.99),
                    max_us: r.latency_us.max(),
                }
            })
            .collect();
        Self {
            url: url.to_owned(),
            duration_s: secs,
            concurrency,
            seed,
            requests: stats.requests(),
            errors: stats.errors(),
            rps: stats.requests() as f64 / secs,
            p50_us: all.value_at_quantile(0.5),
            p99_us: all.value_at_quantile(0.99),
            routes,
            tasks: stats
                .tasks
                .iter()
                .map(|(k, v)| ((*k).to_owned(), *v))
                .collect(),
            error_samples: stats.error_samples.clone(),
        }
    }

    /// The report as a table.
    pub fn to_text(&self) -> String {
        let ms = |us: u64| us as f64 / 1000.0;
        let mut s = format!(
            "boutique-load: {} for {:.1} s, {} users, seed {}\n\
             requests {}  errors {}  {:.0} req/s  p50 {:.2} ms  p99 {:.2} ms\n\n\
             {:<22} {:>9} {:>7} {:>9} {:>9} {:>9} {:>9}\n",
            self.url,
            self.duration_s,
            self.concurrency,
            self.seed,
            self.requests,
            self.errors,
            self.rps,
            ms(self.p50_us),
            ms(self.p99_us),
            "route",
            "requests",
            "errors",
            "req/s",
            "p50 ms",
            "p99 ms",
            "max ms"
        );
        for r in &self.routes {
            // Writing to a String cannot fail.
            let _ = writeln!(
                s,
                "{:<22} {:>9} {:>7} {:>9.1} {:>9.2} {:>9.2} {:>9.2}",
                r.route,
                r.requests,
                r.errors,
                r.rps,
                ms(r.p50_us),
                ms(r.p99_us),
                ms(r.max_us)
            );
        }
        let tasks: Vec<String> = self.tasks.iter().map(|(k, v)| format!("{k} {v}")).collect();
        let _ = writeln!(s, "\ntasks: {}", tasks.join(", "));
        if !self.error_samples.is_empty() {
            let _ = writeln!(s, "first errors:");
            for e in &self.error_samples {
                let _ = writeln!(s, "  {e}");
            }
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_quantiles() {
        let mut stats = Stats::default();
        for ms in 1..=100 {
            stats.request(Route::Home, Some(Duration::from_millis(ms)));
        }
        stats.request(Route::ViewCart, None);
        stats.error(Route::ViewCart, "timed out".into());
        let r = Report::new("http://x", Duration::from_secs(2), 4, 1, &stats);
        assert_eq!((r.requests, r.errors), (101, 1));
        assert!((r.rps - 50.5).abs() < 1e-9);
        let home = &r.routes[0];
        assert_eq!(home.route, "GET /");
        assert!((49_000..=51_000).contains(&home.p50_us), "{}", home.p50_us);
        assert!((98_000..=100_000).contains(&home.p99_us), "{}", home.p99_us);
        assert_eq!(r.error_samples, ["GET /cart: timed out"]);
        let back: Report = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
        assert_eq!(back, r);
        assert!(r.to_text().contains("GET /cart"));
    }
}
