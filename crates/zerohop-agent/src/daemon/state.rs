//! The daemon's state ([`Daemon`]): its options and its table of hosted chains, and what
//! reads them (the chains' views, `zerohop ls`, `zerohop status`, `GET /v1/daemon`).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::error::DaemonError;
use super::host::Hosted;
use super::options::DaemonOptions;
use crate::api::{ChainStatus, ChainSummary};
use crate::ChainView;

/// The daemon's state: its chains.
pub struct Daemon {
    pub(super) opts: DaemonOptions,
    chains: Mutex<BTreeMap<String, Hosted>>,
    /// One apply or down at a time (they are rare; status reads never wait for them).
    pub(super) changing: tokio::sync::Mutex<()>,
    metrics_url: Mutex<Option<String>>,
    started: Instant,
    /// How its chains reach peer daemons (set by [`run_with`](super::run_with) when peers are
    /// configured).
    pub(super) link: std::sync::OnceLock<crate::relay::Link>,
}

impl Daemon {
    /// A daemon with no chains yet.
    pub fn new(opts: DaemonOptions) -> Arc<Self> {
        Arc::new(Self {
            opts,
            chains: Mutex::new(BTreeMap::new()),
            changing: tokio::sync::Mutex::new(()),
            metrics_url: Mutex::new(None),
            started: Instant::now(),
            link: std::sync::OnceLock::new(),
        })
    }

    /// The options it runs with.
    pub fn options(&self) -> &DaemonOptions {
        &self.opts
    }

    /// Seconds since the daemon started.
    pub fn uptime_s(&self) -> u64 {
        self.started.elapsed().as_secs()
    }

    pub(crate) fn set_metrics_url(&self, url: Option<String>) {
        *self.metrics_url.lock().unwrap_or_else(|p| p.into_inner()) = url;
    }

    /// The Prometheus endpoint, once it listens.
    pub fn metrics_url(&self) -> Option<String> {
        self.metrics_url
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub(super) fn table(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Hosted>> {
        self.chains.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Handles on every running chain, by name.
    pub fn views(&self) -> Vec<ChainView> {
        self.table().values().map(|h| h.view.clone()).collect()
    }

    /// The chain named `name`.
    pub fn view(&self, name: &str) -> Result<ChainView, DaemonError> {
        self.table()
            .get(name)
            .map(|h| h.view.clone())
            .ok_or_else(|| DaemonError::NoChain(name.to_owned()))
    }

    /// `zerohop ls`.
    pub fn list(&self) -> Vec<ChainSummary> {
        self.views()
            .iter()
            .map(|v| {
                let s = v.status();
                ChainSummary {
                    name: s.name,
                    listeners: s.listeners,
                    functions: s.functions.len(),
                    instances: s.functions.iter().map(|f| f.ready).sum(),
                    ok: s.gateway.ok,
                    errors: s.gateway.errors,
                    uptime_s: s.uptime_s,
                }
            })
            .collect()
    }

    /// `zerohop status NAME`.
    pub fn status(&self, name: &str) -> Result<ChainStatus, DaemonError> {
        let mut s = self.view(name)?.status();
        s.metrics_url = self.metrics_url();
        Ok(s)
    }

    /// `GET /v1/daemon`.
    pub fn describe(&self) -> crate::api::DaemonStatus {
        crate::api::DaemonStatus {
            pid: std::process::id(),
            version: env!("CARGO_PKG_VERSION").into(),
            socket: self.opts.socket.display().to_string(),
            metrics_url: self.metrics_url(),
            chains: self.table().len(),
        }
    }
}
