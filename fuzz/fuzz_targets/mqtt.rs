//! The listening gateway's MQTT codec (`zerohop-gateway`, `mqtt/codec.rs`) on arbitrary bytes
//! from a client, and the subscription index answers are matched in
//! (`mqtt/subscriptions.rs`).
//!
//! The input is one connection's bytes: read as the gateway reads them (CONNECT, then packet
//! after packet at its level) and at both levels without a CONNECT; SUBSCRIBE and UNSUBSCRIBE
//! filters go into an index, PUBLISH topics are matched in it.
//!
//! Checked (in `zerohop_gateway::fuzzing::mqtt`): nothing panics; an incomplete packet takes
//! nothing; every packet takes at least its header; topic names hold the codec's limits; the
//! index agrees with the plain matching rule and its work is bounded by the nodes on matching
//! paths plus the matching subscriptions; whatever `mqttbytes` decodes re-encodes to bytes
//! that decode to the same packet and encode again identically (canonical).

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    zerohop_gateway::fuzzing::mqtt(data);
});
