//! `zerohop-bench-lang-pass`: the Rust row of `zerohop-bench-languages`, the same
//! pass-through as `pass.c`, `go/main.go`, `pass.py` and `pass.js` beside it: it reads the
//! body's first byte where the gateway wrote it (no copy) and sends the body on unchanged.

#![forbid(unsafe_code)]

use zerohop_runtime::{run, Next, Request};

fn main() {
    run(|req: &mut Request<'_>| {
        // Read, so that every language pays for getting at the body; never optimised out.
        std::hint::black_box(req.body().first().copied());
        Ok(Next::Continue)
    })
}
