//! Listen mode: devices connect to the gateway, which is their broker.
//!
//! Each connection is a reader task (this module's [`Connection`]) and a writer task
//! ([`write_loop`]) joined by a bounded queue of [`Outbound`] packets. A PUBLISH on a routed
//! topic becomes a task of its own that runs the request ([`Gateway::run_mqtt`]), hands the
//! answer to the [`Hub`] (every subscriber whose filter matches the reply topic) and then,
//! for QoS 1, queues the PUBACK: so the PUBACK means "answered", and a connection's
//! requests run side by side.
//!
//! Limits, so that no client can make the gateway hold more than a bounded amount:
//!
//! | what | bound |
//! |---|---|
//! | connections | `max_connections` of the gateway thread; more wait in the backlog |
//! | a TLS handshake (`listen_tls`) | [`HANDSHAKE_TIMEOUT`](crate::tls::HANDSHAKE_TIMEOUT), counted in the connections |
//! | time to CONNECT | [`CONNECT_TIMEOUT`] |
//! | packet | `max_body` + [`PACKET_HEADROOM`] (announced as MQTT 5 Maximum Packet Size) |
//! | read buffer | one packet plus [`READ_CHUNK`] |
//! | requests in flight per connection | [`MAX_INFLIGHT`] (MQTT 5 Receive Maximum); at the bound the socket is not read |
//! | subscriptions per client | [`MAX_SUBSCRIPTIONS`] |
//! | subscriptions of all clients, bytes of their filters | [`MAX_HUB_SUBSCRIPTIONS`], [`MAX_HUB_FILTER_BYTES`] |
//! | levels of a topic name, response topic or filter | [`MAX_TOPIC_LEVELS`] |
//! | cost of delivering one answer | its topic's bytes, the index paths that match it and the matching subscriptions ([`Index`]) |
//! | queued packets to a client | [`OUT_QUEUE`]; answers to a subscriber that is that far behind are dropped for it |
//! | QoS 1 answers not yet acknowledged by a subscriber | [`MAX_UNACKED`] (or its Receive Maximum); more are dropped for it |
//! | a write to a client | [`WRITE_TIMEOUT`], then the connection is closed |
//! | idle client | 1.5 x its keep-alive |

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::BytesMut;
use http::StatusCode;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadHalf, WriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot, watch, Notify, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::codec::{
    self, AckReason, Close, ConnCode, Connect, DecodeError, Delivery, Hello, Inbound, Message,
    Outbound, Peer, SubRefusal, Version,
};
use super::subscriptions::Index;
use super::{valid_filter, MqttReply, MAX_TOPIC_LEVELS, PACKET_HEADROOM};
use crate::tls::{Inside, Tls};
use crate::Gateway;

/// How long a new connection may take to send its CONNECT.
pub(super) const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Requests of one connection inside the chain at once.
pub(super) const MAX_INFLIGHT: usize = 16;
/// Subscriptions one client may hold.
pub(super) const MAX_SUBSCRIPTIONS: usize = 64;
/// Subscriptions all clients of the gateway thread hold together (64 each for 1,024
/// clients), and the bytes of their filters: past either, a SUBSCRIBE gets "quota exceeded"
/// until some go. Together with [`MAX_TOPIC_LEVELS`] they bound the hub's memory and the
/// trie an answer is matched in.
pub(super) const MAX_HUB_SUBSCRIPTIONS: usize = 65_536;
pub(super) const MAX_HUB_FILTER_BYTES: usize = 16 << 20;
/// Packets queued for one client's writer.
pub(super) const OUT_QUEUE: usize = 256;
/// QoS 1 answers sent to one subscriber and not yet acknowledged.
pub(super) const MAX_UNACKED: u16 = 256;
/// How long one write to a client may take before the connection is closed.
pub(super) const WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// Bytes read from a socket at once.
pub(super) const READ_CHUNK: usize = 16 * 1024;
const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(5);
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);
/// Writes are gathered up to this many bytes.
const WRITE_BATCH: usize = 64 * 1024;

/// A client's byte stream: TCP, or TLS over TCP.
trait Stream: AsyncRead + AsyncWrite + Send + Unpin {}
impl<S: AsyncRead + AsyncWrite + Send + Unpin> Stream for S {}
type OwnedReadHalf = ReadHalf<Box<dyn Stream>>;
type OwnedWriteHalf = WriteHalf<Box<dyn Stream>>;

/// The TLS side of the broker: its listener and the chain's certificates.
pub(super) struct TlsListener {
    pub listener: TcpListener,
    pub tls: Arc<Tls>,
}

/// Serves MQTT on `listener` (and over TLS on `secure`'s, with one hub: answers reach the
/// subscribers of both) until `shutdown` turns true; then every connection stops reading,
/// finishes its requests (bounded by the chain timeout), says goodbye and closes.
pub(super) async fn serve(
    gw: Arc<Gateway>,
    listener: TcpListener,
    secure: Option<TlsListener>,
    mut shutdown: watch::Receiver<bool>,
) {
    let hub = Arc::new(Hub::default());
    let slots = Arc::new(Semaphore::new(gw.config.max_connections.max(1) as usize));
    let mut connections = JoinSet::new();
    let mut backoff = ACCEPT_BACKOFF_MIN;
    let ids = AtomicU64::new(1);
    if let Ok(a) = listener.local_addr() {
        tracing::info!("mqtt: gateway listening on {a} (MQTT 3.1.1 and 5)");
    }
    if let Some(a) = secure.as_ref().and_then(|s| s.listener.local_addr().ok()) {
        tracing::info!("mqtt: gateway listening on {a} (MQTT 3.1.1 and 5 over TLS)");
    }
    loop {
        while connections.try_join_next().is_some() {}
        let permit = tokio::select! {
            p = slots.clone().acquire_owned() => p.expect("the semaphore is never closed"),
            _ = stopped(&mut shutdown) => break,
        };
        let tls_accept = async {
            match &secure {
                Some(s) => s.listener.accept().await,
                None => std::future::pending().await,
            }
        };
        let (stream, tls) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    backoff = ACCEPT_BACKOFF_MIN;
                    (stream, None)
                }
                Err(e) => {
                    // EMFILE, ENFILE, ENOBUFS...: retrying at once would spin.
                    tracing::warn!("mqtt: accept failed: {e}; retrying in {backoff:?}");
                    tokio::select! {
                        _ = tokio::time::sleep(backoff) => {}
                        _ = stopped(&mut shutdown) => break,
                    }
                    backoff = (backoff * 2).min(ACCEPT_BACKOFF_MAX);
                    continue;
                }
            },
            accepted = tls_accept => match accepted {
                Ok((stream, _)) => {
                    backoff = ACCEPT_BACKOFF_MIN;
                    (stream, secure.as_ref().map(|s| s.tls.clone()))
                }
                Err(e) => {
                    tracing::warn!("mqtt: accept (TLS) failed: {e}; retrying in {backoff:?}");
                    tokio::select! {
                        _ = tokio::time::sleep(backoff) => {}
                        _ = stopped(&mut shutdown) => break,
                    }
                    backoff = (backoff * 2).min(ACCEPT_BACKOFF_MAX);
                    continue;
                }
            },
            _ = stopped(&mut shutdown) => break,
        };
        let _ = stream.set_nodelay(true);
        let conn = Connection {
            gw: gw.clone(),
            hub: hub.clone(),
            id: ids.fetch_add(1, Ordering::Relaxed),
            shutdown: shutdown.clone(),
        };
        connections.spawn(async move {
            conn.secure(stream, tls).await;
            drop(permit);
        });
    }
    drop(listener);
    drop(secure);
    // Each connection saw the shutdown too and ends by itself, bounded by the chain timeout.
    let grace = gw.config.timeout + WRITE_TIMEOUT.min(Duration::from_secs(2));
    let all = async { while connections.join_next().await.is_some() {} };
    if tokio::time::timeout(grace, all).await.is_err() {
        connections.abort_all();
    }
}

/// Resolves once `rx` says true (or its sender is gone).
async fn stopped(rx: &mut watch::Receiver<bool>) {
    let _ = rx.wait_for(|stop| *stop).await;
}

/// The connected clients' subscriptions: where answers go. One lock, held for the work of
/// one packet or one answer, which the limits bound: a CONNECT, SUBSCRIBE or UNSUBSCRIBE
/// costs its own bytes (client ids and filters are looked up by hash), an answer costs its
/// topic's bytes and the paths of the index that match it ([`Index`]), never a scan of
/// every connection or subscription.
#[derive(Default)]
struct Hub {
    state: Mutex<HubState>,
}

#[derive(Default)]
struct HubState {
    sessions: HashMap<u64, Session>,
    /// Connection of each connected client id.
    by_client: HashMap<String, u64>,
    /// Every session's filters.
    index: Index,
    /// Subscriptions of all sessions, and the bytes of their filters.
    subscriptions: usize,
    filter_bytes: usize,
}

/// One connected client, as the hub knows it.
struct Session {
    client_id: String,
    /// Filters and the QoS granted for each.
    filters: HashMap<String, u8>,
    out: mpsc::Sender<Outbound>,
    /// Notified when another connection takes this client id over.
    kick: Arc<Notify>,
}

impl HubState {
    /// Drops connection `id` and its subscriptions.
    fn drop_session(&mut self, id: u64) -> Option<Session> {
        let s = self.sessions.remove(&id)?;
        if self.by_client.get(&s.client_id) == Some(&id) {
            self.by_client.remove(&s.client_id);
        }
        for f in s.filters.keys() {
            self.index.remove(id, f);
            self.subscriptions -= 1;
            self.filter_bytes -= f.len();
        }
        Some(s)
    }
}

impl Hub {
    fn lock(&self) -> std::sync::MutexGuard<'_, HubState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds connection `id`; a connection with the same client id is told to go.
    fn register(&self, id: u64, session: Session) {
        let mut st = self.lock();
        if let Some(old) = st.by_client.get(&session.client_id).copied() {
            if let Some(s) = st.drop_session(old) {
                s.kick.notify_one();
            }
        }
        st.by_client.insert(session.client_id.clone(), id);
        st.sessions.insert(id, session);
    }

    fn remove(&self, id: u64) {
        self.lock().drop_session(id);
    }

    /// Adds or replaces a subscription of `id` to the valid filter `filter`, within the
    /// per-client and hub-wide bounds.
    fn subscribe(&self, id: u64, filter: &str, qos: u8) -> Result<u8, SubRefusal> {
        let mut st = self.lock();
        let st = &mut *st;
        let Some(s) = st.sessions.get_mut(&id) else {
            return Err(SubRefusal::QuotaExceeded);
        };
        if let Some(q) = s.filters.get_mut(filter) {
            *q = qos;
        } else if s.filters.len() >= MAX_SUBSCRIPTIONS {
            return Err(SubRefusal::QuotaExceeded);
        } else if st.subscriptions >= MAX_HUB_SUBSCRIPTIONS
            || st.filter_bytes + filter.len() > MAX_HUB_FILTER_BYTES
        {
            tracing::warn!(
                "mqtt: the gateway holds {} subscriptions ({} bytes of filters), its limit; client {:?} is refused one",
                st.subscriptions,
                st.filter_bytes,
                s.client_id
            );
            return Err(SubRefusal::QuotaExceeded);
        } else {
            s.filters.insert(filter.to_owned(), qos);
            st.subscriptions += 1;
            st.filter_bytes += filter.len();
        }
        st.index.insert(id, filter, qos);
        Ok(qos)
    }

    /// Removes a subscription of `id`; whether it had it.
    fn unsubscribe(&self, id: u64, filter: &str) -> bool {
        let mut st = self.lock();
        let st = &mut *st;
        let Some(s) = st.sessions.get_mut(&id) else {
            return false;
        };
        if s.filters.remove(filter).is_none() {
            return false;
        }
        st.subscriptions -= 1;
        st.filter_bytes -= filter.len();
        st.index.remove(id, filter)
    }

    /// Queues `delivery` for every client with a matching subscription, once per client at
    /// the highest QoS among its matching filters. A client whose queue is full misses it.
    /// Returns how many clients it was queued for and the steps the match took.
    fn publish(&self, delivery: Delivery) -> (usize, usize) {
        let delivery = Arc::new(delivery);
        let mut sent = 0;
        let st = self.lock();
        let mut matched = HashMap::new();
        let steps = st.index.matches(&delivery.topic, &mut matched);
        for (id, qos) in matched {
            let Some(s) = st.sessions.get(&id) else {
                continue;
            };
            let out = Outbound::Publish {
                delivery: delivery.clone(),
                qos,
            };
            match s.out.try_send(out) {
                Ok(()) => sent += 1,
                Err(_) => tracing::debug!(
                    "mqtt: client {:?} (connection {id}) is too far behind; it misses an answer on {:?}",
                    s.client_id,
                    delivery.topic
                ),
            }
        }
        (sent, steps)
    }
}

/// Packet ids of QoS 1 answers a client has not acknowledged yet.
struct Unacked {
    next: u16,
    ids: HashSet<u16>,
    limit: usize,
}

impl Unacked {
    /// A free packet id, or `None` when the client already has `limit` to acknowledge.
    fn take(&mut self) -> Option<u16> {
        if self.ids.len() >= self.limit {
            return None;
        }
        loop {
            self.next = self.next.checked_add(1).unwrap_or(1);
            if self.ids.insert(self.next) {
                return Some(self.next);
            }
        }
    }

    fn release(&mut self, pkid: u16) {
        self.ids.remove(&pkid);
    }
}

/// What the reader does after a packet.
enum Flow {
    Continue,
    /// Close the connection, saying why (MQTT 5) when there is a reason.
    Close(Option<Close>),
}

/// One client connection (the reader's side).
struct Connection {
    gw: Arc<Gateway>,
    hub: Arc<Hub>,
    id: u64,
    shutdown: watch::Receiver<bool>,
}

/// The state of a connected client's reader.
struct Client {
    connect: Connect,
    out: mpsc::Sender<Outbound>,
    /// Permits of the requests in flight (the reader waits for one before it starts a
    /// request, so at most [`MAX_INFLIGHT`] run).
    inflight: Arc<Semaphore>,
    unacked: Arc<Mutex<Unacked>>,
    kick: Arc<Notify>,
}

impl Connection {
    /// Runs the connection on `stream`, after a TLS handshake with `tls` if given (bounded
    /// by [`HANDSHAKE_TIMEOUT`](crate::tls::HANDSHAKE_TIMEOUT), and by the shutdown).
    async fn secure(mut self, stream: TcpStream, tls: Option<Arc<Tls>>) {
        let peer = stream
            .peer_addr()
            .map_or_else(|_| "?".to_owned(), |a| a.to_string());
        let stream: Box<dyn Stream> = match tls {
            None => Box::new(stream),
            Some(tls) => {
                let secured = tokio::select! {
                    s = tls.accept(stream, Inside::Mqtt) => s,
                    _ = stopped(&mut self.shutdown) => None,
                };
                match secured {
                    Some(s) => Box::new(s),
                    None => return,
                }
            }
        };
        self.run(stream, peer).await
    }

    async fn run(mut self, stream: Box<dyn Stream>, peer: String) {
        let max = self.gw.config.max_body as usize + PACKET_HEADROOM;
        let (mut rd, mut wr) = tokio::io::split(stream);
        let mut buf = BytesMut::with_capacity(READ_CHUNK);
        let Some((connect, assigned_id)) =
            self.handshake(&mut rd, &mut wr, &mut buf, max, &peer).await
        else {
            return;
        };
        let out_peer = Peer::of(&connect);
        tracing::debug!(
            "mqtt: {peer}: client {:?} connected ({:?}, keep-alive {} s)",
            connect.client_id,
            connect.version,
            connect.keep_alive
        );

        let (out, out_rx) = mpsc::channel(OUT_QUEUE);
        let unacked = Arc::new(Mutex::new(Unacked {
            next: 0,
            ids: HashSet::new(),
            limit: usize::from(connect.receive_max.clamp(1, MAX_UNACKED)),
        }));
        let kick = Arc::new(Notify::new());
        let (close_tx, close_rx) = oneshot::channel();
        let writer = tokio::spawn(write_loop(wr, out_rx, out_peer, unacked.clone(), close_rx));
        let _ = out.try_send(Outbound::ConnAck {
            code: ConnCode::Accepted,
            assigned_id,
            max_packet: max.min(u32::MAX as usize) as u32,
            receive_max: MAX_INFLIGHT as u16,
        });
        self.hub.register(
            self.id,
            Session {
                client_id: connect.client_id.clone(),
                filters: HashMap::new(),
                out: out.clone(),
                kick: kick.clone(),
            },
        );
        let client = Client {
            connect,
            out,
            inflight: Arc::new(Semaphore::new(MAX_INFLIGHT)),
            unacked,
            kick,
        };
        let why = self.serve(&client, &mut rd, &mut buf, max, &peer).await;
        self.hub.remove(self.id);
        if let Some(close) = why {
            if close != Close::ShuttingDown {
                tracing::debug!("mqtt: {peer}: closing the connection: {close:?}");
            }
            // Answers that are still running: their PUBACKs go out before the goodbye.
            if close == Close::ShuttingDown {
                let all = client.inflight.acquire_many(MAX_INFLIGHT as u32);
                let _ = tokio::time::timeout(self.gw.config.timeout, all).await;
            }
            let _ = client.out.try_send(Outbound::Disconnect(close));
        }
        drop(client);
        let _ = close_tx.send(());
        let _ = writer.await;
    }

    /// Waits (bounded) for the CONNECT and refuses what the gateway does not take; the
    /// accepted CONNECT, with the client id the gateway assigned if it chose one.
    async fn handshake(
        &mut self,
        rd: &mut OwnedReadHalf,
        wr: &mut OwnedWriteHalf,
        buf: &mut BytesMut,
        max: usize,
        peer: &str,
    ) -> Option<(Connect, Option<String>)> {
        let hello = tokio::select! {
            h = tokio::time::timeout(CONNECT_TIMEOUT, read_hello(rd, buf, max)) => h,
            _ = stopped(&mut self.shutdown) => return None,
        };
        let mut connect = match hello {
            Ok(Ok(Hello::Connect(c))) => c,
            Ok(Ok(Hello::Unsupported(what))) => {
                tracing::debug!("mqtt: {peer}: refused a CONNECT of {what}");
                // Answered the 3.1.1 way, which every level reads.
                let v311 = Peer {
                    version: Version::V311,
                    max_packet: u32::MAX,
                    problem_info: false,
                };
                refuse(wr, v311, ConnCode::UnsupportedVersion).await;
                return None;
            }
            Ok(Err(e)) => {
                tracing::debug!("mqtt: {peer}: closed before CONNECT: {e}");
                return None;
            }
            Err(_) => {
                tracing::debug!("mqtt: {peer}: no CONNECT within {CONNECT_TIMEOUT:?}; closed");
                return None;
            }
        };
        let out_peer = Peer::of(&connect);
        if connect.auth_method {
            refuse(wr, out_peer, ConnCode::BadAuthMethod).await;
            return None;
        }
        let mut assigned_id = None;
        if connect.client_id.is_empty() {
            if connect.version == Version::V311 && !connect.clean {
                // 3.1.1 3.1.3-8: a session to keep needs a client id.
                refuse(wr, out_peer, ConnCode::ClientIdRejected).await;
                return None;
            }
            connect.client_id = format!("zerohop-{}-{}", self.gw.plan.chain, self.id);
            if connect.version == Version::V5 {
                assigned_id = Some(connect.client_id.clone());
            }
        }
        Some((connect, assigned_id))
    }

    /// Reads and handles packets until the connection should end; returns why, when the
    /// client is to be told.
    async fn serve(
        &mut self,
        client: &Client,
        rd: &mut OwnedReadHalf,
        buf: &mut BytesMut,
        max: usize,
        peer: &str,
    ) -> Option<Close> {
        let keep_alive = Duration::from_millis(u64::from(client.connect.keep_alive) * 1500);
        let mut deadline = Instant::now() + keep_alive;
        loop {
            // Every packet already here first; then the socket.
            loop {
                let packet = match codec::read(client.connect.version, buf, max) {
                    Ok(Some(p)) => p,
                    Ok(None) => break,
                    Err(DecodeError { close, what }) => {
                        tracing::debug!("mqtt: {peer}: {what}");
                        return Some(close);
                    }
                };
                match self.handle(client, packet).await {
                    Flow::Continue => deadline = Instant::now() + keep_alive,
                    Flow::Close(why) => return why,
                }
            }
            buf.reserve(READ_CHUNK);
            let read = tokio::select! {
                r = rd.read_buf(buf) => r,
                _ = tokio::time::sleep_until(deadline), if !keep_alive.is_zero() => {
                    tracing::debug!("mqtt: {peer}: nothing within 1.5 x keep-alive");
                    return Some(Close::KeepAliveTimeout);
                }
                _ = client.kick.notified() => return Some(Close::SessionTakenOver),
                _ = client.out.closed() => return None,
                _ = stopped(&mut self.shutdown) => return Some(Close::ShuttingDown),
            };
            match read {
                Ok(0) | Err(_) => return None,
                Ok(_) => {}
            }
        }
    }

    async fn handle(&mut self, client: &Client, packet: Inbound) -> Flow {
        let out = &client.out;
        match packet {
            Inbound::Publish(m) => return self.publish(client, m).await,
            Inbound::PubAck(pkid) => client
                .unacked
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .release(pkid),
            Inbound::Subscribe { pkid, filters } => {
                let granted = filters
                    .iter()
                    .map(|(f, qos)| {
                        if f.starts_with("$share/") {
                            Err(SubRefusal::SharedNotSupported)
                        } else if !valid_filter(f) {
                            tracing::debug!(
                                "mqtt: client {:?} is refused a filter of {} bytes and {} levels: not a valid filter of at most {MAX_TOPIC_LEVELS} levels",
                                client.connect.client_id,
                                f.len(),
                                super::levels(f)
                            );
                            Err(SubRefusal::FilterInvalid)
                        } else {
                            // QoS 2 is granted as 1, the most the gateway delivers at.
                            self.hub.subscribe(self.id, f, (*qos).min(1))
                        }
                    })
                    .collect();
                if out.send(Outbound::SubAck { pkid, granted }).await.is_err() {
                    return Flow::Close(None);
                }
            }
            Inbound::Unsubscribe { pkid, filters } => {
                let found = filters
                    .iter()
                    .map(|f| self.hub.unsubscribe(self.id, f))
                    .collect();
                if out.send(Outbound::UnsubAck { pkid, found }).await.is_err() {
                    return Flow::Close(None);
                }
            }
            Inbound::PingReq => {
                if out.send(Outbound::PingResp).await.is_err() {
                    return Flow::Close(None);
                }
            }
            Inbound::Disconnect => return Flow::Close(None),
        }
        Flow::Continue
    }

    /// A client's PUBLISH: refused, dropped (no route) or started as a request.
    async fn publish(&mut self, client: &Client, m: Message) -> Flow {
        let v5 = client.connect.version == Version::V5;
        if m.qos > 1 {
            tracing::debug!(
                "mqtt: client {:?} published at QoS 2, which is not supported",
                client.connect.client_id
            );
            return Flow::Close(Some(Close::QosNotSupported));
        }
        if m.retain && v5 {
            // CONNACK said Retain Available 0; 3.1.1 retained messages run like any other.
            return Flow::Close(Some(Close::RetainNotSupported));
        }
        let Some(route) = self.gw.mqtt_route(&m.topic) else {
            self.gw.count_error();
            tracing::debug!("mqtt: no route for topic {:?}; message dropped", m.topic);
            if m.qos == 1 {
                let ack = Outbound::PubAck {
                    pkid: m.pkid,
                    reason: AckReason::NoMatchingSubscribers,
                    why: None,
                };
                if client.out.send(ack).await.is_err() {
                    return Flow::Close(None);
                }
            }
            return Flow::Continue;
        };
        // At the bound, wait here: the socket is not read until a request finishes.
        let permit = tokio::select! {
            p = client.inflight.clone().acquire_owned() => p.expect("never closed"),
            _ = client.kick.notified() => return Flow::Close(Some(Close::SessionTakenOver)),
            _ = client.out.closed() => return Flow::Close(None),
            _ = stopped(&mut self.shutdown) => return Flow::Close(Some(Close::ShuttingDown)),
        };
        let reply_topic = self.gw.mqtt_reply_topic(route, m.response_topic.as_deref());
        tokio::spawn(request(
            self.gw.clone(),
            self.hub.clone(),
            route,
            m,
            reply_topic,
            client.out.clone(),
            permit,
        ));
        Flow::Continue
    }
}

/// Runs one message through the chain, publishes the answer, and acknowledges a QoS 1
/// message once answered.
async fn request(
    gw: Arc<Gateway>,
    hub: Arc<Hub>,
    route: u16,
    m: Message,
    reply_topic: Option<String>,
    out: mpsc::Sender<Outbound>,
    permit: OwnedSemaphorePermit,
) {
    let answer = gw.run_mqtt(route, &m.topic, &m.payload).await;
    let reason = ack_reason(&answer);
    let why = answer.error_line();
    match reply_topic {
        Some(topic) => {
            let delivery = Delivery {
                topic,
                payload: answer.payload,
                status: answer.status.as_u16(),
                correlation: m.correlation,
            };
            hub.publish(delivery);
        }
        None => tracing::debug!(
            "mqtt: a message on {:?} was answered {} but names no reply topic",
            m.topic,
            answer.status
        ),
    }
    if m.qos == 1 {
        let _ = out
            .send(Outbound::PubAck {
                pkid: m.pkid,
                reason,
                why,
            })
            .await;
    }
    drop(permit);
}

/// The MQTT 5 PUBACK reason for an answer.
fn ack_reason(answer: &MqttReply) -> AckReason {
    if answer.is_ok() {
        AckReason::Success
    } else if answer.status == StatusCode::SERVICE_UNAVAILABLE {
        AckReason::QuotaExceeded
    } else {
        AckReason::ImplementationSpecific
    }
}

/// Reads until the first packet is complete.
async fn read_hello(
    rd: &mut OwnedReadHalf,
    buf: &mut BytesMut,
    max: usize,
) -> Result<Hello, DecodeError> {
    loop {
        if let Some(h) = codec::read_connect(buf, max)? {
            return Ok(h);
        }
        buf.reserve(READ_CHUNK);
        match rd.read_buf(buf).await {
            Ok(0) => return Err(DecodeError::new(Close::Protocol, "end of stream")),
            Err(e) => return Err(DecodeError::new(Close::Protocol, e.to_string())),
            Ok(_) => {}
        }
    }
}

/// Answers a CONNECT with a refusal and closes.
async fn refuse(wr: &mut OwnedWriteHalf, peer: Peer, code: ConnCode) {
    let mut buf = BytesMut::new();
    let ack = Outbound::ConnAck {
        code,
        assigned_id: None,
        max_packet: 0,
        receive_max: 0,
    };
    if codec::write(peer, &ack, 0, &mut buf) {
        let _ = tokio::time::timeout(WRITE_TIMEOUT, wr.write_all(&buf)).await;
    }
    let _ = tokio::time::timeout(WRITE_TIMEOUT, wr.shutdown()).await;
}

/// Writes a connection's packets until its queue ends, `close` fires (after what was
/// queued by then), a DISCONNECT went out, or a write fails or stalls.
async fn write_loop(
    mut wr: OwnedWriteHalf,
    mut rx: mpsc::Receiver<Outbound>,
    peer: Peer,
    unacked: Arc<Mutex<Unacked>>,
    mut close: oneshot::Receiver<()>,
) {
    let mut buf = BytesMut::new();
    let mut closing = false;
    'outer: loop {
        let first = if closing {
            // Closing: only what was queued before, then the end.
            rx.try_recv().ok()
        } else {
            tokio::select! {
                biased;
                m = rx.recv() => m,
                _ = &mut close => {
                    closing = true;
                    continue;
                }
            }
        };
        let Some(mut next) = first else { break };
        let mut done = false;
        loop {
            done |= matches!(next, Outbound::Disconnect(_));
            let pkid = match &next {
                Outbound::Publish { qos: 1, delivery } => {
                    let id = unacked.lock().unwrap_or_else(|p| p.into_inner()).take();
                    if id.is_none() {
                        tracing::debug!(
                            "mqtt: a subscriber has too many answers to acknowledge; one on {:?} is dropped for it",
                            delivery.topic
                        );
                    }
                    id
                }
                _ => Some(0),
            };
            if let Some(pkid) = pkid {
                if !codec::write(peer, &next, pkid, &mut buf) {
                    if let Outbound::Publish { delivery, .. } = &next {
                        tracing::debug!(
                            "mqtt: an answer on {:?} is larger than the subscriber takes; dropped for it",
                            delivery.topic
                        );
                    }
                    if let (Outbound::Publish { qos: 1, .. }, true) = (&next, pkid != 0) {
                        unacked
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .release(pkid);
                    }
                }
            }
            if done || buf.len() >= WRITE_BATCH {
                break;
            }
            match rx.try_recv() {
                Ok(m) => next = m,
                Err(_) => break,
            }
        }
        if !buf.is_empty() {
            match tokio::time::timeout(WRITE_TIMEOUT, wr.write_all(&buf)).await {
                Ok(Ok(())) => buf.clear(),
                _ => break 'outer,
            }
        }
        if done {
            break;
        }
    }
    let _ = tokio::time::timeout(Duration::from_secs(1), wr.shutdown()).await;
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;

    fn session(client_id: &str) -> (Session, mpsc::Receiver<Outbound>) {
        let (out, rx) = mpsc::channel(OUT_QUEUE);
        let s = Session {
            client_id: client_id.into(),
            filters: HashMap::new(),
            out,
            kick: Arc::new(Notify::new()),
        };
        (s, rx)
    }

    fn answer(topic: &str) -> Delivery {
        Delivery {
            topic: topic.into(),
            payload: Bytes::from_static(b"x"),
            status: 200,
            correlation: None,
        }
    }

    #[test]
    fn subscriptions_are_bounded_per_client_and_for_the_whole_hub() {
        let hub = Hub::default();
        let (s, _rx) = session("one");
        hub.register(1, s);
        for i in 0..MAX_SUBSCRIPTIONS {
            assert_eq!(hub.subscribe(1, &format!("f/{i}"), 1), Ok(1));
        }
        // The same filter again only changes its QoS; a new one is one too many.
        assert_eq!(hub.subscribe(1, "f/0", 0), Ok(0));
        assert_eq!(hub.subscribe(1, "f/x", 0), Err(SubRefusal::QuotaExceeded));
        assert!(hub.unsubscribe(1, "f/1"));
        assert!(!hub.unsubscribe(1, "f/1"));
        assert_eq!(hub.subscribe(1, "f/x", 0), Ok(0));
        // The hub as a whole: past MAX_HUB_SUBSCRIPTIONS, every client is refused.
        let mut rxs = Vec::new();
        let clients = MAX_HUB_SUBSCRIPTIONS / MAX_SUBSCRIPTIONS;
        for c in 2..=clients as u64 {
            let (s, rx) = session(&format!("c{c}"));
            rxs.push(rx);
            hub.register(c, s);
            for i in 0..MAX_SUBSCRIPTIONS {
                assert_eq!(hub.subscribe(c, &format!("f/{i}"), 0), Ok(0));
            }
        }
        assert_eq!(hub.lock().subscriptions, MAX_HUB_SUBSCRIPTIONS);
        let (s, _rx2) = session("late");
        hub.register(u64::MAX, s);
        assert_eq!(
            hub.subscribe(u64::MAX, "late", 0),
            Err(SubRefusal::QuotaExceeded)
        );
        // A client that goes takes its subscriptions with it.
        hub.remove(2);
        assert_eq!(hub.subscribe(u64::MAX, "late", 0), Ok(0));
        // And the bytes of the filters: a few maximal filters fill them.
        let hub = Hub::default();
        let long = "x".repeat(usize::from(u16::MAX));
        let fits = MAX_HUB_FILTER_BYTES / long.len();
        let mut refused = 0;
        for c in 0..=(fits / MAX_SUBSCRIPTIONS + 1) as u64 {
            let (s, rx) = session(&format!("long{c}"));
            rxs.push(rx);
            hub.register(c, s);
            for i in 0..MAX_SUBSCRIPTIONS {
                let f = format!("{i:02}{}", &long[2..]);
                if hub.subscribe(c, &f, 0).is_err() {
                    refused += 1;
                }
            }
        }
        let st = hub.lock();
        assert_eq!(st.subscriptions, fits);
        assert!(st.filter_bytes <= MAX_HUB_FILTER_BYTES);
        assert!(refused > 0);
    }

    #[test]
    fn a_client_id_taken_over_leaves_no_subscriptions_behind() {
        let hub = Hub::default();
        let (a, mut rx_a) = session("same");
        let kick = a.kick.clone();
        hub.register(1, a);
        hub.subscribe(1, "t/#", 1).unwrap();
        let (b, mut rx_b) = session("same");
        hub.register(2, b);
        // The old connection is told to go (a permit is stored for it) and hears nothing.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        rt.block_on(async {
            tokio::time::timeout(Duration::from_secs(5), kick.notified())
                .await
                .expect("the old connection was kicked");
        });
        assert_eq!(hub.publish(answer("t/1")).0, 0);
        hub.subscribe(2, "t/+", 0).unwrap();
        assert_eq!(hub.publish(answer("t/1")).0, 1);
        assert!(rx_a.try_recv().is_err());
        assert!(matches!(
            rx_b.try_recv(),
            Ok(Outbound::Publish { qos: 0, .. })
        ));
        // The old connection's own end removes nothing of the new one's.
        hub.remove(1);
        assert_eq!(hub.publish(answer("t/2")).0, 1);
        hub.remove(2);
        let st = hub.lock();
        assert_eq!((st.subscriptions, st.filter_bytes), (0, 0));
        assert!(st.by_client.is_empty() && st.sessions.is_empty());
    }

    /// Finding 8 of the security review: with 1,000 clients holding 64 filters of thousands
    /// of levels each, one answer on a response topic of thousands of levels compared every
    /// level of every filter, under the hub's lock (about a second of CPU). Such filters and
    /// topics are refused now (at most MAX_TOPIC_LEVELS levels), and what is accepted is
    /// matched through the index: the work of one answer is counted here, not timed.
    #[test]
    fn one_answer_costs_its_matching_paths_whatever_the_clients_hold() {
        let hub = Hub::default();
        let thousands = vec!["+"; 3000].join("/");
        let deepest =
            |tail: usize| format!("{}/f{tail}", vec!["+"; MAX_TOPIC_LEVELS - 1].join("/"));
        let mut rxs = Vec::new();
        for c in 0..1000u64 {
            let (s, rx) = session(&format!("c{c}"));
            rxs.push(rx);
            hub.register(c, s);
            // The filters of the report are no filters here (the SUBSCRIBE path checks
            // `valid_filter` first, and the SUBACK says 0x8F / 0x80).
            assert!(!valid_filter(&thousands));
            for i in 0..MAX_SUBSCRIPTIONS {
                hub.subscribe(c, &deepest(i), 1).unwrap();
            }
        }
        // The deepest topic the codec lets through, matching none of the 64,000 filters.
        let topic = vec!["t"; MAX_TOPIC_LEVELS].join("/");
        let (sent, steps) = hub.publish(answer(&topic));
        assert_eq!(sent, 0);
        assert_eq!(
            steps, MAX_TOPIC_LEVELS,
            "one step per level of the shared path"
        );
        // A topic they all match: one delivery per client, steps grow with the deliveries
        // (64 filters each of 1,000 clients match), not with anything else.
        let topic = format!("{}/f7", vec!["t"; MAX_TOPIC_LEVELS - 1].join("/"));
        let (sent, steps) = hub.publish(answer(&topic));
        assert_eq!(sent, 1000);
        assert_eq!(steps, MAX_TOPIC_LEVELS + 1 + 1000);
    }
}
