//! The node daemon (`zerohop agent`): hosts many chains at once, each in its own security
//! domain, and serves the admin API ([`admin`]) on a unix socket and Prometheus metrics
//! ([`metrics`]) on a TCP port.
//!
//! Each chain runs on a thread of its own (`chain-NAME`) with its own single-threaded
//! runtime: its gateway's first party, supervisors and watchdog live there, and the
//! parent-death signal of its reaper, spawner and instances follows that thread, which lives
//! exactly as long as the chain. Adding, changing or removing one chain therefore touches no
//! other: nothing is shared between chains but the daemon's table of them.
//!
//! Its parts, each depending only on those listed before it (and [`admin`] and [`metrics`]
//! on the daemon's state and errors):
//!
//! - `options`: how the daemon runs ([`DaemonOptions`], [`PeerOptions`], [`default_socket`]);
//! - `error`: why it refused a request ([`DaemonError`]);
//! - `host`: hosting one chain on a thread of its own, and stopping it;
//! - `state`: the daemon's state ([`Daemon`]), its table of chains and what reads it;
//! - `change`: `apply` (create, change in place, replace), `scale` and `down`;
//! - `logs`: a chain's log lines, followed or not;
//! - `peers`: the peer thread and the hops peer daemons relay to this node;
//! - `serve`: binding the listeners, serving until shutdown, stopping ([`run`], [`run_with`]).

pub mod admin;
mod change;
mod error;
mod host;
mod logs;
pub mod metrics;
mod options;
mod peers;
mod serve;
mod state;

pub use error::DaemonError;
pub use options::{default_socket, DaemonOptions, PeerOptions};
pub use serve::{run, run_with};
pub use state::Daemon;
