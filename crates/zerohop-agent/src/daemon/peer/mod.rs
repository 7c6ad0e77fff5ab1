//! Daemon to daemon: the connections that carry a split replica's requests between the nodes
//! its parts run on (one persistent connection per pair of nodes, many requests at once).
//!
//! [`frame`] is the wire format.

pub mod frame;
