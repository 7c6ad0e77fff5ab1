//! `upper`: upper-cases the request body in place (no copy).

#![forbid(unsafe_code)]

use zerohop_runtime::{run, Next, Request};

fn main() {
    run(|req: &mut Request<'_>| {
        req.body_mut().make_ascii_uppercase();
        Ok(Next::Continue)
    })
}
