//! `zerohop-gateway`: the HTTP ingress of one chain.
//!
//! Does the protocol work once per request (hyper, HTTP/1.1 with keep-alive), matches the
//! route, copies the body into a slot (the only copy in), sends the descriptor straight to
//! an instance of the route's head function, waits for the descriptor that comes back from
//! the last function, and writes the response from that slot (the only copy out).
//!
//! Every accepted request gets exactly one answer. Errors carry where they happened and map
//! to one status, with a one-line body (`ErrorSource: what`):
//!
//! | status | when |
//! |---|---|
//! | 404 | no route for the path |
//! | 405 | the path exists, the method does not (`Allow` lists the methods) |
//! | 400 | malformed request or body (hyper answers malformed framing itself) |
//! | 413 | body over the chain's `max_body` |
//! | 431 | the headers the functions asked for do not fit the slot's metadata area |
//! | 503 | no free slot (`Retry-After: 1`), or the head function cannot be reached |
//! | 502 | a function instance crashed with the request in hand |
//! | 504 | the chain did not answer within its `timeout` |
//! | 4xx/5xx | a function returned an error |
//!
//! No unsafe code.

#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod egress;
mod error;
mod ingress;
mod router;

pub use egress::Receiving;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub use error::{ErrorSource, GatewayError};
use tokio::sync::oneshot;
use zerohop_pool::Pool;
use zerohop_transport::{Picker, Plan, Sender};

use crate::egress::Outcome;
use crate::router::Router;

/// Bytes of a slot reserved for request metadata (headers the functions asked for).
pub const META_RESERVE: usize = 1024;

/// Gateway settings from the chain spec.
#[derive(Clone, Debug)]
pub struct GatewayConfig {
    /// Largest accepted request body.
    pub max_body: u64,
    /// How long the chain may take to answer.
    pub timeout: Duration,
    /// How long a client may take to send a request's body once its headers are in.
    pub body_timeout: Duration,
    /// Most client connections open at once; further connections wait in the listen
    /// backlog until one closes.
    pub max_connections: u32,
}

impl GatewayConfig {
    /// Default [`GatewayConfig::body_timeout`].
    pub const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(10);
    /// Default [`GatewayConfig::max_connections`].
    pub const DEFAULT_MAX_CONNECTIONS: u32 = 4096;
}

/// Counters of the gateway (read by the agent and by tests).
#[derive(Debug, Default)]
pub struct GatewayStats {
    /// Requests accepted into the chain (a slot was filled and sent).
    pub accepted: AtomicU64,
    /// Answers with status 2xx from the chain.
    pub ok: AtomicU64,
    /// Requests answered with an error status (any source).
    pub errors: AtomicU64,
    /// Descriptors that came back for a request already answered (timeout, crash).
    pub late: AtomicU64,
}

/// The gateway of one chain.
pub struct Gateway {
    pool: Arc<Pool>,
    sender: Box<dyn Sender>,
    plan: Arc<Plan>,
    router: Router,
    config: GatewayConfig,
    inflight: Mutex<HashMap<u32, oneshot::Sender<Outcome>>>,
    next_request: AtomicU32,
    picker: Picker,
    stats: GatewayStats,
}

impl Gateway {
    /// A gateway for `plan`, sending with `sender` (party 0's) into `pool`.
    pub fn new(
        pool: Arc<Pool>,
        sender: Box<dyn Sender>,
        plan: Arc<Plan>,
        config: GatewayConfig,
    ) -> Arc<Self> {
        Arc::new(Self {
            router: Router::new(&plan),
            picker: Picker::new(&plan, 0),
            pool,
            sender,
            plan,
            config,
            inflight: Mutex::new(HashMap::new()),
            next_request: AtomicU32::new(1),
            stats: GatewayStats::default(),
        })
    }

    /// Counters.
    pub fn stats(&self) -> &GatewayStats {
        &self.stats
    }

    /// Requests waiting for the chain now.
    pub fn inflight(&self) -> usize {
        self.inflight
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .len()
    }

    /// The pool.
    pub fn pool(&self) -> &Arc<Pool> {
        &self.pool
    }

    /// The plan.
    pub fn plan(&self) -> &Arc<Plan> {
        &self.plan
    }

    fn count_error(&self) {
        self.stats.errors.fetch_add(1, Ordering::Relaxed);
    }
}
