//! The ten services' logic, one module each, written once for both deployments.
//!
//! Every module has the same parts: its request type(s) (serde, compact JSON; a service
//! with several operations takes `{"op": "...", ...}`), its answer types, and `handle`,
//! which serves one call from its input bytes to its output bytes. Services that call others
//! are `async` over [`Peers`]; the cart also gets a [`Store`]. The frontend is the exception:
//! its input is a page request (route, headers, body), see [`frontend::handle`].

pub mod ad;
pub mod cart;
pub mod checkout;
pub mod currency;
pub mod email;
pub mod frontend;
pub mod payment;
pub mod productcatalog;
pub mod recommendation;
pub mod shipping;

use crate::rpc::{Peers, Service, ServiceError, Store};

/// Serves one call of `service` (any but the frontend) with `input`; `store` is needed by
/// the cart only.
pub async fn handle<P: Peers>(
    service: Service,
    input: &[u8],
    peers: &mut P,
    store: Option<&dyn Store>,
) -> Result<Vec<u8>, ServiceError> {
    match service {
        Service::Frontend => Err(ServiceError::internal(
            "the frontend serves pages, not calls",
        )),
        Service::Ad => ad::handle(input),
        Service::Cart => match store {
            Some(store) => cart::handle(input, store),
            None => Err(ServiceError::internal("the cart has no store")),
        },
        Service::Checkout => checkout::handle(input, peers).await,
        Service::Currency => currency::handle(input),
        Service::Email => email::handle(input),
        Service::Payment => payment::handle(input),
        Service::ProductCatalog => productcatalog::handle(input),
        Service::Recommendation => recommendation::handle(input, peers).await,
        Service::Shipping => shipping::handle(input),
    }
}
