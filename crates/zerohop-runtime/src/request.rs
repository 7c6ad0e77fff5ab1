//! What a handler sees and returns.

use zerohop_pool::{OwnedSlot, Pools, SlotHeader, State, StateError};
use zerohop_spec::meta;
use zerohop_transport::Plan;

use crate::call::{not_allowed, Answer, CallError, Calls};

/// Where the request goes after the handler.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Next {
    /// On along the route's sequence (or back to the client after the last function).
    Continue,
    /// To the named function (dynamic routing; it must be in this function's `next` list
    /// in the spec). After it, the request returns to the client.
    Forward(String),
    /// Straight back to the client, skipping the rest of the sequence.
    Reply,
}

/// A handler's error: the client gets `status` and the message (prefixed with the
/// function's name).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{status}: {message}")]
pub struct HandlerError {
    /// HTTP status for the client (400..=599).
    pub status: u16,
    /// One line saying what went wrong.
    pub message: String,
}

impl From<CallError> for HandlerError {
    fn from(e: CallError) -> Self {
        HandlerError::new(e.status, e.to_string())
    }
}

impl HandlerError {
    /// An error with a status.
    pub fn new(status: u16, message: impl Into<String>) -> Self {
        Self {
            status: if (400..=599).contains(&status) {
                status
            } else {
                500
            },
            message: message.into(),
        }
    }

    /// 400: the request cannot be processed.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, message)
    }

    /// 404: what the request names does not exist.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(404, message)
    }

    /// 500: the function failed.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(500, message)
    }

    /// 500: `status` is not one [`Request::set_status`] takes (SDKs whose integers are wider
    /// than `u16` refuse theirs with it too).
    pub fn status_refused(status: impl std::fmt::Display) -> Self {
        Self::internal(format!(
            "status {status} is not one a function answers with: 200..=399 but 204, 205 and \
             304 (an error status is answered by failing the request)"
        ))
    }
}

/// One request, viewed in place in shared memory.
pub struct Request<'a> {
    pub(crate) slot: &'a mut OwnedSlot,
    pub(crate) header: SlotHeader,
    pub(crate) len: usize,
    pub(crate) plan: &'a Plan,
    pub(crate) function: u8,
    /// How to make calls (`None` for a function that may call nothing).
    pub(crate) calls: Option<&'a Calls<'a>>,
    /// The outputs of the static fan-out this function joins, in the spec's order.
    pub(crate) branches: Vec<Result<Answer, CallError>>,
    /// The chain's state store, for a function with `state`.
    pub(crate) state: Option<&'a State>,
    /// The pools this instance maps: where a body that outgrows its slot finds the large
    /// pool of its domain.
    pub(crate) pools: &'a Pools,
}

impl From<StateError> for HandlerError {
    /// A state error as the request's answer: 507 for a full store, 413 for a value over
    /// the store's `value_size`, 400 for a bad key, 503 for a lock held too long.
    fn from(e: StateError) -> Self {
        let status = match e {
            StateError::Full { .. } => 507,
            StateError::ValueTooLarge { .. } => 413,
            StateError::BadKey { .. } => 400,
            StateError::Busy { .. } => 503,
        };
        HandlerError::new(status, e.to_string())
    }
}

impl Request<'_> {
    /// The gateway's id of this request.
    pub fn id(&self) -> u32 {
        self.header.request
    }

    /// The request's slot in the chain's pool and the slot's generation, as its descriptor
    /// carries them. For tests of the transports that forge descriptors; not needed by
    /// functions.
    #[doc(hidden)]
    pub fn slot_and_generation(&self) -> (u32, u32) {
        (self.slot.index(), self.slot.generation())
    }

    /// Name of the function handling it (this one).
    pub fn function(&self) -> &str {
        self.plan.function_name(self.function)
    }

    /// The index of the route the request came in by (for a hop a peer node relayed, the
    /// route it stands for).
    #[doc(hidden)]
    pub fn route_index(&self) -> u16 {
        self.plan
            .routes
            .get(self.header.route as usize)
            .and_then(|r| r.relay_of)
            .unwrap_or(self.header.route)
    }

    /// The slot header's position in the route and flags, and the request's deadline
    /// (`CLOCK_MONOTONIC` milliseconds, 0: none), as the agent relays them to a peer node.
    #[doc(hidden)]
    pub fn hop_flags_deadline(&self) -> (u8, u8, u64) {
        (self.header.hop, self.header.flags, self.header.deadline_ms)
    }

    /// HTTP method of the route the request came in by.
    pub fn method(&self) -> &str {
        self.plan
            .routes
            .get(self.route_index() as usize)
            .map_or("", |r| r.method.as_str())
    }

    /// The request's path: as the client sent it (percent-encoded) when a function of the
    /// chain lists `:path` in its `headers`, otherwise the path of the route it came in by
    /// (with its parameters as written in the spec, e.g. `/product/{id}`).
    pub fn path(&self) -> &str {
        self.header(meta::PATH).unwrap_or_else(|| self.route_path())
    }

    /// The path of the route the request came in by, as the spec writes it
    /// (`/product/{id}`, `/static/{*rest}`).
    pub fn route_path(&self) -> &str {
        self.plan
            .routes
            .get(self.route_index() as usize)
            .map_or("", |r| r.path.as_str())
    }

    /// A parameter of the route's path (`{id}` in `GET /product/{id}`, `rest` for a trailing
    /// `*`), percent-decoded.
    pub fn param(&self, name: &str) -> Option<&str> {
        let key = meta::param(name);
        meta::lines(self.meta()).find_map(|(k, v)| (k == key).then_some(v))
    }

    /// The query string as the client sent it (after `?`), when a function of the chain
    /// lists `:query` in its `headers` and the request had one.
    pub fn query_string(&self) -> Option<&str> {
        self.header(meta::QUERY)
    }

    /// The first value of query parameter `name` (`application/x-www-form-urlencoded`
    /// decoding), when a function lists `:query`; see [`Request::query_string`].
    pub fn query(&self, name: &str) -> Option<String> {
        form_urlencoded::parse(self.query_string()?.as_bytes())
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.into_owned())
    }

    /// The value of cookie `name` from the request's `Cookie` headers, when a function of
    /// the chain lists `cookie` in its `headers`.
    pub fn cookie(&self, name: &str) -> Option<&str> {
        meta::lines(self.meta())
            .filter(|(k, _)| k.eq_ignore_ascii_case("cookie"))
            .flat_map(|(_, v)| v.split(';'))
            .find_map(|pair| {
                let (k, v) = pair.trim().split_once('=')?;
                (k.trim() == name).then(|| v.trim().trim_matches('"'))
            })
    }

    /// Sets the answer's status for the client: 200 (the default) to 399, except 204, 205
    /// and 304, which carry no body (an error status is a [`HandlerError`]). With a 3xx, add
    /// a `Location` ([`Request::add_response_header`]). A later function of the route may
    /// set another; a call's answer with a 3xx is an error for its caller.
    pub fn set_status(&mut self, status: u16) -> Result<(), HandlerError> {
        if !(200..=399).contains(&status) || matches!(status, 204 | 205 | 304) {
            return Err(HandlerError::status_refused(status));
        }
        self.header.status = status;
        Ok(())
    }

    /// Adds a header to the client's answer (HTTP only: MQTT and CoAP answers have no
    /// headers), e.g. `Location` with a 303, `Set-Cookie`, or a `Content-Type` of its own
    /// (which replaces the route's `content_type`). Headers about the framing and the
    /// connection (`Content-Length`, `Connection`, ...) are the gateway's and refused here;
    /// at most 64 per answer. The header rides in the slot's metadata area, so the body
    /// moves up by the line's length within its slot (no new slot, no copy elsewhere).
    pub fn add_response_header(&mut self, name: &str, value: &str) -> Result<(), HandlerError> {
        if let Some(why) = meta::response_header_error(name, value.as_bytes()) {
            return Err(HandlerError::internal(why));
        }
        let count = meta::lines(self.meta())
            .filter(|(k, _)| k.starts_with(meta::RESPONSE_PREFIX))
            .count();
        if count >= meta::MAX_RESPONSE_HEADERS {
            return Err(HandlerError::internal(format!(
                "more than {} response headers",
                meta::MAX_RESPONSE_HEADERS
            )));
        }
        let line = format!("{}{name}: {value}\n", meta::RESPONSE_PREFIX);
        let (m, len, n) = (self.header.meta_len as usize, self.len, line.len());
        let fits = m + n + len <= self.slot.data().len() && m + n <= usize::from(u16::MAX);
        if !fits {
            return Err(HandlerError::internal(format!(
                "response header `{name}` does not fit the slot beside the body; raise \
                 pool.slot_size"
            )));
        }
        let data = self.slot.data_mut();
        data.copy_within(m..m + len, m + n);
        data[m..m + n].copy_from_slice(line.as_bytes());
        self.header.meta_len = (m + n) as u16;
        Ok(())
    }

    /// The slot's metadata area: the request headers the spec asked for, as `name: value\n`
    /// lines (what [`Request::header`] reads).
    #[doc(hidden)]
    pub fn meta(&self) -> &[u8] {
        &self.slot.data()[..self.header.meta_len as usize]
    }

    /// A request header, if the spec asked for it (`headers:` of any function) and the
    /// client sent it. Names are case-insensitive.
    pub fn header(&self, name: &str) -> Option<&str> {
        let meta = std::str::from_utf8(self.meta()).ok()?;
        meta.lines().find_map(|l| {
            let (k, v) = l.split_once(": ")?;
            k.eq_ignore_ascii_case(name).then_some(v)
        })
    }

    /// The body.
    pub fn body(&self) -> &[u8] {
        let m = self.header.meta_len as usize;
        &self.slot.data()[m..m + self.len]
    }

    /// The body, writable in place.
    pub fn body_mut(&mut self) -> &mut [u8] {
        let m = self.header.meta_len as usize;
        &mut self.slot.data_mut()[m..m + self.len]
    }

    /// The largest body this request's slot can hold in place. A body may grow beyond it
    /// (up to the chain's `max_body`): [`Request::set_len`], [`Request::set_body`] and
    /// [`Request::extend`] then move the request into a large slot.
    pub fn capacity(&self) -> usize {
        self.slot.data().len() - self.header.meta_len as usize
    }

    /// Grows or shrinks the body; new bytes are zero. In place when it fits the slot;
    /// beyond, the request moves into a slot of its domain's large pool (its metadata and
    /// body copied once, the old slot freed; `docs/protocol.md`, "Large pools").
    pub fn set_len(&mut self, len: usize) -> Result<(), HandlerError> {
        if len > self.capacity() {
            self.move_to_large(len, None)?;
        }
        let (m, old) = (self.header.meta_len as usize, self.len);
        if len > old {
            self.slot.data_mut()[m + old..m + len].fill(0);
        }
        self.len = len;
        Ok(())
    }

    /// Replaces the body with `bytes` (copied into the slot, or into a large slot when they
    /// do not fit this one: see [`Request::set_len`]).
    pub fn set_body(&mut self, bytes: &[u8]) -> Result<(), HandlerError> {
        if bytes.len() > self.capacity() {
            // Straight into the large slot: the old body is not copied first.
            self.move_to_large(bytes.len(), Some(bytes))?;
            self.len = bytes.len();
            return Ok(());
        }
        self.set_len(bytes.len())?;
        self.body_mut().copy_from_slice(bytes);
        Ok(())
    }

    /// Moves the request into a slot of its domain's large pool for a body of `len` bytes:
    /// the metadata, then `body` if given (else the body as it is), the header as the handler
    /// left it; the old slot is freed only after the copy (`body` may be a view of it).
    fn move_to_large(&mut self, len: usize, body: Option<&[u8]>) -> Result<(), HandlerError> {
        let m = self.header.meta_len as usize;
        let here = self.slot.pool();
        let Some(large) = self.pools.large_of(here) else {
            let hint = if here.releases() {
                "the largest slot the chain has (for its max_body); raise max_body"
            } else {
                "the slot, and the chain has no large slots; raise max_body (or pool.slot_size)"
            };
            return Err(HandlerError::internal(format!(
                "output of {len} bytes does not fit: {} bytes fit {hint}",
                self.capacity()
            )));
        };
        if m + len > large.slot_capacity() {
            return Err(HandlerError::internal(format!(
                "output of {len} bytes does not fit: {} bytes fit the largest slot the chain has \
                 (for its max_body); raise max_body",
                large.slot_capacity() - m
            )));
        }
        let Some(mut moved) = large.alloc(self.slot.owner()) else {
            return Err(HandlerError::new(
                503,
                format!(
                    "output of {len} bytes needs a large slot and all {} are in use; try again \
                     or raise pool.large_slots",
                    large.slot_count()
                ),
            ));
        };
        // The request's header at once: should this instance die before it sends the slot
        // on, the gateway finds the request it held by this header (and fails it with 502).
        moved.set_header(&self.header);
        let data = self.slot.data();
        let out = moved.data_mut();
        out[..m].copy_from_slice(&data[..m]);
        match body {
            Some(b) => out[m..m + b.len()].copy_from_slice(b),
            None => {
                let keep = self.len.min(len);
                out[m..m + keep].copy_from_slice(&data[m..m + keep]);
            }
        }
        // The old slot is freed here (dropped): its descriptor was never sent on.
        *self.slot = moved;
        Ok(())
    }

    /// Calls `function` of this chain with `input` (copied into a new slot) and waits for
    /// its output, read in place. `function` must be in this function's `calls` list in
    /// the spec. Waits at most the chain's timeout; fails at once if the callee's instance
    /// dies. A `?` turns a failed call into this handler's error with the call's status.
    pub fn call(&mut self, function: &str, input: &[u8]) -> Result<Answer, CallError> {
        self.call_all(&[(function, input)])
            .pop()
            .expect("one result per call")
    }

    /// Calls several functions at once (fan-out) and returns when every one has answered or
    /// failed (fan-in), results in the order of `calls`. What a failed branch means for the
    /// request is the handler's choice: fail it with `?`, or go on with the rest.
    pub fn call_all(&mut self, calls: &[(&str, &[u8])]) -> Vec<Result<Answer, CallError>> {
        match self.calls {
            Some(cx) => cx.call_all(&self.header, self.slot.pool(), calls),
            // This function's `calls` list is empty.
            None => calls
                .iter()
                .map(|(name, _)| Err(not_allowed(self.plan, self.function, name)))
                .collect(),
        }
    }

    /// The outputs of the static fan-out this function joins (a route's
    /// `{ fan_out: [..], join: this }`), in the order of `fan_out`; empty for a function that
    /// joins none. With `on_error: fail` (the default) the handler runs only when every
    /// branch answered; with `on_error: join` a failed branch is its `Err` here.
    pub fn branches(&self) -> &[Result<Answer, CallError>] {
        &self.branches
    }

    /// Takes the branches out of the request, as owned values ([`Request::branches`] is
    /// empty afterwards): for SDKs of other languages that hand each branch over as an
    /// object of their own.
    pub fn take_branches(&mut self) -> Vec<Result<Answer, CallError>> {
        std::mem::take(&mut self.branches)
    }

    /// The chain's state store (see `docs/spec.md`, "Chain state"), shared by every instance
    /// of every function with `state: true`. A `?` on its errors answers the request with
    /// 507 (full), 413 (value too large), 400 (bad key) or 503 (busy).
    pub fn state(&self) -> Result<&State, HandlerError> {
        self.state.ok_or_else(|| {
            HandlerError::internal(format!(
                "function `{}` has no state store: set `state: true` on it and add a `state` \
                 section to the chain spec",
                self.function()
            ))
        })
    }

    /// Appends `bytes` to the body.
    pub fn extend(&mut self, bytes: &[u8]) -> Result<(), HandlerError> {
        let old = self.len;
        self.set_len(old + bytes.len())?;
        self.body_mut()[old..].copy_from_slice(bytes);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use zerohop_pool::{Owner, Pool, PoolGeometry, Pools};

    use super::*;
    use crate::instance::testing::hello;

    /// Runs `f` on a request of `hello`'s route 0 whose slot holds `meta` then `body`, in a
    /// domain with a large pool (2 slots of 8 KiB beside 2 small slots of 256 bytes).
    fn with_request(name: &str, meta: &str, body: &[u8], f: impl FnOnce(&mut Request<'_>)) {
        with_request_in(name, meta, body, true, f)
    }

    /// [`with_request`], with or without a large pool.
    fn with_request_in(
        name: &str,
        meta: &str,
        body: &[u8],
        large: bool,
        f: impl FnOnce(&mut Request<'_>),
    ) {
        let pool = |first_slot, slot_size, release| {
            Arc::new(
                Pool::create(
                    name,
                    &PoolGeometry {
                        slots: 2,
                        first_slot,
                        slot_size,
                        max_parties: 3,
                        hugepages: false,
                        release,
                    },
                )
                .unwrap(),
            )
        };
        let small = pool(0, 256, false);
        let pools = if large {
            Pools::new(vec![small.clone(), pool(2, 8192, true)]).unwrap()
        } else {
            Pools::single(small.clone())
        };
        let mut slot = small.alloc(Owner::party(1)).unwrap();
        let header = SlotHeader {
            meta_len: meta.len() as u16,
            ..SlotHeader::default()
        };
        slot.set_header(&header);
        slot.data_mut()[..meta.len()].copy_from_slice(meta.as_bytes());
        slot.data_mut()[meta.len()..meta.len() + body.len()].copy_from_slice(body);
        let plan = hello();
        let mut req = Request {
            slot: &mut slot,
            header,
            len: body.len(),
            plan: &plan,
            function: 0,
            calls: None,
            branches: Vec::new(),
            state: None,
            pools: &pools,
        };
        f(&mut req);
    }

    #[test]
    fn a_body_that_outgrows_its_slot_moves_into_a_large_slot_with_its_metadata() {
        with_request("zh-rt-req-large", "x-trace: t\n", b"hello", |req| {
            let (small, large) = (
                req.pools.as_slice()[0].clone(),
                req.pools.as_slice()[1].clone(),
            );
            req.extend(&[7; 1000]).unwrap();
            assert!(Arc::ptr_eq(req.slot.pool(), &large), "moved");
            assert_eq!(&req.body()[..5], b"hello");
            assert!(req.body()[5..].iter().all(|&b| b == 7));
            assert_eq!(req.body().len(), 1005);
            assert_eq!(req.header("x-trace"), Some("t"), "the metadata came along");
            assert_eq!(small.owners().in_use(), 0, "the small slot is freed");
            assert_eq!(large.owners().in_use(), 1);
            assert_eq!(req.capacity(), 8192 - 32 - 11);
            // It stays in its large slot, shrinking or growing in place.
            req.set_len(3).unwrap();
            assert_eq!(req.body(), b"hel");
            req.set_len(6).unwrap();
            assert_eq!(req.body(), b"hel\0\0\0", "new bytes are zero");
            assert!(Arc::ptr_eq(req.slot.pool(), &large));
            // Beyond the largest slot: a clear error, nothing changes.
            let e = req.set_body(&[1; 9000]).unwrap_err();
            assert_eq!(e.status, 500);
            assert!(e.message.contains("raise max_body"), "{e}");
            assert_eq!(req.body(), b"hel\0\0\0");
        });
        // set_body goes straight into the large slot.
        with_request("zh-rt-req-large-set", "", b"old", |req| {
            let body: Vec<u8> = (0..5000u32).map(|i| i as u8).collect();
            req.set_body(&body).unwrap();
            assert!(req.slot.pool().releases());
            assert_eq!(req.body(), &body[..]);
        });
    }

    #[test]
    fn no_free_large_slot_is_503_and_no_large_pool_is_500() {
        with_request("zh-rt-req-full", "", b"keep", |req| {
            let large = req.pools.as_slice()[1].clone();
            let _held = [large.alloc(Owner::party(2)), large.alloc(Owner::party(2))];
            let e = req.set_len(1000).unwrap_err();
            assert_eq!(e.status, 503, "{e}");
            assert!(e.message.contains("pool.large_slots"), "{e}");
            assert_eq!(req.body(), b"keep", "nothing changed");
            assert!(!req.slot.pool().releases());
        });
        with_request_in("zh-rt-req-none", "", b"keep", false, |req| {
            let e = req.extend(&[0; 1000]).unwrap_err();
            assert_eq!(e.status, 500);
            assert!(e.message.contains("no large slots"), "{e}");
            assert_eq!(req.body(), b"keep");
        });
    }

    #[test]
    fn parameters_path_query_and_cookies_come_from_the_metadata() {
        let meta = ":path: /product/a%20b\n:query: q=caf%C3%A9&n=1&q=2\ncookie: shop_session-id=s1; shop_currency=\"EUR\"\n{id}: a b\n";
        with_request("zh-rt-req-meta", meta, b"x", |req| {
            assert_eq!(req.path(), "/product/a%20b");
            assert_eq!(req.route_path(), "/hello");
            assert_eq!(req.param("id"), Some("a b"));
            assert_eq!(req.param("other"), None);
            assert_eq!(req.query_string(), Some("q=caf%C3%A9&n=1&q=2"));
            assert_eq!(req.query("q").as_deref(), Some("café"));
            assert_eq!(req.query("n").as_deref(), Some("1"));
            assert_eq!(req.query("none"), None);
            assert_eq!(req.cookie("shop_session-id"), Some("s1"));
            assert_eq!(req.cookie("shop_currency"), Some("EUR"));
            assert_eq!(req.cookie("shop"), None);
            assert_eq!(req.body(), b"x");
        });
        with_request("zh-rt-req-bare", "", b"", |req| {
            assert_eq!(req.path(), "/hello", "without :path, the route's path");
            assert_eq!(req.query_string(), None);
            assert_eq!(req.cookie("a"), None);
        });
    }

    #[test]
    fn a_response_header_moves_the_body_up_within_its_slot() {
        with_request("zh-rt-req-resp", "x-trace: t\n", b"hello", |req| {
            req.add_response_header("Location", "/cart").unwrap();
            req.add_response_header("set-cookie", "a=1; Path=/")
                .unwrap();
            assert_eq!(req.body(), b"hello");
            assert_eq!(
                req.meta(),
                b"x-trace: t\n>Location: /cart\n>set-cookie: a=1; Path=/\n"
            );
            assert_eq!(req.header("x-trace"), Some("t"));
            for (name, value) in [
                ("content-length", "1"),
                ("bad name", "v"),
                ("x-a", "a\r\nb"),
            ] {
                assert!(req.add_response_header(name, value).is_err(), "{name}");
            }
            let big = "v".repeat(200);
            let e = req.add_response_header("x-big", &big).unwrap_err();
            assert!(e.message.contains("does not fit"), "{e}");
            assert_eq!(
                req.body(),
                b"hello",
                "a refused header leaves the body alone"
            );
            req.set_status(303).unwrap();
            assert_eq!(req.header.status, 303);
            for bad in [100, 204, 304, 404, 600] {
                assert!(req.set_status(bad).is_err(), "{bad}");
            }
        });
    }
}
