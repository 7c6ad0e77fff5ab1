//! What an HTTP request carries beyond its body and headers (the route, its path
//! parameters, the query string, cookies), and what a function adds to the client's answer
//! (response headers, a status): the C face of the runtime's `Request` accessors of the
//! same names. Strings out are (pointer, length) pairs into the slot's metadata (the route's
//! path: into the plan), valid until the handler returns: a response header goes in after
//! the lines already there, so it moves the body but none of them. A decoded query value is
//! the runtime's own string, so zh_query copies it out.

use std::ffi::c_char;
use std::ptr;

use zerohop_runtime::Request;

use super::{out_str, put_len, request, text, zh_request};

/// The path of the route the request came in by, as the spec writes it (`/item/{id}`,
/// `/static/{*rest}`; not NUL-terminated).
///
/// # Safety
///
/// Every pointer is NULL or valid as zerohop.h says (the request for the handler call
/// that got it, strings NUL-terminated, buffers as long as their lengths).
#[no_mangle]
pub unsafe extern "C" fn zh_route_path(req: *mut zh_request, len: *mut usize) -> *const c_char {
    match request(req) {
        Some(r) => out_str(r.req().route_path(), len),
        None => out_str("", len),
    }
}

/// `found`'s value as (pointer, length) for C, or NULL (length 0) when absent.
fn out_opt(found: Option<&str>, len: *mut usize) -> *const c_char {
    match found {
        Some(v) => out_str(v, len),
        None => {
            put_len(len, 0);
            ptr::null()
        }
    }
}

/// What `get` finds under `name` in the request, as (pointer, length), or NULL (length 0)
/// when absent or when `req` or `name` is unusable (zh_param, zh_cookie).
fn named(
    req: *mut zh_request,
    name: *const c_char,
    len: *mut usize,
    get: for<'x> fn(&'x Request<'static>, &str) -> Option<&'x str>,
) -> *const c_char {
    let (Some(r), Some(name)) = (request(req), text(name)) else {
        return out_opt(None, len);
    };
    out_opt(get(r.req(), name), len)
}

/// The route's path parameter `name` (`id` for `GET /item/{id}`, `rest` for a trailing `*`),
/// percent-decoded, else NULL. Parameters always arrive, listed in `headers` or not. Not
/// NUL-terminated; its length in `*len`.
///
/// # Safety
///
/// Every pointer is NULL or valid as zerohop.h says (the request for the handler call
/// that got it, strings NUL-terminated, buffers as long as their lengths).
#[no_mangle]
pub unsafe extern "C" fn zh_param(
    req: *mut zh_request,
    name: *const c_char,
    len: *mut usize,
) -> *const c_char {
    named(req, name, len, Request::param)
}

/// The query string as the client sent it (after `?`, not decoded), when a function of the
/// chain lists `:query` in its `headers` and the request had one, else NULL. Not
/// NUL-terminated; its length in `*len`. zh_query decodes one parameter of it.
///
/// # Safety
///
/// Every pointer is NULL or valid as zerohop.h says (the request for the handler call
/// that got it, strings NUL-terminated, buffers as long as their lengths).
#[no_mangle]
pub unsafe extern "C" fn zh_query_string(req: *mut zh_request, len: *mut usize) -> *const c_char {
    let Some(r) = request(req) else {
        return out_opt(None, len);
    };
    out_opt(r.req().query_string(), len)
}

/// Reads the first value of query parameter `name` (`application/x-www-form-urlencoded`
/// decoding: `+` is a space, `%XX` a byte), as zh_state_get reads a value: returns 1 when
/// found, with its length in `*len` and the value copied to `buf` when it fits in `cap`
/// bytes (not NUL-terminated; a longer one is not copied: call again with room for `*len`);
/// 0 when absent (or `:query` is not listed); 400 for a NULL or non-UTF-8 `name`.
///
/// # Safety
///
/// Every pointer is NULL or valid as zerohop.h says (the request for the handler call
/// that got it, strings NUL-terminated, buffers as long as their lengths).
#[no_mangle]
pub unsafe extern "C" fn zh_query(
    req: *mut zh_request,
    name: *const c_char,
    buf: *mut c_char,
    cap: usize,
    len: *mut usize,
) -> u16 {
    put_len(len, 0);
    let Some(r) = request(req) else { return 500 };
    let Some(name) = text(name) else {
        return r.remember(400, "zh_query: the name is NULL or not UTF-8");
    };
    let Some(v) = r.req().query(name) else {
        return 0;
    };
    put_len(len, v.len());
    if v.len() <= cap && !buf.is_null() {
        // SAFETY: `buf` is not NULL and C passes room for `cap` bytes there (zerohop.h);
        // `v.len() <= cap` was checked; `v` is a string of our own, so they do not overlap.
        unsafe { ptr::copy_nonoverlapping(v.as_ptr(), buf.cast::<u8>(), v.len()) };
    }
    1
}

/// The value of cookie `name` from the request's `Cookie` headers, when a function of the
/// chain lists `cookie` in its `headers`, else NULL. Not NUL-terminated; its length in
/// `*len`.
///
/// # Safety
///
/// Every pointer is NULL or valid as zerohop.h says (the request for the handler call
/// that got it, strings NUL-terminated, buffers as long as their lengths).
#[no_mangle]
pub unsafe extern "C" fn zh_cookie(
    req: *mut zh_request,
    name: *const c_char,
    len: *mut usize,
) -> *const c_char {
    named(req, name, len, Request::cookie)
}

/// Adds the header `name: value` to the client's answer (HTTP only), e.g. `Location` with
/// a 303 or `Set-Cookie`; a `Content-Type` replaces the route's. Returns 0, or 500 for a
/// name that is not a header name or one the gateway sets (`Content-Length`,
/// `Connection`, ...), a value with a line break, a 65th header, or one that does not fit
/// the slot beside the body (nothing changes; zh_last_error says which); 400 for a NULL or
/// non-UTF-8 `name` or `value`. The header rides in the slot before the body, which moves up:
/// a pointer from zh_body is stale afterwards (call zh_body again).
///
/// # Safety
///
/// Every pointer is NULL or valid as zerohop.h says (the request for the handler call
/// that got it, strings NUL-terminated, buffers as long as their lengths).
#[no_mangle]
pub unsafe extern "C" fn zh_add_response_header(
    req: *mut zh_request,
    name: *const c_char,
    value: *const c_char,
) -> u16 {
    let Some(r) = request(req) else { return 500 };
    let (Some(name), Some(value)) = (text(name), text(value)) else {
        return r.remember(
            400,
            "zh_add_response_header: the name or the value is NULL or not UTF-8",
        );
    };
    let result = r.req().add_response_header(name, value);
    r.result(result)
}

/// Sets the answer's status for the client: 200 (the default) to 399, except 204, 205 and
/// 304 (errors are zh_fail's). With a 3xx, add a `Location` (zh_add_response_header).
/// Returns 0, or 500 for a status outside that range (nothing changes).
///
/// # Safety
///
/// Every pointer is NULL or valid as zerohop.h says (the request for the handler call
/// that got it, strings NUL-terminated, buffers as long as their lengths).
#[no_mangle]
pub unsafe extern "C" fn zh_set_status(req: *mut zh_request, status: u16) -> u16 {
    let Some(r) = request(req) else { return 500 };
    let result = r.req().set_status(status);
    r.result(result)
}
