//! The chain spec and the plan derived from it, as data: what a chain is made of (its
//! functions, routes, pools and limits) and what every party of a running chain is told
//! ([`Plan`]). No system calls and no async runtime: the agent, the CLI, the Kubernetes
//! controller and the fuzz targets read and check specs with this crate alone.

mod backend;
pub mod derive;
pub mod plan;
mod read;
pub mod syscalls;

pub use backend::Backend;
pub use derive::{plan_from_spec, reserved};
pub use read::*;

pub use plan::{
    Domain, FunctionPlan, Hop, JoinPolicy, Plan, PoolPlan, RequestIds, RoutePlan, StatePlan,
};

/// A party's index in its chain: the gateway's threads first, then every instance.
pub type PartyId = u16;

/// The function index of the gateway in routes, edges and `next` fields.
pub const GATEWAY_FN: u8 = zerohop_pool::Descriptor::GATEWAY;
