//! The runtime's side: its handler threads hand each request to JavaScript and wait.
//!
//! For every request the runtime's handler (on one of its handler threads) queues a [`Job`]
//! on the threadsafe function that runs index.js's dispatcher on the JavaScript thread,
//! then waits on the request's own channel for [`Command`]s until JavaScript sends the
//! outcome. A call JavaScript asks for comes as a command too and runs here, on this thread:
//! the runtime delivers a call's answer to the handler thread that made it, and while it
//! waits the JavaScript thread goes on with other requests. With `concurrency: N`, N
//! handler threads wait like this, so N requests can be in JavaScript at once.
//!
//! The thread never waits for good on a request JavaScript lost: the channel's only sender
//! travels with the job, so a job that could not be queued, or was dropped before it
//! became a JavaScript object, ends the wait with a 500; a dispatcher that throws answers
//! 500 too (`request::fail`). A handler whose promise never settles does hold its thread:
//! the client gets 504 at the chain's timeout, and the agent stops the instance as hung.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Sender};

use napi::threadsafe_function::{
    ThreadsafeFunction, ThreadsafeFunctionCallMode, UnknownReturnValue,
};
use napi::JsDeferred;
use napi::{Env, Status};
use zerohop_runtime::{HandlerError, Next, Request};

use crate::request::{self, NativeAnswer, NativeRequest};

/// The runtime's request, shared with the JavaScript thread while the handler thread that
/// owns it waits (see `request.rs` for who may touch it when).
pub(crate) struct RequestPtr(pub(crate) *mut Request<'static>);

// SAFETY: the pointer is handed from the handler thread to the JavaScript thread along with
// the job. What it points at may be used from another thread at all (`Request` is `Send`,
// asserted below); the two threads never use it at once (the request's `Phase`, changed only
// by messages that order the two threads: the job's queue, the request's channel, a call's
// deferred); and it outlives every use: `handle` keeps the request borrowed until it receives
// `Command::Done`, which JavaScript sends only after it set the phase to `Gone` (it never
// dereferences the pointer then), or until the channel's last sender is dropped, which
// happens only with the job or the request's JavaScript side, and the pointer with them.
unsafe impl Send for RequestPtr {}

/// What the `Send` of [`RequestPtr`] relies on.
const _: fn() = || {
    fn send<T: Send>() {}
    send::<Request<'static>>();
};

/// A request for JavaScript.
pub(crate) struct Job {
    pub(crate) serial: u64,
    pub(crate) req: RequestPtr,
    /// The request's channel to the handler thread waiting for it.
    pub(crate) tx: Sender<Command>,
    /// A static fan-out's answers (status, body).
    pub(crate) branches: Vec<(u16, Vec<u8>)>,
}

/// Resolves a call's promise on the JavaScript thread.
pub(crate) type Resolver = Box<dyn FnOnce(Env) -> napi::Result<Vec<NativeAnswer>> + Send>;
/// A call's promise, settled from the handler thread.
pub(crate) type CallDeferred = JsDeferred<Vec<NativeAnswer>, Resolver>;

/// What JavaScript asks of the handler thread waiting for its request.
pub(crate) enum Command {
    /// Call these functions with these inputs (at once) and resolve `answer`.
    Call {
        calls: Vec<(String, Vec<u8>)>,
        answer: CallDeferred,
    },
    /// The handler's outcome: the wait is over.
    Done(Result<Next, HandlerError>),
}

/// The threadsafe function that runs the dispatcher with a request.
pub(crate) type Dispatch =
    ThreadsafeFunction<Job, UnknownReturnValue, NativeRequest, Status, false>;

/// Numbers the requests handed to JavaScript.
static SERIAL: AtomicU64 = AtomicU64::new(0);

/// The runtime's handler: one request, handled in JavaScript.
pub(crate) fn handle(dispatch: &Dispatch, req: &mut Request<'_>) -> Result<Next, HandlerError> {
    // Relaxed: the serial only has to be unique (the read-modify-write gives that); nothing is
    // published through it.
    let serial = SERIAL.fetch_add(1, Ordering::Relaxed);
    let branches = req
        .take_branches()
        .into_iter()
        .map(request::owned)
        .collect();
    // From here on the request is used through this pointer only, on this thread and on
    // the JavaScript thread in turn.
    let ptr = std::ptr::from_mut(req).cast::<Request<'static>>();
    let (tx, rx) = mpsc::channel();
    let job = Job {
        serial,
        req: RequestPtr(ptr),
        tx,
        branches,
    };
    let queued = dispatch.call_with_return_value(
        job,
        ThreadsafeFunctionCallMode::NonBlocking,
        move |returned, env| {
            if let Err(e) = returned {
                request::fail(&env, serial, format!("the zerohop dispatcher threw: {e}"));
            }
            Ok(())
        },
    );
    if queued != Status::Ok {
        // Not queued: the job (and its sender) is dropped already.
        return Err(HandlerError::internal(format!(
            "could not hand the request to JavaScript ({queued})"
        )));
    }
    loop {
        match rx.recv() {
            Ok(Command::Call { calls, answer }) => {
                // SAFETY: JavaScript set the request's phase to `Calling` before sending
                // this: it does not touch the request until the answers are handed back
                // (the resolver below, on its thread, after this borrow ended). It may still
                // write the body through its ArrayBuffer, or finish the request (which only
                // detaches that ArrayBuffer and queues `Done` behind this command): neither
                // touches the `Request` itself, and `call_all` reads none of the body's bytes
                // (the inputs are copies, made on the JavaScript thread).
                let req = unsafe { &mut *ptr };
                let list: Vec<(&str, &[u8])> = calls
                    .iter()
                    .map(|(f, d)| (f.as_str(), d.as_slice()))
                    .collect();
                let got: Vec<(u16, Vec<u8>)> = req
                    .call_all(&list)
                    .into_iter()
                    .map(request::owned)
                    .collect();
                answer.resolve(Box::new(move |_env| Ok(request::answered(serial, got))));
            }
            Ok(Command::Done(outcome)) => return outcome,
            Err(_) => {
                return Err(HandlerError::internal(
                    "the request was dropped on the JavaScript side without an answer",
                ))
            }
        }
    }
}
