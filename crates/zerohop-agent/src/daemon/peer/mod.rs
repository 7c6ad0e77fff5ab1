//! Daemon to daemon: the connections that carry a split replica's requests between the nodes
//! its parts run on (one persistent connection per pair of nodes, many requests at once).
//!
//! [`frame`] is the wire format, [`auth`] the handshake that opens each connection (both
//! ends prove they hold the cluster's shared secret), [`conn`] the connections themselves:
//! [`conn::Peers`] calls a function on another node, [`conn::serve`] answers such calls.
//!
//! Trust: a connection is authenticated once, when it opens, and not encrypted; it is
//! meant for the cluster's own network. What an authenticated peer sends is still parsed
//! as untrusted input (sizes checked before allocating, a bad frame closes the connection).

pub mod auth;
pub mod conn;
pub mod frame;
