//! Authentication and rate limits at the gateway, as a user configures them: a JWKS file and
//! Ed25519-signed tokens, an API key file changed while the chain runs, a token bucket; driven
//! with curl, answers and `WWW-Authenticate`/`Retry-After` checked.

mod common;

use std::time::Duration;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use common::curl::curl;
use common::func;
use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use ring::rand::SystemRandom;
use ring::signature::{Ed25519KeyPair, KeyPair};
use serde_json::{json, Value};
use zerohop_test_support::{ChainProcess, TempDir};

/// An Ed25519 key: its public JWK, and tokens signed with it.
struct Issuer {
    kid: &'static str,
    key: EncodingKey,
    jwk: Value,
}

impl Issuer {
    fn new(kid: &'static str) -> Self {
        let pkcs8 = Ed25519KeyPair::generate_pkcs8(&SystemRandom::new()).unwrap();
        let pair = Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).unwrap();
        Self {
            kid,
            key: EncodingKey::from_ed_der(pkcs8.as_ref()),
            jwk: json!({"kty": "OKP", "crv": "Ed25519", "kid": kid,
                "x": URL_SAFE_NO_PAD.encode(pair.public_key().as_ref())}),
        }
    }

    /// A token for `sub` expiring `exp_in` seconds from now (negative: in the past).
    fn token(&self, sub: &str, exp_in: i64, scope: &str) -> String {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        let mut h = Header::new(Algorithm::EdDSA);
        h.kid = Some(self.kid.into());
        let claims = json!({"sub": sub, "iss": "https://id.test", "aud": "shop",
            "exp": now + exp_in, "email": format!("{sub}@shop.test"), "scope": scope});
        encode(&h, &claims, &self.key).unwrap()
    }
}

const KEY_A: &str = "alice-0123456789abcdef";
const KEY_B: &str = "bob-fedcba9876543210xyz";

fn chain(dir: &TempDir, issuer: &Issuer) -> ChainProcess {
    std::fs::write(
        dir.path().join("jwks.json"),
        json!({"keys": [issuer.jwk]}).to_string(),
    )
    .unwrap();
    std::fs::write(dir.path().join("keys.txt"), format!("alice {KEY_A}\n")).unwrap();
    let spec = format!(
        "name: access\nfunctions:\n{}{}routes:\n  \
         - http: GET /me\n    sequence: [who]\n    \
           auth: {{ jwt: {{ jwks: jwks.json, issuer: https://id.test, audience: shop }} }}\n  \
         - http: GET /admin\n    sequence: [who]\n    \
           auth: {{ jwt: {{ jwks: jwks.json, scopes: [admin] }} }}\n  \
         - http: GET /keyed\n    sequence: [client]\n    auth: {{ api_keys: keys.txt }}\n  \
         - http: GET /limited\n    sequence: [client]\n    \
           rate_limit: {{ requests: 2, per: 1h, burst: 2 }}\n",
        func(
            "who",
            "header",
            "TESTFN_HEADER: \":claim.email\"",
            ", headers: [\":claim.email\"]"
        ),
        func(
            "client",
            "header",
            "TESTFN_HEADER: \":client\"",
            ", headers: [\":client\"]"
        ),
    );
    let file = dir.path().join("chain.yaml");
    std::fs::write(&file, spec).unwrap();
    ChainProcess::start_file(&file, &[], TempDir::new("access-run"))
}

#[test]
fn tokens_reach_functions_as_claims_and_bad_ones_get_401_or_403() {
    let dir = TempDir::new("access");
    let issuer = Issuer::new("k1");
    let chain = chain(&dir, &issuer);
    let me = format!("{}/me", chain.url);
    let bearer = |t: &str| format!("Authorization: Bearer {t}");

    let a = curl(&[&me]);
    assert_eq!(a.status, 401, "{}", a.body);
    assert_eq!(a.header("www-authenticate"), ["Bearer realm=\"access\""]);

    let a = curl(&["-H", &bearer(&issuer.token("alice", 300, "")), &me]);
    assert_eq!((a.status, a.body.as_str()), (200, "alice@shop.test"));

    for (token, why) in [
        (issuer.token("alice", -600, ""), "Expired"),
        (
            Issuer::new("k1").token("mallory", 300, ""),
            "InvalidSignature",
        ),
        (
            Issuer::new("k9").token("mallory", 300, ""),
            "no EdDSA key with kid `k9`",
        ),
        (
            format!(
                "{}.{}.",
                URL_SAFE_NO_PAD.encode(br#"{"alg":"none"}"#),
                URL_SAFE_NO_PAD.encode(br#"{"sub":"mallory","exp":9999999999}"#)
            ),
            "malformed",
        ),
    ] {
        let a = curl(&["-H", &bearer(&token), &me]);
        assert_eq!(a.status, 401, "{why}: {}", a.body);
        assert!(a.body.contains(why), "wanted {why}: {}", a.body);
        let challenge = a.header("www-authenticate").join(",");
        assert!(challenge.contains("error=\"invalid_token\""), "{challenge}");
    }

    let admin = format!("{}/admin", chain.url);
    let a = curl(&["-H", &bearer(&issuer.token("alice", 300, "read")), &admin]);
    assert_eq!(a.status, 403, "{}", a.body);
    assert!(a
        .header("www-authenticate")
        .join(",")
        .contains("insufficient_scope"));
    let a = curl(&[
        "-H",
        &bearer(&issuer.token("root", 300, "read admin")),
        &admin,
    ]);
    assert_eq!((a.status, a.body.as_str()), (200, "root@shop.test"));
    assert_eq!(chain.stop(), Some(0));
}

#[test]
fn api_keys_name_the_client_and_a_changed_key_file_is_read_again() {
    let dir = TempDir::new("access");
    let chain = chain(&dir, &Issuer::new("k1"));
    let keyed = format!("{}/keyed", chain.url);
    let a = curl(&[&keyed]);
    assert_eq!(a.status, 401, "{}", a.body);
    assert!(a.header("www-authenticate")[0].contains("header=\"x-api-key\""));
    let a = curl(&["-H", &format!("X-API-Key: {KEY_A}"), &keyed]);
    assert_eq!((a.status, a.body.as_str()), (200, "alice"));
    let a = curl(&["-H", &format!("X-API-Key: {KEY_B}"), &keyed]);
    assert_eq!(a.status, 401, "{}", a.body);

    // Bob's key is added while the chain runs; the file is looked at once a second.
    std::fs::write(
        dir.path().join("keys.txt"),
        format!("alice {KEY_A}\nbob {KEY_B}\n"),
    )
    .unwrap();
    let mut status = 0;
    for _ in 0..50 {
        let a = curl(&["-H", &format!("X-API-Key: {KEY_B}"), &keyed]);
        status = a.status;
        if status == 200 {
            assert_eq!(a.body, "bob");
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(status, 200, "bob's key was never accepted");
    // A broken file keeps the keys read before.
    std::fs::write(dir.path().join("keys.txt"), "garbage\n").unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    let a = curl(&["-H", &format!("X-API-Key: {KEY_A}"), &keyed]);
    assert_eq!((a.status, a.body.as_str()), (200, "alice"));
    assert_eq!(chain.stop(), Some(0));
}

#[test]
fn a_route_over_its_rate_gets_429_with_retry_after() {
    let dir = TempDir::new("access");
    let chain = chain(&dir, &Issuer::new("k1"));
    let limited = format!("{}/limited", chain.url);
    for _ in 0..2 {
        assert_eq!(curl(&[&limited]).status, 200);
    }
    let a = curl(&[&limited]);
    assert_eq!(a.status, 429, "{}", a.body);
    let retry: u64 = a.header("retry-after")[0].parse().unwrap();
    assert!(
        (1700..=1800).contains(&retry),
        "half an hour to the next token: {retry}"
    );
    assert_eq!(chain.stop(), Some(0));
}

#[test]
fn a_key_file_that_cannot_be_read_stops_the_start_naming_the_route() {
    let dir = TempDir::new("access");
    let file = dir.path().join("chain.yaml");
    std::fs::write(
        &file,
        format!(
            "name: access\nfunctions:\n{}routes:\n  - http: GET /keyed\n    sequence: [client]\n    auth: {{ api_keys: missing.txt }}\n",
            func("client", "header", "", "")
        ),
    )
    .unwrap();
    let out = std::process::Command::new(zerohop_test_support::target_bin("zerohop"))
        .arg("up")
        .arg(&file)
        .args(["--listen", "127.0.0.1:0"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("chain.yaml:5: routes[0].auth.api_keys:") && err.contains("missing.txt"),
        "{err}"
    );
}

#[test]
fn zerohop_status_shows_what_guards_each_route() {
    let d = common::daemon::Daemon::start();
    std::fs::write(d.dir().join("keys.txt"), format!("alice {KEY_A}\n")).unwrap();
    let spec = format!(
        "name: guarded\nfunctions:\n{}routes:\n  \
         - http: GET /keyed\n    sequence: [client]\n    content_type: text/plain\n    \
           auth: {{ api_keys: keys.txt }}\n    \
           rate_limit: {{ requests: 10, per: 1m, burst: 5, per_client: true }}\n",
        func(
            "client",
            "header",
            "TESTFN_HEADER: \":client\"",
            ", headers: [\":client\"]"
        )
    );
    d.apply("guarded", &spec);
    let status = d.status("guarded");
    let guards: Vec<&str> = status["routes"][0]["guards"]
        .as_array()
        .expect("guards listed")
        .iter()
        .map(|g| g.as_str().unwrap())
        .collect();
    assert_eq!(guards.len(), 3, "{guards:?}");
    assert!(guards[0].starts_with("api keys (") && guards[0].ends_with("keys.txt, in x-api-key)"));
    assert_eq!(guards[1], "rate 10 per 60s, burst 5, per client");
    assert_eq!(guards[2], "content type text/plain");
    let text = d.cli(&["status", "guarded"]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("GET /keyed -> client") && text.contains("(api keys ("),
        "{text}"
    );
    d.stop_cleanly();
}
