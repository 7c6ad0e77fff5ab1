//! Every service in one process: a call is a function call (still through JSON, so the
//! services see exactly the bytes a real deployment carries), the cart's store is a
//! [`MemStore`]. Calls outside the caller's `calls` list are refused, as the chain spec
//! would refuse them.

use std::future::Future;
use std::sync::Arc;

use super::http::MemStore;
use crate::rpc::{run_ready, Peers, Service, ServiceError};
use crate::services::{self, frontend};

/// The services, in this process.
#[derive(Clone, Default)]
pub struct Local {
    store: Arc<MemStore>,
}

/// Calls made by one service of a [`Local`] deployment.
pub struct LocalPeers<'a> {
    local: &'a Local,
    caller: Service,
}

impl Local {
    /// Answers a page, as the frontend.
    pub fn page(&self, req: &frontend::PageRequest<'_>) -> Result<Vec<u8>, ServiceError> {
        let mut peers = LocalPeers {
            local: self,
            caller: Service::Frontend,
        };
        run_ready(frontend::handle(req, &mut peers))
    }

    fn serve(&self, service: Service, input: &[u8]) -> Result<Vec<u8>, ServiceError> {
        let mut peers = LocalPeers {
            local: self,
            caller: service,
        };
        run_ready(services::handle(
            service,
            input,
            &mut peers,
            Some(&*self.store),
        ))
    }
}

impl Peers for LocalPeers<'_> {
    type Output = Vec<u8>;

    fn call_all(
        &mut self,
        calls: Vec<(Service, Vec<u8>)>,
    ) -> impl Future<Output = Vec<Result<Vec<u8>, ServiceError>>> {
        let answers = calls
            .into_iter()
            .map(|(callee, input)| {
                if !self.caller.calls().contains(&callee) {
                    return Err(ServiceError::internal(format!(
                        "{} may not call {callee}",
                        self.caller
                    )));
                }
                self.local.serve(callee, &input)
            })
            .collect();
        std::future::ready(answers)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::money::Money;
    use crate::services::frontend::{
        CartChanged, CartPage, CheckoutForm, HomePage, OrderPage, PageRequest, ProductPage, Route,
    };

    fn page<T: serde::de::DeserializeOwned>(
        local: &Local,
        route: Route,
        currency: &str,
        body: &[u8],
    ) -> Result<T, ServiceError> {
        let req = PageRequest {
            route,
            session: Some("s1"),
            currency: Some(currency),
            body,
        };
        local
            .page(&req)
            .map(|out| serde_json::from_slice(&out).expect("pages are JSON"))
    }

    pub(crate) fn form(card: &str) -> Vec<u8> {
        serde_json::to_vec(&CheckoutForm {
            email: "someone@example.com".into(),
            street_address: "1600 Amphitheatre Parkway".into(),
            zip_code: "94043".into(),
            city: "Mountain View".into(),
            state: "CA".into(),
            country: "United States".into(),
            credit_card_number: card.into(),
            credit_card_expiration_month: 1,
            credit_card_expiration_year: crate::services::payment::current_year_month().0 + 1,
            credit_card_cvv: "672".into(),
        })
        .unwrap()
    }

    #[test]
    fn a_session_from_home_to_order() {
        let local = Local::default();
        let home: HomePage = page(&local, Route::Home, "EUR", b"").unwrap();
        assert_eq!(home.products.len(), 9);
        assert!(home.products.iter().all(|p| p.price.currency_code == "EUR"));
        assert_eq!(home.cart_size, 0);

        let p: ProductPage = page(&local, Route::Product, "EUR", b"OLJCESPC7Z").unwrap();
        assert_eq!(p.product.price, Money::new("EUR", 60, 141_530_296));
        assert!(!p.recommendations.contains(&p.product.id));
        assert!(p.ad.is_some());

        let add = br#"{"product_id":"OLJCESPC7Z","quantity":2}"#;
        let added: CartChanged = page(&local, Route::AddToCart, "EUR", add).unwrap();
        assert_eq!(added.cart_size, 2);
        let cart: CartPage = page(&local, Route::ViewCart, "EUR", b"").unwrap();
        assert_eq!(cart.items.len(), 1);
        assert_eq!(cart.shipping_cost.currency_code, "EUR");
        let expected = p
            .product
            .price
            .times(2)
            .unwrap()
            .checked_add(&cart.shipping_cost)
            .unwrap();
        assert_eq!(cart.total, expected);

        // A card that fails Luhn leaves the cart as it was.
        let bad = page::<OrderPage>(&local, Route::Checkout, "EUR", &form("4432-8015-6152-0455"));
        assert_eq!(bad.unwrap_err().status, 400);
        let order: OrderPage =
            page(&local, Route::Checkout, "EUR", &form("4432-8015-6152-0454")).unwrap();
        assert_eq!(order.order.total, expected);
        let cart: CartPage = page(&local, Route::ViewCart, "EUR", b"").unwrap();
        assert!(cart.items.is_empty());
        assert_eq!(cart.total, Money::zero("EUR"));
    }

    #[test]
    fn errors_keep_their_status() {
        let local = Local::default();
        let missing = page::<ProductPage>(&local, Route::Product, "USD", b"NOPE");
        assert_eq!(missing.unwrap_err().status, 404);
        let bad_currency = page::<HomePage>(&local, Route::Home, "XXX", b"");
        assert_eq!(bad_currency.unwrap_err().status, 400);
        let empty = page::<OrderPage>(&local, Route::Checkout, "USD", &form("4432801561520454"));
        assert_eq!(empty.unwrap_err().status, 400);
        let no_session = local.page(&PageRequest {
            route: Route::ViewCart,
            session: None,
            currency: None,
            body: b"",
        });
        assert_eq!(no_session.unwrap_err().status, 400);
    }
}
