//! Errors that become HTTP answers: where it happened, what happened, one status.

use bytes::Bytes;
use http::{header, Response, StatusCode};
use http_body_util::Full;

/// Where an error happened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ErrorSource {
    /// In the gateway (routing, limits, timeouts).
    Gateway,
    /// In a named function.
    Function(String),
    /// In the transport between parties.
    Transport,
    /// In the agent (supervision).
    Agent,
}

impl std::fmt::Display for ErrorSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ErrorSource::Gateway => f.write_str("gateway"),
            ErrorSource::Function(n) => write!(f, "function '{n}'"),
            ErrorSource::Transport => f.write_str("transport"),
            ErrorSource::Agent => f.write_str("agent"),
        }
    }
}

/// An error answer.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{origin}: {message}")]
pub struct GatewayError {
    /// HTTP status.
    pub status: StatusCode,
    /// Where.
    pub origin: ErrorSource,
    /// What, one line.
    pub message: String,
    /// Extra headers (`Allow`, `Retry-After`).
    pub headers: Vec<(header::HeaderName, String)>,
}

impl GatewayError {
    /// An error of `source` with `status`.
    pub fn new(status: StatusCode, source: ErrorSource, message: impl Into<String>) -> Self {
        Self {
            status,
            origin: source,
            message: message.into(),
            headers: Vec::new(),
        }
    }

    /// Adds a header to the answer.
    pub fn with_header(mut self, name: header::HeaderName, value: impl Into<String>) -> Self {
        self.headers.push((name, value.into()));
        self
    }

    /// The HTTP answer: status, `text/plain` body of one line.
    pub fn into_response(self) -> Response<Full<Bytes>> {
        error_response(self.status, format!("{self}\n"), &self.headers)
    }
}

/// An error answer whose body is already formatted (e.g. by a function).
pub(crate) fn error_response(
    status: StatusCode,
    body: String,
    headers: &[(header::HeaderName, String)],
) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    for (k, v) in headers {
        if let Ok(v) = header::HeaderValue::from_str(v) {
            h.insert(k.clone(), v);
        }
    }
    r
}
