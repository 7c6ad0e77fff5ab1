//! A function whose behaviour the spec chooses through `TESTFN_MODE`:
//! `upper`, `exclaim`, `slow` (sleep `DELAY_MS`, then upper-case; with `ANNOUNCE: 1` it first
//! says `testfn NAME: holding BODY` on stderr, which `zerohop up` echoes, so that a test
//! knows the request reached the handler), `fail` (422),
//! `panic`, `abort` (the process dies), `forward` (to `TARGET`), `header` (body = the
//! header named by `TESTFN_HEADER`, `x-test` by default), `request` (body = what the request
//! says of itself: `path=`, `route=`, `query=` lines, then `param.N=`, `query.N=` and
//! `cookie.N=` for the names in `TESTFN_PARAMS`, `TESTFN_QUERY` and `TESTFN_COOKIES`
//! (comma-separated)). `request` and `header` answer with `TESTFN_STATUS` and add the
//! response headers of `TESTFN_RESPONSE` (`name=value|name=value`).
//! `flaky` counts its calls in `$ZEROHOP_DATA/calls` and fails the first `TESTFN_FAILS` of
//! them (default 2; `always`: all) with 503, unless `$ZEROHOP_DATA/fixed` exists; it
//! sleeps `DELAY_MS` first and answers like `upper` (retries and the dead-letter queue).
//! `grow` answers `TESTFN_GROW` bytes (default 1 MiB): the request's body repeated (`x` for
//! an empty one), so an answer outgrows its slot; `grow-abort` does so, then dies.
//! `where` adds a line ` TESTFN_NAME pid=PID cpus=LIST` to the body: which process served
//! the request and the CPUs its handler thread may run on (core-affine pipelines).

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
        "where" => {
            let status = std::fs::read_to_string("/proc/thread-self/status").unwrap_or_default();
            let cpus = status
                .lines()
                .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
                .unwrap_or("?")
                .trim();
            let line = format!("\n{name} pid={} cpus={cpus}", std::process::id());
            req.extend(line.as_bytes())?;
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
            respond(req)?;
            Ok(Next::Continue)
        }
        "request" => {
            let list = |var: &str| -> Vec<String> {
                std::env::var(var)
                    .unwrap_or_default()
                    .split(',')
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned)
                    .collect()
            };
            let mut out = format!(
                "path={}\nroute={}\nquery={}\n",
                req.path(),
                req.route_path(),
                req.query_string().unwrap_or("-")
            );
            for n in list("TESTFN_PARAMS") {
                out += &format!("param.{n}={}\n", req.param(&n).unwrap_or("-"));
            }
            for n in list("TESTFN_QUERY") {
                out += &format!("query.{n}={}\n", req.query(&n).as_deref().unwrap_or("-"));
            }
            for n in list("TESTFN_COOKIES") {
                out += &format!("cookie.{n}={}\n", req.cookie(&n).unwrap_or("-"));
            }
            req.set_body(out.as_bytes())?;
            respond(req)?;
            Ok(Next::Continue)
        }
        "flaky" => flaky(req, delay),
        "grow" | "grow-abort" => {
            let want: usize = std::env::var("TESTFN_GROW")
                .ok()
                .and_then(|g| g.parse().ok())
                .unwrap_or(1 << 20);
            let seed = if req.body().is_empty() {
                b"x".to_vec()
            } else {
                req.body().to_vec()
            };
            let out: Vec<u8> = seed.iter().copied().cycle().take(want).collect();
            req.set_body(&out)?;
            if mode == "grow-abort" {
                // Dies holding the request in the large slot it moved to.
                std::process::abort();
            }
            Ok(Next::Continue)
        }
        other => Err(HandlerError::internal(format!(
            "unknown TESTFN_MODE {other}"
        ))),
    })
}

/// The `flaky` mode (see the module's docs).
fn flaky(req: &mut Request<'_>, delay: u64) -> Result<Next, HandlerError> {
    let data = std::path::PathBuf::from(std::env::var("ZEROHOP_DATA").unwrap_or_default());
    let counter = data.join("calls");
    let calls = std::fs::read_to_string(&counter)
        .ok()
        .and_then(|c| c.trim().parse::<u64>().ok())
        .unwrap_or(0)
        + 1;
    std::fs::write(&counter, calls.to_string())
        .map_err(|e| HandlerError::internal(format!("{}: {e}", counter.display())))?;
    std::thread::sleep(Duration::from_millis(delay));
    let fails = std::env::var("TESTFN_FAILS").unwrap_or_else(|_| "2".into());
    let failing = fails == "always" || fails.parse::<u64>().is_ok_and(|n| calls <= n);
    if failing && !data.join("fixed").exists() {
        return Err(HandlerError::new(503, format!("call {calls} fails")));
    }
    req.body_mut().make_ascii_uppercase();
    Ok(Next::Continue)
}

/// Answers with `TESTFN_STATUS` and the response headers of `TESTFN_RESPONSE`
/// (`name=value|name=value`), when set.
fn respond(req: &mut Request<'_>) -> Result<(), HandlerError> {
    if let Some(status) = std::env::var("TESTFN_STATUS")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        req.set_status(status)?;
    }
    for pair in std::env::var("TESTFN_RESPONSE")
        .unwrap_or_default()
        .split('|')
    {
        if let Some((k, v)) = pair.split_once('=') {
            req.add_response_header(k, v)?;
        }
    }
    Ok(())
}
