//! The daemon's side of its peer daemons (chains split over nodes): the thread their
//! connections and the relays' calls run on ([`PeerRuntime`]), and the answer to a hop a
//! peer relays to a chain of this node.

use super::state::Daemon;

impl Daemon {
    /// Answers a hop a peer daemon relays to chain `call.chain` of this node.
    pub(super) async fn relayed(&self, call: zerohop_link::Call) -> zerohop_link::Answer {
        use zerohop_link::Answer;
        let view = self.table().get(&call.chain).map(|h| h.view.clone());
        let Some(view) = view else {
            return Answer {
                status: 503,
                flags: 0,
                payload: format!("chain '{}' does not run on this node", call.chain).into_bytes(),
            };
        };
        let timeout = std::time::Duration::from_millis(u64::from(call.deadline_ms));
        match view
            .relayed(
                call.route,
                &call.function,
                &call.meta,
                &call.payload,
                timeout,
            )
            .await
        {
            Ok(r) => Answer {
                status: r.status.as_u16(),
                flags: if r.left { Answer::LEFT } else { 0 },
                // The reply's own buffer (the gateway's one copy out), not a copy of it.
                payload: Vec::from(r.body),
            },
            Err((status, message)) => Answer {
                status,
                flags: 0,
                payload: message.into_bytes(),
            },
        }
    }
}

/// The runtime of the peer connections (both ways) and of the relays' calls: one thread of
/// its own, so a hop's frames, calls and answers never wait for (or wake) another worker
/// thread. Dropping it stops the thread; what still runs on it is dropped (a relayed
/// request still waiting is answered 500).
pub(super) struct PeerRuntime {
    pub(super) handle: tokio::runtime::Handle,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl PeerRuntime {
    pub(super) fn start() -> std::io::Result<Self> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let handle = rt.handle().clone();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        std::thread::Builder::new()
            .name("peers".into())
            .spawn(move || {
                let _ = rt.block_on(stopped);
            })?;
        Ok(PeerRuntime {
            handle,
            stop: Some(stop),
        })
    }
}

impl Drop for PeerRuntime {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}
