//! MQTT ingress: messages on a route's topic filter run through the chain; its output is
//! published to the route's reply topic (or the message's MQTT 5 response topic).
//!
//! Two ways in, one request path ([`Gateway::submit`], as HTTP):
//!
//! * [`MqttIngress::Listen`] (`broker`): devices connect to the gateway, which is their
//!   broker for MQTT 3.1.1 and 5 on one port (the protocol level of each CONNECT decides).
//!   A PUBLISH on a routed topic is a request; its answer is published to every connected
//!   client subscribed to the reply topic. The gateway is no general broker: only answers
//!   are ever delivered to subscribers.
//! * [`MqttIngress::Broker`] (`client`): the gateway is an MQTT 5 client of an existing
//!   broker, subscribes to every route's filter and publishes answers back there.
//!
//! Every accepted message gets exactly one answer: the chain's output, or the one-line error
//! of whoever failed (a function, the gateway: no slot, timeout), published to the reply
//! topic; over MQTT 5 with the user property `status` (`200`, `422`, `504`, ...) and the
//! request's correlation data. A message without a reply topic still runs through the chain.
//!
//! Whatever a client sends is untrusted: packets are bounded by `max_body` plus
//! [`PACKET_HEADROOM`], a malformed packet closes only its connection, and every queue is
//! bounded (see `broker` for the limits). `docs/mqtt.md` is the user's view.
//!
//! Packets are read and written by `rumqttc`'s `mqttbytes` (3.1.1 and 5); `codec` turns them
//! into the few shapes the gateway deals in, so nothing else here depends on the level.

mod broker;
mod client;
mod codec;
mod subscriptions;

#[doc(hidden)]
pub use codec::fuzz_connection;

use std::sync::Arc;

use bytes::Bytes;
use http::StatusCode;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::ingress::Reply;
use crate::tls::Tls;
use crate::{Gateway, GatewayError};

/// Bytes a packet may carry beyond the chain's `max_body`: fixed header, topic, packet id
/// and properties.
pub(crate) const PACKET_HEADROOM: usize = 16 * 1024;

/// Most levels a topic name or filter may have (`a/b/c` has three). Common brokers bound
/// this too (EMQX `max_topic_levels`, 128 by default; AWS IoT allows 8); 32 is more than
/// real topic trees use, and it bounds what matching one topic against a filter costs.
/// A PUBLISH whose topic or response topic has more is refused (MQTT 5: DISCONNECT 0x90
/// "topic name invalid"), a SUBSCRIBE filter with more gets a SUBACK failure (0x8F / 0x80).
pub const MAX_TOPIC_LEVELS: usize = 32;
// A route's topic the spec accepts is one this broker can match.
const _: () = assert!(MAX_TOPIC_LEVELS == zerohop_spec::MAX_TOPIC_LEVELS);

/// The metadata name under which a request carries its topic (for functions that list it
/// in their `headers`).
pub(crate) const TOPIC_META: &str = "mqtt-topic";

/// How the gateway speaks MQTT.
pub enum MqttIngress {
    /// Devices connect to the gateway, which acts as their broker (MQTT 3.1.1 and 5); in
    /// clear on the first listener, over TLS with the chain's certificates on the second.
    /// Both share one broker: an answer reaches the subscribers of either.
    Listen(TcpListener, Option<(TcpListener, Arc<Tls>)>),
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
    /// Serves MQTT until `shutdown` turns true, then lets open requests finish (up to the
    /// chain timeout) and returns.
    pub async fn serve_mqtt(
        self: Arc<Self>,
        ingress: MqttIngress,
        shutdown: watch::Receiver<bool>,
    ) {
        match ingress {
            MqttIngress::Listen(listener, secure) => {
                let secure = secure.map(|(listener, tls)| broker::TlsListener { listener, tls });
                broker::serve(self, listener, secure, shutdown).await
            }
            MqttIngress::Broker { addr, client_id } => {
                client::serve(self, addr, client_id, shutdown).await
            }
        }
    }

    /// The route a message on `topic` enters by: the first (lowest index) whose filter
    /// matches.
    fn mqtt_route(&self, topic: &str) -> Option<u16> {
        self.plan
            .routes
            .iter()
            .position(|r| !r.mqtt.is_empty() && topic_matches(&r.mqtt, topic))
            .map(|i| i as u16)
    }

    /// Where the answer to a message of `route` goes: the route's `mqtt_reply`, else the
    /// message's response topic, else nowhere.
    fn mqtt_reply_topic(&self, route: u16, response_topic: Option<&str>) -> Option<String> {
        let fixed = &self.plan.routes[route as usize].mqtt_reply;
        if !fixed.is_empty() {
            return Some(fixed.clone());
        }
        response_topic.map(str::to_owned)
    }

    /// Runs one message through `route`; counted in the stats by [`Gateway::submit`].
    async fn run_mqtt(&self, route: u16, topic: &str, payload: &Bytes) -> MqttReply {
        let result = self
            .submit(
                route,
                self.asked([(TOPIC_META, topic)]),
                std::slice::from_ref(payload),
            )
            .await;
        MqttReply::of(result)
    }
}

/// What an MQTT message is answered with.
#[derive(Clone, Debug)]
pub(crate) struct MqttReply {
    /// 200 (or the last function's success status), or the error's status.
    pub status: StatusCode,
    /// The chain's output, or the one-line error (`function 'f': why` from the gateway, the
    /// function's own message for its errors).
    pub payload: Bytes,
}

impl MqttReply {
    fn of(result: Result<Reply, GatewayError>) -> Self {
        match result {
            Ok(r) => Self {
                status: r.status,
                payload: r.body,
            },
            Err(e) => Self {
                status: e.status,
                payload: Bytes::from(e.to_string()),
            },
        }
    }

    /// Whether the chain produced its output (2xx or 3xx), not an error.
    pub fn is_ok(&self) -> bool {
        self.status.is_success() || self.status.is_redirection()
    }

    /// The error line for an MQTT 5 reason string, if this is an error.
    pub fn error_line(&self) -> Option<String> {
        (!self.is_ok()).then(|| String::from_utf8_lossy(&self.payload).into_owned())
    }
}

/// Whether the topic name `topic` matches the topic filter `filter` (MQTT 3.1.1 4.7, MQTT 5
/// 4.7): `+` is one whole level, `#` (last) is the parent level and everything below it, and
/// a filter starting with a wildcard does not match topics starting with `$`.
pub(crate) fn topic_matches(filter: &str, topic: &str) -> bool {
    if topic.starts_with('$') && (filter.starts_with('+') || filter.starts_with('#')) {
        return false;
    }
    let mut f = filter.split('/');
    let mut t = topic.split('/');
    loop {
        match (f.next(), t.next()) {
            (Some("#"), _) => return true,
            (Some("+"), Some(_)) => {}
            (Some(a), Some(b)) if a == b => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

/// How many levels `topic` (a name or a filter) has: one more than its `/`s.
pub(crate) fn levels(topic: &str) -> usize {
    topic.bytes().filter(|&b| b == b'/').count() + 1
}

/// Whether `topic` is a valid topic name to publish to: not empty, no wildcards, no NUL, at
/// most 65535 bytes and [`MAX_TOPIC_LEVELS`] levels.
pub(crate) fn valid_topic(topic: &str) -> bool {
    !topic.is_empty()
        && topic.len() <= usize::from(u16::MAX)
        && !topic.contains(['+', '#', '\0'])
        && levels(topic) <= MAX_TOPIC_LEVELS
}

/// Whether `filter` is a valid topic filter: not empty, no NUL, at most 65535 bytes and
/// [`MAX_TOPIC_LEVELS`] levels, `+` only as a whole level, `#` only as the whole last level.
pub(crate) fn valid_filter(filter: &str) -> bool {
    if filter.is_empty() || filter.len() > usize::from(u16::MAX) || filter.contains('\0') {
        return false;
    }
    let levels = levels(filter);
    if levels > MAX_TOPIC_LEVELS {
        return false;
    }
    filter.split('/').enumerate().all(|(i, l)| {
        (!l.contains('+') || l == "+") && (!l.contains('#') || (l == "#" && i + 1 == levels))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plus_matches_exactly_one_level() {
        assert!(topic_matches("sensors/+/motion", "sensors/hall/motion"));
        assert!(topic_matches("sensors/+/motion", "sensors//motion"));
        assert!(!topic_matches(
            "sensors/+/motion",
            "sensors/hall/door/motion"
        ));
        assert!(!topic_matches("sensors/+/motion", "sensors/motion"));
        assert!(!topic_matches("sensors/+/motion", "sensors/hall/motion/x"));
        assert!(topic_matches("+", "a"));
        assert!(!topic_matches("+", "a/b"));
        assert!(!topic_matches("+", "/a"));
        assert!(topic_matches("+/+", "/a"));
        assert!(topic_matches("a/+", "a/"));
    }

    #[test]
    fn hash_matches_the_parent_and_everything_below() {
        assert!(topic_matches("plant/#", "plant"));
        assert!(topic_matches("plant/#", "plant/"));
        assert!(topic_matches("plant/#", "plant/a/b/c"));
        assert!(!topic_matches("plant/#", "plants/a"));
        assert!(!topic_matches("plant/#", "other/plant/a"));
        assert!(topic_matches("#", "a/b/c"));
        assert!(topic_matches("#", "/"));
        assert!(topic_matches("+/b/#", "a/b"));
        assert!(topic_matches("+/b/#", "a/b/c/d"));
    }

    #[test]
    fn exact_filters_match_only_their_topic() {
        assert!(topic_matches("a/b", "a/b"));
        assert!(!topic_matches("a/b", "a/b/"));
        assert!(!topic_matches("a/b", "a"));
        assert!(!topic_matches("a/b", "A/b"));
        assert!(!topic_matches("a/b", "a/bc"));
    }

    #[test]
    fn wildcards_at_the_first_level_skip_dollar_topics() {
        assert!(!topic_matches("#", "$SYS/broker/load"));
        assert!(!topic_matches("+/broker/load", "$SYS/broker/load"));
        assert!(!topic_matches("+", "$SYS"));
        assert!(topic_matches("$SYS/#", "$SYS/broker/load"));
        assert!(topic_matches("$SYS/+/load", "$SYS/broker/load"));
        // Only the first level is special.
        assert!(topic_matches("a/#", "a/$b"));
        assert!(topic_matches("a/+", "a/$b"));
    }

    #[test]
    fn topic_names_and_filters_are_checked() {
        assert!(valid_topic("a/b"));
        assert!(valid_topic("/"));
        assert!(!valid_topic(""));
        assert!(!valid_topic("a/+"));
        assert!(!valid_topic("a/#"));
        assert!(!valid_topic("a\0b"));
        assert!(!valid_topic(&"x".repeat(65536)));
        // At most MAX_TOPIC_LEVELS levels, for names and filters alike.
        let deepest = vec!["l"; MAX_TOPIC_LEVELS].join("/");
        let deeper = format!("{deepest}/l");
        assert!(valid_topic(&deepest) && valid_filter(&deepest));
        assert!(!valid_topic(&deeper) && !valid_filter(&deeper));
        assert!(valid_filter(&format!(
            "{}/#",
            vec!["+"; MAX_TOPIC_LEVELS - 1].join("/")
        )));
        assert!(!valid_filter(&format!(
            "{}/#",
            vec!["+"; MAX_TOPIC_LEVELS].join("/")
        )));
        assert!(!valid_topic(&"/".repeat(MAX_TOPIC_LEVELS)));

        for ok in ["#", "+", "a/+/b", "a/#", "+/+", "/", "$SYS/#", "$share/g/a"] {
            assert!(valid_filter(ok), "{ok}");
        }
        for bad in ["", "a#", "a/#/b", "a/b+", "++", "#/a", "a/b#", "x\0"] {
            assert!(!valid_filter(bad), "{bad:?}");
        }
    }
}
