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
        other => Err(HandlerError::internal(format!(
            "unknown GRAPH_MODE {other:?}"
        ))),
    })
}
