//! Live update end to end: `zerohop apply` of a changed spec to a chain the real `zerohop
//! agent` daemon runs, while real keep-alive HTTP clients post to it without a pause. Every
//! answer of every run is kept (when it was sent, when it came back, status, body) and judged
//! afterwards: nothing may fail, answers before an update are the old version's, answers to
//! requests sent after `apply` returned are the new one's. What `zerohop status --json` shows
//! (pids, states, restarts) tells what was restarted. Times are measured and printed; they
//! only bound the waits.

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::daemon::{zerohop, Daemon, CLI_BOUND};
use common::{client, post, testfn};
use serde_json::Value;
use zerohop_test_support::{descendants, instances, stat, wait_until, TempDir};

/// The tests here put a chain under load on a small machine: one at a time, so that one
/// test's load does not starve another's new instances.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// Requests sent this long after `apply` returned must meet only the new version (what was
/// sent before may still be answered by an old instance that drains).
const SLACK: Duration = Duration::from_millis(100);

/// Writes `spec` to the daemon's folder as `NAME.yaml` (the same file each time, as an
/// operator edits one spec) and runs `zerohop apply` on it, timed.
fn apply(d: &Daemon, name: &str, spec: &str) -> Applied {
    apply_file(d.socket(), &d.write(name, spec))
}

/// Brings chain `name` up from `spec`; returns its HTTP URL.
fn create(d: &Daemon, name: &str, spec: &str) -> String {
    let a = apply(d, name, spec);
    assert!(a.ok, "apply failed: {}", a.stderr);
    let first = a.stdout.lines().next().unwrap_or_default();
    let prefix = format!("chain '{name}' created: ");
    first
        .strip_prefix(&prefix)
        .unwrap_or_else(|| panic!("{first:?} does not start with {prefix:?}"))
        .trim()
        .to_owned()
}

/// Runs `zerohop apply FILE --socket SOCKET`, timed (a function of its own, so that a test
/// can apply on one thread and watch the status on another).
fn apply_file(socket: &Path, file: &Path) -> Applied {
    let file = file.to_str().expect("a UTF-8 temp path");
    let started = Instant::now();
    let out = zerohop(socket, &["apply", file], CLI_BOUND);
    let returned = Instant::now();
    Applied {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        started,
        returned,
    }
}

/// What one `zerohop apply` did.
struct Applied {
    ok: bool,
    stdout: String,
    stderr: String,
    started: Instant,
    returned: Instant,
}

impl Applied {
    fn took(&self) -> Duration {
        self.returned - self.started
    }

    /// Asserts the chain was updated and the change lines are `changes`, in order.
    fn assert_updated(&self, name: &str, changes: &[&str]) {
        assert!(self.ok, "apply failed: {}{}", self.stdout, self.stderr);
        let mut lines = self.stdout.lines();
        let first = lines.next().unwrap_or_default();
        assert!(
            first.starts_with(&format!("chain '{name}' updated: http://")),
            "{}",
            self.stdout
        );
        let listed: Vec<&str> = lines.map(str::trim).collect();
        assert_eq!(listed, changes, "the changes apply lists");
    }

    fn assert_unchanged(&self, name: &str) {
        assert!(self.ok, "apply failed: {}", self.stderr);
        assert!(
            self.stdout
                .starts_with(&format!("chain '{name}' unchanged: http://")),
            "{}",
            self.stdout
        );
        assert_eq!(self.stdout.lines().count(), 1, "{}", self.stdout);
    }

    /// Asserts apply failed, and returns its message with runs of white space made one
    /// space (the daemon's refusal has a run of spaces inside "`zerohop down NAME`": a string
    /// literal broken over two lines without its `\`; what is checked here is the words).
    fn assert_failed(&self) -> String {
        assert!(
            !self.ok,
            "apply succeeded but should not have: {}",
            self.stdout
        );
        self.stderr.split_whitespace().collect::<Vec<_>>().join(" ")
    }
}

/// A function entry for `zerohop-testfn` (or `program`) in `mode`, with extra fields.
fn function(name: &str, program: &str, mode: &str, fields: &str) -> String {
    format!(
        "  {name}: {{ command: [\"{program}\"], env: {{ TESTFN_MODE: {mode}, TESTFN_NAME: {name} \
         }}{fields} }}\n"
    )
}

/// The chain every test here updates: `a` upper-cases (two fixed instances), `b` scales
/// between 1 and 3 (one more parked), running `b_mode` with `b_fields`.
fn chain(name: &str, a_program: &str, b_program: &str, b_mode: &str, b_fields: &str) -> String {
    format!(
        "name: {name}\npool: {{ slots: 128, slot_size: 16KiB }}\ntimeout: 5s\nfunctions:\n{}{}\
         routes:\n  - http: POST /go\n    sequence: [a, b]\n",
        function("a", a_program, "upper", ", instances: 2"),
        function("b", b_program, b_mode, b_fields)
    )
}

const B_SCALE: &str = ", scale: { min: 1, max: 3 }";

/// `b`'s bounds where load does not scale it out (8 requests in flight per instance): one
/// instance serves and one stays parked, so an update meets a parked instance too.
const B_STEADY: &str = ", scale: { min: 1, max: 3, target: 8 }";

/// `exclaim` after `a`: the old version's answer.
fn exclaimed(req: &str) -> String {
    format!("{}!", req.to_uppercase())
}

/// `upper` after `a`: the new version's answer.
fn uppered(req: &str) -> String {
    req.to_uppercase()
}

/// One answer a client got.
struct Answer {
    sent: Instant,
    done: Instant,
    /// 0: no HTTP answer (the body says what went wrong).
    status: u16,
    request: String,
    body: String,
}

/// Keep-alive clients posting to `url` back to back until finished; every answer is kept.
struct Load {
    stop: Arc<AtomicBool>,
    /// Per client: when it sent the latest request that got an HTTP answer.
    latest: Arc<Mutex<Vec<Option<Instant>>>>,
    threads: Vec<JoinHandle<Vec<Answer>>>,
}

impl Load {
    /// Starts the clients and returns once each has had its first HTTP answer.
    fn start(url: &str, clients: usize) -> Self {
        let began = Instant::now();
        let stop = Arc::new(AtomicBool::new(false));
        let latest = Arc::new(Mutex::new(vec![None; clients]));
        let threads = (0..clients)
            .map(|c| {
                let (url, stop, latest) = (url.to_owned(), stop.clone(), latest.clone());
                std::thread::spawn(move || {
                    let http = client();
                    let mut answers = Vec::new();
                    let mut n = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        let request = format!("client {c} request {n}");
                        let sent = Instant::now();
                        let (status, body) = match http.post(&url).send_string(&request) {
                            Ok(r) => (r.status(), r.into_string().unwrap_or_default()),
                            Err(ureq::Error::Status(s, r)) => {
                                (s, r.into_string().unwrap_or_default())
                            }
                            Err(e) => (0, e.to_string()),
                        };
                        let done = Instant::now();
                        let refused = status == 0;
                        if !refused {
                            latest.lock().expect("the load's clients")[c] = Some(sent);
                        }
                        answers.push(Answer {
                            sent,
                            done,
                            status,
                            request,
                            body,
                        });
                        if refused {
                            // Not hammering a listener that is gone; the answer is counted.
                            std::thread::sleep(Duration::from_millis(10));
                        }
                        n += 1;
                    }
                    answers
                })
            })
            .collect();
        // Made first, so that a failed wait stops the clients as it unwinds (Drop).
        let load = Self {
            stop,
            latest,
            threads,
        };
        // Every client has had its first answer: the chain serves under load.
        load.answered_after(began, "the load getting going");
        load
    }

    /// Waits until every client has had an HTTP answer to a request it sent after `t`: the
    /// load went on past `t`, so answers from after it are there to be judged. Panics saying
    /// that `what` never happened, after a guard of 30 s.
    fn answered_after(&self, t: Instant, what: &str) {
        let guard = Duration::from_secs(30);
        // (clients past `t`, clients)
        let past = || {
            let latest = self.latest.lock().expect("the load's clients");
            let n = latest.iter().filter(|l| l.is_some_and(|s| s > t)).count();
            (n, latest.len())
        };
        assert!(
            wait_until(guard, || {
                let (n, clients) = past();
                n == clients
            }),
            "{what} never happened: {:?} (clients with an HTTP answer to a request sent after \
             it, clients) within {guard:?}",
            past()
        );
    }

    /// Stops the clients once their current requests are answered; returns every answer.
    fn finish(mut self) -> Vec<Answer> {
        self.stop.store(true, Ordering::Relaxed);
        let mut all: Vec<Answer> = self
            .threads
            .drain(..)
            .flat_map(|t| t.join().expect("a client thread panicked"))
            .collect();
        all.sort_by_key(|a| a.sent);
        all
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// How the answers around one update fared.
#[derive(Debug, Default)]
struct Verdict {
    total: usize,
    /// Requests sent while `apply` ran.
    during: usize,
    /// Of those, answered by the old and by the new version.
    during_old: usize,
    during_new: usize,
}

/// Judges `answers` around the update `u`: every one 200; those answered before `apply`
/// started have the old body, those sent after it returned (plus [`SLACK`]) the new body,
/// the rest either. Answers outside `(from, to)` (by send time) are left out, so that one load
/// can span several updates.
fn judge(
    what: &str,
    answers: &[Answer],
    u: &Applied,
    window: (Instant, Instant),
    old: fn(&str) -> String,
    new: fn(&str) -> String,
) -> Verdict {
    let mut v = Verdict::default();
    let mut wrong = Vec::new();
    // Milliseconds from apply's start, negative before it.
    let at = |t: Instant| {
        if t >= u.started {
            (t - u.started).as_secs_f64() * 1e3
        } else {
            -(u.started - t).as_secs_f64() * 1e3
        }
    };
    for a in answers
        .iter()
        .filter(|a| a.sent >= window.0 && a.sent < window.1)
    {
        v.total += 1;
        let (was_old, was_new) = (a.body == old(&a.request), a.body == new(&a.request));
        let during = a.sent >= u.started && a.sent <= u.returned;
        if during {
            v.during += 1;
            v.during_old += usize::from(was_old);
            v.during_new += usize::from(was_new && !was_old);
        }
        let fine = a.status == 200
            && if a.done < u.started {
                was_old
            } else if a.sent > u.returned + SLACK {
                was_new
            } else {
                was_old || was_new
            };
        if !fine {
            wrong.push(format!(
                "sent at {:+.1} ms, answered at {:+.1} ms (apply {:.1} ms): {:?} -> {} {:?}",
                at(a.sent),
                at(a.done),
                u.took().as_secs_f64() * 1e3,
                a.request,
                a.status,
                a.body
            ));
        }
    }
    let versions = if old("x") == new("x") {
        "old and new answer alike".to_owned()
    } else {
        format!(
            "{} by the old version, {} by the new",
            v.during_old, v.during_new
        )
    };
    eprintln!(
        "{what}: apply took {:.0} ms; {} answers judged, {} sent during the update ({versions}), \
         {} wrong",
        u.took().as_secs_f64() * 1e3,
        v.total,
        v.during,
        wrong.len()
    );
    assert!(
        wrong.is_empty(),
        "{what}: {} wrong answer(s), the first: {:#?}",
        wrong.len(),
        &wrong[..wrong.len().min(10)]
    );
    assert!(v.total > 0, "{what}: no answer at all");
    v
}

/// One instance as status lists it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Inst {
    function: String,
    party: u64,
    pid: Option<u32>,
    state: String,
    restarts: u64,
}

fn listed(status: &Value) -> Vec<Inst> {
    let mut all = Vec::new();
    for f in status["functions"].as_array().expect("functions") {
        for i in f["instances"].as_array().expect("instances") {
            all.push(Inst {
                function: f["name"].as_str().unwrap().to_owned(),
                party: i["party"].as_u64().unwrap(),
                pid: i["pid"].as_u64().map(|p| p as u32),
                state: i["state"].as_str().unwrap().to_owned(),
                restarts: i["restarts"].as_u64().unwrap(),
            });
        }
    }
    all
}

fn pids(list: &[Inst]) -> BTreeSet<u32> {
    list.iter().filter_map(|i| i.pid).collect()
}

/// The pids of the instances in `state`.
fn pids_in(list: &[Inst], state: &str) -> BTreeSet<u32> {
    list.iter()
        .filter(|i| i.state == state)
        .filter_map(|i| i.pid)
        .collect()
}

fn count(list: &[Inst], function: &str, state: &str) -> usize {
    list.iter()
        .filter(|i| i.function == function && i.state == state)
        .count()
}

fn shape(list: &[Inst]) -> String {
    list.iter()
        .map(|i| {
            format!(
                "{}/{}:{}:{}",
                i.function,
                i.party,
                i.state,
                i.pid.map_or("-".into(), |p| p.to_string())
            )
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Polls the chain's status (at most `timeout`) until `done` holds for its instances.
fn wait_for(
    d: &Daemon,
    chain: &str,
    timeout: Duration,
    what: &str,
    done: impl Fn(&[Inst]) -> bool,
) -> Vec<Inst> {
    let deadline = Instant::now() + timeout;
    let t = Instant::now();
    loop {
        let list = listed(&d.status(chain));
        if done(&list) {
            eprintln!(
                "{what}: after {:.0} ms: {}",
                t.elapsed().as_secs_f64() * 1e3,
                shape(&list)
            );
            return list;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: not within {timeout:?}: {}",
            shape(&list)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `a` with its two instances ready, `b` with one ready and one parked: the chain at rest.
fn at_rest(list: &[Inst]) -> bool {
    count(list, "a", "ready") == 2
        && count(list, "b", "ready") >= 1
        && count(list, "b", "parked") == 1
        && list
            .iter()
            .all(|i| i.pid.is_some() && matches!(i.state.as_str(), "ready" | "parked"))
}

/// Every instance listed has a process and serves or waits parked, with `a`'s two and at
/// least one of `b` ready: the chain serves, whatever the load scaled `b` to.
fn serving(list: &[Inst]) -> bool {
    count(list, "a", "ready") == 2
        && count(list, "b", "ready") >= 1
        && count(list, "b", "ready") + count(list, "b", "parked") <= 3
        && list
            .iter()
            .all(|i| i.pid.is_some() && matches!(i.state.as_str(), "ready" | "parked"))
}

/// The daemon's instance processes are exactly those the status lists (no old version left
/// running, no broken new one), and nothing else runs below the daemon but its spawner.
fn assert_only_listed(d: &Daemon, chain: &str) {
    let mut last = (BTreeSet::new(), BTreeSet::new());
    let settled = wait_until(Duration::from_secs(10), || {
        let running: BTreeSet<u32> = instances(d.pid()).into_iter().collect();
        let shown = pids(&listed(&d.status(chain)));
        let below = descendants(&[d.pid()]).len();
        let same = running == shown && below == 2 + running.len();
        last = (running, shown);
        same
    });
    assert!(
        settled,
        "the daemon's instance processes {:?} are not those its status lists {:?} (or something \
         else runs below it: {:?})",
        last.0,
        last.1,
        descendants(&[d.pid()])
            .iter()
            .map(|&p| stat(p).map(|s| (p, s.comm)))
            .collect::<Vec<_>>()
    );
}

/// Replaces the program at `path` with a fresh copy of `from`: a new file renamed over it
/// (a running binary cannot be written in place: ETXTBSY), so its inode and modification
/// time change, as a rebuild's do.
fn rebuild(from: &Path, path: &Path) {
    let fresh = path.with_extension("new");
    std::fs::copy(from, &fresh).expect("copy the test function");
    let later = std::time::SystemTime::now() + Duration::from_secs(1);
    std::fs::File::options()
        .write(true)
        .open(&fresh)
        .and_then(|f| f.set_modified(later))
        .expect("set the new binary's modification time");
    std::fs::rename(&fresh, path).expect("rename the new binary over the old");
}

#[test]
fn apply_of_a_new_version_under_load_fails_no_request() {
    let _serial = serial();
    let d = Daemon::start();
    let t = testfn();
    let v1 = chain("roll", &t, &t, "exclaim", B_SCALE);
    let url = create(&d, "roll", &v1);
    let rest = wait_for(&d, "roll", Duration::from_secs(10), "coming up", at_rest);

    // The same spec again: nothing changes, nothing restarts.
    let same = apply(&d, "roll", &v1);
    same.assert_unchanged("roll");
    let after = listed(&d.status("roll"));
    assert_eq!(after, rest, "an unchanged apply restarted nothing");

    // b's environment changes (exclaim -> upper) under four keep-alive clients.
    let load = Load::start(&format!("{url}/go"), 4);
    let before_env = pids(&listed(&d.status("roll")));
    let v2 = chain("roll", &t, &t, "upper", B_SCALE);
    let env = apply(&d, "roll", &v2);
    env.assert_updated(
        "roll",
        &["function 'b': new environment; rolling its instances"],
    );
    let after_env = listed(&d.status("roll"));
    eprintln!("after the environment update: {}", shape(&after_env));
    let b_before: BTreeSet<u32> = rest
        .iter()
        .filter(|i| i.function == "b")
        .filter_map(|i| i.pid)
        .collect();
    assert!(
        after_env
            .iter()
            .filter(|i| i.function == "b")
            .all(|i| i.pid.is_none_or(|p| !b_before.contains(&p))),
        "every instance of b is new: before {b_before:?}, after {}",
        shape(&after_env)
    );
    assert!(
        after_env
            .iter()
            .filter(|i| i.function == "a")
            .all(|i| i.pid.is_some_and(|p| before_env.contains(&p))),
        "a's instances are untouched: {}",
        shape(&after_env)
    );
    load.answered_after(
        env.returned + SLACK,
        "the load going on after the environment update",
    );

    // a and b move to a copy of the program elsewhere (a new command for both), in a folder
    // the chain's uid can reach, as a build folder is (the agent runs it by path)...
    let bin = TempDir::new("update-bin");
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(bin.path(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod the program's folder");
    }
    let copy = bin.path().join("zerohop-testfn");
    std::fs::copy(&t, &copy).expect("copy the test function");
    let c = copy.display().to_string();
    let v3 = chain("roll", &c, &c, "upper", B_SCALE);
    let moved = apply(&d, "roll", &v3);
    moved.assert_updated(
        "roll",
        &[
            "function 'a': new command; rolling its instances",
            "function 'b': new command; rolling its instances",
        ],
    );
    load.answered_after(
        moved.returned + SLACK,
        "the load going on after the new command",
    );

    // ...which is then rebuilt in place: the same spec applied again rolls both.
    let before_binary = pids(&listed(&d.status("roll")));
    rebuild(Path::new(&t), &copy);
    let binary = apply(&d, "roll", &v3);
    binary.assert_updated(
        "roll",
        &[
            "function 'a': new binary; rolling its instances",
            "function 'b': new binary; rolling its instances",
        ],
    );
    // The agent lists an instance's pid once its spawner reported it, which on a loaded
    // machine can come a moment after the roll: wait for that, bounded.
    let all_new = |now: &[Inst]| {
        now.iter()
            .all(|i| i.pid.is_some_and(|p| !before_binary.contains(&p)))
    };
    let mut after_binary = listed(&d.status("roll"));
    let settled = wait_until(Duration::from_secs(10), || {
        after_binary = listed(&d.status("roll"));
        all_new(&after_binary)
    });
    eprintln!("after the new binary: {}", shape(&after_binary));
    assert!(
        settled,
        "every instance has a new pid after the new binary: before {before_binary:?}, after {}",
        shape(&after_binary)
    );
    load.answered_after(
        binary.returned + SLACK,
        "the load going on after the new binary",
    );
    let answers = load.finish();
    let end = Instant::now();

    let first = answers.first().expect("answers").sent;
    let e = judge(
        "environment (b: exclaim -> upper)",
        &answers,
        &env,
        (first, moved.started),
        exclaimed,
        uppered,
    );
    let m = judge(
        "command (a and b: a copy of the program)",
        &answers,
        &moved,
        (env.returned + SLACK, binary.started),
        uppered,
        uppered,
    );
    let b = judge(
        "binary (the copy rebuilt in place)",
        &answers,
        &binary,
        (moved.returned + SLACK, end),
        uppered,
        uppered,
    );
    let failed = answers.iter().filter(|a| a.status != 200).count();
    eprintln!(
        "whole run: {} answers over {:.1} s, {failed} not 200",
        answers.len(),
        (answers.last().unwrap().done - first).as_secs_f64()
    );
    assert_eq!(failed, 0, "every answer of the whole run is 200");
    assert!(
        e.during > 0 && m.during > 0 && b.during > 0,
        "requests were in flight during each update: {e:?} {m:?} {b:?}"
    );

    // Settled: both functions serve, nothing of an old version is left.
    let settled = wait_for(&d, "roll", Duration::from_secs(15), "settled", serving);
    assert_only_listed(&d, "roll");
    // Each request was answered once, none failed, and a planned replacement is no restart.
    let s = d.status("roll");
    let gw = &s["gateway"];
    assert_eq!(
        (
            gw["ok"].as_u64(),
            gw["errors"].as_u64(),
            gw["late"].as_u64()
        ),
        (Some(answers.len() as u64), Some(0), Some(0)),
        "{gw}"
    );
    assert!(
        settled.iter().all(|i| i.restarts == 0),
        "restarts counted for instances replaced by an update: {}",
        listed(&s)
            .iter()
            .map(|i| format!("{}/{}: {}", i.function, i.party, i.restarts))
            .collect::<Vec<_>>()
            .join(", ")
    );

    // Applied again as it is (the rebuilt binary is now the running one): unchanged.
    let again = apply(&d, "roll", &v3);
    again.assert_unchanged("roll");
    let now = listed(&d.status("roll"));
    assert_eq!(
        pids(&now),
        pids(&settled),
        "an unchanged apply restarted nothing"
    );
    let r = post(&client(), &format!("{url}/go"), "done");
    assert_eq!((r.status, r.body.as_str()), (200, "DONE"));
    d.stop_cleanly();
}

/// Under load, `b` is updated to `broken` (a command that never serves); apply must fail,
/// saying `why`, and the old version must keep serving every request. With `watch`, the
/// status is read while apply runs: it answers, and shows the new version's instance
/// starting.
fn rolled_back(d: &Daemon, url: &str, v1: &str, broken: &str, why: &str, what: &str, watch: bool) {
    let rest = wait_for(d, "back", Duration::from_secs(20), "at rest", at_rest);
    let served = pids_in(&rest, "ready");
    let load = Load::start(&format!("{url}/go"), 4);
    let file = d.write("back", broken);
    let u = std::thread::scope(|scope| {
        let socket = d.socket();
        let applying = scope.spawn(|| apply_file(socket, &file));
        if watch {
            let t = Instant::now();
            let seen = wait_for(
                d,
                "back",
                Duration::from_secs(8),
                &format!("{what}: while apply runs"),
                |l| l.iter().any(|i| i.function == "b" && i.state == "starting"),
            );
            assert!(!applying.is_finished(), "{}", shape(&seen));
            eprintln!(
                "{what}: status answered while apply ran, the new instance starting after {:.0} \
                 ms",
                t.elapsed().as_secs_f64() * 1e3
            );
        }
        applying.join().expect("the apply thread")
    });
    let message = u.assert_failed();
    load.answered_after(
        u.returned + SLACK,
        &format!("{what}: the load going on after it"),
    );
    let answers = load.finish();
    eprintln!("{what}: apply said: {message}");
    assert!(
        message.contains(&format!("function 'b': the new version {why}"))
            && message.contains("the old version keeps running")
            && message.contains("zerohop logs back b"),
        "{message}"
    );
    // Every answer, during the attempt too, came from the old version.
    let all = (answers[0].sent, Instant::now());
    let v = judge(what, &answers, &u, all, exclaimed, exclaimed);
    assert!(v.during > 0, "requests were in flight during the attempt");

    // The old instance that served still serves, b has a parked instance again (of the old
    // version: the new one never parks), and whatever the new version started is gone.
    let after = wait_for(
        d,
        "back",
        Duration::from_secs(20),
        &format!("{what}: after the rollback"),
        at_rest,
    );
    let still = pids_in(&after, "ready");
    assert!(
        served.is_subset(&still),
        "the instances that served before ({served:?}) still serve: {}",
        shape(&after)
    );
    assert_only_listed(d, "back");
    // What runs is still the old spec: applying it again changes nothing.
    apply(d, "back", v1).assert_unchanged("back");
    let r = post(&client(), &format!("{url}/go"), "old");
    assert_eq!((r.status, r.body.as_str()), (200, "OLD!"));
}

#[test]
fn a_broken_new_version_is_rolled_back() {
    let _serial = serial();
    let d = Daemon::start();
    let t = testfn();
    let v1 = chain("back", &t, &t, "exclaim", B_STEADY);
    let url = create(&d, "back", &v1);

    // A program that exits at once, before it ever attaches.
    rolled_back(
        &d,
        &url,
        &v1,
        &chain("back", &t, "/bin/true", "exclaim", B_STEADY),
        "exited before it was ready",
        "b -> /bin/true",
        false,
    );
    // A program that runs on but never attaches: the 10 s bound.
    let sleeps = format!(
        "name: back\npool: {{ slots: 128, slot_size: 16KiB }}\ntimeout: 5s\nfunctions:\n{}  b: {{ \
         command: [\"/bin/sleep\", \"60\"], env: {{ TESTFN_MODE: exclaim, TESTFN_NAME: b }}{B_STEADY} \
         }}\nroutes:\n  - http: POST /go\n    sequence: [a, b]\n",
        function("a", &t, "upper", ", instances: 2"),
    );
    rolled_back(
        &d,
        &url,
        &v1,
        &sleeps,
        "was not ready within 10s",
        "b -> /bin/sleep 60",
        true,
    );

    // After two rollbacks, a good new version still rolls out; this one changes all that
    // can change at once: environment, system calls, resources and scaling bounds.
    let load = Load::start(&format!("{url}/go"), 4);
    let good = apply(
        &d,
        "back",
        &chain(
            "back",
            &t,
            &t,
            "upper",
            ", syscalls: [personality], resources: { memory: 64MiB, pids: 64 }, scale: { min: 1, \
             max: 3, target: 6 }",
        ),
    );
    good.assert_updated(
        "back",
        &[
            "function 'b': new environment, system calls, resources; rolling its instances",
            "function 'b': scale target 8 -> 6",
        ],
    );
    load.answered_after(
        good.returned + SLACK,
        "the load going on after the good version",
    );
    let answers = load.finish();
    let all = (answers[0].sent, Instant::now());
    judge(
        "a good version after the rollbacks",
        &answers,
        &good,
        all,
        exclaimed,
        uppered,
    );
    assert_only_listed(&d, "back");
    d.stop_cleanly();
}

/// Asserts `u` replaced chain `name` at `url` (the same address), the first change line
/// starting with `replaced: {why}`; returns the change lines.
fn assert_replaced(u: &Applied, name: &str, url: &str, why: &str) -> Vec<String> {
    assert!(u.ok, "apply failed: {}{}", u.stdout, u.stderr);
    let mut lines = u.stdout.lines();
    assert_eq!(
        lines.next(),
        Some(format!("chain '{name}' replaced: {url}").as_str()),
        "{}",
        u.stdout
    );
    let changes: Vec<String> = lines.map(|l| l.trim().to_owned()).collect();
    assert!(
        changes
            .first()
            .is_some_and(|c| c.starts_with(&format!("replaced: {why}"))),
        "the change says why the chain was replaced ({why}): {changes:?}"
    );
    changes
}

#[test]
fn structural_changes_replace_the_chain_under_load() {
    let _serial = serial();
    let d = Daemon::start();
    let t = testfn();
    let v1 = chain("fixed", &t, &t, "exclaim", B_SCALE);
    let url = create(&d, "fixed", &v1);
    let mut before = wait_for(&d, "fixed", Duration::from_secs(10), "coming up", at_rest);
    let load = Load::start(&format!("{url}/go"), 4);
    let first = Instant::now();

    let route = format!("{v1}  - http: POST /other\n    sequence: [a]\n");
    let added = route.replace(
        "routes:\n",
        &format!("{}routes:\n", function("c", &t, "exclaim", "")),
    ) + "  - http: POST /c\n    sequence: [c]\n";
    let pool = added.replace("slots: 128", "slots: 256");
    let concurrency = pool.replace(", instances: 2", ", instances: 2, concurrency: 2");
    let wider = concurrency.replace(B_SCALE, ", scale: { min: 1, max: 5 }");
    // The new chain's gateway threads share the old one's sockets: one takes both, then
    // three share one.
    let one_thread = format!("{wider}gateway_threads: 1\n");
    let three_threads = format!("{wider}gateway_threads: 3\n");
    let cases = [
        ("a route added", route, "its routes change"),
        (
            "a function added",
            added,
            "its functions change (a, b -> a, b, c)",
        ),
        ("the pool grown", pool, "its pool changes;"),
        (
            "a's concurrency changed",
            concurrency,
            "function 'a' changes more than its program",
        ),
        (
            "b's max beyond its reserved parties",
            wider,
            "function 'b' would run up to 5 instances, beyond the 3 the chain reserved",
        ),
        (
            "one gateway thread",
            one_thread,
            "its gateway_threads changes",
        ),
        (
            "three gateway threads",
            three_threads,
            "its gateway_threads changes",
        ),
    ];
    let mut last = None;
    let http = client();
    for (what, spec, why) in &cases {
        let u = apply(&d, "fixed", spec);
        let changes = assert_replaced(&u, "fixed", &url, why);
        eprintln!(
            "{what}: replaced in {:.0} ms: {changes:?}",
            u.took().as_secs_f64() * 1e3
        );
        // Every instance is new, the old chain's processes (instances, reaper, spawner)
        // are gone, and the new routes answer.
        // (Under the load b may have scaled out, past 3 once its max is 5.)
        let after = wait_for(&d, "fixed", Duration::from_secs(10), what, |l| {
            count(l, "a", "ready") == 2
                && count(l, "b", "ready") >= 1
                && l.iter()
                    .all(|i| i.pid.is_some() && matches!(i.state.as_str(), "ready" | "parked"))
        });
        assert!(
            pids(&before).is_disjoint(&pids(&after)),
            "{what}: the new chain runs new instances: before {}, after {}",
            shape(&before),
            shape(&after)
        );
        assert_only_listed(&d, "fixed");
        let r = post(&http, &format!("{url}/other"), "new route");
        assert_eq!((r.status, r.body.as_str()), (200, "NEW ROUTE"), "{what}");
        if spec.contains("POST /c") {
            let r = post(&http, &format!("{url}/c"), "c");
            assert_eq!((r.status, r.body.as_str()), (200, "c!"), "{what}");
        }
        before = after;
        last = Some(u);
    }
    if let Some(u) = &last {
        load.answered_after(
            u.returned + SLACK,
            "the load going on after the replacements",
        );
    }
    let answers = load.finish();
    // Every request of the load, before, during and after the replacements: answered,
    // 200, right (both versions answer /go alike).
    let all = (first - Duration::from_secs(1), Instant::now());
    let v = judge(
        "seven replacements",
        &answers,
        &last.expect("a case ran"),
        all,
        exclaimed,
        exclaimed,
    );
    assert!(v.total > 100, "the load ran throughout: {v:?}");
    let s = d.status("fixed");
    assert_eq!(s["functions"][1]["max"].as_u64(), Some(5), "{s}");
    // And again, unchanged: nothing happens.
    apply(&d, "fixed", &cases[6].1).assert_unchanged("fixed");
    d.stop_cleanly();
}

#[test]
fn a_replaced_chain_keeps_its_state_and_coap_socket_and_mqtt_chains_are_refused() {
    let _serial = serial();
    let d = Daemon::start();
    let graphfn = zerohop_test_support::target_bin("zerohop-graphfn");
    let count = format!(
        "  count: {{ command: [\"{}\"], env: {{ GRAPH_MODE: count }}, state: true }}\n",
        graphfn.display()
    );
    let v1 = format!(
        "name: kept\ntimeout: 5s\nstate: {{ entries: 16, value_size: 64 }}\nfunctions:\n\
         {count}routes:\n  - http: POST /count\n    sequence: [count]\n"
    );
    let url = create(&d, "kept", &v1);
    let http = client();
    for n in 1..=3 {
        let r = post(&http, &format!("{url}/count"), "hits");
        assert_eq!((r.status, r.body), (200, n.to_string()));
    }
    let v2 = format!("{v1}  - http: POST /again\n    sequence: [count]\n");
    let u = apply(&d, "kept", &v2);
    assert_replaced(&u, "kept", &url, "its routes change");
    let r = post(&http, &format!("{url}/again"), "hits");
    assert_eq!(
        (r.status, r.body.as_str()),
        (200, "4"),
        "the new chain counts on in the old chain's state"
    );
    // A state store of another size would lose what it holds: refused, nothing changes.
    let resized = v2.replace("entries: 16", "entries: 32");
    let message = apply(&d, "kept", &resized).assert_failed();
    assert!(
        message.contains(
            "chain 'kept' cannot change while it runs: its state store would change from 16 \
             entries of 64 bytes to 32 of 64"
        ),
        "{message}"
    );
    let r = post(&http, &format!("{url}/count"), "hits");
    assert_eq!((r.status, r.body.as_str()), (200, "5"));
    assert_only_listed(&d, "kept");

    // A chain with CoAP ingress keeps its CoAP socket (and port) across a replacement.
    let t = testfn();
    let co = format!(
        "name: co\ncoap: {{ listen: \"127.0.0.1:0\" }}\nfunctions:\n{}routes:\n  - coap: /up\n    \
         sequence: [a]\n",
        function("a", &t, "upper", "")
    );
    create(&d, "co", &co);
    let coap_url = |d: &Daemon| {
        d.status("co")["listeners"]
            .as_array()
            .and_then(|l| {
                l.iter()
                    .filter_map(Value::as_str)
                    .find(|u| u.starts_with("coap://"))
            })
            .map(str::to_owned)
            .expect("a coap:// listener")
    };
    let coap = coap_url(&d);
    let coap_post = |uri: &str| {
        let out = std::process::Command::new("timeout")
            .args([
                "-s",
                "KILL",
                "30",
                "coap-client-notls",
                "-B",
                "10",
                "-m",
                "post",
            ])
            .args(["-e", "over coap", uri])
            .output()
            .expect("run timeout(1)");
        assert_ne!(
            out.status.code(),
            Some(127),
            "coap-client-notls is not installed: `apt-get install libcoap3-bin` (CI installs it)"
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    assert_eq!(coap_post(&format!("{coap}/up")), "OVER COAP");
    let co2 = format!("{co}  - http: POST /up\n    sequence: [a]\n");
    let u = apply(&d, "co", &co2);
    assert!(u.ok, "{}", u.stderr);
    assert!(
        u.stdout.starts_with("chain 'co' replaced: "),
        "{}",
        u.stdout
    );
    assert_eq!(coap_url(&d), coap, "the CoAP socket was handed over");
    assert_eq!(coap_post(&format!("{coap}/up")), "OVER COAP");

    // A chain with MQTT ingress: structural changes are refused with the reason.
    let mq = format!(
        "name: mq\nmqtt: {{ listen: \"127.0.0.1:0\" }}\nfunctions:\n{}routes:\n  - mqtt: \
         sensors/+\n    sequence: [a]\n",
        function("a", &t, "upper", "")
    );
    create(&d, "mq", &mq);
    let more = format!("{mq}  - http: POST /a\n    sequence: [a]\n");
    let message = apply(&d, "mq", &more).assert_failed();
    assert!(
        message.contains("chain 'mq' cannot change while it runs: the chain has MQTT ingress")
            && message.contains("`zerohop down mq` and apply it again"),
        "{message}"
    );
    d.stop_cleanly();
}

/// A chain with a data folder that is replaced keeps the folder and the uid that owns it, so
/// the new version's instances can use what the old one wrote (both run while it drains).
#[test]
fn a_replaced_chain_keeps_its_data_folder_and_the_uid_that_owns_it() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let _serial = serial();
    let d = Daemon::start();
    let tmp = TempDir::new("data");
    // The chain's uid passes through the test's own folder to its own.
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let data = tmp.path().join("store");
    let v1 = format!(
        "name: keeper\ndata: {}\nfunctions:\n{}routes:\n  - http: POST /up\n    sequence: [a]\n",
        data.display(),
        function("a", &testfn(), "upper", "")
    );
    let url = create(&d, "keeper", &v1);
    // "instances run as uid N, gid N; ..."
    let uid = |d: &Daemon| -> u32 {
        let c = d.status("keeper")["confinement"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        c.split("uid ")
            .nth(1)
            .and_then(|r| r.split([',', ' ']).next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no uid in {c:?}"))
    };
    let before = uid(&d);
    let owner = || std::fs::metadata(&data).expect("the data folder").uid();
    assert_eq!(owner(), before, "the agent made the folder the chain's");
    let v2 = format!("{v1}  - http: POST /again\n    sequence: [a]\n");
    let u = apply(&d, "keeper", &v2);
    assert_replaced(&u, "keeper", &url, "its routes change");
    assert_eq!(
        uid(&d),
        before,
        "the replacement runs under the folder's uid"
    );
    assert_eq!(owner(), before);
    let r = post(&client(), &format!("{url}/again"), "kept");
    assert_eq!((r.status, r.body.as_str()), (200, "KEPT"));
    assert_only_listed(&d, "keeper");
}

#[test]
fn scaling_bounds_change_without_a_restart() {
    let _serial = serial();
    let d = Daemon::start();
    let t = testfn();
    let v1 = chain("bounds", &t, &t, "exclaim", B_SCALE);
    let url = create(&d, "bounds", &v1);
    let rest = wait_for(&d, "bounds", Duration::from_secs(10), "coming up", at_rest);
    let parked: Vec<u32> = rest
        .iter()
        .filter(|i| i.function == "b" && i.state == "parked")
        .filter_map(|i| i.pid)
        .collect();
    let s0 = d.status("bounds");
    let b0 = s0["functions"][1].clone();

    let u = apply(
        &d,
        "bounds",
        &chain("bounds", &t, &t, "exclaim", ", scale: { min: 2, max: 3 }"),
    );
    u.assert_updated("bounds", &["function 'b': scale min 1 -> 2"]);
    let two = wait_for(
        &d,
        "bounds",
        Duration::from_secs(10),
        &format!(
            "b min 1 -> 2 (apply took {:.0} ms)",
            u.took().as_secs_f64() * 1e3
        ),
        |l| count(l, "b", "ready") == 2,
    );
    // The instances there were still run, the parked one now serving: no restart.
    let now = pids(&two);
    assert!(
        pids(&rest).is_subset(&now),
        "every instance there was runs on: before {}, after {}",
        shape(&rest),
        shape(&two)
    );
    assert!(
        parked
            .iter()
            .all(|p| two.iter().any(|i| i.pid == Some(*p) && i.state == "ready")),
        "the parked instance {parked:?} serves: {}",
        shape(&two)
    );
    assert!(two.iter().all(|i| i.restarts == 0), "{}", shape(&two));
    let s1 = d.status("bounds");
    let b1 = &s1["functions"][1];
    assert_eq!(
        (b1["name"].as_str(), b1["min"].as_u64()),
        (Some("b"), Some(2))
    );
    assert_eq!(
        b1["activations"].as_u64().unwrap() - b0["activations"].as_u64().unwrap(),
        1,
        "the parked instance was activated: {b1}"
    );
    // And a new one parks in its place.
    wait_for(
        &d,
        "bounds",
        Duration::from_secs(10),
        "b parks again",
        |l| count(l, "b", "ready") == 2 && count(l, "b", "parked") == 1,
    );

    // Under load b scales out to its max of 3; max then shrinks to 2: one instance drains
    // and stops at once (a lowered max does not wait for the cooldown, and the default 30 s
    // cooldown keeps the scaler from scaling further in and out while this is checked),
    // none fails, none restarts.
    let load = Load::start(&format!("{url}/go"), 4);
    let three = wait_for(&d, "bounds", Duration::from_secs(10), "b at 3", |l| {
        count(l, "b", "ready") == 3
    });
    let started = |s: &Value| {
        let b = &s["functions"][1];
        b["activations"].as_u64().unwrap() + b["cold_starts"].as_u64().unwrap()
    };
    let started_at_three = started(&d.status("bounds"));
    let shrink = apply(
        &d,
        "bounds",
        &chain("bounds", &t, &t, "exclaim", ", scale: { min: 1, max: 2 }"),
    );
    shrink.assert_updated("bounds", &["function 'b': scale min 2 -> 1, max 3 -> 2"]);
    let two = wait_for(
        &d,
        "bounds",
        Duration::from_secs(10),
        "b max 3 -> 2 under load",
        |l| count(l, "b", "ready") == 2 && l.iter().filter(|i| i.function == "b").count() == 2,
    );
    load.answered_after(Instant::now(), "the load going on with b at 2");
    let answers = load.finish();
    let all = (answers[0].sent, Instant::now());
    judge("b max 3 -> 2", &answers, &shrink, all, exclaimed, exclaimed);
    // The instances left are some of those there were, but for one case: a sender (an
    // instance of `a`, preempted between its pick and its send) may still queue a request
    // for the instance being stopped, and the scaler then hands that queue to a new
    // instance of the party (counted as an activation, not a restart); the scaler then
    // stops another one to stay within max.
    let fresh: BTreeSet<u32> = pids(&two).difference(&pids(&three)).copied().collect();
    let started_since = started(&d.status("bounds")) - started_at_three;
    assert!(
        fresh.len() as u64 <= started_since
            && two
                .iter()
                .filter(|i| fresh.contains(&i.pid.unwrap_or(0)))
                .all(|i| i.function == "b"),
        "the instances left are some of those there were, or b's instances the scaler \
         started ({started_since} since): before {}, after {}",
        shape(&three),
        shape(&two)
    );
    assert!(two.iter().all(|i| i.restarts == 0), "{}", shape(&two));
    assert_only_listed(&d, "bounds");
    d.stop_cleanly();
}

/// `b` runs a copy of the test function in a folder of `mode`; the copy is rebuilt in place
/// as a program that exits at once (`/bin/true`), and the apply is rolled back. The old
/// version must still start afterwards: b's parked instance comes back, and `zerohop scale`
/// gets a second instance serving.
fn a_broken_rebuild_is_rolled_back(mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    let _serial = serial();
    let d = Daemon::start();
    let t = testfn();
    let bin = TempDir::new("update-bin");
    std::fs::set_permissions(bin.path(), std::fs::Permissions::from_mode(mode))
        .expect("chmod the program's folder");
    let copy = bin.path().join("zerohop-testfn");
    std::fs::copy(&t, &copy).expect("copy the test function");
    let v1 = chain(
        "rebuilt",
        &t,
        &copy.display().to_string(),
        "exclaim",
        B_STEADY,
    );
    let url = create(&d, "rebuilt", &v1);
    let rest = wait_for(&d, "rebuilt", Duration::from_secs(10), "coming up", at_rest);

    let load = Load::start(&format!("{url}/go"), 4);
    rebuild(Path::new("/bin/true"), &copy);
    let u = apply(&d, "rebuilt", &v1);
    let message = u.assert_failed();
    load.answered_after(
        u.returned + SLACK,
        &format!("folder {mode:o}: the load going on after the broken rebuild"),
    );
    let answers = load.finish();
    eprintln!("folder {mode:o}: apply said: {message}");
    assert!(
        message.contains("function 'b': the new version exited before it was ready")
            && message.contains("the old version keeps running"),
        "{message}"
    );
    let all = (answers[0].sent, Instant::now());
    judge(
        &format!("folder {mode:o}: broken rebuild"),
        &answers,
        &u,
        all,
        exclaimed,
        exclaimed,
    );

    // The old version still starts: its parked instance is back...
    let after = wait_for(
        &d,
        "rebuilt",
        Duration::from_secs(20),
        &format!("folder {mode:o}: after the rollback"),
        at_rest,
    );
    let serving = pids_in(&rest, "ready");
    assert!(
        serving.iter().all(|p| pids(&after).contains(p)),
        "{}",
        shape(&after)
    );
    // ...and serves when asked to.
    let out = d.cli(&["scale", "rebuilt", "b", "2"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_for(
        &d,
        "rebuilt",
        Duration::from_secs(10),
        &format!("folder {mode:o}: b scaled to 2"),
        |l| count(l, "b", "ready") == 2,
    );
    let http = client();
    for i in 0..20 {
        let r = post(&http, &format!("{url}/go"), &format!("after {i}"));
        assert_eq!((r.status, r.body), (200, format!("AFTER {i}!")));
    }
    assert_only_listed(&d, "rebuilt");
    d.stop_cleanly();
}

/// The program's folder is closed to the chain's uid: the agent runs it by descriptor,
/// which keeps the old file.
#[test]
fn a_broken_rebuild_is_rolled_back_when_run_by_descriptor() {
    a_broken_rebuild_is_rolled_back(0o700);
}

/// The program's folder is open to the chain's uid (as `target/release` is; and always
/// when the agent is not root): the agent runs it by path while the path names the file it
/// opened, and by descriptor once the path holds another file (the broken rebuild).
#[test]
fn a_broken_rebuild_is_rolled_back_when_run_by_path() {
    a_broken_rebuild_is_rolled_back(0o755);
}
