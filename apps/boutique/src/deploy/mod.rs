//! Where the services run: the same logic ([`crate::services`]) in three deployments.
//!
//! * [`zerohop`]: each service a zerohop function of one chain (`apps/boutique/chain.yaml`);
//!   calls are `Request::call_all` over shared memory, the cart's store is the chain's state
//!   store.
//! * [`http`]: each service its own process, an HTTP/1.1 server on 127.0.0.1, calling the
//!   others with a keep-alive HTTP client; the cart keeps carts in its process's memory.
//! * [`local`]: every service in one process, calls are function calls (unit tests, and a
//!   reference for what the two real deployments must answer).

pub mod http;
pub mod local;
pub mod zerohop;
