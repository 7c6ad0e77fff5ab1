//! `zerohop.node`: the Rust runtime (`zerohop-runtime`) as a Node.js addon (napi-rs). The
//! npm package `zerohop` (index.js) wraps it; see docs/sdk-node.md.
//!
//! `run` starts the runtime on a thread of its own, so the JavaScript event loop stays
//! free; the runtime's handler threads hand each request to JavaScript through a
//! threadsafe function and wait for the outcome (`serve.rs`). JavaScript sees the request
//! as a `NativeRequest` (`request.rs`), whose body is an ArrayBuffer over the slot, detached
//! before the slot goes on.
//!
//! `unsafe`: the Node-API calls napi-rs has no safe form for (an ArrayBuffer over the slot
//! and a reference to it; `raw.rs`), and the request pointer shared by the handler thread
//! and the JavaScript thread, which take turns (`request.rs`, `serve.rs`).

mod raw;
mod request;
mod serve;

use std::sync::atomic::{AtomicBool, Ordering};

use napi::bindgen_prelude::Function;
use napi::threadsafe_function::UnknownReturnValue;
use napi_derive::napi;
use request::failure;

pub use request::{Code, NativeAnswer, NativeRequest};

/// Whether `run` was called (an instance attaches to its chain once).
static STARTED: AtomicBool = AtomicBool::new(false);

/// Attaches to the chain the agent started this process for, and serves its requests with
/// `dispatch(request)` (index.js's dispatcher, which ends every request with
/// `request.finish`). Returns at once: the runtime runs on threads of its own, and the
/// dispatcher keeps the event loop alive. Throws with the code `ZEROHOP_NOT_STARTED` when
/// the process was not started by the agent, `ZEROHOP_RUNNING` when `run` was called before.
#[napi]
pub fn run(dispatch: Function<'_, NativeRequest, UnknownReturnValue>) -> request::Result<()> {
    // Relaxed: the swap alone picks the one caller that goes on; nothing is published
    // through the flag (the instance moves into the thread spawned below).
    if STARTED.swap(true, Ordering::Relaxed) {
        return Err(failure(
            "ZEROHOP_RUNNING",
            "zerohop.run was called already; a process serves one function",
        ));
    }
    let instance = zerohop_runtime::start().map_err(|e| failure("ZEROHOP_NOT_STARTED", e))?;
    let dispatch: serve::Dispatch = dispatch
        .build_threadsafe_function::<serve::Job>()
        .callee_handled::<false>()
        .build_callback(|ctx| Ok(NativeRequest::new(ctx.value)))
        .map_err(|e| failure("ZEROHOP_NOT_STARTED", e.reason))?;
    std::thread::Builder::new()
        .name("zerohop".into())
        .spawn(move || {
            instance
                .serve(move |req: &mut zerohop_runtime::Request<'_>| serve::handle(&dispatch, req))
        })
        .map_err(|e| failure("ZEROHOP_NOT_STARTED", format!("cannot start a thread: {e}")))?;
    Ok(())
}
