//! `zerohop-link`: daemon to daemon, the connections that carry a split replica's requests
//! between the nodes its parts run on (one persistent connection per pair of nodes, many
//! requests at once).
//!
//! [`frame`] is the wire format, [`auth`] the handshake that opens each connection (both
//! ends prove they hold the cluster's shared secret); `client` and `server` are the two ends
//! of a connection, `wire` what they share (the bounded backlog of frames to write, reading
//! a frame): [`Peers`] calls a function on another node, [`serve`] answers such calls.
//!
//! ```text
//!  Peers::call ──┐                                        ┌─► handler(call) ─┐ (a task each,
//!  Peers::call ──┼─► backlog ─► writer ══ TCP ══► reader ─┼─► handler(call) ─┤  at most
//!  Peers::call ──┘   (Wire)      task          (serve)    └─► handler(call) ─┘  MAX_IN_FLIGHT)
//!       ▲                                                                    │
//!       └── pending[stream] ◄── reader ◄══ TCP ══ writer ◄── backlog ◄───────┘
//! ```
//!
//! In the daemon all of it runs on one thread of its own (the peer runtime), so a call,
//! its frame and its answer never wake another thread, and the frames made in one turn of
//! that thread leave in one write.
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

use std::sync::{Mutex, MutexGuard, PoisonError};

pub mod auth;
mod client;
pub mod frame;
mod server;
mod wire;

#[cfg(test)]
mod tests;

pub use auth::{Secret, SecretError};
pub use client::{PeerError, PeerStats, Peers, LOST_AFTER_PINGS, PING_INTERVAL};
pub use frame::{Answer, Call, Frame, FrameError, MAX_FRAME};
pub use server::{
    handler, serve, serve_with, Handler, DRAIN, MAX_HANDSHAKES, MAX_IN_FLIGHT, SERVER_IDLE,
    WRITE_STALL,
};
pub use wire::BACKLOG_ROOM;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Nothing panics while holding these locks; a poisoned one is still consistent.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
