//! Function graphs: calls, fan-out and fan-in, a failing branch, a call outside the spec's
//! `calls`. The agent runs in this process (so the test reads the pools' owner tables), the
//! functions are real processes (`zerohop-graphfn`).

use std::path::Path;
use std::time::Duration;

use crate::common::{client, post, runtime};
use zerohop_agent::{spec, up, Running, UpOptions};
use zerohop_test_support::{target_bin, wait_until, Signal};

fn start(rt: &tokio::runtime::Runtime, yaml: &str, transport: &str) -> Running {
    let spec = spec::parse(Path::new("graph.yaml"), yaml)
        .unwrap_or_else(|e| panic!("invalid spec: {e}\n{yaml}"));
    let opts = UpOptions {
        listen: "127.0.0.1:0".parse().unwrap(),
        transport: Some(transport.parse().unwrap()),
        ..UpOptions::default()
    };
    rt.block_on(up(spec, opts)).expect("chain up")
}

/// A function line of the spec running `zerohop-graphfn` in `mode`.
fn graphfn(name: &str, mode: &str, extra: &str) -> String {
    format!(
        "  {name}: {{ command: [\"{}\"], env: {{ GRAPH_MODE: {mode}{extra}",
        target_bin("zerohop-graphfn").display()
    )
}

fn spec(policy: &str) -> String {
    format!(
        "name: graph\ntimeout: 2s\nfunctions:\n\
         {}, GRAPH_CALLS: \"up,crashy,twice\"{policy} }}, concurrency: 4, calls: [up, crashy, twice] }}\n\
         {} }}, instances: 2 }}\n\
         {} }} }}\n\
         {}, GRAPH_CALLS: up }}, calls: [up] }}\n\
         {}, GRAPH_CALLS: up }} }}\n\
         routes:\n  - http: POST /join\n    sequence: [join]\n  - http: POST /sneaky\n    sequence: [sneaky]\n",
        graphfn("join", "join", ""),
        graphfn("up", "upper", ""),
        graphfn("crashy", "crashy", ""),
        graphfn("twice", "twice", ""),
        graphfn("sneaky", "forbidden", ""),
    )
}

/// No slot held by anyone once every answer is in (the last answers' slots are freed by
/// the gateway right after it wrote them).
fn no_slot_held(chain: &Running) -> bool {
    wait_until(Duration::from_secs(5), || chain.pools().in_use() == 0)
}

#[test]
fn calls_fan_out_and_join_with_a_failing_branch() {
    let _serial = crate::serial();
    for transport in ["ring", "socket", "sockmap"] {
        let rt = runtime();
        let chain = start(&rt, &spec(""), transport);
        let url = format!("{}/join", chain.url());
        let agent = client();

        // Three branches at once, one of which (`twice`) calls `up` itself.
        let a = post(&agent, &url, "abc");
        assert_eq!(a.status, 200, "{transport}: {a:?}");
        assert_eq!(a.body, "up=ABC;crashy=cba;twice=ABCABC;", "{transport}");

        // Many at once, from several clients: every answer exact.
        let workers: Vec<_> = (0..4)
            .map(|w| {
                let url = url.clone();
                std::thread::spawn(move || {
                    let agent = client();
                    for i in 0..50 {
                        let body = format!("w{w}r{i}");
                        let a = post(&agent, &url, &body);
                        let rev: String = body.chars().rev().collect();
                        let up = body.to_uppercase();
                        assert_eq!(a.status, 200, "{a:?}");
                        assert_eq!(a.body, format!("up={up};crashy={rev};twice={up}{up};"));
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().expect("every answer exact");
        }

        // A branch answering an error: its status reaches the join.
        let a = post(&agent, &url, "teapot");
        assert_eq!(
            a.body, "up=TEAPOT;crashy!418;twice=TEAPOTTEAPOT;",
            "{transport}"
        );

        // A branch whose instance dies: the join goes on with what arrived, and the failed
        // branch says 502: the join learned of the death (had it waited for the deadline,
        // the branch would say 504).
        let crashy = chain.parties_of("crashy")[0];
        let before = chain.instance_pid(crashy).expect("crashy runs");
        let a = post(&agent, &url, "crash");
        assert_eq!(a.status, 200, "{transport}: {a:?}");
        assert_eq!(
            a.body, "up=CRASH;crashy!502;twice=CRASHCRASH;",
            "{transport}"
        );
        // It is restarted and serves again.
        assert!(
            wait_until(Duration::from_secs(10), || chain
                .instance_pid(crashy)
                .is_some_and(|p| p != before)
                && post(&agent, &url, "x").body == "up=X;crashy=x;twice=XX;"),
            "{transport}: crashy back"
        );

        // A branch that hangs: 504 for that branch after the chain's timeout.
        let a = post(&agent, &url, "hang");
        assert_eq!(a.body, "up=HANG;crashy!504;twice=HANGHANG;", "{transport}");

        // Calling a function not in the spec's `calls`: refused before anything is sent.
        let a = post(&agent, &format!("{}/sneaky", chain.url()), "abc");
        assert_eq!(a.status, 200, "{transport}: {a:?}");
        assert!(
            a.body.contains("`sneaky` may not call `up`"),
            "{transport}: {}",
            a.body
        );

        assert!(
            no_slot_held(&chain),
            "{transport}: slots left: {}",
            chain.pools().in_use()
        );
        assert_eq!(chain.gateways().inflight(), 0);
        rt.block_on(chain.shutdown());
    }
}

#[test]
fn a_failing_branch_can_fail_the_request() {
    let _serial = crate::serial();
    let rt = runtime();
    let chain = start(&rt, &spec(", GRAPH_POLICY: fail"), "ring");
    let url = format!("{}/join", chain.url());
    let agent = client();
    assert_eq!(post(&agent, &url, "ok").status, 200);
    let a = post(&agent, &url, "teapot");
    assert_eq!(a.status, 418, "{a:?}");
    assert!(
        a.body.contains("call to `crashy` failed with 418"),
        "{}",
        a.body
    );
    let a = post(&agent, &url, "crash");
    assert_eq!(a.status, 502, "{a:?}");
    assert!(
        a.body.contains("died while handling the call"),
        "{}",
        a.body
    );
    assert!(
        no_slot_held(&chain),
        "slots left: {}",
        chain.pools().in_use()
    );
    rt.block_on(chain.shutdown());
}

fn fan_spec() -> String {
    format!(
        "name: fan\ntimeout: 2s\nfunctions:\n\
         {} }}, concurrency: 2 }}\n\
         {} }} }}\n\
         {} }}, instances: 2 }}\n\
         {} }} }}\n\
         {}, GRAPH_CALLS: up }}, calls: [up] }}\n\
         {}, GRAPH_CALLS: up }} }}\n\
         routes:\n\
         \x20 - http: POST /fan\n    sequence: [{{ fan_out: [up, crashy, twice], join: merge, on_error: join }}]\n\
         \x20 - http: POST /strict\n    sequence: [{{ fan_out: [up, crashy], join: strict }}, up]\n\
         \x20 - http: POST /stray\n    sequence: [stray]\n",
        graphfn("merge", "merge", ""),
        graphfn("strict", "merge", ""),
        graphfn("up", "upper", ""),
        graphfn("crashy", "crashy", ""),
        graphfn("twice", "twice", ""),
        graphfn("stray", "stray", ""),
    )
}

#[test]
fn static_fan_out_joins_every_branch_under_either_policy() {
    let _serial = crate::serial();
    let rt = runtime();
    let chain = start(&rt, &fan_spec(), "ring");
    let agent = client();
    let fan = format!("{}/fan", chain.url());
    let strict = format!("{}/strict", chain.url());

    // Three branches, joined in the spec's order.
    let a = post(&agent, &fan, "abc");
    assert_eq!((a.status, a.body.as_str()), (200, "0=ABC;1=cba;2=ABCABC;"));
    // The join's output goes on along the sequence.
    let a = post(&agent, &strict, "abc");
    assert_eq!((a.status, a.body.as_str()), (200, "0=ABC;1=CBA;"));

    // A failing branch: `join` sees it, `fail` (the default) fails the request with it.
    let a = post(&agent, &fan, "teapot");
    assert_eq!(a.body, "0=TEAPOT;1!418;2=TEAPOTTEAPOT;");
    let a = post(&agent, &strict, "teapot");
    assert_eq!(a.status, 418, "{a:?}");
    assert!(
        a.body.contains("call to `crashy` failed with 418"),
        "{}",
        a.body
    );

    // A branch that crashes: 502 for it, at once.
    let crashy = chain.parties_of("crashy")[0];
    let before = chain.instance_pid(crashy).expect("crashy runs");
    let a = post(&agent, &fan, "crash");
    assert_eq!(
        (a.status, a.body.as_str()),
        (200, "0=CRASH;1!502;2=CRASHCRASH;")
    );
    assert!(wait_until(Duration::from_secs(10), || chain
        .instance_pid(crashy)
        .is_some_and(|p| p != before)
        && post(&agent, &fan, "x").body == "0=X;1=x;2=XX;"));
    let a = post(&agent, &strict, "crash");
    assert_eq!(a.status, 502, "{a:?}");
    assert!(
        a.body.contains("died while handling the call"),
        "{}",
        a.body
    );

    // A function forwarding along an edge the spec does not declare is refused (and the
    // request answered with why), and counted among the gateway's errors.
    let errors = chain.gateways().total(|s| &s.errors);
    let a = post(&agent, &format!("{}/stray", chain.url()), "abc");
    assert_eq!(a.status, 500, "{a:?}");
    assert!(a.body.contains("may not forward to `up`"), "{}", a.body);
    assert_eq!(chain.gateways().total(|s| &s.errors), errors + 1);

    assert!(
        no_slot_held(&chain),
        "slots left: {}",
        chain.pools().in_use()
    );
    assert_eq!(chain.gateways().inflight(), 0);
    rt.block_on(chain.shutdown());
}

#[test]
fn chain_state_is_shared_atomic_and_survives_crashes() {
    let _serial = crate::serial();
    let yaml = format!(
        "name: state\ntimeout: 5s\nstate: {{ entries: 4, value_size: 64 }}\nfunctions:\n\
         {} }}, instances: 3, concurrency: 2, state: true }}\n\
         {} }}, state: true }}\n\
         routes:\n  - http: POST /count\n    sequence: [count]\n\
         \x20 - http: POST /peek\n    sequence: [peek]\n",
        graphfn("count", "count", ""),
        graphfn("peek", "peek", ""),
    );
    let rt = runtime();
    let chain = start(&rt, &yaml, "ring");
    let count = format!("{}/count", chain.url());
    let peek = format!("{}/peek", chain.url());

    // Increments from many clients through three instances lose nothing.
    let workers: Vec<_> = (0..4)
        .map(|_| {
            let count = count.clone();
            std::thread::spawn(move || {
                let agent = client();
                for _ in 0..50 {
                    let a = post(&agent, &count, "hits");
                    assert_eq!(a.status, 200, "{a:?}");
                }
            })
        })
        .collect();
    for w in workers {
        w.join().expect("every increment answered");
    }
    let agent = client();
    assert_eq!(post(&agent, &peek, "hits").body, "200");

    // A writer killed in the middle of an update (holding the key's lock): the request gets
    // 502, the update never happened, and the next writer takes the lock over.
    let a = post(&agent, &count, "die");
    assert_eq!(a.status, 502, "{a:?}");
    let a = post(&agent, &count, "hits");
    assert_eq!((a.status, a.body.as_str()), (200, "201"));
    assert_eq!(post(&agent, &peek, "die").body, "none");

    // The store outlives every instance: kill them all, the count is still there.
    let parties = chain.parties_of("count");
    assert!(wait_until(Duration::from_secs(10), || parties
        .iter()
        .all(|&p| chain.instance_pid(p).is_some())));
    for &p in &parties {
        zerohop_test_support::signal_pid(chain.instance_pid(p).expect("running"), Signal::SIGKILL);
    }
    assert!(wait_until(Duration::from_secs(10), || {
        post(&agent, &count, "hits").body == "202"
    }));

    // A full store is a clear error (entries: 4; "hits" is one).
    for k in ["a", "b", "c"] {
        assert_eq!(post(&agent, &count, k).status, 200);
    }
    let a = post(&agent, &count, "d");
    assert_eq!(a.status, 507, "{a:?}");
    assert!(a.body.contains("the state store is full"), "{}", a.body);
    assert_eq!(chain.state().expect("a store").len(), 4);

    assert!(
        no_slot_held(&chain),
        "slots left: {}",
        chain.pools().in_use()
    );
    rt.block_on(chain.shutdown());
}
