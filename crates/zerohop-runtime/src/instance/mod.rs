//! One function instance: attach, receive, run the handler, route, send.
//!
//! Its parts, each depending only on those listed before it:
//!
//! - `dispatch`: what the handler threads share (`Dispatcher`): taking a request, running
//!   the handler on it, and sending the result on (along the route, back to a caller, or an
//!   error to the client);
//! - `deferred`: a request whose handler finishes later, on any thread ([`Deferred`]);
//! - `serve`: an attached [`Instance`] and its serving loops (activation, the receiving
//!   thread, the handler threads);
//! - `error`: why an instance could not start ([`StartError`], [`HandOverError`]);
//! - `start`: attaching from the agent's hand-over ([`start()`], [`attach`], [`run`]).
//!
//! Test fixtures the parts' tests share live in `testing`.

mod deferred;
mod dispatch;
mod error;
mod serve;
mod start;
#[cfg(test)]
pub(crate) mod testing;

pub use deferred::Deferred;
pub use error::{HandOverError, StartError};
pub use serve::Instance;
pub use start::{attach, run, start};
