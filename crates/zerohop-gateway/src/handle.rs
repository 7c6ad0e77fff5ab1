//! An HTTP request into the chain: route, body, the headers functions asked for; its
//! answer.

use std::net::IpAddr;

use bytes::Bytes;
use http::header::HeaderValue;
use http::{header, HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, Either, Full};
use hyper::body::Incoming;
use zerohop_pool::Owner;

use crate::body::{self, AnswerBody, Received, Sink};
use crate::cloudevents;
use crate::error::error_response;
use crate::grpc;
use crate::ingress::{too_large, Reply};
use crate::{ErrorSource, Gateway, GatewayError};

/// An HTTP answer: made whole by the gateway (an error), or sent in pieces: the chain's
/// reply (out of its slot when it is large), an async result (out of its file).
pub(crate) type Streamed = Response<Either<Full<Bytes>, AnswerBody>>;

impl Gateway {
    /// Answers one HTTP request from `peer`.
    pub(crate) async fn handle(&self, req: Request<Incoming>, peer: Option<IpAddr>) -> Streamed {
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
            Err(e) => e.into_response().map(Either::Left),
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
        let length = content_length(req.headers()).inspect_err(|_| self.count_error())?;
        if length.is_some_and(|len| len > max) {
            self.count_error();
            // Refused before a byte is read: heard out a little all the same (see
            // `body::linger`), unless the client waits for `100 Continue`.
            if !waits_for_continue(req.headers()) {
                let mut incoming = req.into_body();
                body::linger(&mut incoming).await;
            }
            return Err(too_large(max));
        }
        let mode = cloudevents::mode(req.headers()).inspect_err(|_| self.count_error())?;
        let (mut parts, body) = req.into_parts();
        let route = matched.route;
        let small = self.route_pools[route as usize].slot_capacity();
        let mut body = Some(body);
        let mut event_data = None;
        if mode == cloudevents::Mode::Structured {
            // The event's data alone goes into the slot; its attributes become the headers
            // binary mode would have carried, so the metadata waits for the whole event,
            // which must fit a slot.
            let limit = max.min(small as u64);
            let incoming = body.take().expect("the body is read once");
            let event = tokio::time::timeout(self.config.body_timeout, read_body(incoming, limit))
                .await
                .unwrap_or_else(|_| Err(self.body_late()))
                .map_err(|e| {
                    self.count_error();
                    match e.status {
                        StatusCode::PAYLOAD_TOO_LARGE if limit < max => GatewayError::new(
                            StatusCode::PAYLOAD_TOO_LARGE,
                            ErrorSource::Gateway,
                            format!(
                                "a structured CloudEvent must fit a slot ({limit} bytes); send \
                                 a larger event in binary mode (its attributes as ce-* headers)"
                            ),
                        ),
                        _ => e,
                    }
                })?
                .concat();
            let data = cloudevents::unwrap(&event, &mut parts.headers)
                .inspect_err(|_| self.count_error())?;
            event_data = Some(data);
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
        let received = match (event_data, body) {
            (Some(data), _) => Received::Chunks(vec![data]),
            (None, Some(incoming)) => {
                // The metadata before the body: a body larger than a slot is streamed into
                // a large slot behind it as it arrives.
                let text = self
                    .meta(meta.iter().copied())
                    .inspect_err(|_| self.count_error())?;
                let mut sink = Sink::new(
                    &text,
                    small,
                    self.large_pool(route),
                    Owner::party(self.party),
                    max,
                    call.is_some(),
                );
                // A client that waits for `100 Continue` sends nothing after an early refusal;
                // any other is heard out a little (see `body::linger`).
                let waits = waits_for_continue(&parts.headers);
                let read = async move {
                    let mut incoming = incoming;
                    if let Err(e) = sink.expect(length) {
                        drop(sink);
                        if !waits {
                            body::linger(&mut incoming).await;
                        }
                        return Err(e);
                    }
                    body::read(sink, incoming).await
                };
                // Awaited here, not in a helper `async fn`: one would hold `read` twice in its
                // state (as its argument and inside the `Timeout`), and this future is copied
                // whole on its way into the connection's task.
                tokio::time::timeout(self.config.body_timeout, read)
                    .await
                    .unwrap_or_else(|_| Err(self.body_late()))
                    .inspect_err(|_| self.count_error())?
            }
            (None, None) => unreachable!("the body is read once"),
        };
        let timeout = grpc::Call::timeout(call, self.config.timeout);
        let received = if call.is_none() {
            match self.defer(route, &parts.headers, &meta, received).await? {
                Ok(accepted) => return Ok((accepted, route, mode)),
                Err(received) => received,
            }
        } else {
            received
        };
        let reply = match received {
            Received::Chunks(chunks) => {
                self.submit_retrying(route, &meta, &chunks, timeout).await?
            }
            // Sent as it is: it cannot be sent twice, so no retries.
            Received::Slot(filled) => self.submit_filled(route, filled, timeout).await?,
        };
        Ok((reply, route, mode))
    }

    /// The 408 for a request body that did not arrive within `body_timeout`.
    fn body_late(&self) -> GatewayError {
        GatewayError::new(
            StatusCode::REQUEST_TIMEOUT,
            ErrorSource::Gateway,
            format!(
                "the request body did not arrive within {:?} (body_timeout)",
                self.config.body_timeout
            ),
        )
    }
}

impl Reply {
    /// The HTTP answer: the body as it is, or a function's error as a `text/plain` line.
    /// Its headers follow: the functions' own, then the route's `content_type` if they set
    /// no `Content-Type`.
    fn into_http(self, content_type: Option<&HeaderValue>) -> Streamed {
        let mut r = if self.status.is_success() || self.status.is_redirection() {
            let mut r = Response::new(Either::Right(AnswerBody::new(self.body)));
            *r.status_mut() = self.status;
            if let Some(t) = content_type {
                r.headers_mut().insert(header::CONTENT_TYPE, t.clone());
            }
            r
        } else {
            let mut text = String::from_utf8_lossy(&self.body).into_owned();
            text.push('\n');
            error_response(self.status, text, &[]).map(Either::Left)
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
        let frame = frame.map_err(body::malformed)?;
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

/// Whether the client sends its body only after a `100 Continue` (`Expect: 100-continue`):
/// refused early, it sends nothing more.
fn waits_for_continue(h: &HeaderMap) -> bool {
    h.get(header::EXPECT)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"))
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
