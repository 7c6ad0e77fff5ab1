//! One service's process: an HTTP/1.1 server (hyper) on a current-thread tokio runtime.
//!
//! The frontend answers the page routes ([`frontend::Route`]) with [`frontend::handle`], as
//! the zerohop function does. Every other service answers `POST` (any path) with its call's
//! output: `200` with JSON, or the service's error status with its message as plain text,
//! which the calling service's client turns back into the same [`ServiceError`].

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use super::client::HttpPeers;
use super::{DeployError, MemStore};
use crate::rpc::{Service, ServiceError, Store};
use crate::services::{self, frontend};

/// Largest request body a service reads.
pub const MAX_BODY: usize = 1 << 20;

/// How to run one service.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    /// Which service.
    pub service: Service,
    /// Where to listen (port 0: any free port).
    pub listen: SocketAddr,
    /// Base URLs of the services it calls.
    pub peers: BTreeMap<Service, String>,
    /// Pid of the supervisor: the process exits with it.
    pub parent: Option<u32>,
}

/// Runs one service until killed. Prints `listening on http://ADDR` on stdout once it
/// accepts connections.
pub fn serve(opts: ServeOptions) -> Result<(), DeployError> {
    if let Some(parent) = opts.parent {
        if !crate::sys::die_with_parent(parent) {
            return Err(DeployError::Orphan(parent));
        }
    }
    let mut urls = BTreeMap::new();
    for &callee in opts.service.calls() {
        let url = opts.peers.get(&callee).ok_or(DeployError::MissingPeer {
            service: opts.service,
            missing: callee,
        })?;
        let uri = format!("{}/", url.trim_end_matches('/'))
            .parse::<http::Uri>()
            .map_err(|e| DeployError::io(format!("URL of {callee}"))(std::io::Error::other(e)))?;
        urls.insert(callee, uri);
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(DeployError::io("starting the runtime"))?;
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, async move {
        let listener = TcpListener::bind(opts.listen)
            .await
            .map_err(DeployError::io(format!("listening on {}", opts.listen)))?;
        let addr = listener
            .local_addr()
            .map_err(DeployError::io("reading the listening address"))?;
        let app = Rc::new(App {
            service: opts.service,
            peers: HttpPeers::new(urls),
            store: (opts.service == Service::Cart).then(MemStore::default),
        });
        {
            use std::io::Write;
            let mut out = std::io::stdout().lock();
            writeln!(out, "listening on http://{addr}")
                .and_then(|()| out.flush())
                .map_err(DeployError::io("writing the ready line"))?;
        }
        accept_loop(listener, app).await;
        Ok(())
    })
}

async fn accept_loop(listener: TcpListener, app: Rc<App>) {
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of descriptors or similar: wait for connections to close.
                eprintln!("{}: accept: {e}", app.service);
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let app = app.clone();
        tokio::task::spawn_local(async move {
            let svc = service_fn(move |req| {
                let app = app.clone();
                async move { Ok::<_, Infallible>(app.answer(req).await) }
            });
            // A client that goes away mid-request is its own business.
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

struct App {
    service: Service,
    peers: HttpPeers,
    store: Option<MemStore>,
}

impl App {
    async fn answer(&self, req: hyper::Request<Incoming>) -> hyper::Response<Full<Bytes>> {
        let (parts, body) = req.into_parts();
        let body = match Limited::new(body, MAX_BODY).collect().await {
            Ok(b) => b.to_bytes(),
            Err(e) => return respond(Err(ServiceError::bad_request(format!("body: {e}")))),
        };
        let mut peers = self.peers.clone();
        let out = match self.service {
            Service::Frontend => return self.page(&parts, &body, &mut peers).await,
            service if parts.method == http::Method::POST => {
                let store = self.store.as_ref().map(|s| s as &dyn Store);
                services::handle(service, &body, &mut peers, store).await
            }
            service => Err(ServiceError::new(405, format!("{service} takes POST"))),
        };
        respond(
            out.map_err(|e| {
                ServiceError::new(e.status, format!("{}: {}", self.service, e.message))
            }),
        )
    }

    /// The frontend's answer to a page request: the page with its status and headers, or
    /// the error as the other services answer theirs.
    async fn page(
        &self,
        parts: &http::request::Parts,
        body: &[u8],
        peers: &mut HttpPeers,
    ) -> hyper::Response<Full<Bytes>> {
        let header = |name: &str| parts.headers.get(name).and_then(|v| v.to_str().ok());
        // Several `Cookie` fields are one list (RFC 9113, 8.2.3).
        let cookies: Vec<&str> = (parts.headers.get_all(frontend::HEADERS[0]).iter())
            .filter_map(|v| v.to_str().ok())
            .collect();
        let cookies = (!cookies.is_empty()).then(|| cookies.join("; "));
        let answer = match frontend::Route::lookup(parts.method.as_str(), parts.uri.path()) {
            Ok((route, id)) => {
                let [_, referer, accept] = frontend::HEADERS.map(header);
                let cookie = cookies.as_deref();
                let page = frontend::PageRequest {
                    route,
                    product_id: id.as_deref(),
                    cookie,
                    referer,
                    accept,
                    body,
                };
                frontend::handle(&page, peers).await
            }
            Err(e) => Err(e),
        };
        let answer = match answer {
            Ok(a) => a,
            Err(e) => {
                return respond(Err(ServiceError::new(
                    e.status,
                    format!("{}: {}", self.service, e.message),
                )))
            }
        };
        let mut r = hyper::Response::builder().status(answer.status);
        for (name, value) in &answer.headers {
            r = r.header(*name, value.as_str());
        }
        r.body(Full::new(Bytes::from(answer.body)))
            .unwrap_or_else(|e| {
                respond(Err(ServiceError::internal(format!(
                    "{}: a header of the answer: {e}",
                    self.service
                ))))
            })
    }
}

fn respond(out: Result<Vec<u8>, ServiceError>) -> hyper::Response<Full<Bytes>> {
    let (status, kind, body) = match out {
        Ok(json) => (200, "application/json", json),
        Err(e) => (
            e.status,
            "text/plain",
            format!("{}\n", e.message).into_bytes(),
        ),
    };
    hyper::Response::builder()
        .status(status)
        .header(http::header::CONTENT_TYPE, kind)
        .body(Full::new(Bytes::from(body)))
        .expect("status and header are valid")
}
