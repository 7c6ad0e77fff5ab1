//! An HTTP request into the chain: route, body, the headers functions asked for; its
//! answer.

use std::net::IpAddr;

use bytes::Bytes;
use http::header::HeaderValue;
use http::{header, HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;

use crate::cloudevents;
use crate::error::error_response;
use crate::grpc;
use crate::ingress::{too_large, Reply};
use crate::{ErrorSource, Gateway, GatewayError};

/// An HTTP answer.
pub(crate) type Answer = Response<Full<Bytes>>;

impl Gateway {
    /// Answers one HTTP request from `peer`.
    pub(crate) async fn handle(&self, req: Request<Incoming>, peer: Option<IpAddr>) -> Answer {
        if let Some(a) = self.deferred_result(req.method(), req.uri().path()) {
            return a;
        }
        match self.handle_inner(req, peer, None).await {
            Ok((mut reply, route, mode)) => {
                let route_type = self.content_types[route as usize].as_ref();
                let ok = reply.status.is_success();
                if mode == cloudevents::Mode::Structured && ok {
                    // An event in, an event out (when the functions answered with one).
                    if let Some((body, headers)) =
                        cloudevents::wrap(&reply.body, &reply.headers, route_type)
                    {
                        (reply.body, reply.headers) = (body, headers);
                    }
                }
                reply.into_http(route_type)
            }
            Err(e) => e.into_response(),
        }
    }

    /// The reply, the route it came by, and how its body was read; `call` is the request's
    /// gRPC call, if it is one (see `grpc`).
    pub(crate) async fn handle_inner(
        &self,
        req: Request<Incoming>,
        peer: Option<IpAddr>,
        call: Option<&grpc::Call>,
    ) -> Result<(Reply, u16, cloudevents::Mode), GatewayError> {
        let uri = req.uri().clone();
        let matched = self
            .router
            .find(req.method(), uri.path())
            .inspect_err(|_| self.count_error())?;
        grpc::Call::check_route(call, &self.plan.routes[matched.route as usize], uri.path())
            .inspect_err(|_| self.count_error())?;
        // Who may, and how often: before the body is read.
        let admitted = self
            .config
            .access
            .admit(matched.route, req.headers(), peer, &self.plan.chain)
            .inspect_err(|_| self.count_error())?;
        let max = self.config.max_body;
        if let Some(len) = content_length(req.headers()).inspect_err(|_| self.count_error())? {
            if len > max {
                self.count_error();
                return Err(too_large(max));
            }
        }
        let mode = cloudevents::mode(req.headers()).inspect_err(|_| self.count_error())?;
        let (mut parts, body) = req.into_parts();
        // The whole body first, as the chunks hyper read it (no copy), bounded in size and
        // time: a slow client holds memory of its own, never a slot.
        let mut chunks =
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
        if mode == cloudevents::Mode::Structured {
            // The event's data alone goes into the slot; its attributes become the headers
            // binary mode would have carried.
            let event = chunks.concat();
            let data = cloudevents::unwrap(&event, &mut parts.headers)
                .inspect_err(|_| self.count_error())?;
            chunks = vec![data];
        }
        if call.is_some() {
            // The function gets the message alone.
            chunks = grpc::message(chunks).map_err(|e| {
                self.count_error();
                e.into_gateway()
            })?;
        }
        // What the functions asked for (`headers`), then the route's parameters.
        let mut meta: Vec<(&str, &str)> = Vec::new();
        // Lines whose value the gateway made (claims, joined cookies).
        let mut claims: Vec<(&str, String)> = Vec::new();
        for name in &self.plan.headers {
            match name.as_str() {
                zerohop_spec::meta::PATH => meta.push((name, uri.path())),
                zerohop_spec::meta::QUERY => {
                    if let Some(q) = uri.query() {
                        meta.push((name, q));
                    }
                }
                zerohop_spec::meta::CLIENT => {
                    if let Some(c) = &admitted.client {
                        meta.push((name, c));
                    }
                }
                n if n.starts_with(zerohop_spec::meta::CLAIM_PREFIX) => {
                    let claim = &n[zerohop_spec::meta::CLAIM_PREFIX.len()..];
                    if let Some(v) = admitted.claims.as_ref().and_then(|c| c.get(claim)) {
                        claims.push((name, claim_text(v)));
                    }
                }
                "cookie" => {
                    // HTTP/2 clients may split cookies over several fields (RFC 9113, 8.2.3):
                    // functions get them as one list, as from an HTTP/1.1 client.
                    let all: Vec<&str> = parts
                        .headers
                        .get_all(header::COOKIE)
                        .iter()
                        .filter_map(|v| v.to_str().ok())
                        .collect();
                    if !all.is_empty() {
                        claims.push((name, all.join("; ")));
                    }
                }
                _ => {
                    for v in parts.headers.get_all(name.as_str()) {
                        if let Ok(v) = v.to_str() {
                            meta.push((name, v));
                        }
                    }
                }
            }
        }
        let names: Vec<String> = matched
            .params
            .iter()
            .map(|(n, _)| zerohop_spec::meta::param(n))
            .collect();
        meta.extend(claims.iter().map(|(n, v)| (*n, v.as_str())));
        meta.extend(
            names
                .iter()
                .zip(&matched.params)
                .map(|(n, (_, v))| (n.as_str(), v.as_str())),
        );
        let route = matched.route;
        let timeout = grpc::Call::timeout(call, self.config.timeout);
        if call.is_none() {
            if let Some(accepted) = self.defer(route, &parts.headers, &meta, &chunks).await? {
                return Ok((accepted, route, mode));
            }
        }
        let reply = self.submit_retrying(route, &meta, &chunks, timeout).await?;
        Ok((reply, route, mode))
    }
}

impl Reply {
    /// The HTTP answer: the body as it is, or a function's error as a `text/plain` line.
    /// Its headers follow: the functions' own, then the route's `content_type` if they set
    /// no `Content-Type`.
    fn into_http(self, content_type: Option<&HeaderValue>) -> Answer {
        let mut r = if self.status.is_success() || self.status.is_redirection() {
            let mut r = Response::new(Full::new(self.body));
            *r.status_mut() = self.status;
            if let Some(t) = content_type {
                r.headers_mut().insert(header::CONTENT_TYPE, t.clone());
            }
            r
        } else {
            let mut text = String::from_utf8_lossy(&self.body).into_owned();
            text.push('\n');
            error_response(self.status, text, &[])
        };
        let h = r.headers_mut();
        let mut typed = false;
        for (name, value) in self.headers {
            // A function's own type replaces the route's (or the error's text/plain).
            if name == header::CONTENT_TYPE && !typed {
                h.remove(header::CONTENT_TYPE);
                typed = true;
            }
            h.append(name, value);
        }
        r
    }
}

/// A claim's value as one metadata line holds it: a string as it is, anything else as
/// compact JSON (which has no line breaks).
fn claim_text(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
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
