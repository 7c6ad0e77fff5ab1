//! Hosting one chain: it comes up on a thread of its own (`chain-NAME`) with its own
//! single-threaded runtime ([`host`]), and goes down with that thread ([`stop`]).

use tokio::sync::oneshot;

use super::error::DaemonError;
use crate::spec::ChainSpec;
use crate::{up_with, AgentError, ChainView, UpOptions};

/// One chain the daemon runs.
pub(super) struct Hosted {
    pub(super) view: ChainView,
    pub(super) spec: ChainSpec,
    /// The spec's text when it was applied (an identical re-apply changes nothing).
    pub(super) text: String,
    /// Tells the chain's thread to shut the chain down: at once (`false`), or winding its
    /// connections down because another chain took its listeners over (`true`).
    stop: Option<oneshot::Sender<bool>>,
    /// Resolves when the chain is down.
    done: Option<oneshot::Receiver<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// Brings `spec` up on a thread of its own; returns once it serves.
pub(super) async fn host(
    spec: ChainSpec,
    text: String,
    opts: UpOptions,
    inherit: crate::Inherit,
) -> Result<Hosted, DaemonError> {
    let (ready_tx, ready_rx) = oneshot::channel::<Result<ChainView, AgentError>>();
    let (stop_tx, stop_rx) = oneshot::channel::<bool>();
    let (done_tx, done_rx) = oneshot::channel::<()>();
    let kept = spec.clone();
    let thread = std::thread::Builder::new()
        .name(format!("chain-{}", spec.name))
        .spawn(move || {
            // As `zerohop up` does for its gateway thread.
            let _ = crate::confine::batch_scheduling();
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(r) => r,
                Err(e) => {
                    let _ = ready_tx.send(Err(AgentError::Runtime(e)));
                    return;
                }
            };
            runtime.block_on(async move {
                let running = match up_with(spec, opts, inherit).await {
                    Ok(r) => r,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                if ready_tx.send(Ok(running.view())).is_err() {
                    running.shutdown().await;
                    return;
                }
                // A dropped sender (the daemon is going away) stops the chain too.
                match stop_rx.await {
                    Ok(true) => running.wind_down().await,
                    _ => running.shutdown().await,
                }
                let _ = done_tx.send(());
            });
        })
        .map_err(DaemonError::ChainThread)?;
    match ready_rx.await {
        Ok(Ok(view)) => Ok(Hosted {
            view,
            spec: kept,
            text,
            stop: Some(stop_tx),
            done: Some(done_rx),
            thread: Some(thread),
        }),
        Ok(Err(e)) => {
            let _ = tokio::task::spawn_blocking(move || thread.join()).await;
            Err(e.into())
        }
        Err(_) => {
            let _ = tokio::task::spawn_blocking(move || thread.join()).await;
            Err(DaemonError::Internal(
                "the chain's thread ended before the chain came up".into(),
            ))
        }
    }
}

/// Shuts a hosted chain down and waits for its thread; `handed_over`: another chain took
/// its listeners over, so it winds its connections down first ([`Running::wind_down`]).
///
/// [`Running::wind_down`]: crate::Running::wind_down
pub(super) async fn stop(mut h: Hosted, handed_over: bool) {
    if let Some(s) = h.stop.take() {
        let _ = s.send(handed_over);
    }
    if let Some(d) = h.done.take() {
        let _ = d.await;
    }
    if let Some(t) = h.thread.take() {
        let _ = tokio::task::spawn_blocking(move || t.join()).await;
    }
}
