//! gRPC's length-prefixed messages: a unary request body holds exactly one, and the answer
//! is one.
//!
//! ```text
//! +------------+----------------------+-------------------+
//! | compressed |  length (u32, BE)    |  message (length) |
//! |   1 byte   |       4 bytes        |                   |
//! +------------+----------------------+-------------------+
//! ```
//!
//! The request's message is cut out of hyper's chunks as they arrive, as slices of them (no
//! copy; [`Unframe`]): the one copy in stays the gateway's copy into the slot, also for a
//! message streamed into a large slot. The work is bounded by the number of chunks, whatever
//! the length prefix claims.

use bytes::Bytes;
use http::StatusCode;

use crate::{ErrorSource, GatewayError};

/// Bytes before a message: the compressed flag and the length.
pub(crate) const PREFIX: usize = 5;

/// What is wrong with a unary request body.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum FrameError {
    /// The body holds no message at all (a unary call has exactly one).
    #[error("the request holds no message")]
    NoMessage,
    /// The body ends inside a message's prefix or its bytes.
    #[error("the request message is cut short: {have} of {want} bytes")]
    Truncated {
        /// Bytes the prefix (or the message) needs.
        want: u64,
        /// Bytes there are.
        have: u64,
    },
    /// The message is compressed (flag 1): the gateway announces no compression.
    #[error("compression is not supported")]
    Compressed,
    /// The flag byte is neither 0 nor 1.
    #[error("the compressed flag is {0}, neither 0 nor 1")]
    BadFlag(u8),
    /// A second message follows the first: a client- or bidi-streaming call.
    #[error("streaming is not supported")]
    Streaming,
}

impl FrameError {
    /// The error answer: UNIMPLEMENTED (501) for what the gateway does not do, INTERNAL (500)
    /// for a body that is no gRPC framing, as gRPC servers answer them.
    pub(crate) fn into_gateway(self) -> GatewayError {
        let status = match self {
            FrameError::Compressed | FrameError::Streaming => StatusCode::NOT_IMPLEMENTED,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        GatewayError::new(status, ErrorSource::Gateway, self.to_string())
    }
}

/// The one message of a unary request body (hyper's chunks), as slices of the chunks.
pub(crate) fn message(chunks: Vec<Bytes>) -> Result<Vec<Bytes>, FrameError> {
    let mut unframe = Unframe::default();
    let mut out = Vec::with_capacity(chunks.len());
    for c in chunks {
        let m = unframe.push(c)?;
        if !m.is_empty() {
            out.push(m);
        }
    }
    unframe.finish()?;
    Ok(out)
}

/// Takes the one message out of a unary request body as its chunks arrive, so a body can
/// be streamed into a slot without its prefix: each chunk gives back the part of it that is
/// message (a slice, no copy). Refuses a compressed or second message as soon as it shows.
#[derive(Debug, Default)]
pub(crate) struct Unframe {
    /// The prefix so far.
    prefix: [u8; PREFIX],
    /// Bytes of the prefix seen (up to [`PREFIX`]).
    got: usize,
    /// The message's length, once the prefix is in.
    len: Option<u64>,
    /// Message bytes seen.
    taken: u64,
    /// Bytes seen after the message (the start of a second one).
    after: u64,
}

impl Unframe {
    /// The message's length, once its prefix arrived.
    pub(crate) fn message_len(&self) -> Option<u64> {
        self.len
    }

    /// The part of `chunk` that is message.
    pub(crate) fn push(&mut self, mut chunk: Bytes) -> Result<Bytes, FrameError> {
        if self.len.is_none() {
            let n = (PREFIX - self.got).min(chunk.len());
            self.prefix[self.got..self.got + n].copy_from_slice(&chunk[..n]);
            self.got += n;
            let _ = chunk.split_to(n);
            if self.got < PREFIX {
                return Ok(Bytes::new());
            }
            match self.prefix[0] {
                0 => {}
                1 => return Err(FrameError::Compressed),
                f => return Err(FrameError::BadFlag(f)),
            }
            let [_, a, b, c, d] = self.prefix;
            self.len = Some(u64::from(u32::from_be_bytes([a, b, c, d])));
        }
        let len = self.len.unwrap_or(0);
        let take = (len - self.taken).min(chunk.len() as u64) as usize;
        let rest = chunk.split_off(take);
        self.taken += take as u64;
        self.after += rest.len() as u64;
        if self.after >= PREFIX as u64 {
            // The start of a next message: a call that streams.
            return Err(FrameError::Streaming);
        }
        Ok(chunk)
    }

    /// Whether the body ended where its message does.
    pub(crate) fn finish(&self) -> Result<(), FrameError> {
        let Some(len) = self.len else {
            return Err(match self.got {
                0 => FrameError::NoMessage,
                have => FrameError::Truncated {
                    want: PREFIX as u64,
                    have: have as u64,
                },
            });
        };
        if self.taken < len {
            return Err(FrameError::Truncated {
                want: len,
                have: self.taken,
            });
        }
        match self.after {
            0 => Ok(()),
            n => Err(FrameError::Truncated {
                want: PREFIX as u64,
                have: n,
            }),
        }
    }
}

/// The prefix of an uncompressed message of `len` bytes.
pub(crate) fn prefix(len: usize) -> [u8; PREFIX] {
    let [a, b, c, d] = u32::try_from(len).unwrap_or(u32::MAX).to_be_bytes();
    [0, a, b, c, d]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn framed(flag: u8, msg: &[u8]) -> Vec<u8> {
        let mut v = vec![flag];
        v.extend_from_slice(&(msg.len() as u32).to_be_bytes());
        v.extend_from_slice(msg);
        v
    }

    /// `bytes` cut into chunks at `cuts`.
    fn chunks(bytes: &[u8], cuts: &[usize]) -> Vec<Bytes> {
        let mut out = Vec::new();
        let mut at = 0;
        for &c in cuts.iter().chain([&bytes.len()]) {
            out.push(Bytes::copy_from_slice(&bytes[at..c]));
            at = c;
        }
        out
    }

    #[test]
    fn the_message_is_cut_out_of_any_chunking_without_its_prefix() {
        let body = framed(0, b"\x0a\x05world");
        for cuts in [
            &[][..],
            &[1],
            &[5],
            &[3, 6],
            &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11],
        ] {
            let m = message(chunks(&body, cuts)).unwrap();
            assert_eq!(m.concat(), b"\x0a\x05world", "cuts {cuts:?}");
            assert!(m.iter().all(|c| !c.is_empty()), "cuts {cuts:?}");
        }
        // An empty message (a request with every field at its default) is a message.
        assert!(message(chunks(&framed(0, b""), &[2]))
            .unwrap()
            .concat()
            .is_empty());
    }

    #[test]
    fn bad_framing_is_refused_with_what_is_wrong() {
        let one = framed(0, b"abc");
        let two = [framed(0, b"abc"), framed(0, b"d")].concat();
        for (body, want) in [
            (vec![], FrameError::NoMessage),
            (vec![0, 0, 0], FrameError::Truncated { want: 5, have: 3 }),
            (
                one[..6].to_vec(),
                FrameError::Truncated { want: 3, have: 1 },
            ),
            (framed(1, b"abc"), FrameError::Compressed),
            (framed(7, b"abc"), FrameError::BadFlag(7)),
            (two, FrameError::Streaming),
            (
                [&one[..], &[0, 0]].concat(),
                FrameError::Truncated { want: 5, have: 2 },
            ),
            // A length far past the body costs nothing.
            (
                vec![0, 0xff, 0xff, 0xff, 0xff, 1],
                FrameError::Truncated {
                    want: u32::MAX as u64,
                    have: 1,
                },
            ),
        ] {
            assert_eq!(message(chunks(&body, &[])), Err(want.clone()), "{body:?}");
        }
        assert_eq!(
            FrameError::Compressed.into_gateway().status,
            StatusCode::NOT_IMPLEMENTED
        );
        assert_eq!(
            FrameError::NoMessage.into_gateway().status,
            StatusCode::INTERNAL_SERVER_ERROR
        );
    }

    #[test]
    fn the_answer_prefix_is_an_uncompressed_big_endian_length() {
        assert_eq!(prefix(0), [0, 0, 0, 0, 0]);
        assert_eq!(prefix(0x0102_0304), [0, 1, 2, 3, 4]);
    }
}
