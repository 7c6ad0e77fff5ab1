//! Why the daemon refused a request or could not start ([`DaemonError`]), and the HTTP
//! status each reason maps to.

use std::io;
use std::net::SocketAddr;

use super::admin::socket::AdminSocketError;
use crate::spec;
use crate::AgentError;

/// Why the daemon refused a request; maps to one HTTP status.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// The request was malformed (400).
    #[error("{0}")]
    BadRequest(String),
    /// The spec is invalid (422).
    #[error(transparent)]
    Spec(#[from] spec::SpecError),
    /// No chain of that name (404).
    #[error("no chain named '{0}' runs here; `zerohop ls` lists them")]
    NoChain(String),
    /// The request conflicts with what runs (409).
    #[error("{0}")]
    Conflict(String),
    /// The chain could not be brought up or changed (500).
    #[error("{0}")]
    Agent(#[from] AgentError),
    /// Something else failed (500).
    #[error("{0}")]
    Internal(String),
    /// A running chain's listening sockets could not be handed over to the chain replacing
    /// it (500).
    #[error("chain '{chain}': cannot hand its sockets over to a new chain: {source}")]
    HandOver {
        /// The running chain.
        chain: String,
        /// Why.
        source: io::Error,
    },
    /// The thread a chain runs on could not be started (500).
    #[error("cannot start the chain's thread: {0}")]
    ChainThread(#[source] io::Error),
    /// The daemon cannot listen for peer daemons on the address it was given.
    #[error("cannot listen for peer daemons on {addr}: {source}; pick another with --peer-listen")]
    PeerListen {
        /// The address (`--peer-listen`).
        addr: SocketAddr,
        /// Why.
        source: io::Error,
    },
    /// The daemon cannot serve metrics on the address it was given.
    #[error("cannot listen for metrics on {addr}: {source}; pick another with --metrics")]
    MetricsListen {
        /// The address (`--metrics`).
        addr: SocketAddr,
        /// Why.
        source: io::Error,
    },
    /// The metrics listener's own address could not be read.
    #[error("cannot read the metrics listener's address: {0}")]
    MetricsAddress(#[source] io::Error),
    /// The admin socket could not be made; each reason says what to do.
    #[error(transparent)]
    AdminSocket(#[from] AdminSocketError),
    /// The thread peer connections run on could not be started.
    #[error("cannot start the peer thread: {0}")]
    PeerThread(#[source] io::Error),
}

impl DaemonError {
    /// The HTTP status of this error.
    pub fn status(&self) -> u16 {
        match self {
            DaemonError::BadRequest(_) => 400,
            DaemonError::NoChain(_) => 404,
            DaemonError::Conflict(_) => 409,
            DaemonError::Spec(_) => 422,
            DaemonError::Agent(AgentError::Spec(_)) => 422,
            DaemonError::Agent(_)
            | DaemonError::Internal(_)
            | DaemonError::HandOver { .. }
            | DaemonError::ChainThread(_)
            | DaemonError::PeerListen { .. }
            | DaemonError::MetricsListen { .. }
            | DaemonError::MetricsAddress(_)
            | DaemonError::AdminSocket(_)
            | DaemonError::PeerThread(_) => 500,
        }
    }
}
