//! `zerohop-logline`: the log-line format of an instance's output, pure: how a pipe's bytes
//! become lines ([`Splitter`]), how a line's bytes become its stored text ([`text_of`],
//! [`escape`]), and how a line is printed for a terminal ([`terminal_line`]).
//!
//! The agent's log book (`zerohop_agent::logs`, which re-exports all of it) reads the pipes and
//! stores the lines; `zerohop logs` prints them; the `log_line` fuzz target checks all of it
//! without linking the agent. No I/O and no `unsafe` here.

#![forbid(unsafe_code)]

/// Appended to the text of a line that was cut at the maximum length.
pub const CUT_MARKER: &str = " [zerohop: line cut]";
/// The most bytes [`escape`] makes of one byte of its input (`\u{202e}` for a character of
/// 3 bytes is 8; `\x1b` for 1 is 4).
pub const ESCAPE_GROWTH: usize = 4;

/// The text of a line: lossy UTF-8, [`escape`]d, a character the cut split removed, the
/// marker added.
pub fn text_of(bytes: &[u8], cut: bool) -> String {
    let bytes = if cut {
        without_split_char(bytes)
    } else {
        bytes
    };
    let mut text = escape(&String::from_utf8_lossy(bytes)).into_owned();
    if cut {
        text.push_str(CUT_MARKER);
    }
    text
}

/// Whether a terminal would act on `c` rather than show it: C0 controls but tab (`\r`,
/// ESC, backspace, bell, ...), DEL, C1 controls (U+0080 to U+009F: in UTF-8, U+009B is CSI
/// to some terminals), and the characters that break a line or reorder it (U+2028, U+2029,
/// the bidirectional marks, embeddings, overrides and isolates).
pub fn is_escaped(c: char) -> bool {
    matches!(c,
        '\0'..='\x08' | '\n'..='\x1f' | '\x7f'..='\u{9f}'
        | '\u{61c}' | '\u{200e}' | '\u{200f}' | '\u{2028}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// `text` as a terminal shows it as is: every character [`is_escaped`] written as its code,
/// `\xHH` below U+0080 (`\x1b` for ESC, `\x0d` for `\r`) and `\u{HHHH}` from there
/// (`\u{9b}`, `\u{202e}`); the rest, backslashes included, unchanged. So the result holds no
/// character [`is_escaped`] accepts and escaping it again changes nothing (each layer that
/// prints may escape without doubling); the price is that a function's own text `\x1b`
/// reads the same as an ESC it printed. At most [`ESCAPE_GROWTH`] times as long as `text`.
pub fn escape(text: &str) -> std::borrow::Cow<'_, str> {
    use std::fmt::Write as _;
    let Some(first) = text.find(is_escaped) else {
        return std::borrow::Cow::Borrowed(text);
    };
    let mut out = String::with_capacity(text.len() + 16);
    out.push_str(&text[..first]);
    for c in text[first..].chars() {
        if !is_escaped(c) {
            out.push(c);
        } else if u32::from(c) < 0x80 {
            let _ = write!(out, "\\x{:02x}", u32::from(c));
        } else {
            let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
        }
    }
    std::borrow::Cow::Owned(out)
}

/// One line as `zerohop logs` prints it to a terminal: `TIME function/instance stream:
/// text` and a newline, every field [`escape`]d (what the daemon sends is escaped already;
/// the tool does not rely on it). The line's only newline is its last byte, so what comes
/// before its first space, `/` and `: ` is the origin the agent gave it.
pub fn terminal_line(
    time: &str,
    function: &str,
    instance: u16,
    stream: &str,
    text: &str,
) -> String {
    format!(
        "{} {}/{instance} {}: {}\n",
        escape(time),
        escape(function),
        escape(stream),
        escape(text)
    )
}

/// `b` without an incomplete UTF-8 sequence at its end.
fn without_split_char(b: &[u8]) -> &[u8] {
    let n = b.len();
    for back in 1..=n.min(3) {
        let c = b[n - back];
        if c & 0xc0 == 0x80 {
            continue;
        }
        let need = match c {
            0xf0.. => 4,
            0xe0.. => 3,
            0xc0.. => 2,
            _ => 1,
        };
        return if need > back { &b[..n - back] } else { b };
    }
    b
}

/// Splits a byte stream into lines of at most `max` bytes, the same lines however the
/// stream is cut into chunks.
pub struct Splitter {
    max: usize,
    /// The start of a line whose end has not arrived (at most `max` bytes).
    partial: Vec<u8>,
    /// The current line was cut and filed: discard up to the next newline.
    skipping: bool,
}

impl Splitter {
    /// A splitter for lines of at most `max` bytes.
    pub fn new(max: usize) -> Splitter {
        Splitter {
            max,
            partial: Vec::new(),
            skipping: false,
        }
    }

    /// Calls `line(text, cut)` for every line `chunk` completes (text without its `\n` or
    /// `\r\n`, at most `max` bytes; `cut` when there was more), and for a line that grows
    /// past `max` without an end (the rest of it is then discarded).
    pub fn feed(&mut self, mut chunk: &[u8], mut line: impl FnMut(&[u8], bool)) {
        while let Some(i) = memchr::memchr(b'\n', chunk) {
            let head = &chunk[..i];
            chunk = &chunk[i + 1..];
            if self.skipping {
                self.skipping = false;
                continue;
            }
            let full = self.partial.len() + head.len();
            let last = head.last().or(self.partial.last());
            let len = full - usize::from(last == Some(&b'\r'));
            let keep = len.min(self.max);
            if self.partial.is_empty() {
                line(&head[..keep], len > self.max);
                continue;
            }
            if keep <= self.partial.len() {
                self.partial.truncate(keep);
            } else {
                let more = keep - self.partial.len();
                self.partial.extend_from_slice(&head[..more]);
            }
            line(&self.partial, len > self.max);
            self.partial.clear();
        }
        if self.skipping || chunk.is_empty() {
            return;
        }
        // One byte more may wait if it is a `\r`: the `\n` that ends the line may follow.
        let total = self.partial.len() + chunk.len();
        if total <= self.max || (total == self.max + 1 && chunk.last() == Some(&b'\r')) {
            self.partial.extend_from_slice(chunk);
            return;
        }
        let room = self.max.saturating_sub(self.partial.len());
        self.partial.extend_from_slice(&chunk[..room]);
        self.partial.truncate(self.max);
        line(&self.partial, true);
        self.partial.clear();
        self.skipping = true;
    }

    /// The stream ended: a last line without a newline.
    pub fn finish(&mut self, mut line: impl FnMut(&[u8], bool)) {
        if !self.skipping && !self.partial.is_empty() {
            let len = self.partial.len() - usize::from(self.partial.last() == Some(&b'\r'));
            line(&self.partial[..len], false);
        }
        self.partial.clear();
        self.skipping = false;
    }
}
