//! Autoscaling end to end: the real `zerohop agent` daemon, driven by the real `zerohop` CLI,
//! under real keep-alive HTTP clients. What is asserted is what `zerohop status --json`
//! shows (ready, parked, wanted, activations, cold starts, counters) and what runs below the
//! daemon; times are measured and printed, and only bound the waits.

mod common;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::daemon::{instance_pids, Daemon};
use common::{client, func, post};
use serde_json::Value;
use zerohop_test_support::{
    cpu_ticks, descendants, instances, spawner, ticks_per_second, wait_until,
};

/// The tests here measure scaling times and idle CPU on a small machine: one at a time, so
/// one test's load does not slow another's scaler.
static SERIAL: Mutex<()> = Mutex::new(());

/// How long an awaited change of scale may take before a test calls it missing: a guard
/// against a scaler that never acts, not a measure (a loaded machine is slow, not wrong).
const GUARD: Duration = Duration::from_secs(60);

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// Applies `spec` as chain `name`, which must be created; returns its HTTP URL.
fn create(d: &Daemon, name: &str, spec: &str) -> String {
    let applied = d.apply(name, spec);
    assert_eq!(applied["applied"], "created", "{applied}");
    applied["status"]["listeners"][0]
        .as_str()
        .expect("an http listener")
        .to_owned()
}

/// Chain `name` of one function `a` (the test function in `mode` with `env`, scaled by
/// `scale`) on the route `POST /go`.
fn one_function(name: &str, mode: &str, env: &str, scale: &str) -> String {
    format!(
        "name: {name}\ntimeout: 10s\nfunctions:\n{}routes:\n  - http: POST /go\n    \
         sequence: [a]\n",
        func("a", mode, env, &format!(", scale: {scale}"))
    )
}

/// One function's entry of a status.
fn function<'a>(status: &'a Value, name: &str) -> &'a Value {
    status["functions"]
        .as_array()
        .expect("functions")
        .iter()
        .find(|f| f["name"] == name)
        .unwrap_or_else(|| panic!("no function {name} in {status}"))
}

fn num(v: &Value, key: &str) -> u64 {
    v[key]
        .as_u64()
        .unwrap_or_else(|| panic!("no number {key} in {v}"))
}

/// What a test follows of one function.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Seen {
    ready: u64,
    parked: u64,
    desired: u64,
    activations: u64,
    cold_starts: u64,
    handled: u64,
    /// `party:state` of each instance listed.
    states: String,
    /// Pids of its instances that have a process.
    pids: BTreeSet<u32>,
    /// When the scaler last decided to activate each instance that has such a stamp
    /// (`CLOCK_MONOTONIC` ns).
    activated_ns: Vec<u64>,
}

impl Seen {
    fn of(status: &Value, name: &str) -> Self {
        let f = function(status, name);
        let list = f["instances"].as_array().expect("instances");
        Self {
            ready: num(f, "ready"),
            parked: num(f, "parked"),
            desired: num(f, "desired"),
            activations: num(f, "activations"),
            cold_starts: num(f, "cold_starts"),
            handled: num(f, "handled"),
            states: list
                .iter()
                .map(|i| format!("{}:{}", i["party"], i["state"].as_str().unwrap_or("?")))
                .collect::<Vec<_>>()
                .join(" "),
            pids: list
                .iter()
                .filter_map(|i| i["pid"].as_u64())
                .map(|p| p as u32)
                .collect(),
            activated_ns: list
                .iter()
                .filter_map(|i| i["activated_ns"].as_u64())
                .collect(),
        }
    }

    /// The shape a timeline prints (counters change on every request: left out).
    fn shape(&self) -> String {
        format!(
            "ready {} parked {} desired {} activations {} cold {} [{}]",
            self.ready, self.parked, self.desired, self.activations, self.cold_starts, self.states
        )
    }
}

/// Changes of one function's shape over time, printed at the end of a phase.
struct Timeline {
    start: Instant,
    events: Vec<(Duration, String)>,
}

impl Timeline {
    fn new() -> Self {
        Self {
            start: Instant::now(),
            events: Vec::new(),
        }
    }

    fn note(&mut self, what: String) {
        self.events.push((self.start.elapsed(), what));
    }

    /// Notes `seen` when its shape differs from the last noted.
    fn sample(&mut self, seen: &Seen) {
        let shape = seen.shape();
        if self.events.last().map(|(_, s)| s) != Some(&shape) {
            self.note(shape);
        }
    }

    fn print(&self, title: &str) {
        eprintln!("--- {title}");
        for (t, what) in &self.events {
            eprintln!("  {:>7.1} ms  {what}", t.as_secs_f64() * 1e3);
        }
    }
}

/// Polls the status of `name` in `chain` (at most `timeout`), noting each change on
/// `timeline`, until `done` holds; returns the last seen, or `None` on timeout.
fn watch(
    d: &Daemon,
    chain: &str,
    name: &str,
    timeline: &mut Timeline,
    timeout: Duration,
    mut done: impl FnMut(&Seen) -> bool,
) -> Option<Seen> {
    let deadline = Instant::now() + timeout;
    loop {
        let seen = Seen::of(&d.status(chain), name);
        timeline.sample(&seen);
        if done(&seen) {
            return Some(seen);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Keep-alive clients posting to `url` back to back until dropped; every answer must be 200
/// with the body upper-cased.
struct Load {
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
    wrong: Arc<Mutex<Vec<String>>>,
    threads: Vec<JoinHandle<()>>,
}

impl Load {
    fn start(url: &str, clients: usize) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(AtomicU64::new(0));
        let wrong = Arc::new(Mutex::new(Vec::new()));
        let threads = (0..clients)
            .map(|c| {
                let (url, stop, sent, wrong) =
                    (url.to_owned(), stop.clone(), sent.clone(), wrong.clone());
                std::thread::spawn(move || {
                    let http = client();
                    let mut n = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        let body = format!("client {c} request {n}");
                        let got = match http.post(&url).send_string(&body) {
                            Ok(r) => (r.status(), r.into_string().unwrap_or_default()),
                            Err(ureq::Error::Status(s, r)) => {
                                (s, r.into_string().unwrap_or_default())
                            }
                            Err(e) => (0, e.to_string()),
                        };
                        sent.fetch_add(1, Ordering::Relaxed);
                        if got != (200, body.to_uppercase()) {
                            wrong.lock().unwrap().push(format!("{body:?} -> {got:?}"));
                            if got.0 == 0 {
                                // The daemon is gone: no point hammering it.
                                return;
                            }
                        }
                        n += 1;
                    }
                })
            })
            .collect();
        Self {
            stop,
            sent,
            wrong,
            threads,
        }
    }

    /// Stops the clients once their current requests are answered; returns how many were
    /// sent and the wrong answers.
    fn finish(mut self) -> (u64, Vec<String>) {
        self.halt();
        let wrong = std::mem::take(&mut *self.wrong.lock().unwrap());
        (self.sent.load(Ordering::Relaxed), wrong)
    }

    fn halt(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.halt();
    }
}

/// The daemon, once scaled in, is idle: over 2 s it and everything below it use at most 2
/// clock ticks, and exactly `expected` instance processes run, those the status lists.
fn assert_idle(d: &Daemon, chain: &str, expected: usize) {
    let listed: BTreeSet<u32> = instance_pids(&d.status(chain)).into_iter().collect();
    let running: BTreeSet<u32> = instances(d.pid()).into_iter().collect();
    assert_eq!(
        running, listed,
        "the daemon's instance processes are those its status lists"
    );
    assert_eq!(running.len(), expected, "instances running: {running:?}");
    // The daemon, its spawner and the instances; nothing else (no stray grandchild).
    let mut all = descendants(&[d.pid()]);
    all.sort_unstable();
    let spawner = spawner(d.pid()).expect("the spawner runs");
    assert_eq!(
        all.len(),
        2 + expected,
        "below the daemon ({}, spawner {spawner}): {all:?}",
        d.pid()
    );
    // Let the status call's own work settle, then leave the daemon alone.
    std::thread::sleep(Duration::from_millis(300));
    let ticks = |pids: &[u32]| -> u64 { pids.iter().filter_map(|&p| cpu_ticks(p)).sum() };
    let (daemon0, all0) = (cpu_ticks(d.pid()).unwrap(), ticks(&all));
    std::thread::sleep(Duration::from_secs(2));
    let (daemon, total) = (cpu_ticks(d.pid()).unwrap() - daemon0, ticks(&all) - all0);
    eprintln!(
        "idle over 2 s: daemon {daemon} tick(s), with spawner and {expected} instance(s) {total} \
         (at {} ticks/s)",
        ticks_per_second()
    );
    assert!(daemon <= 2, "the idle daemon used {daemon} ticks in 2 s");
    assert!(
        total <= 2,
        "the idle daemon and its processes used {total} ticks in 2 s"
    );
    assert_eq!(
        instances(d.pid()).into_iter().collect::<BTreeSet<_>>(),
        running,
        "no instance came or went while idle"
    );
}

#[test]
fn scales_out_under_a_load_step_and_back_in() {
    let _serial = serial();
    let d = Daemon::start();
    let url = create(
        &d,
        "step",
        &one_function(
            "step",
            "slow",
            "DELAY_MS: 20",
            "{ min: 1, max: 4, target: 1, parked: 1, cooldown: 2s }",
        ),
    );
    let mut idle = Timeline::new();
    let before = watch(&d, "step", "a", &mut idle, Duration::from_secs(10), |s| {
        s.ready == 1 && s.parked == 1
    });
    idle.print("step: coming up");
    let before = before.expect("idle: one instance ready and one parked");
    assert_eq!(before.desired, 1);
    let gw0 = d.status("step")["gateway"].clone();

    // The step: five clients, each with a request in flight nearly all the time.
    let mut out = Timeline::new();
    let step_ns = zerohop_pool::monotonic_ns();
    let load = Load::start(&format!("{url}/go"), 5);
    // The event is reaching max under the load; how soon depends on the machine's load (the
    // time is printed, not asserted), the guard only ends a scaler that never scales out.
    let at_max = watch(&d, "step", "a", &mut out, GUARD, |s| s.ready == 4);
    let took = out.start.elapsed();
    out.print("step: load on");
    let at_max = at_max.unwrap_or_else(|| {
        panic!("under five clients, a never scaled out to its max of 4 (guard {GUARD:?})")
    });
    // The scaler's own stamps: when it decided each activation, after the step began.
    let decided: Vec<String> = at_max
        .activated_ns
        .iter()
        .filter(|&&t| t >= step_ns)
        .map(|&t| format!("{:.1}", (t - step_ns) as f64 / 1e6))
        .collect();
    eprintln!(
        "scale-out 1 -> 4 ready: seen after {:.0} ms through `zerohop status`; the scaler \
         decided the activations at [{}] ms after the step began",
        took.as_secs_f64() * 1e3,
        decided.join(", ")
    );
    assert_eq!(at_max.desired, 4);
    // Hold the load a little: it stays at max, and nothing is parked beyond max.
    std::thread::sleep(Duration::from_millis(500));
    let held = Seen::of(&d.status("step"), "a");
    assert_eq!((held.ready, held.parked), (4, 0), "{}", held.shape());
    let (sent, wrong) = load.finish();
    let stopped = Instant::now();
    assert!(wrong.is_empty(), "{} wrong answers: {wrong:?}", wrong.len());
    assert!(sent > 0);
    eprintln!("step: {sent} requests, all 200 with the right body");
    // Every request was accepted, run and answered once.
    let s = d.status("step");
    let gw = &s["gateway"];
    let delta = |k: &str| num(gw, k) - num(&gw0, k);
    assert_eq!(
        (delta("accepted"), delta("ok"), delta("errors")),
        (sent, sent, 0),
        "{gw}"
    );
    assert_eq!(num(gw, "late"), 0);
    assert_eq!(
        Seen::of(&s, "a").handled - before.handled,
        sent,
        "a ran each once"
    );

    // Scaled out by one activation (the parked instance) and cold starts for the rest.
    let grown = (
        at_max.activations - before.activations,
        at_max.cold_starts - before.cold_starts,
    );
    assert!(grown.0 >= 1, "the parked instance was activated: {grown:?}");
    assert_eq!(grown.0 + grown.1, 3, "3 more instances: {grown:?}");

    // Back in after the cooldown (2 s), not before it.
    let mut back = Timeline::new();
    let mut first_drop: Option<Duration> = None;
    let one = watch(&d, "step", "a", &mut back, GUARD, |s| {
        if s.desired < 4 && first_drop.is_none() {
            first_drop = Some(stopped.elapsed());
        }
        s.ready == 1 && s.parked == 1 && s.states.split(' ').count() == 2
    });
    let took = stopped.elapsed();
    back.print("step: load off");
    let one = one.unwrap_or_else(|| {
        panic!(
            "{GUARD:?} after the load stopped, a is not back to one ready and one parked \
             (cooldown 2 s): an idle scaler must look again after a partial scale-in"
        )
    });
    let first_drop = first_drop.expect("scaled in");
    eprintln!(
        "scale-in: first instance let go {:.0} ms after the load stopped, settled at {:.0} ms",
        first_drop.as_secs_f64() * 1e3,
        took.as_secs_f64() * 1e3
    );
    assert!(
        first_drop >= Duration::from_millis(1500),
        "a let an instance go {first_drop:?} after the load stopped, before its 2 s cooldown"
    );
    assert_eq!(one.desired, 1);

    assert_idle(&d, "step", 2);
    d.stop_cleanly();
}

/// Which function of the `[up, ex]` chain starts at zero.
#[derive(Clone, Copy, Debug)]
enum AtZero {
    /// `up`, the head: the gateway sends to a function with no instance.
    Head,
    /// `ex`, the second: `up` sends to a function with no instance.
    Second,
}

/// One request to a chain whose `at_zero` function has `instances: 0` (and `parked`
/// instances waiting): answered once, right; the function then goes back to zero. Returns
/// the first request's latency.
fn from_zero_and_back(at_zero: AtZero, parked: u16) -> Duration {
    let name = format!("zero-{at_zero:?}-{parked}").to_lowercase();
    let zero =
        format!(", instances: 0, scale: {{ min: 0, max: 2, parked: {parked}, zero_after: 2s }}");
    let (up, ex) = match at_zero {
        AtZero::Head => (zero.as_str(), ""),
        AtZero::Second => ("", zero.as_str()),
    };
    let scaled = match at_zero {
        AtZero::Head => "up",
        AtZero::Second => "ex",
    };
    let d = Daemon::start();
    let url = create(
        &d,
        &name,
        &format!(
            "name: {name}\ntimeout: 10s\nfunctions:\n{}{}routes:\n  - http: POST /go\n    \
             sequence: [up, ex]\n",
            func("up", "upper", "", up),
            func("ex", "exclaim", "", ex)
        ),
    );
    let mut tl = Timeline::new();
    let parked = u64::from(parked);
    let before = watch(&d, &name, scaled, &mut tl, Duration::from_secs(10), |s| {
        s.ready == 0 && s.parked == parked && s.pids.len() as u64 == parked
    });
    tl.print(&format!("{name}: coming up"));
    let before = before.expect("the function is at zero, with its parked instances waiting");
    assert_eq!(before.desired, 0);
    let other = if scaled == "up" { "ex" } else { "up" };
    assert!(
        wait_until(Duration::from_secs(10), || Seen::of(
            &d.status(&name),
            other
        )
        .ready
            == 1),
        "{other} serves"
    );
    let s0 = d.status(&name);
    let other0 = Seen::of(&s0, other);
    assert_eq!(Seen::of(&s0, scaled), before, "nothing moved while idle");

    // Exactly one request, on a fresh connection.
    let sent_ns = zerohop_pool::monotonic_ns();
    let t = Instant::now();
    let r = post(&client(), &format!("{url}/go"), "hi");
    let latency = t.elapsed();
    assert_eq!((r.status, r.body.as_str()), (200, "HI!"), "{r:?}");
    let s1 = d.status(&name);
    let (after, other1) = (Seen::of(&s1, scaled), Seen::of(&s1, other));
    let decided = after
        .activated_ns
        .iter()
        .filter(|&&t| t >= sent_ns)
        .min()
        .map_or(f64::NAN, |&t| (t - sent_ns) as f64 / 1e6);
    eprintln!(
        "{name}: first request from zero ({}) answered in {:.2} ms; the scaler decided to \
         activate {decided:.2} ms after it was sent",
        if parked > 0 { "parked" } else { "cold" },
        latency.as_secs_f64() * 1e3
    );
    let delta = |k: &str| num(&s1["gateway"], k) - num(&s0["gateway"], k);
    assert_eq!(
        (delta("accepted"), delta("ok"), delta("errors")),
        (1, 1, 0),
        "one request, answered once: {}",
        s1["gateway"]
    );
    assert_eq!(num(&s1["gateway"], "late"), 0, "no second answer");
    assert_eq!(after.handled - before.handled, 1, "{scaled} ran it once");
    assert_eq!(other1.handled - other0.handled, 1, "{other} ran it once");
    // The agent counts a cold instance ready once the spawner has reported its pid, which on
    // a loaded machine can come after the instance's first answer: wait, bounded, for that.
    let mut after = after;
    let settled = wait_until(Duration::from_secs(10), || {
        after = Seen::of(&d.status(&name), scaled);
        after.ready == 1
    });
    assert!(settled, "{}", after.shape());
    if parked > 0 {
        assert_eq!(
            (
                after.activations - before.activations,
                after.cold_starts - before.cold_starts
            ),
            (1, 0),
            "the parked instance was activated: {}",
            after.shape()
        );
        // Its pid was one of the parked ones: no fork, no exec.
        let serving: Vec<u32> = function(&s1, scaled)["instances"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|i| i["state"] == "ready")
            .filter_map(|i| i["pid"].as_u64())
            .map(|p| p as u32)
            .collect();
        assert!(
            serving.iter().all(|p| before.pids.contains(p)),
            "the serving instance {serving:?} is one that was parked {:?}",
            before.pids
        );
    } else {
        assert_eq!(
            (
                after.activations - before.activations,
                after.cold_starts - before.cold_starts
            ),
            (0, 1),
            "started cold: {}",
            after.shape()
        );
    }
    let activation = function(&s1, scaled)["instances"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["state"] == "ready")
        .map(|i| i["activation"].clone());
    assert_eq!(
        activation,
        Some(Value::from(if parked > 0 { "parked" } else { "cold" })),
        "status says how the serving instance was activated"
    );

    // Back to zero after zero_after (2 s), with the parked instances waiting again.
    let answered = Instant::now();
    let mut tl = Timeline::new();
    let back = watch(&d, &name, scaled, &mut tl, Duration::from_secs(12), |s| {
        s.ready == 0 && s.desired == 0 && s.parked == parked && s.pids.len() as u64 == parked
    });
    let took = answered.elapsed();
    tl.print(&format!("{name}: after the request"));
    let back = back.expect("back to zero after zero_after");
    eprintln!(
        "{name}: back at zero {:.0} ms after the answer",
        took.as_secs_f64() * 1e3
    );
    let s2 = d.status(&name);
    assert_eq!(back.handled - before.handled, 1, "nothing ran twice");
    assert_eq!(
        num(&s2["gateway"], "accepted") - num(&s0["gateway"], "accepted"),
        1
    );
    assert_idle(&d, &name, 1 + parked as usize);
    d.stop_cleanly();
    latency
}

#[test]
fn scales_from_zero_and_back_to_zero() {
    let _serial = serial();
    let mut latencies = Vec::new();
    for at_zero in [AtZero::Second, AtZero::Head] {
        for parked in [1, 0] {
            latencies.push((at_zero, parked, from_zero_and_back(at_zero, parked)));
        }
    }
    eprintln!("--- first request from zero");
    for (at_zero, parked, l) in latencies {
        eprintln!(
            "  {:<28} {:<6} {:>8.2} ms",
            match at_zero {
                AtZero::Second => "function -> function at zero",
                AtZero::Head => "gateway -> function at zero",
            },
            if parked > 0 { "parked" } else { "cold" },
            l.as_secs_f64() * 1e3
        );
    }
}

#[test]
fn zerohop_scale_sets_the_minimum() {
    let _serial = serial();
    let d = Daemon::start();
    create(
        &d,
        "pinned",
        &one_function(
            "pinned",
            "upper",
            "",
            "{ min: 1, max: 4, target: 1, parked: 1, cooldown: 1s }",
        ),
    );
    let mut tl = Timeline::new();
    let before = watch(&d, "pinned", "a", &mut tl, Duration::from_secs(10), |s| {
        s.ready == 1 && s.parked == 1
    })
    .expect("one ready, one parked");

    let out = d.cli(&["scale", "pinned", "a", "3"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("at least 3"), "{said}");
    tl.note("zerohop scale pinned a 3".into());
    let three = watch(&d, "pinned", "a", &mut tl, Duration::from_secs(10), |s| {
        s.ready == 3 && s.parked == 1
    });
    let s = d.status("pinned");
    let f = function(&s, "a");
    assert_eq!((num(f, "min"), num(f, "max")), (3, 4));
    let three = three.expect("without load, a reaches 3 ready and parks the fourth");
    assert_eq!(three.desired, 3);
    assert_eq!(
        (three.activations - before.activations) + (three.cold_starts - before.cold_starts),
        2,
        "two more instances: {}",
        three.shape()
    );
    assert!(
        three.activations > before.activations,
        "the parked one went first"
    );
    // It stays past the cooldown: min is not load.
    let stays = Instant::now() + Duration::from_secs(3);
    while Instant::now() < stays {
        let now = Seen::of(&d.status("pinned"), "a");
        tl.sample(&now);
        assert_eq!((now.ready, now.desired), (3, 3), "{}", now.shape());
        std::thread::sleep(Duration::from_millis(100));
    }

    // Beyond max: refused, naming max.
    let out = d.cli(&["scale", "pinned", "a", "9"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "scale to 9 of max 4 succeeded");
    assert!(
        err.contains("at most 4 instances") && err.contains("scale.max"),
        "{err}"
    );
    // An unknown function: refused, naming the functions there are.
    let out = d.cli(&["scale", "pinned", "nosuchfn", "1"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "scaling an unknown function succeeded"
    );
    assert!(
        err.contains("no function 'nosuchfn'") && err.contains("its functions: a"),
        "{err}"
    );
    let unchanged = Seen::of(&d.status("pinned"), "a");
    assert_eq!((unchanged.ready, unchanged.desired), (3, 3));

    // Down again to 1: the extra instances go after the cooldown (1 s), not at once.
    let out = d.cli(&["scale", "pinned", "a", "1"]);
    assert!(out.status.success());
    let lowered = Instant::now();
    tl.note("zerohop scale pinned a 1".into());
    let mut first_drop = None;
    let one = watch(&d, "pinned", "a", &mut tl, Duration::from_secs(12), |s| {
        if s.desired < 3 && first_drop.is_none() {
            first_drop = Some(lowered.elapsed());
        }
        s.ready == 1 && s.parked == 1 && s.states.split(' ').count() == 2
    });
    tl.print("pinned");
    one.expect("back to one ready and one parked");
    let first_drop = first_drop.expect("scaled in");
    assert!(
        first_drop >= Duration::from_millis(700),
        "scaled in {first_drop:?} after min went down, before the 1 s cooldown"
    );
    assert_idle(&d, "pinned", 2);
    d.stop_cleanly();
}
