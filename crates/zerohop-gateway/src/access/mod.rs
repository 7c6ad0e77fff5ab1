//! Who may use a route, and how often: `auth` (JSON Web Tokens or API keys) and
//! `rate_limit` (token buckets), checked before the request's body is read, so a refused
//! request costs no body, no slot and no function.
//!
//! | answer | when |
//! |---|---|
//! | 401 + `WWW-Authenticate` | no credentials, or invalid ones (bad signature, expired, wrong issuer or audience, unknown key) |
//! | 403 + `WWW-Authenticate` | a valid token without the scopes the route needs |
//! | 429 + `Retry-After` | the route's (or this client's) bucket is empty |
//!
//! The client a per-client limit counts is the authenticated name (the token's `sub`, the
//! API key's name), else the connection's address.

mod file;
mod jwt;
mod keys;
mod limit;

use std::net::IpAddr;

use http::{header, HeaderMap, StatusCode};
use zerohop_spec::{AuthSpec, RouteSpec};

use self::file::Watched;
use self::jwt::{JwtCheck, Refusal};
use self::keys::Keys;
use self::limit::Limiter;
use crate::{ErrorSource, GatewayError};

#[doc(hidden)]
pub use self::jwt::fuzz as fuzz_jwt;
pub(crate) use self::jwt::Claims;

/// A route's access could not be set up: a file or URL that cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("routes[{route}].{field}: {message}")]
pub struct AccessError {
    /// The route's index in the spec.
    pub route: usize,
    /// The field at fault (`auth.jwt.jwks`, `auth.api_keys`).
    pub field: &'static str,
    /// What is wrong, naming the file or URL.
    pub message: String,
}

/// The access rules of a chain's routes, shared by its gateway threads (buckets count for
/// all of them).
#[derive(Default)]
pub struct Access {
    routes: Vec<Option<RouteAccess>>,
    /// Per route, [`Access::describe`]'s words.
    described: Vec<Vec<String>>,
}

impl std::fmt::Debug for Access {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let guarded = self.routes.iter().filter(|r| r.is_some()).count();
        write!(f, "Access({guarded} routes guarded)")
    }
}

struct RouteAccess {
    auth: Option<Auth>,
    limit: Option<Limiter>,
}

enum Auth {
    Jwt(JwtCheck),
    Keys {
        keys: Watched<Keys>,
        header: header::HeaderName,
    },
}

/// Who a request comes from, once admitted.
#[derive(Default)]
pub(crate) struct Admitted {
    /// The authenticated client's name (a token's `sub`, an API key's name).
    pub client: Option<String>,
    /// A token's claims.
    pub claims: Option<Claims>,
}

impl Access {
    /// The rules of `routes` (the spec's, in order): reads every key file and fetches every
    /// JWKS URL now.
    pub fn new(routes: &[RouteSpec]) -> Result<Self, AccessError> {
        let mut out = Vec::new();
        let mut described = Vec::new();
        for (i, r) in routes.iter().enumerate() {
            let mut words = Vec::new();
            match &r.auth {
                Some(AuthSpec::Jwt(j)) => words.push(match &j.jwks {
                    zerohop_spec::JwksSource::File(f) => format!("jwt ({})", f.display()),
                    zerohop_spec::JwksSource::Url(u) => format!("jwt ({u})"),
                }),
                Some(AuthSpec::ApiKeys { file, header }) => {
                    words.push(format!("api keys ({}, in {header})", file.display()))
                }
                None => {}
            }
            if let Some(l) = &r.rate_limit {
                words.push(format!(
                    "rate {} per {:?}, burst {}{}",
                    l.requests,
                    l.per,
                    l.burst,
                    if l.per_client { ", per client" } else { "" }
                ));
            }
            described.push(words);
            let auth = match &r.auth {
                None => None,
                Some(AuthSpec::Jwt(spec)) => {
                    Some(Auth::Jwt(JwtCheck::new(spec).map_err(|message| {
                        AccessError {
                            route: i,
                            field: "auth.jwt.jwks",
                            message,
                        }
                    })?))
                }
                Some(AuthSpec::ApiKeys { file, header }) => Some(Auth::Keys {
                    keys: Watched::open(file, Keys::parse).map_err(|message| AccessError {
                        route: i,
                        field: "auth.api_keys",
                        message,
                    })?,
                    header: header::HeaderName::from_bytes(header.as_bytes()).map_err(|_| {
                        AccessError {
                            route: i,
                            field: "auth.header",
                            message: format!("`{header}` is not a header name"),
                        }
                    })?,
                }),
            };
            let limit = r.rate_limit.as_ref().map(Limiter::new);
            out.push((auth.is_some() || limit.is_some()).then_some(RouteAccess { auth, limit }));
        }
        Ok(Self {
            routes: out,
            described,
        })
    }

    /// What guards `route`, in words for `zerohop status`: `jwt (FILE)`, `api keys (FILE)`,
    /// `rate 100 per 1s, burst 200, per client`.
    pub fn describe(&self, route: usize) -> Vec<String> {
        self.described.get(route).cloned().unwrap_or_default()
    }

    /// Admits a request of `route` with `headers` from `peer`, or answers it (401, 403,
    /// 429). `realm` names the chain in `WWW-Authenticate`.
    pub(crate) fn admit(
        &self,
        route: u16,
        headers: &HeaderMap,
        peer: Option<IpAddr>,
        realm: &str,
    ) -> Result<Admitted, GatewayError> {
        let Some(Some(rules)) = self.routes.get(route as usize) else {
            return Ok(Admitted::default());
        };
        let admitted = match &rules.auth {
            None => Admitted::default(),
            Some(Auth::Jwt(check)) => {
                let token = headers
                    .get(header::AUTHORIZATION)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| {
                        let (scheme, rest) = v.split_once(' ')?;
                        scheme.eq_ignore_ascii_case("bearer").then(|| rest.trim())
                    });
                let Some(token) = token else {
                    return Err(unauthorized(
                        "this route needs `Authorization: Bearer TOKEN`",
                        format!("Bearer realm=\"{realm}\""),
                    ));
                };
                match check.check(token) {
                    Ok(claims) => Admitted {
                        client: claims
                            .get("sub")
                            .and_then(|s| s.as_str())
                            .map(str::to_owned),
                        claims: Some(claims),
                    },
                    Err(Refusal::Invalid(why)) => {
                        return Err(unauthorized(
                            format!("invalid token: {why}"),
                            format!(
                                "Bearer realm=\"{realm}\", error=\"invalid_token\", \
                                 error_description=\"{}\"",
                                quoted(&why)
                            ),
                        ))
                    }
                    Err(Refusal::Scope(why)) => {
                        return Err(GatewayError::new(
                            StatusCode::FORBIDDEN,
                            ErrorSource::Gateway,
                            why,
                        )
                        .with_header(
                            header::WWW_AUTHENTICATE,
                            format!(
                                "Bearer realm=\"{realm}\", error=\"insufficient_scope\", \
                                 scope=\"{}\"",
                                check.scopes().join(" ")
                            ),
                        ))
                    }
                }
            }
            Some(Auth::Keys { keys, header }) => {
                let challenge = format!("ApiKey realm=\"{realm}\", header=\"{header}\"");
                let Some(key) = headers.get(header) else {
                    return Err(unauthorized(
                        format!("this route needs an API key in `{header}`"),
                        challenge,
                    ));
                };
                match keys.get().name(key.as_bytes()) {
                    Some(name) => Admitted {
                        client: Some(name.to_owned()),
                        claims: None,
                    },
                    None => {
                        return Err(unauthorized(
                            format!("the API key in `{header}` is not known"),
                            challenge,
                        ))
                    }
                }
            }
        };
        if let Some(limit) = &rules.limit {
            let client = match (&admitted.client, peer) {
                (Some(c), _) => c.clone(),
                (None, Some(ip)) => ip.to_string(),
                (None, None) => String::new(),
            };
            if let Err(wait) = limit.admit(&client) {
                let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
                return Err(GatewayError::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    ErrorSource::Gateway,
                    format!("over the route's rate limit; retry in {secs} s"),
                )
                .with_header(header::RETRY_AFTER, secs.max(1).to_string()));
            }
        }
        Ok(admitted)
    }
}

fn unauthorized(message: impl Into<String>, challenge: String) -> GatewayError {
    GatewayError::new(StatusCode::UNAUTHORIZED, ErrorSource::Gateway, message)
        .with_header(header::WWW_AUTHENTICATE, challenge)
}

/// `s` fit for a quoted-string of a header: no quotes, backslashes or control characters.
fn quoted(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c == '"' || c == '\\' || c.is_control() {
                '\''
            } else {
                c
            }
        })
        .take(200)
        .collect()
}
