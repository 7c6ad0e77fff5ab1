//! Every system of the benchmark, started for real: answers to small and 1 MiB bodies through
//! a real HTTP client, the components it reports, CPU pinning, and nothing left after stop.
//!
//! Needs the binaries built into the same target folder first:
//! `cargo build --release --workspace --bins`, then `cargo test --release -p zerohop-bench`.
//! `nginx-broker` needs nginx at `/usr/sbin/nginx` (`apt-get install -y nginx-light`, which
//! `cargo xtask test` does as root); without it that system's test fails saying so.

use std::io::Read;
use std::sync::Mutex;
use std::time::Duration;

use zerohop_bench::h2load::Protocol;
use zerohop_bench::systems::tls::{self, Certificate};
use zerohop_bench::systems::{self, StartOpts, SystemId};
use zerohop_bench::{passes, Step, HELLO};
use zerohop_test_support::{alive, target_bin, wait_until, Signal, TempDir};
use zerohop_transport::Backend;

/// Systems run one at a time: the machine may have two cores.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// The first CPU this process may run on (pinning every system there keeps the test valid
/// inside a restricted cpuset).
fn first_allowed_cpu() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").expect("read /proc/self/status");
    let list = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .expect("Cpus_allowed_list in /proc/self/status")
        .trim();
    list.split([',', '-'])
        .next()
        .and_then(|c| c.parse().ok())
        .expect("a CPU number")
}

fn cpus_allowed(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
                .map(|v| v.trim().to_owned())
        })
        .unwrap_or_default()
}

/// The component names `id` must report for `chain`.
fn expected_components(id: SystemId, chain: &[Step]) -> Vec<String> {
    let numbered = |mut names: Vec<String>| {
        names.extend(
            chain
                .iter()
                .enumerate()
                .map(|(i, s)| format!("fn:{}#{i}", s.name())),
        );
        names
    };
    match id {
        SystemId::Zerohop(_) => {
            let mut v = vec!["gateway".to_owned()];
            if chain == HELLO {
                v.extend(["fn:upper".to_owned(), "fn:exclaim".to_owned()]);
            } else {
                v.extend((1..=chain.len()).map(|i| format!("fn:pass{i}")));
            }
            v
        }
        SystemId::Monolith | SystemId::HyperMonolith(_) | SystemId::GoMonolith(_) => {
            vec!["monolith".to_owned()]
        }
        SystemId::HttpChain | SystemId::GoHttpChain(_) => numbered(Vec::new()),
        SystemId::NginxBroker => numbered(vec!["nginx".into(), "nginx-worker".into()]),
        SystemId::NginxTls => vec!["nginx".into(), "nginx-worker".into(), "monolith".into()],
    }
}

fn post(agent: &ureq::Agent, url: &str, body: &[u8]) -> (u16, Vec<u8>) {
    let resp = match agent.post(url).send_bytes(body) {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("POST {url} ({} bytes): {e}", body.len()),
    };
    let status = resp.status();
    let mut out = Vec::new();
    resp.into_reader()
        .read_to_end(&mut out)
        .expect("read the answer");
    (status, out)
}

/// A body of `n` bytes of lower-case text (so `upper` changes every letter).
fn body(n: usize) -> Vec<u8> {
    b"zero hop payload "
        .iter()
        .copied()
        .cycle()
        .take(n)
        .collect()
}

fn check(id: SystemId) {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    if id == SystemId::NginxBroker {
        // Not a skip: a green run must mean the baseline was checked. `cargo xtask test`
        // installs nginx-light.
        if let Err(why) = systems::nginx_binary() {
            panic!(
                "nginx-broker cannot be checked: {why}; `cargo xtask test` installs it (as root \
                 with apt)"
            );
        }
    }
    let work = TempDir::new("bench-systems");
    let cpu = first_allowed_cpu();
    let opts = StartOpts {
        cpus: Some(cpu.to_string()),
        gateway_threads: None,
        pipelines: false,
        instances: 1,
        bin_dir: target_bin("zerohop")
            .parent()
            .expect("binary folder")
            .to_path_buf(),
        work_dir: work.path().to_path_buf(),
        tls: None,
    };
    for chain in [HELLO.to_vec(), passes(3)] {
        let what = format!("{} {:?}", id.name(), chain);
        let sys = systems::start(id, &chain, &opts).unwrap_or_else(|e| panic!("{what}: {e:#}"));
        assert_eq!(sys.id, id);
        assert!(
            sys.url.starts_with("http://127.0.0.1:"),
            "{what}: url {}",
            sys.url
        );

        let names: Vec<String> = sys.components.iter().map(|c| c.name.clone()).collect();
        assert_eq!(names, expected_components(id, &chain), "{what}: components");
        let mut pids: Vec<u32> = sys.components.iter().map(|c| c.pid).collect();
        pids.sort_unstable();
        pids.dedup();
        assert_eq!(pids.len(), sys.components.len(), "{what}: distinct pids");
        for c in &sys.components {
            assert!(
                alive(c.pid),
                "{what}: {} (pid {}) not running",
                c.name,
                c.pid
            );
            assert_eq!(
                cpus_allowed(c.pid),
                cpu.to_string(),
                "{what}: {} (pid {}) not pinned to CPU {cpu}",
                c.name,
                c.pid
            );
        }

        let agent = ureq::AgentBuilder::new()
            .timeout(Duration::from_secs(20))
            .build();
        for n in [100, 1 << 20] {
            let sent = body(n);
            let (status, got) = post(&agent, &sys.url, &sent);
            assert_eq!(
                status,
                200,
                "{what}, {n} bytes: {}",
                String::from_utf8_lossy(&got[..got.len().min(300)])
            );
            assert!(
                got == Step::expected(&chain, &sent),
                "{what}, {n} bytes: wrong answer ({} bytes, starts {:?})",
                got.len(),
                String::from_utf8_lossy(&got[..got.len().min(40)])
            );
        }
        // Keep-alive connections stay open across the stop: a system must not wait for them.
        let components = sys.components.clone();
        sys.stop();
        for c in &components {
            assert!(
                wait_until(Duration::from_secs(5), || !alive(c.pid)),
                "{what}: {} (pid {}) still running after stop",
                c.name,
                c.pid
            );
        }
        drop(agent);
    }
}

#[test]
fn zerohop_ring() {
    check(SystemId::Zerohop(Backend::Ring));
}

#[test]
fn zerohop_socket() {
    check(SystemId::Zerohop(Backend::Socket));
}

#[test]
fn zerohop_poll() {
    check(SystemId::Zerohop(Backend::Poll));
}

#[test]
fn zerohop_sockmap() {
    check(SystemId::Zerohop(Backend::Sockmap));
}

#[test]
fn monolith() {
    check(SystemId::Monolith);
}

#[test]
fn http_chain() {
    check(SystemId::HttpChain);
}

#[test]
fn nginx_broker() {
    check(SystemId::NginxBroker);
}

/// The multi-core point's baselines, on the one CPU the test pins them to.
#[test]
fn hyper_monolith_on_two_worker_threads() {
    check(SystemId::HyperMonolith(2));
}

/// Built by `go build` here as zerohop-bench builds them (Go must be on PATH).
fn build_go() {
    let bin = target_bin("zerohop");
    systems::go::build(bin.parent().expect("binary folder"))
        .unwrap_or_else(|e| panic!("the Go baselines cannot be checked: {e:#}"));
}

#[test]
fn go_monolith() {
    build_go();
    check(SystemId::GoMonolith(1));
}

#[test]
fn go_http_chain() {
    build_go();
    check(SystemId::GoHttpChain(1));
}

/// `id` serving HTTPS with a certificate made for the test: the exact answer over HTTP/1.1
/// and h2 by ALPN (curl, trusting only that certificate), the components it reports, and
/// nothing left after stop.
fn check_tls(id: SystemId) {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    if id == SystemId::NginxTls {
        if let Err(why) = systems::nginx_binary() {
            panic!("nginx-tls cannot be checked: {why}; `cargo xtask test` installs it");
        }
    }
    let work = TempDir::new("bench-systems-tls");
    let cert = Certificate::generate(&work.path().join("tls")).expect("a certificate");
    let opts = StartOpts {
        cpus: Some(first_allowed_cpu().to_string()),
        gateway_threads: None,
        pipelines: false,
        instances: 1,
        bin_dir: target_bin("zerohop")
            .parent()
            .expect("binary folder")
            .to_path_buf(),
        work_dir: work.path().to_path_buf(),
        tls: Some(cert.clone()),
    };
    let sys = systems::start(id, &HELLO, &opts).unwrap_or_else(|e| panic!("{}: {e:#}", id.name()));
    assert!(sys.url.starts_with("https://127.0.0.1:"), "url {}", sys.url);
    let names: Vec<String> = sys.components.iter().map(|c| c.name.clone()).collect();
    assert_eq!(names, expected_components(id, &HELLO));
    let sent = body(100);
    for protocol in [Protocol::Https, Protocol::H2] {
        let (status, got) = tls::probe(&sys.url, Some(&cert.cert), protocol, &sent)
            .unwrap_or_else(|e| panic!("{} {}: {e}", id.name(), protocol.name()));
        assert_eq!(status, 200, "{} {}", id.name(), protocol.name());
        assert_eq!(
            got,
            Step::expected(&HELLO, &sent),
            "{} {}",
            id.name(),
            protocol.name()
        );
    }
    // Clear text gets no answer from the chain (nginx says 400), and curl without the
    // certificate refuses the handshake.
    let clear = sys.url.replace("https://", "http://");
    let answer = tls::probe(&clear, None, Protocol::Http1, &sent);
    assert!(!matches!(answer, Ok((200, _))), "{}: {answer:?}", id.name());
    assert!(tls::probe(&sys.url, None, Protocol::Https, &sent).is_err());
    let components = sys.components.clone();
    sys.stop();
    for c in &components {
        assert!(
            wait_until(Duration::from_secs(5), || !alive(c.pid)),
            "{} (pid {}) still running after stop",
            c.name,
            c.pid
        );
    }
}

#[test]
fn zerohop_ring_over_tls() {
    check_tls(SystemId::Zerohop(Backend::Ring));
}

#[test]
fn nginx_tls() {
    check_tls(SystemId::NginxTls);
}

#[test]
fn all_lists_every_system_once() {
    let all = SystemId::all();
    let names: Vec<String> = all.iter().map(SystemId::name).collect();
    assert_eq!(
        names,
        [
            "zerohop-ring",
            "zerohop-socket",
            "zerohop-poll",
            "zerohop-sockmap",
            "monolith",
            "http-chain",
            "nginx-broker"
        ]
    );
}

#[test]
fn missing_binaries_and_empty_chains_are_clear_errors() {
    let work = TempDir::new("bench-systems-missing");
    let empty = TempDir::new("bench-systems-nobin");
    let opts = StartOpts {
        cpus: None,
        gateway_threads: None,
        pipelines: false,
        instances: 1,
        bin_dir: empty.path().to_path_buf(),
        work_dir: work.path().to_path_buf(),
        tls: None,
    };
    for id in [
        SystemId::Zerohop(Backend::Ring),
        SystemId::Monolith,
        SystemId::HttpChain,
    ] {
        let err = match systems::start(id, &HELLO, &opts) {
            Ok(_) => panic!("{} started without binaries", id.name()),
            Err(e) => format!("{e:#}"),
        };
        assert!(
            err.contains("is missing") && err.contains("cargo build --release"),
            "{}: {err}",
            id.name()
        );
    }
    let err = match systems::start(SystemId::Monolith, &[], &opts) {
        Ok(_) => panic!("an empty chain started"),
        Err(e) => format!("{e:#}"),
    };
    assert!(err.contains("at least one step"), "{err}");
}

#[test]
fn zerohop_components_follow_a_restarted_function() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let work = TempDir::new("bench-systems-restart");
    let opts = StartOpts {
        cpus: None,
        gateway_threads: None,
        pipelines: false,
        instances: 1,
        bin_dir: target_bin("zerohop")
            .parent()
            .expect("binary folder")
            .to_path_buf(),
        work_dir: work.path().to_path_buf(),
        tls: None,
    };
    let mut sys = systems::start(SystemId::Zerohop(Backend::Ring), &HELLO, &opts)
        .unwrap_or_else(|e| panic!("{e:#}"));
    let pid_of = |sys: &systems::RunningSystem, name: &str| {
        sys.components
            .iter()
            .find(|c| c.name == name)
            .map(|c| c.pid)
    };
    let old = pid_of(&sys, "fn:upper").expect("fn:upper listed");
    zerohop_test_support::signal_pid(old, Signal::SIGKILL);
    assert!(
        wait_until(Duration::from_secs(10), || {
            sys.refresh_components();
            pid_of(&sys, "fn:upper").is_some_and(|p| p != old && alive(p))
        }),
        "fn:upper was not restarted and found again: {:?}",
        sys.components
    );
    let names: Vec<&str> = sys.components.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["gateway", "fn:upper", "fn:exclaim"]);
    let agent = ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(20))
        .build();
    assert!(
        wait_until(Duration::from_secs(10), || {
            post(&agent, &sys.url, b"again") == (200, b"AGAIN!".to_vec())
        }),
        "the chain does not answer after the restart"
    );
    let components = sys.components.clone();
    sys.stop();
    for c in &components {
        assert!(
            wait_until(Duration::from_secs(5), || !alive(c.pid)),
            "{} (pid {}) still running after stop",
            c.name,
            c.pid
        );
    }
}
