//! The gateway's HTTP/1.1 ingress on arbitrary bytes from a client (the chain and the
//! connection: `common/http_chain.rs`). Inputs that start with the HTTP/2 preface are the
//! `http2` target's.
//!
//! Checked: the connection ends (no hang); what comes back is HTTP; the chain never answers
//! 502/503/504 (the echo function always answers, in time, with its own slot); a request the
//! gateway must accept, a plain `POST /echo` with a `Content-Length` body, gets 200 with the
//! same body back; and no slot or in-flight entry outlives its connection.

#![no_main]

#[path = "common/http_chain.rs"]
mod http_chain;

use std::sync::OnceLock;

use http_chain::{assert_quiet, exchange, Chain, MAX_BODY};
use libfuzzer_sys::fuzz_target;

/// What an HTTP/2 client sends first (RFC 9113 3.4).
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

fn chain() -> &'static Chain {
    static CHAIN: OnceLock<Chain> = OnceLock::new();
    CHAIN.get_or_init(|| {
        Chain::start("fuzz-http", || {
            // The echo oracle below must recognise the simplest request, or it checks nothing.
            assert_eq!(
                plain_echo(b"POST /echo HTTP/1.1\r\nContent-Length: 2\r\n\r\nhi"),
                Some(&b"hi"[..])
            );
        })
    })
}

/// The body of `input` if it is one request the gateway must accept and echo: `POST /echo`
/// over HTTP/1.1 with a `Content-Length` body of at most `max_body` and only plain headers.
fn plain_echo(input: &[u8]) -> Option<&[u8]> {
    let mut headers = [httparse::EMPTY_HEADER; 16];
    let mut req = httparse::Request::new(&mut headers);
    let httparse::Status::Complete(head) = req.parse(input).ok()? else {
        return None;
    };
    if req.method != Some("POST") || req.path != Some("/echo") || req.version != Some(1) {
        return None;
    }
    let mut len = None;
    let mut traces = 0;
    for h in req.headers.iter() {
        match h.name.to_ascii_lowercase().as_str() {
            "content-length" => {
                let digits = h.value;
                if len.is_some()
                    || digits.is_empty()
                    || digits.len() > 6
                    || !digits.iter().all(u8::is_ascii_digit)
                {
                    return None;
                }
                len = std::str::from_utf8(digits).ok()?.parse::<usize>().ok();
            }
            "x-trace" if h.value.len() <= 256 && traces < 2 => traces += 1,
            "host" | "content-type" | "user-agent" | "accept" => {}
            _ => return None,
        }
    }
    let body = &input[head..];
    (len? == body.len() && body.len() <= MAX_BODY).then_some(body)
}

/// The first response of `answer`: status and (for a `Content-Length` response) body.
fn first_response(answer: &[u8]) -> (u16, Option<&[u8]>) {
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut resp = httparse::Response::new(&mut headers);
    let head = match resp.parse(answer) {
        Ok(httparse::Status::Complete(n)) => n,
        other => panic!(
            "the answer does not start with a complete HTTP response ({other:?}): {:?}",
            String::from_utf8_lossy(answer)
        ),
    };
    let code = resp.code.expect("a complete response has a status");
    let len = resp
        .headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case("content-length"))
        .and_then(|h| std::str::from_utf8(h.value).ok()?.parse::<usize>().ok());
    let body = len.and_then(|l| answer.get(head..head + l));
    (code, body)
}

fuzz_target!(|data: &[u8]| {
    if data.starts_with(H2_PREFACE) {
        return;
    }
    let c = chain();
    let answer = exchange(c, data);
    if !answer.is_empty() {
        assert!(
            answer.starts_with(b"HTTP/1.1 ") || answer.starts_with(b"HTTP/1.0 "),
            "not an HTTP answer: {:?}",
            String::from_utf8_lossy(&answer)
        );
        let (code, body) = first_response(&answer);
        assert!(
            !matches!(code, 502..=504),
            "the chain failed ({code}) although its function always answers: {:?}",
            String::from_utf8_lossy(&answer)
        );
        if let Some(sent) = plain_echo(data) {
            assert_eq!(code, 200, "{:?}", String::from_utf8_lossy(&answer));
            assert_eq!(body, Some(sent), "the echo came back changed");
        }
    } else {
        assert!(
            plain_echo(data).is_none(),
            "a plain POST /echo got no answer"
        );
    }
    assert_quiet(c);
});
