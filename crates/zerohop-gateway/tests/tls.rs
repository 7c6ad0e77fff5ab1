//! TLS on the gateway's listeners, with real clients: curl (HTTP/1.1 and HTTP/2 by ALPN,
//! verified against a test CA), the mosquitto clients over TLS, a rustls client holding a
//! keep-alive connection across a certificate reload, and raw TCP connections that never
//! start their handshake. Certificates are made by `openssl` in each test.

mod support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use support::{assert_answer, curl, Certs, EchoChain, Listen, CLIENT_WAIT, WRITE_OUT};
use zerohop_gateway::{CertFiles, Tls, TlsError, HANDSHAKE_TIMEOUT};
use zerohop_test_support::{wait_until, ChildGuard, ChildLines};

/// `curl` to `https://NAME:PORT/echo` (NAME resolved to the gateway), trusting `ca`.
fn curl_https(addr: SocketAddr, name: &str, ca: &Path, extra: &[&str]) -> support::Ran {
    let port = addr.port();
    let url = format!("https://{name}:{port}/echo");
    let resolve = format!("{name}:{port}:127.0.0.1");
    let mut args = vec![
        "--cacert",
        ca.to_str().unwrap(),
        "--resolve",
        &resolve,
        "-d",
        "hello",
        "-w",
        WRITE_OUT,
    ];
    args.extend_from_slice(extra);
    args.push(&url);
    curl(&args)
}

/// The subject of the certificate the gateway shows a client that asks for `name`.
fn served_subject(addr: SocketAddr, name: &str, ca: &Path) -> String {
    let out = curl_https(addr, name, ca, &["-v"]);
    assert!(out.ok(), "curl failed: {}", out.stderr);
    out.stderr
        .lines()
        .find_map(|l| l.trim_start_matches(['*', ' ']).strip_prefix("subject: "))
        .unwrap_or_else(|| panic!("no subject in curl -v's output: {}", out.stderr))
        .to_owned()
}

fn load(files: &[(std::path::PathBuf, std::path::PathBuf)]) -> Result<Arc<Tls>, TlsError> {
    Tls::load(
        files
            .iter()
            .map(|(cert, key)| CertFiles {
                cert: cert.clone(),
                key: key.clone(),
            })
            .collect(),
    )
}

#[test]
fn https_speaks_http1_and_h2_by_alpn_and_tls_1_2_and_1_3_only() {
    let certs = Certs::new();
    let pair = certs.server("srv", "gateway", &["localhost"], false);
    let chain = EchoChain::start(
        "tls-alpn",
        Listen {
            tls: Some(load(&[pair]).expect("the certificate loads")),
            ..Default::default()
        },
    );
    let ca = certs.ca();
    assert_answer(
        &curl_https(chain.addr, "localhost", &ca, &["--http1.1"]),
        "hello",
        "1.1",
    );
    assert_answer(
        &curl_https(chain.addr, "localhost", &ca, &["--http2"]),
        "hello",
        "2",
    );
    // Both versions of TLS the gateway speaks, and not the ones before.
    for (min, max) in [("--tlsv1.2", "1.2"), ("--tlsv1.3", "1.3")] {
        assert_answer(
            &curl_https(chain.addr, "localhost", &ca, &[min, "--tls-max", max]),
            "hello",
            "2",
        );
    }
    let old = curl_https(
        chain.addr,
        "localhost",
        &ca,
        &["--tlsv1", "--tls-max", "1.1"],
    );
    assert!(!old.ok(), "TLS 1.1 was accepted: {old:?}");
    // A client that does not trust the CA refuses the certificate: it is TLS for real.
    let untrusted = curl(&[
        &format!("https://127.0.0.1:{}/echo", chain.addr.port()),
        "-d",
        "x",
    ]);
    assert!(
        !untrusted.ok(),
        "curl trusted the test certificate without its CA"
    );
    // Clear text on the TLS port is not served.
    let clear = curl(&[
        "-d",
        "x",
        &format!("http://127.0.0.1:{}/echo", chain.addr.port()),
    ]);
    assert!(!clear.ok() || !clear.stdout.contains("x"), "{clear:?}");
    assert!(wait_until(Duration::from_secs(5), || chain.quiet()));
}

#[test]
fn the_certificate_is_chosen_by_sni_and_the_first_is_the_default() {
    let certs = Certs::new();
    let api = certs.server("api", "api", &["api.test"], false);
    // An RSA key beside the ECDSA one.
    let devices = certs.server(
        "devices",
        "devices",
        &["devices.test", "*.devices.test"],
        true,
    );
    let chain = EchoChain::start(
        "tls-sni",
        Listen {
            tls: Some(load(&[api, devices]).expect("both certificates load")),
            ..Default::default()
        },
    );
    let ca = certs.ca();
    assert_eq!(served_subject(chain.addr, "api.test", &ca), "CN=api");
    assert_eq!(
        served_subject(chain.addr, "devices.test", &ca),
        "CN=devices"
    );
    assert_eq!(
        served_subject(chain.addr, "door-7.devices.test", &ca),
        "CN=devices"
    );
    // No SNI (an IP address) or a name no certificate has: the first.
    assert_eq!(served_subject(chain.addr, "127.0.0.1", &ca), "CN=api");
    let unknown = curl_https(chain.addr, "other.test", &ca, &["-v"]);
    assert!(!unknown.ok(), "a certificate for other.test was accepted");
    assert!(
        unknown.stderr.contains("subject: CN=api"),
        "the default certificate was not shown: {}",
        unknown.stderr
    );
}

/// A keep-alive HTTP/1.1 connection over rustls, trusting `ca`.
struct KeepAlive {
    tls: rustls::StreamOwned<rustls::ClientConnection, TcpStream>,
}

impl KeepAlive {
    fn open(addr: SocketAddr, ca: &Path) -> Self {
        use rustls::pki_types::pem::PemObject;
        let mut roots = rustls::RootCertStore::empty();
        for c in rustls::pki_types::CertificateDer::pem_file_iter(ca).unwrap() {
            roots.add(c.unwrap()).unwrap();
        }
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
        let conn = rustls::ClientConnection::new(Arc::new(config), "localhost".try_into().unwrap())
            .unwrap();
        let tcp = TcpStream::connect(addr).unwrap();
        tcp.set_read_timeout(Some(CLIENT_WAIT)).unwrap();
        Self {
            tls: rustls::StreamOwned::new(conn, tcp),
        }
    }

    /// One request on the connection; the answer's body.
    fn echo(&mut self, body: &str) -> String {
        write!(
            self.tls,
            "POST /echo HTTP/1.1\r\nHost: localhost\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        self.tls.flush().unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            let n = self.tls.read(&mut buf).expect("the answer");
            assert!(
                n > 0,
                "the connection closed: {:?}",
                String::from_utf8_lossy(&got)
            );
            got.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&got);
            if let Some((head, rest)) = text.split_once("\r\n\r\n") {
                assert!(head.starts_with("HTTP/1.1 200"), "{head}");
                let len: usize = head
                    .lines()
                    .find_map(|l| {
                        l.to_ascii_lowercase()
                            .strip_prefix("content-length: ")
                            .map(|v| v.trim().parse().unwrap())
                    })
                    .expect("a Content-Length");
                if rest.len() >= len {
                    return rest[..len].to_owned();
                }
            }
        }
    }
}

/// Replaces `to` with `from` the way certificate tools do: a new file renamed over it.
fn replace(from: &Path, to: &Path) {
    let tmp = to.with_extension("new");
    std::fs::copy(from, &tmp).unwrap();
    std::fs::rename(&tmp, to).unwrap();
}

#[test]
fn new_certificates_are_used_when_the_files_change_and_open_connections_stay() {
    let certs = Certs::new();
    let (first_cert, first_key) = certs.server("first", "first", &["localhost"], false);
    let (second_cert, second_key) = certs.server("second", "second", &["localhost"], false);
    let live = (certs.dir.join("live.pem"), certs.dir.join("live.key"));
    std::fs::copy(&first_cert, &live.0).unwrap();
    std::fs::copy(&first_key, &live.1).unwrap();
    let chain = EchoChain::start(
        "tls-reload",
        Listen {
            tls: Some(load(std::slice::from_ref(&live)).unwrap()),
            ..Default::default()
        },
    );
    let ca = certs.ca();
    assert_eq!(served_subject(chain.addr, "localhost", &ca), "CN=first");
    let mut open = KeepAlive::open(chain.addr, &ca);
    assert_eq!(open.echo("before"), "before");

    // The key first, then the certificate: in between, the pair does not match and the
    // reload (if it happens then) keeps the first certificate.
    replace(&second_key, &live.1);
    std::thread::sleep(Duration::from_millis(500));
    replace(&second_cert, &live.0);
    assert!(
        wait_until(Duration::from_secs(10), || served_subject(
            chain.addr,
            "localhost",
            &ca
        ) == "CN=second"),
        "new connections never got the new certificate"
    );
    assert_eq!(
        open.echo("after"),
        "after",
        "the open connection was dropped"
    );

    // Files that cannot be used leave the certificate in use as it is.
    std::fs::write(certs.dir.join("broken.pem"), "not a certificate\n").unwrap();
    replace(&certs.dir.join("broken.pem"), &live.0);
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(served_subject(chain.addr, "localhost", &ca), "CN=second");
    assert_eq!(open.echo("still"), "still");
}

#[test]
fn a_stalled_handshake_costs_a_bounded_time_and_one_connection() {
    let certs = Certs::new();
    let pair = certs.server("srv", "gateway", &["localhost"], false);
    let chain = EchoChain::start(
        "tls-stall",
        Listen {
            tls: Some(load(&[pair]).unwrap()),
            max_connections: 3,
            ..Default::default()
        },
    );
    // Two clients connect and never say hello; a third TCP connection is a half-sent
    // ClientHello (a record header promising more).
    let started = Instant::now();
    let mut stalled: Vec<TcpStream> = (0..2)
        .map(|_| TcpStream::connect(chain.addr).unwrap())
        .collect();
    // With two of three permits taken, others are still served, one at a time.
    for _ in 0..3 {
        assert_answer(
            &curl_https(chain.addr, "localhost", &certs.ca(), &["--http2"]),
            "hello",
            "2",
        );
    }
    let mut half = TcpStream::connect(chain.addr).unwrap();
    half.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01])
        .unwrap();
    stalled.push(half);
    // Every stalled connection is closed by the gateway after the handshake timeout.
    for mut s in stalled {
        s.set_read_timeout(Some(HANDSHAKE_TIMEOUT + Duration::from_secs(10)))
            .unwrap();
        let mut buf = [0u8; 64];
        let closed = match s.read(&mut buf) {
            Ok(0) => true,
            Ok(_) => true, // an alert, then the close
            Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
        };
        assert!(closed, "a stalled handshake was not closed");
    }
    let took = started.elapsed();
    assert!(
        took >= HANDSHAKE_TIMEOUT - Duration::from_secs(1),
        "closed after {took:?}, before the handshake timeout"
    );
    assert!(
        took < HANDSHAKE_TIMEOUT + Duration::from_secs(10),
        "closed after {took:?}"
    );
    // Their permits are back: three clients at once get in.
    let both: Vec<_> = (0..3)
        .map(|_| {
            let (addr, ca) = (chain.addr, certs.ca());
            std::thread::spawn(move || curl_https(addr, "localhost", &ca, &["--http1.1"]))
        })
        .collect();
    for t in both {
        assert_answer(&t.join().unwrap(), "hello", "1.1");
    }
}

#[test]
fn bad_certificate_files_are_errors_that_name_the_file_and_the_fault() {
    let certs = Certs::new();
    let (cert, key) = certs.server("srv", "gateway", &["localhost"], false);
    let (other_cert, _) = certs.server("other", "other", &["localhost"], false);
    let d = &certs.dir;
    std::fs::write(d.join("empty.pem"), "").unwrap();
    std::fs::write(
        d.join("broken.pem"),
        "-----BEGIN CERTIFICATE-----\nnot base64 at all!\n",
    )
    .unwrap();
    support::openssl(d, &["genpkey", "-algorithm", "ed448", "-out", "ed448.key"]);
    let cases: Vec<(
        std::path::PathBuf,
        std::path::PathBuf,
        &str,
        std::path::PathBuf,
    )> = vec![
        (
            d.join("missing.pem"),
            key.clone(),
            "cannot read it",
            d.join("missing.pem"),
        ),
        (
            d.join("empty.pem"),
            key.clone(),
            "no certificate in it",
            d.join("empty.pem"),
        ),
        (
            d.join("broken.pem"),
            key.clone(),
            "not a valid PEM file",
            d.join("broken.pem"),
        ),
        (
            cert.clone(),
            cert.clone(),
            "no private key in it",
            cert.clone(),
        ),
        (
            other_cert.clone(),
            key.clone(),
            "this key does not match the certificate in",
            key.clone(),
        ),
        (
            cert.clone(),
            d.join("ed448.key"),
            "unsupported key type",
            d.join("ed448.key"),
        ),
    ];
    for (c, k, want, file) in cases {
        let e = load(&[(c.clone(), k.clone())]).expect_err("a bad pair was accepted");
        let text = e.to_string();
        assert!(
            text.starts_with(&format!("{}: ", file.display())) && text.contains(want),
            "{c:?} + {k:?}: {text}"
        );
        assert_eq!(e.path(), Some(file.as_path()));
    }
    assert!(load(&[(cert, key)]).is_ok());
}

/// A running `mosquitto_sub` over TLS, subscribed before `start` returns.
struct Sub {
    _guard: ChildGuard,
    lines: ChildLines,
}

impl Sub {
    fn start(port: u16, ca: &Path, topic: &str) -> Self {
        let mut cmd = Command::new("stdbuf");
        cmd.args(["-oL", "mosquitto_sub", "-h", "127.0.0.1", "-p"])
            .arg(port.to_string())
            .args([
                "--cafile",
                ca.to_str().unwrap(),
                "-t",
                topic,
                "-d",
                "-W",
                "60",
            ])
            .args(["-F", "MSG|%t|%p"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        let mut guard = ChildGuard::new(cmd.spawn().expect("run mosquitto_sub"));
        let lines = ChildLines::new(&mut guard);
        lines.wait_for("mosquitto_sub", "SUBACK", CLIENT_WAIT);
        Self {
            _guard: guard,
            lines,
        }
    }

    fn next(&self) -> String {
        loop {
            let line = self
                .lines
                .next_line(CLIENT_WAIT)
                .expect("mosquitto_sub got the answer");
            if let Some(m) = line.strip_prefix("MSG|") {
                return m.to_owned();
            }
        }
    }
}

fn publish(port: u16, tls: Option<&Path>, topic: &str, message: &str) {
    let mut cmd = Command::new("mosquitto_pub");
    cmd.args(["-h", "127.0.0.1", "-p", &port.to_string(), "-q", "1"])
        .args(["-t", topic, "-m", message]);
    if let Some(ca) = tls {
        cmd.args(["--cafile", ca.to_str().unwrap()]);
    }
    let out = support::bounded(&mut cmd);
    assert!(out.ok(), "mosquitto_pub failed: {out:?}");
}

#[test]
fn mqtt_over_tls_with_the_mosquitto_clients_shares_one_broker_with_clear_text() {
    let certs = Certs::new();
    let pair = certs.server("srv", "gateway", &["localhost"], false);
    let chain = EchoChain::start(
        "tls-mqtt",
        Listen {
            tls: Some(load(&[pair]).unwrap()),
            mqtt: true,
            ..Default::default()
        },
    );
    let (clear, secure) = (chain.mqtt.unwrap().port(), chain.mqtts.unwrap().port());
    let ca = certs.ca();
    let sub = Sub::start(secure, &ca, "out");
    publish(secure, Some(&ca), "in/1", "over tls");
    assert_eq!(sub.next(), "out|over tls");
    // A device in clear reaches a subscriber over TLS: one broker.
    publish(clear, None, "in/2", "in clear");
    assert_eq!(sub.next(), "out|in clear");
    // Without the CA the client refuses the gateway's certificate.
    let mut untrusted = Command::new("mosquitto_pub");
    untrusted
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &secure.to_string(),
            "-t",
            "in/3",
            "-m",
            "x",
        ])
        .args(["--capath", "/nonexistent"]);
    assert!(!support::bounded(&mut untrusted).ok());
    // Clear MQTT on the TLS port gets no CONNACK.
    let mut plain = Command::new("mosquitto_pub");
    plain.args([
        "-h",
        "127.0.0.1",
        "-p",
        &secure.to_string(),
        "-t",
        "in/4",
        "-m",
        "x",
    ]);
    assert!(!support::bounded(&mut plain).ok());
}
