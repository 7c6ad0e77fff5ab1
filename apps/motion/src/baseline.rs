//! The HTTP-microservice baseline, as people deploy this workload today: the sensor and the
//! actuator as HTTP servers, and an MQTT adapter subscribed at a broker (mosquitto) that POSTs
//! each event to the sensor, which POSTs its reading to the actuator; the actuator's answer
//! travels back and the adapter publishes it to the reply topic.
//!
//! ```text
//! device --MQTT--> mosquitto --MQTT--> adapter --HTTP--> sensor --HTTP--> actuator
//!                      ^                  |
//!                      +----- command ----+
//! ```
//!
//! The function logic is the same code as the zerohop functions' ([`Sensor`], [`Actuator`]);
//! the actuator keeps room state in its own memory. Every server is hyper 1 (HTTP/1.1,
//! keep-alive, `TCP_NODELAY`) on a current-thread tokio runtime, the same stack and the same
//! one-thread-per-process as zerohop's gateway and instances (`concurrency: 1`). The adapter
//! keeps MQTT's per-topic order: one queue per topic, one request at a time per queue (a room's
//! readings must reach the actuator in order), rooms in parallel.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode, Uri};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rumqttc::{AsyncClient, Event as MqttEvent, MqttOptions, Packet, QoS};
use tokio::net::TcpListener;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;

use crate::actuator::{Actuator, Rooms};
use crate::event::encode;
use crate::replay::{nodelay, split_addr, ReplayError};
use crate::sensor::Sensor;

/// Largest request body a server reads (events and readings are under 200 bytes).
const MAX_BODY: usize = 64 * 1024;
/// How long a hop may take before the caller gives up (zerohop's default timeout).
const HOP_TIMEOUT: Duration = Duration::from_secs(30);
/// Header carrying the event's topic to the sensor (the name zerohop's MQTT ingress uses).
pub const TOPIC_HEADER: &str = "mqtt-topic";

/// Why a baseline process stopped.
#[derive(Debug, thiserror::Error)]
pub enum BaselineError {
    /// A system call failed; `what` names it.
    #[error("{what}: {source}")]
    Io {
        /// What was being done (`bind 127.0.0.1:0`, `signal handler`).
        what: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The MQTT client refused the subscription request.
    #[error("subscribe: {0}")]
    Subscribe(#[from] rumqttc::ClientError),
    /// The broker's address.
    #[error(transparent)]
    Address(#[from] ReplayError),
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> BaselineError {
    let what = what.into();
    move |source| BaselineError::Io { what, source }
}

type Answer = Response<Full<Bytes>>;
type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// A keep-alive HTTP client (pooled connections, `TCP_NODELAY`).
fn http_client() -> HttpClient {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    Client::builder(TokioExecutor::new()).build(connector)
}

/// Serves the sensor on `listen`, passing readings to the actuator at `actuator`.
pub async fn serve_sensor(
    listen: SocketAddr,
    sensor: Sensor,
    actuator: Uri,
) -> Result<(), BaselineError> {
    let client = http_client();
    let sensor = Arc::new(sensor);
    serve(listen, move |req: Request<Incoming>| {
        let (sensor, client, actuator) = (sensor.clone(), client.clone(), actuator.clone());
        async move {
            let topic = req
                .headers()
                .get(TOPIC_HEADER)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            let body = match read_body(req).await {
                Ok(b) => b,
                Err(a) => return a,
            };
            let reading = match sensor.sense(topic.as_deref(), &body) {
                Ok(r) => r,
                Err(e) => return text(StatusCode::BAD_REQUEST, format!("sensor: {e}")),
            };
            match post(&client, &actuator, &[], reading).await {
                Ok((status, body)) => {
                    let mut a = Response::new(Full::new(body));
                    *a.status_mut() = status;
                    a
                }
                Err(e) => text(StatusCode::BAD_GATEWAY, format!("sensor: actuator: {e}")),
            }
        }
    })
    .await
}

/// Serves the actuator on `listen`, room state in this process's memory.
pub async fn serve_actuator(listen: SocketAddr, actuator: Actuator) -> Result<(), BaselineError> {
    let actuator = Arc::new(actuator);
    let rooms = Arc::new(Rooms::default());
    serve(listen, move |req: Request<Incoming>| {
        let (actuator, rooms) = (actuator.clone(), rooms.clone());
        async move {
            let body = match read_body(req).await {
                Ok(b) => b,
                Err(a) => return a,
            };
            match actuator.read(&body) {
                Ok(r) => Response::new(Full::new(Bytes::from(encode(&rooms.apply(&actuator, &r))))),
                Err(e) => text(StatusCode::BAD_REQUEST, format!("actuator: {e}")),
            }
        }
    })
    .await
}

/// The adapter's settings.
#[derive(Clone, Debug)]
pub struct AdapterConfig {
    /// The broker, `HOST:PORT`.
    pub broker: String,
    /// Topic filter of the events (`motion/+/event`).
    pub filter: String,
    /// Topic the commands are published to.
    pub reply_topic: String,
    /// The sensor's URL.
    pub sensor: Uri,
}

/// Runs the MQTT adapter until SIGTERM or SIGINT.
pub async fn run_adapter(cfg: AdapterConfig) -> Result<(), BaselineError> {
    let (host, port) = split_addr(&cfg.broker)?;
    let mut opts = MqttOptions::new(format!("motion-adapter-{}", std::process::id()), host, port);
    opts.set_keep_alive(Duration::from_secs(30))
        .set_max_packet_size(MAX_BODY, MAX_BODY)
        .set_inflight(1_000);
    let (client, mut eventloop) = AsyncClient::new(opts, 10_000);
    eventloop.set_network_options(nodelay());
    let http = http_client();
    let mut queues: HashMap<String, mpsc::UnboundedSender<Bytes>> = HashMap::new();
    let (mut term, mut int) = (
        signal(SignalKind::terminate()).map_err(io("signal handler"))?,
        signal(SignalKind::interrupt()).map_err(io("signal handler"))?,
    );
    let mut announced = false;
    loop {
        let ev = tokio::select! {
            ev = eventloop.poll() => ev,
            _ = term.recv() => return Ok(()),
            _ = int.recv() => return Ok(()),
        };
        match ev {
            Ok(MqttEvent::Incoming(Packet::ConnAck(_))) => {
                client
                    .subscribe(cfg.filter.clone(), QoS::AtLeastOnce)
                    .await?;
            }
            Ok(MqttEvent::Incoming(Packet::SubAck(_))) if !announced => {
                announced = true;
                println!("subscribed to {} at mqtt://{}", cfg.filter, cfg.broker);
                let _ = std::io::stdout().flush();
            }
            Ok(MqttEvent::Incoming(Packet::Publish(p))) => {
                let topic = p.topic.clone();
                let queue = queues.entry(topic.clone()).or_insert_with(|| {
                    let (tx, rx) = mpsc::unbounded_channel();
                    tokio::spawn(relay_topic(
                        topic,
                        rx,
                        http.clone(),
                        client.clone(),
                        cfg.clone(),
                    ));
                    tx
                });
                let _ = queue.send(p.payload);
            }
            Ok(_) => {}
            Err(e) => {
                eprintln!("motion-http adapter: MQTT connection: {e}; reconnecting");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

/// Relays the events of one topic, in order, to the sensor and publishes each answer.
async fn relay_topic(
    topic: String,
    mut events: mpsc::UnboundedReceiver<Bytes>,
    http: HttpClient,
    mqtt: AsyncClient,
    cfg: AdapterConfig,
) {
    while let Some(payload) = events.recv().await {
        let answer = match post(
            &http,
            &cfg.sensor,
            &[(TOPIC_HEADER, &topic)],
            payload.to_vec(),
        )
        .await
        {
            Ok((_, body)) => body,
            Err(e) => Bytes::from(format!("adapter: sensor: {e}")),
        };
        if let Err(e) = mqtt
            .publish(cfg.reply_topic.clone(), QoS::AtLeastOnce, false, answer)
            .await
        {
            eprintln!("motion-http adapter: publish: {e}");
        }
    }
}

/// Serves HTTP/1.1 with keep-alive on `listen` until SIGTERM or SIGINT; prints
/// `listening on http://ADDR` first.
async fn serve<F, Fut>(listen: SocketAddr, handle: F) -> Result<(), BaselineError>
where
    F: Fn(Request<Incoming>) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Answer> + Send + 'static,
{
    let (mut term, mut int) = (
        signal(SignalKind::terminate()).map_err(io("signal handler"))?,
        signal(SignalKind::interrupt()).map_err(io("signal handler"))?,
    );
    let listener = TcpListener::bind(listen)
        .await
        .map_err(io(format!("bind {listen}")))?;
    let addr = listener.local_addr().map_err(io("local_addr"))?;
    println!("listening on http://{addr}");
    std::io::stdout().flush().map_err(io("stdout"))?;
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let _ = stream.set_nodelay(true);
                let handle = handle.clone();
                let svc = service_fn(move |req| {
                    let fut = handle(req);
                    async move { Ok::<_, Infallible>(fut.await) }
                });
                let conn = http1::Builder::new()
                    .keep_alive(true)
                    .serve_connection(TokioIo::new(stream), svc);
                tokio::spawn(async move {
                    let _ = conn.await;
                });
            }
            _ = term.recv() => return Ok(()),
            _ = int.recv() => return Ok(()),
        }
    }
}

/// The request's body, or the error answer.
async fn read_body(req: Request<Incoming>) -> Result<Bytes, Answer> {
    Limited::new(req.into_body(), MAX_BODY)
        .collect()
        .await
        .map(|b| b.to_bytes())
        .map_err(|e| {
            text(
                StatusCode::BAD_REQUEST,
                format!("cannot read the body: {e}"),
            )
        })
}

/// POSTs `body` with `headers` to `uri`; the answer's status and body.
async fn post(
    client: &HttpClient,
    uri: &Uri,
    headers: &[(&str, &str)],
    body: Vec<u8>,
) -> Result<(StatusCode, Bytes), String> {
    let mut req = Request::post(uri.clone());
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| e.to_string())?;
    let exchange = async {
        let resp = client.request(req).await.map_err(|e| e.to_string())?;
        let status = resp.status();
        let body = Limited::new(resp.into_body(), MAX_BODY)
            .collect()
            .await
            .map_err(|e| format!("reading the answer: {e}"))?
            .to_bytes();
        Ok((status, body))
    };
    tokio::time::timeout(HOP_TIMEOUT, exchange)
        .await
        .map_err(|_| format!("no answer within {HOP_TIMEOUT:?}"))?
}

/// A one-line plain-text error answer.
fn text(status: StatusCode, line: String) -> Answer {
    let mut answer = Response::new(Full::new(Bytes::from(line.replace('\n', " "))));
    *answer.status_mut() = status;
    answer
}
