//! `zerohop-agent`: runs chains on one node.
//!
//! Parses and validates the chain spec ([`spec`]), turns it into a routing plan, creates the
//! chain's pool and transport, starts the gateway, spawns the function instances (handing
//! each the pool and its transport ends as inherited file descriptors, never as a path
//! another chain could open), supervises them (a dead instance's slots are reclaimed, its
//! in-flight requests answered 502, the instance restarted with backoff), and on shutdown
//! stops everything with nothing left behind.
//!
//! The gateway runs inside the agent process, so crash handling needs no extra hop.
//! No unsafe code.

#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod chain;
mod plan;
pub mod spec;
mod supervise;

pub use chain::{up, AgentError, Running, UpOptions};
pub use plan::plan_from_spec;
