//! Hostile senders (issue 30, findings 3 and 12): a function that floods its queues to the
//! gateway with invalid descriptors is killed with its process group and restarted, and the
//! log names it, while another route of the same chain answers every request correctly
//! under load; the watchdog still kills a truly hung instance on time meanwhile; a function
//! that bumps its pool's wake word in a loop costs the agent at most one scaler look per
//! tick; `zerohop up` stops cleanly after each.
//!
//! The chains run under `zerohop up` (a real agent process, whose log and CPU time the tests
//! read); the fixture is `zerohop-flood`.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::common::{client, func, post, Answer};
use crate::up::Agent;
use zerohop_test_support::{alive, cpu_ticks, target_bin, wait_until};

/// A spec entry running `zerohop-flood`.
fn flood_fn(name: &str) -> String {
    format!(
        "  {name}: {{ command: [\"{}\"] }}\n",
        target_bin("zerohop-flood").display()
    )
}

/// A spec entry running `zerohop-hostile` in `mode`.
fn hostile_fn(name: &str, mode: &str) -> String {
    format!(
        "  {name}: {{ command: [\"{}\"], env: {{ HOSTILE_MODE: {mode} }} }}\n",
        target_bin("zerohop-hostile").display()
    )
}

/// The pid a `zerohop-flood` answer names (`WORD PID ...`).
fn pid_in(a: &Answer) -> u32 {
    assert_eq!(a.status, 200, "{a:?}");
    a.body
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no pid in {a:?}"))
}

/// `workers` clients on the hello route until `done` (at least `min` requests each); each
/// panics on the first answer that is not exactly right, and counts what it got in `ok`.
fn hello_load(
    url: &str,
    workers: u32,
    min: u32,
    done: &Arc<AtomicBool>,
    ok: &Arc<AtomicU32>,
) -> Vec<JoinHandle<()>> {
    (0..workers)
        .map(|w| {
            let (url, done, ok) = (format!("{url}/hello"), done.clone(), ok.clone());
            std::thread::spawn(move || {
                let agent = client();
                let mut i = 0;
                while i < min || !done.load(Ordering::Relaxed) {
                    let a = post(&agent, &url, &format!("w{w} n{i}"));
                    assert_eq!(
                        (a.status, a.body.as_str()),
                        (200, format!("W{w} N{i}!").as_str()),
                        "the hello route answers every request correctly"
                    );
                    ok.fetch_add(1, Ordering::Relaxed);
                    i += 1;
                }
            })
        })
        .collect()
}

const HOSTILE: &str = " is hostile: it sent ";

#[test]
fn a_function_flooding_the_gateway_with_garbage_is_killed_and_restarted_while_another_route_answers(
) {
    let _serial = crate::serial();
    let spec = format!(
        "name: flooded\ngateway_threads: 2\nfunctions:\n{}{}{}routes:\n  - http: POST /hello\n    \
         sequence: [upper, exclaim]\n  - http: POST /flood\n    sequence: [flood]\n",
        func("upper", "upper", "", ", concurrency: 2"),
        func("exclaim", "exclaim", "", ""),
        flood_fn("flood"),
    );
    let agent = Agent::start(&spec);
    let done = Arc::new(AtomicBool::new(false));
    let ok = Arc::new(AtomicU32::new(0));
    let load = hello_load(&agent.url, 4, 50, &done, &ok);
    // Three floods, one after the other, each by a new instance of `flood`.
    let mut killed = Vec::new();
    for round in 1..=3 {
        let mut pid = 0;
        assert!(
            wait_until(Duration::from_secs(10), || {
                let a = agent.call("flood", "flood");
                if a.status == 200 && a.body.starts_with("flooding") {
                    pid = pid_in(&a);
                }
                pid != 0 && !killed.contains(&pid)
            }),
            "round {round}: a (new) instance of flood took the request"
        );
        let before = ok.load(Ordering::Relaxed);
        let line = agent
            .log_line(
                &[
                    &format!("(pid {pid})"),
                    "function 'flood' instance ",
                    HOSTILE,
                    "invalid descriptors (slot out of range: ",
                    "; the bound is ",
                    "killing it and its process group",
                ],
                Duration::from_secs(10),
            )
            .unwrap_or_else(|| panic!("round {round}: the log names the flooding instance"));
        assert!(line.contains("chain 'flooded'"), "{line}");
        assert!(
            wait_until(Duration::from_secs(5), || !alive(pid)),
            "round {round}: the flooding instance {pid} is gone"
        );
        assert!(
            agent
                .log_line(
                    &["and was killed as hostile", "restarting in"],
                    Duration::from_secs(5)
                )
                .is_some(),
            "the supervisor says why it restarts"
        );
        killed.push(pid);
        eprintln!(
            "round {round}: pid {pid} killed; hello answers meanwhile: {}",
            ok.load(Ordering::Relaxed) - before
        );
    }
    // Each instance was killed once, for its own flood.
    assert_eq!(agent.lines(&[HOSTILE]).len(), 3, "one kill per flood");
    // Restarted and serving.
    let agent_ref = &agent;
    assert!(
        wait_until(Duration::from_secs(10), || {
            let a = agent_ref.call("flood", "ping");
            a.status == 200 && a.body.starts_with("alive") && !killed.contains(&pid_in(&a))
        }),
        "flood is restarted and answers"
    );
    done.store(true, Ordering::Relaxed);
    for t in load {
        t.join()
            .expect("every hello request was answered correctly");
    }
    assert!(ok.load(Ordering::Relaxed) >= 200);
    let started = Instant::now();
    assert_eq!(agent.stop(), Some(0), "the chain stops cleanly");
    eprintln!("stopped in {:?}", started.elapsed());
}

/// The flood goes to the next function's instance, not to the gateway: the agent finds it in
/// the flooder's own outbox (ring) and kills the flooder, never the instance it flooded,
/// while that instance's route answers every request correctly.
#[test]
fn a_function_flooding_the_next_function_with_garbage_is_killed_and_its_victim_is_not() {
    let _serial = crate::serial();
    let spec = format!(
        "name: floodnext\ngateway_threads: 2\nfunctions:\n{}{}{}routes:\n  - http: POST /hello\n    \
         sequence: [upper, exclaim]\n  - http: POST /flood\n    sequence: [flood, upper]\n",
        func("upper", "upper", "", ""),
        func("exclaim", "exclaim", "", ""),
        flood_fn("flood"),
    );
    let agent = Agent::start(&spec);
    let done = Arc::new(AtomicBool::new(false));
    let ok = Arc::new(AtomicU32::new(0));
    let load = hello_load(&agent.url, 2, 50, &done, &ok);
    let a = agent.call("flood", "flood-next");
    assert!(a.body.starts_with("FLOODING"), "{a:?}");
    let pid = pid_in(&a);
    let upper: Vec<u32> = agent.instances();
    let line = agent
        .log_line(
            &[
                &format!("(pid {pid})"),
                "function 'flood' instance ",
                HOSTILE,
                "invalid descriptors (slot out of range: ",
            ],
            Duration::from_secs(10),
        )
        .expect("the log names the instance flooding `upper`");
    assert!(line.contains("chain 'floodnext'"), "{line}");
    assert!(
        wait_until(Duration::from_secs(5), || !alive(pid)),
        "the flooding instance {pid} is gone"
    );
    std::thread::sleep(Duration::from_millis(300));
    done.store(true, Ordering::Relaxed);
    for t in load {
        t.join()
            .expect("every hello request was answered correctly");
    }
    let now = agent.instances();
    for p in upper.iter().filter(|&&p| p != pid) {
        assert!(
            now.contains(p),
            "instance {p} (not the flooder) was left alone"
        );
    }
    assert_eq!(agent.lines(&[HOSTILE]).len(), 1, "one kill, the flooder's");
    assert_eq!(agent.stop(), Some(0), "the chain stops cleanly");
}

#[test]
fn the_watchdog_kills_a_hung_instance_on_time_while_a_function_floods_the_gateway() {
    let _serial = crate::serial();
    let spec = format!(
        "name: floodhang\ntimeout: 1s\nfunctions:\n{}{}routes:\n  - http: POST /flood\n    \
         sequence: [flood]\n  - http: POST /stuck\n    sequence: [stuck]\n",
        flood_fn("flood"),
        hostile_fn("stuck", "hang"),
    );
    let agent = Agent::start(&spec);
    assert_eq!(agent.call("stuck", "ping").body, "alive\n");
    // One flood after another, for the whole test: each new instance of `flood` floods.
    let done = Arc::new(AtomicBool::new(false));
    let flooding = {
        let (url, done) = (format!("{}/flood", agent.url), done.clone());
        std::thread::spawn(move || {
            let agent = client();
            while !done.load(Ordering::Relaxed) {
                post(&agent, &url, "flood");
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    assert!(
        agent
            .log_line(&[HOSTILE], Duration::from_secs(10))
            .is_some(),
        "the flood runs"
    );
    let started = Instant::now();
    let hung = std::thread::spawn({
        let url = format!("{}/stuck", agent.url);
        move || post(&client(), &url, "hang")
    });
    // timeout 1 s + grace 1 s, noticed within one sample (0.3 s) of the watchdog, plus slack
    // for a loaded machine: what the same test allows without a flood.
    let line = agent
        .log_line(
            &["function 'stuck' instance ", " hung: its handler thread "],
            Duration::from_secs(8),
        )
        .expect("the watchdog kills the hung instance while the flood runs");
    let took = started.elapsed();
    let floods = agent.lines(&[HOSTILE]).len();
    done.store(true, Ordering::Relaxed);
    flooding.join().expect("flooding client");
    let a = hung.join().expect("hung client");
    assert!([502, 504].contains(&a.status), "{a:?}");
    eprintln!("hung instance killed after {took:?}, {floods} flooding instances killed: {line}");
    assert!(took < Duration::from_secs(8), "{took:?}");
    assert!(floods >= 2, "the flood went on while the watchdog worked");
    assert_eq!(agent.stop(), Some(0), "the chain stops cleanly");
}

/// A function that bumps its pool's wake word in a loop (a million times a second and
/// more) makes the scaler look at most once per tick: the agent's CPU time stays small.
#[test]
fn a_wake_word_bumped_in_a_loop_costs_the_agent_little() {
    let _serial = crate::serial();
    let spec = format!(
        "name: wakes\nfunctions:\n{}routes:\n  - http: POST /wake\n    sequence: [waker]\n",
        flood_fn("waker"),
    );
    let agent = Agent::start(&spec);
    // Settle: the chain is idle.
    std::thread::sleep(Duration::from_millis(300));
    let ticks = |pid| cpu_ticks(pid).expect("agent's /proc stat");
    let before = ticks(agent.pid());
    let at = Instant::now();
    let a = agent.call("wake", "wake 3000");
    assert!(a.body.starts_with("waking"), "{a:?}");
    std::thread::sleep(Duration::from_millis(3000));
    let used = ticks(agent.pid()) - before;
    let wall = at.elapsed();
    let bumps: u64 = agent
        .call("wake", "woke")
        .body
        .trim_start_matches("woke ")
        .trim()
        .parse()
        .expect("bump count");
    // Clock ticks are 10 ms: 3 s of a whole CPU is 300.
    eprintln!("{bumps} wake-word bumps in {wall:?}; the agent used {used} ticks");
    assert!(bumps > 100_000, "the fixture bumped hard ({bumps})");
    assert!(
        used < 45,
        "the agent used {used} clock ticks (of {} in the wall time) while the wake word \
         was bumped {bumps} times",
        wall.as_millis() / 10
    );
    assert_eq!(agent.stop(), Some(0), "the chain stops cleanly");
}
