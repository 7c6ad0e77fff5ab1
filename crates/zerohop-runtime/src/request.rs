//! What a handler sees and returns.

use zerohop_pool::{OwnedSlot, SlotHeader, State, StateError};
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

    /// HTTP path of the route the request came in by.
    pub fn path(&self) -> &str {
        self.plan
            .routes
            .get(self.route_index() as usize)
            .map_or("", |r| r.path.as_str())
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

    /// The largest body this request's slot can hold.
    pub fn capacity(&self) -> usize {
        self.slot.data().len() - self.header.meta_len as usize
    }

    /// Grows or shrinks the body in place; new bytes are zero.
    pub fn set_len(&mut self, len: usize) -> Result<(), HandlerError> {
        if len > self.capacity() {
            return Err(HandlerError::internal(format!(
                "output of {len} bytes exceeds the slot capacity of {} bytes; raise pool.slot_size",
                self.capacity()
            )));
        }
        let (m, old) = (self.header.meta_len as usize, self.len);
        if len > old {
            self.slot.data_mut()[m + old..m + len].fill(0);
        }
        self.len = len;
        Ok(())
    }

    /// Replaces the body with `bytes` (copied into the slot).
    pub fn set_body(&mut self, bytes: &[u8]) -> Result<(), HandlerError> {
        self.set_len(bytes.len())?;
        self.body_mut().copy_from_slice(bytes);
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
