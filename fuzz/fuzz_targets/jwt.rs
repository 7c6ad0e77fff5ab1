//! The gateway's JWT check (`zerohop-gateway`, `access/jwt.rs`) on arbitrary bytes: as a JWKS
//! document (first byte odd) or as a bearer token against a fixed key set (even).
//!
//! Checked (in `zerohop_gateway::fuzzing::jwt`): nothing panics; no token passes (nobody holds
//! the key's private half, and `none` or shared-secret algorithms are never accepted); a token
//! over 8 KiB is refused for its length before it is decoded; a JWKS that parses holds 1 to 64
//! keys.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    zerohop_gateway::fuzzing::jwt(data);
});
