//! Subscribe mode: the gateway is an MQTT 5 client of an existing broker (`rumqttc`'s
//! client). It subscribes to every route's filter at QoS 1 with No Local (so answers it
//! publishes never come back to it as requests), runs each message through the chain,
//! publishes the answer at QoS 1 to the reply topic and only then acknowledges a QoS 1
//! message: a gateway that dies mid-request gets it again from the broker.
//!
//! The broker being away is normal: the gateway logs a warning, retries with a backoff
//! from [`BACKOFF_MIN`] doubling to [`BACKOFF_MAX`], subscribes again after each CONNACK
//! (it connects with a clean start), and never gives up until shutdown. Requests in flight
//! are bounded: QoS 1 ones by the Receive Maximum it announces ([`MAX_INFLIGHT`]), QoS 0
//! ones by as many permits; a QoS 0 message beyond that is dropped and counted as an error.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use rumqttc::v5::mqttbytes::v5::{Filter, Packet, Publish, PublishProperties};
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::{AsyncClient, Event, MqttOptions};
use tokio::sync::{watch, Semaphore};

use super::PACKET_HEADROOM;
use crate::Gateway;

/// Requests from the broker inside the chain at once (per QoS class).
pub(super) const MAX_INFLIGHT: u16 = 256;
/// First wait before connecting again.
pub(super) const BACKOFF_MIN: Duration = Duration::from_millis(200);
/// Longest wait before connecting again.
pub(super) const BACKOFF_MAX: Duration = Duration::from_secs(10);
/// Keep-alive towards the broker.
const KEEP_ALIVE: Duration = Duration::from_secs(30);
/// How long a connection attempt may take, in seconds.
const CONNECT_TIMEOUT_S: u64 = 5;
/// Requests queued to the client's event loop (publishes, acks, subscribes).
const REQUEST_QUEUE: usize = 512;

/// Serves the routes' filters at the broker `addr` until `shutdown` turns true; then lets
/// open requests finish (bounded by the chain timeout), publishes their answers and
/// disconnects.
pub(super) async fn serve(
    gw: Arc<Gateway>,
    addr: String,
    client_id: String,
    mut shutdown: watch::Receiver<bool>,
) {
    let Some((host, port)) = split_addr(&addr) else {
        // The spec check refuses this; kept so a bad address never panics.
        tracing::warn!("mqtt: broker address {addr:?} is not HOST:PORT; MQTT is off");
        let _ = shutdown.wait_for(|s| *s).await;
        return;
    };
    let mut filters: Vec<String> = Vec::new();
    for r in &gw.plan.routes {
        if !r.mqtt.is_empty() && !filters.contains(&r.mqtt) {
            filters.push(r.mqtt.clone());
        }
    }
    let mut options = MqttOptions::new(client_id.clone(), host, port);
    options
        .set_keep_alive(KEEP_ALIVE)
        .set_clean_start(true)
        .set_manual_acks(true)
        .set_connection_timeout(CONNECT_TIMEOUT_S)
        .set_receive_maximum(Some(MAX_INFLIGHT))
        .set_max_packet_size(Some(
            (gw.config.max_body as usize + PACKET_HEADROOM).min(u32::MAX as usize) as u32,
        ));
    let (client, mut events) = AsyncClient::new(options, REQUEST_QUEUE);
    let qos0 = Arc::new(Semaphore::new(usize::from(MAX_INFLIGHT)));
    let qos1 = Arc::new(Semaphore::new(usize::from(MAX_INFLIGHT)));
    let mut backoff = BACKOFF_MIN;
    let mut connected = false;
    loop {
        let event = tokio::select! {
            biased;
            _ = shutdown.wait_for(|s| *s) => break,
            e = events.poll() => e,
        };
        match event {
            Ok(Event::Incoming(Packet::ConnAck(_))) => {
                tracing::info!(
                    "mqtt: connected to broker {addr} as {client_id:?}; subscribing to {}",
                    filters.join(", ")
                );
                connected = true;
                backoff = BACKOFF_MIN;
                let subscriptions = filters.iter().map(|f| Filter {
                    nolocal: true,
                    ..Filter::new(f.clone(), QoS::AtLeastOnce)
                });
                if let Err(e) = client.try_subscribe_many(subscriptions) {
                    tracing::warn!("mqtt: could not subscribe at {addr}: {e}");
                }
            }
            Ok(Event::Incoming(Packet::SubAck(ack))) => {
                for (f, code) in filters.iter().zip(&ack.return_codes) {
                    if !matches!(
                        code,
                        rumqttc::v5::mqttbytes::v5::SubscribeReasonCode::Success(_)
                    ) {
                        tracing::warn!(
                            "mqtt: broker {addr} refused the subscription to {f}: {code:?}"
                        );
                    }
                }
            }
            Ok(Event::Incoming(Packet::Publish(p))) => {
                let permits = if p.qos == QoS::AtMostOnce {
                    &qos0
                } else {
                    &qos1
                };
                match permits.clone().try_acquire_owned() {
                    Ok(permit) => {
                        let (gw, client) = (gw.clone(), client.clone());
                        tokio::spawn(async move {
                            request(&gw, &client, p).await;
                            drop(permit);
                        });
                    }
                    Err(_) => {
                        gw.count_error();
                        tracing::warn!(
                            "mqtt: {MAX_INFLIGHT} requests from the broker in flight; a message on {:?} is dropped",
                            String::from_utf8_lossy(&p.topic)
                        );
                        // A QoS 1 message is acknowledged all the same, or the broker's
                        // window would close for good.
                        let _ = client.try_ack(&p);
                    }
                }
            }
            Ok(_) => {}
            Err(e) => {
                if connected {
                    tracing::warn!("mqtt: lost broker {addr}: {e}; reconnecting");
                } else {
                    tracing::warn!(
                        "mqtt: cannot reach broker {addr}: {e}; retrying in {backoff:?}"
                    );
                }
                connected = false;
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = shutdown.wait_for(|s| *s) => break,
                }
                backoff = (backoff * 2).min(BACKOFF_MAX);
            }
        }
    }
    if !connected {
        return;
    }
    // Open requests finish and their answers go out while the event loop keeps running.
    let all = u32::from(MAX_INFLIGHT);
    let drained = async {
        let _a = qos0.acquire_many(all).await;
        let _b = qos1.acquire_many(all).await;
        let _ = client.disconnect().await;
    };
    let events = async {
        while let Ok(e) = events.poll().await {
            if let Event::Outgoing(rumqttc::Outgoing::Disconnect) = e {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(gw.config.timeout + Duration::from_secs(1), async {
        tokio::join!(drained, events)
    })
    .await;
}

/// Runs one message from the broker through the chain, publishes the answer and
/// acknowledges the message.
async fn request(gw: &Gateway, client: &AsyncClient, p: Publish) {
    let Some((topic, route)) = std::str::from_utf8(&p.topic)
        .ok()
        .and_then(|t| Some((t, gw.mqtt_route(t)?)))
    else {
        // The broker sent what no filter matches (an overlapping subscription of another
        // client with this id, say).
        gw.count_error();
        tracing::debug!(
            "mqtt: no route for topic {:?}; message dropped",
            String::from_utf8_lossy(&p.topic)
        );
        let _ = client.ack(&p).await;
        return;
    };
    let props = p.properties.clone().unwrap_or_default();
    let reply_topic = gw.mqtt_reply_topic(route, props.response_topic.as_deref());
    let answer = gw.run_mqtt(route, topic, &p.payload).await;
    match reply_topic {
        Some(reply) => {
            let properties = PublishProperties {
                correlation_data: props.correlation_data,
                user_properties: vec![("status".into(), answer.status.as_u16().to_string())],
                ..Default::default()
            };
            let sent = client
                .publish_with_properties(
                    reply.clone(),
                    QoS::AtLeastOnce,
                    false,
                    Bytes::clone(&answer.payload),
                    properties,
                )
                .await;
            if let Err(e) = sent {
                tracing::warn!("mqtt: could not publish the answer to {reply}: {e}");
            }
        }
        None => tracing::debug!(
            "mqtt: a message on {topic:?} was answered {} but names no reply topic",
            answer.status
        ),
    }
    let _ = client.ack(&p).await;
}

/// `host:port` (or `[v6]:port`) into its parts.
fn split_addr(addr: &str) -> Option<(String, u16)> {
    let (host, port) = addr.rsplit_once(':')?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let port = port.parse().ok().filter(|&p| p != 0)?;
    (!host.is_empty()).then(|| (host.to_owned(), port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broker_addresses_split_into_host_and_port() {
        assert_eq!(
            split_addr("127.0.0.1:1883"),
            Some(("127.0.0.1".into(), 1883))
        );
        assert_eq!(
            split_addr("broker.lan:8883"),
            Some(("broker.lan".into(), 8883))
        );
        assert_eq!(split_addr("[::1]:1883"), Some(("::1".into(), 1883)));
        assert_eq!(split_addr("host"), None);
        assert_eq!(split_addr(":1883"), None);
        assert_eq!(split_addr("host:0"), None);
        assert_eq!(split_addr("host:x"), None);
    }
}
