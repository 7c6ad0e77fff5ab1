//! `boutique-load`: the original's load generator (locust, `locustfile.py`) as a closed
//! loop: `concurrency` users, each with its own cookies (the session the frontend gives it)
//! and keep-alive connection, run the original's tasks by its weights (index 1, setCurrency
//! 2, browseProduct 10, addToCart 2, viewCart 3, checkout 1) over the original frontend's
//! interface with no think time, for `duration`. Every answer is checked ([`user`]); a run
//! with errors is a failed run. Latencies go into HDR histograms per route ([`report`]): a
//! followed redirect counts as a request of the route it leads to.
//!
//! The users share one thread (a tokio current-thread runtime), so the generator takes at
//! most one core of the machine it measures.

pub mod report;
pub mod user;

use std::cell::RefCell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use report::{Report, Stats};
use user::{Target, User};

use crate::rng::Rng;

/// How to run.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// Base URL of the frontend, `http://HOST:PORT`.
    pub url: String,
    /// How long users start new tasks.
    pub duration: Duration,
    /// Users.
    pub concurrency: usize,
    /// Seed of the users' choices (sessions are fresh every run).
    pub seed: u64,
    /// Print progress to stderr this often (`None`: never).
    pub progress: Option<Duration>,
}

/// Why a run could not start.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The URL is not `http://HOST:PORT`.
    #[error("--url {0:?}: expected http://HOST:PORT")]
    BadUrl(String),
    /// No users.
    #[error("--concurrency must be at least 1")]
    NoUsers,
    /// The runtime could not start.
    #[error("starting the runtime: {0}")]
    Runtime(std::io::Error),
}

fn target(url: &str) -> Result<Target, LoadError> {
    let bad = || LoadError::BadUrl(url.to_owned());
    let uri: http::Uri = url.parse().map_err(|_| bad())?;
    if uri.scheme_str() != Some("http") || !matches!(uri.path(), "" | "/") {
        return Err(bad());
    }
    let authority = uri.authority().ok_or_else(bad)?;
    let port = authority.port_u16().unwrap_or(80);
    Ok(Target {
        addr: format!("{}:{port}", authority.host()),
        host: authority.as_str().to_owned(),
    })
}

/// Runs the load and returns what it counted.
pub fn run(opts: &LoadOptions) -> Result<Report, LoadError> {
    if opts.concurrency == 0 {
        return Err(LoadError::NoUsers);
    }
    let target = Rc::new(target(&opts.url)?);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(LoadError::Runtime)?;
    let stats = Rc::new(RefCell::new(Stats::default()));
    let local = tokio::task::LocalSet::new();
    let mut seeds = Rng::new(opts.seed);
    let start = Instant::now();
    let deadline = start + opts.duration;
    local.block_on(&rt, async {
        let users: Vec<_> = (0..opts.concurrency)
            .map(|_| {
                // Each user's session is the frontend's (a new one per user and run).
                let user = User::new(Rng::new(seeds.next_u64()), target.clone(), stats.clone());
                tokio::task::spawn_local(user.run(deadline))
            })
            .collect();
        let progress = opts.progress.map(|every| {
            let stats = stats.clone();
            tokio::task::spawn_local(async move {
                let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
                loop {
                    tick.tick().await;
                    let s = stats.borrow();
                    let t = start.elapsed().as_secs_f64();
                    eprintln!(
                        "boutique-load: {t:5.0} s {:>9} requests {:>8.0} req/s {:>6} errors",
                        s.requests(),
                        s.requests() as f64 / t,
                        s.errors()
                    );
                }
            })
        });
        for u in users {
            // A user that panicked is a bug; its requests are counted already.
            let _ = u.await;
        }
        if let Some(p) = progress {
            p.abort();
        }
    });
    let elapsed = start.elapsed();
    let stats = stats.borrow();
    Ok(Report::new(
        &opts.url,
        elapsed,
        opts.concurrency,
        opts.seed,
        &stats,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_host_and_port() {
        let t = target("http://127.0.0.1:8080").unwrap();
        assert_eq!(
            (t.addr.as_str(), t.host.as_str()),
            ("127.0.0.1:8080", "127.0.0.1:8080")
        );
        assert_eq!(target("http://localhost/").unwrap().addr, "localhost:80");
        assert!(target("https://x:1").is_err());
        assert!(target("http://x:1/cart").is_err());
        assert!(target("nonsense").is_err());
    }
}
