//! `zerohop-agent`: runs chains on one node.
//!
//! Reads the chain spec (with `zerohop-spec`, re-exported as [`spec`]), turns it into a
//! routing plan, creates the
//! chain's pools (one per security domain) and transport, starts the gateway, spawns the
//! function instances (handing each the pools of its function's domains and its transport
//! ends as inherited file descriptors, never as a path another chain could open),
//! supervises them (a dead instance's slots are reclaimed, its in-flight requests answered
//! 502, the instance restarted with backoff), and on shutdown stops everything with nothing
//! left behind.
//!
//! Every instance is confined by the agent before its program runs (`zerohop-confine`,
//! re-exported as [`confine`]): a uid
//! of the chain's own (or a user namespace), no supplementary groups, `no_new_privs`, not
//! dumpable, a seccomp allow-list, an allow-listed environment, only the hand-over
//! descriptors, its own process group and cgroup, and a parent-death signal; a watchdog
//! kills instances that hang on a request (`watchdog`).
//!
//! The gateway runs inside the agent process, so crash handling needs no extra hop.
//!
//! No `unsafe` here: the system calls that confine an instance are `zerohop-confine`'s.

#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod api;
mod chain;
pub mod daemon;
mod enforcer;
pub mod logs;
mod offence;
mod parties;
pub mod relay;
mod scale;
mod shared;
pub mod split;
mod status;
mod supervise;
mod update;
mod watchdog;

pub use chain::{up, up_with, AgentError, Inherit, Running, UpOptions};
pub use confine::{CgroupMode, UidRange};
pub use status::{ChainView, ScaleError};
pub use zerohop_confine as confine;
pub use zerohop_spec as spec;
pub use zerohop_spec::plan_from_spec;
