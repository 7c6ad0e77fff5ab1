//! API keys: a file of `NAME KEY` lines (`#` starts a comment); a request carries the key in
//! a header, and its client is the key's name.
//!
//! Keys are kept as SHA-256 digests, looked up by digest: what a request sends is hashed
//! once, so a lookup neither keeps the keys in memory nor compares them byte by byte.

use std::collections::HashMap;

use ring::digest::{digest, SHA256};

/// Most keys one file may list.
pub(crate) const MAX_KEYS: usize = 10_000;

/// Shortest key accepted: a guessable key is no key.
pub(crate) const MIN_KEY_LEN: usize = 16;

/// The keys of a file, by digest, with their names.
pub(crate) struct Keys {
    by_digest: HashMap<[u8; 32], String>,
}

impl Keys {
    /// Parses a key file.
    pub(crate) fn parse(bytes: &[u8]) -> Result<Self, String> {
        let text = std::str::from_utf8(bytes).map_err(|_| "not UTF-8 text".to_owned())?;
        let mut by_digest = HashMap::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let n = i + 1;
            let mut words = line.split_whitespace();
            let (Some(name), Some(key), None) = (words.next(), words.next(), words.next()) else {
                return Err(format!("line {n}: expected `NAME KEY`"));
            };
            if key.len() < MIN_KEY_LEN {
                return Err(format!(
                    "line {n}: the key of `{name}` is shorter than {MIN_KEY_LEN} characters"
                ));
            }
            if name.len() > 128 || !name.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(format!(
                    "line {n}: a name is at most 128 visible characters"
                ));
            }
            if by_digest.insert(hash(key), name.to_owned()).is_some() {
                return Err(format!("line {n}: the key of `{name}` is listed twice"));
            }
            if by_digest.len() > MAX_KEYS {
                return Err(format!("more than {MAX_KEYS} keys"));
            }
        }
        if by_digest.is_empty() {
            return Err("no key in it (lines of `NAME KEY`)".into());
        }
        Ok(Self { by_digest })
    }

    /// The name of the client whose key `key` is.
    pub(crate) fn name(&self, key: &[u8]) -> Option<&str> {
        self.by_digest.get(&hash_bytes(key)).map(String::as_str)
    }
}

fn hash(key: &str) -> [u8; 32] {
    hash_bytes(key.as_bytes())
}

fn hash_bytes(key: &[u8]) -> [u8; 32] {
    let d = digest(&SHA256, key);
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_name_their_clients_and_bad_files_say_which_line() {
        let k = Keys::parse(
            b"# clients\nalice 0123456789abcdef0123\n\nbob   fedcba9876543210fedc # ci\n",
        )
        .unwrap();
        assert_eq!(k.name(b"0123456789abcdef0123"), Some("alice"));
        assert_eq!(k.name(b"fedcba9876543210fedc"), Some("bob"));
        assert_eq!(k.name(b"0123456789abcdef012"), None);
        for (file, why) in [
            (
                &b"alice short\n"[..],
                "line 1: the key of `alice` is shorter",
            ),
            (b"alice\n", "line 1: expected `NAME KEY`"),
            (
                b"a 0123456789abcdef0123\nb 0123456789abcdef0123\n",
                "line 2: the key of `b` is listed twice",
            ),
            (b"# nothing\n", "no key in it"),
            (b"\xff\n", "not UTF-8"),
        ] {
            let e = Keys::parse(file).err().unwrap();
            assert!(e.contains(why), "{e}");
        }
    }
}
