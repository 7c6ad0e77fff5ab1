//! TLS and HTTP/2 as users run them: `zerohop up` on a spec with a `tls` section and
//! `mqtt.listen_tls`, certificates made by `openssl` beside the spec (relative paths), and the
//! real clients: curl (HTTP/2 and HTTP/1.1 over TLS with the test CA, h2c in clear) and
//! mosquitto_pub/mosquitto_sub over TLS. Every wait is bounded; every process is guarded.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::func;
use zerohop_test_support::{target_bin, wait_until, ChainProcess, ChildGuard, ChildLines, TempDir};

/// How long any one client waits for what it expects.
const WAIT: Duration = Duration::from_secs(20);

/// Runs `cmd` with no input, bounded by [`WAIT`]; its exit code, standard output and error.
fn run(cmd: &mut Command) -> (Option<i32>, String, String) {
    let mut guard = ChildGuard::new(
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}")),
    );
    let read = |p: Option<Box<dyn std::io::Read + Send>>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            if let Some(mut p) = p {
                let _ = p.read_to_string(&mut s);
            }
            s
        })
    };
    let out = read(guard.child_mut().stdout.take().map(|p| Box::new(p) as _));
    let err = read(guard.child_mut().stderr.take().map(|p| Box::new(p) as _));
    let code = guard.wait_timeout(WAIT + Duration::from_secs(10));
    (code, out.join().unwrap(), err.join().unwrap())
}

fn openssl(dir: &Path, args: &[&str]) {
    let (code, _, err) = run(Command::new("openssl").args(args).current_dir(dir));
    assert_eq!(code, Some(0), "openssl {args:?}: {err}");
}

/// A test CA (`ca.pem`) in `dir`.
fn make_ca(dir: &Path) {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-days",
            "2",
            "-subj",
            "/CN=zerohop e2e CA",
        ],
    );
}

/// A certificate `NAME.pem` and key `NAME.key` in `dir` for localhost and 127.0.0.1,
/// subject `CN=cn`, signed by the CA.
fn make_cert(dir: &Path, name: &str, cn: &str) {
    let (key, csr, pem, ext) = (
        format!("{name}.key"),
        format!("{name}.csr"),
        format!("{name}.pem"),
        format!("{name}.ext"),
    );
    std::fs::write(
        dir.join(&ext),
        "subjectAltName=DNS:localhost,IP:127.0.0.1\n",
    )
    .unwrap();
    let subj = format!("/CN={cn}");
    openssl(
        dir,
        &[
            "req",
            "-new",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            &key,
            "-out",
            &csr,
            "-subj",
            &subj,
        ],
    );
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            &pem,
            "-days",
            "2",
            "-extfile",
            &ext,
        ],
    );
}

/// The port of `scheme` in the chain's ready line.
fn port(chain: &ChainProcess, scheme: &str) -> u16 {
    let addr = chain
        .listener(scheme)
        .unwrap_or_else(|| panic!("no {scheme} in {:?}", chain.ready_line));
    addr.rsplit_once(':').unwrap().1.parse().unwrap()
}

/// curl to `https://localhost:PORT/hello` trusting `ca`: exit code, `BODY|STATUS|VERSION`
/// and curl's messages.
fn curl_https(port: u16, ca: &Path, extra: &[&str]) -> (Option<i32>, String, String) {
    let resolve = format!("localhost:{port}:127.0.0.1");
    run(Command::new("curl")
        .args(["-sS", "--max-time", "20", "--cacert", ca.to_str().unwrap()])
        .args([
            "--resolve",
            &resolve,
            "-d",
            "secure",
            "-w",
            "|%{http_code}|%{http_version}",
        ])
        .args(extra)
        .arg(format!("https://localhost:{port}/hello")))
}

const ROUTES: &str =
    "routes:\n  - http: POST /hello\n    mqtt: in/+\n    mqtt_reply: out\n    sequence: [upper]\n";

#[test]
fn zerohop_up_serves_https_with_h2_and_mqtt_over_tls_and_reloads_its_certificate() {
    let dir = TempDir::new("tls-chain");
    let certs = dir.path().join("certs");
    std::fs::create_dir(&certs).unwrap();
    make_ca(&certs);
    make_cert(&certs, "server", "first");
    let spec = format!(
        "name: secure\nfunctions:\n{}{ROUTES}tls: {{ cert: certs/server.pem, key: certs/server.key }}\nmqtt: {{ listen: 127.0.0.1:0, listen_tls: 127.0.0.1:0 }}\n",
        func("upper", "upper", "", "")
    );
    let file = dir.path().join("chain.yaml");
    std::fs::write(&file, spec).unwrap();
    let ca = certs.join("ca.pem");
    let chain = ChainProcess::start_file(&file, &[], dir);
    assert!(chain.url.starts_with("https://"), "{}", chain.ready_line);
    let https = port(&chain, "https://");

    for (version, flag) in [("2", "--http2"), ("1.1", "--http1.1")] {
        let (code, out, err) = curl_https(https, &ca, &[flag]);
        assert_eq!(code, Some(0), "curl {flag}: {err}");
        assert_eq!(out, format!("SECURE|200|{version}"));
    }

    // MQTT over TLS: a subscriber and a publisher with the test CA.
    let mqtts = port(&chain, "mqtts://");
    let mut sub = Command::new("stdbuf");
    sub.args([
        "-oL",
        "mosquitto_sub",
        "-h",
        "127.0.0.1",
        "-p",
        &mqtts.to_string(),
    ])
    .args([
        "--cafile",
        ca.to_str().unwrap(),
        "-t",
        "out",
        "-d",
        "-W",
        "60",
    ])
    .args(["-F", "MSG|%t|%p"])
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::null());
    let mut sub = ChildGuard::new(sub.spawn().expect("run mosquitto_sub"));
    let lines = ChildLines::new(&mut sub);
    lines.wait_for("mosquitto_sub", "SUBACK", WAIT);
    let (code, _, err) = run(Command::new("mosquitto_pub")
        .args(["-h", "127.0.0.1", "-p", &mqtts.to_string(), "-q", "1"])
        .args([
            "--cafile",
            ca.to_str().unwrap(),
            "-t",
            "in/door",
            "-m",
            "open",
        ]));
    assert_eq!(code, Some(0), "mosquitto_pub: {err}");
    let got = loop {
        let line = lines
            .next_line(WAIT)
            .expect("the answer reached the subscriber");
        if let Some(m) = line.strip_prefix("MSG|") {
            break m.to_owned();
        }
    };
    assert_eq!(got, "out|OPEN");

    // A renewed certificate, written as tools do (a new file renamed over the old):
    // new connections get it, without restarting the chain.
    make_cert(&certs, "renewed", "renewed");
    for (from, to) in [("renewed.key", "server.key"), ("renewed.pem", "server.pem")] {
        std::fs::copy(certs.join(from), certs.join(format!("{to}.new"))).unwrap();
        std::fs::rename(certs.join(format!("{to}.new")), certs.join(to)).unwrap();
    }
    let subject = || {
        let (_, _, err) = curl_https(https, &ca, &["-v"]);
        err.lines()
            .find_map(|l| l.trim_start_matches(['*', ' ']).strip_prefix("subject: "))
            .map(str::to_owned)
    };
    assert!(
        wait_until(Duration::from_secs(10), || subject().as_deref()
            == Some("CN=renewed")),
        "the renewed certificate was not served: {:?}",
        subject()
    );
    assert_eq!(chain.stop(), Some(0));
}

#[test]
fn h2c_with_prior_knowledge_reaches_a_clear_text_chain() {
    let spec = format!(
        "name: clear\nfunctions:\n{}{}",
        func("upper", "upper", "", ""),
        "routes:\n  - http: POST /hello\n    sequence: [upper]\n"
    );
    let chain = ChainProcess::start(&spec, &[]);
    assert!(chain.url.starts_with("http://"), "{}", chain.ready_line);
    let (code, out, err) = run(Command::new("curl")
        .args([
            "-sS",
            "--max-time",
            "20",
            "--http2-prior-knowledge",
            "-d",
            "plain",
        ])
        .args(["-w", "|%{http_code}|%{http_version}"])
        .arg(format!("{}/hello", chain.url)));
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(out, "PLAIN|200|2");
}

#[test]
fn a_key_that_does_not_match_stops_zerohop_up_at_its_spec_line() {
    let dir = TempDir::new("tls-bad");
    make_ca(dir.path());
    make_cert(dir.path(), "a", "a");
    make_cert(dir.path(), "b", "b");
    let spec = format!(
        "name: bad\nfunctions:\n{}routes:\n  - http: POST /hello\n    sequence: [upper]\ntls:\n  cert: a.pem\n  key: b.key\n",
        func("upper", "upper", "", "")
    );
    let file = dir.path().join("chain.yaml");
    std::fs::write(&file, spec).unwrap();
    let (code, _, err) = run(Command::new(target_bin("zerohop"))
        .arg("up")
        .arg(&file)
        .args(["--listen", "127.0.0.1:0"]));
    assert_ne!(
        code,
        Some(0),
        "zerohop up took a key of another certificate"
    );
    let want = format!(
        "{}:9: tls.key: {}: this key does not match the certificate in {}",
        file.display(),
        dir.path().join("b.key").display(),
        dir.path().join("a.pem").display()
    );
    assert!(err.contains(&want), "wanted {want:?} in:\n{err}");
}

#[test]
fn the_tls_flags_of_zerohop_up_turn_a_clear_spec_into_https() {
    let dir = TempDir::new("tls-flags");
    make_ca(dir.path());
    make_cert(dir.path(), "a", "a");
    make_cert(dir.path(), "b", "b");
    let spec = format!(
        "name: flags\nfunctions:\n{}routes:\n  - http: POST /hello\n    sequence: [upper]\n",
        func("upper", "upper", "", "")
    );
    let file = dir.path().join("chain.yaml");
    std::fs::write(&file, spec).unwrap();
    let (a, a_key, b_key) = (
        dir.path().join("a.pem"),
        dir.path().join("a.key"),
        dir.path().join("b.key"),
    );
    // A key of another certificate: the flag is named.
    let (code, _, err) = run(Command::new(target_bin("zerohop"))
        .arg("up")
        .arg(&file)
        .args(["--listen", "127.0.0.1:0", "--tls-cert"])
        .arg(&a)
        .arg("--tls-key")
        .arg(&b_key));
    assert_ne!(code, Some(0));
    assert!(
        err.contains(&format!(
            "--tls-key: {}: this key does not match",
            b_key.display()
        )),
        "{err}"
    );
    let ca = dir.path().join("ca.pem");
    let (a, a_key) = (a.display().to_string(), a_key.display().to_string());
    let chain = ChainProcess::start_file(&file, &["--tls-cert", &a, "--tls-key", &a_key], dir);
    assert!(chain.url.starts_with("https://"), "{}", chain.ready_line);
    let (code, out, err) = curl_https(port(&chain, "https://"), &ca, &["--http2"]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(out, "SECURE|200|2");
}
