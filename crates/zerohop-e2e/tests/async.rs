//! Async invocations, retries and the dead-letter queue end to end: the real daemon and CLI,
//! HTTP with ureq, a tiny callback server of the test's own, and a daemon killed with
//! SIGKILL between a 202 and its answer.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use common::daemon::Daemon;
use common::{client, func};
use serde_json::Value;
use zerohop_test_support::{signal_pid, wait_until, Signal, TempDir};

/// How long a test waits for an async answer.
const ANSWER_WITHIN: Duration = Duration::from_secs(30);

/// An HTTP answer with the headers the tests look at.
#[derive(Debug)]
struct Got {
    status: u16,
    body: String,
    location: Option<String>,
    preference: Option<String>,
}

fn send(method: &str, url: &str, body: &str, headers: &[(&str, &str)]) -> Got {
    let mut req = client().request(method, url);
    for (k, v) in headers {
        req = req.set(k, v);
    }
    let resp = match req.send_string(body) {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("{method} {url}: {e}"),
    };
    Got {
        status: resp.status(),
        location: resp.header("location").map(str::to_owned),
        preference: resp.header("preference-applied").map(str::to_owned),
        body: resp.into_string().unwrap_or_default(),
    }
}

/// A chain spec: one `flaky` (or other `mode`) function, `route` fields under `POST /work`,
/// and the data folder `data` (the function's call counter) when given.
fn spec(name: &str, mode: &str, env: &str, route: &str, data: Option<&Path>) -> String {
    let data = data.map_or(String::new(), |d| format!("data: {}\n", d.display()));
    format!(
        "name: {name}\npool: {{ slots: 64, slot_size: 16KiB }}\ntimeout: 5s\n{data}functions:\n{}\
         routes:\n  - http: POST /work\n{route}    sequence: [f]\n",
        func("f", mode, env, "")
    )
}

fn url_of(applied: &Value) -> String {
    applied["status"]["listeners"][0]
        .as_str()
        .expect("an http listener")
        .to_owned()
}

/// A folder the chain's own uid can pass through to its data folder (`store`).
fn data_folder() -> (TempDir, PathBuf) {
    let tmp = TempDir::new("async-data");
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let data = tmp.path().join("store");
    (tmp, data)
}

fn calls(data: &Path) -> u64 {
    std::fs::read_to_string(data.join("calls"))
        .ok()
        .and_then(|c| c.trim().parse().ok())
        .unwrap_or(0)
}

/// A daemon whose async folders are under `state`.
fn daemon(state: &Path) -> Daemon {
    Daemon::start_with_env(|_| Vec::new(), &[("ZEROHOP_STATE_DIR", state.as_os_str())])
}

/// Posts `body` asking for async; asserts the 202 and returns the result's URL.
fn accepted(url: &str, body: &str, headers: &[(&str, &str)]) -> String {
    let mut all = vec![("Prefer", "respond-async")];
    all.extend_from_slice(headers);
    let r = send("POST", &format!("{url}/work"), body, &all);
    assert_eq!(r.status, 202, "{r:?}");
    assert_eq!(r.preference.as_deref(), Some("respond-async"));
    let loc = r.location.clone().expect("a Location");
    assert!(loc.starts_with("/_zerohop/async/"), "{loc}");
    let v: Value = serde_json::from_str(&r.body).expect("a JSON body");
    assert_eq!(v["location"], loc.as_str());
    format!("{url}{loc}")
}

/// Polls `result` until it is no longer 202; the final answer.
fn answer(result: &str) -> Got {
    let mut last = None;
    let done = wait_until(ANSWER_WITHIN, || {
        let r = send("GET", result, "", &[]);
        let pending = r.status == 202;
        last = Some(r);
        if pending {
            std::thread::sleep(Duration::from_millis(50));
        }
        !pending
    });
    assert!(
        done,
        "no answer at {result} within {ANSWER_WITHIN:?}: {last:?}"
    );
    last.unwrap()
}

/// The value of metric `name` (or `name_total`) for `chain` on the daemon's metrics page.
fn metric(d: &Daemon, name: &str, chain: &str) -> Option<u64> {
    let page = client().get(d.metrics()).call().ok()?.into_string().ok()?;
    let label = format!("{{chain=\"{chain}\"}} ");
    page.lines().find_map(|l| {
        let rest = l
            .strip_prefix(&format!("{name}_total"))
            .or_else(|| l.strip_prefix(name))?;
        rest.strip_prefix(&label)?.trim().parse().ok()
    })
}

#[test]
fn an_async_request_is_answered_202_and_its_result_fetched_later() {
    let state = TempDir::new("async-state");
    let d = daemon(state.path());
    let applied = d.apply("later", &spec("later", "upper", "", "", None));
    let url = url_of(&applied);
    let result = accepted(&url, "hello", &[]);
    let r = answer(&result);
    assert_eq!((r.status, r.body.as_str()), (200, "HELLO"));
    // Kept: asked again, the same answer.
    let again = send("GET", &result, "", &[]);
    assert_eq!((again.status, again.body.as_str()), (200, "HELLO"));
    // Without the preference the route answers at once; unknown ids are 404.
    let sync = send("POST", &format!("{url}/work"), "now", &[]);
    assert_eq!((sync.status, sync.body.as_str()), (200, "NOW"));
    let unknown = send(
        "GET",
        &format!("{url}/_zerohop/async/{}", "0".repeat(32)),
        "",
        &[],
    );
    assert_eq!(unknown.status, 404);
    let bad = send("GET", &format!("{url}/_zerohop/async/../x"), "", &[]);
    assert_eq!(bad.status, 404);
    // A bad callback is refused before anything is queued.
    let r = send(
        "POST",
        &format!("{url}/work"),
        "x",
        &[("Prefer", "respond-async"), ("X-Callback-Url", "ftp://x/")],
    );
    assert_eq!(r.status, 400, "{r:?}");
    assert_eq!(metric(&d, "zerohop_async_accepted", "later"), Some(1));
    assert_eq!(metric(&d, "zerohop_async_completed", "later"), Some(1));
    d.stop_cleanly();
}

#[test]
fn an_async_route_retries_503_twice_then_succeeds() {
    let state = TempDir::new("async-state");
    let (_tmp, data) = data_folder();
    let d = daemon(state.path());
    let route = "    async: true\n    retry: { attempts: 4, backoff: 20ms, max_backoff: 100ms }\n";
    let applied = d.apply(
        "flaky",
        &spec("flaky", "flaky", "TESTFN_FAILS: 2", route, Some(&data)),
    );
    let url = url_of(&applied);
    let guards = &d.status("flaky")["routes"][0]["guards"];
    assert_eq!(
        guards,
        &serde_json::json!(["async", "retry 4x (20ms to 100ms, on 502/503/504)"]),
        "zerohop status shows how the route delivers"
    );
    // `async: true`: no preference needed.
    let r = send("POST", &format!("{url}/work"), "again", &[]);
    assert_eq!(r.status, 202, "{r:?}");
    let result = format!("{url}{}", r.location.unwrap());
    let r = answer(&result);
    assert_eq!((r.status, r.body.as_str()), (200, "AGAIN"));
    assert_eq!(calls(&data), 3, "two 503s, then the answer");
    assert_eq!(metric(&d, "zerohop_retries", "flaky"), Some(2));
    assert_eq!(metric(&d, "zerohop_dead_lettered", "flaky"), Some(0));
    d.stop_cleanly();
}

#[test]
fn an_idempotent_route_retries_a_synchronous_request() {
    let state = TempDir::new("async-state");
    let (_tmp, data) = data_folder();
    let d = daemon(state.path());
    let route = "    idempotent: true\n    retry: { attempts: 3, backoff: 10ms }\n";
    let applied = d.apply(
        "idem",
        &spec("idem", "flaky", "TESTFN_FAILS: 2", route, Some(&data)),
    );
    let url = url_of(&applied);
    let r = send("POST", &format!("{url}/work"), "sync", &[]);
    assert_eq!((r.status, r.body.as_str()), (200, "SYNC"), "{r:?}");
    assert_eq!(calls(&data), 3);
    // Out of attempts: the client gets the last 503.
    std::fs::write(data.join("calls"), "0").unwrap();
    let applied = d.apply(
        "idem",
        &spec("idem", "flaky", "TESTFN_FAILS: 5", route, Some(&data)),
    );
    let url = url_of(&applied);
    std::fs::write(data.join("calls"), "0").unwrap();
    let r = send("POST", &format!("{url}/work"), "sync", &[]);
    assert_eq!(r.status, 503, "{r:?}");
    assert_eq!(calls(&data), 3, "three attempts, no more");
    assert!(
        !state.path().join("idem").exists(),
        "a chain that took no async request leaves no folder"
    );
    d.stop_cleanly();
}

#[test]
fn what_always_fails_lands_in_the_dlq_and_replay_answers_it_once_fixed() {
    let state = TempDir::new("async-state");
    let (_tmp, data) = data_folder();
    let d = daemon(state.path());
    let route = "    retry: { attempts: 2, backoff: 10ms }\n";
    let applied = d.apply(
        "dead",
        &spec("dead", "flaky", "TESTFN_FAILS: always", route, Some(&data)),
    );
    let url = url_of(&applied);
    let hooks = Callbacks::start();
    let first = accepted(&url, "first", &[("X-Callback-Url", hooks.url.as_str())]);
    let second = accepted(&url, "second", &[]);
    let listed = || d.json(&["dlq", "ls", "dead"]);
    assert!(
        wait_until(ANSWER_WITHIN, || listed().as_array().unwrap().len() == 2),
        "{}",
        listed()
    );
    let r = send("GET", &first, "", &[]);
    assert_eq!(r.status, 503, "a dead letter answers its last error: {r:?}");
    assert!(r.body.contains("dead-letter"), "{}", r.body);
    let id = |u: &str| u.rsplit('/').next().unwrap().to_owned();
    let (a, b) = (id(&first), id(&second));
    // Its callback hears of it: the last status and error, as JSON.
    assert!(
        wait_until(ANSWER_WITHIN, || hooks.hits.load(Ordering::SeqCst) >= 1),
        "the callback was not told of the dead letter"
    );
    let told: Value = serde_json::from_str(&hooks.bodies.lock().unwrap()[0]).unwrap();
    assert_eq!(told["state"], "dead-letter", "{told}");
    assert_eq!(
        (told["id"].as_str(), told["status"].as_u64()),
        (Some(a.as_str()), Some(503))
    );
    assert_eq!(told["attempts"], 2);
    let shown = d.json(&["dlq", "show", "dead", &a]);
    assert_eq!(shown["status"], 503);
    assert_eq!(shown["attempts"], 2);
    assert_eq!(shown["route"], "POST /work");
    assert_eq!(shown["body"], "first");
    assert!(
        shown["error"].as_str().unwrap().contains("fails"),
        "{shown}"
    );
    let text = d.cli(&["dlq", "ls", "dead"]);
    assert!(String::from_utf8_lossy(&text.stdout).contains(&a));
    // Dropped: gone from the queue and from the results.
    d.json(&["dlq", "drop", "dead", &b]);
    assert_eq!(send("GET", &second, "", &[]).status, 404);
    let left: Vec<String> = listed()
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(left, std::slice::from_ref(&a));
    // Fixed, then replayed: answered.
    std::fs::write(data.join("fixed"), "").unwrap();
    d.json(&["dlq", "replay", "dead", &a]);
    let r = answer(&first);
    assert_eq!((r.status, r.body.as_str()), (200, "FIRST"));
    assert!(listed().as_array().unwrap().is_empty());
    // And of its result, once replayed: once each.
    assert!(
        wait_until(ANSWER_WITHIN, || hooks.hits.load(Ordering::SeqCst) >= 2),
        "the callback was not given the replayed result"
    );
    assert_eq!(hooks.bodies.lock().unwrap()[1], "FIRST");
    let missing = d.cli(&["dlq", "show", "dead", &b]);
    assert!(!missing.status.success());
    assert_eq!(metric(&d, "zerohop_dead_lettered", "dead"), Some(2));
    assert_eq!(metric(&d, "zerohop_async_completed", "dead"), Some(1));
    d.stop_cleanly();
}

/// A callback server: counts the POSTs it gets and keeps their bodies.
struct Callbacks {
    url: String,
    bodies: Arc<Mutex<Vec<String>>>,
    hits: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Callbacks {
    fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        let bodies = Arc::new(Mutex::new(Vec::new()));
        let hits = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (b, h, s) = (bodies.clone(), hits.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                let Ok((stream, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                };
                stream.set_nonblocking(false).unwrap();
                stream
                    .set_read_timeout(Some(Duration::from_secs(5)))
                    .unwrap();
                let mut r = BufReader::new(stream);
                let mut len = 0usize;
                let mut line = String::new();
                while r.read_line(&mut line).is_ok_and(|n| n > 0) {
                    if line == "\r\n" {
                        break;
                    }
                    if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                        len = v.trim().parse().unwrap_or(0);
                    }
                    line.clear();
                }
                let mut body = vec![0; len];
                if r.read_exact(&mut body).is_err() {
                    continue;
                }
                h.fetch_add(1, Ordering::SeqCst);
                b.lock()
                    .unwrap()
                    .push(String::from_utf8_lossy(&body).into_owned());
                let _ = r.get_mut().write_all(
                    b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                );
            }
        });
        Self {
            url,
            bodies,
            hits,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Callbacks {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[test]
fn a_daemon_killed_between_the_202_and_the_answer_answers_once_after_its_restart() {
    let state = TempDir::new("async-state");
    let hooks = Callbacks::start();
    let chain = spec("crash", "slow", "DELAY_MS: 1500", "    async: true\n", None);
    let mut d = daemon(state.path());
    let url = url_of(&d.apply("crash", &chain));
    let r = send(
        "POST",
        &format!("{url}/work"),
        "survive",
        &[("X-Callback-Url", hooks.url.as_str())],
    );
    assert_eq!(r.status, 202, "{r:?}");
    let location = r.location.unwrap();
    // The function holds it (1.5 s): the daemon dies under it.
    std::thread::sleep(Duration::from_millis(300));
    signal_pid(d.pid(), Signal::SIGKILL);
    assert_eq!(d.stop(), None, "killed by the signal");
    assert_eq!(hooks.hits.load(Ordering::SeqCst), 0);
    drop(d);

    let d = daemon(state.path());
    let url = url_of(&d.apply("crash", &chain));
    let r = answer(&format!("{url}{location}"));
    assert_eq!((r.status, r.body.as_str()), (200, "SURVIVE"));
    assert!(
        wait_until(ANSWER_WITHIN, || hooks.hits.load(Ordering::SeqCst) >= 1),
        "the callback was never called"
    );
    // Long enough for a second run or a second delivery to show.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        hooks.hits.load(Ordering::SeqCst),
        1,
        "answered exactly once"
    );
    assert_eq!(hooks.bodies.lock().unwrap().as_slice(), ["SURVIVE"]);
    assert_eq!(metric(&d, "zerohop_async_completed", "crash"), Some(1));
    d.stop_cleanly();
}

/// The runs of an async request that failed before the daemon died count against the route's
/// attempts after its restart: a request that always fails runs `attempts` times in all, not
/// `attempts` more after every restart.
#[test]
fn runs_that_failed_before_a_restart_count_against_the_attempts() {
    let state = TempDir::new("async-state");
    let (_tmp, data) = data_folder();
    let route = "    retry: { attempts: 3, backoff: 10ms }\n";
    let chain = spec(
        "count",
        "flaky",
        "TESTFN_FAILS: always, DELAY_MS: 1000",
        route,
        Some(&data),
    );
    let mut d = daemon(state.path());
    let url = url_of(&d.apply("count", &chain));
    let result = accepted(&url, "once", &[]);
    let location = result.strip_prefix(&url).unwrap().to_owned();
    // Run 1 fails after a second; run 2 is counted as it starts, and the daemon dies under it.
    assert!(
        wait_until(ANSWER_WITHIN, || calls(&data) >= 2),
        "no second run: {} calls",
        calls(&data)
    );
    signal_pid(d.pid(), Signal::SIGKILL);
    assert_eq!(d.stop(), None, "killed by the signal");
    drop(d);

    let d = daemon(state.path());
    let url = url_of(&d.apply("count", &chain));
    let r = answer(&format!("{url}{location}"));
    assert_eq!(r.status, 503, "dead-lettered: {r:?}");
    // The interrupted run 2 is run again, then run 3: four calls in all (five, had the
    // failed run 1 been forgotten).
    assert_eq!(calls(&data), 4, "runs after the restart");
    let id = location.rsplit('/').next().unwrap();
    let shown = d.json(&["dlq", "show", "count", id]);
    assert_eq!(shown["attempts"], 3, "{shown}");
    d.stop_cleanly();
}
