//! Response headers a function sets for the client: `>name: value` lines in the metadata
//! area of the slot that comes back (see `zerohop_spec::meta`), read once and checked.
//!
//! They are input like everything else in shared memory: a name must be a header name that
//! is not about the connection or the framing (the gateway owns those), a value must be a
//! valid header value, and there are at most [`MAX_RESPONSE_HEADERS`]. Anything else fails
//! the request with a 502 that names the function, rather than reach the client half-applied.

use http::header::{HeaderName, HeaderValue};
use zerohop_spec::meta::{response_header_error, MAX_RESPONSE_HEADERS, RESPONSE_PREFIX};

/// The response headers of a metadata area, in order; or what is wrong with one.
pub(crate) fn response_headers(meta: &[u8]) -> Result<Vec<(HeaderName, HeaderValue)>, String> {
    let mut out = Vec::new();
    // Lines are split on bytes: a value need not be UTF-8 to be refused clearly.
    for line in meta.split(|&b| b == b'\n') {
        let Some(rest) = line.strip_prefix(&[RESPONSE_PREFIX as u8]) else {
            continue;
        };
        let Some(colon) = rest.windows(2).position(|w| w == b": ") else {
            return Err(format!(
                "a response header line `{}` has no `: `",
                String::from_utf8_lossy(&rest[..rest.len().min(64)])
            ));
        };
        let (name, value) = (&rest[..colon], &rest[colon + 2..]);
        let text = std::str::from_utf8(name).unwrap_or("(not UTF-8)");
        if let Some(why) = response_header_error(text, value) {
            return Err(why);
        }
        let (Ok(name), Ok(value)) = (HeaderName::from_bytes(name), HeaderValue::from_bytes(value))
        else {
            return Err(format!("`{text}` is not a response header"));
        };
        if out.len() == MAX_RESPONSE_HEADERS {
            return Err(format!("more than {MAX_RESPONSE_HEADERS} response headers"));
        }
        out.push((name, value));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn response_lines_become_headers_and_request_lines_are_left_alone() {
        let meta = b"cookie: a=1\n:path: /x\n{id}: 7\n>Location: /cart\n>set-cookie: s=1\n>set-cookie: t=2\n";
        let h = response_headers(meta).unwrap();
        let got: Vec<(&str, &[u8])> = h.iter().map(|(n, v)| (n.as_str(), v.as_bytes())).collect();
        assert_eq!(
            got,
            [
                ("location", &b"/cart"[..]),
                ("set-cookie", b"s=1"),
                ("set-cookie", b"t=2")
            ]
        );
        assert!(response_headers(b"").unwrap().is_empty());
    }

    #[test]
    fn forged_response_headers_are_refused_with_the_reason() {
        for (meta, why) in [
            (&b">content-length: 5\n"[..], "set by the gateway"),
            (b">Transfer-Encoding: chunked\n", "set by the gateway"),
            (b">connection: close\n", "set by the gateway"),
            (b">bad name: x\n", "not a header name"),
            (b">x-a: \x01\n", "control character"),
            (b">x-a\n", "has no `: `"),
        ] {
            let e = response_headers(meta).unwrap_err();
            assert!(e.contains(why), "{e}");
        }
        let many: Vec<u8> = (0..=MAX_RESPONSE_HEADERS)
            .flat_map(|i| format!(">x-{i}: v\n").into_bytes())
            .collect();
        assert!(response_headers(&many).unwrap_err().contains("more than"));
    }
}
