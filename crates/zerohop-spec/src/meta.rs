//! Names in a slot's metadata area (`name: value\n` lines, see `docs/protocol.md`) beside
//! the request headers the chain's functions list: one place, so the gateway that writes
//! them and every SDK that reads them agree.
//!
//! | line | written by | when |
//! |---|---|---|
//! | `x-trace: v` | gateway | a function lists the header (`headers: [X-Trace]`), names lower case |
//! | `:path: /product/42` | gateway | a function lists `:path`: the request's path as sent (percent-encoded) |
//! | `:query: a=1&b=2` | gateway | a function lists `:query`: the query string as sent, without `?` |
//! | `:client: alice` | gateway | a function lists `:client` and the route has `auth`: the client's name |
//! | `:claim.email: a@b.c` | gateway | a function lists it and the token has the claim (a string as is, else JSON) |
//! | `{id}: 42` | gateway | always, for each parameter of the route's path (percent-decoded) |
//! | `>location: /cart` | a function | a response header for the client (see [`RESPONSE_PREFIX`]) |
//!
//! None of these names can be a header name (`:`, `{` and `>` are not token characters), so
//! they never collide with what a client sends.

/// The request's path as the client sent it, listed in a function's `headers` to get it.
pub const PATH: &str = ":path";

/// The request's query string (after `?`, as sent), listed in a function's `headers`.
pub const QUERY: &str = ":query";

/// The authenticated client's name (a token's `sub`, an API key's name), listed in a
/// function's `headers`.
pub const CLIENT: &str = ":client";

/// Starts the name of a token claim a function lists in `headers` (`:claim.email`).
pub const CLAIM_PREFIX: &str = ":claim.";

/// The fixed pseudo-headers a function may list in `headers` beside real header names (and
/// `:claim.NAME`).
pub const PSEUDO: [&str; 3] = [PATH, QUERY, CLIENT];

/// Whether `name` (lower case) is a pseudo-header a function may list: one of [`PSEUDO`], or
/// [`CLAIM_PREFIX`] and a claim name (letters, digits, `_`, `-`, `.`; at most 64).
pub fn is_pseudo(name: &str) -> bool {
    PSEUDO.contains(&name)
        || name.strip_prefix(CLAIM_PREFIX).is_some_and(|c| {
            !c.is_empty()
                && c.len() <= 64
                && c.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b))
        })
}

/// Starts a response header line a function adds for the client (`>name: value`); the
/// gateway checks the name and value and sends it with the answer.
pub const RESPONSE_PREFIX: char = '>';

/// Most response headers one answer may carry.
pub const MAX_RESPONSE_HEADERS: usize = 64;

/// Response headers the gateway sets itself (the framing, the connection): a function may
/// not (lower case).
pub const GATEWAY_OWNED: [&str; 9] = [
    "connection",
    "content-length",
    "transfer-encoding",
    "upgrade",
    "te",
    "trailer",
    "keep-alive",
    "proxy-authenticate",
    "date",
];

/// Why `name: value` cannot be a response header a function sets, if it cannot: `name` must
/// be a header name (token characters) not in [`GATEWAY_OWNED`], `value` visible characters,
/// spaces and tabs (no line breaks).
pub fn response_header_error(name: &str, value: &[u8]) -> Option<String> {
    let token = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
    if !token {
        return Some(format!("`{name}` is not a header name"));
    }
    if GATEWAY_OWNED.iter().any(|g| g.eq_ignore_ascii_case(name)) {
        return Some(format!("`{name}` is set by the gateway, not by functions"));
    }
    if value.iter().any(|&b| (b < b' ' && b != b'\t') || b == 0x7f) {
        return Some(format!(
            "the value of response header `{name}` holds a control character or a line break"
        ));
    }
    None
}

/// The metadata name of path parameter `name` (`{name}`).
pub fn param(name: &str) -> String {
    format!("{{{name}}}")
}

/// The lines of a metadata area as `(name, value)` pairs; lines without `": "` are skipped.
pub fn lines(meta: &[u8]) -> impl Iterator<Item = (&str, &str)> {
    std::str::from_utf8(meta)
        .unwrap_or("")
        .lines()
        .filter_map(|l| l.split_once(": "))
}
