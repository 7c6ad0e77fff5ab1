//! The gateway's CoAP message code (`zerohop-gateway`, `coap/message.rs`,
//! `coap/blockwise.rs`, `coap/exchanges.rs`, `coap/reachability.rs`) on arbitrary datagrams
//! from four client addresses, one of them verified.
//!
//! The input is a run of datagrams, each `[peer, length, bytes...]`; the low two bits of
//! `peer` pick the sender, its high four bits how many seconds pass before it.
//!
//! Checked (in `zerohop_gateway::fuzzing::coap`): nothing panics; tokens are at most 8
//! bytes; an unverified address never gets more bytes back than its datagram carried; Block
//! options re-encode to what they decoded from; an assembled body is at most `max_body`;
//! the deduplication table holds its bound; every response decodes to the message id,
//! token, code and payload it was encoded with.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    zerohop_gateway::fuzzing::coap(data);
});
