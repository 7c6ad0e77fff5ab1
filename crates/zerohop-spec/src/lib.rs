//! The chain spec and the plan derived from it, as data: what a chain is made of (its
//! functions, routes, pools and limits) and what every party of a running chain is told
//! ([`Plan`]). No system calls and no async runtime: the agent, the CLI, the Kubernetes
//! controller and the fuzz targets read and check specs with this crate alone.

#[cfg(feature = "reader")]
pub mod access;
mod backend;
pub mod cpus;
pub mod delivery;
pub mod derive;
#[cfg(feature = "reader")]
mod functions;
#[cfg(feature = "reader")]
mod fuse;
#[cfg(feature = "reader")]
mod graph;
pub mod handover;
pub mod meta;
#[cfg(feature = "reader")]
mod paths;
pub mod plan;
#[cfg(feature = "reader")]
mod read;
#[cfg(feature = "reader")]
mod routes;
#[cfg(feature = "reader")]
mod storage;
pub mod syscalls;
#[cfg(all(test, feature = "reader"))]
mod tests;
#[cfg(feature = "reader")]
mod tls;
mod types;
mod units;
#[cfg(feature = "reader")]
mod yaml;

pub use backend::Backend;
pub use delivery::{DeliverySpec, RetrySpec};
pub use derive::{plan_from_spec, reserved};
#[cfg(feature = "reader")]
pub use read::{load, parse};
#[cfg(feature = "reader")]
pub use routes::{check_grpc_method, check_topic};
pub use types::*;
pub use units::{parse_cpu, parse_duration, parse_size};

pub use plan::{
    Domain, FunctionPlan, Hop, JoinPolicy, Plan, PlanError, PoolPlan, RequestIds, RoutePlan,
    StatePlan,
};

/// Most levels of an MQTT topic name or filter (the gateway's broker holds the same bound).
pub const MAX_TOPIC_LEVELS: usize = 32;

/// A party's index in its chain: the gateway's threads first, then every instance.
pub type PartyId = u16;

/// The function index of the gateway in routes, edges and `next` fields.
pub const GATEWAY_FN: u8 = zerohop_pool::Descriptor::GATEWAY;
