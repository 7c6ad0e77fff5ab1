//! `hello-fused`: upper and exclaim in one program, each handler registered by its
//! function's name. With `fused.yaml` (`fuse: [[upper, exclaim]]`) one instance runs both,
//! the hop between them a function call on the same slot; under `chain.yaml`'s layout
//! (two functions, two processes) it serves as either.
//!
//! `HELLO_CRASH_ON=TEXT` in its environment makes `exclaim` abort the process when the body
//! is `TEXT` (after upper-casing): the end-to-end tests use it to crash the group's second
//! step.

#![forbid(unsafe_code)]

use zerohop_runtime::{run_named, Handlers, Next, Request};

fn main() {
    let crash_on = std::env::var("HELLO_CRASH_ON").ok();
    run_named(
        Handlers::new()
            .on("upper", |req: &mut Request<'_>| {
                req.body_mut().make_ascii_uppercase();
                Ok(Next::Continue)
            })
            .on("exclaim", move |req: &mut Request<'_>| {
                if crash_on.as_deref().map(str::as_bytes) == Some(req.body()) {
                    std::process::abort();
                }
                req.extend(b"!")?;
                Ok(Next::Continue)
            }),
    )
}
