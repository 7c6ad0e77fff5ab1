//! Helpers shared by the end-to-end tests: an HTTP client, spec builders, and the node
//! daemon driven by the CLI ([`daemon`]).
//!
//! Every test binary compiles all of it (`mod common;`) and uses only part: hence the
//! `dead_code` allowance, which covers the submodules too.

#![allow(dead_code)]

pub mod curl;
pub mod daemon;

use std::time::Duration;

use zerohop_test_support::target_bin;

/// A keep-alive HTTP client with a bounded timeout.
pub fn client() -> ureq::Agent {
    ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(30))
        .build()
}

/// An HTTP answer.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub body: String,
    pub retry_after: Option<String>,
    pub allow: Option<String>,
}

fn read(r: ureq::Response) -> Answer {
    let retry_after = r.header("retry-after").map(str::to_owned);
    let allow = r.header("allow").map(str::to_owned);
    Answer {
        status: r.status(),
        body: r.into_string().expect("utf-8 body"),
        retry_after,
        allow,
    }
}

/// Sends `method url` with `body`, returning status and body whatever the status.
pub fn call(agent: &ureq::Agent, method: &str, url: &str, body: &[u8]) -> Answer {
    match agent.request(method, url).send_bytes(body) {
        Ok(r) => read(r),
        Err(ureq::Error::Status(_, r)) => read(r),
        Err(e) => panic!("{method} {url}: transport error {e}"),
    }
}

/// POST helper.
pub fn post(agent: &ureq::Agent, url: &str, body: &str) -> Answer {
    call(agent, "POST", url, body.as_bytes())
}

/// The configurable test function's path.
pub fn testfn() -> String {
    target_bin("zerohop-testfn").display().to_string()
}

/// A one-function spec entry for `zerohop-testfn` in `mode`, with extra environment
/// (`"DELAY_MS: 500"`) and extra fields (`", concurrency: 32"`).
pub fn func(name: &str, mode: &str, env: &str, fields: &str) -> String {
    let env = if env.is_empty() {
        String::new()
    } else {
        format!(", {env}")
    };
    format!(
        "  {name}: {{ command: [\"{}\"], env: {{ TESTFN_MODE: {mode}, TESTFN_NAME: {name}{env} }}{fields} }}\n",
        testfn()
    )
}

/// The tokio runtime of a test that runs the agent in this process: one worker thread.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap()
}
