//! `zerohop-runtime`: the Rust SDK of zerohop functions.
//!
//! A function author writes a handler and calls [`run`]; everything else (attaching to the
//! chain's pools and transport, receiving descriptors, routing to the next function, error
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

mod call;
mod instance;
mod request;
mod sys;

pub use call::{Answer, CallError};
pub use instance::{run, start, Instance, StartError};
pub use request::{HandlerError, Next, Request};
pub use zerohop_pool::{State, StateError};

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
pub use zerohop_transport::handover as env;
