//! What changes which chains the daemon runs: `zerohop apply` (a new chain, a change in
//! place, or a replacement beside the running chain), `zerohop scale` and `zerohop down`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Instant;

use super::error::DaemonError;
use super::host::{host, stop, Hosted};
use super::state::Daemon;
use crate::api::{Applied, ApplyRequest, ApplyResponse, ChainStatus, DownResponse};
use crate::spec::{self, ChainSpec};
use crate::{ChainView, UpOptions};

impl Daemon {
    /// `zerohop apply`: brings a new chain up, or changes a running one.
    pub async fn apply(&self, req: ApplyRequest) -> Result<ApplyResponse, DaemonError> {
        let path = PathBuf::from(&req.path);
        if !path.is_absolute() {
            return Err(DaemonError::BadRequest(format!(
                "the spec path `{}` must be absolute (the daemon resolves relative program paths \
                 against its folder)",
                req.path
            )));
        }
        let mut spec = spec::parse(&path, &req.text)?;
        if let Some(split) = &req.split {
            if self.link.get().is_none() {
                return Err(DaemonError::BadRequest(format!(
                    "chain '{}' is split over nodes, and this daemon has no peers (start it \
                     with --peer-secret)",
                    spec.name
                )));
            }
            spec = crate::split::split(&spec, &split.local, &split.peers).map_err(|e| {
                DaemonError::BadRequest(format!("chain '{}' cannot be split: {e}", spec.name))
            })?;
        }
        let listen =
            match &req.listen {
                Some(l) => Some(l.parse::<SocketAddr>().map_err(|_| {
                    DaemonError::BadRequest(format!("--listen `{l}` is not IP:PORT"))
                })?),
                None => None,
            };
        let _one = self.changing.lock().await;
        let name = spec.name.clone();
        let running = self
            .table()
            .get(&name)
            .map(|h| (h.view.clone(), h.spec.clone(), h.text.clone()));
        if let Some((view, old, old_text)) = running {
            if old.file != spec.file {
                return Err(DaemonError::Conflict(format!(
                    "chain '{name}' already runs from {}; apply that file, or `zerohop down                      {name}` first",
                    old.file.display()
                )));
            }
            let paths = spec
                .functions
                .iter()
                .map(|f| crate::chain::check_program(&spec, f))
                .collect::<Result<Vec<_>, _>>()?;
            let change = view.plan_update(&old, &spec, &paths).map_err(|why| {
                DaemonError::Conflict(format!(
                    "chain '{name}' cannot change while it runs: {why}; to apply this spec, \
                     `zerohop down {name}` and apply it again"
                ))
            })?;
            let plan = match change {
                crate::update::Change::InPlace(plan) => plan,
                crate::update::Change::Replace(why) => {
                    return self.replace(view, old, spec, req.text, listen, why).await;
                }
            };
            let changes = plan.changes.clone();
            let applied = if plan.is_empty() && old_text == req.text {
                Applied::Unchanged
            } else {
                for c in &changes {
                    tracing::info!(chain = %name, "updating: {c}");
                }
                view.update(&spec, plan)
                    .await
                    .map_err(|e| DaemonError::Conflict(e.to_string()))?;
                if let Some(h) = self.table().get_mut(&name) {
                    h.spec = spec;
                    h.text = req.text;
                }
                Applied::Updated
            };
            let mut status = view.status();
            status.metrics_url = self.metrics_url();
            return Ok(ApplyResponse {
                applied,
                changes,
                status,
            });
        }
        let opts = self.chain_options(listen.or(spec.listen));
        let hosted = host(spec, req.text, opts, crate::Inherit::default()).await?;
        let mut status = hosted.view.status();
        status.metrics_url = self.metrics_url();
        tracing::info!(chain = %name, "applied: {}", status.listeners.join(", "));
        self.table().insert(name, hosted);
        Ok(ApplyResponse {
            applied: Applied::Created,
            changes: Vec::new(),
            status,
        })
    }

    /// `zerohop down NAME`: stops the chain with nothing left behind.
    pub async fn down(&self, name: &str) -> Result<DownResponse, DaemonError> {
        let _one = self.changing.lock().await;
        let hosted = self
            .table()
            .remove(name)
            .ok_or_else(|| DaemonError::NoChain(name.to_owned()))?;
        let answered = {
            let s = hosted.view.status();
            s.gateway.ok + s.gateway.errors
        };
        stop(hosted, false).await;
        tracing::info!(chain = %name, "down");
        Ok(DownResponse {
            name: name.to_owned(),
            answered,
        })
    }

    /// Stops every chain (the daemon is shutting down).
    pub async fn down_all(&self) {
        let _one = self.changing.lock().await;
        let all: Vec<Hosted> = std::mem::take(&mut *self.table()).into_values().collect();
        for h in all {
            let name = h.view.name().to_owned();
            stop(h, false).await;
            tracing::info!(chain = %name, "down");
        }
    }

    /// `zerohop scale NAME FUNCTION N`.
    pub async fn scale(
        &self,
        name: &str,
        function: &str,
        instances: u16,
    ) -> Result<ChainStatus, DaemonError> {
        let view = self.view(name)?;
        let b = view
            .scale(function, instances)
            .map_err(|e| DaemonError::BadRequest(e.to_string()))?;
        tracing::info!(
            chain = name,
            function,
            "scaled: min {} (max {}, target {} in flight per instance)",
            b.min,
            b.max,
            b.target
        );
        self.status(name)
    }
}

impl Daemon {
    /// How a chain of this daemon comes up: on `listen`, else a free port of 127.0.0.1,
    /// under the daemon's uid range and cgroup mode, its output kept in its log book only.
    fn chain_options(&self, listen: Option<SocketAddr>) -> UpOptions {
        UpOptions {
            listen: listen.unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 0))),
            uid_range: self.opts.uid_range,
            cgroups: self.opts.cgroups,
            echo_logs: false,
            link: self.link.get().cloned(),
            ..UpOptions::default()
        }
    }

    /// Applies `spec` to the running chain `view` (running `old`) by replacing it: the new
    /// chain comes up beside it, taking its listeners over (see [`crate::update`]), then the
    /// old one winds down. If the new one does not come up, the old one serves on.
    async fn replace(
        &self,
        view: ChainView,
        old: ChainSpec,
        spec: ChainSpec,
        text: String,
        listen: Option<SocketAddr>,
        why: String,
    ) -> Result<ApplyResponse, DaemonError> {
        let name = spec.name.clone();
        tracing::info!(chain = %name, "replacing: {why}");
        let wanted = listen.or(spec.listen);
        let inherit =
            view.handover(&old, &spec, wanted)
                .map_err(|source| DaemonError::HandOver {
                    chain: name.clone(),
                    source,
                })?;
        let kept_address = !inherit.http.is_empty();
        let opts = self.chain_options(wanted);
        let started = Instant::now();
        let new = host(spec, text, opts, inherit).await.map_err(|e| {
            DaemonError::Conflict(format!(
                "chain '{name}' was to be replaced ({why}), but the new chain did not come \
                 up: {e}; the running chain serves on unchanged"
            ))
        })?;
        let came_up = started.elapsed();
        let old_hosted = self.table().insert(name.clone(), new);
        if let Some(h) = old_hosted {
            stop(h, true).await;
        }
        let wound_down = started.elapsed() - came_up;
        let mut changes = vec![format!(
            "replaced: {why}; the new chain came up beside the old one in {} ms{}; the old one \
             finished what it had and stopped in {} ms",
            came_up.as_millis(),
            if kept_address {
                " on the same listening sockets"
            } else {
                ""
            },
            wound_down.as_millis()
        )];
        let status = self.status(&name)?;
        if !kept_address {
            changes.push(format!(
                "the chain now listens on {}",
                status.listeners.join(", ")
            ));
        }
        tracing::info!(chain = %name, "{}", changes.join("; "));
        Ok(ApplyResponse {
            applied: Applied::Replaced,
            changes,
            status,
        })
    }
}
