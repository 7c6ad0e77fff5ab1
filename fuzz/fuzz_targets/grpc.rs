//! The gateway's gRPC framing (`zerohop-gateway`, `grpc/frame.rs`, `grpc/status.rs`,
//! `grpc/mod.rs`) on arbitrary unary request bodies, cut into chunks as hyper might hand
//! them over.
//!
//! The input is `[n, n chunk lengths, body]` (`n` modulo 8; the last chunk is the rest).
//!
//! Checked (in `zerohop_gateway::fuzzing::grpc`): nothing panics; a message is taken only
//! from a body that is exactly one uncompressed length-prefixed message, and it is the body
//! without its 5-byte prefix, however it was chunked; anything else is refused as INTERNAL or
//! UNIMPLEMENTED; any text becomes a `grpc-message` of visible ASCII; `grpc-timeout`
//! parsing takes any bytes.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    zerohop_gateway::fuzzing::grpc(data);
});
