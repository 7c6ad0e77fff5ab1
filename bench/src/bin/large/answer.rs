//! The bodies the benchmark sends and the check of each answer as it streams in.

use anyhow::{bail, ensure, Result};
use bytes::Bytes;

/// The answer is checked at every `CHECK_STRIDE`-th byte (a prime, so the samples fall at
/// every offset within pages and chunks), besides its length and last byte.
pub const CHECK_STRIDE: usize = 1021;

/// A body of `len` lower-case letters and spaces (pseudo-random, the same every run), so
/// that upper-casing changes most bytes.
pub fn make_body(len: usize) -> Bytes {
    const ALPHABET: &[u8; 32] = b"abcdefghijklmnopqrstuvwxyz .,-;:";
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut body = Vec::with_capacity(len);
    while body.len() < len {
        // xorshift64: eight bytes of choices per step.
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        for b in x.to_le_bytes() {
            if body.len() < len {
                body.push(ALPHABET[usize::from(b) % ALPHABET.len()]);
            }
        }
    }
    Bytes::from(body)
}

/// Checks an answer to `body` chunk by chunk as it arrives, without keeping it: it must be
/// `upper(body) + "!"`; every [`CHECK_STRIDE`]-th byte is compared, and the length and the
/// last byte always.
pub struct AnswerCheck<'a> {
    body: &'a [u8],
    seen: usize,
    last: Option<u8>,
    wrong: Option<String>,
}

impl<'a> AnswerCheck<'a> {
    pub fn new(body: &'a [u8]) -> Self {
        Self {
            body,
            seen: 0,
            last: None,
            wrong: None,
        }
    }

    pub fn feed(&mut self, chunk: &[u8]) {
        let Some(&last) = chunk.last() else { return };
        if self.wrong.is_none() {
            let first = self.seen.div_ceil(CHECK_STRIDE) * CHECK_STRIDE;
            for at in (first..self.seen + chunk.len()).step_by(CHECK_STRIDE) {
                let got = chunk[at - self.seen];
                let want = match self.body.get(at) {
                    Some(b) => b.to_ascii_uppercase(),
                    None if at == self.body.len() => b'!',
                    None => break,
                };
                if got != want {
                    self.wrong = Some(format!(
                        "byte {at} is {:?}, expected {:?}",
                        got as char, want as char
                    ));
                    break;
                }
            }
        }
        self.seen += chunk.len();
        self.last = Some(last);
    }

    pub fn finish(self) -> Result<()> {
        if let Some(wrong) = self.wrong {
            bail!("wrong answer: {wrong}");
        }
        let want = self.body.len() + 1;
        ensure!(
            self.seen == want,
            "wrong answer: {} bytes, expected {want}",
            self.seen
        );
        ensure!(
            self.last == Some(b'!'),
            "wrong answer: it does not end with `!`"
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn upper_bang(body: &[u8]) -> Vec<u8> {
        let mut a = body.to_ascii_uppercase();
        a.push(b'!');
        a
    }

    /// Feeds `answer` in chunks of `size` and returns the verdict.
    fn verdict(body: &[u8], answer: &[u8], size: usize) -> Result<()> {
        let mut c = AnswerCheck::new(body);
        for chunk in answer.chunks(size) {
            c.feed(chunk);
        }
        c.finish()
    }

    #[test]
    fn a_right_answer_passes_however_it_is_cut() {
        let body = make_body(10_000);
        let answer = upper_bang(&body);
        for size in [1, 7, 1021, 1022, 4096, 20_000] {
            verdict(&body, &answer, size).unwrap();
        }
    }

    #[test]
    fn a_wrong_answer_fails() {
        let body = make_body(10_000);
        // A letter at a sampled offset left as it was sent.
        let at = (1..)
            .map(|i| i * CHECK_STRIDE)
            .find(|&at| body[at].is_ascii_lowercase())
            .unwrap();
        let mut lower = upper_bang(&body);
        lower[at] = body[at];
        assert!(verdict(&body, &lower, 333).is_err());
        let right = upper_bang(&body);
        assert!(verdict(&body, &right[..right.len() - 1], 512).is_err());
        let mut longer = right.clone();
        longer.push(b'!');
        assert!(verdict(&body, &longer, 512).is_err());
        let mut no_bang = right.clone();
        *no_bang.last_mut().unwrap() = b'?';
        assert!(verdict(&body, &no_bang, 512).is_err());
        assert!(verdict(&body, b"", 1).is_err());
    }

    #[test]
    fn the_body_is_mostly_letters_to_upper_case() {
        let body = make_body(1 << 16);
        assert_eq!(body.len(), 1 << 16);
        let letters = body.iter().filter(|b| b.is_ascii_lowercase()).count();
        assert!(letters > body.len() * 3 / 4, "{letters}");
        assert_eq!(make_body(100), make_body(100));
    }
}
