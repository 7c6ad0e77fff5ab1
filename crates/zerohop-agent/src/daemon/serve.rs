//! Running the daemon ([`run`], [`run_with`]): binding its listeners (peer, metrics, admin
//! socket) before its ready line, serving the admin API, metrics and peer daemons until
//! shutdown, then stopping every chain and removing the socket.

use std::sync::Arc;

use super::error::DaemonError;
use super::options::DaemonOptions;
use super::peers::PeerRuntime;
use super::state::Daemon;
use super::{admin, metrics};

/// Runs the daemon until `shutdown` resolves: binds the metrics and peer ports and the admin socket,
/// prints one `ready` line on stdout, serves, then stops every chain and removes the socket.
pub async fn run(
    opts: DaemonOptions,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), DaemonError> {
    run_with(opts, shutdown, |_, _| async {}).await
}

/// [`run`], with `attach` running beside the admin API on the same daemon (a cluster
/// member's watch of what its node should run): it gets the daemon and a signal that turns
/// true at shutdown, and is awaited (at most 10 s) before the chains are stopped, so that it
/// can leave its cluster while every chain still answers.
pub async fn run_with<F, Fut>(
    opts: DaemonOptions,
    shutdown: impl std::future::Future<Output = ()>,
    attach: F,
) -> Result<(), DaemonError>
where
    F: FnOnce(Arc<Daemon>, tokio::sync::watch::Receiver<bool>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    // Every listener is bound before the ready line (and before the admin socket exists), so
    // whoever waits for either can use all of them, and a port in use leaves nothing behind.
    let peer_listener = match &opts.peer {
        Some(p) => Some(
            std::net::TcpListener::bind(p.listen)
                .and_then(|l| l.set_nonblocking(true).map(|()| l))
                .map_err(|source| DaemonError::PeerListen {
                    addr: p.listen,
                    source,
                })?,
        ),
        None => None,
    };
    let metrics_listener = match opts.metrics {
        Some(addr) => Some(
            tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|source| DaemonError::MetricsListen { addr, source })?,
        ),
        None => None,
    };
    // Each of its errors names the socket or its folder and says what to do.
    let listener = admin::socket::bind(&opts.socket)?;
    let daemon = Daemon::new(opts.clone());
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stop_rx_attach = stop_rx.clone();
    let mut tasks = Vec::new();
    if let Some(l) = metrics_listener {
        let url = format!(
            "http://{}/metrics",
            l.local_addr().map_err(DaemonError::MetricsAddress)?
        );
        daemon.set_metrics_url(Some(url));
        tasks.push(tokio::spawn(metrics::serve(
            daemon.clone(),
            l,
            stop_rx.clone(),
        )));
    }
    // Peer daemons: hops of split chains, both ways. It stops after the cluster watch (a
    // node leaving its cluster still answers its peers until its parts have moved).
    let (peer_stop, peer_stop_rx) = tokio::sync::watch::channel(false);
    let mut peer_server = None;
    let mut peer_runtime = None;
    if let (Some(p), Some(l)) = (&opts.peer, peer_listener) {
        let rt = PeerRuntime::start().map_err(DaemonError::PeerThread)?;
        let _ = daemon.link.set(crate::relay::Link::new(
            Arc::new(zerohop_link::Peers::new(p.secret.clone())),
            rt.handle.clone(),
        ));
        let d = daemon.clone();
        let handler = zerohop_link::handler(move |call| {
            let d = d.clone();
            async move { d.relayed(call).await }
        });
        let secret = p.secret.clone();
        peer_server = Some(rt.handle.spawn(async move {
            match tokio::net::TcpListener::from_std(l) {
                Ok(l) => zerohop_link::serve(l, secret, handler, peer_stop_rx).await,
                Err(e) => tracing::error!("peer listener: {e}"),
            }
        }));
        peer_runtime = Some(rt);
    }
    // The admin API last: a chain brought up through it finds the peer link in place.
    tasks.push(tokio::spawn(admin::serve(
        daemon.clone(),
        listener,
        stop_rx,
    )));
    {
        use std::io::Write;
        let mut out = std::io::stdout();
        let _ = writeln!(
            out,
            "zerohop: daemon ready on {}{}",
            opts.socket.display(),
            daemon
                .metrics_url()
                .map_or(String::new(), |u| format!(", metrics at {u}"))
        );
        let _ = out.flush();
    }
    let attached = tokio::spawn(attach(daemon.clone(), stop_rx_attach));
    shutdown.await;
    let _ = stop_tx.send(true);
    if tokio::time::timeout(std::time::Duration::from_secs(10), attached)
        .await
        .is_err()
    {
        tracing::warn!("the cluster watch did not stop within 10 s");
    }
    let _ = peer_stop.send(true);
    if let Some(p) = peer_server {
        let _ = p.await;
    }
    tracing::info!("stopping every chain");
    for t in tasks {
        let _ = t.await;
    }
    daemon.down_all().await;
    // Only now: the chains' relays used it until they stopped.
    drop(peer_runtime);
    let _ = std::fs::remove_file(&opts.socket);
    Ok(())
}
