//! Step 3 of the polyglot chain, in Rust: checks that the Go step came before it and appends
//! its tag to the body in the slot. A body starting with `SLEEP-RS:` first says "rs: holding
//! the request" on standard error and holds it for a minute (the tests wait for that line,
//! then kill the instance while it holds the request).

use std::time::Duration;

use zerohop_runtime::{run, HandlerError, Next, Request};

fn main() {
    run(|req: &mut Request<'_>| {
        if !req.body().ends_with(b"+go") {
            return Err(HandlerError::internal(
                "rust: the Go step did not run first",
            ));
        }
        if req.body().starts_with(b"SLEEP-RS:") {
            eprintln!("rs: holding the request");
            std::thread::sleep(Duration::from_secs(60));
        }
        req.extend(b"+rs")?;
        Ok(Next::Continue)
    })
}
