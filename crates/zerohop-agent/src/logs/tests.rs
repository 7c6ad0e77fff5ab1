use std::fs::File;
use std::io::Write as _;

use super::*;

/// Every line `chunks` make, fed in that order, then the end of the stream.
fn split(max: usize, chunks: &[&[u8]]) -> Vec<(String, bool)> {
    let mut s = Splitter::new(max);
    let mut out = Vec::new();
    for c in chunks {
        s.feed(c, |l, cut| {
            out.push((String::from_utf8_lossy(l).into_owned(), cut));
        });
    }
    s.finish(|l, cut| out.push((String::from_utf8_lossy(l).into_owned(), cut)));
    out
}

fn lines(v: &[(&str, bool)]) -> Vec<(String, bool)> {
    v.iter().map(|(s, c)| (s.to_string(), *c)).collect()
}

#[test]
fn splits_on_newlines_across_chunks_and_strips_crlf() {
    assert_eq!(
        split(100, &[b"one\ntw", b"o\r", b"\nthree\r\n\n", b"four"]),
        lines(&[
            ("one", false),
            ("two", false),
            ("three", false),
            ("", false),
            ("four", false)
        ])
    );
    // A lone \r inside a line stays; one at the very end of the stream goes.
    assert_eq!(
        split(100, &[b"a\rb\n", b"c\r"]),
        lines(&[("a\rb", false), ("c", false)])
    );
    assert!(split(100, &[b""]).is_empty());
}

#[test]
fn long_lines_are_cut_and_their_rest_discarded() {
    // Complete in one chunk.
    assert_eq!(
        split(4, &[b"abcdefgh\nxy\n"]),
        lines(&[("abcd", true), ("xy", false)])
    );
    // Exactly the maximum, with \r\n: not cut.
    assert_eq!(split(4, &[b"abcd\r\n"]), lines(&[("abcd", false)]));
    // Growing past the maximum without a newline: filed at once, the rest up to the
    // next newline (chunks later) discarded.
    let mut s = Splitter::new(4);
    let mut out = Vec::new();
    s.feed(b"ab", |l, c| out.push((l.to_vec(), c)));
    assert!(out.is_empty());
    s.feed(b"cdef", |l, c| out.push((l.to_vec(), c)));
    assert_eq!(out, vec![(b"abcd".to_vec(), true)]);
    s.feed(b"ghijkl", |l, c| out.push((l.to_vec(), c)));
    s.feed(b"mn\nok\n", |l, c| out.push((l.to_vec(), c)));
    assert_eq!(out, vec![(b"abcd".to_vec(), true), (b"ok".to_vec(), false)]);
    // A partial line that ends up over the maximum when its newline comes.
    assert_eq!(split(4, &[b"abc", b"de\n"]), lines(&[("abcd", true)]));
}

#[test]
fn cut_text_has_the_marker_and_no_split_character() {
    assert_eq!(text_of(b"abc", false), "abc");
    assert_eq!(text_of(b"abc", true), format!("abc{CUT_MARKER}"));
    // "é" is two bytes: cut after the first, it goes entirely.
    assert_eq!(
        text_of("abé".as_bytes()[..3].as_ref(), true),
        format!("ab{CUT_MARKER}")
    );
    assert_eq!(
        text_of("ab€".as_bytes()[..4].as_ref(), true),
        format!("ab{CUT_MARKER}")
    );
    assert_eq!(text_of("ab€".as_bytes(), true), format!("ab€{CUT_MARKER}"));
    // Invalid bytes elsewhere are replaced, not lost.
    assert_eq!(text_of(b"a\xffb", false), "a\u{fffd}b");
}

#[test]
fn a_line_of_the_maximum_with_crlf_is_not_cut_however_it_arrives() {
    for chunks in [
        &[&b"abcd\r\n"[..]][..],
        &[b"abcd", b"\r", b"\n"],
        &[b"abcd\r", b"\n"],
        &[b"ab", b"cd\r", b"\n"],
    ] {
        assert_eq!(split(4, chunks), lines(&[("abcd", false)]), "{chunks:?}");
    }
    // A `\r` that is not the line's end: the line is longer than the maximum.
    assert_eq!(split(4, &[b"abcd\r", b"e\n"]), lines(&[("abcd", true)]));
    assert_eq!(
        split(4, &[b"abcd", b"\r", b"e\n"]),
        lines(&[("abcd", true)])
    );
    // At the end of the stream, a last `\r` goes as at the end of a line.
    assert_eq!(split(4, &[b"abcd", b"\r"]), lines(&[("abcd", false)]));
}

#[test]
fn control_characters_are_stored_escaped_and_visible() {
    // A function that colours, clears, moves the cursor up, rewinds the line with \r to
    // print a fake origin over its own, rings the bell, sends a C1 CSI, and hides text
    // behind a bidi override.
    let hostile = "\x1b[31mred\x1b[0m \x1b[2K\x1b[1A\rexclaim/1 stdout: forged\x07 \u{9b}2J \
                   \u{202e}txet\x7f\0";
    let text = text_of(hostile.as_bytes(), false);
    assert_eq!(
        text,
        "\\x1b[31mred\\x1b[0m \\x1b[2K\\x1b[1A\\x0dexclaim/1 stdout: forged\\x07 \\u{9b}2J \
         \\u{202e}txet\\x7f\\x00"
    );
    assert!(!text.chars().any(is_escaped), "{text:?}");
    // Tabs, backslashes, ordinary Unicode and replaced invalid bytes stay as they are.
    assert_eq!(
        text_of(b"a\tb \\x1b caf\xc3\xa9 \xff", false),
        "a\tb \\x1b caf\u{e9} \u{fffd}"
    );
    // Escaping what is escaped changes nothing: layers may each escape.
    assert_eq!(escape(&text), text);
    assert!(matches!(
        escape("plain"),
        std::borrow::Cow::Borrowed("plain")
    ));
    // Every escaped character becomes ASCII starting with a backslash, within the
    // documented growth.
    for c in (0u32..0x2100)
        .filter_map(char::from_u32)
        .filter(|c| is_escaped(*c))
    {
        let e = escape(c.encode_utf8(&mut [0; 4])).into_owned();
        assert!(e.len() <= ESCAPE_GROWTH * c.len_utf8(), "{c:?} -> {e}");
        assert!(e.starts_with('\\') && e.is_ascii(), "{e}");
    }
    // Cut lines are escaped too.
    assert_eq!(
        text_of(b"\x1b[2J\x1b[2J", true),
        format!("\\x1b[2J\\x1b[2J{CUT_MARKER}")
    );
}

#[test]
fn a_terminal_line_starts_with_its_origin_and_has_one_newline() {
    let l = terminal_line(
        "2024-02-29T12:34:56.789Z",
        "upper",
        3,
        "stdout",
        "x\r2024-02-29T12:34:56.789Z exclaim/1 stdout: forged\n\x1b[1Anext",
    );
    assert_eq!(
        l,
        "2024-02-29T12:34:56.789Z upper/3 stdout: x\\x0d2024-02-29T12:34:56.789Z exclaim/1 \
         stdout: forged\\x0a\\x1b[1Anext\n"
    );
    assert_eq!(l.matches('\n').count(), 1);
    assert!(!l[..l.len() - 1].chars().any(is_escaped));
}

fn line(seq: u64, cut: bool) -> Arc<LogLine> {
    Arc::new(LogLine {
        seq,
        time: UNIX_EPOCH,
        chain: "c".into(),
        function: "f".into(),
        instance: 1,
        stream: Stream::Stdout,
        text: seq.to_string(),
        cut,
    })
}

#[test]
fn a_full_ring_evicts_its_oldest_lines_without_dropping() {
    let mut ring = Ring::default();
    for i in 0..5 {
        ring.push(line(i, i == 4), 3);
    }
    let seqs: Vec<u64> = ring.lines.iter().map(|l| l.seq).collect();
    assert_eq!(seqs, [2, 3, 4]);
    assert_eq!(ring.stats.evicted, 2);
    assert_eq!(ring.stats.dropped, 0);
    assert_eq!(ring.stats.cut, 1);
}

#[test]
fn the_rate_budget_drops_the_rest_of_a_window() {
    let limits = LogLimits {
        rate_budget: 3,
        rate_window: Duration::from_secs(1),
        ..LogLimits::default()
    };
    let mut ring = Ring::default();
    let t0 = Instant::now();
    let admitted: Vec<Admit> = (0..6).map(|_| ring.admit(&limits, t0)).collect();
    assert_eq!(
        admitted,
        [
            Admit::Yes,
            Admit::Yes,
            Admit::Yes,
            Admit::FirstNo,
            Admit::No,
            Admit::No
        ]
    );
    assert_eq!(ring.stats.dropped, 3);
    // Still the same window just before its end; a new one at its end.
    let late = t0 + Duration::from_millis(999);
    assert_eq!(ring.admit(&limits, late), Admit::No);
    let next = t0 + Duration::from_secs(1);
    assert_eq!(ring.admit(&limits, next), Admit::Yes);
    assert_eq!(ring.stats.dropped, 4);
}

#[test]
fn rfc3339_in_utc_with_milliseconds() {
    let at =
        |s: u64, ms: u64| rfc3339(UNIX_EPOCH + Duration::from_secs(s) + Duration::from_millis(ms));
    assert_eq!(at(0, 0), "1970-01-01T00:00:00.000Z");
    assert_eq!(at(951_782_400, 0), "2000-02-29T00:00:00.000Z");
    assert_eq!(at(1_709_210_096, 789), "2024-02-29T12:34:56.789Z");
    assert_eq!(at(1_234_567_890, 500), "2009-02-13T23:31:30.500Z");
    assert_eq!(at(4_102_444_799, 999), "2099-12-31T23:59:59.999Z");
    assert_eq!(
        rfc3339(UNIX_EPOCH - Duration::from_secs(5)),
        "1970-01-01T00:00:00.000Z"
    );
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// Waits (at most 10 s) until `book` holds `n` lines of `function`.
async fn until_kept(book: &LogBook, function: &str, n: u64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while book.stats(function).expect("known").kept < n {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{function}: {:?}, wanted {n} kept",
            book.stats(function)
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[test]
fn readers_file_both_streams_and_end_at_end_of_file() {
    runtime().block_on(async {
        let book = LogBook::new("chain", &["a", "b"], 10);
        let mut follower = book.follow();
        let (out_r, out_w) = pipe().expect("pipe");
        let (err_r, err_w) = pipe().expect("pipe");
        book.attach(1, 7, out_r, err_r).expect("attach");
        assert_eq!(book.readers(), 2);
        let (mut out, mut err) = (File::from(out_w), File::from(err_w));
        out.write_all(b"first\nsecond\r\nthi").expect("write");
        err.write_all(b"oops\n").expect("write");
        until_kept(&book, "b", 3).await;
        out.write_all(b"rd").expect("write");
        drop((out, err));
        until_kept(&book, "b", 4).await;
        let all = book.snapshot(Some("b"), 100);
        let mut texts: Vec<(&str, Stream)> = all.iter().map(|l| (&*l.text, l.stream)).collect();
        // The two pipes are read independently: only each stream's order is given.
        texts.sort_by_key(|(_, s)| *s == Stream::Stderr);
        assert_eq!(
            texts,
            [
                ("first", Stream::Stdout),
                ("second", Stream::Stdout),
                ("third", Stream::Stdout),
                ("oops", Stream::Stderr)
            ]
        );
        assert!(all.iter().all(|l| l.instance == 7 && &*l.function == "b"));
        assert!(all.windows(2).all(|w| w[0].seq < w[1].seq));
        assert_eq!(book.snapshot(None, 2), all[2..].to_vec());
        assert!(book.snapshot(Some("a"), 10).is_empty());
        assert!(book.snapshot(Some("nope"), 10).is_empty());
        let stats = book.stats("b").expect("b");
        assert_eq!((stats.kept, stats.evicted, stats.dropped), (4, 0, 0));
        assert_eq!(stats.bytes, 24);
        for want in &all {
            let got = tokio::time::timeout(Duration::from_secs(5), follower.recv())
                .await
                .expect("followed in time")
                .expect("a line");
            assert_eq!(*got, *want);
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while book.readers() > 0 {
            assert!(tokio::time::Instant::now() < deadline, "readers ended");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
}

#[test]
fn close_drains_what_is_there_and_ends_readers_whose_writer_lives_on() {
    runtime().block_on(async {
        let book = LogBook::new("chain", &["a"], 10);
        let (r, w) = pipe().expect("pipe");
        let (r2, _w2) = pipe().expect("pipe");
        book.attach(0, 3, r, r2).expect("attach");
        let mut w = File::from(w);
        w.write_all(b"one\ntwo").expect("write");
        book.close().await;
        assert_eq!(book.readers(), 0);
        let texts: Vec<String> = book
            .snapshot(None, 10)
            .into_iter()
            .map(|l| l.text)
            .collect();
        assert_eq!(texts, ["one", "two"]);
        // Attached after closing: drained at once.
        let (r3, w3) = pipe().expect("pipe");
        let (r4, _w4) = pipe().expect("pipe");
        File::from(w3).write_all(b"late\n").expect("write");
        book.attach(0, 4, r3, r4).expect("attach");
        until_kept(&book, "a", 3).await;
        assert!(book
            .attach(1, 4, pipe().unwrap().0, pipe().unwrap().0)
            .is_err());
    });
}

#[test]
fn a_flood_is_bounded_by_the_ring_and_the_budget() {
    runtime().block_on(async {
        let limits = LogLimits {
            capacity: 50,
            rate_budget: 200,
            rate_window: Duration::from_secs(3600),
            ..LogLimits::default()
        };
        let book = LogBook::with_limits("chain", &["f"], limits);
        let (r, w) = pipe().expect("pipe");
        let (r2, w2) = pipe().expect("pipe");
        book.attach(0, 2, r, r2).expect("attach");
        drop(w2);
        let writer = std::thread::spawn(move || {
            let mut w = std::io::BufWriter::new(File::from(w));
            for i in 0..100_000 {
                writeln!(w, "line {i}").expect("write");
            }
        });
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while book.readers() > 0 {
            assert!(tokio::time::Instant::now() < deadline, "flood read");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        writer.join().expect("writer");
        let s = book.stats("f").expect("f");
        assert_eq!(s.kept, 50);
        assert_eq!(s.kept + s.evicted, 200);
        assert_eq!(s.dropped, 100_000 - 200);
        let kept = book.snapshot(Some("f"), 1000);
        assert_eq!(kept.len(), 50);
        assert_eq!(kept[0].text, "line 150");
        assert_eq!(kept[49].text, "line 199");
    });
}

#[test]
fn echo_writes_function_and_instance_and_says_what_it_skipped() {
    let (tx, rx) = broadcast::channel(2);
    for i in 0..3 {
        tx.send(line(i, false)).expect("receiver");
    }
    drop(tx);
    let mut out = Vec::new();
    let echoed = AtomicU64::new(0);
    echo(rx, &mut out, &echoed);
    assert_eq!(echoed.load(Ordering::Relaxed), 3);
    let out = String::from_utf8(out).expect("utf-8");
    assert_eq!(
        out,
        "[zerohop] 1 lines of instance output not echoed (standard error is too slow)\n\
         [f/1] 1\n[f/1] 2\n"
    );
    // Raw bytes in a line (not stored by a book, which escapes) are escaped all the same.
    let (tx, rx) = broadcast::channel(2);
    let mut raw = LogLine::clone(&line(0, false));
    raw.text = "\r[g/2] forged\x1b[2K".into();
    tx.send(Arc::new(raw)).expect("receiver");
    drop(tx);
    let mut out = Vec::new();
    echo(rx, &mut out, &echoed);
    assert_eq!(out, b"[f/1] \\x0d[g/2] forged\\x1b[2K\n");
}
