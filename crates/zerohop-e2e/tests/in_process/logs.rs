//! The agent's log book with real instances: what they print lands in it, per function,
//! instance and stream, in order; followers see it live; a flooding function neither
//! stalls the chain nor grows the book past its bounds; and nothing of it outlives the
//! chain. The agent runs in this process (the tests read its log book, descriptors and
//! tasks), the functions are `zerohop-chatty`.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::common::{client, post, runtime};
use zerohop_agent::logs::{LogLine, Stream, DEFAULT_CAPACITY};
use zerohop_agent::{spec, up, Running, UpOptions};
use zerohop_test_support::{children, open_fds, target_bin, wait_until};

/// A spec entry running `zerohop-chatty` as `name` with extra fields. `RUST_LOG=off`: the
/// SDK's own log lines would upset the exact line counts here.
fn chatty(name: &str, fields: &str) -> String {
    format!(
        "  {name}: {{ command: [\"{}\"], env: {{ RUST_LOG: \"off\" }}{fields} }}\n",
        target_bin("zerohop-chatty").display()
    )
}

/// A chain with functions `quiet` and `loud`, each on its own route.
fn start(rt: &tokio::runtime::Runtime, quiet: &str, loud: &str) -> Running {
    let yaml = format!(
        "name: talk\nfunctions:\n{}{}routes:\n  - http: POST /quiet\n    sequence: [quiet]\n  - http: POST /loud\n    sequence: [loud]\n",
        chatty("quiet", quiet),
        chatty("loud", loud),
    );
    let spec = spec::parse(Path::new("test.yaml"), &yaml).expect("valid spec");
    let opts = UpOptions {
        listen: "127.0.0.1:0".parse().unwrap(),
        // The lines are checked in the book; echoing a flood would only fill the test's
        // output.
        echo_logs: false,
        ..UpOptions::default()
    };
    rt.block_on(up(spec, opts)).expect("chain up")
}

/// The texts of `function`'s stored lines from `stream`.
fn texts(chain: &Running, function: &str, stream: Stream) -> Vec<String> {
    chain
        .logs()
        .snapshot(Some(function), usize::MAX)
        .into_iter()
        .filter(|l| l.stream == stream)
        .map(|l| l.text)
        .collect()
}

#[test]
fn printed_lines_land_in_the_book_by_function_instance_and_stream_in_order() {
    let _serial = crate::serial();
    let rt = runtime();
    let chain = start(&rt, "", "");
    let (quiet, loud) = (chain.parties_of("quiet")[0], chain.parties_of("loud")[0]);
    let agent = client();
    for i in 0..50 {
        let a = post(&agent, &format!("{}/quiet", chain.url()), &format!("q{i}"));
        assert_eq!((a.status, a.body.as_str()), (200, "ok"));
    }
    let a = post(&agent, &format!("{}/loud", chain.url()), "hello there");
    assert_eq!(a.status, 200);
    let logs = chain.logs();
    assert!(
        wait_until(Duration::from_secs(10), || {
            logs.stats("quiet").expect("quiet").kept == 100
                && logs.stats("loud").expect("loud").kept == 2
        }),
        "every line arrived: quiet {:?}, loud {:?}",
        logs.stats("quiet"),
        logs.stats("loud")
    );
    let want = |prefix: &str| {
        (0..50)
            .map(|i| format!("{prefix} q{i}"))
            .collect::<Vec<_>>()
    };
    assert_eq!(texts(&chain, "quiet", Stream::Stdout), want("out"));
    assert_eq!(texts(&chain, "quiet", Stream::Stderr), want("err"));
    assert_eq!(texts(&chain, "loud", Stream::Stdout), ["out hello there"]);
    assert_eq!(texts(&chain, "loud", Stream::Stderr), ["err hello there"]);
    let all = logs.snapshot(None, usize::MAX);
    assert_eq!(all.len(), 102);
    for l in &all {
        assert_eq!(&*l.chain, "talk");
        let party = if &*l.function == "quiet" { quiet } else { loud };
        assert_eq!(l.instance, party, "{l:?}");
        assert!(!l.cut);
    }
    assert!(
        all.windows(2).all(|w| w[0].seq < w[1].seq),
        "merged in order"
    );
    // The last n, also across functions.
    let last = logs.snapshot(None, 3);
    assert_eq!(last, all[99..].to_vec());
    let stats = logs.stats("quiet").expect("quiet");
    assert_eq!((stats.evicted, stats.dropped, stats.cut), (0, 0, 0));
    // "out qN\n" and "err qN\n" for N in 0..50.
    let bytes: usize = (0..50).map(|i| 2 * format!("out q{i}\n").len()).sum();
    assert_eq!(stats.bytes, bytes as u64);
    assert_eq!(logs.stats("nobody"), None);
    // Shown as RFC 3339 in UTC with milliseconds. (The two streams are read by two
    // readers: which of "out q0" and "err q0" was stored first is not fixed.)
    let shown = all
        .iter()
        .find(|l| l.stream == Stream::Stdout)
        .expect("a stdout line")
        .to_string();
    assert!(
        shown.ends_with(&format!(" quiet/{quiet} stdout out q0")),
        "{shown}"
    );
    assert_eq!(shown.find('T'), Some(10), "{shown}");
    assert_eq!(shown.find("Z "), Some(23), "{shown}");
    drop(agent);
    rt.block_on(chain.shutdown());
}

#[test]
fn a_follower_receives_lines_as_they_are_printed() {
    let _serial = crate::serial();
    let rt = runtime();
    let chain = start(&rt, "", "");
    let mut follower = chain.logs().follow();
    let agent = client();
    let url = format!("{}/quiet", chain.url());
    for i in 0..3 {
        let body = format!("live {i}");
        assert_eq!(post(&agent, &url, &body).status, 200);
        // Both lines of this request arrive before the next one is sent.
        let mut got: Vec<(Stream, String)> = Vec::new();
        while got.len() < 2 {
            let line: std::sync::Arc<LogLine> = rt
                .block_on(async {
                    tokio::time::timeout(Duration::from_secs(10), follower.recv()).await
                })
                .expect("a line within 10 s")
                .expect("no line skipped");
            assert_eq!(&*line.function, "quiet");
            got.push((line.stream, line.text.clone()));
        }
        got.sort_by_key(|(s, _)| *s == Stream::Stderr);
        assert_eq!(
            got,
            [
                (Stream::Stdout, format!("out {body}")),
                (Stream::Stderr, format!("err {body}"))
            ]
        );
    }
    drop(agent);
    rt.block_on(chain.shutdown());
}

#[test]
fn a_flooding_function_neither_stalls_the_chain_nor_outgrows_its_bounds() {
    let _serial = crate::serial();
    let rt = runtime();
    let chain = start(&rt, "", "");
    let agent = client();
    let url = chain.url();
    let flood_ms = 3000;
    let a = post(&agent, &format!("{url}/loud"), &format!("flood {flood_ms}"));
    assert_eq!((a.status, a.body.as_str()), (200, "flooding"));
    let logs = chain.logs();
    let loud_bytes = || logs.stats("loud").expect("loud").bytes;
    let report = || {
        texts(&chain, "loud", Stream::Stderr)
            .into_iter()
            .find(|t| t.starts_with("flood wrote "))
    };
    // Until the flooder reports how many lines it wrote (1.5 s after the flood, in a fresh
    // rate window), the other function answers every request; some of them while the
    // flood's bytes kept coming in.
    let (mut answered, mut while_flooding) = (0u64, 0u64);
    let mut seen = loud_bytes();
    let deadline = Instant::now() + Duration::from_secs(30);
    let report = loop {
        if let Some(r) = report() {
            break r;
        }
        assert!(
            Instant::now() < deadline,
            "the flooder did not report within 30 s: {:?}",
            logs.stats("loud")
        );
        let a = post(
            &agent,
            &format!("{url}/quiet"),
            &format!("during {answered}"),
        );
        assert_eq!(
            (a.status, a.body.as_str()),
            (200, "ok"),
            "request {answered}"
        );
        answered += 1;
        let now = loud_bytes();
        if now > seen {
            while_flooding += 1;
        }
        seen = now;
    };
    assert!(
        answered > 0 && while_flooding > 0,
        "{answered} answered, {while_flooding} while the flood came in"
    );
    let written: u64 = report
        .split_whitespace()
        .nth(2)
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("a count in {report:?}"));
    eprintln!(
        "{report}; quiet answered {answered} requests meanwhile ({while_flooding} while flooded)"
    );
    // Every line is accounted for once the last is read: the request's two, the flood,
    // the report.
    assert!(
        wait_until(Duration::from_secs(10), || {
            let s = logs.stats("loud").expect("loud");
            s.kept + s.evicted + s.dropped == written + 3
        }),
        "{written} + 3 lines: {:?}",
        logs.stats("loud")
    );
    let s = logs.stats("loud").expect("loud");
    assert!(
        s.dropped > 0 && s.evicted > 0,
        "over budget and over capacity: {s:?}"
    );
    assert_eq!(
        s.kept, DEFAULT_CAPACITY as u64,
        "the ring is full, not more: {s:?}"
    );
    assert_eq!(
        logs.snapshot(Some("loud"), usize::MAX).len(),
        DEFAULT_CAPACITY
    );
    // The quiet function's lines are all there, none dropped for the flood next door.
    assert!(
        wait_until(Duration::from_secs(10), || {
            let q = logs.stats("quiet").expect("quiet");
            q.kept + q.evicted == 2 * answered
        }),
        "{answered} requests' lines: {:?}",
        logs.stats("quiet")
    );
    assert_eq!(logs.stats("quiet").expect("quiet").dropped, 0);
    assert_eq!(
        texts(&chain, "quiet", Stream::Stdout).last(),
        Some(&format!("out during {}", answered - 1))
    );
    drop(agent);
    rt.block_on(chain.shutdown());
}

#[test]
fn no_reader_or_descriptor_outlives_the_chain() {
    let _serial = crate::serial();
    let rt = runtime();
    let me = std::process::id();
    // Baselines once the runtime exists (its epoll and eventfd stay).
    let fds_before = open_fds(me);
    let tasks_before = rt.metrics().num_alive_tasks();
    let chain = start(&rt, ", instances: 2", "");
    assert_eq!(chain.logs().readers(), 6, "two pipes per instance");
    let agent = client();
    let url = chain.url();
    assert_eq!(
        post(&agent, &format!("{url}/loud"), "flood 1000").status,
        200
    );
    // A killed instance's readers end at end of file; its successor gets new ones.
    let victim_party = chain.parties_of("quiet")[0];
    let victim = chain.instance_pid(victim_party).expect("quiet runs");
    let killed = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(victim as i32),
        nix::sys::signal::Signal::SIGKILL,
    );
    assert!(killed.is_ok(), "kill -9 {victim}: {killed:?}");
    assert!(
        wait_until(Duration::from_secs(15), || chain.restarts(victim_party)
            == 1
            && chain
                .instance_pid(victim_party)
                .is_some_and(|p| p != victim)),
        "the instance was restarted"
    );
    assert!(
        wait_until(Duration::from_secs(10), || chain.logs().readers() == 6),
        "the dead instance's readers ended: {} running",
        chain.logs().readers()
    );
    for i in 0..10 {
        assert_eq!(
            post(&agent, &format!("{url}/quiet"), &format!("r{i}")).status,
            200
        );
    }
    drop(agent);
    rt.block_on(chain.shutdown());
    assert!(children(me).is_empty(), "children left: {:?}", children(me));
    assert!(
        wait_until(Duration::from_secs(5), || open_fds(me) <= fds_before),
        "fds: {fds_before} before, {} after",
        open_fds(me)
    );
    assert!(
        wait_until(Duration::from_secs(5), || rt.metrics().num_alive_tasks()
            <= tasks_before),
        "tasks: {tasks_before} before, {} after",
        rt.metrics().num_alive_tasks()
    );
    drop(rt);
}
