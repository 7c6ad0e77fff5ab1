//! End to end, both deployments of the boutique as real processes on real sockets: the
//! zerohop chain (`chain.yaml` under the real `zerohop up`) and the HTTP microservices
//! (`boutique-http`). Against each: a scripted session whose every answer is checked (set
//! EUR, browse, add two products, view the cart, a refused card, checkout: the order's total
//! is the converted prices times quantities plus shipping, and the cart is empty after), and
//! a short run of `boutique-load` (every answer checked there) that must count requests and
//! no error. Every wait is bounded; every process is stopped by a guard, also on failure.

mod harness;

use std::process::{Command, Stdio};

use harness::{checkout_form, User, BAD_CARD, BARISTA_KIT, GOOD_CARD, TYPEWRITER, WAIT};
use zerohop_app_boutique::load::report::Report;
use zerohop_app_boutique::money::Money;
use zerohop_app_boutique::services::frontend::{
    CartChanged, CartPage, CurrencyChoice, HomePage, OrderPage, ProductPage,
};
use zerohop_app_boutique::services::{currency, shipping};
use zerohop_test_support::{
    alive, children, wait_until, ChainProcess, ChildGuard, ChildLines, Signal,
};

/// The repository's chain spec, one function per service.
fn start_chain() -> ChainProcess {
    ChainProcess::start(&harness::chain_spec("chain.yaml", 10), &[])
}

/// `boutique-http` and the frontend's URL; killed (and its services with it) on drop.
struct HttpDeployment {
    guard: ChildGuard,
    url: String,
}

fn start_http() -> HttpDeployment {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_boutique-http"));
    cmd.stdin(Stdio::null()).stdout(Stdio::piped());
    let mut guard = ChildGuard::new(cmd.spawn().expect("spawn boutique-http"));
    let lines = ChildLines::new(&mut guard);
    let url = lines.wait_for("boutique-http", "boutique-http: frontend at ", WAIT);
    assert!(url.starts_with("http://127.0.0.1:"), "{url}");
    HttpDeployment { guard, url }
}

/// Runs `boutique-load` briefly with a few users; checks its report, per route too.
fn smoke_load(url: &str) -> Report {
    let report = harness::run_load(url, 7);
    assert_eq!(
        report.routes.iter().map(|r| r.requests).sum::<u64>(),
        report.requests
    );
    report
}

/// One user's HTTP client: a session id and a currency sent as headers.
struct Client {
    agent: ureq::Agent,
    url: String,
    session: String,
    currency: Option<String>,
}

impl Client {
    fn new(url: &str, session: &str) -> Self {
        Self {
            agent: harness::http_agent(),
            url: url.to_owned(),
            session: session.to_owned(),
            currency: None,
        }
    }

    /// Status and body of `METHOD path`.
    fn send(&self, method: &str, path: &str, body: &[u8]) -> (u16, String) {
        let who = User {
            session: Some(&self.session),
            currency: self.currency.as_deref(),
        };
        let (status, body) = harness::send(&self.agent, &self.url, method, path, who, body);
        (status, String::from_utf8(body).expect("a text body"))
    }

    /// The page at `METHOD path`, which must answer 200 with JSON of type `T`.
    fn page<T: serde::de::DeserializeOwned>(&self, method: &str, path: &str, body: &[u8]) -> T {
        let (status, text) = self.send(method, path, body);
        assert_eq!(status, 200, "{method} {path}: {text}");
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{method} {path}: {e}: {text}"))
    }

    fn status(&self, method: &str, path: &str, body: &[u8]) -> u16 {
        self.send(method, path, body).0
    }
}

/// The checkout form of the scripted session, paid with `card`.
fn form(card: &str) -> Vec<u8> {
    checkout_form("someone@example.com", "1600 Amphitheatre Parkway", card)
}

/// A session from the home page to a placed order, every answer checked.
fn scripted_session(url: &str) {
    let mut c = Client::new(url, &format!("scripted-{}", std::process::id()));

    let home: HomePage = c.page("GET", "/", b"");
    assert_eq!(home.products.len(), 9);
    assert_eq!(home.currency, "USD");
    assert_eq!(home.cart_size, 0);
    let typewriter = home.products.iter().find(|p| p.id == TYPEWRITER).unwrap();
    assert_eq!(typewriter.price, Money::new("USD", 67, 990_000_000));

    // Unknown currency, product and route.
    assert_eq!(
        c.status("POST", "/setCurrency", br#"{"currency_code":"XXX"}"#),
        400
    );
    assert_eq!(c.status("POST", "/product", b"NOPE000000"), 404);
    assert_eq!(c.status("GET", "/nowhere", b""), 404);
    assert_eq!(c.status("PUT", "/cart", b""), 405);

    let choice: CurrencyChoice = c.page("POST", "/setCurrency", br#"{"currency_code":"EUR"}"#);
    assert_eq!(choice.currency_code, "EUR");
    c.currency = Some(choice.currency_code);

    let mut prices = Vec::new();
    for id in [TYPEWRITER, BARISTA_KIT] {
        let page: ProductPage = c.page("POST", "/product", id.as_bytes());
        assert_eq!(page.product.id, id);
        assert_eq!(page.currency, "EUR");
        assert!(!page.recommendations.iter().any(|r| r == id));
        assert!(page.ad.is_some());
        prices.push(page.product.price);
    }
    // 67.99 USD at 1.1305 USD per EUR, truncated to nanos.
    assert_eq!(prices[0], Money::new("EUR", 60, 141_530_296));
    let home: HomePage = c.page("GET", "/", b"");
    let shown = home.products.iter().find(|p| p.id == BARISTA_KIT).unwrap();
    assert_eq!(shown.price, prices[1], "home and product pages agree");

    let added: CartChanged = c.page(
        "POST",
        "/cart",
        format!(r#"{{"product_id":"{TYPEWRITER}","quantity":2}}"#).as_bytes(),
    );
    assert_eq!(added.cart_size, 2);
    let added: CartChanged = c.page(
        "POST",
        "/cart",
        format!(r#"{{"product_id":"{BARISTA_KIT}","quantity":1}}"#).as_bytes(),
    );
    assert_eq!(added.cart_size, 3);
    assert_eq!(
        c.status(
            "POST",
            "/cart",
            br#"{"product_id":"NOPE000000","quantity":1}"#
        ),
        404
    );

    let cart: CartPage = c.page("GET", "/cart", b"");
    let lines: Vec<(&str, u32)> = cart
        .items
        .iter()
        .map(|l| (l.product_id.as_str(), l.quantity))
        .collect();
    assert_eq!(lines, [(TYPEWRITER, 2), (BARISTA_KIT, 1)]);
    let usd_shipping = shipping::quote(3);
    let shipping = currency::convert(&usd_shipping, "EUR").unwrap();
    assert_eq!(cart.shipping_cost, shipping);
    let expected =
        Money::sum("EUR", [&prices[0].times(2).unwrap(), &prices[1], &shipping]).unwrap();
    assert_eq!(cart.total, expected);

    // A number that fails the Luhn check: refused, and the cart stays.
    assert_eq!(c.status("POST", "/cart/checkout", &form(BAD_CARD)), 400);
    let cart: CartPage = c.page("GET", "/cart", b"");
    assert_eq!(cart.cart_size, 3);

    let order: OrderPage = c.page("POST", "/cart/checkout", &form(GOOD_CARD));
    let o = &order.order;
    assert_eq!(
        o.total, expected,
        "order total = converted prices + shipping"
    );
    assert_eq!(o.shipping_cost, shipping);
    assert_eq!(o.items.len(), 2);
    assert_eq!(o.items[0].unit_price, prices[0]);
    assert!(!o.order_id.is_empty() && !o.shipping_tracking_id.is_empty());
    assert!(!o.transaction_id.is_empty());

    let cart: CartPage = c.page("GET", "/cart", b"");
    assert!(cart.items.is_empty(), "the cart is empty after checkout");
    assert_eq!(cart.total, Money::zero("EUR"));
    let home: HomePage = c.page("GET", "/", b"");
    assert_eq!(home.cart_size, 0);
    // Nothing left to order.
    assert_eq!(c.status("POST", "/cart/checkout", &form(GOOD_CARD)), 400);
}

#[test]
fn zerohop_chain_serves_the_boutique() {
    let chain = start_chain();
    scripted_session(&chain.url);
    smoke_load(&chain.url);
    assert_eq!(chain.stop(), Some(0), "zerohop up exits cleanly on SIGTERM");
}

#[test]
fn http_deployment_serves_the_boutique() {
    let mut http = start_http();
    let services = children(http.guard.pid());
    assert_eq!(services.len(), 10, "one process per service");
    scripted_session(&http.url);
    smoke_load(&http.url);

    http.guard.signal(Signal::SIGTERM);
    assert_eq!(http.guard.wait_timeout(WAIT), Some(0));
    assert!(
        wait_until(WAIT, || services.iter().all(|&p| !alive(p))),
        "services outlived boutique-http"
    );
}

#[test]
fn http_services_die_with_a_killed_supervisor() {
    let mut http = start_http();
    let services = children(http.guard.pid());
    assert_eq!(services.len(), 10);
    http.guard.signal(Signal::SIGKILL);
    assert_eq!(http.guard.wait_timeout(WAIT), None, "killed by a signal");
    assert!(
        wait_until(WAIT, || services.iter().all(|&p| !alive(p))),
        "services outlived a killed boutique-http"
    );
}
