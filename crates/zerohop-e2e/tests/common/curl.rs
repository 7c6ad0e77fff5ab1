//! curl as the end-to-end tests' HTTP client where headers matter: `-i` output parsed
//! into status, headers and body.

use std::process::Command;

/// An answer as curl saw it: status, headers (lower-case names, in order), body.
pub struct Seen {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Seen {
    pub fn header(&self, name: &str) -> Vec<&str> {
        self.headers
            .iter()
            .filter(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
            .collect()
    }
}

/// `curl -i` with `args` (bounded in time); panics if curl fails to talk HTTP at all.
pub fn curl(args: &[&str]) -> Seen {
    let out = Command::new("curl")
        .args(["-sS", "-i", "--max-time", "20"])
        .args(args)
        .output()
        .expect("curl runs");
    assert!(
        out.status.success(),
        "curl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).expect("utf-8 answer");
    let (head, body) = text.split_once("\r\n\r\n").expect("a header block");
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .expect("a status line");
    let headers = lines
        .filter_map(|l| l.split_once(": "))
        .map(|(k, v)| (k.to_ascii_lowercase(), v.to_owned()))
        .collect();
    Seen {
        status,
        headers,
        body: body.to_owned(),
    }
}
