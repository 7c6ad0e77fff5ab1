//! `examples/polyglot` end to end: one route through Python -> Go -> Rust -> Node.js -> C,
//! run from its own `chain.yaml` by the real `zerohop up`, answered over real HTTP. Each
//! step checks that the one before it ran, works on the body in the slot and appends its tag,
//! so the answer's bytes say that all five ran, in order, on one request.
//!
//! Then, for every language alike: an idle instance uses no CPU, and an instance killed
//! while it holds a request gets that request answered 502 and is restarted, after which
//! the chain answers again.
//!
//! The functions are built by `cargo xtask polyglot` (and by `cargo xtask test` before the
//! workspace's tests): `target/polyglot/step-{c,go}`, `target/release/polyglot-rs`, the
//! Python SDK in `target/python-sdk`, `examples/polyglot/node_modules`.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{client, post};
use zerohop_test_support::{
    cpu_ticks, instances, signal_pid, ticks_per_second, wait_until, ChainProcess, Signal, TempDir,
};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("the checkout")
}

/// The steps in route order: (function, what its instance's command line contains).
const STEPS: [(&str, &str); 5] = [
    ("py", "-m\0zerohop"),
    ("go", "step-go"),
    ("rs", "polyglot-rs"),
    ("js", "step.js"),
    ("c", "step-c"),
];

/// Each function's instance pid, told apart by their command lines.
fn pids(chain: &ChainProcess) -> BTreeMap<&'static str, u32> {
    let mut out = BTreeMap::new();
    for pid in instances(chain.pid()) {
        let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&cmdline);
        if let Some((name, _)) = STEPS.iter().find(|(_, m)| cmdline.contains(m)) {
            out.insert(*name, pid);
        }
    }
    out
}

fn start() -> ChainProcess {
    let root = root();
    for built in [
        "target/polyglot/step-c",
        "target/polyglot/step-go",
        "target/release/polyglot-rs",
        "target/python-sdk/zerohop/__init__.py",
        "examples/polyglot/node_modules/zerohop/package.json",
    ] {
        assert!(
            root.join(built).exists(),
            "{built} is missing: `cargo xtask polyglot` builds the example's functions \
             (`cargo xtask test` does too)"
        );
    }
    // From the checkout's root, as `cargo xtask polyglot` runs it: the spec's PYTHONPATH is
    // relative to it. Watched: each step says when it holds a `sleep-` request.
    ChainProcess::start_file_in_watched(
        &root.join("examples/polyglot/chain.yaml"),
        &[],
        TempDir::new("polyglot"),
        Some(&root),
    )
}

#[test]
fn one_route_through_five_languages_on_one_slot() {
    let chain = start();
    let url = format!("{}/polyglot", chain.url);
    let http = client();
    let r = post(&http, &url, "hello");
    assert_eq!((r.status, r.body.as_str()), (200, "HELLO+py+go+rs+js+c"));
    // Python upper-cases ASCII only; the other bytes go through every step untouched.
    let r = post(&http, &url, "grüße, zürich");
    assert_eq!(
        (r.status, r.body.as_str()),
        (200, "GRüßE, ZüRICH+py+go+rs+js+c")
    );
    // A larger body (40 KB, in a 64 KiB slot), written in place by Python and extended by
    // the others.
    let big = "abcdefghij".repeat(4000);
    let r = post(&http, &url, &big);
    assert_eq!(r.status, 200);
    assert_eq!(r.body, format!("{}+py+go+rs+js+c", big.to_uppercase()));
    // Four clients at once, each with bodies of its own: no answer carries another's bytes.
    std::thread::scope(|s| {
        for t in 0..4 {
            let url = &url;
            s.spawn(move || {
                let http = client();
                for i in 0..50 {
                    let body = format!("client {t} request {i}");
                    let r = post(&http, url, &body);
                    assert_eq!(r.status, 200, "{body}: {}", r.body);
                    assert_eq!(r.body, format!("{}+py+go+rs+js+c", body.to_uppercase()));
                }
            });
        }
    });

    // Idle: every language's instance sleeps in the kernel.
    let before = pids(&chain);
    assert_eq!(before.len(), 5, "one instance per step: {before:?}");
    std::thread::sleep(Duration::from_millis(300));
    let ticks: Vec<_> = before
        .values()
        .map(|&p| cpu_ticks(p).expect("an idle instance is alive"))
        .collect();
    let idle = Duration::from_secs(2);
    std::thread::sleep(idle);
    for ((name, &pid), t0) in before.iter().zip(ticks) {
        let used = cpu_ticks(pid).expect("an idle instance is alive") - t0;
        let share = used as f64 / ticks_per_second() / idle.as_secs_f64();
        // Generous: a busy loop would be 1.0; sleeping in the kernel is 0.
        assert!(
            share < 0.05,
            "{name}: idle instance used {share:.3} of a core"
        );
    }

    // Each language's instance killed while it holds a request (it says so, and holds it a
    // minute: only the kill ends it within the chain's 10 s timeout): 502, restarted, serving.
    for (name, _) in STEPS {
        let victim = pids(&chain)[name];
        let held = {
            let url = url.clone();
            std::thread::spawn(move || post(&client(), &url, &format!("sleep-{name}:x")))
        };
        chain.wait_for_output(
            &format!("{name}: holding the request"),
            Duration::from_secs(30),
            &format!("{name}'s instance holding the request"),
        );
        signal_pid(victim, Signal::SIGKILL);
        let r = held.join().expect("the held request's client");
        assert_eq!(r.status, 502, "{name} killed with the request: {}", r.body);
        assert!(
            wait_until(Duration::from_secs(15), || pids(&chain)
                .get(name)
                .is_some_and(|&p| p != victim)),
            "{name} was not restarted"
        );
        let r = post(&http, &url, "again");
        assert_eq!(
            (r.status, r.body.as_str()),
            (200, "AGAIN+py+go+rs+js+c"),
            "after {name} restarted"
        );
    }
    assert_eq!(chain.stop(), Some(0));
}
