//! The CoAP ingress as devices use it: `zerohop up` with `coap:` routes and libcoap's
//! `coap-client` (CON, NON, PUT, a separate response, block-wise both ways, error codes), and
//! raw datagrams from the test (malformed ones, a retransmitted request) against a chain run
//! in this process, whose stats show that a duplicate never runs the chain twice, and that an
//! address that has not shown it receives never gets more bytes than it sent.

use std::net::{SocketAddr, UdpSocket};
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use crate::common::{func, runtime};
use coap_lite::{CoapOption, MessageClass, MessageType, Packet};
use zerohop_agent::{spec, up, Running, UpOptions};
use zerohop_test_support::{ChainProcess, TempDir};

const CLIENT: &str = "coap-client-notls";

/// Runs `coap-client-notls ARGS URI`, bounded: the client gives up after 10 s of waiting
/// (`-B`), `timeout` kills it after 30 s whatever it does.
fn coap_client(args: &[&str], uri: &str) -> Output {
    let out = Command::new("timeout")
        .args(["-s", "KILL", "30", CLIENT, "-B", "10"])
        .args(args)
        .arg(uri)
        .output()
        .expect("run timeout(1)");
    assert_ne!(
        out.status.code(),
        Some(127),
        "{CLIENT} is not installed: `apt-get install libcoap3-bin` (CI installs it)"
    );
    out
}

/// stdout of a request that must succeed (coap-client prints the payload there, then a
/// newline when it is no terminal; errors go to stderr as `c.dd text`).
fn ok_payload(out: &Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{CLIENT} failed: {stderr}");
    assert!(
        stderr.trim().is_empty(),
        "{CLIENT} reported an error: {stderr}"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    stdout.strip_suffix('\n').unwrap_or(&stdout).to_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).trim().to_owned()
}

/// A spec with one route per (path, function), functions given as spec lines.
fn spec_of(name: &str, top: &str, functions: &[String], routes: &[(&str, &str)]) -> String {
    let mut s = format!("name: {name}\n{top}functions:\n");
    for f in functions {
        s.push_str(f);
    }
    s.push_str("routes:\n");
    for (path, f) in routes {
        s.push_str(&format!("  - coap: {path}\n    sequence: [{f}]\n"));
    }
    s.push_str("coap: { listen: 127.0.0.1:0 }\n");
    s
}

#[test]
fn con_non_put_and_a_slow_chain_get_the_output_errors_get_their_codes() {
    let _serial = crate::serial();
    let spec = spec_of(
        "co",
        "",
        &[
            func("up", "upper", "", ""),
            func("refuse", "fail", "", ""),
            func("slow", "slow", "DELAY_MS: 1500", ""),
        ],
        &[("/motion", "up"), ("/refuse", "refuse"), ("/slow", "slow")],
    );
    let chain = ChainProcess::start(&spec, &[]);
    let addr = chain
        .listener("coap://")
        .unwrap_or_else(|| panic!("no coap:// in {:?}", chain.ready_line));
    let uri = |path: &str| format!("coap://{addr}{path}");

    let con = coap_client(&["-m", "post", "-e", "hello"], &uri("/motion"));
    assert_eq!(ok_payload(&con), "HELLO");
    let non = coap_client(&["-N", "-m", "post", "-e", "hello non"], &uri("/motion"));
    assert_eq!(ok_payload(&non), "HELLO NON");
    let put = coap_client(&["-m", "put", "-e", "put me"], &uri("/motion"));
    assert_eq!(ok_payload(&put), "PUT ME");
    // Longer than the gateway waits before acknowledging: an empty ACK, then the response
    // as a separate CON (and as a NON to a NON).
    let slow = coap_client(&["-m", "post", "-e", "slow"], &uri("/slow"));
    assert_eq!(ok_payload(&slow), "SLOW");
    let slow = coap_client(&["-N", "-m", "post", "-e", "slow non"], &uri("/slow"));
    assert_eq!(ok_payload(&slow), "SLOW NON");

    // A function's error: its status's code, its message as the diagnostic payload.
    let e = coap_client(&["-m", "post", "-e", "abc"], &uri("/refuse"));
    assert_eq!(stderr(&e), "4.22 function 'refuse': refusing \"abc\"");
    assert!(e.stdout.is_empty());
    let e = coap_client(&["-m", "post", "-e", "abc"], &uri("/nowhere"));
    assert_eq!(stderr(&e), "4.04 gateway: no route for POST /nowhere");
    let e = coap_client(&["-m", "get"], &uri("/motion"));
    assert_eq!(
        stderr(&e),
        "4.05 gateway: /motion does not accept GET; allowed: POST, PUT"
    );
    // Resource discovery lists the routes.
    let list = coap_client(&["-m", "get"], &uri("/.well-known/core"));
    assert_eq!(ok_payload(&list), "</motion>,</refuse>,</slow>");
    let e = coap_client(&["-m", "post", "-e", "x"], &uri("/.well-known/core"));
    assert_eq!(
        stderr(&e),
        "4.05 gateway: /.well-known/core does not accept POST; allowed: GET"
    );

    assert_eq!(chain.stop(), Some(0), "clean exit");
}

#[test]
fn a_function_reads_the_path_it_was_posted_to() {
    let _serial = crate::serial();
    let spec = spec_of(
        "copath",
        "",
        &[func(
            "where",
            "header",
            "TESTFN_HEADER: coap-path",
            ", headers: [coap-path]",
        )],
        &[("/rooms/kitchen", "where")],
    );
    let chain = ChainProcess::start(&spec, &[]);
    let addr = chain.listener("coap://").expect("coap listener");
    let out = coap_client(
        &["-m", "post", "-e", "21.5"],
        &format!("coap://{addr}/rooms/kitchen"),
    );
    assert_eq!(ok_payload(&out), "/rooms/kitchen");
}

#[test]
fn a_10_kib_body_goes_block_wise_both_ways() {
    let _serial = crate::serial();
    let spec = spec_of(
        "coblock",
        "",
        &[func("up", "upper", "", "")],
        &[("/motion", "up")],
    );
    let chain = ChainProcess::start(&spec, &[]);
    let addr = chain.listener("coap://").expect("coap listener");
    let uri = format!("coap://{addr}/motion");
    let dir = TempDir::new("coap-block");
    let body: String = (0..10 * 1024)
        .map(|i| char::from(b"abcdefghijklmnopqrstuvwxyz0123456789-"[(i * 7 + i / 37) % 37]))
        .collect();
    let input = dir.path().join("body.txt");
    std::fs::write(&input, &body).unwrap();
    for (i, args) in [
        // CON, 1024-byte blocks each way.
        &["-b", "1024"][..],
        // NON, 256-byte request blocks (the response comes in blocks of the same size).
        &["-N", "-b", "256"][..],
        // No block size given: libcoap picks one, the gateway answers in 1024-byte blocks.
        &[][..],
    ]
    .into_iter()
    .enumerate()
    {
        let output = dir.path().join(format!("out{i}.txt"));
        let mut all = vec!["-m", "post", "-f", input.to_str().unwrap()];
        all.extend_from_slice(args);
        all.extend_from_slice(&["-o", output.to_str().unwrap()]);
        let out = coap_client(&all, &uri);
        assert_eq!(
            ok_payload(&out),
            "",
            "{args:?}: the payload went to the file"
        );
        let got = std::fs::read_to_string(&output).unwrap_or_default();
        assert_eq!(got.len(), body.len(), "{args:?}: whole body back");
        assert!(
            got == body.to_uppercase(),
            "{args:?}: every byte upper-cased"
        );
    }
    assert_eq!(chain.stop(), Some(0), "clean exit");
}

/// A chain in this process (its stats readable) with a 4 KiB body limit.
fn start_here(rt: &tokio::runtime::Runtime) -> (Running, SocketAddr) {
    let yaml = spec_of(
        "coraw",
        "max_body: 4KiB\n",
        &[
            func("up", "upper", "", ""),
            func("slow", "slow", "DELAY_MS: 1500", ""),
            func("refuse", "fail", "", ""),
        ],
        &[("/motion", "up"), ("/slow", "slow"), ("/refuse", "refuse")],
    );
    let spec = spec::parse(Path::new("coraw.yaml"), &yaml)
        .unwrap_or_else(|e| panic!("invalid spec: {e}\n{yaml}"));
    let opts = UpOptions {
        listen: "127.0.0.1:0".parse().unwrap(),
        ..UpOptions::default()
    };
    let chain = rt.block_on(up(spec, opts)).expect("chain up");
    let port = chain.coap_port().expect("a CoAP port");
    (chain, SocketAddr::from(([127, 0, 0, 1], port)))
}

fn accepted(chain: &Running) -> u64 {
    chain.gateways().total(|s| &s.accepted)
}

/// A UDP socket of the test's own, every read bounded.
struct Raw {
    sock: UdpSocket,
    to: SocketAddr,
}

impl Raw {
    fn new(to: SocketAddr) -> Self {
        let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
        sock.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        Self { sock, to }
    }

    fn send(&self, bytes: &[u8]) {
        self.sock.send_to(bytes, self.to).unwrap();
    }

    /// The next datagram from the gateway, raw.
    fn recv_bytes(&self, what: &str) -> Vec<u8> {
        let mut buf = vec![0u8; 65536];
        let (n, from) = self
            .sock
            .recv_from(&mut buf)
            .unwrap_or_else(|e| panic!("no answer to {what} within 10 s: {e}"));
        assert_eq!(from, self.to);
        buf.truncate(n);
        buf
    }

    fn recv(&self, what: &str) -> Packet {
        let b = self.recv_bytes(what);
        Packet::from_bytes(&b).unwrap_or_else(|e| panic!("{what}: undecodable answer {b:?}: {e}"))
    }

    /// Whatever arrives within `wait` (bounded), as raw datagrams.
    fn drain(&self, wait: Duration) -> Vec<Vec<u8>> {
        let mut got = Vec::new();
        let until = std::time::Instant::now() + wait;
        let mut buf = vec![0u8; 65536];
        while let Some(left) = until.checked_duration_since(std::time::Instant::now()) {
            self.sock
                .set_read_timeout(Some(left.max(Duration::from_millis(1))))
                .unwrap();
            match self.sock.recv_from(&mut buf) {
                Ok((n, _)) => got.push(buf[..n].to_vec()),
                Err(_) => break,
            }
        }
        self.sock
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        got
    }

    /// Proves this socket's address receives (RFC 9175 Echo): a request whose answer is
    /// larger than itself gets the 4.01 challenge; repeated with its Echo value, it is
    /// answered, and the address is verified.
    fn verify(&self) {
        let ask = |mid, opts: &[(u16, Vec<u8>)]| {
            request(
                MessageType::Confirmable,
                POST,
                mid,
                b"v",
                "/no-such-route-to-verify",
                opts,
                b"",
            )
        };
        self.send(&ask(0x7000, &[]));
        let p = self.recv("the challenge");
        assert_eq!(code(&p), "4.01", "{p:?}");
        let echo = p
            .get_first_option(CoapOption::Unknown(ECHO))
            .expect("an Echo option")
            .clone();
        self.send(&ask(0x7001, &[(ECHO, echo)]));
        let p = self.recv("the echoed request");
        assert_eq!(code(&p), "4.04", "{p:?}");
    }
}

/// The Echo option (RFC 9175).
const ECHO: u16 = 252;

/// Options of a request: (number, value).
type Options = Vec<(u16, Vec<u8>)>;

/// A request message; `opts` are (number, value) after the Uri-Path.
fn request(
    kind: MessageType,
    code: u8,
    mid: u16,
    token: &[u8],
    path: &str,
    opts: &[(u16, Vec<u8>)],
    payload: &[u8],
) -> Vec<u8> {
    let mut p = Packet::new();
    p.header.set_type(kind);
    p.header.code = MessageClass::from(code);
    p.header.message_id = mid;
    p.set_token(token.to_vec());
    for seg in path.split('/').filter(|s| !s.is_empty()) {
        p.add_option(CoapOption::UriPath, seg.as_bytes().to_vec());
    }
    for (n, v) in opts {
        p.add_option(CoapOption::from(*n), v.clone());
    }
    p.payload = payload.to_vec();
    p.to_bytes_unlimited().unwrap()
}

const POST: u8 = 2;

fn code(p: &Packet) -> String {
    p.header.code.to_string()
}

fn is_empty_of(p: &Packet, kind: MessageType, mid: u16) -> bool {
    p.header.get_type() == kind
        && p.header.code == MessageClass::Empty
        && p.header.message_id == mid
        && p.get_token().is_empty()
        && p.payload.is_empty()
}

#[test]
fn a_retransmitted_request_runs_the_chain_once() {
    let _serial = crate::serial();
    let rt = runtime();
    let (chain, addr) = start_here(&rt);
    let raw = Raw::new(addr);

    // CON, then the very same datagram again: the same piggy-backed answer, one run.
    let con = request(
        MessageType::Confirmable,
        POST,
        0x1234,
        b"tok1",
        "/motion",
        &[],
        b"once",
    );
    raw.send(&con);
    let first = raw.recv_bytes("the CON");
    let p = Packet::from_bytes(&first).unwrap();
    assert_eq!(p.header.get_type(), MessageType::Acknowledgement);
    assert_eq!((p.header.message_id, code(&p)), (0x1234, "2.04".into()));
    assert_eq!(
        (p.get_token(), &p.payload[..]),
        (&b"tok1"[..], &b"ONCE"[..])
    );
    raw.send(&con);
    assert_eq!(raw.recv_bytes("the retransmitted CON"), first);
    assert_eq!(accepted(&chain), 1, "the chain ran once");

    // NON twice: one run; the duplicate gets the same NON response again.
    let non = request(
        MessageType::NonConfirmable,
        POST,
        0x2000,
        b"n",
        "/motion",
        &[],
        b"non",
    );
    raw.send(&non);
    let first = raw.recv_bytes("the NON");
    let p = Packet::from_bytes(&first).unwrap();
    assert_eq!(p.header.get_type(), MessageType::NonConfirmable);
    assert_eq!((&p.payload[..], p.get_token()), (&b"NON"[..], &b"n"[..]));
    raw.send(&non);
    assert_eq!(raw.recv_bytes("the repeated NON"), first);
    assert_eq!(accepted(&chain), 2);

    // A slow chain, the CON sent twice at once, from an address that proved it receives:
    // empty ACKs (one per copy that found the chain running, at least one), then the
    // response as a separate CON, which the test acknowledges. A copy sent after that gets
    // the empty ACK again.
    raw.verify();
    let slow = request(
        MessageType::Confirmable,
        POST,
        0x3000,
        b"slow",
        "/slow",
        &[],
        b"slow",
    );
    raw.send(&slow);
    raw.send(&slow);
    let mut empty_acks = 0;
    let separate = loop {
        let p = raw.recv("the slow CON");
        if is_empty_of(&p, MessageType::Acknowledgement, 0x3000) {
            empty_acks += 1;
            assert!(empty_acks <= 2, "one empty ACK per copy at most");
            continue;
        }
        break p;
    };
    assert!(empty_acks >= 1, "the request was acknowledged first");
    assert_eq!(separate.header.get_type(), MessageType::Confirmable);
    assert_eq!(code(&separate), "2.04");
    assert_eq!(
        (separate.get_token(), &separate.payload[..]),
        (&b"slow"[..], &b"SLOW"[..])
    );
    let mut ack = Packet::new();
    ack.header.set_type(MessageType::Acknowledgement);
    ack.header.code = MessageClass::Empty;
    ack.header.message_id = separate.header.message_id;
    raw.send(&ack.to_bytes().unwrap());
    raw.send(&slow);
    let again = raw.recv("the slow CON once more");
    assert!(
        is_empty_of(&again, MessageType::Acknowledgement, 0x3000),
        "{again:?}"
    );
    assert_eq!(accepted(&chain), 3, "every request ran exactly once");

    rt.block_on(chain.shutdown());
}

#[test]
fn malformed_datagrams_are_answered_or_dropped_and_the_gateway_keeps_serving() {
    let _serial = crate::serial();
    let rt = runtime();
    let (chain, addr) = start_here(&rt);
    let raw = Raw::new(addr);
    // Diagnostics are longer than these requests: only a verified address gets them.
    raw.verify();

    // Dropped without an answer: nothing, a truncated header, version 2, garbage, a NON
    // with a broken option, a request carried by an ACK, a reset for nothing we sent.
    let mut garbage = vec![0xffu8; 300];
    let mut x = 0x2545_f491_4f6c_dd1du64;
    for b in garbage.iter_mut().skip(1) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    for d in [
        &[][..],
        &[0x40][..],
        &[0x40, 0x02, 0x00][..],
        &[0x80, 0x02, 0x00, 0x01, 0xff, b'x'][..],
        &garbage[..],
        &[0x50, 0x02, 0x00, 0x02, 0xf1, 0x00][..],
        &[0x60, 0x02, 0x00, 0x03][..],
        &[0x70, 0x00, 0x00, 0x04][..],
    ] {
        raw.send(d);
    }
    // A ping: its Reset is the first answer, so none of the above got one.
    raw.send(&[0x40, 0x00, 0x00, 0x10]);
    let p = raw.recv("the ping");
    assert!(is_empty_of(&p, MessageType::Reset, 0x10), "{p:?}");

    // A CON that cannot be parsed (token length 9; an option running past the end; a
    // payload marker with no payload): a Reset for its message id.
    for (d, mid) in [
        (
            &[0x49, 0x02, 0x00, 0x11, 1, 2, 3, 4, 5, 6, 7, 8, 9][..],
            0x11,
        ),
        (&[0x40, 0x02, 0x00, 0x12, 0xbf][..], 0x12),
        (
            &[
                0x40, 0x02, 0x00, 0x13, 0xb6, b'm', b'o', b't', b'i', b'o', b'n', 0xff,
            ][..],
            0x13,
        ),
    ] {
        raw.send(d);
        let p = raw.recv("an unparseable CON");
        assert!(is_empty_of(&p, MessageType::Reset, mid), "{mid}: {p:?}");
    }

    // Well-formed, but options the gateway refuses: 4.02 with a diagnostic.
    let cases: [(u16, Options, &str); 3] = [
        (0x20, vec![(9, b"x".to_vec())], "option 9 is not supported"),
        (0x21, vec![(27, vec![0x0f])], "exponent 7"),
        (
            0x22,
            vec![(27, vec![0, 0, 0, 0x0e])],
            "option 27 has a value of 4 bytes",
        ),
    ];
    for (mid, opts, says) in cases {
        raw.send(&request(
            MessageType::Confirmable,
            POST,
            mid,
            b"t",
            "/motion",
            &opts,
            b"x",
        ));
        let p = raw.recv("a bad option");
        assert_eq!((p.header.message_id, code(&p)), (mid, "4.02".into()));
        let text = String::from_utf8_lossy(&p.payload);
        assert!(text.contains(says), "{mid}: {text}");
    }

    // Block-wise mistakes: a block with nothing before it (4.08), a body announced over
    // max_body (4.13 with Size1 = the limit), a single datagram over it (4.13).
    raw.send(&request(
        MessageType::Confirmable,
        POST,
        0x30,
        b"b",
        "/motion",
        &[(27, vec![0x2e])],
        &[b'a'; 1024],
    ));
    let p = raw.recv("a late block");
    assert_eq!(
        code(&p),
        "4.08",
        "{:?}",
        String::from_utf8_lossy(&p.payload)
    );
    raw.send(&request(
        MessageType::Confirmable,
        POST,
        0x31,
        b"b",
        "/motion",
        &[(27, vec![0x0e]), (60, vec![0x27, 0x10])],
        &[b'a'; 1024],
    ));
    let p = raw.recv("an announced large body");
    assert_eq!(code(&p), "4.13");
    assert_eq!(
        p.get_first_option(CoapOption::Size1),
        Some(&vec![0x10, 0x00])
    );
    raw.send(&request(
        MessageType::Confirmable,
        POST,
        0x32,
        b"b",
        "/motion",
        &[],
        &[b'a'; 5000],
    ));
    let p = raw.recv("a large datagram");
    assert_eq!(code(&p), "4.13");
    assert_eq!(
        p.get_first_option(CoapOption::Size1),
        Some(&vec![0x10, 0x00])
    );
    assert_eq!(accepted(&chain), 0, "nothing reached the chain");

    // And real requests are served as before.
    let out = coap_client(
        &["-m", "post", "-e", "still here"],
        &format!("coap://{addr}/motion"),
    );
    assert_eq!(ok_payload(&out), "STILL HERE");
    raw.send(&request(
        MessageType::Confirmable,
        POST,
        0x40,
        b"ok",
        "/motion",
        &[],
        b"raw too",
    ));
    let p = raw.recv("a good request");
    assert_eq!((code(&p), &p.payload[..]), ("2.04".into(), &b"RAW TOO"[..]));
    assert_eq!(accepted(&chain), 2);

    rt.block_on(chain.shutdown());
}

#[test]
fn an_unverified_address_gets_no_more_bytes_than_it_sent_until_it_echoes() {
    let _serial = crate::serial();
    let rt = runtime();
    let (chain, addr) = start_here(&rt);

    // A request whose answer (the function's error line) is larger than the request: the
    // chain runs once, the address gets the 4.01 Echo challenge, no larger than what it
    // sent, and so does a copy of the request.
    let raw = Raw::new(addr);
    let refuse = request(
        MessageType::Confirmable,
        POST,
        0x50,
        b"t1",
        "/refuse",
        &[],
        b"abc",
    );
    raw.send(&refuse);
    let challenge = raw.recv_bytes("the request with a large answer");
    assert!(
        challenge.len() <= refuse.len(),
        "{} bytes back for {}",
        challenge.len(),
        refuse.len()
    );
    let p = Packet::from_bytes(&challenge).unwrap();
    assert_eq!(p.header.get_type(), MessageType::Acknowledgement);
    assert_eq!((p.header.message_id, code(&p)), (0x50, "4.01".into()));
    let echo = p
        .get_first_option(CoapOption::Unknown(ECHO))
        .expect("an Echo option")
        .clone();
    raw.send(&refuse);
    assert_eq!(raw.recv_bytes("the copy"), challenge);
    assert_eq!(accepted(&chain), 1, "the chain ran once");
    // Repeated with the Echo value (a new message, as libcoap sends it): the answer the
    // chain gave, without running it again.
    raw.send(&request(
        MessageType::Confirmable,
        POST,
        0x51,
        b"t2",
        "/refuse",
        &[(ECHO, echo.clone())],
        b"abc",
    ));
    let p = raw.recv("the echoed request");
    assert_eq!((p.header.message_id, code(&p)), (0x51, "4.22".into()));
    assert_eq!(
        String::from_utf8_lossy(&p.payload),
        "function 'refuse': refusing \"abc\""
    );
    assert_eq!(accepted(&chain), 1, "answered from what was kept");
    // An Echo value is good for its own address only.
    let other = Raw::new(addr);
    other.send(&request(
        MessageType::Confirmable,
        POST,
        0x52,
        b"t3",
        "/refuse",
        &[(ECHO, echo)],
        b"xyz",
    ));
    let p = other.recv("a borrowed Echo value");
    assert_eq!(code(&p), "4.01", "still unverified: {p:?}");

    // A slow chain, from an unverified address: no empty ACK ahead, no separate response,
    // no retransmission; the answer goes out piggy-backed when ready because it fits, and
    // a copy that finds the chain running gets nothing. Over the whole exchange the
    // address gets fewer bytes than it sent.
    let quiet = Raw::new(addr);
    let slow = request(
        MessageType::Confirmable,
        POST,
        0x60,
        b"slow",
        "/slow",
        &[],
        b"slow",
    );
    quiet.send(&slow);
    quiet.send(&slow);
    let got = quiet.drain(Duration::from_secs(6));
    assert_eq!(got.len(), 1, "one answer, nothing more: {got:?}");
    let p = Packet::from_bytes(&got[0]).unwrap();
    assert_eq!(p.header.get_type(), MessageType::Acknowledgement);
    assert_eq!((p.header.message_id, code(&p)), (0x60, "2.04".into()));
    assert_eq!(&p.payload[..], b"SLOW");
    assert!(
        got[0].len() <= slow.len(),
        "{} bytes for {}",
        got[0].len(),
        slow.len()
    );
    // Its retransmission gets the same answer again, no more.
    quiet.send(&slow);
    assert_eq!(quiet.recv_bytes("the retransmission"), got[0]);

    // libcoap's client answers the challenge by itself (RFC 9175 support): a request with
    // a large answer from a new address works as it always did, and runs once.
    let before = accepted(&chain);
    let out = coap_client(
        &["-m", "post", "-e", "abc"],
        &format!("coap://{addr}/refuse"),
    );
    assert_eq!(stderr(&out), "4.22 function 'refuse': refusing \"abc\"");
    assert_eq!(accepted(&chain), before + 1);

    rt.block_on(chain.shutdown());
}
