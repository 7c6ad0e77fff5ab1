//! Functions for the graph tests, by `GRAPH_MODE`:
//! - `join`: calls every function named in `GRAPH_CALLS` (comma separated) at once with the
//!   request body, and answers `name=output;` per branch in that order, `name!status;` for a
//!   branch that failed. With `GRAPH_POLICY=fail` the first failed branch fails the request
//!   (with that branch's status).
//! - `upper`: the body in upper case.
//! - `twice`: calls `GRAPH_CALLS` (one function), then repeats its output twice.
//! - `crashy`: aborts the process when the body is `crash`, sleeps 5 s on `hang`, answers
//!   418 on `teapot`, else reverses the body.
//! - `forbidden`: calls `GRAPH_CALLS` (not in its `calls` list) and answers the error.
//! - `merge`: joins a static fan-out: `i=output;` per branch in order, `i!status;` for one
//!   that failed.
//! - `stray`: forwards to `GRAPH_CALLS` (not in its `next` list).
//! - `count`: adds one to the state key named by the body and answers the new count; a
//!   body of `die` aborts the process in the middle of the update (holding its lock).
//! - `peek`: answers the count of the state key named by the body (`none` when absent).

use zerohop_runtime::{run, HandlerError, Next, Request};

fn main() {
    let mode = std::env::var("GRAPH_MODE").unwrap_or_default();
    let calls: Vec<String> = std::env::var("GRAPH_CALLS")
        .unwrap_or_default()
        .split(',')
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect();
    let fail_fast = std::env::var("GRAPH_POLICY").is_ok_and(|p| p == "fail");
    run(move |req: &mut Request<'_>| match mode.as_str() {
        "join" => {
            let input = req.body().to_vec();
            let branches: Vec<(&str, &[u8])> =
                calls.iter().map(|c| (c.as_str(), &input[..])).collect();
            let answers = req.call_all(&branches);
            let mut out = Vec::new();
            for (name, a) in calls.iter().zip(answers) {
                match a {
                    Ok(a) => {
                        out.extend_from_slice(format!("{name}=").as_bytes());
                        out.extend_from_slice(a.body());
                    }
                    Err(e) if fail_fast => return Err(e.into()),
                    Err(e) => out.extend_from_slice(format!("{name}!{}", e.status).as_bytes()),
                }
                out.push(b';');
            }
            req.set_body(&out)?;
            Ok(Next::Continue)
        }
        "upper" => {
            req.body_mut().make_ascii_uppercase();
            Ok(Next::Continue)
        }
        "twice" => {
            let input = req.body().to_vec();
            let a = req.call(&calls[0], &input)?;
            let out = [a.body(), a.body()].concat();
            drop(a);
            req.set_body(&out)?;
            Ok(Next::Continue)
        }
        "crashy" => match req.body() {
            b"crash" => std::process::abort(),
            b"hang" => {
                std::thread::sleep(std::time::Duration::from_secs(5));
                Ok(Next::Continue)
            }
            b"teapot" => Err(HandlerError::new(418, "short and stout")),
            _ => {
                req.body_mut().reverse();
                Ok(Next::Continue)
            }
        },
        "forbidden" => {
            let input = req.body().to_vec();
            let e = req.call(&calls[0], &input).expect_err("not in calls");
            req.set_body(e.to_string().as_bytes())?;
            Ok(Next::Continue)
        }
        "merge" => {
            let mut out = Vec::new();
            for (i, b) in req.branches().iter().enumerate() {
                match b {
                    Ok(a) => {
                        out.extend_from_slice(format!("{i}=").as_bytes());
                        out.extend_from_slice(a.body());
                    }
                    Err(e) => out.extend_from_slice(format!("{i}!{}", e.status).as_bytes()),
                }
                out.push(b';');
            }
            req.set_body(&out)?;
            Ok(Next::Continue)
        }
        "stray" => Ok(Next::Forward(calls[0].clone())),
        "count" => {
            let key = req.body().to_vec();
            let die = key == b"die";
            let new = req.state()?.update(&key, |old| {
                if die {
                    std::process::abort();
                }
                let n = old.map_or(0, count);
                Some((n + 1).to_le_bytes().to_vec())
            })?;
            let n = new.as_deref().map_or(0, count);
            req.set_body(n.to_string().as_bytes())?;
            Ok(Next::Continue)
        }
        "peek" => {
            let key = req.body().to_vec();
            let out = match req.state()?.get(&key)? {
                Some(v) => count(&v).to_string(),
                None => "none".to_owned(),
            };
            req.set_body(out.as_bytes())?;
            Ok(Next::Continue)
        }
        other => Err(HandlerError::internal(format!(
            "unknown GRAPH_MODE {other:?}"
        ))),
    })
}

/// A counter as stored in the state: 8 bytes little endian (anything else counts as 0).
fn count(v: &[u8]) -> u64 {
    v.try_into().map_or(0, u64::from_le_bytes)
}
