//! `zerohop-bench-pass`: a zerohop function that passes the body on unchanged (the chain
//! length experiments measure the hops, not the work).

#![forbid(unsafe_code)]

use zerohop_runtime::{run, Next, Request};

fn main() {
    run(|_req: &mut Request<'_>| Ok(Next::Continue))
}
