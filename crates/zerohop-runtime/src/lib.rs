//! `zerohop-runtime`: the Rust SDK of zerohop functions.
//!
//! A function author writes a handler and calls [`run`]; everything else (attaching to the
//! chain's pool and transport, receiving descriptors, routing to the next function, error
//! replies, concurrency) happens here. The handler gets a zero-copy view of the request in
//! shared memory and edits it in place:
//!
//! ```no_run
//! use zerohop_runtime::{run, Next, Request};
//!
//! fn main() {
//!     run(|req: &mut Request<'_>| {
//!         req.body_mut().make_ascii_uppercase();
//!         Ok(Next::Continue)
//!     })
//! }
//! ```
//!
//! An author never touches descriptors, slots or file descriptors. The program must be
//! started by the agent (`zerohop up CHAIN.yaml`), which hands it the chain through
//! inherited file descriptors and `ZEROHOP_*` environment variables.
//!
//! `unsafe` only in `sys` (prctl, getppid).

#![deny(missing_docs)]

mod instance;
mod request;
mod sys;

pub use instance::{run, start, Instance, StartError};
pub use request::{HandlerError, Next, Request};

/// A request handler: transforms the request in place and says where it goes next.
pub trait Handler: Send + Sync + 'static {
    /// Handles one request.
    fn handle(&self, req: &mut Request<'_>) -> Result<Next, HandlerError>;
}

impl<F> Handler for F
where
    F: Fn(&mut Request<'_>) -> Result<Next, HandlerError> + Send + Sync + 'static,
{
    fn handle(&self, req: &mut Request<'_>) -> Result<Next, HandlerError> {
        self(req)
    }
}

/// Environment variables the agent sets for every instance.
pub mod env {
    /// The chain's plan, JSON.
    pub const PLAN: &str = "ZEROHOP_PLAN";
    /// This instance's party index.
    pub const PARTY: &str = "ZEROHOP_PARTY";
    /// Number of inherited descriptors starting at fd 3: the pool, then the transport's.
    pub const FDS: &str = "ZEROHOP_FDS";
    /// Pid of the agent; the instance exits when the agent goes away.
    pub const AGENT_PID: &str = "ZEROHOP_AGENT_PID";
    /// First inherited descriptor.
    pub const FIRST_FD: i32 = 3;
}
