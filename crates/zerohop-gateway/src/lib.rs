//! `zerohop-gateway`: the ingress of one chain: HTTP, MQTT and CoAP.
//!
//! Does the protocol work once per request (hyper, HTTP/1.1 with keep-alive and HTTP/2, in
//! clear or over TLS with rustls; MQTT 3.1.1 and 5, in clear or over TLS; CoAP over UDP),
//! matches the route (the most specific of its method, with path parameters; see `router`),
//! copies the body into a slot (the only copy in; a body bigger than a small slot streams
//! into a slot of the domain's large pool as it arrives), sends the descriptor straight to
//! an instance of the route's head function, waits for the descriptor that comes back from
//! the last function, and writes the response from that slot (the only copy out; a large
//! answer is handed to the connection piece by piece straight from its slot).
//!
//! Every accepted request gets exactly one answer. Errors carry where they happened and map
//! to one status, with a one-line body (`ErrorSource: what`):
//!
//! | status | when |
//! |---|---|
//! | 404 | no route for the path |
//! | 405 | the path exists, the method does not (`Allow` lists the methods) |
//! | 400 | malformed request or body (hyper answers malformed framing itself), or a path parameter that is not UTF-8 or holds a line break once decoded |
//! | 408 | the body did not arrive within `body_timeout` |
//! | 413 | body over the chain's `max_body` |
//! | 431 | the headers the functions asked for do not fit the slot's metadata area |
//! | 503 | no free slot, or the head function's queue is full (`Retry-After: 1`), or it cannot be reached |
//! | 502 | a function instance crashed (or hung) with the request in hand, or answered with a status outside 200..=599 or a response header it may not set |
//! | 504 | the chain did not answer within its `timeout` |
//! | 4xx/5xx | a function returned an error |
//!
//! Whatever comes back from shared memory is input: the slot header is read once (when the
//! slot is taken) and used from that copy, the status is checked, and an answer is accepted
//! only in the very slot and generation the request was sent in (or, for a request a
//! function moved into a large slot, in a slot of its route's large pool once its own slot
//! was freed), with the request's id and route, from a function that may answer that route.
//! Anything else is dropped and counted ([`GatewayStats::refused`]); the request it claimed
//! to answer keeps waiting for its own.
//!
//! The HTTP side never blocks its runtime thread on the chain: sends never wait (a full
//! queue is a 503), a body that fits a small slot is read completely before a slot is taken
//! and a bigger one holds its large slot at most `body_timeout` (both bounded by `max_body`),
//! a client that stops reading an answer is cut after `body_timeout` without progress,
//! connections are capped at `max_connections`, and accept errors back off.
//!
//! No unsafe code.

#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod access;
mod body;
mod cloudevents;
mod coap;
mod deferred;
mod egress;
mod error;
mod grpc;
mod handle;
mod ingress;
mod mqtt;
mod response;
mod router;
mod serve;
mod stall;
mod tls;

mod group;

pub use access::{Access, AccessError};
pub use deferred::{DeadLetter, Deferred, DeferredError, DeferredStats, RESULT_PATH};
pub use egress::Receiving;
pub use group::Gateways;
pub use ingress::Reply;
pub use mqtt::{MqttIngress, MAX_TOPIC_LEVELS};
pub use serve::{
    H2_CONNECTION_WINDOW, H2_MAX_HEADER_LIST, H2_MAX_LOCAL_RESETS, H2_MAX_PENDING_RESETS,
    H2_MAX_STREAMS, H2_STREAM_WINDOW, IDLE_TIMEOUT,
};
pub use tls::{CertFiles, Tls, TlsError, HANDSHAKE_TIMEOUT};

/// What the fuzz targets (`fuzz/`) drive: the MQTT and CoAP parsers on bytes, without a
/// socket. Not an API: it changes with the targets.
#[doc(hidden)]
pub mod fuzzing {
    pub use crate::access::fuzz_jwt as jwt;
    pub use crate::coap::fuzz_datagrams as coap;
    pub use crate::grpc::fuzz_frames as grpc;
    pub use crate::mqtt::fuzz_connection as mqtt;
}

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub use error::{ErrorSource, GatewayError};
use tokio::sync::oneshot;
use zerohop_pool::{Pool, Pools};
use zerohop_transport::{PartyId, Picker, Plan, RequestIds, Sender};

use crate::egress::Outcome;
use crate::router::Router;

pub use zerohop_pool::META_RESERVE;

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
    /// Who may use each route and how often (`auth`, `rate_limit`), shared by the chain's
    /// gateway threads.
    pub access: Arc<Access>,
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
    /// Answers refused: wrong slot, generation, request, route or sender for the request
    /// they name.
    pub refused: AtomicU64,
    /// Times the receive path failed (a panic) and was restarted.
    pub receive_restarts: AtomicU64,
}

/// What the gateway remembers of a request sent into the chain.
pub(crate) struct Inflight {
    /// Where its outcome goes.
    pub tx: oneshot::Sender<Outcome>,
    /// The slot and generation it was sent in; its answer must come back in the same.
    pub slot: u32,
    pub generation: u32,
    /// The route it entered by.
    pub route: u16,
}

/// One gateway thread of a chain: a party of its own, with its own listener (SO_REUSEPORT
/// when there are several), in-flight table and inbox; see [`Gateways`].
pub struct Gateway {
    /// Its party index (`0..plan.gateways()`).
    party: PartyId,
    /// The pools of every security domain of the chain.
    pools: Pools,
    /// Per route, the pool of its domain (its small slots).
    route_pools: Vec<Arc<Pool>>,
    /// Per route, the large pool of its domain (bodies bigger than a small slot), if the
    /// chain has large pools.
    route_large: Vec<Option<Arc<Pool>>>,
    sender: Box<dyn Sender>,
    plan: Arc<Plan>,
    router: Router,
    /// Per route, the `Content-Type` of its successful answers (`content_type` in the spec).
    content_types: Vec<Option<http::HeaderValue>>,
    config: GatewayConfig,
    inflight: Mutex<HashMap<u32, Inflight>>,
    /// Requests sent so far; the request id is [`RequestIds::id`] of it.
    next_request: AtomicU32,
    /// How this chain's gateway threads number requests.
    ids: RequestIds,
    picker: Picker,
    /// Notified when a request enters an empty in-flight table (see [`Gateways::busy`]);
    /// shared by the gateways of one chain.
    became_busy: Arc<tokio::sync::Notify>,
    /// Notified when a request went to a function with no ready instance (see
    /// [`Gateways::wants_instance`]).
    wants_instance: Arc<tokio::sync::Notify>,
    /// Per route, the functions that may answer it (ascending).
    answerers: Vec<Vec<u8>>,
    stats: GatewayStats,
    /// Set when another gateway took the listeners over: every answer closes its connection
    /// (see [`Gateway::close_connections`]).
    closing: AtomicBool,
    /// The chain's async requests and retries, once the agent gives them ([`Deferred::attach`]).
    deferred: std::sync::OnceLock<Arc<Deferred>>,
    /// Small slots its answers hold while they are written, and how many they may.
    held_slots: Arc<ingress::HeldSlots>,
}

impl Gateway {
    /// A gateway for `plan`, sending with `sender` (party 0's) into `pools`: every pool of
    /// the plan ([`Plan::pool_geometry`] and [`Plan::large_pool_geometry`] of each of its
    /// [`Plan::domains`]: a route's pools are found by their first slot), or a single pool
    /// for all routes. For several gateway threads see [`Gateways::new`].
    ///
    /// # Panics
    ///
    /// If `pools` is neither a single pool nor holds each domain's small pool.
    pub fn new(
        pools: impl Into<Pools>,
        sender: Box<dyn Sender>,
        plan: Arc<Plan>,
        config: GatewayConfig,
    ) -> Arc<Self> {
        Self::party(
            0,
            pools.into(),
            sender,
            plan,
            config,
            Default::default(),
            Default::default(),
        )
    }

    /// Gateway party `party` of `plan`.
    fn party(
        party: PartyId,
        pools: Pools,
        sender: Box<dyn Sender>,
        plan: Arc<Plan>,
        config: GatewayConfig,
        became_busy: Arc<tokio::sync::Notify>,
        wants_instance: Arc<tokio::sync::Notify>,
    ) -> Arc<Self> {
        let (route_pools, route_large) = route_pools(&plan, &pools);
        let smallest = route_pools.iter().map(|p| p.slot_count()).min();
        let held_slots = ingress::HeldSlots::new(smallest.unwrap_or(1), plan.gateways());
        Arc::new(Self {
            held_slots,
            route_pools,
            route_large,
            router: Router::new(&plan),
            content_types: plan
                .routes
                .iter()
                .map(|r| {
                    http::HeaderValue::from_str(&r.content_type)
                        .ok()
                        .filter(|_| !r.content_type.is_empty())
                })
                .collect(),
            party,
            ids: plan.request_ids(),
            picker: Picker::new(&plan, party),
            answerers: (0..plan.routes.len())
                .map(|r| plan.answerers(r as u16))
                .collect(),
            pools,
            sender,
            plan,
            config,
            inflight: Mutex::new(HashMap::new()),
            became_busy,
            wants_instance,
            next_request: AtomicU32::new(0),
            stats: GatewayStats::default(),
            closing: AtomicBool::new(false),
            deferred: std::sync::OnceLock::new(),
        })
    }

    /// Winds this gateway's HTTP connections down for a gateway that took its listeners
    /// over: from now on every answer says `Connection: close` and the connection closes
    /// after it, so a keep-alive client moves to a new connection (accepted by the new
    /// gateway) between requests instead of having an idle connection closed under a request
    /// it is sending. When its serve loops are then stopped, they wait for connections to
    /// close this way (see [`Gateway::serve`]).
    pub fn close_connections(&self) {
        // Relaxed: see the loads in `ingress.rs` (a flag; the shutdown signal that follows
        // orders it for the serve loops).
        self.closing.store(true, Ordering::Relaxed);
    }

    /// Who may use each route and how often.
    pub fn access(&self) -> &Access {
        &self.config.access
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

    /// Its party index.
    pub fn party_index(&self) -> PartyId {
        self.party
    }

    /// The pools, one per security domain (and its large pool, if the chain has them).
    pub fn pools(&self) -> &Pools {
        &self.pools
    }

    /// The large pool of route `route`'s security domain: where a body bigger than a small
    /// slot goes. `None` when the chain has none (every body fits a small slot).
    pub(crate) fn large_pool(&self, route: u16) -> Option<&Arc<Pool>> {
        self.route_large.get(usize::from(route))?.as_ref()
    }

    /// The largest body a request or an answer may have (the chain's `max_body`).
    pub fn max_body(&self) -> u64 {
        self.config.max_body
    }

    /// The pool of small slots of route `route`'s security domain.
    pub(crate) fn route_pool(&self, route: u16) -> Option<&Arc<Pool>> {
        self.route_pools.get(usize::from(route))
    }

    /// Every large pool of the chain (each domain's, once).
    pub(crate) fn large_pools(&self) -> impl Iterator<Item = &Arc<Pool>> {
        self.pools.iter().filter(|p| p.releases())
    }

    /// The plan.
    pub fn plan(&self) -> &Arc<Plan> {
        &self.plan
    }

    fn count_error(&self) {
        self.stats.errors.fetch_add(1, Ordering::Relaxed);
    }
}

/// Per route of `plan`, the small pool of its security domain and its large pool (if any),
/// found in `pools` by the first slot the plan gives each (`pools` is every pool of the
/// chain); or, when `pools` is a single pool, that one for every route and no large pool.
///
/// # Panics
///
/// If a domain's small pool is not in `pools`.
fn route_pools(plan: &Plan, pools: &Pools) -> (Vec<Arc<Pool>>, Vec<Option<Arc<Pool>>>) {
    if let [only] = pools.as_slice() {
        let n = plan.routes.len();
        return (vec![only.clone(); n], vec![None; n]);
    }
    plan.route_domains()
        .into_iter()
        .map(|d| {
            let small = plan
                .pool_geometry(d)
                .and_then(|g| pools.of_slot(g.first_slot))
                .filter(|p| !p.releases())
                .unwrap_or_else(|| {
                    panic!(
                        "the gateway needs every security domain's pool: domain {d}'s is not \
                         among the {} given",
                        pools.len()
                    )
                })
                .clone();
            let large = pools.large_of(&small).cloned();
            (small, large)
        })
        .unzip()
}
