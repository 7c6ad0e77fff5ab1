//! Crash safety and leaks, with the agent in this process (so the test can read the pool's
//! owner table and its own descriptors) and the functions as real processes.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::common::{client, func, post, runtime};
use zerohop_agent::{spec, up, Running, UpOptions};
use zerohop_pool::Owner;
use zerohop_test_support::{
    alive, children, instances, memfd_mappings, memfds, open_fds, signal_pid, spawner, wait_until,
    Signal,
};

fn start(rt: &tokio::runtime::Runtime, yaml: &str, transport: &str) -> Running {
    let spec = spec::parse(Path::new("test.yaml"), yaml).expect("valid spec");
    let opts = UpOptions {
        listen: "127.0.0.1:0".parse().unwrap(),
        transport: Some(transport.parse().unwrap()),
        ..UpOptions::default()
    };
    rt.block_on(up(spec, opts)).expect("chain up")
}

#[test]
fn kill_9_with_32_in_flight_answers_all_and_recovers() {
    let _serial = crate::serial();
    for transport in ["ring", "socket", "sockmap"] {
        let rt = runtime();
        let yaml = format!(
            "name: crash\ntimeout: 20s\nfunctions:\n{}{}routes:\n  - http: POST /hello\n    sequence: [upper, exclaim]\n",
            func("upper", "slow", "DELAY_MS: 2000", ", concurrency: 32"),
            func("exclaim", "exclaim", "", ""),
        );
        let chain = start(&rt, &yaml, transport);
        let url = format!("{}/hello", chain.url());
        // From the agent's own records: an instance is not dumpable and its environment is
        // cleared, so /proc/PID/environ says nothing about which function it runs.
        let upper = chain.parties_of("upper")[0];
        let victim = chain.instance_pid(upper).expect("upper runs");
        let clients: Vec<_> = (0..32)
            .map(|i| {
                let url = url.clone();
                std::thread::spawn(move || post(&client(), &url, &format!("r{i}")))
            })
            .collect();
        // All 32 are inside `upper` once it holds 32 slots.
        let upper_party = Owner::party(upper);
        assert!(
            wait_until(Duration::from_secs(10), || chain
                .pools()
                .held_by(upper_party)
                .len()
                == 32),
            "{transport}: 32 requests reached upper"
        );
        signal_pid(victim, Signal::SIGKILL);
        let answers: Vec<_> = clients.into_iter().map(|c| c.join().unwrap()).collect();
        let ok = answers.iter().filter(|a| a.status == 200).count();
        let failed = answers.iter().filter(|a| a.status == 502).count();
        assert_eq!(
            ok + failed,
            32,
            "{transport}: every request answered 200 or 502: {answers:?}"
        );
        assert_eq!(failed, 32, "{transport}: all were in the killed instance");
        assert!(answers.iter().all(|a| a.status == 200
            || a.body
                .contains(&format!("instance {upper} was killed by signal 9"))));
        assert!(
            chain.pools().held_by(upper_party).is_empty(),
            "{transport}: no slot stays with the dead instance"
        );
        // The instance is restarted and new requests work.
        let agent = client();
        assert!(
            wait_until(Duration::from_secs(15), || post(&agent, &url, "again")
                .status
                == 200),
            "{transport}: chain recovered"
        );
        assert_ne!(chain.instance_pid(upper), Some(victim));
        assert_eq!(chain.restarts(upper), 1);
        rt.block_on(chain.shutdown());
    }
}

#[test]
fn ten_thousand_requests_leave_no_leak() {
    let _serial = crate::serial();
    let rt = runtime();
    // Baseline after the runtime exists (its epoll and eventfd stay).
    let me = std::process::id();
    let fds_before = open_fds(me);
    let yaml = format!(
        "name: leaks\nfunctions:\n{}{}routes:\n  - http: POST /hello\n    sequence: [upper, exclaim]\n",
        func("upper", "upper", "", ", instances: 2"),
        func("exclaim", "exclaim", "", ""),
    );
    let chain = start(&rt, &yaml, "ring");
    let url = Arc::new(format!("{}/hello", chain.url()));
    let workers: Vec<_> = (0..4)
        .map(|w| {
            let url = url.clone();
            std::thread::spawn(move || {
                let agent = client();
                for i in 0..2500 {
                    let a = post(&agent, &url, &format!("w{w} n{i}"));
                    assert_eq!(a.status, 200);
                    assert_eq!(a.body, format!("W{w} N{i}!"));
                }
            })
        })
        .collect();
    for w in workers {
        w.join().expect("worker saw only correct answers");
    }
    assert_eq!(chain.pools().in_use(), 0, "no slot owned after the load");
    assert_eq!(chain.gateways().inflight(), 0);
    assert_eq!(chain.gateways().total(|s| &s.accepted), 10_000);
    assert_eq!(instances(me).len(), 3);
    // The spawner holds stdio, its socket, /dev/null and the instances' Landlock ruleset:
    // none of the chain's memory.
    let sp = spawner(me).expect("the spawner runs");
    assert!(open_fds(sp) <= 6, "spawner descriptors: {}", open_fds(sp));
    assert!(memfds(sp).is_empty(), "spawner memfds: {:?}", memfds(sp));
    // The instances and the spawner: all must go.
    let kids = children(me);
    assert_eq!(kids.len(), 4);
    rt.block_on(chain.shutdown());
    for k in &kids {
        assert!(
            wait_until(Duration::from_secs(5), || !alive(*k)),
            "instance {k} left behind"
        );
    }
    assert!(children(me).is_empty(), "no child process left");
    assert!(memfds(me).is_empty(), "memfds still open: {:?}", memfds(me));
    assert_eq!(memfd_mappings(me), 0, "pool or ring still mapped");
    // Sockets of the client connections are closed by now; allow a moment for the server
    // side to see the FIN.
    assert!(
        wait_until(Duration::from_secs(5), || open_fds(me) <= fds_before),
        "fds: {} before, {} after",
        fds_before,
        open_fds(me)
    );
    drop(rt);
}

#[test]
fn failed_start_stops_and_reaps_the_instances_already_started() {
    let _serial = crate::serial();
    let rt = runtime();
    let me = std::process::id();
    let yaml = format!(
        "name: halfway\nfunctions:\n{}  quits: {{ command: [\"/bin/true\"] }}\nroutes:\n  - http: POST /x\n    sequence: [good, quits]\n",
        func("good", "upper", "", ", instances: 2"),
    );
    let spec = spec::parse(Path::new("test.yaml"), &yaml).expect("valid spec");
    // Two gateway threads (parties 0 and 1): the second thread is stopped too.
    let opts = UpOptions {
        listen: "127.0.0.1:0".parse().unwrap(),
        gateway_threads: Some(2),
        ..UpOptions::default()
    };
    let err = match rt.block_on(up(spec, opts)) {
        Ok(_) => panic!("a function that exits at once cannot come up"),
        Err(e) => e.to_string(),
    };
    assert!(
        // Parties: 0-1 the gateway threads, 2-4 `good` (2 instances and the spare for
        // updates), 5 `quits`.
        err.contains("function 'quits' (instance 5) exited"),
        "{err}"
    );
    assert!(
        wait_until(Duration::from_secs(5), || !thread_names(me)
            .iter()
            .any(|n| n.starts_with("gateway-"))),
        "the gateway thread ended: {:?}",
        thread_names(me)
    );
    // Every instance started before the failure is gone and reaped (no zombie child).
    assert!(children(me).is_empty(), "children left: {:?}", children(me));
    assert!(memfds(me).is_empty(), "memfds left: {:?}", memfds(me));
    drop(rt);
}

/// Names of the threads of process `pid`.
fn thread_names(pid: u32) -> Vec<String> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("comm")).ok())
        .map(|n| n.trim().to_owned())
        .collect()
}

#[test]
fn every_gateway_thread_serves_and_gets_its_own_answers() {
    let _serial = crate::serial();
    for transport in ["ring", "socket", "sockmap"] {
        let rt = runtime();
        let yaml = format!(
            "name: threads\ngateway_threads: 4\nfunctions:\n{}{}routes:\n  - http: POST /hello\n    sequence: [upper, exclaim]\n",
            func("upper", "upper", "", ", instances: 2"),
            func("exclaim", "exclaim", "", ""),
        );
        let chain = start(&rt, &yaml, transport);
        assert_eq!(chain.gateways().len(), 4);
        assert_eq!(
            chain.parties_of("upper"),
            vec![4, 5],
            "instances follow the gateways"
        );
        let url = Arc::new(format!("{}/hello", chain.url()));
        // One connection per worker; SO_REUSEPORT spreads connections by their address.
        let workers: Vec<_> = (0..32)
            .map(|w| {
                let url = url.clone();
                std::thread::spawn(move || {
                    let agent = client();
                    for i in 0..100 {
                        let a = post(&agent, &url, &format!("w{w} n{i}"));
                        assert_eq!(a.status, 200, "{a:?}");
                        assert_eq!(a.body, format!("W{w} N{i}!"));
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().expect("worker saw only correct answers");
        }
        let per: Vec<u64> = chain
            .gateways()
            .iter()
            .map(|g| {
                g.stats()
                    .accepted
                    .load(std::sync::atomic::Ordering::Relaxed)
            })
            .collect();
        assert_eq!(per.iter().sum::<u64>(), 3200, "{transport}: {per:?}");
        assert!(
            per.iter().filter(|&&n| n > 0).count() >= 2,
            "{transport}: connections reached several gateway threads: {per:?}"
        );
        assert_eq!(chain.gateways().total(|s| &s.refused), 0);
        assert_eq!(chain.gateways().total(|s| &s.late), 0);
        assert_eq!(
            chain.pools().in_use(),
            0,
            "{transport}: no slot owned after the load"
        );
        rt.block_on(chain.shutdown());
    }
}
