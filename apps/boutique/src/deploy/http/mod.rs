//! The HTTP microservice deployment: each service its own process, an HTTP/1.1 server
//! (hyper) on a free 127.0.0.1 port, calling the others with a keep-alive client (hyper-util's
//! pooled client, `TCP_NODELAY`). What a deployment of the original demo looks like on one
//! node, with gRPC replaced by HTTP/1.1 and JSON.
//!
//! * [`supervisor`]: `boutique-http` starts the ten processes (callees first, so each is
//!   told its callees' URLs), prints the frontend's URL, and stops them all on SIGINT or
//!   SIGTERM, or when one of them exits. Each child dies with it (`PR_SET_PDEATHSIG`).
//! * [`server`]: one service's process. Every service but the frontend answers `POST` on
//!   any path with the call's JSON output; the frontend answers the page routes.
//! * [`client`]: calls from one process to the others.
//!
//! Each process runs one thread (a tokio current-thread runtime): a service is one event
//! loop, as a zerohop function with `concurrency: 1` is one handler thread. The cart keeps
//! carts in its process's memory ([`MemStore`]), lost when it stops, as the chain's store
//! is lost with the chain.

pub mod client;
pub mod server;
pub mod supervisor;

use std::collections::HashMap;
use std::sync::Mutex;

use crate::rpc::{Service, ServiceError, Store, Update};

/// Why the HTTP deployment could not run.
#[derive(Debug, thiserror::Error)]
pub enum DeployError {
    /// A system call or I/O failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The failure.
        source: std::io::Error,
    },
    /// A service did not report its address in time.
    #[error("{service} did not start: {detail}")]
    NotReady {
        /// The service.
        service: Service,
        /// What was seen instead.
        detail: String,
    },
    /// A service exited while the deployment ran.
    #[error("{service} exited ({status}); stopped the others")]
    Exited {
        /// The service.
        service: Service,
        /// Its exit status.
        status: String,
    },
    /// A service was started without the address of a service it calls.
    #[error("{service} calls {missing}: pass --peer {missing}=URL")]
    MissingPeer {
        /// The service started.
        service: Service,
        /// The callee without an address.
        missing: Service,
    },
    /// The parent that started this service is already gone.
    #[error("the supervisor (pid {0}) is gone; exiting")]
    Orphan(u32),
}

impl DeployError {
    pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Self {
        let what = what.into();
        move |source| DeployError::Io { what, source }
    }
}

/// A [`Store`] in this process's memory.
#[derive(Debug, Default)]
pub struct MemStore {
    map: Mutex<HashMap<Vec<u8>, Vec<u8>>>,
}

impl Store for MemStore {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, ServiceError> {
        let map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        Ok(map.get(key).cloned())
    }

    fn update(&self, key: &[u8], f: &mut Update<'_>) -> Result<Option<Vec<u8>>, ServiceError> {
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        let new = f(map.get(key).map(Vec::as_slice));
        match &new {
            Some(v) => map.insert(key.to_vec(), v.clone()),
            None => map.remove(key),
        };
        Ok(new)
    }
}
