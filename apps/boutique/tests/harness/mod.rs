//! What the boutique's end-to-end tests (`smoke.rs`, `polyglot.rs`, `locust.rs`) share: the
//! app's chain specs made runnable from a test, the HTTP deployment, a user's HTTP request
//! (its cookies, a form body), the forms, and a short `boutique-load` run whose report is
//! checked.
//!
//! Each test binary compiles this module and uses a part of it.
#![allow(dead_code)]

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use zerohop_app_boutique::load::report::Report;
use zerohop_app_boutique::services::frontend::form::encode_checkout;
use zerohop_app_boutique::services::frontend::{self, CheckoutForm};
use zerohop_app_boutique::services::payment;
use zerohop_test_support::{ChildGuard, ChildLines};

/// Longest wait for anything to start or stop.
pub const WAIT: Duration = Duration::from_secs(30);

/// A product of the catalog, 67.99 USD.
pub const TYPEWRITER: &str = "OLJCESPC7Z";
/// A product of the catalog, 124.00 USD.
pub const BARISTA_KIT: &str = "1YMWWN1N4O";
/// A card number that passes the Luhn check.
pub const GOOD_CARD: &str = "4432-8015-6152-0454";
/// A card number that fails it.
pub const BAD_CARD: &str = "4432-8015-6152-0455";

/// The app's spec `file` with the function program's real path (the build's target folder
/// need not be `../../target`), which the spec must name `functions` times.
pub fn chain_spec(file: &str, functions: usize) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(file);
    let spec = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {file}: {e}"));
    let program = "../../target/release/boutique-fn";
    assert_eq!(
        spec.matches(program).count(),
        functions,
        "{file}: functions run by boutique-fn"
    );
    spec.replace(program, env!("CARGO_BIN_EXE_boutique-fn"))
}

/// `boutique-http` and the frontend's URL; killed (and its services with it) on drop.
pub struct HttpDeployment {
    /// The supervisor.
    pub guard: ChildGuard,
    /// Base URL of the frontend.
    pub url: String,
}

/// Starts `boutique-http` on a free port; waits (bounded) for the frontend's URL.
pub fn start_http() -> HttpDeployment {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_boutique-http"));
    cmd.stdin(Stdio::null()).stdout(Stdio::piped());
    let mut guard = ChildGuard::new(cmd.spawn().expect("spawn boutique-http"));
    let lines = ChildLines::new(&mut guard);
    let url = lines.wait_for("boutique-http", "boutique-http: frontend at ", WAIT);
    assert!(url.starts_with("http://127.0.0.1:"), "{url}");
    HttpDeployment { guard, url }
}

/// An HTTP client that gives up on an answer after 10 s and follows no redirect (the tests
/// check them).
pub fn http_agent() -> ureq::Agent {
    ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(10))
        .redirects(0)
        .build()
}

/// Who asks: the cookies sent (`shop_session-id`, `shop_currency`), if any.
#[derive(Clone, Copy)]
pub struct User<'a> {
    /// The session cookie.
    pub session: Option<&'a str>,
    /// The currency cookie.
    pub currency: Option<&'a str>,
}

impl User<'_> {
    /// The `Cookie` header of this user, if it has cookies.
    pub fn cookie(&self) -> Option<String> {
        let jar: Vec<String> = [
            (frontend::SESSION_COOKIE, self.session),
            (frontend::CURRENCY_COOKIE, self.currency),
        ]
        .into_iter()
        .filter_map(|(name, value)| Some(format!("{name}={}", value?)))
        .collect();
        (!jar.is_empty()).then(|| jar.join("; "))
    }
}

/// An answer: status, the headers the tests look at, body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    /// Status.
    pub status: u16,
    /// `Location`.
    pub location: Option<String>,
    /// Every `Set-Cookie`.
    pub set_cookies: Vec<String>,
    /// `Content-Type`.
    pub content_type: Option<String>,
    /// Body.
    pub body: Vec<u8>,
}

impl Reply {
    /// The body as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// The answer to `METHOD path` at `url`, sent by `who` with `Accept: application/json`
/// (HTML when `json` is false) and `body` as a form; an error status is an answer.
pub fn send_as(
    agent: &ureq::Agent,
    url: &str,
    method: &str,
    path: &str,
    who: User<'_>,
    body: &[u8],
    json: bool,
) -> Reply {
    let mut req = agent.request(method, &format!("{url}{path}"));
    if let Some(c) = who.cookie() {
        req = req.set("Cookie", &c);
    }
    if json {
        req = req.set("Accept", frontend::JSON);
    }
    if method == "POST" {
        req = req.set("Content-Type", "application/x-www-form-urlencoded");
    }
    let resp = match req.send_bytes(body) {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("{method} {path} to {url}: {e}"),
    };
    let set_cookies = resp
        .all("set-cookie")
        .into_iter()
        .map(str::to_owned)
        .collect();
    let mut reply = Reply {
        status: resp.status(),
        location: resp.header("location").map(str::to_owned),
        set_cookies,
        content_type: resp.header("content-type").map(str::to_owned),
        body: Vec::new(),
    };
    std::io::Read::read_to_end(&mut resp.into_reader(), &mut reply.body).expect("read the body");
    reply
}

/// [`send_as`] asking for JSON.
pub fn send(
    agent: &ureq::Agent,
    url: &str,
    method: &str,
    path: &str,
    who: User<'_>,
    body: &[u8],
) -> Reply {
    send_as(agent, url, method, path, who, body, true)
}

/// The form of `POST /cart`.
pub fn add_form(product: &str, quantity: i64) -> Vec<u8> {
    form_urlencoded::Serializer::new(String::new())
        .append_pair("product_id", product)
        .append_pair("quantity", &quantity.to_string())
        .finish()
        .into_bytes()
}

/// The form of `POST /cart/checkout`: an address in Mountain View, a card valid until next
/// year.
pub fn checkout_form(email: &str, street: &str, card: &str) -> Vec<u8> {
    encode_checkout(&CheckoutForm {
        email: email.into(),
        street_address: street.into(),
        zip_code: "94043".into(),
        city: "Mountain View".into(),
        state: "CA".into(),
        country: "United States".into(),
        credit_card_number: card.into(),
        credit_card_expiration_month: 1,
        credit_card_expiration_year: payment::current_year_month().0 + 1,
        credit_card_cvv: "672".into(),
    })
    .into_bytes()
}

/// `boutique-load` on `url` for 2 s with 4 users (`--seed seed`), every answer checked
/// there: its report, which must count requests and no error.
pub fn run_load(url: &str, seed: u64) -> Report {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_boutique-load"));
    cmd.args(["--url", url, "--duration", "2s", "--concurrency", "4"])
        .args(["--seed", &seed.to_string(), "--json"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped());
    let mut guard = ChildGuard::new(cmd.spawn().expect("spawn boutique-load"));
    let lines = ChildLines::new(&mut guard);
    let line = lines
        .next_line(WAIT)
        .expect("boutique-load printed its report");
    let code = guard.wait_timeout(WAIT);
    let report: Report = serde_json::from_str(&line).expect("the report is JSON");
    assert_eq!(report.errors, 0, "errors: {:?}", report.error_samples);
    assert!(report.requests > 0, "no request made: {line}");
    assert_eq!(code, Some(0), "boutique-load failed: {line}");
    report
}
