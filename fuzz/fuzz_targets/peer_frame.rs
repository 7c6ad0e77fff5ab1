//! The peer connection's frames (`zerohop_link::frame`) on arbitrary bytes
//! from an authenticated peer.
//!
//! The input is read as the connection's reader reads it: a length word checked by
//! `Frame::announced`, then that many bytes given to `Frame::decode`, frame after frame
//! until the input runs out or a length is refused. The whole input is also decoded as one
//! body, to reach the size checks of `decode` itself.
//!
//! Checked: nothing panics; a refused length is out of `9..=MAX_FRAME`; whatever decodes
//! encodes back to exactly the bytes it came from (the encoding is canonical), with a length
//! word `announced` accepts, and decodes again to the same frame.

#![no_main]

use libfuzzer_sys::fuzz_target;
use zerohop_link::frame::{Frame, MAX_FRAME};

fn round_trip(body: &[u8]) {
    let Ok(frame) = Frame::decode(body) else {
        return;
    };
    let mut out = Vec::new();
    frame.encode(&mut out);
    let head: [u8; 4] = out[..4].try_into().expect("a length word");
    let n = Frame::announced(head).expect("an encoded frame's length is accepted");
    assert_eq!(n, out.len() - 4);
    assert_eq!(&out[4..], body, "the encoding is not canonical: {frame:?}");
    assert_eq!(Frame::decode(&out[4..]).as_ref(), Ok(&frame));
}

fuzz_target!(|data: &[u8]| {
    round_trip(data);
    let mut rest = data;
    while rest.len() >= 4 {
        let head: [u8; 4] = rest[..4].try_into().expect("4 bytes");
        let n = match Frame::announced(head) {
            Ok(n) => n,
            Err(_) => {
                let n = u32::from_le_bytes(head) as usize;
                assert!(!(9..=MAX_FRAME).contains(&n), "{n} refused");
                return;
            }
        };
        assert!((9..=MAX_FRAME).contains(&n));
        let Some(body) = rest.get(4..4 + n) else {
            return;
        };
        round_trip(body);
        rest = &rest[4 + n..];
    }
});
