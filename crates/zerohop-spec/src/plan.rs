//! The routing plan of a chain: which function each party runs, the routes' sequences and
//! the allowed edges. The agent computes it from the spec and hands it to every party (as
//! JSON in `ZEROHOP_PLAN`); the gateway and the runtime route by it.

use serde::{Deserialize, Serialize};

use crate::{PartyId, GATEWAY_FN};

/// Why a plan handed over in `ZEROHOP_PLAN` cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// The variable's text is no plan (bad JSON, or JSON of another shape).
    #[error("invalid ZEROHOP_PLAN: {0}")]
    Json(#[source] serde_json::Error),
}

/// What a function with a static fan-out does when a branch fails.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JoinPolicy {
    /// The request fails with the first failed branch's status and message.
    #[default]
    Fail,
    /// The join handler runs with what arrived; failed branches are errors in its list.
    Join,
}

/// The shape of the chain's pools: per security domain a pool of small slots and, when the
/// chain's `max_body` does not fit a small slot, a pool of large slots for the bodies that
/// do not (`docs/protocol.md`, "Large pools"). Every domain's pools are alike but for their
/// first slot (domain `d`'s small pool starts at `d * (slots + large_slots)`, its large pool
/// right after), with a party-table entry for every party of the plan. A party maps a pool
/// only if the pool's header says the same ([`Plan::pool_geometry`],
/// [`Plan::large_pool_geometry`]; `zerohop_pool::Pool::attach`): the header is shared memory
/// every party of the domain can write, the plan is not.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolPlan {
    /// Small slots per domain.
    pub slots: u32,
    /// Bytes per small slot, slot header included.
    pub slot_size: u32,
    /// Small slots backed by huge pages (large pools never are).
    pub hugepages: bool,
    /// Large slots per domain; 0: no large pool (every body fits a small slot).
    #[serde(default)]
    pub large_slots: u32,
    /// Bytes per large slot, slot header included (a multiple of 4096); 0 with no large
    /// pool.
    #[serde(default)]
    pub large_slot_size: u32,
}

/// The chain's state store geometry (see `zerohop_pool::State`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatePlan {
    /// Keys it holds at most.
    pub entries: u32,
    /// Largest value in bytes.
    pub value_size: u32,
}

/// One function of the chain.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FunctionPlan {
    /// Name from the spec.
    pub name: String,
    /// Handler threads per instance.
    pub concurrency: u16,
    /// Function indices it may forward to by dynamic routing.
    pub next: Vec<u8>,
    /// Function indices it may call (their answers come back to the calling instance).
    #[serde(default)]
    pub calls: Vec<u8>,
    /// Branches of a static fan-out this function joins: before its handler runs, the
    /// runtime calls each with the request's body (all of them are in `calls` too).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fan_out: Vec<u8>,
    /// What a failed branch of `fan_out` means.
    #[serde(default)]
    pub join: JoinPolicy,
    /// Whether its instances map the chain's state store.
    #[serde(default)]
    pub state: bool,
    /// On the first function of a fused group: the group's functions in order, itself first
    /// (empty when it is not fused). Its instances run every step of the group, the hops
    /// between them function calls on the same slot.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fused: Vec<u8>,
    /// On the other functions of a fused group: the group's first function, whose
    /// instances run this one (it has no parties of its own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<u8>,
}

impl FunctionPlan {
    /// Handler threads an instance runs: `concurrency`, at least 1. Its progress records
    /// (`zerohop_pool::Progress`) hold one per thread, on both sides of the hand-over.
    pub fn handler_threads(&self) -> usize {
        usize::from(self.concurrency.max(1))
    }
}

/// One route into the chain.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoutePlan {
    /// HTTP method (empty: the route has no HTTP trigger).
    pub method: String,
    /// HTTP path (empty: the route has no HTTP trigger).
    pub path: String,
    /// The route is a gRPC unary method: `method` and `path` are `POST
    /// /package.Service/Method`, the body is one length-prefixed message and the answer one
    /// message with `grpc-status` trailers.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub grpc: bool,
    /// MQTT topic filter that selects this route (empty: none).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub mqtt: String,
    /// Topic an MQTT request's output is published to (empty: the message's MQTT 5
    /// response topic, if any).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub mqtt_reply: String,
    /// CoAP path that selects this route (empty: none).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub coap: String,
    /// `Content-Type` of the route's successful HTTP answers unless a function sets one
    /// (empty: none).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub content_type: String,
    /// Function indices, in order.
    pub sequence: Vec<u8>,
    /// Set on a route the agent adds for hops relayed from a peer node (a chain split over
    /// nodes): it has no trigger, its sequence is the one function the peer asked for, and
    /// its requests report route `relay_of`'s method and path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub relay_of: Option<u16>,
}

/// Everything a party needs to know about its chain.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    /// Chain name.
    pub chain: String,
    /// Transport backend name (`ring`, `socket`).
    pub transport: String,
    /// Transport tunables.
    pub spin_us: u32,
    /// Per-sender queue capacity.
    pub queue_capacity: u32,
    /// Functions, indexed by function index.
    pub functions: Vec<FunctionPlan>,
    /// Routes, indexed by route index (the `route` of a slot header).
    pub routes: Vec<RoutePlan>,
    /// Request header names (lower case) the gateway copies into every slot's metadata.
    pub headers: Vec<String>,
    /// Function index of each party: first the gateway's parties (one per gateway thread,
    /// [`GATEWAY_FN`]), then every instance.
    pub party_function: Vec<u8>,
    /// The chain's request timeout in milliseconds: how long a call waits for its answer at
    /// most.
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
    /// The chain's state store, if it has one.
    #[serde(default)]
    pub state: Option<StatePlan>,
    /// The shape of the chain's pools.
    pub pool: PoolPlan,
    /// The chain's cores, ascending; empty when it has none ([`crate::cpus`]): party `p`
    /// runs on `cpus[lane(p)]` ([`Plan::cpu_of`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cpus: Vec<u16>,
}

fn default_timeout_ms() -> u64 {
    30_000
}

/// A security domain: routes whose requests the same set of functions may touch. Each
/// domain has a pool of its own, mapped by the gateway and by those functions' instances
/// only, so a function cannot read or write the requests of a route it is not part of.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Domain {
    /// Route indices, ascending.
    pub routes: Vec<u16>,
    /// Function indices ([`Plan::answerers`] of each of its routes), ascending.
    pub functions: Vec<u8>,
}

/// How gateway threads number their requests: thread `g` of `n` numbers its `k`-th request
/// `g + n * (1 + k mod (u32::MAX / n - 1))`, so the request id alone names the thread that
/// holds the client's connection, and an answer goes straight back to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestIds {
    gateways: u32,
    /// Ids per gateway before they wrap.
    per: u32,
}

impl RequestIds {
    /// The numbering of `gateways` threads (at least 1).
    pub fn new(gateways: u16) -> Self {
        let gateways = u32::from(gateways.max(1));
        Self {
            gateways,
            per: u32::MAX / gateways - 1,
        }
    }

    /// The gateway party waiting for the answer to `request`.
    pub fn gateway_of(self, request: u32) -> PartyId {
        (request % self.gateways) as PartyId
    }

    /// The `k`-th request id of gateway party `gateway` (`k` may wrap: ids stay in the
    /// gateway's residue class, and are never 0).
    pub fn id(self, gateway: PartyId, k: u32) -> u32 {
        u32::from(gateway) + self.gateways * (1 + k % self.per)
    }
}

/// Where a request goes after a function finished with it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hop {
    /// To function `function`, now at `hop` in its route's sequence.
    Function {
        /// Function index.
        function: u8,
        /// New position in the sequence.
        hop: u8,
    },
    /// Back to the gateway.
    Gateway,
}

impl Plan {
    /// Number of parties (gateway + instances).
    pub fn parties(&self) -> u16 {
        self.party_function.len() as u16
    }

    /// Number of gateway parties (gateway threads): the leading [`GATEWAY_FN`] entries of
    /// `party_function`, at least 1.
    pub fn gateways(&self) -> u16 {
        // Party 0 is the gateway whatever the plan says (as in the transport's policy).
        1 + self
            .party_function
            .iter()
            .skip(1)
            .take_while(|&&f| f == GATEWAY_FN)
            .count() as u16
    }

    /// The lane of party `p` among the chain's cores: which of [`Plan::cpus`] it runs on;
    /// `None` without `cpus` (see [`crate::cpus::lanes`]). O(parties): for start-up, not the
    /// request path.
    pub fn lane(&self, p: PartyId) -> Option<usize> {
        crate::cpus::lane(&self.party_function, usize::from(p), self.cpus.len())
    }

    /// The core party `p` runs on, when the chain has `cpus`.
    pub fn cpu_of(&self, p: PartyId) -> Option<u16> {
        self.lane(p).map(|l| self.cpus[l])
    }

    /// How this chain's gateway threads number requests (computed once; for the request
    /// path).
    pub fn request_ids(&self) -> RequestIds {
        RequestIds::new(self.gateways())
    }

    /// The gateway party waiting for the answer to `request`; see [`RequestIds`].
    pub fn gateway_of(&self, request: u32) -> PartyId {
        self.request_ids().gateway_of(request)
    }

    /// The `k`-th request id of gateway party `gateway`; see [`RequestIds`].
    pub fn request_id(&self, gateway: PartyId, k: u32) -> u32 {
        self.request_ids().id(gateway, k)
    }

    /// The allowed edges: along every route's sequence (gateway -> head -> ... -> gateway),
    /// from every function of a sequence back to the gateway (a function may answer early,
    /// with `Reply` or an error), from every function to its dynamic `next` targets, and
    /// from those back to the gateway, and both ways between a function and those it calls
    /// (the call, and its answer).
    ///
    /// A fused group is one party on every edge: a hop inside it is no edge (a function
    /// call), an edge into it goes to its first function, an edge out of it leaves from its
    /// first function (whose instances run the group), see [`Plan::host_of`].
    pub fn edges(&self) -> Vec<(u8, u8)> {
        let mut e = Vec::new();
        for r in &self.routes {
            let mut prev = GATEWAY_FN;
            for &f in &r.sequence {
                let f = self.host_of(f);
                if !(prev == f && self.is_fused(f)) {
                    e.push((prev, f));
                }
                e.push((f, GATEWAY_FN));
                prev = f;
            }
        }
        for (i, f) in self.functions.iter().enumerate() {
            for &t in &f.next {
                e.push((i as u8, t));
                e.push((t, GATEWAY_FN));
            }
            for &c in &f.calls {
                e.push((i as u8, c));
                e.push((c, i as u8));
            }
        }
        e.sort_unstable();
        e.dedup();
        e
    }

    /// The function whose instances run function `f`: the first function of `f`'s fused
    /// group, or `f` itself (also for the gateway and unknown indices).
    pub fn host_of(&self, f: u8) -> u8 {
        self.functions
            .get(f as usize)
            .and_then(|p| p.host)
            .unwrap_or(f)
    }

    /// Whether function `f` runs a fused group (it is a group's first function).
    pub fn is_fused(&self, f: u8) -> bool {
        self.functions
            .get(f as usize)
            .is_some_and(|p| !p.fused.is_empty())
    }

    /// The fused group function `f`'s instances run, in order (`[f]` when it runs no group).
    pub fn group_of(&self, f: u8) -> Vec<u8> {
        match self.functions.get(f as usize) {
            Some(p) if !p.fused.is_empty() => p.fused.clone(),
            _ => vec![f],
        }
    }

    /// Display name of the instances of function `f`: its name, or its group's names joined
    /// by `+` (`upper+exclaim`) when it runs a fused group.
    pub fn group_name(&self, f: u8) -> String {
        self.group_of(f)
            .iter()
            .map(|&g| self.function_name(g))
            .collect::<Vec<_>>()
            .join("+")
    }

    /// Index of the function named `name`.
    pub fn function_index(&self, name: &str) -> Option<u8> {
        self.functions
            .iter()
            .position(|f| f.name == name)
            .map(|i| i as u8)
    }

    /// Display name of a function index (or "gateway").
    pub fn function_name(&self, f: u8) -> &str {
        if f == GATEWAY_FN {
            return "gateway";
        }
        self.functions
            .get(f as usize)
            .map_or("unknown", |f| f.name.as_str())
    }

    /// The hop after position `hop` of route `route` (`None` if the route does not exist).
    pub fn next_in_sequence(&self, route: u16, hop: u8) -> Option<Hop> {
        let seq = &self.routes.get(route as usize)?.sequence;
        let next = hop as usize + 1;
        Some(match seq.get(next) {
            Some(&function) => Hop::Function {
                function,
                hop: next as u8,
            },
            None => Hop::Gateway,
        })
    }

    /// Parties that run function `f` (the gateway's parties for [`GATEWAY_FN`]).
    pub fn parties_of(&self, f: u8) -> Vec<PartyId> {
        self.party_function
            .iter()
            .enumerate()
            // Party 0 is the gateway whatever the plan says (as in the transport's policy).
            .filter(|&(p, &g)| if p == 0 { f == GATEWAY_FN } else { g == f })
            .map(|(p, _)| p as PartyId)
            .collect()
    }

    /// The functions that may touch a request that entered by `route`: every function of
    /// its sequence and every function reachable from them by dynamic routing or calls (a
    /// call's slot is in the request's pool). Empty for an unknown route.
    pub fn answerers(&self, route: u16) -> Vec<u8> {
        let Some(r) = self.routes.get(route as usize) else {
            return Vec::new();
        };
        let mut out: Vec<u8> = r.sequence.clone();
        let mut i = 0;
        while i < out.len() {
            if let Some(f) = self.functions.get(out[i] as usize) {
                for &t in f.next.iter().chain(&f.calls) {
                    if !out.contains(&t) {
                        out.push(t);
                    }
                }
            }
            i += 1;
        }
        out.sort_unstable();
        out
    }

    /// The chain's security domains: routes grouped by the functions that may touch their
    /// requests (their [`answerers`](Plan::answerers)); routes with the same set share a
    /// domain. Ordered by their first route; every party computes the same list.
    pub fn domains(&self) -> Vec<Domain> {
        let mut out: Vec<Domain> = Vec::new();
        for r in 0..self.routes.len() as u16 {
            let functions = self.answerers(r);
            match out.iter_mut().find(|d| d.functions == functions) {
                Some(d) => d.routes.push(r),
                None => out.push(Domain {
                    routes: vec![r],
                    functions,
                }),
            }
        }
        out
    }

    /// Index (into [`domains`](Plan::domains)) of the domain of each route.
    pub fn route_domains(&self) -> Vec<usize> {
        let mut by_route = vec![0; self.routes.len()];
        for (i, d) in self.domains().iter().enumerate() {
            for &r in &d.routes {
                by_route[r as usize] = i;
            }
        }
        by_route
    }

    /// Indices of the domains function `f` belongs to (whose pools its instances map, in
    /// this order).
    pub fn domains_of(&self, f: u8) -> Vec<usize> {
        self.domains()
            .iter()
            .enumerate()
            .filter(|(_, d)| d.functions.contains(&f))
            .map(|(i, _)| i)
            .collect()
    }

    /// The shape of security domain `domain`'s pool of small slots (see [`PoolPlan`]);
    /// `None` when its slots would not fit a descriptor's slot numbers.
    #[cfg(not(loom))]
    pub fn pool_geometry(&self, domain: usize) -> Option<zerohop_pool::PoolGeometry> {
        let first_slot = self.domain_first_slot(domain, self.pool.slots)?;
        Some(zerohop_pool::PoolGeometry {
            slots: self.pool.slots,
            first_slot,
            slot_size: self.pool.slot_size,
            max_parties: self.parties(),
            hugepages: self.pool.hugepages,
            release: false,
        })
    }

    /// The shape of security domain `domain`'s large pool, numbered right after its small
    /// pool: sparse, never on huge pages, a freed slot's pages given back (`release`).
    /// `None` when the chain has no large pools (every body fits a small slot) or its slots
    /// would not fit a descriptor's slot numbers.
    #[cfg(not(loom))]
    pub fn large_pool_geometry(&self, domain: usize) -> Option<zerohop_pool::PoolGeometry> {
        if self.pool.large_slots == 0 || self.pool.large_slot_size == 0 {
            return None;
        }
        let first_slot = self
            .domain_first_slot(domain, self.pool.slots + self.pool.large_slots)?
            .checked_add(self.pool.slots)?;
        Some(zerohop_pool::PoolGeometry {
            slots: self.pool.large_slots,
            first_slot,
            slot_size: self.pool.large_slot_size,
            max_parties: self.parties(),
            hugepages: false,
            release: true,
        })
    }

    /// The shapes of security domain `domain`'s pools in hand-over order (`docs/protocol.md`,
    /// "Hand-over"): its small pool, then its large pool if the chain has large pools.
    /// `None` when their slots would not fit a descriptor's slot numbers.
    #[cfg(not(loom))]
    pub fn pool_geometries(&self, domain: usize) -> Option<Vec<zerohop_pool::PoolGeometry>> {
        let small = self.pool_geometry(domain)?;
        if self.pool.large_slots == 0 || self.pool.large_slot_size == 0 {
            return Some(vec![small]);
        }
        Some(vec![small, self.large_pool_geometry(domain)?])
    }

    /// First slot of domain `domain`'s small pool, if the domain's slots (ending `span`
    /// slots after it) fit the descriptor's 24-bit slot numbers.
    #[cfg(not(loom))]
    fn domain_first_slot(&self, domain: usize, span: u32) -> Option<u32> {
        let per_domain = self.pool.slots.checked_add(self.pool.large_slots)?;
        let first = u32::try_from(domain).ok()?.checked_mul(per_domain)?;
        let end = u64::from(first) + u64::from(span);
        (end <= u64::from(zerohop_pool::Descriptor::MAX_SLOT) + 1).then_some(first)
    }

    /// Serialises for `ZEROHOP_PLAN`.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a plan always serialises")
    }

    /// Parses `ZEROHOP_PLAN`.
    pub fn from_json(s: &str) -> Result<Self, PlanError> {
        serde_json::from_str(s).map_err(PlanError::Json)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_gateway_thread_gets_the_answers_to_its_own_requests() {
        for n in [1u16, 2, 3, 64] {
            let plan = Plan {
                chain: "c".into(),
                transport: "ring".into(),
                spin_us: 0,
                queue_capacity: 8,
                functions: vec![],
                routes: vec![],
                headers: vec![],
                party_function: [vec![GATEWAY_FN; n as usize], vec![0, 0]].concat(),
                cpus: Vec::new(),
                timeout_ms: 30_000,
                state: None,
                pool: PoolPlan {
                    slots: 64,
                    slot_size: 4096,
                    hugepages: false,
                    large_slots: 0,
                    large_slot_size: 0,
                },
            };
            assert_eq!(plan.gateways(), n);
            assert_eq!(plan.parties_of(GATEWAY_FN).len(), n as usize);
            assert_eq!(plan.parties_of(0), vec![n, n + 1]);
            for g in 0..n {
                let mut ids = std::collections::HashSet::new();
                for k in [0, 1, 2, 1000, u32::MAX / 2, u32::MAX - 1, u32::MAX] {
                    let id = plan.request_id(g, k);
                    assert_ne!(id, 0);
                    assert_eq!(plan.gateway_of(id), g, "n={n} g={g} k={k}");
                    ids.insert(id);
                }
                assert!(ids.len() >= 5, "ids repeat only after wrapping: {ids:?}");
            }
        }
    }

    fn hello() -> Plan {
        Plan {
            chain: "hello".into(),
            transport: "ring".into(),
            spin_us: 20,
            queue_capacity: 64,
            functions: vec![
                FunctionPlan {
                    name: "upper".into(),
                    concurrency: 1,
                    next: vec![],
                    calls: Vec::new(),
                    ..Default::default()
                },
                FunctionPlan {
                    name: "exclaim".into(),
                    concurrency: 1,
                    next: vec![],
                    calls: Vec::new(),
                    ..Default::default()
                },
            ],
            routes: vec![RoutePlan {
                method: "POST".into(),
                path: "/hello".into(),
                sequence: vec![0, 1],
                ..Default::default()
            }],
            headers: vec![],
            party_function: vec![GATEWAY_FN, 0, 1],
            cpus: Vec::new(),
            timeout_ms: 30_000,
            state: None,
            pool: PoolPlan {
                slots: 64,
                slot_size: 4096,
                hugepages: false,
                large_slots: 0,
                large_slot_size: 0,
            },
        }
    }

    #[test]
    fn edges_follow_the_sequence() {
        let p = hello();
        assert_eq!(
            p.edges(),
            vec![(0, 1), (0, GATEWAY_FN), (1, GATEWAY_FN), (GATEWAY_FN, 0)]
        );
        assert_eq!(p.answerers(0), vec![0, 1]);
        assert!(p.answerers(7).is_empty());
        assert_eq!(
            p.next_in_sequence(0, 0),
            Some(Hop::Function {
                function: 1,
                hop: 1
            })
        );
        assert_eq!(p.next_in_sequence(0, 1), Some(Hop::Gateway));
        assert_eq!(p.next_in_sequence(3, 0), None);
        assert_eq!(Plan::from_json(&p.to_json()).unwrap(), p);
        assert_eq!(
            p.domains(),
            vec![Domain {
                routes: vec![0],
                functions: vec![0, 1]
            }]
        );
    }

    #[test]
    fn routes_share_a_domain_only_with_the_same_functions() {
        let mut p = hello();
        let f = |name: &str, next: Vec<u8>| FunctionPlan {
            name: name.into(),
            concurrency: 1,
            next,
            calls: Vec::new(),
            ..Default::default()
        };
        // upper(0), exclaim(1), audit(2) -> log(3) by dynamic routing.
        p.functions = vec![
            f("upper", vec![]),
            f("exclaim", vec![]),
            f("audit", vec![3]),
            f("log", vec![]),
        ];
        let route = |path: &str, sequence: Vec<u8>| RoutePlan {
            method: "POST".into(),
            path: path.into(),
            sequence,
            ..Default::default()
        };
        p.routes = vec![
            route("/a", vec![0, 1]),
            route("/b", vec![2]),
            route("/c", vec![1, 0]),
            route("/d", vec![1]),
        ];
        let d = p.domains();
        assert_eq!(d.len(), 3);
        assert_eq!(
            (d[0].routes.clone(), d[0].functions.clone()),
            (vec![0, 2], vec![0, 1])
        );
        assert_eq!(
            (d[1].routes.clone(), d[1].functions.clone()),
            (vec![1], vec![2, 3])
        );
        assert_eq!(
            (d[2].routes.clone(), d[2].functions.clone()),
            (vec![3], vec![1])
        );
        assert_eq!(p.route_domains(), vec![0, 1, 0, 2]);
        assert_eq!(p.domains_of(1), vec![0, 2]);
        assert_eq!(p.domains_of(3), vec![1]);
        assert!(p.domains_of(9).is_empty());
    }
}
