//! Function graphs: calls, fan-out and fan-in, a failing branch, a call outside the spec's
//! `calls`. The agent runs in this process (so the test reads the pools' owner tables), the
//! functions are real processes (`zerohop-graphfn`).

mod common;

use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use common::{client, post, runtime};
use zerohop_agent::{spec, up, Running, UpOptions};
use zerohop_test_support::{target_bin, wait_until};

/// The tests here start chains with children of this process: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

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
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    for transport in ["ring", "socket"] {
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
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
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
