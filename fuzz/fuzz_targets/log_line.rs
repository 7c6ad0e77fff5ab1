//! The log line format (`zerohop_logline`, which the agent's `logs` re-exports): how an
//! instance's output becomes stored lines (`Splitter`, `text_of`), and how a line is printed
//! for a terminal (`terminal_line`, `escape`).
//!
//! The input: a byte for the longest line (1 to 64 bytes, so lines are cut often), a byte
//! that picks where the output is cut into reads, then the output itself. Checked:
//!
//! * nothing panics;
//! * the lines are the same however the output is cut into reads, and the same as a plain
//!   model's (split on `\n`, a last `\r` removed, at most the longest line kept, cut when
//!   longer);
//! * a stored text holds no character a terminal acts on (`is_escaped`, newline included),
//!   escaping it again changes nothing, its length is bounded, and without anything to
//!   escape it is the output as it was (lossy UTF-8);
//! * a printed line is the prefix the agent gives it, then the text, then its only newline:
//!   whatever the function wrote, the line parses back to its own origin.

#![no_main]

use libfuzzer_sys::fuzz_target;
use zerohop_logline::{
    escape, is_escaped, terminal_line, text_of, Splitter, CUT_MARKER, ESCAPE_GROWTH,
};

/// The time every line is printed with (as the agent makes it, `rfc3339`).
const TIME: &str = "2024-02-29T12:34:56.789Z";

/// What the splitter must find, from the whole output at once.
fn model(max: usize, out: &[u8]) -> Vec<(Vec<u8>, bool)> {
    let mut lines = Vec::new();
    let mut pieces: Vec<&[u8]> = out.split(|b| *b == b'\n').collect();
    // The piece after the last newline is a line only if it holds something.
    if pieces.last().is_some_and(|p| p.is_empty()) {
        pieces.pop();
    }
    for p in pieces {
        let len = p.len() - usize::from(p.last() == Some(&b'\r'));
        lines.push((p[..len.min(max)].to_vec(), len > max));
    }
    lines
}

fuzz_target!(|data: &[u8]| {
    let [max, seed, out @ ..] = data else {
        return;
    };
    let max = usize::from(max % 64) + 1;

    let mut split = Splitter::new(max);
    let mut lines = Vec::new();
    let mut rest = out;
    let mut state = u32::from(*seed) | 1;
    while !rest.is_empty() {
        // xorshift: reads of 1 to 32 bytes, the same for the same seed.
        state ^= state << 13;
        state ^= state >> 17;
        state ^= state << 5;
        let n = (state as usize % 32 + 1).min(rest.len());
        split.feed(&rest[..n], |l, cut| lines.push((l.to_vec(), cut)));
        rest = &rest[n..];
    }
    split.finish(|l, cut| lines.push((l.to_vec(), cut)));
    assert_eq!(lines, model(max, out), "the reads changed the lines");

    // The function names lines are printed with: the first 0 to 7 bytes of the output (line
    // `i` gets name `i % 8`), each escaped once here, not once per line.
    let functions: Vec<(String, String)> = (0..lines.len().min(8))
        .map(|n| {
            let function = String::from_utf8_lossy(out.get(..n).unwrap_or_default()).into_owned();
            let escaped = escape(&function).into_owned();
            assert!(!escaped.chars().any(is_escaped), "{escaped:?}");
            (function, escaped)
        })
        .collect();

    for (i, (bytes, cut)) in lines.iter().enumerate() {
        assert!(bytes.len() <= max);
        let text = text_of(bytes, *cut);
        assert!(!text.chars().any(is_escaped), "{text:?}");
        assert_eq!(escape(&text), text.as_str(), "escaping twice differs");
        assert!(text.len() <= ESCAPE_GROWTH * 3 * max + CUT_MARKER.len());
        let raw = String::from_utf8_lossy(bytes);
        if !cut && !raw.chars().any(is_escaped) {
            assert_eq!(text, raw);
        }
        if *cut {
            assert!(text.ends_with(CUT_MARKER));
        }

        // Printed, with a function name and stream that may be anything too.
        let (function, escaped) = &functions[i % 8];
        let instance = i as u16;
        let line = terminal_line(TIME, function, instance, "stdout", &text);
        let prefix = format!("{TIME} {escaped}/{instance} stdout: ");
        let body = line
            .strip_prefix(prefix.as_str())
            .and_then(|l| l.strip_suffix('\n'))
            .expect("a printed line is its prefix, its text and a newline");
        assert_eq!(body, text, "the text changed in print");
        // So the line holds no character a terminal acts on but its last: its prefix is the
        // time, the escaped function name (checked above), digits and the stream, its body
        // the text (checked above).
        // The raw line printed as is: the same, since the text is escaped already.
        let printed = terminal_line("t", "f", 0, "stderr", &raw);
        assert_eq!(printed.matches('\n').count(), 1);
        assert!(printed.ends_with('\n'));
        assert!(!printed[..printed.len() - 1].chars().any(is_escaped));
    }
});
