//! An HTTP request into the chain: route, body, the headers functions asked for; its
//! answer.

use bytes::Bytes;
use http::{header, HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;

use crate::error::error_response;
use crate::ingress::{too_large, Reply};
use crate::{ErrorSource, Gateway, GatewayError};

/// An HTTP answer.
pub(crate) type Answer = Response<Full<Bytes>>;

impl Gateway {
    /// Answers one HTTP request.
    pub(crate) async fn handle(&self, req: Request<Incoming>) -> Answer {
        match self.handle_inner(req).await {
            Ok(reply) => reply.into_http(),
            Err(e) => e.into_response(),
        }
    }

    async fn handle_inner(&self, req: Request<Incoming>) -> Result<Reply, GatewayError> {
        let route = self
            .router
            .find(req.method(), req.uri().path())
            .inspect_err(|_| self.count_error())?;
        let max = self.config.max_body;
        if let Some(len) = content_length(req.headers()).inspect_err(|_| self.count_error())? {
            if len > max {
                self.count_error();
                return Err(too_large(max));
            }
        }
        let (parts, body) = req.into_parts();
        // The whole body first, as the chunks hyper read it (no copy), bounded in size and
        // time: a slow client holds memory of its own, never a slot.
        let chunks =
            match tokio::time::timeout(self.config.body_timeout, read_body(body, max)).await {
                Ok(Ok(chunks)) => chunks,
                Ok(Err(e)) => {
                    self.count_error();
                    return Err(e);
                }
                Err(_) => {
                    self.count_error();
                    return Err(GatewayError::new(
                        StatusCode::REQUEST_TIMEOUT,
                        ErrorSource::Gateway,
                        format!(
                            "the request body did not arrive within {:?} (body_timeout)",
                            self.config.body_timeout
                        ),
                    ));
                }
            };
        let mut meta: Vec<(&str, &str)> = Vec::new();
        for name in &self.plan.headers {
            for v in parts.headers.get_all(name.as_str()) {
                if let Ok(v) = v.to_str() {
                    meta.push((name, v));
                }
            }
        }
        self.submit(route, meta, &chunks).await
    }
}

impl Reply {
    /// The HTTP answer: the body as it is, or a function's error as a `text/plain` line.
    fn into_http(self) -> Answer {
        if self.status.is_success() || self.status.is_redirection() {
            let mut r = Response::new(Full::new(self.body));
            *r.status_mut() = self.status;
            return r;
        }
        let mut text = String::from_utf8_lossy(&self.body).into_owned();
        text.push('\n');
        error_response(self.status, text, &[])
    }
}

/// Reads a whole body as hyper's chunks, refusing it as soon as it exceeds `max`.
async fn read_body(mut body: Incoming, max: u64) -> Result<Vec<Bytes>, GatewayError> {
    let mut chunks = Vec::new();
    let mut len = 0u64;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| {
            GatewayError::new(
                StatusCode::BAD_REQUEST,
                ErrorSource::Gateway,
                format!("malformed request body: {e}"),
            )
        })?;
        if let Ok(data) = frame.into_data() {
            len += data.len() as u64;
            if len > max {
                return Err(too_large(max));
            }
            chunks.push(data);
        }
    }
    Ok(chunks)
}

fn content_length(h: &HeaderMap) -> Result<Option<u64>, GatewayError> {
    match h.get(header::CONTENT_LENGTH) {
        None => Ok(None),
        Some(v) => v
            .to_str()
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .map(Some)
            .ok_or_else(|| {
                GatewayError::new(
                    StatusCode::BAD_REQUEST,
                    ErrorSource::Gateway,
                    "Content-Length is not a number",
                )
            }),
    }
}
