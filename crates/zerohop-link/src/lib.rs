//! `zerohop-link`: daemon to daemon, the connections that carry a split replica's requests
//! between the nodes its parts run on (one persistent connection per pair of nodes, many
//! requests at once).
//!
//! [`frame`] is the wire format, [`auth`] the handshake that opens each connection (both
//! ends prove they hold the cluster's shared secret), `conn` the connections themselves:
//! [`Peers`] calls a function on another node, [`serve`] answers such calls.
//!
//! The link sits below the chain: the agent's relays call through [`Peers`], and its daemon
//! serves with a [`Handler`] that hands each [`Call`] to the chain it names. Nothing here
//! knows chains, pools or functions beyond the names and numbers a [`Call`] carries.
//!
//! Trust: a connection is authenticated once, when it opens, and not encrypted; it is
//! meant for the cluster's own network. What an authenticated peer sends is still parsed
//! as untrusted input (sizes checked before allocating, a bad frame closes the connection).
//!
//! No `unsafe`, and no system call of its own: plain TCP through tokio, any Linux.

#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod auth;
mod conn;
pub mod frame;

pub use auth::Secret;
pub use conn::{
    handler, serve, serve_with, Handler, PeerError, PeerStats, Peers, BACKLOG_ROOM, DRAIN,
    LOST_AFTER_PINGS, MAX_HANDSHAKES, MAX_IN_FLIGHT, PING_INTERVAL, SERVER_IDLE, WRITE_STALL,
};
pub use frame::{Answer, Call, Frame, FrameError, MAX_FRAME};
