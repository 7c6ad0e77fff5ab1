//! CoAP messages on the wire: what a datagram is, the options a request may carry, block
//! options, response codes, and encoding a response. Pure functions of bytes, so every rule
//! about hostile input is tested here without a socket.
//!
//! Decoding and encoding of the message format itself is `coap-lite`'s; this module decides
//! what a decoded message means for the gateway (RFC 7252 sections 4.2, 4.3, 5.4, RFC 7959).

use bytes::Bytes;
use coap_lite::option_value::{OptionValueU16, OptionValueU32};
use coap_lite::{CoapOption, MessageClass, MessageType, Packet};
use http::StatusCode;

/// The only CoAP version; datagrams of any other are ignored (RFC 7252 section 3).
const VERSION: u8 = 1;

/// A code as its byte: class in the top 3 bits, detail in the low 5 (`c.dd`).
pub(super) const fn code(class: u8, detail: u8) -> u8 {
    class << 5 | detail
}

/// Request and response codes the gateway reads or writes.
pub(super) mod codes {
    use super::code;

    pub const GET: u8 = code(0, 1);
    pub const POST: u8 = code(0, 2);
    pub const PUT: u8 = code(0, 3);
    pub const CREATED: u8 = code(2, 1);
    pub const CHANGED: u8 = code(2, 4);
    pub const CONTENT: u8 = code(2, 5);
    pub const CONTINUE: u8 = code(2, 31);
    pub const BAD_REQUEST: u8 = code(4, 0);
    pub const UNAUTHORIZED: u8 = code(4, 1);
    pub const BAD_OPTION: u8 = code(4, 2);
    pub const NOT_FOUND: u8 = code(4, 4);
    pub const METHOD_NOT_ALLOWED: u8 = code(4, 5);
    pub const INCOMPLETE: u8 = code(4, 8);
    pub const TOO_LARGE: u8 = code(4, 13);
    pub const INTERNAL: u8 = code(5, 0);
    pub const BAD_GATEWAY: u8 = code(5, 2);
    pub const UNAVAILABLE: u8 = code(5, 3);
    pub const PROXYING_NOT_SUPPORTED: u8 = code(5, 5);
}

/// `c.dd`, as CoAP writes codes.
pub(super) fn code_name(c: u8) -> String {
    format!("{}.{:02}", c >> 5, c & 0x1f)
}

/// The name of a request method code, for messages.
pub(super) fn method_name(c: u8) -> String {
    match c {
        1 => "GET".into(),
        2 => "POST".into(),
        3 => "PUT".into(),
        4 => "DELETE".into(),
        5 => "FETCH".into(),
        6 => "PATCH".into(),
        7 => "iPATCH".into(),
        c => format!("method {}", code_name(c)),
    }
}

/// The CoAP code for a chain's (or the gateway's) HTTP status: the same code where CoAP has
/// one, otherwise `x.00` of the status's class. Success is 2.04 Changed (POST and PUT change
/// something; 2.05 Content answers GET only), 201 is 2.01 Created.
pub(super) fn code_for(status: StatusCode) -> u8 {
    let s = status.as_u16();
    match s {
        201 => codes::CREATED,
        200..=299 => codes::CHANGED,
        401 | 403 | 404 | 405 | 406 | 409 | 412 | 413 | 415 | 422 | 429 => code(4, (s - 400) as u8),
        400..=499 => codes::BAD_REQUEST,
        500..=504 => code(5, (s - 500) as u8),
        _ => codes::INTERNAL,
    }
}

/// Message types (RFC 7252 section 3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    Con = 0,
    Non = 1,
    Ack = 2,
    Rst = 3,
}

impl From<Kind> for MessageType {
    fn from(k: Kind) -> Self {
        match k {
            Kind::Con => MessageType::Confirmable,
            Kind::Non => MessageType::NonConfirmable,
            Kind::Ack => MessageType::Acknowledgement,
            Kind::Rst => MessageType::Reset,
        }
    }
}

/// An Empty message (no token, no options, no payload): an ACK or a Reset for `mid`.
pub(super) fn empty(kind: Kind, mid: u16) -> Bytes {
    let [hi, lo] = mid.to_be_bytes();
    Bytes::copy_from_slice(&[VERSION << 6 | (kind as u8) << 4, 0, hi, lo])
}

/// A Block1 or Block2 option value (RFC 7959 section 2.2): block number, more flag, size
/// exponent (`16 << szx` bytes; 7 is BERT, for TCP only, and refused).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Block {
    pub num: u32,
    pub more: bool,
    pub szx: u8,
}

impl Block {
    /// The largest block this gateway sends or asks for, and the default for responses.
    pub const DEFAULT_SZX: u8 = 6;

    /// Decodes an option value of 0 to 3 bytes; `None` when it is longer or uses SZX 7.
    pub fn decode(v: &[u8]) -> Option<Block> {
        if v.len() > 3 {
            return None;
        }
        let n = v.iter().fold(0u32, |acc, b| acc << 8 | u32::from(*b));
        let szx = (n & 7) as u8;
        (szx != 7).then_some(Block {
            num: n >> 4,
            more: n & 8 != 0,
            szx,
        })
    }

    /// The option value, in as few bytes as it takes.
    pub fn encode(self) -> Vec<u8> {
        let n = self.num << 4 | u32::from(self.more) << 3 | u32::from(self.szx & 7);
        let bytes = n.to_be_bytes();
        let skip = match n {
            0 => 4,
            1..=0xff => 3,
            0x100..=0xffff => 2,
            _ => 1,
        };
        bytes[skip..].to_vec()
    }

    /// Bytes per block.
    pub fn size(self) -> usize {
        16 << self.szx
    }

    /// Where the block starts in the body (NUM is at most 2^20 - 1, so this cannot overflow).
    pub fn offset(self) -> usize {
        self.num as usize * self.size()
    }
}

/// What the server does with a datagram.
#[derive(Debug)]
pub(super) enum Message {
    /// Nothing: another version, too short, or a message that needs no answer.
    Drop,
    /// Answer with a Reset for this message id: a Confirmable message that cannot be
    /// processed (format error, an unexpected response) or an empty one (a "CoAP ping").
    Reset(u16),
    /// An empty ACK or a Reset from the peer for a message id the gateway sent.
    Confirm(u16),
    /// A request (CON or NON); `Err` holds the error response when its options are refused.
    Request(Exchange, Result<Request, Response>),
}

/// The message layer of a request: what its response must match.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Exchange {
    pub con: bool,
    pub mid: u16,
    pub token: Vec<u8>,
}

/// A request's code, options and payload, checked.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Request {
    /// Method code (0.01 to 0.31).
    pub method: u8,
    /// `/a/b` from the Uri-Path options (`/` with none); `None` when a segment holds a `/`,
    /// which no route can match.
    pub path: Option<String>,
    /// The Uri-Query options joined by `&`.
    pub query: String,
    pub content_format: Option<u16>,
    pub block1: Option<Block>,
    pub block2: Option<Block>,
    pub size1: Option<u32>,
    /// The Request-Tag option (RFC 9175): tells concurrent block-wise uploads apart.
    pub request_tag: Vec<u8>,
    /// The Echo option (RFC 9175 section 2.2): a value the gateway sent this client.
    pub echo: Option<Vec<u8>>,
    pub payload: Vec<u8>,
}

/// Decides what a datagram is. Never panics, whatever the bytes.
pub(super) fn classify(bytes: &[u8]) -> Message {
    if bytes.len() < 4 || bytes[0] >> 6 != VERSION {
        return Message::Drop;
    }
    let kind = match (bytes[0] >> 4) & 3 {
        0 => Kind::Con,
        1 => Kind::Non,
        2 => Kind::Ack,
        _ => Kind::Rst,
    };
    let token_len = usize::from(bytes[0] & 0x0f);
    let code = bytes[1];
    let mid = u16::from_be_bytes([bytes[2], bytes[3]]);
    // RFC 7252 section 4.2/4.3: a CON that cannot be processed is rejected with a Reset;
    // anything else is silently ignored.
    let reject = if kind == Kind::Con {
        Message::Reset(mid)
    } else {
        Message::Drop
    };
    if code == 0 {
        if token_len != 0 || bytes.len() != 4 {
            return reject;
        }
        return match kind {
            Kind::Con => Message::Reset(mid),
            Kind::Ack | Kind::Rst => Message::Confirm(mid),
            Kind::Non => Message::Drop,
        };
    }
    match code >> 5 {
        0 => {}
        // Responses: the gateway sends no requests, so none is expected.
        2 | 4 | 5 => return reject,
        // Reserved classes: a format error.
        _ => return reject,
    }
    if !matches!(kind, Kind::Con | Kind::Non) {
        // A request in an ACK or a Reset is malformed and never answered.
        return Message::Drop;
    }
    let Ok(packet) = Packet::from_bytes(bytes) else {
        return reject;
    };
    if packet.payload.is_empty() && has_empty_payload_marker(&packet, bytes.len()) {
        // "A marker followed by a zero-length payload MUST be processed as a message
        // format error" (RFC 7252 section 3).
        return reject;
    }
    let exchange = Exchange {
        con: kind == Kind::Con,
        mid,
        token: packet.get_token().to_vec(),
    };
    let request = request(code, packet);
    Message::Request(exchange, request)
}

/// Whether the datagram ended in a payload marker with nothing after it: the packet without
/// payload encodes to one byte less (option encodings are unique, so the re-encoding is the
/// datagram but for the marker).
fn has_empty_payload_marker(packet: &Packet, len: usize) -> bool {
    packet
        .to_bytes_unlimited()
        .is_ok_and(|b| b.len() + 1 == len)
}

/// Option numbers (RFC 7252 section 12.2, RFC 7959, RFC 9175).
mod opt {
    pub const URI_HOST: u16 = 3;
    pub const ETAG: u16 = 4;
    pub const OBSERVE: u16 = 6;
    pub const URI_PORT: u16 = 7;
    pub const URI_PATH: u16 = 11;
    pub const CONTENT_FORMAT: u16 = 12;
    pub const MAX_AGE: u16 = 14;
    pub const URI_QUERY: u16 = 15;
    pub const HOP_LIMIT: u16 = 16;
    pub const ACCEPT: u16 = 17;
    pub const BLOCK2: u16 = 23;
    pub const BLOCK1: u16 = 27;
    pub const SIZE2: u16 = 28;
    pub const PROXY_URI: u16 = 35;
    pub const PROXY_SCHEME: u16 = 39;
    pub const SIZE1: u16 = 60;
    pub const ECHO: u16 = 252;
    pub const NO_RESPONSE: u16 = 258;
    pub const REQUEST_TAG: u16 = 292;
}

/// The value lengths an option may have and whether it may repeat, for the options the
/// gateway recognises in a request; `None` for the others.
fn known(number: u16) -> Option<(usize, usize, bool)> {
    use opt::*;
    Some(match number {
        URI_HOST => (1, 255, false),
        ETAG => (1, 8, true),
        OBSERVE => (0, 3, false),
        URI_PORT => (0, 2, false),
        URI_PATH => (0, 255, true),
        CONTENT_FORMAT => (0, 2, false),
        MAX_AGE => (0, 4, false),
        URI_QUERY => (0, 255, true),
        HOP_LIMIT => (1, 1, false),
        ACCEPT => (0, 2, false),
        BLOCK2 | BLOCK1 => (0, 3, false),
        SIZE2 | SIZE1 => (0, 4, false),
        NO_RESPONSE => (0, 1, false),
        ECHO => (1, 40, false),
        REQUEST_TAG => (0, 8, false),
        _ => return None,
    })
}

fn uint(v: &[u8]) -> u32 {
    v.iter().fold(0u32, |acc, b| acc << 8 | u32::from(*b))
}

/// Checks a request's options (RFC 7252 section 5.4): an unrecognised critical option, a
/// critical one with a value of the wrong length, or one repeated that may not be, is 4.02
/// Bad Option; such elective options are ignored. Proxy-Uri and Proxy-Scheme are 5.05.
fn request(method: u8, packet: Packet) -> Result<Request, Response> {
    let mut r = Request {
        method,
        ..Request::default()
    };
    let mut segments: Vec<&[u8]> = Vec::new();
    let mut queries: Vec<&[u8]> = Vec::new();
    for (&number, values) in packet.options() {
        let critical = number & 1 == 1;
        if matches!(number, opt::PROXY_URI | opt::PROXY_SCHEME) {
            return Err(Response::diagnostic(
                codes::PROXYING_NOT_SUPPORTED,
                "gateway: this endpoint is no proxy",
            ));
        }
        let Some((min, max, repeatable)) = known(number) else {
            if critical {
                return Err(Response::diagnostic(
                    codes::BAD_OPTION,
                    format!("gateway: option {number} is not supported"),
                ));
            }
            continue;
        };
        if !repeatable && values.len() > 1 {
            if critical {
                return Err(Response::diagnostic(
                    codes::BAD_OPTION,
                    format!("gateway: option {number} may appear once"),
                ));
            }
            continue;
        }
        for v in values {
            if v.len() < min || v.len() > max {
                if critical {
                    return Err(Response::diagnostic(
                        codes::BAD_OPTION,
                        format!(
                            "gateway: option {number} has a value of {} bytes; {min} to {max} expected",
                            v.len()
                        ),
                    ));
                }
                continue;
            }
            match number {
                opt::URI_PATH => segments.push(v),
                opt::URI_QUERY => queries.push(v),
                opt::CONTENT_FORMAT => r.content_format = Some(uint(v) as u16),
                opt::SIZE1 => r.size1 = Some(uint(v)),
                opt::REQUEST_TAG => r.request_tag = v.clone(),
                opt::ECHO => r.echo = Some(v.clone()),
                opt::BLOCK1 | opt::BLOCK2 => {
                    let Some(b) = Block::decode(v) else {
                        return Err(Response::diagnostic(
                            codes::BAD_OPTION,
                            format!(
                                "gateway: option {number} (Block{}) uses block size exponent 7, \
                                 which CoAP over UDP does not have",
                                if number == opt::BLOCK1 { 1 } else { 2 }
                            ),
                        ));
                    };
                    if number == opt::BLOCK1 {
                        r.block1 = Some(b);
                    } else {
                        r.block2 = Some(b);
                    }
                }
                _ => {}
            }
        }
    }
    let mut path = String::from("/");
    let mut matchable = true;
    for (i, s) in segments.iter().enumerate() {
        let Ok(s) = std::str::from_utf8(s) else {
            return Err(Response::diagnostic(
                codes::BAD_REQUEST,
                "gateway: a Uri-Path segment is not UTF-8",
            ));
        };
        matchable &= !s.contains('/');
        if i > 0 {
            path.push('/');
        }
        path.push_str(s);
    }
    r.path = matchable.then_some(path);
    let mut query = Vec::with_capacity(queries.len());
    for q in queries {
        let Ok(q) = std::str::from_utf8(q) else {
            return Err(Response::diagnostic(
                codes::BAD_REQUEST,
                "gateway: a Uri-Query option is not UTF-8",
            ));
        };
        query.push(q);
    }
    r.query = query.join("&");
    r.payload = packet.payload;
    Ok(r)
}

/// Longest diagnostic payload: errors are one line and always fit one datagram.
const MAX_DIAGNOSTIC: usize = 512;

/// A response, before it is put in a message (a piggy-backed ACK, a separate CON, a NON).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Response {
    pub code: u8,
    pub payload: Bytes,
    pub content_format: Option<u16>,
    pub etag: Option<u32>,
    pub max_age: Option<u32>,
    pub block1: Option<Block>,
    pub block2: Option<Block>,
    pub size1: Option<u32>,
    pub size2: Option<u32>,
    /// The Echo option of a 4.01 challenge (RFC 9175 section 2.4).
    pub echo: Option<Vec<u8>>,
}

impl Response {
    /// A response with `code` and no payload.
    pub fn new(code: u8) -> Self {
        Self {
            code,
            ..Self::default()
        }
    }

    /// An error with a diagnostic payload (RFC 7252 section 5.5.2): UTF-8 text, no
    /// Content-Format, cut to [`MAX_DIAGNOSTIC`] bytes on a character boundary.
    pub fn diagnostic(code: u8, text: impl Into<String>) -> Self {
        let mut text = text.into();
        if text.len() > MAX_DIAGNOSTIC {
            let mut end = MAX_DIAGNOSTIC;
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            text.truncate(end);
        }
        Self {
            code,
            payload: Bytes::from(text),
            ..Self::default()
        }
    }

    /// Whether the code is an error (4.xx, 5.xx).
    pub fn is_error(&self) -> bool {
        self.code >> 5 >= 4
    }

    /// The message: `kind` with `mid` and the request's `token`.
    pub fn encode(&self, kind: Kind, mid: u16, token: &[u8]) -> Bytes {
        let mut p = Packet::new();
        p.header.set_type(kind.into());
        p.header.code = MessageClass::from(self.code);
        p.header.message_id = mid;
        p.set_token(token.iter().take(8).copied().collect());
        if let Some(e) = self.etag {
            p.add_option(CoapOption::ETag, e.to_be_bytes().to_vec());
        }
        if let Some(cf) = self.content_format {
            p.add_option_as(CoapOption::ContentFormat, OptionValueU16(cf));
        }
        if let Some(a) = self.max_age {
            p.add_option_as(CoapOption::MaxAge, OptionValueU32(a));
        }
        if let Some(b) = self.block2 {
            p.add_option(CoapOption::Block2, b.encode());
        }
        if let Some(b) = self.block1 {
            p.add_option(CoapOption::Block1, b.encode());
        }
        if let Some(s) = self.size2 {
            p.add_option_as(CoapOption::Size2, OptionValueU32(s));
        }
        if let Some(s) = self.size1 {
            p.add_option_as(CoapOption::Size1, OptionValueU32(s));
        }
        if let Some(e) = &self.echo {
            p.add_option(CoapOption::Unknown(opt::ECHO), e.clone());
        }
        p.payload = self.payload.to_vec();
        match p.to_bytes_unlimited() {
            Ok(b) => Bytes::from(b),
            // Cannot happen (no size limit, a token of at most 8 bytes); a bare 5.00 keeps
            // the exchange answered all the same.
            Err(_) => {
                let [hi, lo] = mid.to_be_bytes();
                let mut b = vec![VERSION << 6 | (kind as u8) << 4, codes::INTERNAL, hi, lo];
                b[0] |= p.get_token().len() as u8;
                b.extend_from_slice(p.get_token());
                Bytes::from(b)
            }
        }
    }

    /// Block `block` of this (whole) response: its slice of the payload, the Block2 option,
    /// and Size2 with the first block.
    pub fn block(&self, block: Block) -> Option<Response> {
        let start = block.offset();
        if start >= self.payload.len() && !(start == 0 && self.payload.is_empty()) {
            return None;
        }
        let end = (start + block.size()).min(self.payload.len());
        Some(Response {
            code: self.code,
            payload: self.payload.slice(start..end),
            content_format: self.content_format,
            etag: self.etag,
            max_age: self.max_age,
            block1: None,
            block2: Some(Block {
                num: block.num,
                more: end < self.payload.len(),
                szx: block.szx,
            }),
            size1: None,
            size2: (block.num == 0).then_some(self.payload.len() as u32),
            echo: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request datagram built with coap-lite.
    fn datagram(kind: Kind, code: u8, mid: u16, opts: &[(u16, &[u8])], payload: &[u8]) -> Vec<u8> {
        let mut p = Packet::new();
        p.header.set_type(kind.into());
        p.header.code = MessageClass::from(code);
        p.header.message_id = mid;
        p.set_token(vec![1, 2, 3]);
        for (n, v) in opts {
            p.add_option(CoapOption::from(*n), v.to_vec());
        }
        p.payload = payload.to_vec();
        p.to_bytes_unlimited().unwrap()
    }

    fn request_of(m: Message) -> (Exchange, Result<Request, Response>) {
        match m {
            Message::Request(e, r) => (e, r),
            other => panic!("not a request: {other:?}"),
        }
    }

    #[test]
    fn a_post_is_a_request_with_its_path_query_and_body() {
        let d = datagram(
            Kind::Con,
            codes::POST,
            7,
            &[
                (opt::URI_HOST, b"localhost"),
                (opt::URI_PATH, b"sensors"),
                (opt::URI_PATH, b"motion"),
                (opt::CONTENT_FORMAT, &[50]),
                (opt::URI_QUERY, b"a=1"),
                (opt::URI_QUERY, b"b"),
            ],
            b"{}",
        );
        let (ex, r) = request_of(classify(&d));
        assert_eq!(
            ex,
            Exchange {
                con: true,
                mid: 7,
                token: vec![1, 2, 3]
            }
        );
        let r = r.unwrap();
        assert_eq!(r.method, codes::POST);
        assert_eq!(r.path.as_deref(), Some("/sensors/motion"));
        assert_eq!(r.query, "a=1&b");
        assert_eq!(r.content_format, Some(50));
        assert_eq!(r.payload, b"{}");
    }

    #[test]
    fn no_uri_path_is_the_root_and_a_slash_in_a_segment_matches_nothing() {
        let d = datagram(Kind::Non, codes::POST, 1, &[], b"");
        assert_eq!(
            request_of(classify(&d)).1.unwrap().path.as_deref(),
            Some("/")
        );
        let d = datagram(Kind::Non, codes::POST, 1, &[(opt::URI_PATH, b"a/b")], b"");
        assert_eq!(request_of(classify(&d)).1.unwrap().path, None);
        let d = datagram(Kind::Non, codes::POST, 1, &[(opt::URI_PATH, &[0xff])], b"");
        assert_eq!(
            request_of(classify(&d)).1.unwrap_err().code,
            codes::BAD_REQUEST
        );
    }

    #[test]
    fn garbage_is_dropped_or_reset_never_a_panic() {
        assert!(matches!(classify(b""), Message::Drop));
        assert!(matches!(classify(&[0x40, 2, 0]), Message::Drop));
        // Version 2: ignored silently.
        assert!(matches!(classify(&[0x80, 2, 0, 1]), Message::Drop));
        // A CON with a token length of 9 (a format error): Reset.
        assert!(matches!(
            classify(&[0x49, 2, 0, 9, 1, 2, 3, 4, 5, 6, 7, 8, 9]),
            Message::Reset(9)
        ));
        // The same as NON: dropped.
        assert!(matches!(
            classify(&[0x59, 2, 0, 9, 1, 2, 3, 4, 5, 6, 7, 8, 9]),
            Message::Drop
        ));
        // Token shorter than announced.
        assert!(matches!(classify(&[0x44, 2, 0, 3, 1]), Message::Reset(3)));
        // Option delta 15 (reserved) without a payload marker.
        assert!(matches!(
            classify(&[0x40, 2, 0, 4, 0xf1, 0]),
            Message::Reset(4)
        ));
        // Option length running past the end.
        assert!(matches!(
            classify(&[0x40, 2, 0, 5, 0xb8, b'a']),
            Message::Reset(5)
        ));
        // Payload marker with no payload.
        assert!(matches!(
            classify(&[0x40, 2, 0, 6, 0xff]),
            Message::Reset(6)
        ));
        // A reserved code class, and a response the gateway never asked for.
        assert!(matches!(classify(&[0x40, 0x20, 0, 7]), Message::Reset(7)));
        assert!(matches!(classify(&[0x40, 0x45, 0, 8]), Message::Reset(8)));
        assert!(matches!(classify(&[0x60, 0x45, 0, 8]), Message::Drop));
        // Empty messages: a ping is reset, an ACK or RST confirms, one with a token is bad.
        assert!(matches!(classify(&[0x40, 0, 0, 10]), Message::Reset(10)));
        assert!(matches!(classify(&[0x60, 0, 0, 11]), Message::Confirm(11)));
        assert!(matches!(classify(&[0x70, 0, 0, 12]), Message::Confirm(12)));
        assert!(matches!(classify(&[0x50, 0, 0, 13]), Message::Drop));
        assert!(matches!(classify(&[0x41, 0, 0, 14, 1]), Message::Reset(14)));
        // A request carried by an ACK.
        assert!(matches!(classify(&[0x60, 2, 0, 15]), Message::Drop));
        // Every prefix and many mutations of a valid request.
        let d = datagram(
            Kind::Con,
            codes::POST,
            99,
            &[
                (opt::URI_PATH, b"motion"),
                (opt::BLOCK1, &[0x0e]),
                (opt::REQUEST_TAG, b"t"),
                (opt::SIZE1, &[0x27, 0x10]),
            ],
            b"payload",
        );
        for n in 0..=d.len() {
            let _ = classify(&d[..n]);
        }
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..20_000 {
            let mut m = d.clone();
            for _ in 0..3 {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                let at = (seed % m.len() as u64) as usize;
                m[at] = (seed >> 32) as u8;
            }
            let _ = classify(&m);
        }
    }

    #[test]
    fn unknown_critical_options_are_bad_elective_ones_ignored() {
        let d = datagram(Kind::Con, codes::POST, 1, &[(9, b"x")], b"");
        assert_eq!(
            request_of(classify(&d)).1.unwrap_err().code,
            codes::BAD_OPTION
        );
        // If-Match: conditional requests are not supported.
        let d = datagram(Kind::Con, codes::POST, 1, &[(1, b"x")], b"");
        assert_eq!(
            request_of(classify(&d)).1.unwrap_err().code,
            codes::BAD_OPTION
        );
        let d = datagram(Kind::Con, codes::POST, 1, &[(2048, b"x")], b"");
        assert!(request_of(classify(&d)).1.is_ok());
        // Block1 of 4 bytes, Block2 with SZX 7, two Block1 options.
        let d = datagram(
            Kind::Con,
            codes::POST,
            1,
            &[(opt::BLOCK1, &[0, 0, 0, 6])],
            b"",
        );
        assert_eq!(
            request_of(classify(&d)).1.unwrap_err().code,
            codes::BAD_OPTION
        );
        let d = datagram(Kind::Con, codes::POST, 1, &[(opt::BLOCK2, &[0x17])], b"");
        assert_eq!(
            request_of(classify(&d)).1.unwrap_err().code,
            codes::BAD_OPTION
        );
        let d = datagram(
            Kind::Con,
            codes::POST,
            1,
            &[(opt::BLOCK1, &[0x0e]), (opt::BLOCK1, &[0x1e])],
            b"",
        );
        assert_eq!(
            request_of(classify(&d)).1.unwrap_err().code,
            codes::BAD_OPTION
        );
        // An elective option of the wrong length is ignored.
        let d = datagram(
            Kind::Con,
            codes::POST,
            1,
            &[(opt::CONTENT_FORMAT, &[1, 2, 3])],
            b"",
        );
        assert_eq!(request_of(classify(&d)).1.unwrap().content_format, None);
        let d = datagram(
            Kind::Con,
            codes::POST,
            1,
            &[(opt::PROXY_URI, b"coap://x/")],
            b"",
        );
        assert_eq!(
            request_of(classify(&d)).1.unwrap_err().code,
            codes::PROXYING_NOT_SUPPORTED
        );
    }

    #[test]
    fn block_options_round_trip() {
        for b in [
            Block {
                num: 0,
                more: false,
                szx: 0,
            },
            Block {
                num: 0,
                more: true,
                szx: 6,
            },
            Block {
                num: 15,
                more: true,
                szx: 2,
            },
            Block {
                num: 16,
                more: false,
                szx: 6,
            },
            Block {
                num: 4095,
                more: true,
                szx: 6,
            },
            Block {
                num: 4096,
                more: false,
                szx: 1,
            },
            Block {
                num: (1 << 20) - 1,
                more: true,
                szx: 6,
            },
        ] {
            let v = b.encode();
            assert!(v.len() <= 3, "{b:?}");
            assert_eq!(Block::decode(&v), Some(b));
        }
        assert_eq!(
            Block::decode(&[]),
            Some(Block {
                num: 0,
                more: false,
                szx: 0
            })
        );
        assert_eq!(Block::decode(&[0x0f]), None);
        assert_eq!(Block::decode(&[1, 2, 3, 4]), None);
        let b = Block {
            num: 3,
            more: false,
            szx: 6,
        };
        assert_eq!((b.size(), b.offset()), (1024, 3072));
    }

    #[test]
    fn statuses_map_to_the_nearest_code() {
        let c = |s: u16| code_name(code_for(StatusCode::from_u16(s).unwrap()));
        for (s, want) in [
            (200, "2.04"),
            (201, "2.01"),
            (202, "2.04"),
            (400, "4.00"),
            (401, "4.01"),
            (402, "4.00"),
            (404, "4.04"),
            (408, "4.00"),
            (413, "4.13"),
            (418, "4.00"),
            (422, "4.22"),
            (429, "4.29"),
            (431, "4.00"),
            (500, "5.00"),
            (501, "5.01"),
            (502, "5.02"),
            (503, "5.03"),
            (504, "5.04"),
            (505, "5.00"),
            (599, "5.00"),
        ] {
            assert_eq!(c(s), want, "HTTP {s}");
        }
    }

    #[test]
    fn responses_encode_and_split_into_blocks() {
        let r = Response {
            code: codes::CHANGED,
            payload: Bytes::from(vec![b'x'; 2500]),
            content_format: Some(0),
            etag: Some(7),
            ..Response::default()
        };
        let b0 = r
            .block(Block {
                num: 0,
                more: false,
                szx: 6,
            })
            .unwrap();
        assert_eq!(b0.payload.len(), 1024);
        assert_eq!(
            b0.block2,
            Some(Block {
                num: 0,
                more: true,
                szx: 6
            })
        );
        assert_eq!(b0.size2, Some(2500));
        let b2 = r
            .block(Block {
                num: 2,
                more: false,
                szx: 6,
            })
            .unwrap();
        assert_eq!(b2.payload.len(), 452);
        assert_eq!(
            b2.block2,
            Some(Block {
                num: 2,
                more: false,
                szx: 6
            })
        );
        assert_eq!(b2.size2, None);
        assert!(r
            .block(Block {
                num: 3,
                more: false,
                szx: 6
            })
            .is_none());
        // Smaller blocks later are fine: block 5 of 256 bytes starts at 1280.
        let b5 = r
            .block(Block {
                num: 5,
                more: false,
                szx: 4,
            })
            .unwrap();
        assert_eq!(b5.payload.len(), 256);

        let bytes = b0.encode(Kind::Ack, 0x1234, &[9, 9]);
        let p = Packet::from_bytes(&bytes).unwrap();
        assert_eq!(p.header.get_type(), MessageType::Acknowledgement);
        assert_eq!(p.header.message_id, 0x1234);
        assert_eq!(u8::from(p.header.code), codes::CHANGED);
        assert_eq!(p.get_token(), &[9, 9]);
        assert_eq!(p.payload.len(), 1024);
        assert_eq!(
            Block::decode(p.get_first_option(CoapOption::Block2).unwrap()),
            Some(Block {
                num: 0,
                more: true,
                szx: 6
            })
        );
        assert_eq!(p.get_first_option(CoapOption::ETag).unwrap(), &[0, 0, 0, 7]);
        assert_eq!(
            p.get_first_option(CoapOption::Size2).unwrap(),
            &[0x09, 0xc4]
        );

        let long = Response::diagnostic(codes::BAD_REQUEST, "é".repeat(400));
        assert!(long.payload.len() <= MAX_DIAGNOSTIC);
        assert!(std::str::from_utf8(&long.payload).is_ok());
        assert_eq!(&empty(Kind::Rst, 0x0102)[..], &[0x70, 0, 1, 2]);
    }
}
