//! A function whose behaviour the spec chooses through `TESTFN_MODE`:
//! `upper`, `exclaim`, `slow` (sleep `DELAY_MS`, then upper-case; with `ANNOUNCE: 1` it first
//! says `testfn NAME: holding BODY` on stderr, which `zerohop up` echoes, so that a test
//! knows the request reached the handler), `fail` (422),
//! `panic`, `abort` (the process dies), `forward` (to `TARGET`), `header` (body = the
//! header named by `TESTFN_HEADER`, `x-test` by default).

#![forbid(unsafe_code)]

use std::time::Duration;

use zerohop_runtime::{run, HandlerError, Next, Request};

fn main() {
    let mode = std::env::var("TESTFN_MODE").unwrap_or_else(|_| "upper".into());
    let delay: u64 = std::env::var("DELAY_MS")
        .ok()
        .and_then(|d| d.parse().ok())
        .unwrap_or(0);
    let target = std::env::var("TARGET").unwrap_or_default();
    let header = std::env::var("TESTFN_HEADER").unwrap_or_else(|_| "x-test".into());
    let name = std::env::var("TESTFN_NAME").unwrap_or_default();
    let announce = std::env::var("ANNOUNCE").is_ok_and(|a| a == "1");
    run(move |req: &mut Request<'_>| match mode.as_str() {
        "upper" => {
            req.body_mut().make_ascii_uppercase();
            Ok(Next::Continue)
        }
        "exclaim" => {
            req.extend(b"!")?;
            Ok(Next::Continue)
        }
        "slow" => {
            if announce {
                eprintln!(
                    "testfn {name}: holding {}",
                    String::from_utf8_lossy(req.body())
                );
            }
            std::thread::sleep(Duration::from_millis(delay));
            req.body_mut().make_ascii_uppercase();
            Ok(Next::Continue)
        }
        "fail" => Err(HandlerError::new(
            422,
            format!("refusing {:?}", String::from_utf8_lossy(req.body())),
        )),
        "panic" => panic!("boom"),
        "abort" => std::process::abort(),
        "forward" => Ok(Next::Forward(target.clone())),
        "header" => {
            let v = req.header(&header).unwrap_or("<none>").to_owned();
            req.set_body(v.as_bytes())?;
            Ok(Next::Continue)
        }
        other => Err(HandlerError::internal(format!(
            "unknown TESTFN_MODE {other}"
        ))),
    })
}
