//! The gateway's HTTP/2 ingress on arbitrary bytes from a client that speaks HTTP/2 with
//! prior knowledge: the input follows the connection preface (the chain and the connection:
//! `common/http_chain.rs`).
//!
//! Checked: the connection ends (no hang); what comes back is whole HTTP/2 frames, the first
//! the server's SETTINGS on stream 0, none larger than the 16 KiB a client accepts until it
//! says otherwise (unless the input's SETTINGS raised it); and no slot or in-flight entry
//! outlives its connection.

#![no_main]

#[path = "common/http_chain.rs"]
mod http_chain;

use std::sync::OnceLock;

use http_chain::{assert_quiet, exchange, Chain};
use libfuzzer_sys::fuzz_target;

/// What an HTTP/2 client sends first (RFC 9113 3.4).
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// SETTINGS_MAX_FRAME_SIZE until a client's SETTINGS change it (RFC 9113 6.5.2).
const DEFAULT_MAX_FRAME: usize = 16_384;
const SETTINGS: u8 = 0x4;

fn chain() -> &'static Chain {
    static CHAIN: OnceLock<Chain> = OnceLock::new();
    CHAIN.get_or_init(|| Chain::start("fuzz-http2", || {}))
}

fuzz_target!(|data: &[u8]| {
    let c = chain();
    let mut input = H2_PREFACE.to_vec();
    input.extend_from_slice(data);
    let answer = exchange(c, &input);
    // The input's SETTINGS may allow larger frames (id 0x5); then sizes are not checked.
    let raised = data.windows(2).any(|w| w == [0x00, 0x05]);
    let mut at = 0;
    let mut first = true;
    while at < answer.len() {
        let header = answer
            .get(at..at + 9)
            .unwrap_or_else(|| panic!("a cut frame header at {at} of {}", answer.len()));
        let len =
            usize::from(header[0]) << 16 | usize::from(header[1]) << 8 | usize::from(header[2]);
        let stream = u32::from_be_bytes([header[5], header[6], header[7], header[8]]) & 0x7fff_ffff;
        if first {
            assert!(
                header[3] == SETTINGS && stream == 0,
                "the server did not start with its SETTINGS: {header:?}"
            );
            first = false;
        }
        assert!(raised || len <= DEFAULT_MAX_FRAME, "a frame of {len} bytes");
        at += 9 + len;
        assert!(at <= answer.len(), "a cut frame: {at} of {}", answer.len());
    }
    assert_quiet(c);
});
