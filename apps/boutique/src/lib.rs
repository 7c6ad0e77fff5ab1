//! `zerohop-app-boutique`: Google's Online Boutique (microservices-demo) as zerohop
//! functions and, with the same service code, as HTTP microservices, so that a benchmark
//! can drive both with the same load.
//!
//! * [`services`]: the ten services' logic (frontend, ad, cart, checkout, currency, email,
//!   payment, productcatalog, recommendation, shipping), written once, `async` over
//!   [`rpc::Peers`] (call other services) and [`rpc::Store`] (the cart's store). Inputs and
//!   outputs are compact JSON.
//! * [`deploy`]: where the logic runs: [`deploy::zerohop`] (one function per service,
//!   calls over shared memory, the chain's state store), [`deploy::http`] (one process per
//!   service, HTTP/1.1 keep-alive between them), [`deploy::local`] (one process, for tests).
//! * [`load`]: the load generator, the original's locust tasks and weights, every answer
//!   checked.
//! * [`money`], [`rng`]: amounts and random ids.
//!
//! The data (catalog, currency rates, ads) is the original demo's, embedded in the binaries
//! with `include_str!`: a confined zerohop function may not read the agent's files.
//!
//! `unsafe` only in `sys` (`prctl(PR_SET_PDEATHSIG)` and `kill` for the HTTP deployment).

#![deny(unsafe_code)]

pub mod deploy;
pub mod load;
pub mod money;
pub mod rng;
pub mod rpc;
pub mod services;
mod sys;
