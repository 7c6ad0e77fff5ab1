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
    // The large slots beside the small ones (the default max_body, 64 MiB, is past a slot).
    let slots = &beta["slots"];
    assert_eq!(
        (slots["total"].as_u64(), slots["large_total"].as_u64()),
        (Some(64 + 16), Some(16)),
        "{slots}"
    );
    assert_eq!(slots["max_body"], 64 << 20);
    let text = String::from_utf8_lossy(&d.cli(&["status", "beta"]).stdout).into_owned();
    assert!(
        text.contains("of them large (bodies over a slot, up to 64 MiB): 0 of 16"),
        "{text}"
    );
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

/// A chain whose function prints what it is sent (`zerohop-chatty`: `out BODY` on standard
/// output, `err BODY` on standard error).
fn chatty_spec() -> String {
    let chatty = target_bin("zerohop-chatty").display().to_string();
    format!(
        "name: talk\ntimeout: 5s\nfunctions:\n  say: {{ command: [\"{chatty}\"] }}\n\
         routes:\n  - http: POST /say\n    sequence: [say]\n"
    )
}

/// Whether `out` holds a byte or character a terminal acts on (tab and the line ends
/// `zerohop logs` writes itself aside).
fn raw_control(out: &str) -> Option<char> {
    out.chars()
        .find(|&c| c != '\n' && c != '\t' && zerohop_agent::logs::is_escaped(c))
}

/// A function answers escape sequences, `\r`, a C1 CSI and a bidi override: `zerohop
/// invoke` prints them visibly escaped, line by line, and `--json` gives the body exactly.
#[test]
fn invoke_never_passes_a_functions_control_bytes_to_the_terminal() {
    let d = Daemon::start();
    d.apply(
        "shout",
        &format!(
            "name: shout\nfunctions:\n{}routes:\n  - http: POST /up\n    sequence: [upper]\n",
            func("upper", "upper", "", "")
        ),
    );
    let hostile = "\x1b[2J\x1b[31mred\x07 \rback\x08 \u{9b}2J \u{202e}desrever\nsecond line";
    let out = d.cli(&["invoke", "shout", "POST /up", "--data", hostile]);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).expect("UTF-8");
    assert_eq!(
        raw_control(&text),
        None,
        "invoke passed a control character: {text:?}"
    );
    assert_eq!(
        text,
        "\\x1b[2J\\x1b[31MRED\\x07 \\x0dBACK\\x08 \\u{9b}2J \\u{202e}DESREVER\nSECOND LINE\n"
    );
    let json = d.json(&["invoke", "shout", "POST /up", "--data", hostile]);
    assert_eq!(json["body"], hostile.to_uppercase(), "{json}");
}

/// A function prints escape sequences, `\r`, a C1 CSI, a bidi override and a line that
/// looks like another function's: `zerohop logs` (plain, `--json`, `-f`) shows all of it
/// visibly escaped, and every line it prints starts with the function's own origin.
#[test]
fn logs_never_pass_a_functions_control_bytes_to_the_terminal() {
    let mut d = Daemon::start();
    let s = d.apply("talk", &chatty_spec());
    let url = url_of(&s["status"]);
    let forged = "2024-02-29T12:34:56.789Z exclaim/1 stdout: you have been forged";
    let hostile = format!(
        "\x1b[2J\x1b[H\x1b[31mred\x1b[0m\x1b]0;title\x07 \rrewound\x08 \u{9b}2J \
         \u{202e}desrever\n{forged}"
    );
    // Follow from before the request, so the live path is checked too.
    let mut follow = Command::new(target_bin("zerohop"));
    follow
        .args(["logs", "talk", "-f", "-n", "0", "--socket"])
        .arg(d.socket())
        .stdin(Stdio::null())
        .stdout(Stdio::piped());
    let mut guard = ChildGuard::new(follow.spawn().expect("zerohop logs -f"));
    let lines = ChildLines::new(&mut guard);
    let http = client();
    let mut followed = Vec::new();
    for _ in 0..50 {
        assert_eq!(post(&http, &format!("{url}/say"), &hostile).status, 200);
        while let Some(l) = lines.next_line(Duration::from_millis(200)) {
            followed.push(l);
        }
        if followed.iter().filter(|l| l.contains("forged")).count() >= 2 {
            break;
        }
    }
    guard.signal(Signal::SIGINT);
    assert_eq!(guard.wait_timeout(Duration::from_secs(10)), Some(0));

    let out = d.cli(&["logs", "talk"]);
    assert!(out.status.success());
    let plain = String::from_utf8(out.stdout).expect("zerohop logs writes UTF-8");
    let followed = followed.join("\n");
    for (what, text) in [("logs", plain.as_str()), ("logs -f", followed.as_str())] {
        assert_eq!(
            raw_control(text),
            None,
            "{what} passed a control character: {text:?}"
        );
        // Every line is the origin the agent gave it, then the function's text.
        let mut forgeries = 0;
        for line in text.lines() {
            let (time, rest) = line.split_once(' ').expect("a time first");
            assert_eq!(
                (time.len(), time.find('T')),
                (24, Some(10)),
                "{what}: {line}"
            );
            let rest = rest
                .strip_prefix("say/")
                .unwrap_or_else(|| panic!("{what}: {line}"));
            let (_instance, rest) = rest.split_once(' ').expect("an instance");
            let text = rest
                .strip_prefix("stdout: ")
                .or_else(|| rest.strip_prefix("stderr: "))
                .unwrap_or_else(|| panic!("{what}: {line}"));
            if text == forged {
                forgeries += 1;
            }
        }
        assert!(
            forgeries >= 2,
            "{what}: the fake line on both streams: {text}"
        );
        // What the function printed is there, visibly.
        assert!(
            text.contains(
                "out \\x1b[2J\\x1b[H\\x1b[31mred\\x1b[0m\\x1b]0;title\\x07 \\x0drewound\\x08 \
                 \\u{9b}2J \\u{202e}desrever"
            ),
            "{what}: {text}"
        );
    }

    let out = d.cli(&["logs", "talk", "--json"]);
    assert!(out.status.success());
    let json = String::from_utf8(out.stdout).expect("UTF-8");
    assert_eq!(
        raw_control(&json),
        None,
        "--json passed a control character"
    );
    let texts: Vec<String> = json
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).expect("a JSON line");
            v["text"].as_str().expect("a text").to_owned()
        })
        .collect();
    assert!(texts.iter().all(|t| raw_control(t).is_none()), "{texts:?}");
    assert!(
        texts.iter().any(|t| t.starts_with("err \\x1b[2J")),
        "{texts:?}"
    );
    assert!(texts.iter().any(|t| t == forged), "{texts:?}");
    assert_eq!(d.stop(), Some(0));
}

/// The key of the peer daemons in these tests.
const PEER_KEY: &str = "the cluster's peer secret, 32 B!";

/// A daemon that serves peer daemons on a free port of 127.0.0.1 with [`PEER_KEY`], and
/// that address.
fn peer_daemon() -> (Daemon, std::net::SocketAddr) {
    let free = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    let listen = free.local_addr().expect("its address");
    drop(free);
    let d = Daemon::start_with(|dir| {
        let secret = dir.join("peer-secret");
        std::fs::write(&secret, PEER_KEY).expect("write the peer secret");
        vec![
            "--peer-secret".into(),
            secret.display().to_string(),
            "--peer-listen".into(),
            listen.to_string(),
        ]
    });
    (d, listen)
}

/// The daemon's resident memory, in KiB.
fn rss_kib(pid: u32) -> u64 {
    // A reading that fails must fail the test: 0 before and after would pass any bound.
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_else(|e| panic!("/proc/{pid}/status: {e}"));
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no VmRSS in /proc/{pid}/status"))
}

/// A peer that authenticates, then sends PINGs as fast as it can and never reads: the
/// daemon stops reading it once a bounded backlog waits (its memory stays put), drops it
/// after the write stall, says so in its log naming it, and goes on.
#[test]
fn a_peer_that_never_reads_is_dropped_and_the_daemon_stays_small() {
    use zerohop_link::auth::{handshake, Role};
    use zerohop_link::{Frame, Secret, WRITE_STALL};

    let (mut d, peer) = peer_daemon();
    let pid = d.pid();
    let before = rss_kib(pid);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let bound = WRITE_STALL + Duration::from_secs(30);
    let (me, sent, peak, closed) = rt.block_on(async {
        let mut s = tokio::net::TcpStream::connect(peer).await.expect("connect");
        handshake(
            &mut s,
            &Secret::new(PEER_KEY.as_bytes()),
            Role::Client,
            peer,
        )
        .await
        .expect("the handshake with the key passes");
        let me = s.local_addr().expect("our address");
        let mut ping = Vec::new();
        Frame::Ping(1).encode(&mut ping);
        let batch = ping.repeat(4096);
        let (mut sent, mut at, mut peak) = (0usize, 0usize, 0u64);
        let began = std::time::Instant::now();
        let mut closed = false;
        while began.elapsed() < bound {
            peak = peak.max(rss_kib(pid));
            match tokio::time::timeout(Duration::from_millis(200), s.writable()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => {
                    closed = true;
                    break;
                }
                Err(_) => continue,
            }
            match s.try_write(&batch[at..]) {
                Ok(n) => {
                    sent += n;
                    at = (at + n) % batch.len();
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(_) => {
                    closed = true;
                    break;
                }
            }
        }
        (me, sent, peak, closed)
    });
    assert!(
        closed,
        "the daemon kept a peer that never reads ({sent} bytes sent)"
    );
    assert!(
        sent < 48 << 20,
        "the daemon took {sent} bytes from a peer that never reads"
    );
    let grew = peak.saturating_sub(before);
    assert!(
        grew < 64 << 10,
        "the daemon grew by {grew} KiB ({before} KiB before)"
    );
    let log = std::fs::read_to_string(d.log()).expect("the agent's log");
    assert!(
        log.lines()
            .any(|l| l.contains(&me.to_string()) && l.contains("does not read")),
        "the log names the peer: {log}"
    );
    assert!(d.cli(&["ls"]).status.success());
    assert_eq!(d.stop(), Some(0));
}

/// The daemon dials a peer that is an attacker without the key (a split chain's function
/// placed on it), and the attacker dials the daemon at the same time: it gives each
/// connection the daemon's hello of the other and forwards the daemon's proofs between
/// them. Both connections fail (the daemon refuses its own identity), the request gets a
/// 502, and no call of the attacker runs.
#[test]
fn a_handshake_reflected_between_the_daemons_own_connections_fails() {
    use std::io::{Read, Write};
    use zerohop_link::auth::{HELLO_LEN, TAG_LEN};
    use zerohop_link::{Call, Frame};

    let (mut d, peer) = peer_daemon();
    let trap = std::net::TcpListener::bind("127.0.0.1:0").expect("a trap");
    let trap_addr = trap.local_addr().expect("its address");
    let attacker = std::thread::spawn(move || {
        let bound = Some(Duration::from_secs(20));
        trap.set_nonblocking(true).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        let mut s1 = loop {
            match trap.accept() {
                Ok((s, _)) => break s,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    assert!(
                        std::time::Instant::now() < deadline,
                        "the daemon never dialed"
                    );
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(e) => panic!("accept: {e}"),
            }
        };
        s1.set_nonblocking(false).unwrap();
        let mut s2 = std::net::TcpStream::connect(peer).expect("dial the daemon");
        for s in [&s1, &s2] {
            s.set_read_timeout(bound).unwrap();
        }
        let (mut h1, mut h2) = ([0u8; HELLO_LEN], [0u8; HELLO_LEN]);
        s1.read_exact(&mut h1).expect("the dialer's hello");
        s2.read_exact(&mut h2).expect("the acceptor's hello");
        let _ = s1.write_all(&h2);
        let _ = s2.write_all(&h1);
        let (mut t1, mut t2) = ([0u8; TAG_LEN], [0u8; TAG_LEN]);
        if s1.read_exact(&mut t1).is_ok() && s2.read_exact(&mut t2).is_ok() {
            let _ = s2.write_all(&t1);
            let _ = s1.write_all(&t2);
        }
        // Were it in, this would run the chain's function on the daemon.
        let mut call = Vec::new();
        Frame::Call(
            1,
            Call {
                chain: "split".into(),
                function: "up".into(),
                deadline_ms: 1000,
                route: 0,
                hop: 0,
                flags: 0,
                meta: Vec::new(),
                payload: b"stolen".to_vec(),
            },
        )
        .encode(&mut call);
        let _ = s2.write_all(&call);
        let mut rest = Vec::new();
        // The daemon closes it: end of file or reset, not a timeout.
        match s2.read_to_end(&mut rest) {
            Ok(_) => true,
            Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
        }
    });
    let file = d.write("split", &spec("split"));
    let applied = d.json(&[
        "apply",
        file.to_str().expect("UTF-8"),
        "--here",
        "up",
        "--peer",
        &format!("ex={trap_addr}"),
    ]);
    let url = url_of(&applied["status"]);
    let a = post(&client(), &format!("{url}/go"), "x");
    assert_eq!(a.status, 502, "{}", a.body);
    assert!(a.body.contains("reflection"), "{}", a.body);
    assert!(
        attacker.join().expect("the attacker"),
        "the daemon kept the attacker's connection"
    );
    let log = std::fs::read_to_string(d.log()).expect("the agent's log");
    assert!(
        log.contains("own identity or nonce (a reflection)"),
        "the accepting connection refuses the reflection: {log}"
    );
    assert!(!log.contains("stolen"), "{log}");
    assert_eq!(d.stop(), Some(0));
}

/// The sum of every function's restarts in a `zerohop status --json`.
fn restarts(status: &Value) -> u64 {
    status["functions"]
        .as_array()
        .expect("functions")
        .iter()
        .map(|f| f["restarts"].as_u64().expect("restarts"))
        .sum()
}

/// A chain split over two daemons: `h` (hostile) runs on the first, `up` on the second, and
/// the first daemon plays `up`'s instance itself (a relay, in the daemon's own process, as
/// root). `h` rewrites its pool's `slot_count`, `slot_size` and `slots_offset` and passes
/// the request on alive, so the relay takes it from the poisoned header. The relay reads and
/// writes the slot by the plan's geometry: the answer is right, nobody crashes or restarts,
/// and the route goes on answering while the header stays poisoned.
#[test]
fn a_poisoned_pool_header_moves_no_relay_of_a_split_chain() {
    let (mut a, a_peer) = peer_daemon();
    let (mut b, b_peer) = peer_daemon();
    let spec = format!(
        "name: relayed\npool: {{ slots: 64, slot_size: 16KiB }}\ntimeout: 5s\nfunctions:\n  \
         h: {{ command: [\"{}\"], env: {{ HOSTILE_MODE: header }} }}\n{}\
         routes:\n  - http: POST /go\n    sequence: [h, up]\n",
        target_bin("zerohop-hostile").display(),
        func("up", "upper", "", ""),
    );
    let part = |d: &Daemon, here: &str, peer: String| {
        let file = d.write("relayed", &spec);
        d.json(&[
            "apply",
            file.to_str().expect("UTF-8"),
            "--here",
            here,
            "--peer",
            &peer,
        ])
    };
    part(&b, "up", format!("h={a_peer}"));
    let applied = part(&a, "h", format!("up={b_peer}"));
    let url = format!("{}/go", url_of(&applied["status"]));
    let c = client();
    let go = |body: &str| {
        let r = post(&c, &url, body);
        (r.status, r.body)
    };
    assert_eq!(go("hello"), (200, "HELLO".to_owned()), "through the hop");

    assert_eq!(
        go("poison"),
        (200, "POISON".to_owned()),
        "the relay took the request by the plan's geometry, not the header's"
    );
    for i in 0..20 {
        let body = format!("after {i}");
        assert_eq!(go(&body), (200, body.to_uppercase()));
    }
    assert!(alive(a.pid()), "the daemon that runs the relay is alive");
    let (sa, sb) = (a.status("relayed"), b.status("relayed"));
    assert_eq!((restarts(&sa), restarts(&sb)), (0, 0), "{sa}\n{sb}");
    let log = std::fs::read_to_string(a.log()).expect("the agent's log");
    assert!(!log.contains("panicked"), "{log}");
    assert_eq!(a.stop(), Some(0));
    assert_eq!(b.stop(), Some(0));
}
