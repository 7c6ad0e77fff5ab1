//! gRPC unary methods over HTTP/2: a route `grpc: package.Service/Method` is the HTTP route
//! `POST /package.Service/Method` whose body is one length-prefixed message.
//!
//! A call is told by its `content-type` (`application/grpc` or `application/grpc+proto`) and
//! must come over HTTP/2 (other `application/grpc+…` types get 415, HTTP/1.1 gets 505, in
//! plain HTTP as gRPC servers answer them). The gateway routes, admits and reads it as any
//! HTTP request (bounded by `max_body` and `body_timeout`), hands the function the message
//! alone ([`Unframe`]: the prefix stripped as the body arrives, still one copy into the
//! slot, a large message streamed into a large slot), and waits
//! at most `grpc-timeout`, bounded by the chain's `timeout`. The answer is HTTP 200,
//! `content-type: application/grpc`, the function's output as one message and the trailer
//! `grpc-status: 0`; any error is a Trailers-Only answer (`grpc-status` and a percent-encoded
//! `grpc-message` in the headers, no body) with the code [`status::Code::of_http`] maps its
//! status to, but a call no gRPC route takes (an unknown method) is UNIMPLEMENTED.
//!
//! Not supported, and refused as UNIMPLEMENTED: compressed messages (`grpc-accept-encoding:
//! identity` says so) and a second request message (client and bidirectional streaming
//! cannot be told from unary on the wire until it comes). A server-streaming call gets its
//! one answer message.

mod frame;
mod status;

use std::net::IpAddr;
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode, Version};
use hyper::body::Incoming;
use zerohop_transport::RoutePlan;

pub(crate) use frame::{prefix, FrameError, Unframe, PREFIX};
use status::{message_value, Code};

use crate::body::AnswerBody;
use crate::ingress::Reply;
use crate::{ErrorSource, Gateway, GatewayError};

const GRPC: HeaderValue = HeaderValue::from_static("application/grpc");
const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
const GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");
const GRPC_TIMEOUT: &str = "grpc-timeout";
const ACCEPT_ENCODING: HeaderName = HeaderName::from_static("grpc-accept-encoding");
const IDENTITY: HeaderValue = HeaderValue::from_static("identity");

/// A gRPC call: what the gateway learned of it before routing.
#[derive(Debug)]
pub(crate) struct Call {
    /// The method's path (`/package.Service/Method`), for the error of an unknown method.
    path: String,
    /// `grpc-timeout`, if the client sent one: `Err` when it is malformed.
    timeout: Result<Option<Duration>, ()>,
}

impl Call {
    /// The call `req` makes: `Ok(None)` for a request that is not gRPC, `Err` for a gRPC
    /// request the gateway cannot serve (answered in plain HTTP).
    pub(crate) fn of<B>(req: &Request<B>) -> Result<Option<Call>, GatewayError> {
        let Some(t) = req.headers().get(header::CONTENT_TYPE) else {
            return Ok(None);
        };
        let t = t.to_str().unwrap_or("").to_ascii_lowercase();
        let base = t.split(';').next().unwrap_or("").trim();
        match base {
            "application/grpc" | "application/grpc+proto" => {}
            b if b.starts_with("application/grpc+") => {
                return Err(GatewayError::new(
                    StatusCode::UNSUPPORTED_MEDIA_TYPE,
                    ErrorSource::Gateway,
                    format!(
                        "gRPC messages in `{b}` are not supported; send \
                         `application/grpc` (protobuf)"
                    ),
                ))
            }
            _ => return Ok(None),
        }
        if req.version() < Version::HTTP_2 {
            return Err(GatewayError::new(
                StatusCode::HTTP_VERSION_NOT_SUPPORTED,
                ErrorSource::Gateway,
                "gRPC needs HTTP/2 (h2c by prior knowledge in clear, ALPN h2 over TLS)",
            ));
        }
        let timeout = match req.headers().get(GRPC_TIMEOUT) {
            None => Ok(None),
            Some(v) => parse_timeout(v.as_bytes()).map(Some).ok_or(()),
        };
        Ok(Some(Call {
            path: req.uri().path().to_owned(),
            timeout,
        }))
    }

    /// How long the chain may take: `grpc-timeout`, at most the chain's `timeout`.
    pub(crate) fn timeout(call: Option<&Call>, chain: Duration) -> Duration {
        match call.map(|c| c.timeout) {
            Some(Ok(Some(t))) => t.min(chain),
            _ => chain,
        }
    }

    /// Whether `route` takes `call` (`None`: not a gRPC request): gRPC calls go to gRPC
    /// routes only, and a gRPC route takes gRPC calls only.
    pub(crate) fn check_route(
        call: Option<&Call>,
        route: &RoutePlan,
        path: &str,
    ) -> Result<(), GatewayError> {
        match call {
            Some(_) if !route.grpc => Err(GatewayError::new(
                StatusCode::NOT_FOUND,
                ErrorSource::Gateway,
                format!("no route for {path}"),
            )),
            Some(Call {
                timeout: Err(()), ..
            }) => Err(GatewayError::new(
                StatusCode::BAD_REQUEST,
                ErrorSource::Gateway,
                "malformed grpc-timeout (1 to 8 digits and a unit of H, M, S, m, u, n)",
            )),
            None if route.grpc => Err(GatewayError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                ErrorSource::Gateway,
                format!(
                    "POST {path} is a gRPC method: call it with a gRPC client (HTTP/2, \
                     `content-type: application/grpc`)"
                ),
            )),
            _ => Ok(()),
        }
    }

    /// The answer to the call: the reply as one message and `grpc-status: 0`, or the error
    /// (a gateway's, or a function's status 4xx/5xx) as a Trailers-Only answer.
    pub(crate) fn answer(&self, result: Result<Reply, GatewayError>) -> Response<AnswerBody> {
        let reply = match result {
            Ok(r) if r.status.is_success() => r,
            Ok(r) => {
                let text = String::from_utf8_lossy(&r.body);
                return trailers_only(Code::of_http(r.status), text.trim(), &[]);
            }
            // No route for the call's path, or not a gRPC one: an unknown method.
            Err(e)
                if e.origin == ErrorSource::Gateway && matches!(e.status.as_u16(), 404 | 405) =>
            {
                let method = self.path.trim_start_matches('/');
                return trailers_only(
                    Code::Unimplemented,
                    &format!("gateway: unknown method {method}"),
                    &[],
                );
            }
            Err(e) => return trailers_only(Code::of_http(e.status), &e.to_string(), &e.headers),
        };
        let mut trailers = HeaderMap::new();
        trailers.insert(GRPC_STATUS, Code::Ok.value());
        let head = Bytes::copy_from_slice(&prefix(reply.body.len()));
        let mut r = Response::new(AnswerBody::message(head, reply.body, trailers));
        let h = r.headers_mut();
        h.insert(header::CONTENT_TYPE, GRPC);
        h.insert(ACCEPT_ENCODING, IDENTITY);
        // The functions' own headers are the call's response metadata; the type is gRPC's.
        for (name, value) in reply.headers {
            if name != header::CONTENT_TYPE {
                h.append(name, value);
            }
        }
        r
    }
}

/// A Trailers-Only answer: HTTP 200 and the status in the headers, no body.
fn trailers_only(
    code: Code,
    message: &str,
    extra: &[(HeaderName, String)],
) -> Response<AnswerBody> {
    let mut r = Response::new(AnswerBody::default());
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, GRPC);
    h.insert(ACCEPT_ENCODING, IDENTITY);
    h.insert(GRPC_STATUS, code.value());
    h.insert(GRPC_MESSAGE, message_value(message));
    // `Retry-After`, `WWW-Authenticate`: as useful to a gRPC client as to any.
    for (k, v) in extra {
        if let Ok(v) = HeaderValue::from_str(v) {
            h.insert(k.clone(), v);
        }
    }
    r
}

impl Gateway {
    /// Answers one gRPC call from `peer`: through the same routes, guards and limits as any
    /// HTTP request ([`Gateway::handle`]), answered in gRPC's terms.
    pub(crate) async fn handle_grpc(
        &self,
        req: Request<Incoming>,
        peer: Option<IpAddr>,
        call: Call,
    ) -> Response<AnswerBody> {
        let result = self.handle_inner(req, peer, Some(&call)).await;
        call.answer(result.map(|(reply, ..)| reply))
    }
}

/// A `grpc-timeout` value: 1 to 8 digits and a unit (`H`, `M`, `S`, `m`, `u`, `n`).
fn parse_timeout(v: &[u8]) -> Option<Duration> {
    let (&unit, digits) = v.split_last()?;
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n: u64 = std::str::from_utf8(digits).ok()?.parse().ok()?;
    Some(match unit {
        b'H' => Duration::from_secs(n * 3600),
        b'M' => Duration::from_secs(n * 60),
        b'S' => Duration::from_secs(n),
        b'm' => Duration::from_millis(n),
        b'u' => Duration::from_micros(n),
        b'n' => Duration::from_nanos(n),
        _ => return None,
    })
}

/// Fuzzing entry (`fuzz/fuzz_targets/grpc.rs`): `data` is `[n, n chunk lengths, body]`, the
/// body of a unary call as hyper might hand it over in chunks (`n` taken modulo 8, the last
/// chunk the rest). Checks that a message taken is the whole body but its prefix, that an
/// error is INTERNAL or UNIMPLEMENTED, and that `grpc-message` and `grpc-timeout` take any
/// text.
#[doc(hidden)]
pub fn fuzz_frames(data: &[u8]) {
    let Some((&n, rest)) = data.split_first() else {
        return;
    };
    let n = usize::from(n % 8).min(rest.len());
    let (cuts, body) = rest.split_at(n);
    let mut chunks = Vec::new();
    let mut at = 0;
    for &c in cuts {
        let end = (at + usize::from(c)).min(body.len());
        chunks.push(Bytes::copy_from_slice(&body[at..end]));
        at = end;
    }
    chunks.push(Bytes::copy_from_slice(&body[at..]));
    match frame::message(chunks) {
        Ok(m) => {
            let m = m.concat();
            // Exactly one uncompressed message, the whole body.
            assert_eq!(body[0], 0);
            assert_eq!(m.len() + frame::PREFIX, body.len());
            assert_eq!(&body[frame::PREFIX..], &m[..]);
            assert_eq!(&body[1..5], &(m.len() as u32).to_be_bytes());
        }
        Err(e) => {
            let code = Code::of_http(e.into_gateway().status);
            assert!(matches!(code, Code::Internal | Code::Unimplemented));
        }
    }
    if let Ok(v) = std::str::from_utf8(body) {
        let m = message_value(v);
        assert!(m.as_bytes().iter().all(|b| (0x20..0x7f).contains(b)));
    }
    let _ = parse_timeout(body);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(version: Version, content_type: &str, timeout: Option<&str>) -> Request<()> {
        let mut b = Request::post("/a.B/C")
            .version(version)
            .header(header::CONTENT_TYPE, content_type);
        if let Some(t) = timeout {
            b = b.header(GRPC_TIMEOUT, t);
        }
        b.body(()).unwrap()
    }

    #[test]
    fn grpc_calls_are_told_by_their_type_and_need_http2() {
        let v2 = Version::HTTP_2;
        assert!(Call::of(&request(v2, "application/grpc", None))
            .unwrap()
            .is_some());
        assert!(Call::of(&request(v2, "application/grpc+proto", None))
            .unwrap()
            .is_some());
        assert!(Call::of(&request(v2, "text/plain", None))
            .unwrap()
            .is_none());
        assert!(Call::of(&request(v2, "application/grpc-web", None))
            .unwrap()
            .is_none());
        let e = Call::of(&request(v2, "application/grpc+json", None)).unwrap_err();
        assert_eq!(e.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
        let e = Call::of(&request(Version::HTTP_11, "application/grpc", None)).unwrap_err();
        assert_eq!(e.status, StatusCode::HTTP_VERSION_NOT_SUPPORTED);
    }

    #[test]
    fn grpc_timeout_is_bounded_by_the_chains() {
        let chain = Duration::from_secs(10);
        let t = |v| {
            Call::timeout(
                Call::of(&request(Version::HTTP_2, "application/grpc", Some(v)))
                    .unwrap()
                    .as_ref(),
                chain,
            )
        };
        assert_eq!(t("250m"), Duration::from_millis(250));
        assert_eq!(t("1H"), chain);
        assert_eq!(t("99999999n"), Duration::from_nanos(99_999_999));
        assert_eq!(Call::timeout(None, chain), chain);
        for bad in ["", "5", "S", "123456789S", "5s", "-1S", "1.5S"] {
            assert_eq!(parse_timeout(bad.as_bytes()), None, "{bad}");
        }
        let call = Call::of(&request(Version::HTTP_2, "application/grpc", Some("5x"))).unwrap();
        let grpc_route = RoutePlan {
            grpc: true,
            ..Default::default()
        };
        let e = Call::check_route(call.as_ref(), &grpc_route, "/a.B/C").unwrap_err();
        assert_eq!(Code::of_http(e.status), Code::InvalidArgument);
    }

    #[test]
    fn the_fuzz_entry_takes_its_seeds() {
        for seed in [
            &b"\x00\x00\x00\x00\x00\x05\x0a\x03Ada"[..],
            b"\x02\x03\x04\x00\x00\x00\x00\x05\x0a\x03Ada",
            b"\x00\x01\x00\x00\x00\x01x",
            b"\x07\xff",
            b"",
        ] {
            fuzz_frames(seed);
        }
    }

    #[test]
    fn calls_and_routes_must_match() {
        let call = Call::of(&request(Version::HTTP_2, "application/grpc", None)).unwrap();
        let grpc_route = RoutePlan {
            grpc: true,
            ..Default::default()
        };
        let http_route = RoutePlan::default();
        assert!(Call::check_route(call.as_ref(), &grpc_route, "/a.B/C").is_ok());
        assert!(Call::check_route(None, &http_route, "/a.B/C").is_ok());
        let e = Call::check_route(None, &grpc_route, "/a.B/C").unwrap_err();
        assert_eq!(e.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
        // A call to an HTTP route is a call to an unknown method.
        let e = Call::check_route(call.as_ref(), &http_route, "/a.B/C").unwrap_err();
        let a = call.unwrap().answer(Err(e));
        assert_eq!(a.headers()["grpc-status"], "12");
        assert_eq!(a.headers()["grpc-message"], "gateway: unknown method a.B/C");
    }

    #[test]
    fn answers_are_one_message_or_trailers_only() {
        let call = Call::of(&request(Version::HTTP_2, "application/grpc", None))
            .unwrap()
            .unwrap();
        let reply = |status: u16, body: &'static [u8]| Reply {
            status: StatusCode::from_u16(status).unwrap(),
            body: Bytes::from_static(body),
            headers: vec![
                (header::CONTENT_TYPE, HeaderValue::from_static("text/x")),
                (
                    HeaderName::from_static("x-m"),
                    HeaderValue::from_static("1"),
                ),
            ],
            left: false,
        };
        let a = call.answer(Ok(reply(200, b"out")));
        assert_eq!(a.status(), StatusCode::OK);
        assert_eq!(a.headers()[header::CONTENT_TYPE], "application/grpc");
        assert_eq!(a.headers()["x-m"], "1");
        assert!(a.headers().get("grpc-status").is_none(), "in the trailers");
        let a = call.answer(Ok(reply(404, b"function 'f': no such thing\n")));
        assert_eq!(a.status(), StatusCode::OK);
        assert_eq!(a.headers()["grpc-status"], "5");
        assert_eq!(a.headers()["grpc-message"], "function 'f': no such thing");
        assert!(hyper::body::Body::is_end_stream(a.body()));
        let e = GatewayError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            ErrorSource::Gateway,
            "full",
        )
        .with_header(header::RETRY_AFTER, "1");
        let a = call.answer(Err(e));
        assert_eq!(a.headers()["grpc-status"], "14");
        assert_eq!(a.headers()["grpc-message"], "gateway: full");
        assert_eq!(a.headers()[header::RETRY_AFTER], "1");
        // A function's own 404 is NOT_FOUND, not an unknown method.
        let e = GatewayError::new(
            StatusCode::NOT_FOUND,
            ErrorSource::Function("f".into()),
            "gone",
        );
        assert_eq!(call.answer(Err(e)).headers()["grpc-status"], "5");
    }
}
