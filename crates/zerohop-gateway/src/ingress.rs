//! The way in for every protocol: a slot, the one copy in, the descriptor to the head
//! function, the answer (the one copy out).

use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue};
use http::{header, StatusCode};
use tokio::sync::oneshot;
use tracing::Instrument;
use zerohop_pool::{Descriptor, OwnedSlot, Owner, SlotHeader};
use zerohop_transport::{PartyId, SendError};

use crate::egress::Outcome;
use crate::response::response_headers;
use crate::{ErrorSource, Gateway, GatewayError, Inflight, META_RESERVE};

/// Removes a request from the in-flight table when its HTTP task ends before an outcome
/// arrived (timed out, client gone, send failed). An outcome's sender already removed it, so
/// the guard is disarmed then and the answered path takes the lock once, not twice.
struct InflightGuard<'a> {
    gw: &'a Gateway,
    id: u32,
    armed: bool,
}

impl Drop for InflightGuard<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        self.gw
            .inflight
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.id);
    }
}

impl Gateway {
    /// Runs one request through route `route` of the chain, whatever protocol it came by:
    /// takes a slot, writes `meta` (name, value pairs the chain's functions asked for: HTTP
    /// looks up only those, other protocols filter theirs with [`Gateway::asked`]) and the body (`chunks`, the only copy in), sends it to the head
    /// function and waits for the answer. Counts the outcome in [`GatewayStats`]: a reply
    /// with a 2xx or 3xx status is `ok`, anything else `errors`.
    ///
    /// [`GatewayStats`]: crate::GatewayStats
    pub async fn submit<'m, C: AsRef<[u8]>>(
        &self,
        route: u16,
        meta: impl IntoIterator<Item = (&'m str, &'m str)>,
        chunks: &[C],
    ) -> Result<Reply, GatewayError> {
        self.submit_within(route, meta, chunks, self.config.timeout)
            .await
    }

    /// [`Gateway::submit`] waiting at most `timeout` (a gRPC call's `grpc-timeout`), which
    /// the chain's timeout bounds.
    pub(crate) async fn submit_within<'m, C: AsRef<[u8]>>(
        &self,
        route: u16,
        meta: impl IntoIterator<Item = (&'m str, &'m str)>,
        chunks: &[C],
        timeout: Duration,
    ) -> Result<Reply, GatewayError> {
        // The request's life in a span, its id recorded once assigned. DEBUG: under the
        // agent's usual `info` filter the span is never created (a check of a few ns, no
        // allocation), so the error events below name the request themselves.
        let span = tracing::debug_span!("request", id = tracing::field::Empty, route);
        let result = self
            .submit_inner(route, meta, chunks, timeout.min(self.config.timeout), &span)
            .instrument(span.clone())
            .await;
        self.tally(&result);
        result
    }

    /// Runs one hop a peer node relays (a chain split over nodes): [`Gateway::submit`] on
    /// `route`, a relay route (`RoutePlan::relay_of`), with `meta` as the peer's slot held it
    /// and `timeout` the time the peer's request has left (at most the chain's timeout).
    /// The reply says whether the function left the sequence ([`Reply::left`]).
    pub async fn submit_relayed(
        &self,
        route: u16,
        meta: &[u8],
        body: &[u8],
        timeout: Duration,
    ) -> Result<Reply, GatewayError> {
        let relay = self
            .plan
            .routes
            .get(route as usize)
            .is_some_and(|r| r.relay_of.is_some());
        if !relay {
            self.count_error();
            return Err(GatewayError::new(
                StatusCode::NOT_FOUND,
                ErrorSource::Gateway,
                format!("route {route} takes no relayed hops"),
            ));
        }
        let text = String::from_utf8_lossy(meta);
        let pairs = text.lines().filter_map(|l| l.split_once(": "));
        let span = tracing::debug_span!("relayed", id = tracing::field::Empty, route);
        let result = self
            .submit_inner(
                route,
                pairs,
                &[body],
                timeout.min(self.config.timeout),
                &span,
            )
            .instrument(span.clone())
            .await;
        self.tally(&result);
        result
    }

    /// Counts a request's outcome in [`GatewayStats`]: a reply with a 2xx or 3xx status is
    /// `ok`, anything else `errors`.
    ///
    /// [`GatewayStats`]: crate::GatewayStats
    fn tally(&self, result: &Result<Reply, GatewayError>) {
        match result {
            Ok(r) if r.status.is_success() || r.status.is_redirection() => {
                // Relaxed: a counter for reports, it orders nothing.
                self.stats.ok.fetch_add(1, Ordering::Relaxed);
            }
            _ => self.count_error(),
        }
    }

    async fn submit_inner<'m, C: AsRef<[u8]>>(
        &self,
        route: u16,
        meta: impl IntoIterator<Item = (&'m str, &'m str)>,
        chunks: &[C],
        timeout: Duration,
        span: &tracing::Span,
    ) -> Result<Reply, GatewayError> {
        let head = self.plan.routes[route as usize].sequence[0];
        let total: u64 = chunks.iter().map(|c| c.as_ref().len() as u64).sum();
        if total > self.config.max_body {
            return Err(too_large(self.config.max_body));
        }
        let meta = self.meta(meta)?;
        let pool = &self.route_pools[route as usize];
        let Some(mut slot) = pool.alloc(Owner::party(self.party)) else {
            tracing::debug!(route, "every slot of the pool is in use; answered 503");
            return Err(GatewayError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                ErrorSource::Gateway,
                format!(
                    "all {} slots of the pool are in use; retry",
                    pool.slot_count()
                ),
            )
            .with_header(header::RETRY_AFTER, "1"));
        };
        let meta_len = meta.len();
        // The one copy in: the metadata and the body's chunks straight into the slot.
        let mut len = 0usize;
        {
            let data = slot.data_mut();
            data[..meta_len].copy_from_slice(meta.as_bytes());
            for c in chunks {
                let c = c.as_ref();
                data[meta_len + len..meta_len + len + c.len()].copy_from_slice(c);
                len += c.len();
            }
        }
        let id = self.ids.id(
            self.party,
            self.next_request.fetch_add(1, Ordering::Relaxed),
        );
        span.record("id", id);
        slot.set_header(&SlotHeader {
            request: id,
            route,
            meta_len: meta_len as u16,
            deadline_ms: zerohop_pool::monotonic_ms() + timeout.as_millis() as u64,
            ..SlotHeader::default()
        });
        let (tx, rx) = oneshot::channel();
        let sent = (slot.index(), slot.generation());
        let was_idle = {
            let mut table = self.inflight.lock().unwrap_or_else(|p| p.into_inner());
            let was_idle = table.is_empty();
            table.insert(
                id,
                Inflight {
                    tx,
                    slot: sent.0,
                    generation: sent.1,
                    route,
                },
            );
            was_idle
        };
        if was_idle {
            self.became_busy.notify_waiters();
        }
        let mut guard = InflightGuard {
            gw: self,
            id,
            armed: true,
        };
        let desc = slot.descriptor(id, len as u32, head);
        // Never wait for room on this thread: it serves every connection of the chain.
        let delivered = match self.picker.pick_state(head, pool) {
            Some((to, state)) => {
                let sent = self.sender.try_send(to, desc);
                if state != zerohop_pool::PartyState::Ready && sent.is_ok() {
                    // It waits in that party's queue until the agent activates it.
                    self.wants_instance.notify_one();
                }
                sent
            }
            None => Err(SendError::NoSuchParty(Descriptor::GATEWAY as PartyId)),
        };
        match delivered {
            Ok(()) => slot.into_sent(),
            Err(SendError::Full(_)) => {
                // Back-pressure, not a fault: the client is told to retry.
                tracing::debug!(
                    request = id,
                    function = self.plan.function_name(head),
                    "the head function's queue is full; answered 503"
                );
                return Err(GatewayError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    ErrorSource::Function(self.plan.function_name(head).to_owned()),
                    "its queue is full (the function is behind or stuck); retry",
                )
                .with_header(header::RETRY_AFTER, "1"));
            }
            Err(e) => {
                tracing::warn!(
                    request = id,
                    function = self.plan.function_name(head),
                    "could not send the request to its head function: {e}; answered 503"
                );
                return Err(GatewayError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    ErrorSource::Transport,
                    format!("could not reach `{}`: {e}", self.plan.function_name(head)),
                ));
            }
        }
        self.stats.accepted.fetch_add(1, Ordering::Relaxed);
        let outcome = tokio::time::timeout(timeout, rx).await;
        // Whoever resolved the oneshot (`complete`, or dropping the table) took the entry out.
        guard.armed = outcome.is_err();
        if !matches!(outcome, Ok(Ok(Outcome::Done { .. }))) {
            // No answer: if the head never took the slot (the descriptor still waits in the
            // queue of a dead or stuck instance), it is still ours under the generation we
            // sent; take it back so it cannot leak. A slot anyone took is left alone.
            pool.revoke(sent.0, sent.1, Owner::party(self.party));
        }
        match outcome {
            Ok(Ok(Outcome::Done {
                slot,
                len,
                header,
                function,
            })) => self.reply(slot, len, &header, function),
            // Logged with the request where it failed (an instance's death, the receive
            // path).
            Ok(Ok(Outcome::Failed(e))) => Err(e),
            Ok(Err(_)) => {
                tracing::warn!(request = id, "dropped without an answer; answered 502");
                Err(GatewayError::new(
                    StatusCode::BAD_GATEWAY,
                    ErrorSource::Gateway,
                    "the request was dropped without an answer",
                ))
            }
            Err(_) => {
                tracing::warn!(
                    request = id,
                    route,
                    "no answer within {timeout:?} (timeout); answered 504",
                );
                Err(GatewayError::new(
                    StatusCode::GATEWAY_TIMEOUT,
                    ErrorSource::Gateway,
                    format!(
                        "chain '{}' did not answer within {timeout:?}",
                        self.plan.chain
                    ),
                ))
            }
        }
    }

    /// The one copy out: the reply's body from the slot; the slot is freed on return.
    /// `header` is the copy validated when the slot was taken.
    fn reply(
        &self,
        slot: OwnedSlot,
        len: u32,
        header: &SlotHeader,
        function: u8,
    ) -> Result<Reply, GatewayError> {
        let m = header.meta_len as usize;
        let body = Bytes::copy_from_slice(&slot.data()[m..m + len as usize]);
        let headers = response_headers(&slot.data()[..m]);
        drop(slot);
        let headers = headers.map_err(|why| {
            tracing::warn!(
                request = header.request,
                function = self.plan.function_name(function),
                "{why}; answered 502"
            );
            GatewayError::new(
                StatusCode::BAD_GATEWAY,
                ErrorSource::Function(self.plan.function_name(function).to_owned()),
                format!("answered with a bad response header: {why}"),
            )
        })?;
        let status = match header.status {
            0 => StatusCode::OK,
            s => match StatusCode::from_u16(s) {
                Ok(st) if answerable(st) => st,
                _ => {
                    tracing::warn!(
                        request = header.request,
                        function = self.plan.function_name(function),
                        "answered with status {s}, which has no body; answered 502"
                    );
                    return Err(GatewayError::new(
                        StatusCode::BAD_GATEWAY,
                        ErrorSource::Function(self.plan.function_name(function).to_owned()),
                        format!("answered with status {s}, which is not a final status with a body (200..=599 but 204, 205, 304)"),
                    ));
                }
            },
        };
        Ok(Reply {
            status,
            body,
            headers,
            left: header.flags & SlotHeader::FLAG_DYNAMIC != 0,
        })
    }

    /// The metadata area's text: `name: value\n` lines, at most [`META_RESERVE`] bytes.
    fn meta<'m>(
        &self,
        pairs: impl IntoIterator<Item = (&'m str, &'m str)>,
    ) -> Result<String, GatewayError> {
        let mut meta = String::new();
        for (name, value) in pairs {
            if value.contains('\n') || value.contains('\r') {
                continue;
            }
            meta.push_str(name);
            meta.push_str(": ");
            meta.push_str(value);
            meta.push('\n');
        }
        if meta.len() > META_RESERVE {
            return Err(GatewayError::new(
                StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                ErrorSource::Gateway,
                format!(
                    "the headers the chain's functions ask for take {} bytes, more than {META_RESERVE}",
                    meta.len()
                ),
            ));
        }
        Ok(meta)
    }
}

impl Gateway {
    /// The pairs of `pairs` whose name a function of the chain asked for (its `headers`,
    /// case-insensitive): what a protocol without HTTP's headers hands to [`Gateway::submit`].
    pub(crate) fn asked<'a, 'm: 'a>(
        &'a self,
        pairs: impl IntoIterator<Item = (&'m str, &'m str)> + 'a,
    ) -> impl Iterator<Item = (&'m str, &'m str)> + 'a {
        let headers = &self.plan.headers;
        pairs
            .into_iter()
            .filter(move |(name, _)| headers.iter().any(|h| h.eq_ignore_ascii_case(name)))
    }
}

/// What the chain answered a request with: the last function's status and output, or a
/// function's error (status 4xx/5xx, its one-line message as the body).
#[derive(Debug)]
pub struct Reply {
    /// 200 unless the function set another final status.
    pub status: StatusCode,
    /// The output, copied out of the slot.
    pub body: Bytes,
    /// Response headers the functions set (HTTP sends them; MQTT and CoAP have no place
    /// for them).
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// The request left its route's sequence before the end (dynamic routing, or a function
    /// that replied early).
    pub left: bool,
}

/// A status a function may answer with: final (200..=599) and one that carries a body.
fn answerable(s: StatusCode) -> bool {
    (200..=599).contains(&s.as_u16())
        && s != StatusCode::NO_CONTENT
        && s != StatusCode::RESET_CONTENT
        && s != StatusCode::NOT_MODIFIED
}

pub(crate) fn too_large(max: u64) -> GatewayError {
    GatewayError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        ErrorSource::Gateway,
        format!("request body exceeds the chain's limit of {max} bytes (max_body)"),
    )
}
