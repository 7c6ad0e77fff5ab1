//! `upper`: upper-cases the request body in place (no copy).
//!
//! It logs each request at debug level through the SDK's `tracing`: run the chain with
//! `RUST_LOG=debug` (or give this function `env: { RUST_LOG: debug }` in the spec) to see
//! `DEBUG zerohop{chain=hello function=upper instance=1}:request{id=.. route=0}: upper-casing
//! bytes=11` in the agent's log.

#![forbid(unsafe_code)]

use zerohop_runtime::{run, tracing, Next, Request};

fn main() {
    run(|req: &mut Request<'_>| {
        tracing::debug!(bytes = req.body().len(), "upper-casing");
        req.body_mut().make_ascii_uppercase();
        Ok(Next::Continue)
    })
}
