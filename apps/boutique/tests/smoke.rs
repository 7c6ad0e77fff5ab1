//! End to end, both deployments of the boutique as real processes on real sockets: the
//! zerohop chain (`chain.yaml` under the real `zerohop up`) and the HTTP microservices
//! (`boutique-http`). Against each, over the original frontend's interface (cookies, form
//! posts, redirects; JSON asked for, HTML checked too): a scripted session whose every answer
//! is checked (the session cookie, set EUR, browse, add two products, view the cart, a
//! refused card, checkout: the order's total is the converted prices times quantities plus
//! shipping, and the cart is empty after; empty the cart, log out), and
//! a short run of `boutique-load` (every answer checked there) that must count requests and
//! no error. Every wait is bounded; every process is stopped by a guard, also on failure.

mod harness;

use harness::{
    add_form, checkout_form, start_http, Reply, User, BAD_CARD, BARISTA_KIT, GOOD_CARD, TYPEWRITER,
    WAIT,
};
use zerohop_app_boutique::load::report::Report;
use zerohop_app_boutique::money::Money;
use zerohop_app_boutique::services::frontend::{
    self, html, CartChanged, CartPage, CurrencyChoice, HomePage, OrderPage, ProductPage,
    CURRENCY_COOKIE, SESSION_COOKIE,
};
use zerohop_app_boutique::services::{currency, shipping};
use zerohop_test_support::{alive, children, wait_until, ChainProcess, Signal};

/// The repository's chain spec, one function per service.
fn start_chain() -> ChainProcess {
    ChainProcess::start(&harness::chain_spec("chain.yaml", 10), &[])
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

/// One user's HTTP client: the cookies the frontend set (session, currency), sent back.
struct Client {
    agent: ureq::Agent,
    url: String,
    session: Option<String>,
    currency: Option<String>,
}

impl Client {
    fn new(url: &str) -> Self {
        Self {
            agent: harness::http_agent(),
            url: url.to_owned(),
            session: None,
            currency: None,
        }
    }

    /// The answer to `METHOD path` (JSON asked for unless `json` is false); the cookies it
    /// sets join the user's.
    fn send_as(&mut self, method: &str, path: &str, body: &[u8], json: bool) -> Reply {
        let who = User {
            session: self.session.as_deref(),
            currency: self.currency.as_deref(),
        };
        let reply = harness::send_as(&self.agent, &self.url, method, path, who, body, json);
        for c in &reply.set_cookies {
            let (name, value) = c.split(';').next().unwrap().split_once('=').unwrap();
            let value = (!c.contains("Max-Age=0")).then(|| value.to_owned());
            match name {
                SESSION_COOKIE => self.session = value,
                CURRENCY_COOKIE => self.currency = value,
                other => panic!("{method} {path} set cookie {other}"),
            }
        }
        reply
    }

    fn send(&mut self, method: &str, path: &str, body: &[u8]) -> Reply {
        self.send_as(method, path, body, true)
    }

    /// The JSON of type `T` at `METHOD path`, which must answer `status`.
    fn json<T: serde::de::DeserializeOwned>(
        &mut self,
        status: u16,
        method: &str,
        path: &str,
        body: &[u8],
    ) -> (T, Reply) {
        let reply = self.send(method, path, body);
        assert_eq!(reply.status, status, "{method} {path}: {}", reply.text());
        assert_eq!(reply.content_type.as_deref(), Some(frontend::JSON));
        let page = serde_json::from_slice(&reply.body)
            .unwrap_or_else(|e| panic!("{method} {path}: {e}: {}", reply.text()));
        (page, reply)
    }

    /// The page at `METHOD path`, which must answer 200 with JSON of type `T`.
    fn page<T: serde::de::DeserializeOwned>(&mut self, method: &str, path: &str, body: &[u8]) -> T {
        self.json(200, method, path, body).0
    }

    /// The HTML page at `GET path`.
    fn html(&mut self, path: &str) -> String {
        let reply = self.send_as("GET", path, b"", false);
        assert_eq!(reply.status, 200, "GET {path}: {}", reply.text());
        assert_eq!(reply.content_type.as_deref(), Some(frontend::HTML));
        reply.text()
    }

    /// What a `POST` that redirects answers: its JSON, checked to lead to `to`.
    fn redirect<T: serde::de::DeserializeOwned>(&mut self, path: &str, body: &[u8], to: &str) -> T {
        let (changed, reply) = self.json(302, "POST", path, body);
        assert_eq!(reply.location.as_deref(), Some(to), "POST {path}");
        changed
    }

    fn status(&mut self, method: &str, path: &str, body: &[u8]) -> u16 {
        self.send(method, path, body).status
    }
}

/// The body of `GET path` at `url` sent over a raw connection with the header lines `lines`
/// (which may repeat a header, as no client library here does), asking for JSON.
fn raw_get(url: &str, path: &str, lines: &[&str]) -> String {
    use std::io::{Read, Write};
    let addr = url.trim_start_matches("http://");
    let mut conn = std::net::TcpStream::connect(addr).expect("connect");
    conn.set_read_timeout(Some(WAIT)).unwrap();
    let mut req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nAccept: application/json\r\n");
    for l in lines {
        req.push_str(&format!("{l}\r\n"));
    }
    req.push_str("Connection: close\r\n\r\n");
    conn.write_all(req.as_bytes()).unwrap();
    let mut answer = String::new();
    conn.read_to_string(&mut answer).expect("the whole answer");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    answer.split_once("\r\n\r\n").expect("a body").1.to_owned()
}

/// The checkout form of the scripted session, paid with `card`.
fn form(card: &str) -> Vec<u8> {
    checkout_form("someone@example.com", "1600 Amphitheatre Parkway", card)
}

/// A session from the home page to a placed order and a logout, over the original
/// frontend's interface, every answer checked.
fn scripted_session(url: &str) {
    let mut c = Client::new(url);

    // The first page sets the session cookie, for 48 hours.
    let reply = c.send("GET", "/", b"");
    assert_eq!(reply.set_cookies.len(), 1, "{:?}", reply.set_cookies);
    assert!(reply.set_cookies[0].ends_with("; Path=/; Max-Age=172800"));
    let session = c.session.clone().expect("a session cookie");
    let home: HomePage = serde_json::from_slice(&reply.body).unwrap();
    assert_eq!(home.session_id, session);
    assert_eq!(home.products.len(), 9);
    assert_eq!(home.currency, "USD");
    assert_eq!(home.cart_size, 0);
    let typewriter = home.products.iter().find(|p| p.id == TYPEWRITER).unwrap();
    assert_eq!(typewriter.price, Money::new("USD", 67, 990_000_000));
    // The same page in HTML, for the same session (no new cookie).
    let html = c.html("/");
    assert!(
        html.contains("Vintage Typewriter") && html.contains("USD 67.99"),
        "{html}"
    );
    assert_eq!(c.session.as_deref(), Some(session.as_str()));

    // Unknown currency, product and route; a form without its fields.
    assert_eq!(c.status("POST", "/setCurrency", b"currency_code=XXX"), 400);
    assert_eq!(c.status("GET", "/product/NOPE000000", b""), 404);
    assert_eq!(c.status("GET", "/nowhere", b""), 404);
    assert_eq!(c.status("PUT", "/cart", b""), 405);
    assert_eq!(c.status("POST", "/cart", b"product_id=OLJCESPC7Z"), 400);
    let health = c.send("GET", "/_healthz", b"");
    assert_eq!((health.status, health.text().as_str()), (200, "ok"));

    let choice: CurrencyChoice = c.redirect("/setCurrency", b"currency_code=EUR", "/");
    assert_eq!(choice.currency_code, "EUR");
    assert_eq!(c.currency.as_deref(), Some("EUR"), "the currency cookie");
    // Cookies over two `Cookie` fields are one list.
    let split = [
        format!("Cookie: other=1; {SESSION_COOKIE}={session}"),
        format!("Cookie: {CURRENCY_COOKIE}=JPY"),
    ];
    let split: Vec<&str> = split.iter().map(String::as_str).collect();
    let home: HomePage = serde_json::from_str(&raw_get(url, "/", &split)).unwrap();
    assert_eq!(
        (home.session_id, home.currency.as_str()),
        (session.clone(), "JPY")
    );

    let mut prices = Vec::new();
    for id in [TYPEWRITER, BARISTA_KIT] {
        let page: ProductPage = c.page("GET", &format!("/product/{id}"), b"");
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
    let html = c.html(&format!("/product/{TYPEWRITER}"));
    assert!(
        html.contains("Vintage Typewriter") && html.contains("EUR 60.14"),
        "{html}"
    );

    let added: CartChanged = c.redirect("/cart", &add_form(TYPEWRITER, 2), "/cart");
    assert_eq!(added.cart_size, 2);
    let added: CartChanged = c.redirect("/cart", &add_form(BARISTA_KIT, 1), "/cart");
    assert_eq!(added.cart_size, 3);
    assert_eq!(c.status("POST", "/cart", &add_form("NOPE000000", 1)), 404);

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
    let html = c.html("/cart");
    assert!(html.contains("Home Barista Kit"), "{html}");
    assert!(
        html.contains(&html::money(&expected)),
        "the total in {html}"
    );

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

    // An order in HTML shows its id; an emptied cart; a logout expires both cookies.
    c.redirect::<CartChanged>("/cart", &add_form(TYPEWRITER, 1), "/cart");
    let reply = c.send_as("POST", "/cart/checkout", &form(GOOD_CARD), false);
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert!(reply
        .text()
        .contains("Order confirmation ID: <span class=\"order-id\">"));
    c.redirect::<CartChanged>("/cart", &add_form(TYPEWRITER, 1), "/cart");
    let emptied: CartChanged = c.redirect("/cart/empty", b"", "/");
    assert_eq!(emptied.cart_size, 0);
    let reply = c.send("GET", "/logout", b"");
    assert_eq!((reply.status, reply.location.as_deref()), (302, Some("/")));
    assert_eq!(reply.set_cookies.len(), 2, "{:?}", reply.set_cookies);
    assert_eq!((c.session.as_deref(), c.currency.as_deref()), (None, None));
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
