//! `exclaim`: appends `!` to the request body, in place.

#![forbid(unsafe_code)]

use zerohop_runtime::{run, Next, Request};

fn main() {
    run(|req: &mut Request<'_>| {
        req.extend(b"!")?;
        Ok(Next::Continue)
    })
}
