//! The node daemon end to end: the real `zerohop agent` process, driven by the real `zerohop`
//! CLI over its admin socket, serving real HTTP clients.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::daemon::{instance_pids, Daemon};
use common::{client, func, post};
use serde_json::Value;
use zerohop_test_support::{alive, target_bin, ChildGuard, ChildLines, Signal};

fn spec(name: &str) -> String {
    format!(
        "name: {name}\npool: {{ slots: 64, slot_size: 16KiB }}\ntimeout: 5s\nfunctions:\n{}{}\
         routes:\n  - http: POST /go\n    sequence: [up, ex]\n",
        func("up", "upper", "", ""),
        func("ex", "exclaim", "", "")
    )
}

fn url_of(status: &Value) -> String {
    status["listeners"][0]
        .as_str()
        .expect("an http listener")
        .to_owned()
}

#[test]
fn two_chains_on_one_daemon_and_one_goes_down_alone() {
    let mut d = Daemon::start();
    let a = d.apply("alpha", &spec("alpha"));
    let b = d.apply("beta", &spec("beta"));
    assert_eq!(a["applied"], "created");
    let (ua, ub) = (url_of(&a["status"]), url_of(&b["status"]));
    assert_ne!(ua, ub, "each chain has its own listener");
    let http = client();
    for (u, n) in [(&ua, 5), (&ub, 7)] {
        for _ in 0..n {
            let r = post(&http, &format!("{u}/go"), "hi");
            assert_eq!((r.status, r.body.as_str()), (200, "HI!"));
        }
    }
    // Re-applying the same spec changes nothing.
    let again = d.apply("alpha", &spec("alpha"));
    assert_eq!(again["applied"], "unchanged");

    let ls = d.json(&["ls"]);
    let names: Vec<&str> = ls
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["alpha", "beta"]);
    let beta = d.json(&["status", "beta"]);
    assert_eq!(beta["gateway"]["ok"], 7);
    assert_eq!(beta["gateway"]["errors"], 0);
    assert!(beta["metrics_url"].as_str().unwrap().ends_with("/metrics"));
    let alpha_pids = instance_pids(&d.json(&["status", "alpha"]));
    let beta_pids = instance_pids(&beta);
    assert_eq!((alpha_pids.len(), beta_pids.len()), (2, 2));

    // invoke goes through the gateway's own entry point.
    let inv = d.json(&["invoke", "beta", "POST /go", "--data", "via cli"]);
    assert_eq!(
        (inv["status"].as_u64(), inv["body"].as_str()),
        (Some(200), Some("VIA CLI!"))
    );
    let bad = d.cli(&["invoke", "beta", "/nowhere"]);
    assert!(!bad.status.success());
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("no route `/nowhere`; routes: #0 (POST /go)"),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );

    let down = d.json(&["down", "alpha"]);
    assert_eq!(down["answered"], 5);
    assert!(
        zerohop_test_support::wait_until(Duration::from_secs(10), || !alpha_pids
            .iter()
            .any(|&p| alive(p))),
        "alpha's instances are gone"
    );
    assert!(
        std::net::TcpStream::connect(ua.trim_start_matches("http://")).is_err(),
        "alpha's listener is closed"
    );
    // beta never noticed: same instances, still answering.
    assert!(beta_pids.iter().all(|&p| alive(p)));
    let r = post(&http, &format!("{ub}/go"), "still");
    assert_eq!((r.status, r.body.as_str()), (200, "STILL!"));
    assert_eq!(instance_pids(&d.json(&["status", "beta"])), beta_pids);
    let missing = d.cli(&["status", "alpha"]);
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("no chain named 'alpha'"));

    let socket = d.socket().to_path_buf();
    assert_eq!(d.stop(), Some(0));
    assert!(
        !beta_pids.iter().any(|&p| alive(p)),
        "stopping the daemon stops its chains"
    );
    assert!(!socket.exists(), "the socket is removed");
}

#[test]
fn metrics_pass_promtool_and_count_what_was_sent() {
    let promtool = Path::new("/usr/bin/promtool");
    assert!(
        promtool.exists(),
        "promtool is missing: apt-get install prometheus (.ci/run does)"
    );
    let mut d = Daemon::start();
    let s = d.apply("counted", &spec("counted"));
    let url = url_of(&s["status"]);
    let http = client();
    for _ in 0..13 {
        assert_eq!(post(&http, &format!("{url}/go"), "x").status, 200);
    }
    let page = http
        .get(d.metrics())
        .call()
        .expect("GET /metrics")
        .into_string()
        .unwrap();
    let mut check = Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run promtool");
    use std::io::Write;
    check
        .stdin
        .take()
        .unwrap()
        .write_all(page.as_bytes())
        .unwrap();
    let out = check.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics: {}{}\n{page}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let sample = |name: &str| -> Option<f64> {
        page.lines()
            .find(|l| l.starts_with(name) && l.contains("chain=\"counted\""))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
    };
    assert_eq!(sample("zerohop_requests_total{"), Some(13.0), "{page}");
    assert_eq!(sample("zerohop_answers_ok_total{"), Some(13.0));
    assert_eq!(sample("zerohop_answers_error_total{"), Some(0.0));
    assert_eq!(sample("zerohop_slots_in_use{"), Some(0.0));
    // Instances have cgroups as root (CI): their CPU time is there, and non-zero.
    if nix::unistd::geteuid().is_root() {
        let cpu = sample("zerohop_instance_cpu_seconds_total{");
        assert!(cpu.is_some_and(|c| c > 0.0), "instance CPU time: {page}");
    }
    assert_eq!(d.stop(), Some(0));
}

#[test]
fn the_admin_socket_refuses_other_uids() {
    let mut d = Daemon::start();
    let mode = std::fs::metadata(d.socket()).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "the socket is mode 0600");
    let dir_mode = std::fs::metadata(d.socket().parent().unwrap())
        .unwrap()
        .permissions()
        .mode();
    if !nix::unistd::geteuid().is_root() {
        // Only root can run a client under another uid; the file mode above is what stops
        // others, and the peer check is the same code path the root run of CI exercises.
        eprintln!("not root: skipping the other-uid client (CI runs this as root)");
        return;
    }
    let other = |socket: &Path| {
        Command::new(target_bin("zerohop"))
            .args(["ls", "--socket"])
            .arg(socket)
            .env_remove("ZEROHOP_SOCKET")
            .uid(65534)
            .gid(65534)
            .stdin(Stdio::null())
            .output()
            .expect("run zerohop as nobody")
    };
    // The file mode keeps nobody out...
    let out = other(d.socket());
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("Permission denied"), "{err}");
    // ...and when an operator opens the mode up, the peer credentials still do.
    std::fs::set_permissions(d.dir(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(d.socket(), std::fs::Permissions::from_mode(0o666)).unwrap();
    let out = other(d.socket());
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("uid 65534 may not use this daemon"), "{err}");
    std::fs::set_permissions(d.dir(), std::fs::Permissions::from_mode(dir_mode)).unwrap();
    // The owner still may.
    assert!(d.cli(&["ls"]).status.success());
    assert_eq!(d.stop(), Some(0));
}

#[test]
fn logs_show_past_lines_and_follow_new_ones() {
    let mut d = Daemon::start();
    let chatty = target_bin("zerohop-chatty").display().to_string();
    let s = d.apply(
        "talk",
        &format!(
            "name: talk\ntimeout: 5s\nfunctions:\n  say: {{ command: [\"{chatty}\"] }}\n\
             routes:\n  - http: POST /say\n    sequence: [say]\n"
        ),
    );
    let url = url_of(&s["status"]);
    let http = client();
    assert_eq!(post(&http, &format!("{url}/say"), "first").status, 200);
    // The past: both streams, with function and instance.
    let seen = zerohop_test_support::wait_until(Duration::from_secs(10), || {
        let out = d.cli(&["logs", "talk", "say", "--json"]);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.contains("\"out first\"") && text.contains("\"err first\"")
    });
    assert!(seen, "the first request's lines are in `zerohop logs`");
    let out = d.cli(&["logs", "talk"]);
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.ends_with("stdout: out first"))
        .unwrap_or_else(|| panic!("a human line for stdout: {text}"));
    assert!(line.contains(" say/"), "{line}");
    let unknown = d.cli(&["logs", "talk", "nobody"]);
    assert!(!unknown.status.success());
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("no function 'nobody'"));

    // Following: a new request's lines arrive on the open stream.
    let mut follow = Command::new(target_bin("zerohop"));
    follow
        .args(["logs", "talk", "-f", "-n", "0", "--socket"])
        .arg(d.socket())
        .stdin(Stdio::null())
        .stdout(Stdio::piped());
    let mut guard = ChildGuard::new(follow.spawn().expect("zerohop logs -f"));
    let lines = ChildLines::new(&mut guard);
    // The follower subscribes when its request arrives: send until a line shows.
    let mut got = None;
    for i in 0..50 {
        assert_eq!(
            post(&http, &format!("{url}/say"), &format!("live {i}")).status,
            200
        );
        if let Some(l) = lines.next_line(Duration::from_millis(200)) {
            got = Some(l);
            break;
        }
    }
    let got = got.expect("`zerohop logs -f` showed a new line");
    assert!(
        got.contains(": out live ") || got.contains(": err live "),
        "{got}"
    );
    guard.signal(Signal::SIGINT);
    assert_eq!(
        guard.wait_timeout(Duration::from_secs(10)),
        Some(0),
        "Ctrl-C ends -f cleanly"
    );
    assert_eq!(d.stop(), Some(0));
}
