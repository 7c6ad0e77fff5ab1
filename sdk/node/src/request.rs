//! The request as JavaScript sees it: the class `NativeRequest`, which index.js wraps in
//! its `Request`. It lives on the JavaScript thread only (napi objects never leave it).
//!
//! While JavaScript handles a request, the runtime's handler thread that took it waits on
//! the request's channel (see `serve.rs`), so JavaScript may use the runtime's `Request`
//! through the pointer it was handed, and nothing else does. The request's [`Phase`] says
//! who may touch it:
//!
//! - `Live`: JavaScript (the methods here; the runtime thread is parked in `recv`).
//! - `Calling`: the runtime thread, making a call JavaScript asked for; every method here
//!   throws until the call's answers are handed back on this thread (`answered`).
//! - `Gone`: nobody here: the handler's outcome was sent and the runtime thread has gone on
//!   (the slot with it), or that thread is gone. Every method throws.
//!
//! The body is handed to JavaScript as an ArrayBuffer over the slot (no copy). Before the
//! body is resized and before the outcome is sent, that ArrayBuffer is detached, so a
//! `Buffer` kept past either reads as empty instead of reaching into the slot, which goes on
//! to other requests. An ArrayBuffer that JavaScript detached itself (transferred, so its
//! memory may live on in another ArrayBuffer) stops the instance at once.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::mpsc::{SendError, Sender};

use napi::bindgen_prelude::{ArrayBuffer, Buffer, Object, Uint8ArraySlice};
use napi::{Env, Error, Status};
use napi_derive::napi;
use zerohop_runtime::{Answer, CallError, HandlerError, Next, Request, State};

use crate::raw::{self, BodyRef, Detached};
use crate::serve::{Command, Job, RequestPtr};

/// A native method's failure as JavaScript sees it: `err.code` names it (index.js turns
/// `ZEROHOP_STATUS_<n>` into a `HandlerError` with status n).
pub struct Code(String);

impl AsRef<str> for Code {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl From<Status> for Code {
    fn from(s: Status) -> Self {
        Code(s.as_ref().to_owned())
    }
}

/// What the methods here return.
pub type Result<T> = napi::Result<T, Code>;

/// A failure with the code `code`.
pub(crate) fn failure(code: &str, message: impl ToString) -> Error<Code> {
    Error::new(Code(code.to_owned()), message)
}

/// The request's handler has returned.
fn gone() -> Error<Code> {
    failure(
        "ZEROHOP_GONE",
        "the request is gone: its handler has returned",
    )
}

/// A call on the request has not answered yet.
fn calling() -> Error<Code> {
    failure(
        "ZEROHOP_CALL_IN_FLIGHT",
        "a call is in flight on this request; await it first",
    )
}

/// A runtime error that answers the request with its status unless the handler catches it.
fn status(e: HandlerError) -> Error<Code> {
    Error::new(Code(format!("ZEROHOP_STATUS_{}", e.status)), e.message)
}

fn napi_error(e: Error) -> Error<Code> {
    Error::new(e.status.into(), e.reason)
}

/// Who may touch the request now (see the module's docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Live,
    Calling,
    Gone,
}

/// One request being handled by JavaScript.
struct Inner {
    serial: u64,
    req: RequestPtr,
    phase: Cell<Phase>,
    /// To the runtime thread waiting for this request; used while the phase is not `Gone`.
    tx: Sender<Command>,
    /// The ArrayBuffer over the body handed out since the body last changed size.
    body: RefCell<Option<BodyRef>>,
    /// The static fan-out's answers (status, body), taken out of the request up front.
    branches: Vec<(u16, Vec<u8>)>,
}

thread_local! {
    /// The requests JavaScript is handling, by serial: for what reaches a request by
    /// number on this thread (a call's answers, a dispatch that threw). Removed when the
    /// outcome is sent.
    static HANDLING: RefCell<HashMap<u64, Rc<Inner>>> = RefCell::new(HashMap::new());
}

impl Inner {
    /// The request, for JavaScript's use now.
    #[allow(clippy::mut_from_ref)]
    fn get(&self) -> Result<&mut Request<'static>> {
        match self.phase.get() {
            // SAFETY: `Live`: the runtime thread that owns the request waits on this
            // request's channel and does not touch it (see `serve::handle`), and this is
            // the only thread that uses the pointer meanwhile; every use here ends before
            // the method returns, so no two of these borrows overlap.
            Phase::Live => Ok(unsafe { &mut *self.req.0 }),
            Phase::Calling => Err(calling()),
            Phase::Gone => Err(gone()),
        }
    }

    /// Detaches the body's ArrayBuffer, if one was handed out. One that cannot be detached,
    /// or was detached by JavaScript (a transfer, which may have moved the memory into
    /// another ArrayBuffer), could still reach into the slot after it goes on to other
    /// requests: the instance stops at once (its requests are answered 502 and the agent
    /// starts a new one).
    fn drop_body(&self, env: &Env) {
        let Some(body) = self.body.borrow_mut().take() else {
            return;
        };
        let why = match body.detach(env) {
            Ok(Detached::Now) => return,
            Ok(Detached::Before) => {
                "the request body's ArrayBuffer was transferred or detached by JavaScript, so \
                 its memory may still be reachable; copy the body instead \
                 (Buffer.from(req.body))"
                    .to_owned()
            }
            Err(e) => format!("the request body's ArrayBuffer could not be detached: {e}"),
        };
        eprintln!(
            "zerohop: {why}. The slot goes on to other requests, so the instance stops here."
        );
        std::process::abort();
    }

    /// Sends the handler's outcome, unless the request is gone already (then `false`); the
    /// request is gone afterwards.
    fn finish(&self, env: &Env, outcome: std::result::Result<Next, HandlerError>) -> bool {
        if self.phase.replace(Phase::Gone) == Phase::Gone {
            return false;
        }
        self.drop_body(env);
        HANDLING.with(|h| h.borrow_mut().remove(&self.serial));
        // The runtime thread waits for exactly this; it is gone only if the instance is going
        // down.
        let _ = self.tx.send(Command::Done(outcome));
        true
    }

    /// The chain's state store, for JavaScript's use now.
    fn state(&self) -> Result<&State> {
        self.get()?.state().map_err(status)
    }
}

/// A call's answer as JavaScript gets it: status 200 and the output, or the error's status
/// and message.
#[napi(object)]
pub struct NativeAnswer {
    pub status: u32,
    pub body: Buffer,
}

/// A call's result as owned bytes (the callee's slot is freed here).
pub(crate) fn owned(r: std::result::Result<Answer, CallError>) -> (u16, Vec<u8>) {
    match r {
        Ok(a) => (200, a.body().to_vec()),
        Err(e) => (e.status, e.to_string().into_bytes()),
    }
}

fn answers(list: Vec<(u16, Vec<u8>)>) -> Vec<NativeAnswer> {
    list.into_iter()
        .map(|(status, body)| NativeAnswer {
            status: status.into(),
            body: body.into(),
        })
        .collect()
}

/// The answers of a call JavaScript asked for on request `serial`, back on this thread:
/// the request is JavaScript's again.
pub(crate) fn answered(serial: u64, list: Vec<(u16, Vec<u8>)>) -> Vec<NativeAnswer> {
    HANDLING.with(|h| {
        if let Some(inner) = h.borrow().get(&serial) {
            if inner.phase.get() == Phase::Calling {
                inner.phase.set(Phase::Live);
            }
        }
    });
    answers(list)
}

/// Answers request `serial` with 500 and `message`, unless it was answered already: for a
/// dispatch that threw instead of answering.
pub(crate) fn fail(env: &Env, serial: u64, message: String) {
    let inner = HANDLING.with(|h| h.borrow().get(&serial).cloned());
    if let Some(inner) = inner {
        inner.finish(env, Err(HandlerError::internal(message)));
    }
}

/// One request, handed to index.js's dispatcher. Not constructible from JavaScript.
#[napi]
pub struct NativeRequest {
    inner: Rc<Inner>,
}

impl NativeRequest {
    /// The request of `job`, now handled by JavaScript (on the JavaScript thread).
    pub(crate) fn new(job: Job) -> Self {
        let inner = Rc::new(Inner {
            serial: job.serial,
            req: job.req,
            phase: Cell::new(Phase::Live),
            tx: job.tx,
            body: RefCell::new(None),
            branches: job.branches,
        });
        HANDLING.with(|h| h.borrow_mut().insert(job.serial, inner.clone()));
        NativeRequest { inner }
    }

    /// Detaches the body's ArrayBuffer: the body is about to change size.
    fn resizing(&self, env: &Env) -> Result<&mut Request<'static>> {
        let req = self.inner.get()?;
        self.inner.drop_body(env);
        Ok(req)
    }

    /// Writes `data` into the body with `write` (`Request::set_body` or `Request::extend`),
    /// which resizes it.
    fn write(
        &self,
        env: &Env,
        data: &[u8],
        write: fn(&mut Request<'static>, &[u8]) -> std::result::Result<(), HandlerError>,
    ) -> Result<()> {
        let data = apart(self.inner.get()?, data);
        write(self.resizing(env)?, &data).map_err(status)
    }
}

/// `data`, or a copy of it if it overlaps the request's slot (a view of the body itself):
/// the runtime copies into the slot with a non-overlapping copy.
fn apart<'a>(req: &Request<'_>, data: &'a [u8]) -> std::borrow::Cow<'a, [u8]> {
    let body = req.body().as_ptr() as usize;
    let d = data.as_ptr() as usize;
    if d < body + req.capacity() && body < d + data.len() {
        data.to_vec().into()
    } else {
        data.into()
    }
}

#[napi]
impl NativeRequest {
    /// The body: an ArrayBuffer over the request's bytes in the slot (no copy), the same
    /// one until the body changes size or the handler returns, when it is detached.
    #[napi]
    pub fn body<'env>(&self, env: &'env Env) -> Result<ArrayBuffer<'env>> {
        let req = self.inner.get()?;
        if let Some(b) = self.inner.body.borrow().as_ref() {
            return b.get(env).map_err(napi_error);
        }
        let body = req.body_mut();
        if body.is_empty() {
            return ArrayBuffer::copy_from(env, []).map_err(napi_error);
        }
        // SAFETY: the body's bytes stay valid while the request is JavaScript's; the
        // ArrayBuffer is detached (`drop_body`) before the body changes size and before the
        // outcome is sent, after which the runtime reuses the slot.
        let (buffer, reference) =
            unsafe { raw::external_arraybuffer(env, body.as_mut_ptr(), body.len()) }
                .map_err(napi_error)?;
        *self.inner.body.borrow_mut() = Some(reference);
        Ok(buffer)
    }

    /// The body's length.
    #[napi]
    pub fn body_len(&self) -> Result<u32> {
        Ok(self.inner.get()?.body().len() as u32)
    }

    /// The most bytes the body may grow to in place (beyond, it moves into a large slot).
    #[napi]
    pub fn capacity(&self) -> Result<u32> {
        Ok(self.inner.get()?.capacity() as u32)
    }

    /// Replaces the body with `data` (copied into the slot).
    #[napi]
    pub fn set_body(&self, env: &Env, data: Uint8ArraySlice) -> Result<()> {
        self.write(env, &data, Request::set_body)
    }

    /// Appends `data` to the body.
    #[napi]
    pub fn extend(&self, env: &Env, data: Uint8ArraySlice) -> Result<()> {
        self.write(env, &data, Request::extend)
    }

    /// Sets the body's length (new bytes are zero).
    #[napi]
    pub fn set_len(&self, env: &Env, len: u32) -> Result<()> {
        self.resizing(env)?.set_len(len as usize).map_err(status)
    }

    /// The gateway's id of the request.
    #[napi]
    pub fn id(&self) -> Result<u32> {
        Ok(self.inner.get()?.id())
    }

    /// This function's name.
    #[napi]
    pub fn function(&self) -> Result<String> {
        Ok(self.inner.get()?.function().to_owned())
    }

    /// The route's HTTP method.
    #[napi]
    pub fn method(&self) -> Result<String> {
        Ok(self.inner.get()?.method().to_owned())
    }

    /// The request's path (as sent when `:path` is listed, else the route's).
    #[napi]
    pub fn path(&self) -> Result<String> {
        Ok(self.inner.get()?.path().to_owned())
    }

    /// The route's path as the spec writes it.
    #[napi]
    pub fn route_path(&self) -> Result<String> {
        Ok(self.inner.get()?.route_path().to_owned())
    }

    /// A request header the spec lists, if the client sent it.
    #[napi]
    pub fn header(&self, name: String) -> Result<Option<String>> {
        Ok(self.inner.get()?.header(&name).map(str::to_owned))
    }

    /// The route's path parameter `name`, percent-decoded.
    #[napi]
    pub fn param(&self, name: String) -> Result<Option<String>> {
        Ok(self.inner.get()?.param(&name).map(str::to_owned))
    }

    /// The query string as sent, when `:query` is listed and the request had one.
    #[napi]
    pub fn query_string(&self) -> Result<Option<String>> {
        Ok(self.inner.get()?.query_string().map(str::to_owned))
    }

    /// The first value of query parameter `name`, form-urlencoded decoded.
    #[napi]
    pub fn query(&self, name: String) -> Result<Option<String>> {
        Ok(self.inner.get()?.query(&name))
    }

    /// The value of cookie `name`, when `cookie` is listed.
    #[napi]
    pub fn cookie(&self, name: String) -> Result<Option<String>> {
        Ok(self.inner.get()?.cookie(&name).map(str::to_owned))
    }

    /// Adds a header to the client's answer. The body moves up within its slot, so its
    /// ArrayBuffer is detached first, as for a resize (even when the header is refused:
    /// the next `body()` is a fresh one either way).
    #[napi]
    pub fn add_response_header(&self, env: &Env, name: String, value: String) -> Result<()> {
        self.resizing(env)?
            .add_response_header(&name, &value)
            .map_err(status)
    }

    /// Sets the answer's status (200..=399 but 204, 205 and 304).
    #[napi]
    pub fn set_status(&self, code: u32) -> Result<()> {
        let req = self.inner.get()?;
        // index.js passes whole numbers up to 0xffff; anything past is refused all the same.
        req.set_status(u16::try_from(code).unwrap_or(0))
            .map_err(status)
    }

    /// Calls `functions[i]` with `inputs[i]`, all at once; a promise of their answers in
    /// order. The runtime thread makes the calls; the request is its until they answer.
    #[napi]
    pub fn call<'env>(
        &self,
        env: &'env Env,
        functions: Vec<String>,
        inputs: Vec<Uint8ArraySlice>,
    ) -> Result<Object<'env>> {
        self.inner.get()?;
        if functions.len() != inputs.len() {
            return Err(failure("ERR_INVALID_ARG_VALUE", "one input per function"));
        }
        let calls = functions
            .into_iter()
            .zip(inputs.iter().map(|d| d.to_vec()))
            .collect();
        let (answer, promise) = env.create_deferred().map_err(napi_error)?;
        self.inner.phase.set(Phase::Calling);
        if let Err(SendError(command)) = self.inner.tx.send(Command::Call { calls, answer }) {
            // The handler thread is gone (the instance is going down), and the request with
            // it: gone here too, its body's ArrayBuffer detached.
            self.inner
                .finish(env, Err(HandlerError::internal("the instance is stopping")));
            if let Command::Call { answer, .. } = command {
                answer.reject(Error::new(Status::Cancelled, "the instance is stopping"));
            }
            return Err(gone());
        }
        Ok(promise)
    }

    /// The answers of a static fan-out's branches, in the route's order (empty unless this
    /// function joins a fan-out).
    #[napi]
    pub fn branches(&self) -> Result<Vec<NativeAnswer>> {
        self.inner.get()?;
        Ok(answers(self.inner.branches.clone()))
    }

    /// The chain state's value of `key`, or null.
    #[napi]
    pub fn state_get(&self, key: Uint8ArraySlice) -> Result<Option<Buffer>> {
        let got = self
            .inner
            .state()?
            .get(&key)
            .map_err(|e| status(e.into()))?;
        Ok(got.map(Buffer::from))
    }

    /// Sets the chain state's `key` to `value`.
    #[napi]
    pub fn state_put(&self, key: Uint8ArraySlice, value: Uint8ArraySlice) -> Result<()> {
        self.inner
            .state()?
            .put(&key, &value)
            .map_err(|e| status(e.into()))
    }

    /// Removes the chain state's `key`; whether it was there.
    #[napi]
    pub fn state_delete(&self, key: Uint8ArraySlice) -> Result<bool> {
        self.inner
            .state()?
            .delete(&key)
            .map_err(|e| status(e.into()))
    }

    /// The handler's outcome: `kind` 0 on along the route, 1 back to the client, 2 on to
    /// the function `text`, 3 fail with `status` and the message `text`. The body's
    /// ArrayBuffer is detached and the request is gone afterwards. Allowed while a call is
    /// in flight: the runtime thread finishes the call first. `text` is left out (undefined)
    /// where it says nothing, so the common outcome converts no string.
    #[napi]
    pub fn finish(&self, env: &Env, kind: u32, status: u32, text: Option<String>) -> Result<()> {
        let text = text.unwrap_or_default();
        let outcome = match kind {
            0 => Ok(Next::Continue),
            1 => Ok(Next::Reply),
            2 => Ok(Next::Forward(text)),
            _ => Err(HandlerError::new(
                u16::try_from(status).unwrap_or(500),
                text,
            )),
        };
        if self.inner.finish(env, outcome) {
            Ok(())
        } else {
            Err(gone())
        }
    }
}
