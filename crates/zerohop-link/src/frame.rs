//! The frames daemons exchange on a peer connection: one connection per pair of nodes,
//! carrying many requests at once, each named by a stream number the caller picks.
//!
//! ```text
//! frame  = len:u32 kind:u8 stream:u64 body           (little-endian; len counts kind..end)
//! CALL   body = chain:str16 function:str16 deadline_ms:u32 route:u16 hop:u8 flags:u8
//!               meta:bytes32 payload:bytes32
//! ANSWER body = status:u16 flags:u8 payload:bytes32
//! PING / PONG  body = (empty)
//! str16  = n:u16 then n bytes of UTF-8;  bytes32 = n:u32 then n bytes
//! ```
//!
//! A CALL asks the peer to run `function` of its part of `chain` on `payload` (with the
//! slot's metadata area `meta`, the request's route and position in it) within
//! `deadline_ms`; exactly one ANSWER with the same stream comes back. Its flags say how the
//! caller goes on ([`Answer::LEFT`]: the request left its route's sequence on the peer, so
//! the output goes to the client; unknown bits are carried, not refused). A peer is
//! authenticated, but what it sends is still input: every length is checked against the
//! frame and against [`MAX_FRAME`] before anything is allocated.

/// The largest frame accepted: a slot's payload (slots are at most 64 MiB) plus headers.
pub const MAX_FRAME: usize = (64 << 20) + 4096;

/// Frame kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// Run a function.
    Call = 1,
    /// The result of a call.
    Answer = 2,
    /// Are you there?
    Ping = 3,
    /// Yes.
    Pong = 4,
}

/// A call: one hop of a request to a function the peer runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Call {
    /// The chain's name on the peer (its part of the same replica).
    pub chain: String,
    /// The function to run.
    pub function: String,
    /// Milliseconds the request has left.
    pub deadline_ms: u32,
    /// The route the request entered by.
    pub route: u16,
    /// Its position in the route.
    pub hop: u8,
    /// The slot header's flags.
    pub flags: u8,
    /// The slot's metadata area (the headers the chain's functions asked for).
    pub meta: Vec<u8>,
    /// The request's payload.
    pub payload: Vec<u8>,
}

/// The answer to a call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    /// 0 or 200: the function's output; else the status of its error.
    pub status: u16,
    /// [`Answer::LEFT`], other bits reserved (sent as 0, carried as received).
    pub flags: u8,
    /// The output, or the error's message.
    pub payload: Vec<u8>,
}

impl Answer {
    /// The request left its route's sequence on the peer (dynamic routing or an early
    /// reply): the caller must answer the client with this output instead of continuing.
    pub const LEFT: u8 = 1;
}

/// A decoded frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Frame {
    /// See [`Call`].
    Call(u64, Call),
    /// See [`Answer`].
    Answer(u64, Answer),
    /// Keep-alive probe.
    Ping(u64),
    /// Its reply.
    Pong(u64),
}

/// Why a frame is refused.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// Longer than [`MAX_FRAME`] or shorter than its fixed part.
    #[error("a frame of {0} bytes (at most {MAX_FRAME})")]
    Size(usize),
    /// An unknown kind byte.
    #[error("unknown frame kind {0}")]
    Kind(u8),
    /// A length inside the frame passes its end.
    #[error("a field of the frame runs past its end")]
    Truncated,
    /// Bytes left after the last field.
    #[error("{0} bytes after the frame's last field")]
    Trailing(usize),
    /// A name that is not UTF-8.
    #[error("a name that is not UTF-8")]
    Utf8,
}

impl Call {
    /// The length of its frame's body (what the length word counts), as [`Frame::encode`]
    /// writes it: kind, stream, chain, function, deadline, route, hop, flags, meta, payload.
    pub fn body_len(&self) -> usize {
        1 + 8
            + (2 + self.chain.len() + 2 + self.function.len())
            + (4 + 2 + 1 + 1)
            + (4 + self.meta.len() + 4 + self.payload.len())
    }
}

impl Answer {
    /// The length of its frame's body: kind, stream, status, flags, payload.
    pub fn body_len(&self) -> usize {
        1 + 8 + 2 + 1 + 4 + self.payload.len()
    }
}

impl Frame {
    /// Appends the frame's bytes, length first, to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let start = out.len();
        out.extend_from_slice(&[0; 4]);
        let (kind, stream) = match self {
            Frame::Call(s, _) => (Kind::Call, *s),
            Frame::Answer(s, _) => (Kind::Answer, *s),
            Frame::Ping(s) => (Kind::Ping, *s),
            Frame::Pong(s) => (Kind::Pong, *s),
        };
        out.push(kind as u8);
        out.extend_from_slice(&stream.to_le_bytes());
        match self {
            Frame::Call(_, c) => {
                str16(out, &c.chain);
                str16(out, &c.function);
                out.extend_from_slice(&c.deadline_ms.to_le_bytes());
                out.extend_from_slice(&c.route.to_le_bytes());
                out.push(c.hop);
                out.push(c.flags);
                bytes32(out, &c.meta);
                bytes32(out, &c.payload);
            }
            Frame::Answer(_, a) => {
                out.extend_from_slice(&a.status.to_le_bytes());
                out.push(a.flags);
                bytes32(out, &a.payload);
            }
            Frame::Ping(_) | Frame::Pong(_) => {}
        }
        let len = (out.len() - start - 4) as u32;
        out[start..start + 4].copy_from_slice(&len.to_le_bytes());
    }

    /// Decodes one frame's body (what follows its length word).
    pub fn decode(body: &[u8]) -> Result<Frame, FrameError> {
        if body.len() < 9 || body.len() > MAX_FRAME {
            return Err(FrameError::Size(body.len()));
        }
        let mut r = Reader { b: &body[9..] };
        let stream = u64::from_le_bytes(body[1..9].try_into().expect("8 bytes"));
        let frame = match body[0] {
            k if k == Kind::Call as u8 => Frame::Call(
                stream,
                Call {
                    chain: r.str16()?,
                    function: r.str16()?,
                    deadline_ms: u32::from_le_bytes(r.take(4)?.try_into().expect("4")),
                    route: u16::from_le_bytes(r.take(2)?.try_into().expect("2")),
                    hop: r.take(1)?[0],
                    flags: r.take(1)?[0],
                    meta: r.bytes32()?,
                    payload: r.bytes32()?,
                },
            ),
            k if k == Kind::Answer as u8 => Frame::Answer(
                stream,
                Answer {
                    status: u16::from_le_bytes(r.take(2)?.try_into().expect("2")),
                    flags: r.take(1)?[0],
                    payload: r.bytes32()?,
                },
            ),
            k if k == Kind::Ping as u8 => Frame::Ping(stream),
            k if k == Kind::Pong as u8 => Frame::Pong(stream),
            k => return Err(FrameError::Kind(k)),
        };
        if !r.b.is_empty() {
            return Err(FrameError::Trailing(r.b.len()));
        }
        Ok(frame)
    }

    /// The length a frame announces in its first four bytes, checked against
    /// [`MAX_FRAME`].
    pub fn announced(head: [u8; 4]) -> Result<usize, FrameError> {
        let n = u32::from_le_bytes(head) as usize;
        if !(9..=MAX_FRAME).contains(&n) {
            return Err(FrameError::Size(n));
        }
        Ok(n)
    }
}

fn str16(out: &mut Vec<u8>, s: &str) {
    let b = &s.as_bytes()[..s.len().min(u16::MAX as usize)];
    out.extend_from_slice(&(b.len() as u16).to_le_bytes());
    out.extend_from_slice(b);
}

fn bytes32(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u32).to_le_bytes());
    out.extend_from_slice(b);
}

struct Reader<'a> {
    b: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], FrameError> {
        if self.b.len() < n {
            return Err(FrameError::Truncated);
        }
        let (head, rest) = self.b.split_at(n);
        self.b = rest;
        Ok(head)
    }

    fn str16(&mut self) -> Result<String, FrameError> {
        let n = u16::from_le_bytes(self.take(2)?.try_into().expect("2")) as usize;
        String::from_utf8(self.take(n)?.to_vec()).map_err(|_| FrameError::Utf8)
    }

    fn bytes32(&mut self) -> Result<Vec<u8>, FrameError> {
        let n = u32::from_le_bytes(self.take(4)?.try_into().expect("4")) as usize;
        Ok(self.take(n)?.to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call() -> Frame {
        Frame::Call(
            7,
            Call {
                chain: "default_hello_0".into(),
                function: "exclaim".into(),
                deadline_ms: 9_500,
                route: 1,
                hop: 2,
                flags: 0,
                meta: b"x-request-id\0abc\0".to_vec(),
                payload: b"HELLO WORLD".to_vec(),
            },
        )
    }

    #[test]
    fn frames_round_trip() {
        for f in [
            call(),
            Frame::Answer(
                7,
                Answer {
                    status: 0,
                    flags: 0,
                    payload: b"HELLO WORLD!".to_vec(),
                },
            ),
            Frame::Answer(
                8,
                Answer {
                    status: 502,
                    flags: Answer::LEFT,
                    payload: Vec::new(),
                },
            ),
            Frame::Ping(1),
            Frame::Pong(1),
        ] {
            let mut out = Vec::new();
            f.encode(&mut out);
            let n = Frame::announced(out[..4].try_into().unwrap()).unwrap();
            assert_eq!(n, out.len() - 4);
            assert_eq!(Frame::decode(&out[4..]).unwrap(), f);
            // The sizes callers check before encoding are what encoding writes.
            match &f {
                Frame::Call(_, c) => assert_eq!(c.body_len(), n),
                Frame::Answer(_, a) => assert_eq!(a.body_len(), n),
                Frame::Ping(_) | Frame::Pong(_) => {}
            }
        }
    }

    #[test]
    fn answer_flags_follow_the_status() {
        let mut out = Vec::new();
        Frame::Answer(
            3,
            Answer {
                status: 200,
                flags: Answer::LEFT,
                payload: b"ok".to_vec(),
            },
        )
        .encode(&mut out);
        // len kind stream | status flags | n payload
        assert_eq!(out[4 + 9..4 + 9 + 3], [200, 0, Answer::LEFT]);
        assert_eq!(out[4 + 9 + 3..4 + 9 + 3 + 4], 2u32.to_le_bytes());
        assert_eq!(out.len(), 4 + 9 + 3 + 4 + 2);
        // Every cut of an answer is refused too.
        for cut in 0..out.len() - 4 {
            assert!(Frame::decode(&out[4..4 + cut]).is_err(), "cut at {cut}");
        }
    }

    #[test]
    fn every_cut_and_every_wrong_length_is_refused() {
        let mut out = Vec::new();
        call().encode(&mut out);
        let body = &out[4..];
        for cut in 0..body.len() {
            assert!(Frame::decode(&body[..cut]).is_err(), "cut at {cut}");
        }
        let mut longer = body.to_vec();
        longer.push(0);
        assert_eq!(Frame::decode(&longer), Err(FrameError::Trailing(1)));
        let mut kind = body.to_vec();
        kind[0] = 9;
        assert_eq!(Frame::decode(&kind), Err(FrameError::Kind(9)));
        // A payload length that claims more than the frame holds.
        let mut lie = body.to_vec();
        let at = lie.len() - 11 - 4;
        lie[at..at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(Frame::decode(&lie), Err(FrameError::Truncated));
        assert!(Frame::announced(u32::MAX.to_le_bytes()).is_err());
        assert!(Frame::announced(3u32.to_le_bytes()).is_err());
    }
}
