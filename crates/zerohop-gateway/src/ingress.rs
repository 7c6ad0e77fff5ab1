//! The way in for every protocol: a slot, the one copy in, the descriptor to the head
//! function, the answer (the one copy out).

use std::ops::Range;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue};
use http::{header, StatusCode};
use tokio::sync::oneshot;
use tracing::Instrument;
use zerohop_pool::{Descriptor, OwnedSlot, Owner, Pool, SlotHeader};
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

/// Answers of at most this many bytes are copied out of their slot, which is freed at once;
/// larger ones are written to the client from the slot. Below it a copy costs no more than
/// the slot-backed buffer it would save (one allocation either way; measured on this
/// machine: a copy of up to 256 bytes 15 ns, of 1 KiB 24 ns, of 60 KiB 1.3 us; the
/// slot-backed buffer 20-25 ns at any size), and a copied answer holds no slot while a slow
/// client reads it.
pub(crate) const COPY_UP_TO: usize = 1024;

/// Of a gateway thread's share of a pool of small slots, the part its answers may hold
/// while they are written: 1 in `HOLD_SHARE`. Past it, answers are copied out as small ones
/// are, so clients that stop reading can keep at most this part of the pool (each slot for
/// at most `body_timeout` without progress), never all of it.
const HOLD_SHARE: u32 = 4;

/// What becomes of the slot of a reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Keep {
    /// The body is copied out and the slot freed: MQTT, CoAP, relayed hops and the async
    /// result store hold replies for an unknown time, so they never hold a slot.
    Copy,
    /// A body over [`COPY_UP_TO`] bytes stays in its slot ([`SlotBytes`]) until the HTTP
    /// answer that writes it is written or dropped (the one copy out is then the kernel's,
    /// into the socket); a client that stops reading holds it at most `body_timeout`
    /// without progress (see `stall`). A slot of a small pool is kept only within the
    /// gateway's [`HeldSlots`] budget; a large slot always (copying it would take as much
    /// memory again, and the large pool bounds itself).
    Slot,
}

/// Slots of small pools that a gateway thread's answers hold while they are written, and
/// how many they may: see [`HOLD_SHARE`].
#[derive(Debug)]
pub(crate) struct HeldSlots {
    held: AtomicU32,
    limit: u32,
}

impl HeldSlots {
    /// A budget of `slots / (HOLD_SHARE * gateways)` slots, at least one.
    pub(crate) fn new(slots: u32, gateways: u16) -> Arc<Self> {
        Arc::new(Self {
            held: AtomicU32::new(0),
            limit: (slots / (HOLD_SHARE * u32::from(gateways.max(1)))).max(1),
        })
    }

    /// One more slot held, while the budget allows.
    fn take(self: &Arc<Self>) -> Option<Held> {
        // Relaxed: a count, it orders no memory (the slot's owner word does that).
        let before = self.held.fetch_add(1, Ordering::Relaxed);
        if before >= self.limit {
            self.held.fetch_sub(1, Ordering::Relaxed);
            return None;
        }
        Some(Held(self.clone()))
    }
}

/// One slot counted in [`HeldSlots`], until dropped.
#[derive(Debug)]
pub(crate) struct Held(Arc<HeldSlots>);

impl Drop for Held {
    fn drop(&mut self) {
        // Relaxed: see `HeldSlots::take`.
        self.0.held.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A slot holding a request: its metadata lines, then `len` bytes of body.
pub(crate) struct Filled {
    slot: OwnedSlot,
    meta_len: usize,
    len: usize,
}

/// The metadata and body do not fit the slot.
#[derive(Debug, thiserror::Error)]
#[error("the request does not fit the slot")]
pub(crate) struct Overflow;

impl Filled {
    /// `slot` with `meta` written and no body yet.
    pub(crate) fn start(mut slot: OwnedSlot, meta: &str) -> Result<Self, Overflow> {
        let area = slot.data_mut().get_mut(..meta.len()).ok_or(Overflow)?;
        area.copy_from_slice(meta.as_bytes());
        Ok(Self {
            slot,
            meta_len: meta.len(),
            len: 0,
        })
    }

    /// Appends `data` to the body (the one copy in).
    pub(crate) fn append(&mut self, data: &[u8]) -> Result<(), Overflow> {
        let at = self.meta_len + self.len;
        let end = at.checked_add(data.len()).ok_or(Overflow)?;
        let area = self.slot.data_mut();
        area.get_mut(at..end).ok_or(Overflow)?.copy_from_slice(data);
        self.len += data.len();
        Ok(())
    }

    /// Bytes of body so far.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The body so far.
    pub(crate) fn body(&self) -> &[u8] {
        &self.slot.data()[self.meta_len..self.meta_len + self.len]
    }
}

/// A reply's body left in its slot: the slot is freed when the last [`Bytes`] made from it
/// (the answer body's pieces) is dropped, which happens once whatever becomes of the answer
/// (written, its connection gone or cut by `stall`, its HTTP/2 stream reset): the slot is
/// this value's, and [`Bytes`] drops its owner exactly once.
pub(crate) struct SlotBytes {
    slot: OwnedSlot,
    range: Range<usize>,
    /// Its place in the budget of held small slots (none for a large slot).
    _held: Option<Held>,
}

impl SlotBytes {
    /// `range` of `slot`'s data area as [`Bytes`], without a copy.
    pub(crate) fn bytes(slot: OwnedSlot, range: Range<usize>) -> Bytes {
        Self::held(slot, range, None)
    }

    fn held(slot: OwnedSlot, range: Range<usize>, held: Option<Held>) -> Bytes {
        Bytes::from_owner(SlotBytes {
            slot,
            range,
            _held: held,
        })
    }
}

impl AsRef<[u8]> for SlotBytes {
    fn as_ref(&self) -> &[u8] {
        // The gateway owns the slot until this is dropped: no party of the chain may write
        // it. One that does anyway, against the protocol, garbles only this answer: its
        // length (the range) was fixed and checked against the pool's geometry when the
        // answer was taken, and the framing around it is the gateway's.
        &self.slot.data()[self.range.clone()]
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
        let timeout = self.config.timeout;
        self.submit_keeping(route, meta, chunks, timeout, Keep::Copy)
            .await
    }

    /// [`Gateway::submit`] for an HTTP or gRPC request, waiting at most `timeout` (a gRPC
    /// call's `grpc-timeout`), which the chain's timeout bounds. A reply over
    /// [`COPY_UP_TO`] bytes is a view of its slot ([`Keep::Slot`]): the HTTP answer writes
    /// it to the client from there and frees the slot when it is dropped.
    pub(crate) async fn submit_within<'m, C: AsRef<[u8]>>(
        &self,
        route: u16,
        meta: impl IntoIterator<Item = (&'m str, &'m str)>,
        chunks: &[C],
        timeout: Duration,
    ) -> Result<Reply, GatewayError> {
        self.submit_keeping(route, meta, chunks, timeout, Keep::Slot)
            .await
    }

    async fn submit_keeping<'m, C: AsRef<[u8]>>(
        &self,
        route: u16,
        meta: impl IntoIterator<Item = (&'m str, &'m str)>,
        chunks: &[C],
        timeout: Duration,
        keep: Keep,
    ) -> Result<Reply, GatewayError> {
        // The request's life in a span, its id recorded once assigned. DEBUG: under the
        // agent's usual `info` filter the span is never created (a check of a few ns, no
        // allocation), so the error events below name the request themselves.
        let span = tracing::debug_span!("request", id = tracing::field::Empty, route);
        let timeout = timeout.min(self.config.timeout);
        let result = async {
            let filled = self.fill(route, meta, chunks)?;
            self.send_and_wait(route, filled, timeout, keep, &span)
                .await
        }
        .instrument(span.clone())
        .await;
        self.tally(&result);
        result
    }

    /// Runs a request whose body the HTTP side already streamed into a slot
    /// ([`crate::body::Sink`]): [`Gateway::submit_within`] without the copy. Such a body
    /// cannot be sent twice, so an `idempotent` route's retries do not apply.
    pub(crate) async fn submit_filled(
        &self,
        route: u16,
        filled: Filled,
        timeout: Duration,
    ) -> Result<Reply, GatewayError> {
        let span = tracing::debug_span!("request", id = tracing::field::Empty, route);
        let timeout = timeout.min(self.config.timeout);
        let result = self
            .send_and_wait(route, filled, timeout, Keep::Slot, &span)
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
        let timeout = timeout.min(self.config.timeout);
        let result = async {
            let filled = self.fill(route, pairs, &[body])?;
            self.send_and_wait(route, filled, timeout, Keep::Copy, &span)
                .await
        }
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

    /// Fills a slot for route `route`: the metadata lines of `meta`, then the body's
    /// `chunks` (the one copy in). A body that fits beside the metadata in a slot of the
    /// route's pool goes there, a larger one into a slot of its large pool.
    fn fill<'m, C: AsRef<[u8]>>(
        &self,
        route: u16,
        meta: impl IntoIterator<Item = (&'m str, &'m str)>,
        chunks: &[C],
    ) -> Result<Filled, GatewayError> {
        let total: u64 = chunks.iter().map(|c| c.as_ref().len() as u64).sum();
        if total > self.config.max_body {
            return Err(too_large(self.config.max_body));
        }
        let meta = self.meta(meta)?;
        let small = &self.route_pools[route as usize];
        let pool = if (meta.len() as u64).saturating_add(total) <= small.slot_capacity() as u64 {
            small
        } else {
            match self.large_pool(route) {
                Some(large) => large,
                None => return Err(too_large(self.config.max_body)),
            }
        };
        let large = !Arc::ptr_eq(pool, small);
        let Some(slot) = pool.alloc(Owner::party(self.party)) else {
            tracing::debug!(
                route,
                large,
                "every slot of the pool is in use; answered 503"
            );
            return Err(no_free_slot(pool, large));
        };
        let too_large = |_| too_large(self.config.max_body);
        let mut filled = Filled::start(slot, &meta).map_err(too_large)?;
        for c in chunks {
            filled.append(c.as_ref()).map_err(too_large)?;
        }
        Ok(filled)
    }

    /// Sends the request in `filled` to the head function of route `route` and waits at
    /// most `timeout` for its answer.
    async fn send_and_wait(
        &self,
        route: u16,
        filled: Filled,
        timeout: Duration,
        keep: Keep,
        span: &tracing::Span,
    ) -> Result<Reply, GatewayError> {
        let head = self.plan.routes[route as usize].sequence[0];
        let Filled {
            mut slot,
            meta_len,
            len,
        } = filled;
        let pool = slot.pool().clone();
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
        // Party states live in the route's (small) pool, whichever pool holds the body.
        let parties = &self.route_pools[route as usize];
        let delivered = match self.picker.pick_state(head, parties, &*self.sender) {
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
            })) => self.reply(slot, len, &header, function, keep),
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

    /// The reply's body out of the slot: copied (the one copy out, and the slot is freed on
    /// return), or, for [`Keep::Slot`] and more than [`COPY_UP_TO`] bytes, a view of the
    /// slot that frees it when its last piece is dropped (the HTTP answer writes it from
    /// there, and the copy out is the kernel's, into the socket). `header` is the copy
    /// validated when the slot was taken.
    fn reply(
        &self,
        slot: OwnedSlot,
        len: u32,
        header: &SlotHeader,
        function: u8,
        keep: Keep,
    ) -> Result<Reply, GatewayError> {
        let m = header.meta_len as usize;
        let headers = response_headers(&slot.data()[..m]);
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
        let range = m..m + len as usize;
        let body = match keep {
            Keep::Slot if range.len() > COPY_UP_TO => {
                if slot.pool().releases() {
                    SlotBytes::bytes(slot, range)
                } else {
                    match self.held_slots.take() {
                        Some(held) => SlotBytes::held(slot, range, Some(held)),
                        // Past the budget: copied, as a small answer.
                        None => Bytes::copy_from_slice(&slot.data()[range]),
                    }
                }
            }
            _ => Bytes::copy_from_slice(&slot.data()[range]),
        };
        Ok(Reply {
            status,
            body,
            headers,
            left: header.flags & SlotHeader::FLAG_DYNAMIC != 0,
        })
    }

    /// The metadata area's text: `name: value\n` lines, at most [`META_RESERVE`] bytes.
    pub(crate) fn meta<'m>(
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
    /// The output, copied out of the slot; for an HTTP or gRPC request and more than 1 KiB
    /// (while few enough slots are held so), a view of the slot, which is freed when the
    /// last clone of it is dropped.
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

/// The 503 for a pool with no free slot; `large`: the pool of bodies larger than a slot.
pub(crate) fn no_free_slot(pool: &Pool, large: bool) -> GatewayError {
    let what = if large {
        format!(
            "all {} large slots (for bodies larger than a slot) are in use; retry",
            pool.slot_count()
        )
    } else {
        format!(
            "all {} slots of the pool are in use; retry",
            pool.slot_count()
        )
    };
    GatewayError::new(StatusCode::SERVICE_UNAVAILABLE, ErrorSource::Gateway, what)
        .with_header(header::RETRY_AFTER, "1")
}

pub(crate) fn too_large(max: u64) -> GatewayError {
    GatewayError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        ErrorSource::Gateway,
        format!("request body exceeds the chain's limit of {max} bytes (max_body)"),
    )
}
