//! Route table: `METHOD /path` to a route index and its path parameters, with 404 and 405
//! told apart; `HEAD` takes the `GET` route of its path when it has none of its own.
//!
//! One router ([`matchit`]) per method, built from the plan's paths, which the spec already
//! checked with the same router: at each segment a literal beats a parameter and a
//! parameter beats a catch-all, so the most specific route wins, and two routes of one
//! method never match a path equally well.

use std::collections::HashMap;

use http::{header, Method, StatusCode};
use percent_encoding::percent_decode_str;
use zerohop_transport::Plan;

use crate::{ErrorSource, GatewayError};

/// The routes of a chain by method.
pub(crate) struct Router {
    by_method: HashMap<Method, matchit::Router<u16>>,
    /// The methods in the order the spec first names them, for `Allow`.
    methods: Vec<Method>,
}

/// A route matched: its index and its path parameters (name, percent-decoded value).
pub(crate) struct Matched<'p> {
    pub route: u16,
    pub params: Vec<(&'p str, String)>,
}

impl Router {
    pub(crate) fn new(plan: &Plan) -> Self {
        let mut by_method: HashMap<Method, matchit::Router<u16>> = HashMap::new();
        let mut methods = Vec::new();
        for (i, r) in plan.routes.iter().enumerate() {
            if r.path.is_empty() || r.relay_of.is_some() {
                continue;
            }
            let Ok(m) = Method::from_bytes(r.method.as_bytes()) else {
                continue;
            };
            if !methods.contains(&m) {
                methods.push(m.clone());
            }
            // The spec refused every path this router would refuse; a plan that did not come
            // from a checked spec loses the route, loudly.
            if let Err(e) = by_method
                .entry(m)
                .or_default()
                .insert(r.path.clone(), i as u16)
            {
                tracing::error!("route {} {}: {e}; not routed", r.method, r.path);
            }
        }
        Self { by_method, methods }
    }

    /// The route for `method path`, with its parameters.
    pub(crate) fn find<'p>(
        &'p self,
        method: &Method,
        path: &'p str,
    ) -> Result<Matched<'p>, GatewayError> {
        let at = |m: &Method| self.by_method.get(m).and_then(|r| r.at(path).ok());
        // HEAD runs the GET route when it has none of its own; hyper sends no body for it.
        let found = at(method).or_else(|| (*method == Method::HEAD).then(|| at(&Method::GET))?);
        if let Some(m) = found {
            let mut params = Vec::new();
            for (name, raw) in m.params.iter() {
                let value = percent_decode_str(raw)
                    .decode_utf8()
                    .map_err(|_| bad_param(name, "is not UTF-8 once percent-decoded"))?;
                if value.contains(['\r', '\n']) {
                    return Err(bad_param(name, "holds a line break"));
                }
                params.push((name, value.into_owned()));
            }
            return Ok(Matched {
                route: *m.value,
                params,
            });
        }
        let mut allow: Vec<&str> = self
            .methods
            .iter()
            .filter(|m| self.by_method[*m].at(path).is_ok())
            .map(Method::as_str)
            .collect();
        if allow.contains(&"GET") && !allow.contains(&"HEAD") {
            allow.push("HEAD");
        }
        if allow.is_empty() {
            return Err(GatewayError::new(
                StatusCode::NOT_FOUND,
                ErrorSource::Gateway,
                format!("no route for {method} {path}"),
            ));
        }
        Err(GatewayError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            ErrorSource::Gateway,
            format!(
                "{path} does not accept {method}; allowed: {}",
                allow.join(", ")
            ),
        )
        .with_header(header::ALLOW, allow.join(", ")))
    }
}

fn bad_param(name: &str, why: &str) -> GatewayError {
    GatewayError::new(
        StatusCode::BAD_REQUEST,
        ErrorSource::Gateway,
        format!("path parameter `{name}` {why}"),
    )
}
