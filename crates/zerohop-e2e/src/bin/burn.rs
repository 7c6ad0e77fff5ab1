//! A function that uses resources on request, for the tests of per-function limits. The
//! body says what to do:
//!
//! * `spin MS`: keeps one core busy for MS milliseconds of wall time (so a CPU limit
//!   stretches nothing: it only lowers the CPU time the request gets); answers `spun MS`.
//! * `fork N`: starts up to N processes (`sleep 60`), stopping at the first failure, then
//!   kills and reaps them; answers `forked K` and, when one failed, ` error MESSAGE`.
//! * `alloc MIB`: allocates and touches MIB mebibytes, then frees them; answers
//!   `allocated MIB`.

#![forbid(unsafe_code)]

use std::hint::black_box;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use zerohop_runtime::{run, HandlerError, Next, Request};

fn spin(ms: u64) -> String {
    let end = Instant::now() + Duration::from_millis(ms);
    let mut x = 0u64;
    while Instant::now() < end {
        for i in 0..10_000u64 {
            x = black_box(x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(i));
        }
    }
    black_box(x);
    format!("spun {ms}")
}

fn fork(n: u64) -> String {
    let mut children = Vec::new();
    let mut error = None;
    for _ in 0..n {
        match Command::new("sleep")
            .arg("60")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
        {
            Ok(c) => children.push(c),
            Err(e) => {
                error = Some(e.to_string());
                break;
            }
        }
    }
    let forked = children.len();
    for mut c in children {
        let _ = c.kill();
        let _ = c.wait();
    }
    match error {
        Some(e) => format!("forked {forked} error {e}"),
        None => format!("forked {forked}"),
    }
}

fn alloc(mib: usize) -> String {
    let mut v = vec![0u8; mib << 20];
    for page in v.chunks_mut(4096) {
        page[0] = 1;
    }
    black_box(&v);
    format!("allocated {mib}")
}

fn main() {
    run(|req: &mut Request<'_>| {
        let body = String::from_utf8_lossy(req.body()).into_owned();
        let (what, n) = body.trim().split_once(' ').unwrap_or((body.trim(), "0"));
        let n: u64 = n
            .parse()
            .map_err(|_| HandlerError::new(400, format!("not a number: {n:?}")))?;
        let answer = match what {
            "spin" => spin(n),
            "fork" => fork(n),
            "alloc" => alloc(n as usize),
            other => return Err(HandlerError::new(400, format!("unknown request {other:?}"))),
        };
        req.set_body(answer.as_bytes())?;
        Ok(Next::Continue)
    })
}
