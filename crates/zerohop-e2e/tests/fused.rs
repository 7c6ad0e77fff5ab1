//! Fused chains end to end (`fuse:` in the spec): the real `zerohop agent` daemon and CLI run
//! the hello chain with upper and exclaim fused into one program (`hello-fused`), under a
//! real HTTP client. It answers as the two-process chain does; a crash in the group's second
//! step fails the request with a 502 that names that step, and the group restarts as one; the
//! group scales as one, through any of its functions; `zerohop status` shows the group.

mod common;

use std::time::Duration;

use common::daemon::{instance_pids, Daemon};
use common::{client, post};
use zerohop_test_support::{target_bin, wait_until};

/// A guard against a daemon that never gets there, not a measure.
const GUARD: Duration = Duration::from_secs(30);

/// The fused hello chain `name`: both functions are `hello-fused`, whose `exclaim` aborts
/// the process on the body `CRASH` (the environment is the group's: the same on both).
fn fused_hello(name: &str) -> String {
    let bin = target_bin("hello-fused").display().to_string();
    format!(
        "name: {name}\ntimeout: 10s\nfunctions:\n  upper: {{ command: [\"{bin}\"], env: {{ \
         HELLO_CRASH_ON: CRASH }}, scale: {{ min: 1, max: 3, parked: 0 }} }}\n  exclaim: {{ \
         command: [\"{bin}\"], env: {{ HELLO_CRASH_ON: CRASH }} }}\nroutes:\n  - http: POST \
         /hello\n    sequence: [upper, exclaim]\nfuse:\n  - [upper, exclaim]\n"
    )
}

fn ready_and_restarts(d: &Daemon, chain: &str) -> (u64, u64) {
    let s = d.status(chain);
    let upper = &s["functions"][0];
    (
        upper["ready"].as_u64().unwrap_or(0),
        upper["restarts"].as_u64().unwrap_or(0),
    )
}

#[test]
fn a_fused_hello_answers_fails_a_crashed_step_by_name_restarts_and_scales_as_one_group() {
    let d = Daemon::start();
    let applied = d.apply("fused", &fused_hello("fused"));
    assert_eq!(applied["applied"], "created", "{applied}");
    let url = applied["status"]["listeners"][0]
        .as_str()
        .expect("an http listener")
        .to_owned();
    let hello = format!("{url}/hello");
    let http = client();

    // One set of instances, the group's; both functions say which group they are in.
    let s = d.status("fused");
    let (upper, exclaim) = (&s["functions"][0], &s["functions"][1]);
    assert_eq!(
        (&upper["name"], &exclaim["name"]),
        (&"upper".into(), &"exclaim".into())
    );
    assert_eq!(upper["fused"], "upper+exclaim", "{s}");
    assert_eq!(exclaim["fused"], "upper+exclaim", "{s}");
    assert_eq!(upper["ready"], 1, "{s}");
    assert_eq!(
        exclaim["instances"].as_array().map(Vec::len),
        Some(0),
        "{s}"
    );
    let text = String::from_utf8_lossy(&d.cli(&["status", "fused"]).stdout).into_owned();
    assert!(text.contains("upper (fused upper+exclaim)"), "{text}");

    let a = post(&http, &hello, "hello world");
    assert_eq!((a.status, a.body.as_str()), (200, "HELLO WORLD!"));

    // A crash in the second step: the client hears which step, and the group restarts.
    let before = instance_pids(&d.status("fused"));
    let a = post(&http, &hello, "crash");
    assert_eq!(a.status, 502, "{a:?}");
    assert!(
        a.body.starts_with("function 'exclaim': instance ")
            && a.body.contains("(fused group upper+exclaim)"),
        "the 502 names the step that crashed and its group: {a:?}"
    );
    assert!(
        wait_until(GUARD, || {
            let (ready, restarts) = ready_and_restarts(&d, "fused");
            ready == 1 && restarts >= 1
        }),
        "the group restarted: {}",
        d.status("fused")
    );
    assert_ne!(instance_pids(&d.status("fused")), before, "a new process");
    let a = post(&http, &hello, "hello again");
    assert_eq!((a.status, a.body.as_str()), (200, "HELLO AGAIN!"));

    // Scaling applies to the group, whichever of its functions is named.
    let out = d.cli(&["scale", "fused", "exclaim", "2"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        wait_until(GUARD, || ready_and_restarts(&d, "fused").0 == 2),
        "two instances of the group: {}",
        d.status("fused")
    );
    assert_eq!(instance_pids(&d.status("fused")).len(), 2);
    for _ in 0..8 {
        let a = post(&http, &hello, "hello world");
        assert_eq!((a.status, a.body.as_str()), (200, "HELLO WORLD!"));
    }
    d.stop_cleanly();
}

/// A C program registering its two handlers with `zh_run_named`.
const C_FUSED: &str = r#"#include <ctype.h>
#include <zerohop.h>

static zh_next upper(zh_request *req, void *user) {
    (void)user;
    size_t len;
    uint8_t *body = zh_body(req, &len);
    for (size_t i = 0; i < len; i++) body[i] = (uint8_t)toupper(body[i]);
    return ZH_CONTINUE;
}

static zh_next exclaim(zh_request *req, void *user) {
    (void)user;
    size_t len;
    const uint8_t *body = zh_body(req, &len);
    if (len == 2 && body[0] == 'N' && body[1] == 'O') return zh_fail(req, 422, "refusing");
    if (zh_extend(req, "!", 1) != 0) return zh_fail(req, 500, "cannot extend");
    return ZH_CONTINUE;
}

int main(void) {
    const char *names[] = {"upper", "exclaim"};
    const zh_handler handlers[] = {upper, exclaim};
    zh_run_named(names, handlers, 2, NULL);
}
"#;

#[test]
fn a_c_program_serves_a_fused_group_with_zh_run_named() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let lib = root.join("target/release/libzerohop.a");
    assert!(
        lib.exists(),
        "{} is missing: `cargo build --release -p zerohop-c` builds it",
        lib.display()
    );
    let dir = zerohop_test_support::TempDir::new("fused-c");
    let source = dir.path().join("fused.c");
    std::fs::write(&source, C_FUSED).expect("write the C source");
    let program = dir.path().join("fused");
    let status = std::process::Command::new("cc")
        .args(["-O2", "-std=c11", "-Wall", "-Wextra", "-Werror", "-I"])
        .arg(root.join("sdk/c/include"))
        .arg(&source)
        .arg("-o")
        .arg(&program)
        .arg(&lib)
        .args(["-lpthread", "-ldl", "-lm"])
        .status()
        .expect("run cc");
    assert!(status.success(), "cc failed");
    let p = program.display();
    let chain = zerohop_test_support::ChainProcess::start(
        &format!(
            "name: cfused\nfunctions:\n  upper: {{ command: [\"{p}\"] }}\n  exclaim: {{ \
             command: [\"{p}\"] }}\nroutes:\n  - http: POST /hello\n    sequence: [upper, \
             exclaim]\nfuse:\n  - [upper, exclaim]\n"
        ),
        &[],
    );
    assert!(
        chain.ready_line.contains("functions: upper+exclaim x1"),
        "{}",
        chain.ready_line
    );
    let http = client();
    let hello = format!("{}/hello", chain.url);
    let a = post(&http, &hello, "hello from c");
    assert_eq!((a.status, a.body.as_str()), (200, "HELLO FROM C!"));
    let a = post(&http, &hello, "no");
    assert_eq!(
        (a.status, a.body.as_str()),
        (422, "function 'exclaim': refusing\n")
    );
    assert_eq!(chain.stop(), Some(0));
}
