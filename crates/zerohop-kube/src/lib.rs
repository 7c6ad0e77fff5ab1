//! zerohop on Kubernetes.
//!
//! The API server stores what should run, a controller decides where, and the zerohop daemon
//! on each node makes it so:
//!
//! - [`resources`]: the `zerohop.dev/v1alpha1` kinds: `Chain` (a chain spec plus replicas and
//!   placement, written by users) and `ChainPart` (one replica, or one part of a split
//!   replica, placed on one node by the controller).
//! - [`placement`]: where parts go, as a pure function of nodes and existing parts.
//!
//! No `unsafe`: this crate only talks to the API server and to the daemon's own API.
//! The manifests that install it are in `deploy/kubernetes/`; `docs/kubernetes.md` is the
//! user's guide.

#![forbid(unsafe_code)]

pub mod placement;
pub mod resources;
