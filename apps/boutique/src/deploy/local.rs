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
    pub fn page(
        &self,
        req: &frontend::PageRequest<'_>,
    ) -> Result<frontend::Response, ServiceError> {
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
    use crate::services::frontend::form::{encode_checkout, encode_currency_choice};
    use crate::services::frontend::{
        CartChanged, CartPage, CheckoutForm, CurrencyChoice, HomePage, OrderPage, PageRequest,
        ProductPage, Response, Route,
    };

    /// The answer to `route` for session `s1` with `currency` in its cookie, asking JSON.
    fn answer(
        local: &Local,
        route: Route,
        currency: &str,
        id: Option<&str>,
        body: &[u8],
    ) -> Result<Response, ServiceError> {
        let cookie = format!("shop_session-id=s1; shop_currency={currency}");
        let req = PageRequest {
            route,
            product_id: id,
            cookie: Some(&cookie),
            referer: None,
            accept: Some("application/json"),
            body,
        };
        local.page(&req)
    }

    fn page<T: serde::de::DeserializeOwned>(
        local: &Local,
        route: Route,
        currency: &str,
        body: &[u8],
    ) -> Result<T, ServiceError> {
        let id = (route == Route::Product).then(|| std::str::from_utf8(body).unwrap());
        answer(local, route, currency, id, body)
            .map(|a| serde_json::from_slice(&a.body).expect("pages are JSON"))
    }

    pub(crate) fn form(card: &str) -> Vec<u8> {
        encode_checkout(&CheckoutForm {
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
        .into_bytes()
    }

    #[test]
    fn a_session_from_home_to_order() {
        let local = Local::default();
        let home: HomePage = page(&local, Route::Home, "EUR", b"").unwrap();
        assert_eq!(home.products.len(), 9);
        assert!(home.products.iter().all(|p| p.price.currency_code == "EUR"));
        assert_eq!((home.cart_size, home.session_id.as_str()), (0, "s1"));

        let p: ProductPage = page(&local, Route::Product, "EUR", b"OLJCESPC7Z").unwrap();
        assert_eq!(p.product.price, Money::new("EUR", 60, 141_530_296));
        assert!(!p.recommendations.contains(&p.product.id));
        assert!(p.ad.is_some());

        let add = b"product_id=OLJCESPC7Z&quantity=2";
        let added = answer(&local, Route::AddToCart, "EUR", None, add).unwrap();
        assert_eq!(
            (added.status, added.header("location")),
            (302, Some("/cart"))
        );
        let changed: CartChanged = serde_json::from_slice(&added.body).unwrap();
        assert_eq!(changed.cart_size, 2);
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
    fn cookies_redirects_and_html() {
        let local = Local::default();
        // No cookie: a new session, set for 48 hours; HTML without an Accept.
        let req = PageRequest {
            route: Route::Home,
            product_id: None,
            cookie: None,
            referer: None,
            accept: None,
            body: b"",
        };
        let home = local.page(&req).unwrap();
        let set = home.header("set-cookie").unwrap();
        assert!(set.starts_with("shop_session-id="), "{set}");
        assert!(set.ends_with("; Path=/; Max-Age=172800"), "{set}");
        assert_eq!(home.header("content-type"), Some(frontend::HTML));
        let text = String::from_utf8(home.body).unwrap();
        assert!(
            text.contains("Vintage Typewriter") && text.contains("USD 67.99"),
            "{text}"
        );

        // setCurrency: the cookie, back to the referer.
        let body = encode_currency_choice(&CurrencyChoice {
            currency_code: "JPY".into(),
        });
        let req = PageRequest {
            route: Route::SetCurrency,
            cookie: Some("shop_session-id=s2"),
            referer: Some("http://shop/product/OLJCESPC7Z"),
            body: body.as_bytes(),
            ..req
        };
        let set = local.page(&req).unwrap();
        assert_eq!(set.status, 302);
        assert_eq!(
            set.header("location"),
            Some("http://shop/product/OLJCESPC7Z")
        );
        assert_eq!(
            set.headers,
            [
                ("Content-Type", frontend::HTML.to_owned()),
                ("Location", "http://shop/product/OLJCESPC7Z".to_owned()),
                (
                    "Set-Cookie",
                    "shop_currency=JPY; Path=/; Max-Age=172800".to_owned()
                ),
            ],
            "no new session: the request had one"
        );
        let bad = PageRequest {
            body: b"currency_code=XXX",
            ..req.clone()
        };
        assert_eq!(local.page(&bad).unwrap_err().status, 400);

        // The cart page in HTML shows the lines in the cookie's currency.
        let add = PageRequest {
            route: Route::AddToCart,
            cookie: Some("shop_session-id=s2; shop_currency=EUR"),
            body: b"product_id=OLJCESPC7Z&quantity=3",
            ..req.clone()
        };
        assert_eq!(local.page(&add).unwrap().header("location"), Some("/cart"));
        let view = PageRequest {
            route: Route::ViewCart,
            body: b"",
            ..add.clone()
        };
        let text = String::from_utf8(local.page(&view).unwrap().body).unwrap();
        assert!(text.contains("Vintage Typewriter"), "{text}");
        assert!(text.contains("<td class=\"quantity\">3</td>"), "{text}");
        assert!(text.contains("EUR 180.42"), "3 x 60.14: {text}");

        // Logout expires the request's cookies.
        let out = local
            .page(&PageRequest {
                route: Route::Logout,
                ..view.clone()
            })
            .unwrap();
        assert_eq!((out.status, out.header("location")), (302, Some("/")));
        let expired: Vec<&str> = out
            .headers
            .iter()
            .filter(|(n, _)| *n == "Set-Cookie")
            .map(|(_, v)| v.as_str())
            .collect();
        assert_eq!(expired.len(), 2);
        assert!(expired[0].starts_with("shop_session-id=; Path=/; Max-Age=0"));
        assert!(expired[1].starts_with("shop_currency=; Path=/; Max-Age=0"));

        let health = local
            .page(&PageRequest {
                route: Route::Health,
                ..view
            })
            .unwrap();
        assert_eq!((health.status, health.body.as_slice()), (200, &b"ok"[..]));
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
        let bad_form = answer(&local, Route::AddToCart, "USD", None, b"product_id=X");
        assert_eq!(bad_form.unwrap_err().status, 400);
        let no_id = answer(&local, Route::Product, "USD", None, b"");
        assert_eq!(no_id.unwrap_err().status, 400);
    }
}
