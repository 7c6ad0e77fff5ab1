//! `zerohop-bench-stamp`: a zerohop function that answers with when it ran, for
//! `zerohop-bench-activation`.
//!
//! The answer is one line, `TAKE_NS MAIN_NS PID N`: `TAKE_NS` is `CLOCK_MONOTONIC` at the
//! start of the handler (the instance has just taken the request's descriptor), `MAIN_NS`
//! the same clock when `main` began (after `execve` and dynamic linking, before the runtime
//! attached), `PID` this process and `N` how many requests it has handled, this one
//! included (1: the first request of a freshly activated instance). The clock is the one
//! the agent's scaler stamps its activation decisions with, so the benchmark can subtract.

#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicU64, Ordering};

use zerohop_runtime::{run, Next, Request};

fn main() {
    let main_ns = zerohop_pool::monotonic_ns();
    let pid = std::process::id();
    let handled = AtomicU64::new(0);
    run(move |req: &mut Request<'_>| {
        // First thing: anything before it would count as activation time.
        let take_ns = zerohop_pool::monotonic_ns();
        let n = handled.fetch_add(1, Ordering::Relaxed) + 1;
        req.set_body(format!("{take_ns} {main_ns} {pid} {n}").as_bytes())?;
        Ok(Next::Continue)
    })
}
