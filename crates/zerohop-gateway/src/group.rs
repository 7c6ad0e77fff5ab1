//! The gateway threads of one chain, seen as one: several [`Gateway`] parties share the
//! chain's pools and plan, each with its own listener, in-flight table and inbox. A request
//! id names the gateway that sent it ([`RequestIds`](zerohop_transport::RequestIds)), so an answer never crosses
//! threads.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use zerohop_pool::{Owner, Pools};
use zerohop_transport::{PartyId, Plan, Sender};

use crate::{Gateway, GatewayConfig, GatewayStats};

/// Every gateway party of a chain (`plan.gateways()` of them).
pub struct Gateways {
    list: Vec<Arc<Gateway>>,
    became_busy: Arc<tokio::sync::Notify>,
    wants_instance: Arc<tokio::sync::Notify>,
}

impl Gateways {
    /// One gateway per sender: `senders[g]` is gateway party `g`'s. Each serves at most its
    /// share of `config.max_connections` (rounded up).
    ///
    /// # Panics
    ///
    /// If the number of senders is not `plan.gateways()`, or `pools` holds neither one pool
    /// nor one per security domain.
    pub fn new(
        pools: impl Into<Pools>,
        senders: Vec<Box<dyn Sender>>,
        plan: Arc<Plan>,
        config: GatewayConfig,
    ) -> Self {
        let pools: Pools = pools.into();
        let n = senders.len();
        assert_eq!(
            n,
            usize::from(plan.gateways()),
            "one sender per gateway party"
        );
        let config = GatewayConfig {
            max_connections: config.max_connections.div_ceil(n as u32).max(1),
            ..config
        };
        let became_busy = Arc::new(tokio::sync::Notify::new());
        let wants_instance = Arc::new(tokio::sync::Notify::new());
        let list = senders
            .into_iter()
            .enumerate()
            .map(|(g, sender)| {
                Gateway::party(
                    g as PartyId,
                    pools.clone(),
                    sender,
                    plan.clone(),
                    config.clone(),
                    became_busy.clone(),
                    wants_instance.clone(),
                )
            })
            .collect();
        Self {
            list,
            became_busy,
            wants_instance,
        }
    }

    /// The gateways, by party index.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<Gateway>> {
        self.list.iter()
    }

    /// Number of gateway threads.
    pub fn len(&self) -> usize {
        self.list.len()
    }

    /// Always false: a chain has at least one gateway.
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// The chain's pools.
    pub fn pools(&self) -> &Pools {
        self.list[0].pools()
    }

    /// The chain's plan.
    pub fn plan(&self) -> &Arc<Plan> {
        self.list[0].plan()
    }

    /// Requests waiting for the chain now, over all gateways.
    pub fn inflight(&self) -> usize {
        self.list.iter().map(|g| g.inflight()).sum()
    }

    /// Resolves once a request is in flight at any gateway (at once if one is now).
    pub async fn busy(&self) {
        let notified = self.became_busy.notified();
        if self.inflight() > 0 {
            return;
        }
        notified.await;
    }

    /// Resolves once a gateway sent a request to a function with no ready instance (it
    /// waits in the queue of the party chosen to be activated); a notice given while nobody
    /// waited is kept for the next call.
    pub async fn wants_instance(&self) {
        self.wants_instance.notified().await;
    }

    /// Sum of one counter over every gateway, e.g. `gws.total(|s| &s.accepted)`.
    pub fn total(&self, counter: impl Fn(&GatewayStats) -> &AtomicU64) -> u64 {
        self.list
            .iter()
            .map(|g| counter(g.stats()).load(std::sync::atomic::Ordering::Relaxed))
            .sum()
    }

    /// Called by the agent when `party` died: every gateway answers its requests the party
    /// held with 502, then the slots are freed. Returns how many requests were failed.
    pub fn party_died(&self, party: PartyId, what: &str) -> usize {
        let held = self.pools().held_by(Owner::party(party));
        let failed = self
            .list
            .iter()
            .map(|g| g.fail_held(party, &held, what))
            .sum();
        self.list[0].free_held(party, &held);
        failed
    }
}
