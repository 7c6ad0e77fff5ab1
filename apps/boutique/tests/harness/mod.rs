//! What the boutique's end-to-end tests (`smoke.rs`, `polyglot.rs`) share: the app's chain
//! specs made runnable from a test, a user's HTTP request, the checkout form, and a short
//! `boutique-load` run whose report is checked.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use zerohop_app_boutique::load::report::Report;
use zerohop_app_boutique::services::frontend::CheckoutForm;
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

/// An HTTP client that gives up on an answer after 10 s.
pub fn http_agent() -> ureq::Agent {
    ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(10))
        .build()
}

/// Who asks: the session and currency headers, if sent.
#[derive(Clone, Copy)]
pub struct User<'a> {
    /// `X-Session`.
    pub session: Option<&'a str>,
    /// `X-Currency`.
    pub currency: Option<&'a str>,
}

/// Status and body of `METHOD path` at `url`, sent by `who`; an error status is an answer.
pub fn send(
    agent: &ureq::Agent,
    url: &str,
    method: &str,
    path: &str,
    who: User<'_>,
    body: &[u8],
) -> (u16, Vec<u8>) {
    let mut req = agent.request(method, &format!("{url}{path}"));
    if let Some(s) = who.session {
        req = req.set("X-Session", s);
    }
    if let Some(c) = who.currency {
        req = req.set("X-Currency", c);
    }
    let resp = match req.send_bytes(body) {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("{method} {path} to {url}: {e}"),
    };
    let status = resp.status();
    let mut body = Vec::new();
    std::io::Read::read_to_end(&mut resp.into_reader(), &mut body).expect("read the body");
    (status, body)
}

/// The body of `POST /cart/checkout`: an address in Mountain View, a card valid until next
/// year.
pub fn checkout_form(email: &str, street: &str, card: &str) -> Vec<u8> {
    serde_json::to_vec(&CheckoutForm {
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
    .unwrap()
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
