//! Route table: `METHOD /path` to a route index, with 404 and 405 told apart.

use std::collections::HashMap;

use http::{header, Method, StatusCode};
use zerohop_transport::Plan;

use crate::{ErrorSource, GatewayError};

/// Exact-path route table.
pub(crate) struct Router {
    by_path: HashMap<String, Vec<(Method, u16)>>,
}

impl Router {
    pub(crate) fn new(plan: &Plan) -> Self {
        let mut by_path: HashMap<String, Vec<(Method, u16)>> = HashMap::new();
        for (i, r) in plan.routes.iter().enumerate() {
            if let Ok(m) = Method::from_bytes(r.method.as_bytes()) {
                by_path
                    .entry(r.path.clone())
                    .or_default()
                    .push((m, i as u16));
            }
        }
        Self { by_path }
    }

    /// The route index for `method path`.
    pub(crate) fn find(&self, method: &Method, path: &str) -> Result<u16, GatewayError> {
        let Some(routes) = self.by_path.get(path) else {
            return Err(GatewayError::new(
                StatusCode::NOT_FOUND,
                ErrorSource::Gateway,
                format!("no route for {method} {path}"),
            ));
        };
        if let Some((_, i)) = routes.iter().find(|(m, _)| m == method) {
            return Ok(*i);
        }
        let allow: Vec<&str> = routes.iter().map(|(m, _)| m.as_str()).collect();
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
