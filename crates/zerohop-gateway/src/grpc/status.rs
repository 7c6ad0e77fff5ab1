//! gRPC status codes, and how the gateway's and the functions' HTTP-like statuses map to
//! them (the table in `docs/spec.md`, "gRPC").

use http::StatusCode;
use percent_encoding::{utf8_percent_encode, AsciiSet, CONTROLS};

/// A gRPC status code (`grpc-status`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Code {
    Ok = 0,
    Cancelled = 1,
    Unknown = 2,
    InvalidArgument = 3,
    DeadlineExceeded = 4,
    NotFound = 5,
    PermissionDenied = 7,
    ResourceExhausted = 8,
    Aborted = 10,
    Unimplemented = 12,
    Internal = 13,
    Unavailable = 14,
    Unauthenticated = 16,
}

impl Code {
    /// The code of an answer with HTTP status `s`, a function's or the gateway's own.
    pub(crate) fn of_http(s: StatusCode) -> Code {
        if s.is_success() {
            return Code::Ok;
        }
        match s.as_u16() {
            400 => Code::InvalidArgument,
            401 => Code::Unauthenticated,
            403 => Code::PermissionDenied,
            404 => Code::NotFound,
            408 => Code::DeadlineExceeded,
            409 => Code::Aborted,
            413 | 429 | 431 => Code::ResourceExhausted,
            499 => Code::Cancelled,
            500 => Code::Internal,
            501 => Code::Unimplemented,
            503 => Code::Unavailable,
            504 => Code::DeadlineExceeded,
            _ => Code::Unknown,
        }
    }

    /// The `grpc-status` value.
    pub(crate) fn value(self) -> http::HeaderValue {
        http::HeaderValue::from(u16::from(self as u8))
    }
}

/// What `grpc-message` leaves as it is: space and visible ASCII but `%` (gRPC's
/// "Percent-Byte-Unencoded"); anything else, UTF-8 included, is percent-encoded.
const MESSAGE: &AsciiSet = &CONTROLS.add(b'%');

/// `message` as a `grpc-message` value: percent-encoded, one line, at most `MAX_MESSAGE`
/// bytes of it.
pub(crate) fn message_value(message: &str) -> http::HeaderValue {
    let line = message.lines().next().unwrap_or("");
    let mut end = line.len().min(MAX_MESSAGE);
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    let text = utf8_percent_encode(&line[..end], MESSAGE).to_string();
    http::HeaderValue::from_str(&text).expect("percent-encoded text is a header value")
}

/// Longest message text sent (before encoding): an error is one line, not a document.
const MAX_MESSAGE: usize = 1024;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_map_as_the_docs_table_says() {
        for (http, code) in [
            (200, 0),
            (201, 0),
            (400, 3),
            (401, 16),
            (403, 7),
            (404, 5),
            (408, 4),
            (409, 10),
            (413, 8),
            (429, 8),
            (431, 8),
            (499, 1),
            (500, 13),
            (501, 12),
            (502, 2),
            (503, 14),
            (504, 4),
            (303, 2),
            (422, 2),
        ] {
            let got = Code::of_http(StatusCode::from_u16(http).unwrap()) as u8;
            assert_eq!(got, code, "HTTP {http}");
        }
    }

    #[test]
    fn messages_are_percent_encoded_as_grpc_says() {
        let v = message_value("function 'f': 100% café\tdone\nsecond line");
        assert_eq!(v, "function 'f': 100%25 caf%C3%A9%09done");
        let long = "é".repeat(MAX_MESSAGE);
        assert!(message_value(&long).len() <= 3 * MAX_MESSAGE);
    }
}
