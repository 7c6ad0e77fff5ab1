//! A route's `auth` (JSON Web Tokens or API keys) and `rate_limit` (a token bucket): what the
//! gateway checks before it reads a request's body.

use std::path::Path;
use std::time::Duration;

use saphyr::MarkedYaml;

use crate::functions::absolute;
use crate::routes::http_header_name_invalid;
use crate::yaml::{get, line, Cx};
use crate::*;

/// The JWT signature algorithms the gateway verifies.
pub const JWT_ALGORITHMS: [&str; 3] = ["RS256", "ES256", "EdDSA"];

/// Clock skew allowed on `exp` and `nbf` unless `leeway` says otherwise.
pub const DEFAULT_LEEWAY: Duration = Duration::from_secs(60);

impl Cx {
    /// `routes[i].auth`.
    pub(crate) fn auth(&self, n: &MarkedYaml<'_>, p: &str) -> Result<AuthSpec, SpecError> {
        let at = format!("{p}auth");
        let m = self.mapping(n, &at)?;
        self.only_known(&m, &format!("{at}."), &["jwt", "api_keys", "header"])?;
        let dir = Path::new(&self.file).parent().unwrap_or(Path::new(""));
        let file = |n: &MarkedYaml<'_>, field: &str| -> Result<std::path::PathBuf, SpecError> {
            let f = self.string(n, field)?;
            if f.is_empty() {
                return Err(self.err(line(n), field, "empty; name a file"));
            }
            Ok(absolute(&dir.join(f)).into())
        };
        match (get(&m, "jwt"), get(&m, "api_keys")) {
            (Some(j), None) => {
                if let Some(h) = get(&m, "header") {
                    return Err(self.err(
                        line(h),
                        &format!("{at}.header"),
                        "only for `api_keys`; a JWT comes in `Authorization: Bearer ...`",
                    ));
                }
                let at = format!("{at}.jwt");
                let jm = self.mapping(j, &at)?;
                self.only_known(
                    &jm,
                    &format!("{at}."),
                    &[
                        "jwks",
                        "issuer",
                        "audience",
                        "algorithms",
                        "leeway",
                        "scopes",
                    ],
                )?;
                let jwks_node = self.required(j, &jm, "jwks", &format!("{at}."))?;
                let text = self.string(jwks_node, &format!("{at}.jwks"))?;
                let jwks = if text.starts_with("http://") || text.starts_with("https://") {
                    JwksSource::Url(text)
                } else {
                    JwksSource::File(file(jwks_node, &format!("{at}.jwks"))?)
                };
                let opt = |key: &str| -> Result<Option<String>, SpecError> {
                    get(&jm, key)
                        .map(|n| self.string(n, &format!("{at}.{key}")))
                        .transpose()
                };
                let algorithms = match get(&jm, "algorithms") {
                    None => JWT_ALGORITHMS.iter().map(|a| a.to_string()).collect(),
                    Some(n) => {
                        let list = self.strings(n, &format!("{at}.algorithms"))?;
                        for (i, a) in list.iter().enumerate() {
                            if !JWT_ALGORITHMS.contains(&a.as_str()) {
                                return Err(self.err(
                                    line(n),
                                    &format!("{at}.algorithms[{i}]"),
                                    format!(
                                        "`{a}` is not an algorithm the gateway verifies; use {} \
                                         (shared secrets and `none` are refused)",
                                        JWT_ALGORITHMS.join(", ")
                                    ),
                                ));
                            }
                        }
                        if list.is_empty() {
                            return Err(self.err(
                                line(n),
                                &format!("{at}.algorithms"),
                                "empty; leave it out to accept RS256, ES256 and EdDSA",
                            ));
                        }
                        list
                    }
                };
                let leeway = match get(&jm, "leeway") {
                    None => DEFAULT_LEEWAY,
                    Some(n) => {
                        let d = self.duration(n, &format!("{at}.leeway"))?;
                        if d > Duration::from_secs(600) {
                            return Err(self.err(
                                line(n),
                                &format!("{at}.leeway"),
                                "at most 10m: a token's expiry should mean something",
                            ));
                        }
                        d
                    }
                };
                let scopes = match get(&jm, "scopes") {
                    None => Vec::new(),
                    Some(n) => self.strings(n, &format!("{at}.scopes"))?,
                };
                Ok(AuthSpec::Jwt(JwtSpec {
                    jwks,
                    issuer: opt("issuer")?,
                    audience: opt("audience")?,
                    algorithms,
                    leeway,
                    scopes,
                }))
            }
            (None, Some(k)) => {
                let header = match get(&m, "header") {
                    None => "x-api-key".to_owned(),
                    Some(h) => {
                        let v = self.string(h, &format!("{at}.header"))?;
                        if http_header_name_invalid(&v) {
                            return Err(self.err(
                                line(h),
                                &format!("{at}.header"),
                                format!("`{v}` is not an HTTP header name"),
                            ));
                        }
                        v.to_ascii_lowercase()
                    }
                };
                Ok(AuthSpec::ApiKeys {
                    file: file(k, &format!("{at}.api_keys"))?,
                    header,
                })
            }
            _ => Err(self.err(
                line(n),
                &at,
                "name one way to authenticate: `jwt: { jwks: FILE_OR_URL, ... }` or \
                 `api_keys: FILE`",
            )),
        }
    }

    /// `routes[i].rate_limit`.
    pub(crate) fn rate_limit(
        &self,
        n: &MarkedYaml<'_>,
        p: &str,
    ) -> Result<RateLimitSpec, SpecError> {
        let at = format!("{p}rate_limit");
        let m = self.mapping(n, &at)?;
        self.only_known(
            &m,
            &format!("{at}."),
            &["requests", "per", "burst", "per_client"],
        )?;
        let requests_node = self.required(n, &m, "requests", &format!("{at}."))?;
        let requests =
            self.integer(requests_node, &format!("{at}.requests"), 1, 1_000_000_000)? as u32;
        let per = match get(&m, "per") {
            None => Duration::from_secs(1),
            Some(n) => {
                let d = self.duration(n, &format!("{at}.per"))?;
                if d < Duration::from_millis(1) || d > Duration::from_secs(86_400) {
                    return Err(self.err(line(n), &format!("{at}.per"), "must be 1ms to 24h"));
                }
                d
            }
        };
        let burst = match get(&m, "burst") {
            None => requests,
            Some(n) => self.integer(n, &format!("{at}.burst"), 1, 1_000_000_000)? as u32,
        };
        let per_client = match get(&m, "per_client") {
            None => false,
            Some(n) => self.boolean(n, &format!("{at}.per_client"))?,
        };
        Ok(RateLimitSpec {
            requests,
            per,
            burst,
            per_client,
        })
    }
}
