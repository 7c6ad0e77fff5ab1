//! A function that talks, for the log tests. Per request it prints `out BODY` to standard
//! output and `err BODY` to standard error and answers `ok`. A body `flood MS` starts a
//! thread that writes `flood N` lines to standard output as fast as it can for MS
//! milliseconds (one `write(2)` per line), then waits 1.5 s (so the next line falls in a
//! fresh rate window of the agent's log book) and prints `flood wrote N lines in MS ms` to
//! standard error; that request is answered `flooding` at once.

#![forbid(unsafe_code)]

use std::io::Write;
use std::time::{Duration, Instant};

use zerohop_runtime::{run, Next, Request};

fn flood(ms: u64) {
    let until = Instant::now() + Duration::from_millis(ms);
    let mut out = std::io::stdout().lock();
    let mut n: u64 = 0;
    while Instant::now() < until {
        for _ in 0..256 {
            if writeln!(out, "flood {n}").is_err() {
                return;
            }
            n += 1;
        }
    }
    drop(out);
    std::thread::sleep(Duration::from_millis(1500));
    eprintln!("flood wrote {n} lines in {ms} ms");
}

fn main() {
    run(|req: &mut Request<'_>| {
        let body = String::from_utf8_lossy(req.body()).into_owned();
        println!("out {body}");
        eprintln!("err {body}");
        if let Some(ms) = body.strip_prefix("flood ") {
            let ms = ms.trim().parse().unwrap_or(1000);
            std::thread::spawn(move || flood(ms));
            req.set_body(b"flooding")?;
        } else {
            req.set_body(b"ok")?;
        }
        Ok(Next::Continue)
    })
}
