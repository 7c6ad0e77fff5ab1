//! The peer handshake (`zerohop_link::auth`) against an attacker without the
//! key who talks to two sessions of one node at once: one the node dialed (it is the
//! client there), one it accepted (the server), as in the reflection attack of issue 30.
//!
//! The input is the attacker's script, one operation after another; between operations
//! both sessions run as far as they can, and the attacker keeps what the node wrote in each
//! (its hello, then its tag):
//!
//! ```text
//! op & 3 == 0   literal:  n = next % 64, then n bytes to send to session (op >> 2) & 1
//! op & 3 == 1   copy:     offset, n = next % 64: bytes the node wrote in session
//!                         (op >> 3) & 1, from offset, to session (op >> 2) & 1
//! op & 3 == 2   copy both of a session's messages as they are (hello, then tag once made)
//!               from session (op >> 3) & 1 to (op >> 2) & 1
//! op & 3 == 3   end: no more bytes to session (op >> 2) & 1
//! ```
//!
//! Then both sessions are told the attacker is done. Checked: nothing panics; each session
//! ends (reads nothing past its hello and tag, so the end of input ends it); neither
//! accepts, whatever was copied between them; a session whose peer hello did not start with
//! the protocol's preamble says so.

#![no_main]

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use libfuzzer_sys::fuzz_target;
use tokio::io::{duplex, AsyncRead, AsyncWrite, DuplexStream, ReadBuf};
use zerohop_link::auth::{authenticate, AuthFailure, Role, Secret, HELLO_LEN, MAGIC, TAG_LEN};

type Session<'a> = Pin<Box<dyn Future<Output = Result<(), AuthFailure>> + 'a>>;

/// The attacker's end of one session.
struct Far {
    io: DuplexStream,
    /// What the node wrote so far.
    heard: Vec<u8>,
    /// What the attacker sent so far.
    said: Vec<u8>,
    ended: bool,
}

impl Far {
    /// Takes what the node wrote; whether there was anything.
    fn listen(&mut self, cx: &mut Context<'_>) -> bool {
        let before = self.heard.len();
        let mut buf = [0u8; 256];
        loop {
            let mut rb = ReadBuf::new(&mut buf);
            match Pin::new(&mut self.io).poll_read(cx, &mut rb) {
                Poll::Ready(Ok(())) if !rb.filled().is_empty() => {
                    self.heard.extend_from_slice(rb.filled())
                }
                _ => return self.heard.len() > before,
            }
        }
    }

    fn say(&mut self, cx: &mut Context<'_>, mut bytes: &[u8]) {
        if self.ended {
            return;
        }
        while !bytes.is_empty() {
            match Pin::new(&mut self.io).poll_write(cx, bytes) {
                Poll::Ready(Ok(n)) if n > 0 => {
                    self.said.extend_from_slice(&bytes[..n]);
                    bytes = &bytes[n..];
                }
                // Full (the node reads no more than its handshake) or closed.
                _ => return,
            }
        }
    }

    fn end(&mut self, cx: &mut Context<'_>) {
        if !self.ended {
            let _ = Pin::new(&mut self.io).poll_shutdown(cx);
            self.ended = true;
        }
    }
}

/// The node under attack: one `Secret`, hence one node id, for both its sessions (made once:
/// a fresh one per input would only cost time).
static NODE: std::sync::LazyLock<Secret> =
    std::sync::LazyLock::new(|| Secret::new(b"the cluster's peer secret, 32 B!"));

fuzz_target!(|data: &[u8]| {
    let node = &*NODE;
    let (mut dialed, far0) = duplex(4096);
    let (mut accepted, far1) = duplex(4096);
    let mut far = [far0, far1].map(|io| Far {
        io,
        heard: Vec::new(),
        said: Vec::new(),
        ended: false,
    });
    let mut sessions: [Option<Session<'_>>; 2] = [
        Some(Box::pin(authenticate(&mut dialed, node, Role::Client))),
        Some(Box::pin(authenticate(&mut accepted, node, Role::Server))),
    ];
    let mut outcome: [Option<Result<(), AuthFailure>>; 2] = [None, None];
    let mut cx = Context::from_waker(Waker::noop());

    let mut run = |far: &mut [Far; 2], cx: &mut Context<'_>| {
        // Each session does a bounded number of steps; a few rounds reach the point where
        // both wait for the attacker. A round in which no session ended and the node wrote
        // nothing leaves everything as it was (a pending session waits for bytes only the
        // attacker can send), so the rounds after it would do nothing either; once both
        // sessions ended (and what they wrote was heard) there is nothing left to run. This
        // was most of the time per input, spent in rounds that changed nothing.
        for _ in 0..6 {
            let mut changed = false;
            for i in 0..2 {
                if let Some(s) = sessions[i].as_mut() {
                    if let Poll::Ready(r) = s.as_mut().poll(cx) {
                        outcome[i] = Some(r);
                        sessions[i] = None;
                        changed = true;
                    }
                    changed |= far[i].listen(cx);
                }
            }
            if !changed {
                break;
            }
        }
        sessions.iter().all(Option::is_none)
    };

    run(&mut far, &mut cx);
    let mut rest = data;
    while let Some((&op, tail)) = rest.split_first() {
        rest = tail;
        let to = usize::from((op >> 2) & 1);
        let from = usize::from((op >> 3) & 1);
        match op & 3 {
            0 => {
                let n = rest.first().map_or(0, |b| usize::from(b % 64));
                let bytes = rest.get(1..1 + n).unwrap_or(rest.get(1..).unwrap_or(&[]));
                let bytes = bytes.to_vec();
                rest = &rest[(1 + bytes.len()).min(rest.len())..];
                far[to].say(&mut cx, &bytes);
            }
            1 => {
                let (off, n) = match rest {
                    [off, n, ..] => (usize::from(*off), usize::from(n % 64)),
                    _ => break,
                };
                rest = &rest[2..];
                let heard = &far[from].heard;
                let bytes = heard
                    .get(off.min(heard.len())..(off + n).min(heard.len()))
                    .unwrap_or(&[])
                    .to_vec();
                far[to].say(&mut cx, &bytes);
            }
            2 => {
                let bytes = far[from].heard.clone();
                far[to].say(&mut cx, &bytes);
            }
            _ => far[to].end(&mut cx),
        }
        run(&mut far, &mut cx);
    }
    for f in &mut far {
        f.end(&mut cx);
    }
    assert!(
        run(&mut far, &mut cx),
        "a session still runs after its input ended"
    );

    for (i, r) in outcome.iter().enumerate() {
        match r {
            Some(Ok(())) => panic!(
                "session {i} accepted an attacker without the key: it sent {:?}",
                far[i].said
            ),
            Some(Err(AuthFailure::WrongMagic)) => {
                assert!(far[i].said.len() >= HELLO_LEN);
                assert_ne!(&far[i].said[..MAGIC.len()], MAGIC);
            }
            Some(Err(AuthFailure::WrongSecret)) => {
                assert!(far[i].said.len() >= HELLO_LEN + TAG_LEN);
            }
            Some(Err(_)) => {}
            None => unreachable!("checked above"),
        }
        // The node wrote its hello, and its tag only after a well-formed hello.
        let heard = far[i].heard.len();
        assert!(
            heard == HELLO_LEN || heard == HELLO_LEN + TAG_LEN,
            "{heard}"
        );
        if heard > HELLO_LEN {
            assert!(far[i].said.len() >= HELLO_LEN);
        }
    }
});
