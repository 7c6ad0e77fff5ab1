//! `zerohop-bench-relay`: a zerohop function that calls `RELAY_TO` with the body and
//! answers with the callee's output (the cost of one call, measured by
//! `zerohop-bench-call`).

#![forbid(unsafe_code)]

use zerohop_runtime::{run, HandlerError, Next, Request};

fn main() {
    let to = std::env::var("RELAY_TO").unwrap_or_default();
    run(move |req: &mut Request<'_>| {
        if to.is_empty() {
            return Err(HandlerError::internal("RELAY_TO is not set"));
        }
        let input = req.body().to_vec();
        let answer = req.call(&to, &input)?;
        let out = answer.body().to_vec();
        drop(answer);
        req.set_body(&out)?;
        Ok(Next::Continue)
    })
}
