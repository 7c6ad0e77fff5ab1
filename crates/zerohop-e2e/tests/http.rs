//! The chain as a user runs it: `zerohop up`, a real HTTP client, every answer the gateway
//! promises, and a clean stop.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::{call, client, func, post};
use zerohop_test_support::{
    alive, children, cpu_ticks, instances, memfds, target_bin, wait_until, ChainProcess, TempDir,
};

fn hello_spec(extra_top: &str) -> String {
    format!(
        "name: hello\n{extra_top}functions:\n  upper: {{ command: [\"{}\"] }}\n  exclaim: {{ command: [\"{}\"] }}\nroutes:\n  - http: POST /hello\n    sequence: [upper, exclaim]\n",
        target_bin("upper").display(),
        target_bin("exclaim").display()
    )
}

/// Runs `zerohop SUB FILE` (`up` on a free port) on `spec` written to a scratch file, to
/// completion: exit code, stderr, and the file's path as the messages name it.
fn zerohop_on(sub: &str, spec: &str) -> (Option<i32>, String, String) {
    let dir = TempDir::new("spec");
    let file = dir.path().join("c.yaml");
    std::fs::write(&file, spec).unwrap();
    let mut cmd = Command::new(target_bin("zerohop"));
    cmd.arg(sub).arg(&file);
    if sub == "up" {
        cmd.args(["--listen", "127.0.0.1:0"]);
    }
    let out = cmd.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    (out.status.code(), err, file.display().to_string())
}

#[test]
fn example_hello_chain_answers_from_its_own_spec() {
    // The spec shipped in examples/hello, with its relative program paths.
    let spec = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/hello/chain.yaml");
    let chain = ChainProcess::start_file(&spec, &[], TempDir::new("example"));
    assert!(chain
        .ready_line
        .contains("chain 'hello' ready at http://127.0.0.1:"));
    let agent = client();
    let a = post(&agent, &format!("{}/hello", chain.url), "hello world");
    assert_eq!((a.status, a.body.as_str()), (200, "HELLO WORLD!"));
    assert_eq!(chain.stop(), Some(0));
}

#[test]
fn hello_over_every_transport_with_keep_alive() {
    for transport in ["ring", "socket", "poll", "sockmap"] {
        let chain = ChainProcess::start(&hello_spec(""), &["--transport", transport]);
        assert!(chain.ready_line.contains(&format!("transport {transport}")));
        let agent = client();
        let url = format!("{}/hello", chain.url);
        for i in 0..200 {
            let body = format!("hello {i}");
            let a = post(&agent, &url, &body);
            assert_eq!(a.status, 200, "{transport}: {a:?}");
            assert_eq!(a.body, format!("HELLO {i}!"), "{transport}");
        }
        // Empty body and a body of many KiB.
        assert_eq!(post(&agent, &url, "").body, "!");
        let big = "x".repeat(60_000);
        assert_eq!(
            post(&agent, &url, &big).body,
            format!("{}!", big.to_uppercase())
        );
        assert_eq!(chain.stop(), Some(0), "{transport}: clean exit");
    }
}

/// A route may visit a function twice in a row: with one instance, that instance sends the
/// request to itself. Every transport answers both routes, every time.
#[test]
fn a_function_that_follows_itself_answers_on_every_transport() {
    let spec = format!(
        "name: twice\nfunctions:\n  upper: {{ command: [\"{}\"] }}\n  exclaim: {{ command: [\"{}\"] }}\nroutes:\n  - http: POST /twice\n    sequence: [upper, upper]\n  - http: POST /mixed\n    sequence: [upper, exclaim, upper, upper]\n",
        target_bin("upper").display(),
        target_bin("exclaim").display()
    );
    for transport in ["ring", "socket", "poll", "sockmap"] {
        let chain = ChainProcess::start(&spec, &["--transport", transport]);
        let agent = client();
        for i in 0..50 {
            let a = post(
                &agent,
                &format!("{}/twice", chain.url),
                &format!("self {i}"),
            );
            assert_eq!(
                (a.status, a.body.as_str()),
                (200, format!("SELF {i}").as_str()),
                "{transport}: [upper, upper]"
            );
            let a = post(&agent, &format!("{}/mixed", chain.url), &format!("mix {i}"));
            assert_eq!(
                (a.status, a.body.as_str()),
                (200, format!("MIX {i}!").as_str()),
                "{transport}: [upper, exclaim, upper, upper]"
            );
        }
        assert_eq!(chain.stop(), Some(0), "{transport}: clean exit");
    }
}

#[test]
fn routing_errors_are_404_and_405() {
    let chain = ChainProcess::start(&hello_spec(""), &[]);
    let agent = client();
    let a = post(&agent, &format!("{}/nope", chain.url), "x");
    assert_eq!(a.status, 404);
    assert_eq!(a.body, "gateway: no route for POST /nope\n");
    let a = call(&agent, "GET", &format!("{}/hello", chain.url), b"");
    assert_eq!(a.status, 405);
    assert_eq!(a.allow.as_deref(), Some("POST"));
    assert_eq!(
        a.body,
        "gateway: /hello does not accept GET; allowed: POST\n"
    );
    assert_eq!(chain.stop(), Some(0));
}

#[test]
fn malformed_request_gets_400_and_chain_keeps_working() {
    let chain = ChainProcess::start(&hello_spec(""), &[]);
    let addr = chain.url.trim_start_matches("http://").to_owned();
    let mut s = TcpStream::connect(&addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"THIS IS NOT HTTP\r\n\r\n").unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    assert!(out.starts_with("HTTP/1.1 400"), "got {out:?}");
    // A bad Content-Length value.
    let mut s = TcpStream::connect(&addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"POST /hello HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n")
        .unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    assert!(out.starts_with("HTTP/1.1 400"), "got {out:?}");
    let a = post(&client(), &format!("{}/hello", chain.url), "still fine");
    assert_eq!((a.status, a.body.as_str()), (200, "STILL FINE!"));
    assert_eq!(chain.stop(), Some(0));
}

#[test]
fn body_over_limit_gets_413() {
    let chain = ChainProcess::start(&hello_spec("max_body: 1KiB\n"), &[]);
    let agent = client();
    let url = format!("{}/hello", chain.url);
    let a = post(&agent, &url, &"y".repeat(1025));
    assert_eq!(a.status, 413);
    assert_eq!(
        a.body,
        "gateway: request body exceeds the chain's limit of 1024 bytes (max_body)\n"
    );
    assert_eq!(post(&agent, &url, &"y".repeat(1024)).status, 200);
    assert_eq!(chain.stop(), Some(0));
}

#[test]
fn function_errors_pass_through_with_their_status() {
    let spec = format!(
        "name: errs\nfunctions:\n{}{}{}routes:\n  - http: POST /fail\n    sequence: [refuse]\n  - http: POST /panic\n    sequence: [boom]\n  - http: POST /hdr\n    sequence: [hdr]\n",
        func("refuse", "fail", "", ""),
        func("boom", "panic", "", ""),
        func("hdr", "header", "", ", headers: [X-Test]"),
    );
    let chain = ChainProcess::start(&spec, &[]);
    let agent = client();
    let a = post(&agent, &format!("{}/fail", chain.url), "abc");
    assert_eq!(a.status, 422);
    assert_eq!(a.body, "function 'refuse': refusing \"abc\"\n");
    let a = post(&agent, &format!("{}/panic", chain.url), "abc");
    assert_eq!(a.status, 500);
    assert_eq!(a.body, "function 'boom': handler panicked: boom\n");
    // The panicking instance keeps serving.
    assert_eq!(
        post(&agent, &format!("{}/panic", chain.url), "x").status,
        500
    );
    let r = agent
        .post(&format!("{}/hdr", chain.url))
        .set("X-Test", "zero-copy")
        .send_string("ignored")
        .expect("200");
    assert_eq!(r.into_string().unwrap(), "zero-copy");
    assert_eq!(chain.stop(), Some(0));
}

#[test]
fn crash_gets_502_slow_chain_gets_504_full_pool_gets_503() {
    let spec = format!(
        "name: faults\ntimeout: 1s\npool: {{ slots: 2, slot_size: 4KiB }}\nfunctions:\n{}{}routes:\n  - http: POST /crash\n    sequence: [dies]\n  - http: POST /slow\n    sequence: [sleepy]\n",
        func("dies", "abort", "", ""),
        // Each request is held for a minute: its slot stays taken as long as the test needs.
        func("sleepy", "slow", "DELAY_MS: 60000, ANNOUNCE: 1", ", concurrency: 4"),
    );
    let chain = ChainProcess::start_watched(&spec, &[]);
    let agent = client();
    let a = post(&agent, &format!("{}/crash", chain.url), "x");
    assert_eq!(a.status, 502, "{a:?}");
    // Instances are numbered after the gateway's threads (one per core by default).
    assert!(
        a.body.starts_with("function 'dies': instance ")
            && a.body.contains(" was killed by signal 6"),
        "{a:?}"
    );
    let a = post(&agent, &format!("{}/slow", chain.url), "x");
    assert_eq!(a.status, 504);
    assert_eq!(a.body, "gateway: chain 'faults' did not answer within 1s\n");
    // Two slots: the sleeper still holds the first one, one more fits (the handler says it
    // holds that one too), the third request finds the pool empty.
    let held = Duration::from_secs(30);
    chain.wait_for_output("holding x", held, "the sleeper holding the first request");
    let url = format!("{}/slow", chain.url);
    let t = std::thread::spawn(move || post(&client(), &url, "y").status);
    chain.wait_for_output("holding y", held, "the sleeper holding the second request");
    let a = post(&agent, &format!("{}/slow", chain.url), "z");
    assert_eq!(a.status, 503, "{a:?}");
    assert_eq!(a.retry_after.as_deref(), Some("1"));
    assert!(a
        .body
        .starts_with("gateway: all 2 slots of the pool are in use"));
    assert_eq!(t.join().unwrap(), 504);
    assert_eq!(chain.stop(), Some(0));
}

#[test]
fn stop_leaves_no_process_and_no_memfd() {
    let chain = ChainProcess::start(&hello_spec(""), &["--transport", "socket"]);
    let pid = chain.pid();
    assert_eq!(instances(pid).len(), 2, "one process per instance");
    // The instances and the spawner: none may outlive the agent.
    let kids = children(pid);
    assert_eq!(kids.len(), 3, "{kids:?}");
    assert!(!memfds(pid).is_empty(), "the agent holds the pool memfd");
    assert_eq!(
        post(&client(), &format!("{}/hello", chain.url), "a").status,
        200
    );
    assert_eq!(chain.stop(), Some(0));
    assert!(!alive(pid));
    for k in kids {
        assert!(
            wait_until(Duration::from_secs(5), || !alive(k)),
            "instance {k} outlived the agent"
        );
    }
}

#[test]
fn idle_chain_uses_no_cpu() {
    let chain = ChainProcess::start(&hello_spec(""), &[]);
    // Warm up, then leave it alone.
    assert_eq!(
        post(&client(), &format!("{}/hello", chain.url), "warm").status,
        200
    );
    std::thread::sleep(Duration::from_millis(500));
    let pids: Vec<u32> = std::iter::once(chain.pid())
        .chain(children(chain.pid()))
        .collect();
    assert_eq!(pids.len(), 4, "the agent, its spawner and two instances");
    let total = |pids: &[u32]| -> u64 { pids.iter().filter_map(|&p| cpu_ticks(p)).sum() };
    let before = total(&pids);
    std::thread::sleep(Duration::from_secs(5));
    let used = total(&pids) - before;
    // 1% of one core over 5 s is 5 ticks of 10 ms.
    assert!(used < 5, "idle chain used {used} ticks in 5 s");
    assert_eq!(chain.stop(), Some(0));
}

#[test]
fn spec_errors_name_file_line_and_field_and_exit_2() {
    for sub in ["check", "up"] {
        let (code, err, file) = zerohop_on(
            sub,
            "name: bad\nfunctions:\n  upper: { command: [\"/bin/true\"] }\nroutes:\n  - http: POST /x\n    sequence: [upper, shout]\n",
        );
        assert_eq!(code, Some(2), "{sub}");
        assert!(
            err.contains(&format!(
                "{file}:6: routes[0].sequence[1]: unknown function `shout`"
            )),
            "{sub}: {err}"
        );
    }
    // A program that does not exist is reported against the spec, before anything starts.
    let (code, err, _) = zerohop_on(
        "up",
        "name: bad\nfunctions:\n  upper: { command: [\"./nowhere/upper\"] }\nroutes:\n  - http: POST /x\n    sequence: [upper]\n",
    );
    assert_eq!(code, Some(2));
    assert!(
        err.contains(":3: functions.upper.command: program"),
        "{err}"
    );
}

#[test]
fn instance_that_exits_before_ready_is_reported_and_nothing_stays() {
    let (code, err, _) = zerohop_on(
        "up",
        "name: quitter\nfunctions:\n  quits: { command: [\"/bin/true\"] }\nroutes:\n  - http: POST /x\n    sequence: [quits]\n",
    );
    assert_eq!(code, Some(1));
    assert!(
        err.contains("function 'quits' (instance ")
            && err.contains(") exited (exit status: 0) before it was ready"),
        "{err}"
    );
}

/// Free 2 MiB huge pages on the host.
fn free_hugepages() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("HugePages_Free:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

#[test]
fn hugepages_pool_runs_or_says_what_is_missing() {
    let spec = hello_spec("pool: { slots: 64, slot_size: 64KiB, hugepages: true }\n");
    // 64 x 64 KiB plus the header rounds up to 3 pages of 2 MiB.
    let needed = 3;
    let nr = Path::new("/proc/sys/vm/nr_hugepages");
    let before = std::fs::read_to_string(nr)
        .unwrap()
        .trim()
        .parse::<u64>()
        .unwrap();
    if free_hugepages() >= needed {
        // Someone reserved pages: the chain must run on them.
        let chain = ChainProcess::start(&spec, &[]);
        let a = post(&client(), &format!("{}/hello", chain.url), "huge");
        assert_eq!((a.status, a.body.as_str()), (200, "HUGE!"));
        assert_eq!(chain.stop(), Some(0));
        return;
    }
    // None free: the error says how many are needed and how to reserve them.
    let (code, err, _) = zerohop_on("up", &spec);
    assert_eq!(code, Some(1));
    assert!(
        err.contains(&format!(
            "hugepages: the pool needs {needed} free 2 MiB huge pages"
        )) && err.contains("/proc/sys/vm/nr_hugepages"),
        "{err}"
    );
    // As root, reserve them and run the chain for real; put the setting back afterwards.
    let root = std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"));
    if !root {
        eprintln!("not root: huge pages cannot be reserved, only the error path was checked");
        return;
    }
    struct Restore(u64);
    impl Drop for Restore {
        fn drop(&mut self) {
            let _ = std::fs::write("/proc/sys/vm/nr_hugepages", self.0.to_string());
        }
    }
    let _restore = Restore(before);
    std::fs::write(nr, (before + needed).to_string()).unwrap();
    assert!(
        free_hugepages() >= needed,
        "the kernel did not reserve {needed} huge pages"
    );
    let chain = ChainProcess::start(&spec, &[]);
    let a = post(&client(), &format!("{}/hello", chain.url), "huge");
    assert_eq!((a.status, a.body.as_str()), (200, "HUGE!"));
    assert_eq!(chain.stop(), Some(0));
}

#[test]
fn a_body_slower_than_body_timeout_gets_408() {
    let chain = ChainProcess::start(&hello_spec("body_timeout: 200ms\n"), &[]);
    let addr = chain.url.trim_start_matches("http://").to_owned();
    let mut s = TcpStream::connect(&addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"POST /hello HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nslow")
        .unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    assert!(out.starts_with("HTTP/1.1 408"), "got {out:?}");
    assert!(
        out.contains("did not arrive within 200ms (body_timeout)"),
        "{out:?}"
    );
    let a = post(&client(), &format!("{}/hello", chain.url), "after");
    assert_eq!((a.status, a.body.as_str()), (200, "AFTER!"));
    assert_eq!(chain.stop(), Some(0));
}
