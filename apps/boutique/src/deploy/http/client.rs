//! Calls from one service's process to the others: HTTP/1.1 `POST` of the JSON input to the
//! callee's URL over pooled keep-alive connections (hyper-util's client, `TCP_NODELAY`); the
//! calls of one `call_all` are in flight at once.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use crate::rpc::{Peers, Service, ServiceError};

/// How long a call may take before the caller gives up (504), as a zerohop call waits at
/// most the chain's timeout.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// Idle keep-alive connections kept per callee.
const IDLE_PER_CALLEE: usize = 256;

/// The callees of one service, by URL.
#[derive(Clone)]
pub struct HttpPeers {
    client: Client<HttpConnector, Full<Bytes>>,
    urls: Arc<BTreeMap<Service, http::Uri>>,
}

impl HttpPeers {
    /// Calls go to `urls` (`http://127.0.0.1:PORT/`); needs a tokio runtime to call.
    pub fn new(urls: BTreeMap<Service, http::Uri>) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(IDLE_PER_CALLEE)
            .build(connector);
        Self {
            client,
            urls: Arc::new(urls),
        }
    }

    async fn call(&self, service: Service, input: Vec<u8>) -> Result<Bytes, ServiceError> {
        let uri = self.urls.get(&service).ok_or_else(|| {
            ServiceError::internal(format!("no address for {service}: it may not be called"))
        })?;
        let req = http::Request::post(uri.clone())
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(input)))
            .map_err(|e| ServiceError::internal(format!("request to {service}: {e}")))?;
        let exchange = async {
            let resp = self.client.request(req).await.map_err(|e| {
                ServiceError::new(503, format!("{service} could not be reached: {e}"))
            })?;
            let status = resp.status();
            let body = resp
                .into_body()
                .collect()
                .await
                .map_err(|e| ServiceError::new(502, format!("{service} broke off: {e}")))?
                .to_bytes();
            Ok::<_, ServiceError>((status, body))
        };
        let (status, body) = tokio::time::timeout(CALL_TIMEOUT, exchange)
            .await
            .map_err(|_| {
                ServiceError::new(504, format!("{service} did not answer in {CALL_TIMEOUT:?}"))
            })??;
        if status == http::StatusCode::OK {
            Ok(body)
        } else {
            let message = String::from_utf8_lossy(&body).trim().to_owned();
            Err(ServiceError::new(status.as_u16(), message))
        }
    }
}

impl Peers for HttpPeers {
    type Output = Bytes;

    fn call_all(
        &mut self,
        calls: Vec<(Service, Vec<u8>)>,
    ) -> impl Future<Output = Vec<Result<Bytes, ServiceError>>> {
        join_all(
            calls
                .into_iter()
                .map(|(service, input)| self.call(service, input))
                .collect(),
        )
    }
}

/// Awaits every future at once; outputs in order.
pub async fn join_all<F: Future>(futures: Vec<F>) -> Vec<F::Output> {
    let mut futures: Vec<Pin<Box<F>>> = futures.into_iter().map(Box::pin).collect();
    let mut outputs: Vec<Option<F::Output>> = futures.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (f, out) in futures.iter_mut().zip(outputs.iter_mut()) {
            if out.is_none() {
                match f.as_mut().poll(cx) {
                    Poll::Ready(v) => *out = Some(v),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    outputs
        .into_iter()
        .map(|o| o.expect("every future finished"))
        .collect()
}
