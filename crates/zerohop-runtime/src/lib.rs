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
//! One program may serve several functions, a handler registered per function name
//! ([`Handlers`], [`run_named`]): what the instances of a fused group run (`fuse:` in the
//! spec), each step of the group a function call on the same slot, with no descriptor and
//! no wake-up between them (`docs/fused.md`).
//!
//! An author never touches descriptors, slots or file descriptors. The program must be
//! started by the agent (`zerohop up CHAIN.yaml`), which hands it the chain through
//! inherited file descriptors and `ZEROHOP_*` environment variables.
//!
//! # Logging
//!
//! A function logs with [`tracing`], re-exported here (no dependency to add):
//! `zerohop_runtime::tracing::info!(bytes = n, "upper-casing")`. [`run`] (and [`start`])
//! install a subscriber that writes one line per event to standard error, where the agent
//! stamps and files it, filtered by `RUST_LOG` (`info` when unset), without time or colours,
//! inside the instance's span (chain, function, instance) and, while a handler runs, the
//! request's (its id and route):
//!
//! ```text
//!  INFO zerohop{chain=hello function=upper instance=1}:request{id=65537 route=0}: upper-casing bytes=11
//! ```
//!
//! A program that installs its own subscriber before calling [`run`] keeps it.
//!
//! `unsafe` only in `sys` (prctl, getppid, sched_setaffinity).

#![deny(missing_docs)]

mod call;
mod instance;
mod logging;
mod named;
mod request;
mod sys;

pub use call::{Answer, CallError};
pub use instance::{attach, run, start, Deferred, HandOverError, Instance, StartError};
pub use named::{run_named, Handlers};
pub use request::{HandlerError, Next, Request};
/// The logging facade functions use; the runtime installs its subscriber (see "Logging").
pub use tracing;
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
