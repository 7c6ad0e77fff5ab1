//! The polyglot chain (`chain-polyglot.yaml`: currency in Node.js, email and recommendation
//! in Python, shipping in Go) against the all-Rust chain (`chain.yaml`), both as real
//! processes under the real `zerohop up` on free ports, asked the same over real HTTP:
//!
//! - pages through the Rust frontend, over the original's interface (cookies, form posts,
//!   redirects; JSON asked for): home in several currencies, every product, the cart,
//!   checkouts that pass and fail, invalid inputs: the same status and `Location`, the same
//!   error text, the same JSON once the random parts (ad picks, recommendations, new
//!   sessions, order, transaction and tracking ids) are checked against their constraints
//!   and masked;
//! - each ported service called directly, by a route the test adds to both specs: byte for
//!   byte the same answers (the e-mail's text among them, which no page shows), the same
//!   errors for semantic failures, the same status and prefix for inputs serde refuses (its
//!   line and column are not ported);
//! - the instances' command lines: the ports are what runs, in the polyglot chain only;
//! - a short `boutique-load` run on the polyglot chain: no error.
//!
//! Built here: the Go port (`target/polyglot/boutique-shipping`, `go build`) and the Node.js
//! port's `node_modules` (`npm install --offline`). Needed from the build of the workspace
//! (`cargo xtask test` makes them): `target/release/zerohop`, the C SDK (`target/c-sdk`),
//! the Python SDK (`target/python-sdk`), the Node.js addon (`sdk/node/zerohop.node`).
//! Every wait is bounded; every process is stopped by a guard, also on failure.

mod harness;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use harness::{checkout_form, User, BAD_CARD, BARISTA_KIT, GOOD_CARD, TYPEWRITER, WAIT};
use serde_json::{json, Value};
use zerohop_app_boutique::money::Money;
use zerohop_app_boutique::rpc::Service;
use zerohop_app_boutique::services::productcatalog;
use zerohop_app_boutique::services::recommendation::Recommendations;
use zerohop_test_support::{instances, wait_until, ChainProcess, ChildGuard};

/// Longest a port's build may take (the first Go build compiles the cgo glue).
const BUILD_WAIT: Duration = Duration::from_secs(600);

/// The ported services, by what their instance runs: (service, language). Each is also
/// called directly, by a route `POST /direct/SERVICE` the test adds to both specs.
const PORTS: [(&str, &str); 4] = [
    ("currency", "Node.js"),
    ("email", "Python"),
    ("recommendation", "Python"),
    ("shipping", "Go"),
];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("the checkout")
}

fn boutique() -> PathBuf {
    root().join("apps/boutique")
}

/// Runs a build step, inheriting its output (shown when it fails); at most BUILD_WAIT.
fn build(what: &str, cmd: &mut Command) {
    let child = cmd
        .stdin(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("{what}: cannot run {:?}: {e}", cmd.get_program()));
    let code = ChildGuard::new(child).wait_timeout(BUILD_WAIT);
    assert_eq!(code, Some(0), "{what} failed (its output is above)");
}

/// Builds the ports that need a build (once per test binary); the Go program's path.
fn build_ports() -> &'static Path {
    static SHIPPING: OnceLock<PathBuf> = OnceLock::new();
    SHIPPING.get_or_init(|| {
        let root = root();
        for (built, how) in [
            ("target/c-sdk/lib/pkgconfig", "cargo xtask c-sdk"),
            (
                "target/python-sdk/zerohop/__init__.py",
                "python3 -m pip install --target target/python-sdk sdk/python",
            ),
            ("sdk/node/zerohop.node", "cd sdk/node && npm run build"),
        ] {
            assert!(
                root.join(built).exists(),
                "{built} is missing: `cargo xtask test` builds it (or `{how}`)"
            );
        }
        let shipping = root.join("target/polyglot/boutique-shipping");
        build(
            "go build of apps/boutique/polyglot/shipping (Go 1.22 or newer)",
            Command::new("go")
                .args(["build", "-buildvcs=false"])
                .arg(zerohop_test_support::go_sdk_stamp(
                    &root.join("target/c-sdk/lib/libzerohop.a"),
                ))
                .arg("-o")
                .arg(&shipping)
                .arg(".")
                .current_dir(boutique().join("polyglot/shipping"))
                .env("PKG_CONFIG_PATH", root.join("target/c-sdk/lib/pkgconfig")),
        );
        build(
            "npm install in apps/boutique/polyglot (the zerohop package from sdk/node)",
            Command::new("npm")
                .args([
                    "install",
                    "--offline",
                    "--no-audit",
                    "--no-fund",
                    "--silent",
                ])
                .current_dir(boutique().join("polyglot")),
        );
        shipping
    })
}

/// `text` with `from` replaced by `to`, which must occur `count` times.
fn replace(text: &str, from: &str, to: &str, count: usize) -> String {
    assert_eq!(text.matches(from).count(), count, "{from:?} in the spec");
    text.replace(from, to)
}

/// The app's spec `file` (a boutique chain, routes last, `functions` of them run by
/// boutique-fn) ready for a test ([`harness::chain_spec`]), with the direct routes.
fn test_spec(file: &str, functions: usize) -> String {
    let mut spec = harness::chain_spec(file, functions);
    assert!(
        spec.trim_end().ends_with("sequence: [frontend] }"),
        "routes last"
    );
    for (s, _) in PORTS {
        spec += &format!("  - {{ http: POST /direct/{s}, sequence: [{s}] }}\n");
    }
    spec
}

fn start_rust() -> ChainProcess {
    ChainProcess::start(&test_spec("chain.yaml", 10), &[])
}

/// The polyglot chain, its relative paths made absolute (the spec is written to a scratch
/// folder; its Python package path is relative to the checkout's root).
fn start_polyglot() -> ChainProcess {
    let shipping = build_ports();
    let (root, boutique) = (root(), boutique());
    let spec = test_spec("chain-polyglot.yaml", 6);
    let spec = replace(
        &spec,
        "../../target/polyglot/boutique-shipping",
        &shipping.display().to_string(),
        1,
    );
    let spec = replace(
        &spec,
        "handler: \"polyglot/",
        &format!("handler: \"{}/polyglot/", boutique.display()),
        1,
    );
    let python_path = format!(
        "PYTHONPATH: \"{}:{}\"",
        root.join("target/python-sdk").display(),
        boutique.display()
    );
    let spec = replace(&spec, "PYTHONPATH: target/python-sdk", &python_path, 2);
    ChainProcess::start(&spec, &[])
}

/// An answer: status, `Location` and body.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Answer {
    status: u16,
    location: Option<String>,
    body: Vec<u8>,
}

impl Answer {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

const ANONYMOUS: User<'static> = User {
    session: None,
    currency: None,
};

fn user<'a>(session: &'a str, currency: Option<&'a str>) -> User<'a> {
    User {
        session: Some(session),
        currency,
    }
}

/// The two chains, asked the same.
struct Pair {
    rust: ChainProcess,
    poly: ChainProcess,
    http: ureq::Agent,
}

impl Pair {
    fn send(&self, url: &str, method: &str, path: &str, who: User<'_>, body: &[u8]) -> Answer {
        let reply = harness::send(&self.http, url, method, path, who, body);
        Answer {
            status: reply.status,
            location: reply.location,
            body: reply.body,
        }
    }

    /// Both chains' answers to the same request.
    fn both(&self, method: &str, path: &str, who: User<'_>, body: &[u8]) -> (Answer, Answer) {
        (
            self.send(&self.rust.url, method, path, who, body),
            self.send(&self.poly.url, method, path, who, body),
        )
    }

    /// A page from both frontends: the same status (and `Location`), an error's text the
    /// same, a page's (or a redirect's) JSON the same once its random parts are checked
    /// (`excluded`: products that must not be recommended) and masked. The Rust chain's
    /// answer, masked.
    fn page(
        &self,
        method: &str,
        path: &str,
        who: User<'_>,
        body: &[u8],
        excluded: &[&str],
    ) -> (u16, Value) {
        let what = format!("{method} {path} {:?}", String::from_utf8_lossy(body));
        let (rust, poly) = self.both(method, path, who, body);
        let status = rust.status;
        assert_eq!(
            rust.status,
            poly.status,
            "{what}: Rust {} / polyglot {}",
            rust.text(),
            poly.text()
        );
        assert_eq!(rust.location, poly.location, "{what}: Location");
        if !matches!(rust.status, 200 | 302) {
            assert_eq!(rust.text(), poly.text(), "{what}: the error");
            return (rust.status, Value::String(rust.text()));
        }
        let parse = |a: &Answer| -> Value {
            let mut v: Value = serde_json::from_slice(&a.body)
                .unwrap_or_else(|e| panic!("{what}: {e}: {}", a.text()));
            mask(&mut v, excluded, &what);
            v
        };
        let (rust, poly) = (parse(&rust), parse(&poly));
        assert_eq!(rust, poly, "{what}: Rust and polyglot pages differ");
        (status, rust)
    }

    /// A page that must be served.
    fn ok(&self, method: &str, path: &str, who: User<'_>, body: &[u8], excluded: &[&str]) -> Value {
        let (status, v) = self.page(method, path, who, body, excluded);
        assert_eq!(status, 200, "{method} {path}: {v}");
        v
    }

    /// A form post that must redirect (302); its JSON.
    fn moved(&self, path: &str, who: User<'_>, body: &[u8]) -> Value {
        let (status, v) = self.page("POST", path, who, body, &[]);
        assert_eq!(status, 302, "POST {path}: {v}");
        v
    }

    /// `service` called directly in both chains with `input`.
    fn direct(&self, service: &str, input: &[u8]) -> (Answer, Answer) {
        self.both("POST", &format!("/direct/{service}"), ANONYMOUS, input)
    }

    /// `service`'s answers to `input`, byte for byte the same in both chains; the answer.
    fn same(&self, service: &str, input: &[u8]) -> Answer {
        let (rust, poly) = self.direct(service, input);
        assert_eq!(
            (rust.status, rust.text()),
            (poly.status, poly.text()),
            "{service} {:?}: Rust, polyglot",
            String::from_utf8_lossy(input)
        );
        assert_eq!(rust.body, poly.body, "{service}: byte for byte");
        rust
    }

    /// `input` refused by serde in the Rust service and by the port alike: 400, the same
    /// prefix (`SERVICE: bad request: `); the rest is serde's wording, with a position.
    fn refused(&self, service: &str, input: &[u8]) {
        let (rust, poly) = self.direct(service, input);
        let prefix = format!("function '{service}': {service}: bad request: ");
        for (who, a) in [("Rust", &rust), ("polyglot", &poly)] {
            assert!(
                a.status == 400 && a.text().starts_with(&prefix),
                "{service} {:?}: {who} answered {} {}",
                String::from_utf8_lossy(input),
                a.status,
                a.text()
            );
        }
    }
}

/// The catalog's product ids.
fn catalog() -> Vec<&'static str> {
    productcatalog::products()
        .iter()
        .map(|p| p.id.as_str())
        .collect()
}

/// Checks recommendations: distinct catalog products, none of `excluded`, as many as there
/// are others up to five.
fn check_recommendations(ids: &[String], excluded: &[&str], what: &str) {
    let catalog = catalog();
    let others = catalog.iter().filter(|id| !excluded.contains(id)).count();
    assert_eq!(ids.len(), others.min(5), "{what}: {ids:?}");
    for (i, id) in ids.iter().enumerate() {
        assert!(catalog.contains(&id.as_str()), "{what}: {id} is no product");
        assert!(
            !excluded.contains(&id.as_str()),
            "{what}: {id} was to be left out"
        );
        assert!(!ids[..i].contains(id), "{what}: {id} twice");
    }
}

fn is_uuid(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 36
        && b.iter().enumerate().all(|(i, &c)| match i {
            8 | 13 | 18 | 23 => c == b'-',
            14 => c == b'4',
            _ => c.is_ascii_hexdigit(),
        })
}

/// `QK-483920-118273`, as shipping.rs makes them.
fn is_tracking_id(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 16
        && b.iter().enumerate().all(|(i, &c)| match i {
            0 | 1 => c.is_ascii_uppercase(),
            2 | 9 => c == b'-',
            _ => c.is_ascii_digit(),
        })
}

/// Checks the random parts of a page and replaces them with what both chains must agree on.
fn mask(v: &mut Value, excluded: &[&str], what: &str) {
    match v {
        Value::Object(map) => map
            .iter_mut()
            .for_each(|(k, x)| mask_member(k, x, excluded, what)),
        Value::Array(items) => items.iter_mut().for_each(|x| mask(x, excluded, what)),
        _ => {}
    }
}

/// [`mask`] for the member `key` of an object, `x`.
fn mask_member(key: &str, x: &mut Value, excluded: &[&str], what: &str) {
    let placeholder = match key {
        "ad" => {
            let ad = x.as_object().unwrap_or_else(|| panic!("{what}: ad {x}"));
            assert!(ad["redirect_url"]
                .as_str()
                .unwrap()
                .starts_with("/product/"));
            assert!(!ad["text"].as_str().unwrap().is_empty());
            "<ad>"
        }
        "recommendations" => {
            let ids: Vec<String> = serde_json::from_value(x.clone())
                .unwrap_or_else(|e| panic!("{what}: recommendations {x}: {e}"));
            check_recommendations(&ids, excluded, what);
            "<recommendations>"
        }
        // A user without the cookie gets a new session in each chain.
        "session_id" if x.as_str().is_some_and(is_uuid) => "<new session>",
        "order_id" | "transaction_id" => {
            assert!(is_uuid(x.as_str().unwrap_or_default()), "{what}: {key} {x}");
            "<uuid>"
        }
        "shipping_tracking_id" => {
            let id = x.as_str().unwrap_or_default();
            assert!(is_tracking_id(id), "{what}: tracking id {x}");
            "<tracking id>"
        }
        _ => return mask(x, excluded, what),
    };
    *x = json!(placeholder);
}

const CAMERA: &str = "66VCHSJNUP";

fn add(product: &str, quantity: i64) -> Vec<u8> {
    harness::add_form(product, quantity)
}

/// Pages through the Rust frontend, the same in both chains.
fn same_pages(p: &Pair) {
    let s = "shopper";
    // Home pages: no session, then in several currencies (every price converted by the
    // port in the polyglot chain).
    p.ok("GET", "/", ANONYMOUS, b"", &[]);
    for c in [
        None,
        Some("EUR"),
        Some("JPY"),
        Some("GBP"),
        Some("IDR"),
        Some("TRY"),
    ] {
        p.ok("GET", "/", user(s, c), b"", &[]);
    }
    assert_eq!(p.page("GET", "/", user(s, Some("XXX")), b"", &[]).0, 400);
    p.moved("/setCurrency", user(s, None), b"currency_code=CAD");
    for body in [&b"currency_code=XXX"[..], b"CAD"] {
        assert_eq!(
            p.page("POST", "/setCurrency", user(s, None), body, &[]).0,
            400
        );
    }

    // Every product's page (recommendations leave the product out), in two currencies.
    for id in catalog() {
        for c in [Some("EUR"), Some("KRW")] {
            p.ok("GET", &format!("/product/{id}"), user(s, c), b"", &[id]);
        }
    }
    assert_eq!(
        p.page("GET", "/product/NOPE000000", user(s, None), b"", &[])
            .0,
        404
    );

    // The cart: adds, refused adds, the cart page in several currencies (shipping quoted by
    // the port and converted by the port).
    for (id, n) in [(TYPEWRITER, 2), (BARISTA_KIT, 1), (CAMERA, 10)] {
        p.moved("/cart", user(s, None), &add(id, n));
    }
    assert_eq!(
        p.page("POST", "/cart", user(s, None), &add(TYPEWRITER, 0), &[])
            .0,
        400
    );
    assert_eq!(
        p.page("POST", "/cart", user(s, None), &add("NOPE000000", 1), &[])
            .0,
        404
    );
    assert_eq!(p.page("POST", "/cart", user(s, None), b"{", &[]).0, 400);
    assert_eq!(
        p.page(
            "POST",
            "/cart",
            user(s, None),
            b"product_id=X&quantity=x",
            &[]
        )
        .0,
        400
    );
    let in_cart = [TYPEWRITER, BARISTA_KIT, CAMERA];
    for c in [None, Some("EUR"), Some("JPY"), Some("IDR")] {
        p.ok("GET", "/cart", user(s, c), b"", &in_cart);
    }

    // Checkouts that fail: a card failing the Luhn check (payment), no street (the
    // shipping port, after the charge), a currency nobody has (the currency port's
    // message, quoted as Rust's {:?} does). The cart stays.
    let form = checkout_form(
        "someone@example.com",
        "1600 Amphitheatre Parkway",
        GOOD_CARD,
    );
    let failing = [
        (
            checkout_form("someone@example.com", "1 Main St", BAD_CARD),
            Some("EUR"),
        ),
        (
            checkout_form("someone@example.com", "", GOOD_CARD),
            Some("EUR"),
        ),
        (form.clone(), Some("XXX")),
        (form.clone(), Some("X\"Y\\Z")),
        (form.clone(), Some("X\tY")),
        (b"email=a".to_vec(), Some("EUR")),
    ];
    for (body, c) in failing {
        let (status, v) = p.page("POST", "/cart/checkout", user(s, c), &body, &[]);
        assert_eq!(status, 400, "{v}");
    }
    let (_, v) = p.page(
        "POST",
        "/cart/checkout",
        user(s, Some("X\"Y\\Z")),
        &form,
        &[],
    );
    assert!(
        v.as_str()
            .unwrap()
            .ends_with("unsupported currency \"X\\\"Y\\\\Z\"\n"),
        "{v}"
    );
    let cart = p.ok("GET", "/cart", user(s, Some("EUR")), b"", &in_cart);
    assert_eq!(cart["cart_size"], 13);

    // The order, in EUR: prices, shipping and total from the ports.
    let order = p.ok("POST", "/cart/checkout", user(s, Some("EUR")), &form, &[]);
    assert_eq!(order["order"]["items"].as_array().unwrap().len(), 3);
    let cart = p.ok("GET", "/cart", user(s, Some("EUR")), b"", &[]);
    assert_eq!(cart["cart_size"], 0);
    assert_eq!(
        p.page("POST", "/cart/checkout", user(s, Some("EUR")), &form, &[])
            .0,
        400,
        "nothing left to order"
    );

    // An address that is no e-mail address: the order goes through (the confirmation's
    // failure is only logged, in both chains); an order in JPY; an emptied cart.
    p.moved("/cart", user(s, None), &add(CAMERA, 3));
    let no_email = checkout_form("nobody", "1600 Amphitheatre Parkway", GOOD_CARD);
    p.ok(
        "POST",
        "/cart/checkout",
        user(s, Some("USD")),
        &no_email,
        &[],
    );
    p.moved("/cart", user(s, None), &add(BARISTA_KIT, 5));
    p.ok("POST", "/cart/checkout", user(s, Some("JPY")), &form, &[]);
    p.moved("/cart", user(s, None), &add(TYPEWRITER, 1));
    p.moved("/cart/empty", user(s, None), b"");
    p.ok("GET", "/cart", user(s, None), b"", &[]);
}

fn money(code: &str, units: i64, nanos: i32) -> Value {
    json!(Money::new(code, units, nanos))
}

fn to_vec(v: &Value) -> Vec<u8> {
    serde_json::to_vec(v).unwrap()
}

/// currency called directly: every amount in every currency, byte for byte.
fn same_currency(p: &Pair) {
    let supported = p.same("currency", br#"{"op":"supported"}"#);
    assert_eq!(supported.status, 200);
    let codes: Vec<String> = serde_json::from_slice::<Value>(&supported.body).unwrap()
        ["currency_codes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap().to_owned())
        .collect();
    assert_eq!(codes.len(), 33);

    let amounts = [
        money("USD", 67, 990_000_000),
        money("USD", 0, 10_000_000),
        money("EUR", -1, -500_000_000),
        money("JPY", 123_456_789_012, 1),
        money("IDR", 0, 1),
        money("KRW", i64::MAX, 999_999_999),
        money("USD", i64::MIN, -999_999_999),
        money("GBP", 0, 0),
        json!({ "currencyCode": "CHF", "units": 3 }),
        json!({ "currency_code": "TRY" }),
    ];
    for from in &amounts {
        for to in &codes {
            let input = to_vec(&json!({ "op": "convert", "from": from, "to_code": to }));
            p.same("currency", &input);
        }
    }

    // Refused for what they mean: the same status and message.
    let refused = [
        json!({ "op": "convert", "from": money("USD", 1, -1), "to_code": "EUR" }),
        json!({ "op": "convert", "from": money("USD", 0, 1_000_000_000), "to_code": "EUR" }),
        json!({ "op": "convert", "from": money("XXX", 1, 0), "to_code": "EUR" }),
        json!({ "op": "convert", "from": money("USD", 1, 0), "to_code": "eur" }),
        json!({ "op": "convert", "from": money("X\"\\\t\n\u{0}\u{7f}é\u{301}😀", 1, 0), "to_code": "EUR" }),
        json!({ "op": "convert", "from": money("USD", i64::MAX, 0), "to_code": "IDR" }),
    ];
    for input in &refused {
        assert_eq!(p.same("currency", &to_vec(input)).status, 400, "{input}");
    }
    // Refused by serde: not UTF-8, not JSON, a missing or mistyped field, a field twice, an
    // integer out of range or a float.
    for input in [
        &b"\xff"[..],
        b"",
        b"{",
        b"[]",
        b"{}",
        br#"{"op":"nope"}"#,
        br#"{"op":5}"#,
        br#"{"op":"convert"}"#,
        br#"{"op":"convert","to_code":"EUR"}"#,
        br#"{"op":"convert","from":{"units":1},"to_code":"EUR"}"#,
        br#"{"op":"convert","from":{"currency_code":"USD","units":1.0},"to_code":"EUR"}"#,
        br#"{"op":"convert","from":{"currency_code":"USD","units":9223372036854775808},"to_code":"EUR"}"#,
        br#"{"op":"convert","from":{"currency_code":"USD","nanos":2147483648},"to_code":"EUR"}"#,
        br#"{"op":"convert","from":{"currency_code":"USD","units":"1"},"to_code":"EUR"}"#,
        br#"{"op":"convert","from":{"currency_code":"USD","currencyCode":"USD"},"to_code":"EUR"}"#,
        br#"{"op":"convert","from":{"currency_code":"USD"},"to_code":"EUR","to_code":"USD"}"#,
        br#"{"op":"convert","from":{"currency_code":"\ud800"},"to_code":"EUR"}"#,
        br#"{"op":"convert","from":{"currency_code":null},"to_code":"EUR"}"#,
        br#"{"op":"supported"} x"#,
    ] {
        p.refused("currency", input);
    }
}

fn order(items: Value, shipping: Value, total: Value, address: Value) -> Value {
    json!({
        "order_id": "5d8c2a52-6f0e-4c1b-9a53-0a2f3c8d1e77",
        "shipping_tracking_id": "QK-483920-118273",
        "shipping_cost": shipping,
        "shipping_address": address,
        "items": items,
        "total": total,
        "transaction_id": "b0e1f2a3-4c5d-4e6f-8a9b-0c1d2e3f4a5b",
    })
}

fn address(street: &str, city: &str) -> Value {
    json!({
        "street_address": street, "city": city, "state": "CA",
        "country": "United States", "zip_code": "94043",
    })
}

/// email called directly: the confirmation, byte for byte.
fn same_email(p: &Pair) {
    let item =
        |id: &str, q: u32, m: Value| json!({ "product_id": id, "quantity": q, "unit_price": m });
    let plain = order(
        json!([
            item(TYPEWRITER, 2, money("EUR", 60, 141_530_296)),
            item(BARISTA_KIT, 1, money("EUR", 109, 686_864_219)),
        ]),
        money("EUR", 7, 952_233_524),
        money("EUR", 237, 921_824_116),
        address("1600 Amphitheatre Parkway", "Mountain View"),
    );
    // Amounts at the edges of the cents' truncation and of the types, text that JSON must
    // escape, no items, the catalog's spelling of a currency, fields nobody reads.
    let edges = order(
        json!([
            item("A", 0, money("USD", 0, -5_000_000)),
            item(
                "B\"\\\n\t\u{1}\u{7f}",
                u32::MAX,
                money("USD", 0, -10_000_000)
            ),
            item(
                "日本😀\u{301}\u{2028}",
                1,
                money("JPY", i64::MAX, 999_999_999)
            ),
            item("C", 7, money("USD", i64::MIN, -999_999_999)),
            item("D", 1, json!({ "currencyCode": "GBP", "units": -3 })),
            item("E", 1, json!({ "currency_code": "" })),
        ]),
        money("USD", 0, 9_999_999),
        money("USD", -12, -345_678_901),
        address("Straße 1\r\n</script>&<>", "Zürich"),
    );
    let empty = order(
        json!([]),
        money("EUR", 0, 0),
        money("EUR", 0, 0),
        address("", ""),
    );
    for (email, o) in [
        ("someone@example.com", &plain),
        ("\"odd\"@exämple", &edges),
        ("@", &empty),
    ] {
        let mut req = json!({ "email": email, "order": o });
        let a = p.same("email", &to_vec(&req));
        assert_eq!(a.status, 200, "{}", a.text());
        req["unknown"] = json!([1, { "x": null }]);
        req["order"]["more"] = json!(true);
        p.same("email", &to_vec(&req));
    }
    let confirmation: Value = serde_json::from_slice(
        &p.same("email", &to_vec(&json!({ "email": "a@b", "order": plain })))
            .body,
    )
    .unwrap();
    assert!(
        confirmation["text"]
            .as_str()
            .unwrap()
            .contains("2 x OLJCESPC7Z at 60.14 EUR\n"),
        "{confirmation}"
    );

    // No e-mail address: the same message, the address quoted as Rust's {:?} does.
    for email in [
        "nobody",
        "",
        "tab\there \"q\" \\ \0 \u{7f} \u{a0} \u{200b} é\u{301} 😀 '",
    ] {
        let a = p.same("email", &to_vec(&json!({ "email": email, "order": plain })));
        assert_eq!(a.status, 400, "{}", a.text());
    }

    let mut bad_quantity = json!({ "email": "a@b", "order": plain });
    bad_quantity["order"]["items"][0]["quantity"] = json!(-1);
    let mut float_units = json!({ "email": "a@b", "order": plain });
    float_units["order"]["total"]["units"] = json!(1.5);
    let mut no_street = json!({ "email": "a@b", "order": plain });
    no_street["order"]["shipping_address"]
        .as_object_mut()
        .unwrap()
        .remove("street_address");
    let mut null_id = json!({ "email": "a@b", "order": plain });
    null_id["order"]["order_id"] = Value::Null;
    let mut big_nanos = json!({ "email": "a@b", "order": plain });
    big_nanos["order"]["shipping_cost"]["nanos"] = json!(2_147_483_648_i64);
    for input in [bad_quantity, float_units, no_street, null_id, big_nanos] {
        p.refused("email", &to_vec(&input));
    }
    for input in [
        &b"\xc3\x28"[..],
        b"NaN",
        b"{}",
        br#"{"email":"a@b"}"#,
        br#"{"email":"a@b","email":"c@d","order":{}}"#,
        br#"{"email":"\udc00","order":{}}"#,
        br#"{"email":true,"order":{}}"#,
    ] {
        p.refused("email", input);
    }
}

/// shipping called directly: quotes byte for byte, shipments' ids in shape, the same errors.
fn same_shipping(p: &Pair) {
    let home = address("1600 Amphitheatre Parkway", "Mountain View");
    let items = |qs: &[u32]| -> Value {
        qs.iter()
            .enumerate()
            .map(|(i, q)| json!({ "product_id": format!("P{i}"), "quantity": q }))
            .collect()
    };
    for qs in [&[][..], &[0], &[1], &[2, 3], &[u32::MAX, u32::MAX, 1]] {
        let a = p.same(
            "shipping",
            &to_vec(&json!({ "op": "quote", "address": home, "items": items(qs) })),
        );
        assert_eq!(a.status, 200, "{}", a.text());
    }
    let ship = to_vec(&json!({ "op": "ship", "address": home, "items": items(&[1, 2]) }));
    // Random ids: fifty of each, all in shape (a number without its leading zeros would
    // show within fifty) and all different.
    let mut ids = [BTreeSet::new(), BTreeSet::new()];
    for _ in 0..50 {
        let (rust, poly) = p.direct("shipping", &ship);
        for ((who, a), ids) in [("Rust", rust), ("polyglot", poly)]
            .into_iter()
            .zip(&mut ids)
        {
            let v: Value = serde_json::from_slice(&a.body).unwrap_or_else(|e| panic!("{who}: {e}"));
            let id = v["tracking_id"].as_str().unwrap_or_default();
            assert!(is_tracking_id(id), "{who}: tracking id of {v}");
            assert_eq!(v.as_object().unwrap().len(), 1, "{who}: {v}");
            ids.insert(id.to_owned());
        }
    }
    assert_eq!(ids.map(|i| i.len()), [50, 50], "distinct tracking ids");
    for (address, qs) in [
        (home.clone(), &[][..]),
        (address("", "Mountain View"), &[1]),
        (
            json!({ "street_address": "1 Main St", "city": "", "state": "", "country": "", "zip_code": "" }),
            &[1],
        ),
    ] {
        let input = to_vec(&json!({ "op": "ship", "address": address, "items": items(qs) }));
        assert_eq!(p.same("shipping", &input).status, 400);
    }
    let mut case = json!({ "Op": "quote", "address": home, "items": [] });
    p.refused("shipping", &to_vec(&case));
    case = json!({ "op": "quote", "Address": home, "items": [] });
    p.refused("shipping", &to_vec(&case));
    for items in [
        json!([{ "product_id": "A", "quantity": -1 }]),
        json!([{ "product_id": "A", "quantity": 1.5 }]),
        json!([{ "product_id": "A", "quantity": 4_294_967_296_u64 }]),
        json!([{ "product_id": "A", "quantity": "1" }]),
        json!([{ "product_id": null, "quantity": 1 }]),
        json!([{ "quantity": 1 }]),
        json!([1]),
        json!({}),
    ] {
        p.refused(
            "shipping",
            &to_vec(&json!({ "op": "quote", "address": home, "items": items })),
        );
    }
    for input in [
        &b"\xed\xa0\x80"[..],
        b"{}",
        br#"{"op":"fly","address":{},"items":[]}"#,
        br#"{"op":"quote","items":[]}"#,
        br#"{"op":"quote","address":{"street_address":"a","city":"b","state":"c","country":"d"},"items":[]}"#,
        br#"{"op":"quote","address":{"street_address":"\ud800x","city":"b","state":"c","country":"d","zip_code":"e"},"items":[]}"#,
        br#"{"op":"quote","op":"quote","address":{"street_address":"a","city":"b","state":"c","country":"d","zip_code":"e"},"items":[]}"#,
        b"[",
    ] {
        p.refused("shipping", input);
    }
}

/// recommendation called directly: the constraints in both chains, the same errors.
fn same_recommendation(p: &Pair) {
    let all = catalog();
    let excluded_sets: [&[&str]; 5] = [
        &[],
        &all[..1],
        &all[..6],
        &all[..],
        &["NOPE000000", "", "x"],
    ];
    for excluded in excluded_sets {
        let input = to_vec(&json!({ "user_id": "u", "product_ids": excluded }));
        let (rust, poly) = p.direct("recommendation", &input);
        let mut answers = Vec::new();
        for (who, a) in [("Rust", rust), ("polyglot", poly)] {
            assert_eq!(a.status, 200, "{who}: {}", a.text());
            let v: Value = serde_json::from_slice(&a.body).unwrap();
            assert_eq!(v.as_object().unwrap().len(), 1, "{who}: {v}");
            let mut ids = serde_json::from_value::<Recommendations>(v)
                .unwrap()
                .product_ids;
            check_recommendations(&ids, excluded, &format!("{who} recommendation"));
            ids.sort();
            answers.push(ids);
        }
        // Three or fewer left: both answer all of them.
        if answers[0].len() < 5 {
            assert_eq!(answers[0], answers[1]);
        }
    }
    // Both fields are optional; an empty list of products is an empty answer's reason, not
    // an error.
    for input in [&b"{}"[..], br#"{"user_id":"u"}"#, br#"{"product_ids":[]}"#] {
        let (rust, poly) = p.direct("recommendation", input);
        assert_eq!((rust.status, poly.status), (200, 200));
    }
    for input in [
        &b"\xff"[..],
        b"null",
        br#"{"product_ids":"OLJCESPC7Z"}"#,
        br#"{"product_ids":[1]}"#,
        br#"{"product_ids":[null]}"#,
        br#"{"user_id":null}"#,
        br#"{"user_id":"a","user_id":"b"}"#,
    ] {
        p.refused("recommendation", input);
    }
}

/// Which service each instance of `chain` serves, and in what language (by its command
/// line): service -> (language, pid).
fn who_serves(chain: &ChainProcess) -> BTreeMap<String, (&'static str, u32)> {
    let mut out = BTreeMap::new();
    for pid in instances(chain.pid()) {
        let Ok(raw) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue; // gone meanwhile
        };
        let argv: Vec<String> = raw
            .split(|&b| b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let arg = |i: usize| argv.get(i).map_or("", String::as_str);
        let (service, language) = if arg(0).ends_with("/boutique-fn") {
            (arg(1).to_owned(), "Rust")
        } else if arg(0).ends_with("/boutique-shipping") {
            ("shipping".to_owned(), "Go")
        } else if arg(0) == "/usr/bin/python3" && arg(1) == "-m" && arg(2) == "zerohop" {
            let handler = argv.last().unwrap();
            let module = handler
                .strip_prefix("polyglot.")
                .and_then(|h| h.strip_suffix(":handle"));
            (module.unwrap_or(handler).to_owned(), "Python")
        } else if arg(0).ends_with("node")
            && argv
                .iter()
                .any(|a| a.ends_with("/apps/boutique/polyglot/currency.js"))
        {
            ("currency".to_owned(), "Node.js")
        } else {
            (format!("pid {pid}: {argv:?}"), "unknown")
        };
        out.insert(service, (language, pid));
    }
    out
}

/// The ports run in the polyglot chain, and only there; every instance's pid, Rust chain's
/// first.
fn ports_run(p: &Pair) -> Vec<BTreeMap<String, (&'static str, u32)>> {
    let rust: BTreeMap<String, &str> = Service::ALL
        .iter()
        .map(|s| (s.name().to_owned(), "Rust"))
        .collect();
    let mut poly = rust.clone();
    for (service, language) in PORTS {
        poly.insert(service.to_owned(), language);
    }
    let mut pids = Vec::new();
    for (chain, expected, name) in [(&p.rust, &rust, "Rust"), (&p.poly, &poly, "polyglot")] {
        let mut seen = BTreeMap::new();
        let complete = wait_until(WAIT, || {
            seen = who_serves(chain);
            seen.iter()
                .map(|(s, (l, _))| (s.clone(), *l))
                .eq(expected.clone())
        });
        assert!(
            complete,
            "{name} chain: instances {seen:?}, expected {expected:?}"
        );
        pids.push(seen);
    }
    pids
}

#[test]
fn ported_services_answer_as_the_rust_ones() {
    let pair = Pair {
        poly: start_polyglot(),
        rust: start_rust(),
        http: harness::http_agent(),
    };
    let started = ports_run(&pair);
    same_pages(&pair);
    same_currency(&pair);
    same_email(&pair);
    same_shipping(&pair);
    same_recommendation(&pair);
    let report = harness::run_load(&pair.poly.url, 3);
    eprintln!(
        "polyglot chain under boutique-load (2 s, 4 users): {} requests, {:.0}/s",
        report.requests, report.rps
    );
    assert_eq!(ports_run(&pair), started, "no instance died on the way");
    let Pair { rust, poly, .. } = pair;
    assert_eq!(poly.stop(), Some(0), "the polyglot chain stops cleanly");
    assert_eq!(rust.stop(), Some(0), "the Rust chain stops cleanly");
}
