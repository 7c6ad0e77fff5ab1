//! The sockmap transport end to end, as root: the kernel refuses an edge the chain does not
//! declare (and the request is answered), its counters equal the requests sent, nothing of
//! ours stays loaded after a shutdown or after the agent is killed, and without the
//! privileges the chain is refused in one line. The other end-to-end suites run over
//! sockmap too (http, graph, supervision, chaos).
//!
//! The tests look at every BPF program and map on the machine, so they take turns.

mod common;

use std::process::Command;
use std::sync::Mutex;
use std::time::Duration;

use common::daemon::Daemon;
use common::{client, func, post};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::Value;
use zerohop_test_support::{target_bin, wait_until, ChainProcess};

static SERIAL: Mutex<()> = Mutex::new(());

/// Ids of the loaded BPF programs and maps that are ours (named `zh_*`).
fn ours() -> (Vec<u32>, Vec<u32>) {
    let named = |n: Option<&str>| n.is_some_and(|n| n.starts_with("zh_"));
    let progs = aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .filter(|p| named(p.name_as_str()))
        .map(|p| p.id())
        .collect();
    let maps = aya::maps::loaded_maps()
        .filter_map(Result::ok)
        .filter(|m| named(m.name_as_str()))
        .map(|m| m.id())
        .collect();
    (progs, maps)
}

/// Waits (at most 10 s: the kernel frees them after an RCU grace period) until none of
/// `ids` is loaded any more.
fn gone(ids: &(Vec<u32>, Vec<u32>)) -> bool {
    wait_until(Duration::from_secs(10), || {
        let now = ours();
        !ids.0.iter().any(|i| now.0.contains(i)) && !ids.1.iter().any(|i| now.1.contains(i))
    })
}

fn hello_spec() -> String {
    format!(
        "name: hello\ntimeout: 5s\nfunctions:\n{}{}routes:\n  - http: POST /hello\n    sequence: [upper, exclaim]\n",
        func("upper", "upper", "", ""),
        func("exclaim", "exclaim", "", ""),
    )
}

#[test]
fn an_undeclared_edge_is_refused_in_the_kernel_counted_and_answered() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let daemon = Daemon::start();
    // `forger` may send only to `exclaim`; it sends its request to `upper` (function 1,
    // party 2: the gateway thread is party 0, forger 1) past the SDK, straight to its socket.
    let spec = format!(
        "name: policy\ntransport: sockmap\ntimeout: 5s\nfunctions:\n  forger: {{ command: [\"{}\"], env: {{ HOSTILE_MODE: forge, HOSTILE_TARGET_FN: 1, HOSTILE_TARGET_PARTY: 2 }} }}\n{}{}routes:\n  - http: POST /forge\n    sequence: [forger, exclaim]\n  - http: POST /hello\n    sequence: [upper, exclaim]\n",
        target_bin("zerohop-hostile").display(),
        func("upper", "upper", "", ""),
        func("exclaim", "exclaim", "", ""),
    );
    let applied = daemon.apply("policy", &spec);
    let url = applied["status"]["listeners"][0]
        .as_str()
        .expect("an http listener")
        .to_owned();
    let names: Vec<&str> = applied["status"]["functions"]
        .as_array()
        .expect("functions")
        .iter()
        .map(|f| f["name"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(names, ["forger", "upper", "exclaim"], "function indices");

    const FORGED: u64 = 5;
    const HELLOS: u64 = 200;
    let agent = client();
    // Legitimate traffic alongside, on its own connection.
    let hello_url = format!("{url}/hello");
    let legit = std::thread::spawn(move || {
        let agent = client();
        (0..HELLOS)
            .map(|i| {
                let a = post(&agent, &hello_url, &format!("hello {i}"));
                (a.status, a.body) == (200, format!("HELLO {i}!"))
            })
            .filter(|ok| *ok)
            .count() as u64
    });
    for i in 0..FORGED {
        let a = post(&agent, &format!("{url}/forge"), &format!("forged {i}"));
        assert_eq!(a.status, 403, "the forged hop is answered 403: {a:?}");
        assert!(
            a.body
                .contains("\"forger\" sent this request to function \"upper\"")
                && a.body
                    .contains("declares no such edge; the kernel refused it"),
            "a clear error: {}",
            a.body
        );
    }
    assert_eq!(legit.join().expect("legit client"), HELLOS, "legit traffic");

    let status = daemon.status("policy");
    let kernel = |f: usize| status["functions"][f]["kernel"].clone();
    let dropped = |k: &Value, why: &str| k["dropped"][why].as_u64().unwrap_or(u64::MAX);
    let (forger, upper, exclaim) = (kernel(0), kernel(1), kernel(2));
    assert_eq!(dropped(&forger, "edge_not_declared"), FORGED, "{forger}");
    assert_eq!(forger["received"], FORGED, "{forger}");
    assert_eq!(
        upper["received"], HELLOS,
        "upper saw no forged hop: {upper}"
    );
    assert_eq!(upper["sent"], HELLOS, "{upper}");
    for k in [&upper, &exclaim] {
        let total: u64 = k["dropped"]
            .as_object()
            .expect("reasons")
            .values()
            .map(|v| v.as_u64().unwrap_or(u64::MAX))
            .sum();
        assert_eq!(total, 0, "nothing else dropped: {k}");
    }
    // Every hello went gateway -> upper -> exclaim -> gateway: the counts equal the requests.
    let gateway = &status["gateway"]["kernel"];
    assert_eq!(gateway["sent"], HELLOS + FORGED, "{gateway}");
    assert_eq!(exclaim["sent"], HELLOS, "{exclaim}");
    // The answers, and whatever the forger's runtime sends after its slot was taken back
    // (dropped by the gateway); a refusal returned to the gateway is counted as a drop.
    let answers = gateway["received"].as_u64().unwrap_or(0);
    assert!((HELLOS..=HELLOS + FORGED).contains(&answers), "{gateway}");

    // The same counts on the metrics page.
    let page = client()
        .get(daemon.metrics())
        .call()
        .expect("metrics page")
        .into_string()
        .expect("text");
    let want = format!(
        "zerohop_function_kernel_drops_total{{chain=\"policy\",function=\"forger\",reason=\"edge_not_declared\"}} {FORGED}"
    );
    let want_in = format!(
        "zerohop_function_kernel_descriptors_total{{chain=\"policy\",function=\"upper\",direction=\"in\"}} {HELLOS}"
    );
    for w in [want, want_in] {
        assert!(page.lines().any(|l| l == w), "{w} in the metrics:\n{page}");
    }
    daemon.stop_cleanly();
}

#[test]
fn nothing_stays_loaded_after_a_shutdown_or_after_the_agent_is_killed() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let before = ours();
    let up = || {
        let chain = ChainProcess::start(&hello_spec(), &["--transport", "sockmap"]);
        let a = post(&client(), &format!("{}/hello", chain.url), "hi");
        assert_eq!((a.status, a.body.as_str()), (200, "HI!"));
        let now = ours();
        let mine: (Vec<u32>, Vec<u32>) = (
            now.0
                .into_iter()
                .filter(|i| !before.0.contains(i))
                .collect(),
            now.1
                .into_iter()
                .filter(|i| !before.1.contains(i))
                .collect(),
        );
        (chain, mine)
    };

    let (chain, mine) = up();
    assert_eq!(
        (mine.0.len(), mine.1.len()),
        (1, 8),
        "one verdict program and its 8 maps while the chain runs: {mine:?}"
    );
    assert_eq!(chain.stop(), Some(0), "clean exit");
    assert!(
        gone(&mine),
        "left loaded after a shutdown: {mine:?}, now {:?}",
        ours()
    );

    let (chain, mine) = up();
    kill(Pid::from_raw(chain.pid() as i32), Signal::SIGKILL).expect("kill -9 the agent");
    assert!(
        gone(&mine),
        "left loaded after kill -9 of the agent: {mine:?}, now {:?}",
        ours()
    );
    drop(chain);
    // A new chain comes up and loads its own.
    let (chain, again) = up();
    assert_eq!((again.0.len(), again.1.len()), (1, 8), "{again:?}");
    assert!(
        again.0.iter().all(|i| !mine.0.contains(i)),
        "new program ids"
    );
    assert_eq!(chain.stop(), Some(0), "clean exit");
    assert!(gone(&again), "left loaded: {again:?}, now {:?}", ours());
}

#[test]
fn without_bpf_privileges_the_chain_is_refused_in_one_line() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = zerohop_test_support::TempDir::new("sockmap-caps");
    let file = dir.path().join("chain.yaml");
    std::fs::write(
        &file,
        hello_spec().replace("timeout: 5s", "timeout: 5s\ntransport: sockmap"),
    )
    .expect("write spec");
    // Root without CAP_BPF, CAP_SYS_ADMIN, CAP_NET_ADMIN and CAP_PERFMON in the bounding set:
    // the agent runs without them.
    let out = Command::new("setpriv")
        .args([
            "--bounding-set",
            "-bpf,-sys_admin,-net_admin,-perfmon",
            "--",
        ])
        .arg(target_bin("zerohop"))
        .arg("up")
        .arg(&file)
        .args(["--listen", "127.0.0.1:0"])
        .output()
        .expect("run setpriv (util-linux)");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "refused: {stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one line: {stderr}");
    assert!(
        lines[0].contains("the sockmap transport cannot run here")
            && lines[0].contains("needs CAP_BPF and CAP_NET_ADMIN")
            && lines[0].contains("use `transport: ring`"),
        "names what is missing and the way out: {stderr}"
    );
}
