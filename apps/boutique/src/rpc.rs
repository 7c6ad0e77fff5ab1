//! What the services' logic needs from the deployment it runs in: a way to call other
//! services ([`Peers`]) and, for the cart, a key-value store ([`Store`]).
//!
//! The logic is written once, as `async fn`s over these two traits:
//!
//! * in zerohop, [`Peers::call_all`] is `Request::call_all` (descriptors over shared memory)
//!   and blocks until every answer is in, so its future is ready on the first poll and the
//!   function drives the logic with [`run_ready`], on its handler thread, no executor;
//! * in the HTTP deployment it is a keep-alive HTTP/1.1 client that sends the calls at once
//!   and awaits them on the service's event loop.
//!
//! Inputs and outputs of every call are compact JSON (serde_json), one object each; a
//! service's failure is a [`ServiceError`], an HTTP-like status and one line, which both
//! deployments carry unchanged to the caller (so an unknown product is a 404 at the client,
//! whichever service found out).

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use serde::de::DeserializeOwned;
use serde::Serialize;

/// The ten services of the boutique.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Service {
    /// The HTTP front: one route per page, calls the others.
    Frontend,
    /// Ads by product category.
    Ad,
    /// Carts, kept in the deployment's store.
    Cart,
    /// Places orders.
    Checkout,
    /// Supported currencies and conversion.
    Currency,
    /// Order confirmations.
    Email,
    /// Card validation and charges.
    Payment,
    /// The product catalog.
    ProductCatalog,
    /// Products to suggest.
    Recommendation,
    /// Shipping quotes and shipments.
    Shipping,
}

impl Service {
    /// Every service.
    pub const ALL: [Service; 10] = [
        Service::Frontend,
        Service::Ad,
        Service::Cart,
        Service::Checkout,
        Service::Currency,
        Service::Email,
        Service::Payment,
        Service::ProductCatalog,
        Service::Recommendation,
        Service::Shipping,
    ];

    /// The service's name: its function name in `chain.yaml` and its process's name in the
    /// HTTP deployment.
    pub fn name(self) -> &'static str {
        match self {
            Service::Frontend => "frontend",
            Service::Ad => "ad",
            Service::Cart => "cart",
            Service::Checkout => "checkout",
            Service::Currency => "currency",
            Service::Email => "email",
            Service::Payment => "payment",
            Service::ProductCatalog => "productcatalog",
            Service::Recommendation => "recommendation",
            Service::Shipping => "shipping",
        }
    }

    /// The service named `name`.
    pub fn from_name(name: &str) -> Option<Service> {
        Self::ALL.into_iter().find(|s| s.name() == name)
    }

    /// The services this one calls (its `calls` list in `chain.yaml`); the graph is acyclic.
    pub fn calls(self) -> &'static [Service] {
        use Service::*;
        match self {
            Frontend => &[
                Currency,
                ProductCatalog,
                Cart,
                Recommendation,
                Shipping,
                Checkout,
                Ad,
            ],
            Checkout => &[Cart, ProductCatalog, Currency, Shipping, Payment, Email],
            Recommendation => &[ProductCatalog],
            Ad | Cart | Currency | Email | Payment | ProductCatalog | Shipping => &[],
        }
    }
}

impl std::fmt::Display for Service {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.name())
    }
}

/// A service's failure: what the client (or the calling service) gets, an HTTP-like status
/// and one line. It is the runtime's handler error, so a zerohop function returns it as is.
pub use zerohop_runtime::HandlerError as ServiceError;

impl From<crate::money::MoneyError> for ServiceError {
    fn from(e: crate::money::MoneyError) -> Self {
        ServiceError::bad_request(e.to_string())
    }
}

/// How a service calls the others.
pub trait Peers {
    /// A callee's output (JSON), read where the deployment holds it.
    type Output: AsRef<[u8]>;

    /// Calls every `(service, input)` at once and returns the outputs (or failures) in the
    /// same order once all are in.
    fn call_all(
        &mut self,
        calls: Vec<(Service, Vec<u8>)>,
    ) -> impl Future<Output = Vec<Result<Self::Output, ServiceError>>>;
}

/// How [`Store::update`] changes a value: old value (`None`: absent) to new (`None`: delete).
pub type Update<'f> = dyn FnMut(Option<&[u8]>) -> Option<Vec<u8>> + 'f;

/// The cart's key-value store: per-key atomic updates, no transactions across keys.
pub trait Store {
    /// The value of `key`.
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, ServiceError>;

    /// Replaces the value of `key` with `f(old)` (`None` deletes it), with no other write of
    /// the key in between; returns the new value.
    fn update(&self, key: &[u8], f: &mut Update<'_>) -> Result<Option<Vec<u8>>, ServiceError>;
}

/// A service with nobody to call (the leaves of the graph).
pub struct NoPeers;

impl Peers for NoPeers {
    type Output = Vec<u8>;

    fn call_all(
        &mut self,
        calls: Vec<(Service, Vec<u8>)>,
    ) -> impl Future<Output = Vec<Result<Vec<u8>, ServiceError>>> {
        std::future::ready(
            calls
                .into_iter()
                .map(|(s, _)| {
                    Err(ServiceError::internal(format!(
                        "this service may not call {s}"
                    )))
                })
                .collect(),
        )
    }
}

/// A call's input: `request` as JSON, for `service`.
pub fn encode<T: Serialize>(service: Service, request: &T) -> (Service, Vec<u8>) {
    // Serialising plain data structures into a Vec cannot fail.
    let input = serde_json::to_vec(request).expect("request types serialise");
    (service, input)
}

/// A call's typed output. A callee's failure passes through as it is (its message already
/// names the callee); an output that is not the expected JSON is the callee's fault, 502.
pub fn decode<T: DeserializeOwned>(
    service: Service,
    answer: Result<impl AsRef<[u8]>, ServiceError>,
) -> Result<T, ServiceError> {
    let out = answer?;
    serde_json::from_slice(out.as_ref())
        .map_err(|e| ServiceError::new(502, format!("{service} answered bad JSON: {e}")))
}

/// Calls one service and decodes its output.
pub async fn call<P: Peers, T: DeserializeOwned>(
    peers: &mut P,
    service: Service,
    request: &impl Serialize,
) -> Result<T, ServiceError> {
    let answer = peers
        .call_all(vec![encode(service, request)])
        .await
        .pop()
        .unwrap_or_else(|| Err(ServiceError::internal("no answer")));
    decode(service, answer)
}

/// Drives `f` to completion on this thread, for logic over a blocking [`Peers`] (whose
/// futures are ready at once). A future that is still pending after its first poll would
/// wait for a wake-up nobody sends: that is a bug of the deployment, reported as a panic.
pub fn run_ready<F: Future>(f: F) -> F::Output {
    let mut f = pin!(f);
    match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => v,
        Poll::Pending => panic!("run_ready: a blocking deployment's future was not ready"),
    }
}

/// An input in a service's own language: parses `input` as `T`, 400 when it is not.
pub fn parse<T: DeserializeOwned>(service: Service, input: &[u8]) -> Result<T, ServiceError> {
    serde_json::from_slice(input)
        .map_err(|e| ServiceError::bad_request(format!("{service}: bad request: {e}")))
}

/// A service's output as JSON.
pub fn reply<T: Serialize>(out: &T) -> Result<Vec<u8>, ServiceError> {
    serde_json::to_vec(out).map_err(|e| ServiceError::internal(format!("encoding output: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_calls_form_no_cycle() {
        for s in Service::ALL {
            assert_eq!(Service::from_name(s.name()), Some(s));
        }
        // Depth-first search for a cycle.
        fn visit(s: Service, path: &mut Vec<Service>) {
            assert!(!path.contains(&s), "cycle through {path:?} -> {s}");
            path.push(s);
            for &c in s.calls() {
                visit(c, path);
            }
            path.pop();
        }
        visit(Service::Frontend, &mut Vec::new());
        assert!(Service::ALL.iter().all(|s| !s.calls().contains(s)));
    }

    #[test]
    fn callee_failures_keep_their_status() {
        let e = decode::<u32>(
            Service::Cart,
            Err::<Vec<u8>, _>(ServiceError::not_found("x")),
        );
        assert_eq!(e.unwrap_err().status, 404);
        let e = decode::<u32>(Service::Cart, Ok(b"nope".to_vec()));
        assert_eq!(e.unwrap_err().status, 502);
        assert_eq!(decode::<u32>(Service::Cart, Ok(b"7".to_vec())), Ok(7));
    }

    #[test]
    fn no_peers_refuses_every_call() {
        let out = run_ready(NoPeers.call_all(vec![(Service::Cart, vec![])]));
        assert_eq!(out[0].as_ref().unwrap_err().status, 500);
    }
}
