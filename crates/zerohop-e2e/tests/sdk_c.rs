//! The C SDK end to end: C functions (compiled here with the system's `cc` against
//! `target/release/libzerohop.a` and `sdk/c/include/zerohop.h`) in a chain run by the real
//! `zerohop up`, with Rust functions beside them, answered over real HTTP (ureq, and curl
//! where the answer's status and headers are the point).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::curl::curl;
use common::{client, post, testfn};
use std::time::Duration;

use zerohop_test_support::{
    cpu_ticks, instances, ticks_per_second, wait_until, ChainProcess, TempDir,
};

/// Compiles `source` (relative to the repository) into `dir` as a user does, with the
/// flags pkg-config gives for `package` (`zerohop-static`: libzerohop.a linked in;
/// `zerohop`: libzerohop.so at run time) from the SDK `cargo xtask c-sdk` installed in
/// `target/c-sdk`; the program's path.
fn compile(source: &str, dir: &Path, package: &str) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let pkgconfig = root.join("target/c-sdk/lib/pkgconfig");
    assert!(
        pkgconfig.join(format!("{package}.pc")).exists(),
        "{} has no {package}.pc: `cargo xtask c-sdk` (cargo xtask test runs it) installs the C SDK",
        pkgconfig.display()
    );
    let flags = Command::new("pkg-config")
        .args(["--cflags", "--libs", package])
        .env("PKG_CONFIG_PATH", &pkgconfig)
        .output()
        .expect("run pkg-config (Debian: apt-get install pkg-config)");
    assert!(flags.status.success(), "pkg-config {package} failed");
    let flags = String::from_utf8(flags.stdout).expect("UTF-8 flags");
    let out = dir.join(Path::new(source).file_stem().expect("a file name"));
    let status = Command::new("cc")
        .args(["-O2", "-std=c11", "-Wall", "-Wextra", "-Werror"])
        .arg(root.join(source))
        .arg("-o")
        .arg(&out)
        .args(flags.split_whitespace())
        .status()
        .expect("run cc");
    assert!(status.success(), "cc failed on {source}");
    out
}

#[test]
fn c_functions_work_in_place_beside_rust_ones_and_fail_clearly() {
    let dir = TempDir::new("sdk-c");
    // The example linked to the shared library, the test function to the static one.
    let upper = compile("examples/c/upper.c", dir.path(), "zerohop");
    let cfn = compile("sdk/c/tests/cfn.c", dir.path(), "zerohop-static");
    let t = testfn();
    let c_env = |name: &str, mode: &str, env: &str| {
        format!(
            "  {name}: {{ command: [\"{}\"], env: {{ CFN_MODE: {mode}{}{env} }} }}\n",
            cfn.display(),
            if env.is_empty() { "" } else { ", " }
        )
    };
    let c = |name: &str, mode: &str| c_env(name, mode, "");
    let spec = format!(
        "name: sdkc\npool: {{ slots: 64, slot_size: 4KiB, large_slots: 2 }}\nmax_body: 16KiB\n\
         functions:\n\
         \x20 upper: {{ command: [\"{}\"] }}\n\
         \x20 exclaim: {{ command: [\"{t}\"], env: {{ TESTFN_MODE: exclaim }} }}\n{}{}{}{}\
         routes:\n\
         \x20 - http: POST /hello\n    sequence: [upper, exclaim]\n\
         \x20 - http: POST /wrap\n    sequence: [exclaim, wrap]\n\
         \x20 - http: POST /big\n    sequence: [big, exclaim]\n\
         \x20 - http: POST /huge\n    sequence: [huge]\n\
         \x20 - http: POST /no\n    sequence: [no]\n",
        upper.display(),
        c("wrap", "wrap"),
        c_env("big", "grow", "CFN_GROW: \"10000\""),
        c_env("huge", "grow", "CFN_GROW: \"100000\""),
        c("no", "fail"),
    );
    let chain = ChainProcess::start(&spec, &[]);
    let url = chain.url.clone();
    let http = client();
    let r = post(&http, &format!("{url}/hello"), "hello from c");
    assert_eq!((r.status, r.body.as_str()), (200, "HELLO FROM C!"));
    let r = post(&http, &format!("{url}/wrap"), "x");
    assert_eq!((r.status, r.body.as_str()), (200, "<x!>"));
    // Growing past the slot moves the body into a large slot (the C function looks its body
    // up again), and the next function works on it there.
    let r = post(&http, &format!("{url}/big"), "abc");
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body, format!("{}!", "z".repeat(10_000)));
    // Past max_body: a clear error naming what to raise, the function serving on.
    let r = post(&http, &format!("{url}/huge"), "abc");
    assert_eq!(r.status, 500, "{}", r.body);
    assert!(
        r.body
            .starts_with("function 'huge': output of 100000 bytes does not fit: ")
            && r.body.trim_end().ends_with("raise max_body"),
        "{}",
        r.body
    );
    let r = post(&http, &format!("{url}/big"), "again");
    assert_eq!((r.status, r.body.len()), (200, 10_001));
    let r = post(&http, &format!("{url}/no"), "this");
    assert_eq!(
        (r.status, r.body.as_str()),
        (422, "function 'no': refusing this\n")
    );
    for _ in 0..3 {
        let r = post(&http, &format!("{url}/hello"), "again");
        assert_eq!((r.status, r.body.as_str()), (200, "AGAIN!"));
    }
    assert_eq!(chain.stop(), Some(0), "zerohop up exits 0 on SIGTERM");
}

#[test]
fn c_functions_call_join_count_forward_and_read_headers() {
    let dir = TempDir::new("sdk-c");
    let cfn = compile("sdk/c/tests/cfn.c", dir.path(), "zerohop-static");
    let f = |name: &str, mode: &str, extra: &str| {
        format!(
            "  {name}: {{ command: [\"{}\"], env: {{ CFN_MODE: {mode}{extra} }} }}\n",
            cfn.display()
        )
    };
    let spec = format!(
        "name: sdkc2\nstate: {{ entries: 16, value_size: 64 }}\nfunctions:\n\
         {}{}{}{}{}{}{}{}\
         routes:\n\
         \x20 - http: POST /call\n    sequence: [caller]\n\
         \x20 - http: POST /join\n    sequence: [{{ fan_out: [up, wrap], join: join }}]\n\
         \x20 - http: POST /count\n    sequence: [count]\n\
         \x20 - http: POST /hdr\n    sequence: [hdr]\n\
         \x20 - http: PUT /route/here\n    sequence: [route]\n\
         \x20 - http: POST /fwd\n    sequence: [fwd]\n",
        f("caller", "call", ", CFN_CALLS: \"up,wrap,no\"")
            .replace(" }\n", ", calls: [up, wrap, no] }\n"),
        f("up", "upper", ""),
        f("wrap", "wrap", ""),
        f("no", "fail", ""),
        f("join", "join", ""),
        f("count", "count", "").replace(" }\n", ", state: true }\n"),
        f("hdr", "header", "").replace(" }\n", ", headers: [X-Test] }\n"),
        f("route", "route", "")
            + &f("fwd", "forward", ", CFN_TARGET: up").replace(" }\n", ", next: [up] }\n"),
    );
    let chain = ChainProcess::start(&spec, &[]);
    let url = chain.url.clone();
    let http = client();
    let r = post(&http, &format!("{url}/call"), "ab");
    assert_eq!(
        (r.status, r.body.as_str()),
        (
            200,
            "up=AB;wrap=<ab>;no!422:call to `no` failed with 422: function 'no': refusing ab;"
        )
    );
    let r = post(&http, &format!("{url}/join"), "cd");
    assert_eq!((r.status, r.body.as_str()), (200, "0=CD;1=<cd>;"));
    for n in 1..=3 {
        let r = post(&http, &format!("{url}/count"), "visits");
        assert_eq!((r.status, r.body), (200, n.to_string()));
    }
    let r = http
        .post(&format!("{url}/hdr"))
        .set("X-Test", "from the client")
        .send_string("");
    let r = r.expect("200").into_string().expect("a body");
    assert_eq!(r, "from the client");
    let r = post(&http, &format!("{url}/hdr"), "");
    assert_eq!((r.status, r.body.as_str()), (200, "<none>"));
    let r = http
        .put(&format!("{url}/route/here"))
        .send_string("")
        .expect("200")
        .into_string()
        .expect("a body");
    assert_eq!(r, "PUT /route/here route id>0");
    let r = post(&http, &format!("{url}/fwd"), "forwarded");
    assert_eq!((r.status, r.body.as_str()), (200, "FORWARDED"));
    assert_eq!(chain.stop(), Some(0));
}

#[test]
fn a_c_function_reads_parameters_query_and_cookies_and_answers_303_with_headers() {
    let dir = TempDir::new("sdk-c");
    let cfn = compile("sdk/c/tests/cfn.c", dir.path(), "zerohop-static");
    let spec = format!(
        "name: sdkc4\nfunctions:\n  item: {{ command: [\"{}\"], env: {{ CFN_MODE: item }}, \
         headers: [\":path\", \":query\", cookie] }}\nroutes:\n  - http: GET /item/{{id}}\n    \
         sequence: [item]\n",
        cfn.display()
    );
    let chain = ChainProcess::start(&spec, &[]);
    let a = curl(&[
        "-b",
        "other=x; session=s-1",
        &format!("{}/item/42?q=caf%C3%A9+au+lait&n=1", chain.url),
    ]);
    assert_eq!(
        (a.status, a.body.as_str()),
        (
            303,
            "path=/item/42 route=/item/{id} id=42 query=q=caf%C3%A9+au+lait&n=1 \
             q=café au lait session=s-1 refused=500:`Content-Length` is set by the gateway, \
             not by functions status404=500"
        )
    );
    assert_eq!(a.header("location"), ["/item/42/done"]);
    assert_eq!(a.header("set-cookie"), ["seen=42; Path=/"]);
    // Without a query or cookies: absent, not empty; the parameter is there all the same.
    let a = curl(&[&format!("{}/item/7", chain.url)]);
    assert_eq!(a.status, 303, "{}", a.body);
    assert!(
        a.body
            .starts_with("path=/item/7 route=/item/{id} id=7 query=- q=- session=- "),
        "{}",
        a.body
    );
    assert_eq!(chain.stop(), Some(0));
}

#[test]
fn an_idle_c_instance_uses_no_cpu_and_a_killed_one_is_answered_and_restarted() {
    let dir = TempDir::new("sdk-c");
    let cfn = compile("sdk/c/tests/cfn.c", dir.path(), "zerohop-static");
    let spec = format!(
        "name: sdkc3\ntimeout: 10s\nfunctions:\n  slow: {{ command: [\"{}\"], env: {{ CFN_MODE: \
         sleep }} }}\nroutes:\n  - http: POST /slow\n    sequence: [slow]\n",
        cfn.display()
    );
    let chain = ChainProcess::start_watched(&spec, &[]);
    let url = chain.url.clone();
    let pids = instances(chain.pid());
    assert_eq!(pids.len(), 1, "one instance: {pids:?}");
    let pid = pids[0];
    // Idle: a second of no requests costs the C instance (nearly) no CPU.
    let before = cpu_ticks(pid).expect("the instance runs");
    std::thread::sleep(Duration::from_secs(2));
    let used = cpu_ticks(pid).expect("the instance runs") - before;
    assert!(
        used as f64 <= 0.01 * 2.0 * ticks_per_second() + 1.0,
        "an idle C instance used {used} ticks in 2 s"
    );
    // Killed in the middle of a request: answered 502, restarted, serving again. The
    // function says when it holds the request (and holds it a minute: only the kill ends
    // it within the chain's timeout).
    let slow = format!("{url}/slow");
    let waiting = std::thread::spawn(move || post(&client(), &slow, "hold"));
    chain.wait_for_output(
        "cfn: holding hold",
        Duration::from_secs(30),
        "the C instance holding the request",
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill the instance");
    let r = waiting.join().expect("the client thread");
    assert_eq!(r.status, 502, "{}", r.body);
    let restarted = wait_until(Duration::from_secs(10), || {
        instances(chain.pid()).iter().any(|&p| p != pid)
    });
    assert!(restarted, "a new instance replaces the killed one");
    let r = post(&client(), &format!("{url}/slow"), "again");
    assert_eq!((r.status, r.body.as_str()), (200, "AGAIN"));
    assert_eq!(chain.stop(), Some(0));
}
