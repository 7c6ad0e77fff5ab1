//! JSON Web Tokens: `Authorization: Bearer TOKEN`, signed with RS256, ES256 or EdDSA by a key
//! of a JWKS (a file read again when it changes, or a URL fetched again every few minutes),
//! with the issuer, audience, expiry (a small leeway) and scopes a route asks for.
//!
//! Bounded work per request: a token over [`MAX_TOKEN`] bytes is refused before it is
//! decoded; a token names its key (`kid`), or at most [`MAX_TRIES`] keys of its algorithm's
//! family are tried; a JWKS holds at most [`MAX_KEYS`] keys and 1 MiB. Shared secrets (HS*)
//! and `alg: none` are never accepted: the algorithms come from the spec, never the token.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use jsonwebtoken::jwk::{AlgorithmParameters, JwkSet};
use jsonwebtoken::{decode, decode_header, Algorithm, DecodingKey, Validation};
use serde_json::{Map, Value};
use zerohop_spec::{JwksSource, JwtSpec};

use super::file::{Watched, MAX_FILE};

/// Longest token accepted.
pub(crate) const MAX_TOKEN: usize = 8 * 1024;
/// Most keys a JWKS may hold.
pub(crate) const MAX_KEYS: usize = 64;
/// Most keys tried for a token without a `kid`.
pub(crate) const MAX_TRIES: usize = 4;
/// How often a JWKS URL is fetched again.
const REFRESH: Duration = Duration::from_secs(300);
/// How long one fetch may take.
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);

/// A token's claims.
pub(crate) type Claims = Map<String, Value>;

/// Why a token was refused: 401 (`invalid_token`) or 403 (`insufficient_scope`).
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// No token, a malformed one, a bad signature, expired, wrong issuer or audience.
    Invalid(String),
    /// A valid token without the scopes the route needs.
    Scope(String),
}

/// One usable key of a JWKS.
struct Key {
    kid: Option<String>,
    family: Family,
    key: DecodingKey,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Family {
    Rsa,
    Ec,
    Ed,
}

fn family(alg: Algorithm) -> Option<Family> {
    match alg {
        Algorithm::RS256 => Some(Family::Rsa),
        Algorithm::ES256 => Some(Family::Ec),
        Algorithm::EdDSA => Some(Family::Ed),
        _ => None,
    }
}

/// The usable keys of a JWKS.
pub(crate) struct Jwks {
    keys: Vec<Key>,
}

impl Jwks {
    /// Parses a JWKS document: every key must be an RSA, EC or OKP public key.
    pub(crate) fn parse(bytes: &[u8]) -> Result<Self, String> {
        let set: JwkSet = serde_json::from_slice(bytes)
            .map_err(|e| format!("not a JWKS (JSON Web Key Set): {e}"))?;
        if set.keys.len() > MAX_KEYS {
            return Err(format!("{} keys, more than {MAX_KEYS}", set.keys.len()));
        }
        let mut keys = Vec::new();
        for (i, jwk) in set.keys.iter().enumerate() {
            let family = match &jwk.algorithm {
                AlgorithmParameters::RSA(_) => Family::Rsa,
                AlgorithmParameters::EllipticCurve(_) => Family::Ec,
                AlgorithmParameters::OctetKeyPair(_) => Family::Ed,
                AlgorithmParameters::OctetKey(_) => {
                    return Err(format!(
                        "keys[{i}] is a shared secret (kty oct); only public keys (RSA, EC, OKP) \
                         are accepted"
                    ))
                }
            };
            let key = DecodingKey::from_jwk(jwk).map_err(|e| format!("keys[{i}]: {e}"))?;
            keys.push(Key {
                kid: jwk.common.key_id.clone(),
                family,
                key,
            });
        }
        if keys.is_empty() {
            return Err("no key in it".into());
        }
        Ok(Self { keys })
    }
}

/// Where the keys come from, kept current.
enum Source {
    File(Watched<Jwks>),
    Url(Arc<RwLock<Arc<Jwks>>>),
}

/// A route's JWT check.
pub(crate) struct JwtCheck {
    source: Source,
    spec: JwtSpec,
    algorithms: Vec<Algorithm>,
}

impl JwtCheck {
    /// Loads the keys now (a URL is fetched once here, then every few minutes by a thread of
    /// its own); the error names the file or URL and what is wrong.
    pub(crate) fn new(spec: &JwtSpec) -> Result<Self, String> {
        let source = match &spec.jwks {
            JwksSource::File(path) => Source::File(Watched::open(path, Jwks::parse)?),
            JwksSource::Url(url) => {
                let keys = Arc::new(RwLock::new(Arc::new(fetch(url)?)));
                let (from, shared) = (url.clone(), Arc::downgrade(&keys));
                std::thread::Builder::new()
                    .name("zh-jwks".into())
                    .spawn(move || loop {
                        std::thread::sleep(REFRESH);
                        // The check is gone (the chain stopped): so is this thread.
                        let Some(keys) = shared.upgrade() else { return };
                        match fetch(&from) {
                            Ok(k) => *keys.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(k),
                            Err(why) => tracing::warn!("gateway: kept the previous keys: {why}"),
                        }
                    })
                    .map_err(|e| format!("could not start the thread that fetches {url}: {e}"))?;
                Source::Url(keys)
            }
        };
        let algorithms = spec
            .algorithms
            .iter()
            .map(|a| match a.as_str() {
                "RS256" => Ok(Algorithm::RS256),
                "ES256" => Ok(Algorithm::ES256),
                "EdDSA" => Ok(Algorithm::EdDSA),
                other => Err(format!("algorithm `{other}` is not verified here")),
            })
            .collect::<Result<_, _>>()?;
        Ok(Self {
            source,
            spec: spec.clone(),
            algorithms,
        })
    }

    fn keys(&self) -> Arc<Jwks> {
        match &self.source {
            Source::File(w) => w.get(),
            Source::Url(k) => k.read().unwrap_or_else(|p| p.into_inner()).clone(),
        }
    }

    /// Checks `token`; its claims when it passes.
    pub(crate) fn check(&self, token: &str) -> Result<Claims, Refusal> {
        let invalid = |why: String| Refusal::Invalid(why);
        if token.len() > MAX_TOKEN {
            return Err(invalid(format!(
                "the token is longer than {MAX_TOKEN} bytes"
            )));
        }
        let header = decode_header(token).map_err(|e| invalid(format!("malformed token: {e}")))?;
        if !self.algorithms.contains(&header.alg) {
            return Err(invalid(format!(
                "tokens signed with {:?} are not accepted here",
                header.alg
            )));
        }
        let fam = family(header.alg).ok_or_else(|| invalid("unsupported algorithm".into()))?;
        let keys = self.keys();
        let candidates: Vec<&Key> = match &header.kid {
            Some(kid) => keys
                .keys
                .iter()
                .filter(|k| k.kid.as_deref() == Some(kid.as_str()) && k.family == fam)
                .take(1)
                .collect(),
            None => keys
                .keys
                .iter()
                .filter(|k| k.family == fam)
                .take(MAX_TRIES)
                .collect(),
        };
        if candidates.is_empty() {
            return Err(invalid(match &header.kid {
                Some(kid) => format!("no {:?} key with kid `{kid}`", header.alg),
                None => format!("no {:?} key", header.alg),
            }));
        }
        let mut v = Validation::new(header.alg);
        v.leeway = self.spec.leeway.as_secs();
        v.validate_nbf = true;
        v.set_required_spec_claims(&["exp"]);
        if let Some(iss) = &self.spec.issuer {
            v.set_issuer(&[iss]);
        }
        match &self.spec.audience {
            Some(aud) => v.set_audience(&[aud]),
            None => v.validate_aud = false,
        }
        let mut last = String::new();
        for k in candidates {
            match decode::<Claims>(token, &k.key, &v) {
                Ok(data) => return self.scoped(data.claims),
                Err(e) => last = e.to_string(),
            }
        }
        Err(invalid(last))
    }

    /// `claims` if they hold every scope the route needs (the `scope` claim, space-separated).
    fn scoped(&self, claims: Claims) -> Result<Claims, Refusal> {
        if self.spec.scopes.is_empty() {
            return Ok(claims);
        }
        let held: Vec<&str> = claims
            .get("scope")
            .and_then(Value::as_str)
            .map(|s| s.split(' ').collect())
            .unwrap_or_default();
        let missing: Vec<&str> = self
            .spec
            .scopes
            .iter()
            .map(String::as_str)
            .filter(|s| !held.contains(s))
            .collect();
        if missing.is_empty() {
            Ok(claims)
        } else {
            Err(Refusal::Scope(format!(
                "the token lacks the scope {}",
                missing.join(" ")
            )))
        }
    }

    /// The scopes the route needs (for `WWW-Authenticate`).
    pub(crate) fn scopes(&self) -> &[String] {
        &self.spec.scopes
    }
}

/// What the `jwt` fuzz target drives: bytes as a JWKS document (first byte odd) or as a
/// token checked against a fixed key set (even). Checked: nothing panics, no token passes
/// (none is signed by the key), and a token over [`MAX_TOKEN`] is refused for its length.
#[doc(hidden)]
pub fn fuzz(data: &[u8]) {
    use std::sync::OnceLock;
    static CHECK: OnceLock<JwtCheck> = OnceLock::new();
    let Some((&first, rest)) = data.split_first() else {
        return;
    };
    if first % 2 == 1 {
        if let Ok(set) = Jwks::parse(rest) {
            assert!(!set.keys.is_empty() && set.keys.len() <= MAX_KEYS);
        }
        return;
    }
    let check = CHECK.get_or_init(|| {
        // 32 bytes as an Ed25519 public key: nobody holds a private key for them.
        let jwks = br#"{"keys":[{"kty":"OKP","crv":"Ed25519","kid":"k","x":"WGZmZmZmZmZmZmZmZmZmZmZmZmZmZmZmZmZmZmZmZmY"}]}"#;
        JwtCheck {
            source: Source::Url(Arc::new(RwLock::new(Arc::new(
                Jwks::parse(jwks).expect("the fixed key set parses"),
            )))),
            spec: JwtSpec {
                jwks: JwksSource::Url(String::new()),
                issuer: None,
                audience: None,
                algorithms: vec!["RS256".into(), "ES256".into(), "EdDSA".into()],
                leeway: Duration::from_secs(60),
                scopes: vec!["s".into()],
            },
            algorithms: vec![Algorithm::RS256, Algorithm::ES256, Algorithm::EdDSA],
        }
    });
    let token = String::from_utf8_lossy(rest);
    match check.check(&token) {
        Ok(_) | Err(Refusal::Scope(_)) => panic!("a token nobody signed passed: {token:?}"),
        Err(Refusal::Invalid(why)) => {
            if token.len() > MAX_TOKEN {
                assert!(why.contains("longer than"), "{why}");
            }
        }
    }
}

/// Fetches and parses a JWKS from `url` (at most 1 MiB, within [`FETCH_TIMEOUT`]).
fn fetch(url: &str) -> Result<Jwks, String> {
    use std::io::Read;
    let answer = ureq::AgentBuilder::new()
        .timeout(FETCH_TIMEOUT)
        .build()
        .get(url)
        .call()
        .map_err(|e| format!("{url}: {e}"))?;
    let mut bytes = Vec::new();
    answer
        .into_reader()
        .take(MAX_FILE + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("{url}: {e}"))?;
    if bytes.len() as u64 > MAX_FILE {
        return Err(format!("{url}: more than {MAX_FILE} bytes"));
    }
    Jwks::parse(&bytes).map_err(|why| format!("{url}: {why}"))
}

#[cfg(test)]
pub(crate) mod tests {
    use std::path::Path;

    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use base64::Engine;
    use jsonwebtoken::{encode, EncodingKey, Header};
    use ring::rand::SystemRandom;
    use ring::signature::{EcdsaKeyPair, Ed25519KeyPair, KeyPair, ECDSA_P256_SHA256_FIXED_SIGNING};
    use serde_json::json;

    use super::*;

    /// A signer and its public JWK.
    pub(crate) struct Signer {
        pub alg: Algorithm,
        pub kid: String,
        pub key: EncodingKey,
        pub jwk: Value,
    }

    impl Signer {
        pub(crate) fn ed(kid: &str) -> Self {
            let pkcs8 = Ed25519KeyPair::generate_pkcs8(&SystemRandom::new()).unwrap();
            let pair = Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).unwrap();
            Self {
                alg: Algorithm::EdDSA,
                kid: kid.into(),
                key: EncodingKey::from_ed_der(pkcs8.as_ref()),
                jwk: json!({"kty": "OKP", "crv": "Ed25519", "kid": kid,
                    "x": URL_SAFE_NO_PAD.encode(pair.public_key().as_ref())}),
            }
        }

        pub(crate) fn es(kid: &str) -> Self {
            let rng = SystemRandom::new();
            let pkcs8 =
                EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
            let pair =
                EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng)
                    .unwrap();
            let point = pair.public_key().as_ref();
            Self {
                alg: Algorithm::ES256,
                kid: kid.into(),
                key: EncodingKey::from_ec_der(pkcs8.as_ref()),
                jwk: json!({"kty": "EC", "crv": "P-256", "kid": kid,
                    "x": URL_SAFE_NO_PAD.encode(&point[1..33]),
                    "y": URL_SAFE_NO_PAD.encode(&point[33..65])}),
            }
        }

        /// A token with `claims`, naming this key.
        pub(crate) fn token(&self, claims: &Value) -> String {
            let mut h = Header::new(self.alg);
            h.kid = Some(self.kid.clone());
            encode(&h, claims, &self.key).unwrap()
        }
    }

    pub(crate) fn now() -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
    }

    fn check(jwks: &Path, scopes: &[&str]) -> JwtCheck {
        JwtCheck::new(&JwtSpec {
            jwks: JwksSource::File(jwks.to_owned()),
            issuer: Some("https://id.example".into()),
            audience: Some("shop".into()),
            algorithms: vec!["RS256".into(), "ES256".into(), "EdDSA".into()],
            leeway: Duration::from_secs(60),
            scopes: scopes.iter().map(|s| s.to_string()).collect(),
        })
        .unwrap()
    }

    #[test]
    fn tokens_are_checked_for_signature_key_issuer_audience_expiry_and_scope() {
        let dir = zerohop_test_support::TempDir::new("jwt");
        let (ed, es, stranger) = (Signer::ed("ed1"), Signer::es("es1"), Signer::ed("ed1"));
        let file = dir.path().join("jwks.json");
        std::fs::write(&file, json!({"keys": [ed.jwk, es.jwk]}).to_string()).unwrap();
        let c = check(&file, &[]);
        let good = |extra: Value| {
            let mut claims = json!({"sub": "alice", "iss": "https://id.example", "aud": "shop",
                "exp": now() + 300, "scope": "read write"});
            for (k, v) in extra.as_object().unwrap() {
                claims[k] = v.clone();
            }
            claims
        };
        let claims = c.check(&ed.token(&good(json!({})))).unwrap();
        assert_eq!(claims["sub"], "alice");
        assert!(c.check(&es.token(&good(json!({})))).is_ok(), "ES256 too");
        // Within the leeway an expired token passes; past it, not.
        assert!(c
            .check(&ed.token(&good(json!({"exp": now() - 30}))))
            .is_ok());
        let refused = |token: String, why: &str| match c.check(&token) {
            Err(Refusal::Invalid(w)) => assert!(w.contains(why), "{w} (wanted {why})"),
            other => panic!("{other:?} (wanted {why})"),
        };
        refused(ed.token(&good(json!({"exp": now() - 120}))), "Expired");
        refused(
            ed.token(&good(json!({"iss": "https://evil.example"}))),
            "Issuer",
        );
        refused(ed.token(&good(json!({"aud": "other"}))), "Audience");
        refused(
            ed.token(&json!({"sub": "a", "iss": "https://id.example", "aud": "shop"})),
            "exp",
        );
        refused(stranger.token(&good(json!({}))), "Signature");
        let mut unknown = Signer::ed("nobody");
        unknown.key = ed.key.clone();
        refused(
            unknown.token(&good(json!({}))),
            "no EdDSA key with kid `nobody`",
        );
        // A shared secret, or none at all: never accepted.
        let hs = encode(
            &Header::new(Algorithm::HS256),
            &good(json!({})),
            &EncodingKey::from_secret(b"s"),
        )
        .unwrap();
        refused(hs, "HS256");
        let none = format!(
            "{}.{}.",
            URL_SAFE_NO_PAD.encode(br#"{"alg":"none","typ":"JWT"}"#),
            URL_SAFE_NO_PAD.encode(good(json!({})).to_string())
        );
        refused(none, "malformed");
        refused("a".repeat(MAX_TOKEN + 1), "longer than");
        refused("not.a.token".into(), "malformed");

        let scoped = check(&file, &["write", "admin"]);
        match scoped.check(&ed.token(&good(json!({})))) {
            Err(Refusal::Scope(w)) => assert!(w.contains("admin"), "{w}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_fuzz_entry_refuses_forged_tokens_and_takes_any_bytes() {
        let signer = Signer::ed("k");
        let forged = signer.token(&json!({"sub": "x", "exp": now() + 60}));
        for input in [
            format!("\0{forged}").into_bytes(),
            b"\0".to_vec(),
            b"\x01{\"keys\":[]}".to_vec(),
            [&b"\0"[..], &vec![b'a'; MAX_TOKEN + 5]].concat(),
            b"\x02\xff\xfe.\x00.".to_vec(),
        ] {
            fuzz(&input);
        }
    }

    #[test]
    fn a_jwks_of_secrets_or_too_many_keys_is_refused() {
        let e = Jwks::parse(br#"{"keys":[{"kty":"oct","k":"c2VjcmV0"}]}"#)
            .err()
            .unwrap();
        assert!(e.contains("shared secret"), "{e}");
        let one = Signer::ed("k").jwk;
        let many = json!({"keys": vec![one; MAX_KEYS + 1]}).to_string();
        assert!(Jwks::parse(many.as_bytes())
            .err()
            .unwrap()
            .contains("more than"));
        assert!(Jwks::parse(b"[1,2]").err().unwrap().contains("not a JWKS"));
        assert!(Jwks::parse(br#"{"keys":[]}"#)
            .err()
            .unwrap()
            .contains("no key"));
    }
}
