//! MQTT ingress as users run it: `zerohop up` with an `mqtt:` section, the real mosquitto
//! clients (`mosquitto_pub`, `mosquitto_sub`), raw TCP for what those cannot send, and a real
//! `mosquitto` broker for subscribe mode. Every wait is bounded; every process is guarded.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::func;
use zerohop_test_support::{free_port, wait_until, ChainProcess, ChildGuard, ChildLines, TempDir};

/// How long any one client waits for what it expects.
const WAIT: Duration = Duration::from_secs(20);

/// A chain whose routes are `routes` (YAML list items) over `functions`, with `mqtt`.
fn spec(functions: &str, routes: &str, mqtt: &str) -> String {
    format!("name: mq\nfunctions:\n{functions}routes:\n{routes}mqtt: {mqtt}\n")
}

/// The port of the chain's MQTT listener, from its ready line.
fn mqtt_port(chain: &ChainProcess) -> u16 {
    let addr = chain
        .listener("mqtt://")
        .unwrap_or_else(|| panic!("no mqtt:// in {:?}", chain.ready_line));
    addr.rsplit_once(':').unwrap().1.parse().unwrap()
}

/// A running `mosquitto_sub`, subscribed (its SUBACK seen) before `start` returns.
struct Sub {
    _guard: ChildGuard,
    lines: ChildLines,
}

impl Sub {
    /// Subscribes to `topic` with extra `args` (`-V mqttv5`, `-q 1`); messages come as
    /// `MSG|topic|payload|user properties|correlation data` (the last two MQTT 5 only).
    fn start(port: u16, topic: &str, args: &[&str]) -> Self {
        // Line-buffered (stdbuf execs it, same process): its debug lines, the SUBACK one
        // among them, are not flushed otherwise.
        let mut cmd = Command::new("stdbuf");
        cmd.args([
            "-oL",
            "mosquitto_sub",
            "-h",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "-t",
            topic,
            "-d",
        ])
        .args(["-W", "120"])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
        let v5 = args.contains(&"mqttv5");
        cmd.args(["-F", if v5 { "MSG|%t|%p|%P|%D" } else { "MSG|%t|%p" }]);
        let mut guard = ChildGuard::new(cmd.spawn().expect("run mosquitto_sub"));
        let lines = ChildLines::new(&mut guard);
        lines.wait_for("mosquitto_sub", "SUBACK", WAIT);
        Self {
            _guard: guard,
            lines,
        }
    }

    /// The next `n` messages (without the `MSG|` prefix); panics when they do not come.
    fn take(&self, n: usize) -> Vec<String> {
        let mut got = Vec::new();
        while got.len() < n {
            let line = self.lines.next_line(WAIT).unwrap_or_else(|| {
                panic!("mosquitto_sub got {} of {n} messages: {got:?}", got.len())
            });
            if let Some(m) = line.strip_prefix("MSG|") {
                got.push(m.to_owned());
            }
        }
        got
    }
}

/// Runs `mosquitto_pub` with `args` to the gateway at `port`: exit code and its output.
fn publish(port: u16, args: &[&str]) -> (Option<i32>, String) {
    let dir = TempDir::new("mqtt-pub");
    let log = dir.path().join("out");
    let file = std::fs::File::create(&log).unwrap();
    let mut cmd = Command::new("mosquitto_pub");
    cmd.args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .stdin(Stdio::null())
        .stdout(file.try_clone().unwrap())
        .stderr(file);
    let mut guard = ChildGuard::new(cmd.spawn().expect("run mosquitto_pub"));
    let code = guard.wait_timeout(WAIT);
    (code, std::fs::read_to_string(&log).unwrap_or_default())
}

/// Publishes and insists on a clean exit.
fn publish_ok(port: u16, args: &[&str]) {
    let (code, out) = publish(port, args);
    assert_eq!(code, Some(0), "mosquitto_pub {args:?}: {out}");
}

// --- raw MQTT 3.1.1 / 5 packets, for what the mosquitto clients will not send ---

fn packet(first: u8, body: &[u8]) -> Vec<u8> {
    let mut p = vec![first];
    let mut n = body.len();
    loop {
        let mut b = (n % 128) as u8;
        n /= 128;
        if n > 0 {
            b |= 0x80;
        }
        p.push(b);
        if n == 0 {
            break;
        }
    }
    p.extend_from_slice(body);
    p
}

fn str16(s: &str) -> Vec<u8> {
    let mut v = (s.len() as u16).to_be_bytes().to_vec();
    v.extend_from_slice(s.as_bytes());
    v
}

fn connect(level: u8, client_id: &str, keep_alive: u16) -> Vec<u8> {
    let mut b = str16("MQTT");
    b.push(level);
    b.push(0x02); // clean session
    b.extend_from_slice(&keep_alive.to_be_bytes());
    if level == 5 {
        b.push(0); // no properties
    }
    b.extend_from_slice(&str16(client_id));
    packet(0x10, &b)
}

fn publish_packet(level: u8, topic: &str, qos: u8, pkid: u16, payload: &str) -> Vec<u8> {
    let mut b = str16(topic);
    if qos > 0 {
        b.extend_from_slice(&pkid.to_be_bytes());
    }
    if level == 5 {
        b.push(0);
    }
    b.extend_from_slice(payload.as_bytes());
    packet(0x30 | (qos << 1), &b)
}

fn subscribe_packet(pkid: u16, filters: &[(&str, u8)]) -> Vec<u8> {
    let mut b = pkid.to_be_bytes().to_vec();
    for (f, q) in filters {
        b.extend_from_slice(&str16(f));
        b.push(*q);
    }
    packet(0x82, &b)
}

/// A raw TCP client with bounded reads.
struct Raw(TcpStream);

impl Raw {
    fn connect(port: u16) -> Self {
        let s = TcpStream::connect(("127.0.0.1", port)).expect("connect to the gateway");
        s.set_read_timeout(Some(WAIT)).unwrap();
        Self(s)
    }

    /// Connects and completes CONNECT/CONNACK at `level` (4: 3.1.1, 5).
    fn session(port: u16, level: u8, client_id: &str) -> Self {
        let mut raw = Self::connect(port);
        raw.send(&connect(level, client_id, 60));
        let (kind, body) = raw.packet().expect("CONNACK");
        assert_eq!((kind, body[1]), (0x20, 0), "CONNACK accepted: {body:?}");
        raw
    }

    fn send(&mut self, bytes: &[u8]) {
        self.0.write_all(bytes).expect("write to the gateway");
    }

    /// The next packet (first byte, body); `None` when the gateway closed the connection.
    /// Panics when nothing comes within [`WAIT`].
    fn packet(&mut self) -> Option<(u8, Vec<u8>)> {
        let mut first = [0u8; 1];
        match self.0.read(&mut first) {
            Ok(0) => return None,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return None,
            Err(e) => panic!("no packet within {WAIT:?}: {e}"),
        }
        let (mut len, mut shift) = (0usize, 0);
        loop {
            let mut b = [0u8; 1];
            self.0.read_exact(&mut b).ok()?;
            len |= usize::from(b[0] & 0x7F) << shift;
            if b[0] & 0x80 == 0 {
                break;
            }
            shift += 7;
        }
        let mut body = vec![0u8; len];
        self.0.read_exact(&mut body).ok()?;
        Some((first[0], body))
    }

    /// Reads until the gateway closes the connection; the packets it sent before.
    fn until_closed(&mut self) -> Vec<(u8, Vec<u8>)> {
        let mut got = Vec::new();
        while let Some(p) = self.packet() {
            got.push(p);
            assert!(got.len() < 100, "the gateway keeps talking: {got:?}");
        }
        got
    }
}

fn pkid(body: &[u8]) -> u16 {
    u16::from_be_bytes([body[0], body[1]])
}

#[test]
fn both_levels_at_qos_0_and_1_reach_the_reply_topic() {
    let chain = ChainProcess::start(
        &spec(
            &func("up", "upper", "", ""),
            "  - mqtt: sensors/+/motion\n    mqtt_reply: lights/motion\n    sequence: [up]\n",
            "{ listen: 127.0.0.1:0 }",
        ),
        &[],
    );
    let port = mqtt_port(&chain);
    let v311 = Sub::start(port, "lights/#", &["-V", "mqttv311", "-q", "1"]);
    let v5 = Sub::start(port, "lights/motion", &["-V", "mqttv5"]);
    let mut sent = Vec::new();
    for version in ["mqttv311", "mqttv5"] {
        for qos in ["0", "1"] {
            let body = format!("motion {version} q{qos}");
            publish_ok(
                port,
                &[
                    "-V",
                    version,
                    "-q",
                    qos,
                    "-t",
                    "sensors/hall/motion",
                    "-m",
                    &body,
                ],
            );
            sent.push(body.to_uppercase());
        }
    }
    sent.sort();
    // Each subscriber gets every answer once, whatever level it speaks.
    let mut got311: Vec<String> = v311
        .take(4)
        .into_iter()
        .map(|m| m.strip_prefix("lights/motion|").unwrap().to_owned())
        .collect();
    got311.sort();
    assert_eq!(got311, sent);
    let mut got5: Vec<String> = v5
        .take(4)
        .into_iter()
        .map(|m| {
            // MQTT 5 answers carry the status as a user property.
            m.strip_prefix("lights/motion|")
                .and_then(|m| m.strip_suffix("|status:200|"))
                .unwrap_or_else(|| panic!("{m}"))
                .to_owned()
        })
        .collect();
    got5.sort();
    assert_eq!(got5, sent);
    // A topic no route matches runs nothing: QoS 1 is still acknowledged ("no matching
    // subscribers" in MQTT 5), and the next message is answered as before.
    publish_ok(
        port,
        &[
            "-V",
            "mqttv5",
            "-q",
            "1",
            "-t",
            "sensors/hall/door",
            "-m",
            "x",
        ],
    );
    publish_ok(
        port,
        &["-V", "mqttv311", "-q", "1", "-t", "nothing", "-m", "x"],
    );
    publish_ok(
        port,
        &["-q", "1", "-t", "sensors/yard/motion", "-m", "last"],
    );
    assert_eq!(v311.take(1), ["lights/motion|LAST"]);
    assert_eq!(chain.stop(), Some(0));
}

#[test]
fn mqtt5_response_topic_gets_the_answer_with_correlation_data() {
    let chain = ChainProcess::start(
        &spec(
            &func("up", "upper", "", ""),
            "  - mqtt: ask/#\n    sequence: [up]\n",
            "{ listen: 127.0.0.1:0 }",
        ),
        &[],
    );
    let port = mqtt_port(&chain);
    let sub = Sub::start(port, "replies/#", &["-V", "mqttv5"]);
    publish_ok(
        port,
        &[
            "-V",
            "mqttv5",
            "-q",
            "1",
            "-t",
            "ask/one",
            "-m",
            "first",
            "-D",
            "publish",
            "response-topic",
            "replies/1",
            "-D",
            "publish",
            "correlation-data",
            "req-17",
        ],
    );
    // No response topic and no mqtt_reply: the message runs, nobody hears of it.
    publish_ok(
        port,
        &["-V", "mqttv5", "-q", "1", "-t", "ask/two", "-m", "quiet"],
    );
    publish_ok(
        port,
        &[
            "-V",
            "mqttv5",
            "-t",
            "ask/three",
            "-m",
            "third",
            "-D",
            "publish",
            "response-topic",
            "replies/3",
        ],
    );
    assert_eq!(
        sub.take(2),
        [
            "replies/1|FIRST|status:200|req-17",
            "replies/3|THIRD|status:200|"
        ]
    );
    assert_eq!(chain.stop(), Some(0));
}

#[test]
fn a_function_reads_the_topic_it_was_published_on() {
    let chain = ChainProcess::start(
        &spec(
            &func(
                "where",
                "header",
                "TESTFN_HEADER: mqtt-topic",
                ", headers: [mqtt-topic]",
            ),
            "  - mqtt: rooms/+/temp\n    mqtt_reply: seen\n    sequence: [where]\n",
            "{ listen: 127.0.0.1:0 }",
        ),
        &[],
    );
    let port = mqtt_port(&chain);
    let sub = Sub::start(port, "seen", &["-V", "mqttv311"]);
    publish_ok(port, &["-t", "rooms/kitchen/temp", "-m", "21.5"]);
    assert_eq!(sub.take(1), vec!["seen|rooms/kitchen/temp".to_owned()]);
}

#[test]
fn a_function_error_arrives_as_its_message_with_its_status() {
    let chain = ChainProcess::start(
        &spec(
            &func("bad", "fail", "", ""),
            "  - mqtt: orders/#\n    mqtt_reply: orders-failed\n    sequence: [bad]\n",
            "{ listen: 127.0.0.1:0 }",
        ),
        &[],
    );
    let port = mqtt_port(&chain);
    let v311 = Sub::start(port, "orders-failed", &["-V", "mqttv311"]);
    let v5 = Sub::start(port, "orders-failed", &["-V", "mqttv5"]);
    publish_ok(
        port,
        &["-V", "mqttv311", "-q", "1", "-t", "orders/1", "-m", "o1"],
    );
    // MQTT 5: the PUBACK says the message failed, with the error line as reason string.
    let (code, out) = publish(
        port,
        &["-V", "mqttv5", "-q", "1", "-t", "orders/2", "-m", "o2"],
    );
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains("failed") && out.contains("refusing"),
        "mosquitto_pub reports the failed publish: {out}"
    );
    let error = |body: &str| format!("function 'bad': refusing \"{body}\"");
    assert_eq!(
        v311.take(2),
        [
            format!("orders-failed|{}", error("o1")),
            format!("orders-failed|{}", error("o2"))
        ]
    );
    assert_eq!(
        v5.take(2),
        [
            format!("orders-failed|{}|status:422|", error("o1")),
            format!("orders-failed|{}|status:422|", error("o2"))
        ]
    );
    assert_eq!(chain.stop(), Some(0));
}

#[test]
fn a_malformed_packet_closes_only_its_connection() {
    let chain = ChainProcess::start(
        &spec(
            &func("up", "upper", "", ""),
            "  - mqtt: sensors/+/motion\n    mqtt_reply: lights/motion\n    sequence: [up]\n",
            "{ listen: 127.0.0.1:0 }",
        ),
        &[],
    );
    let port = mqtt_port(&chain);
    let sub = Sub::start(port, "lights/motion", &[]);
    let mut good = Raw::session(port, 4, "good");

    // A reserved packet type after CONNECT.
    let mut bad = Raw::session(port, 4, "bad-type");
    bad.send(&[0xF0, 0x00]);
    assert!(bad.until_closed().is_empty());
    // A topic length beyond the packet.
    let mut bad = Raw::session(port, 4, "bad-length");
    bad.send(&[0x30, 0x03, 0x00, 0xC8, b'a']);
    assert!(bad.until_closed().is_empty());
    // A remaining length of five bytes.
    let mut bad = Raw::session(port, 4, "bad-varint");
    bad.send(&[0x30, 0xFF, 0xFF, 0xFF, 0xFF, 0x7F]);
    assert!(bad.until_closed().is_empty());
    // A packet far over the chain's size limit, refused from its header.
    let mut bad = Raw::session(port, 5, "too-big");
    bad.send(&[0x30, 0xFF, 0xFF, 0xFF, 0x7F]);
    let said = bad.until_closed();
    assert_eq!(said.len(), 1, "{said:?}");
    assert_eq!(
        (said[0].0, said[0].1[0]),
        (0xE0, 0x95),
        "DISCONNECT: packet too large"
    );
    // Not MQTT at all.
    let mut bad = Raw::connect(port);
    bad.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(bad.until_closed().is_empty());
    // MQTT 3.1 (protocol level 3) is refused with CONNACK 1.
    let mut old = Raw::connect(port);
    old.send(&connect(3, "old", 60));
    let said = old.until_closed();
    assert_eq!(said, [(0x20, vec![0, 1])]);
    // QoS 2: MQTT 5 is told "QoS not supported", 3.1.1 is closed.
    let mut q2 = Raw::session(port, 5, "qos2-v5");
    q2.send(&publish_packet(5, "sensors/a/motion", 2, 1, "x"));
    let said = q2.until_closed();
    assert_eq!(said.len(), 1, "{said:?}");
    assert_eq!((said[0].0, said[0].1[0]), (0xE0, 0x9B));
    let mut q2 = Raw::session(port, 4, "qos2-v311");
    q2.send(&publish_packet(4, "sensors/a/motion", 2, 1, "x"));
    assert!(q2.until_closed().is_empty());
    // No CONNECT at all, and a client silent beyond 1.5 x its keep-alive: both closed.
    let mut silent = Raw::connect(port);
    assert!(silent.until_closed().is_empty());
    let mut idle = Raw::connect(port);
    idle.send(&connect(4, "idle", 1));
    assert_eq!(idle.until_closed(), [(0x20, vec![0, 0])]);

    // The good connection lived through all of it.
    good.send(&[0xC0, 0x00]);
    assert_eq!(good.packet(), Some((0xD0, vec![])), "PINGRESP");
    good.send(&publish_packet(4, "sensors/raw/motion", 1, 7, "raw"));
    let (kind, body) = good.packet().expect("PUBACK");
    assert_eq!((kind, pkid(&body)), (0x40, 7));
    publish_ok(port, &["-t", "sensors/tool/motion", "-m", "tool"]);
    assert_eq!(
        sub.take(2),
        ["lights/motion|RAW", "lights/motion|TOOL"],
        "answers keep coming"
    );
    assert_eq!(chain.stop(), Some(0));
}

#[test]
fn requests_of_one_connection_run_side_by_side() {
    let functions = func("slow", "slow", "DELAY_MS: 1500", "") + &func("up", "upper", "", "");
    let chain = ChainProcess::start(
        &spec(
            &functions,
            "  - mqtt: slow/#\n    mqtt_reply: done/slow\n    sequence: [slow]\n  - mqtt: fast/#\n    mqtt_reply: done/fast\n    sequence: [up]\n",
            "{ listen: 127.0.0.1:0 }",
        ),
        &[],
    );
    let port = mqtt_port(&chain);
    let sub = Sub::start(port, "done/+", &[]);
    let mut raw = Raw::session(port, 4, "both");
    raw.send(&publish_packet(4, "slow/1", 1, 1, "slow"));
    raw.send(&publish_packet(4, "fast/1", 1, 2, "fast"));
    // The fast request does not wait behind the slow one of the same connection.
    let first = raw.packet().expect("PUBACK");
    let second = raw.packet().expect("PUBACK");
    assert_eq!((first.0, pkid(&first.1)), (0x40, 2));
    assert_eq!((second.0, pkid(&second.1)), (0x40, 1));
    assert_eq!(sub.take(2), ["done/fast|FAST", "done/slow|SLOW"]);
    assert_eq!(chain.stop(), Some(0));
}

#[test]
fn raw_subscribers_get_qos_1_at_most_unsubscribe_and_are_taken_over() {
    let chain = ChainProcess::start(
        &spec(
            &func("up", "upper", "", ""),
            "  - mqtt: in/#\n    mqtt_reply: out/x\n    sequence: [up]\n",
            "{ listen: 127.0.0.1:0 }",
        ),
        &[],
    );
    let port = mqtt_port(&chain);
    let watcher = Sub::start(port, "out/x", &[]);
    let mut raw = Raw::session(port, 4, "raw-sub");
    // QoS 2 is granted as 1; an invalid filter and a shared subscription are refused.
    raw.send(&subscribe_packet(
        3,
        &[
            ("out/+", 2),
            ("a/#/b", 0),
            ("$share/g/out/x", 0),
            ("out/#", 0),
        ],
    ));
    let (kind, body) = raw.packet().expect("SUBACK");
    assert_eq!(
        (kind, pkid(&body), &body[2..]),
        (0x90, 3, &[1u8, 0x80, 0x80, 0][..])
    );
    publish_ok(port, &["-t", "in/1", "-m", "one"]);
    // One delivery at the highest QoS of the matching filters, acknowledged by the client.
    let (kind, body) = raw.packet().expect("PUBLISH");
    assert_eq!(kind, 0x32, "QoS 1, no retain, no dup");
    let topic_len = usize::from(pkid(&body));
    assert_eq!(&body[2..2 + topic_len], b"out/x");
    let id = pkid(&body[2 + topic_len..]);
    assert_eq!(&body[4 + topic_len..], b"ONE");
    raw.send(&packet(0x40, &id.to_be_bytes()));
    assert_eq!(watcher.take(1), ["out/x|ONE"]);
    // Unsubscribed from both, it hears nothing more: its next packet answers its PINGREQ,
    // sent after the next answer was already out (the watcher saw it).
    let mut b = 4u16.to_be_bytes().to_vec();
    b.extend(str16("out/+"));
    b.extend(str16("out/#"));
    raw.send(&packet(0xA2, &b));
    let (kind, body) = raw.packet().expect("UNSUBACK");
    assert_eq!((kind, pkid(&body)), (0xB0, 4));
    publish_ok(port, &["-t", "in/2", "-m", "two"]);
    assert_eq!(watcher.take(1), ["out/x|TWO"]);
    raw.send(&[0xC0, 0x00]);
    assert_eq!(raw.packet(), Some((0xD0, vec![])));
    // A DISCONNECT ends the session quietly.
    raw.send(&[0xE0, 0x00]);
    assert!(raw.until_closed().is_empty());
    // A client id in use is taken over by the new connection; MQTT 5 tells the old why.
    let mut first = Raw::session(port, 5, "same-id");
    let mut second = Raw::session(port, 5, "same-id");
    let said = first.until_closed();
    assert_eq!(said.len(), 1, "{said:?}");
    assert_eq!(
        (said[0].0, said[0].1[0]),
        (0xE0, 0x8E),
        "session taken over"
    );
    second.send(&[0xC0, 0x00]);
    assert_eq!(second.packet(), Some((0xD0, vec![])));
    assert_eq!(chain.stop(), Some(0));
}

#[test]
fn connections_past_max_connections_wait_for_a_free_one() {
    let port = free_port();
    let chain = ChainProcess::start(
        &format!(
            "max_connections: 2\n{}",
            spec(
                &func("up", "upper", "", ""),
                "  - mqtt: in/#\n    mqtt_reply: out\n    sequence: [up]\n",
                "{ listen: 127.0.0.1:0 }",
            )
        ),
        &[
            "--gateway-threads",
            "1",
            "--mqtt",
            &format!("127.0.0.1:{port}"),
        ],
    );
    assert_eq!(
        mqtt_port(&chain),
        port,
        "--mqtt overrides the spec's address"
    );
    let mut first = Raw::session(port, 4, "one");
    let _second = Raw::session(port, 5, "two");
    let mut third = Raw::connect(port);
    third.send(&connect(4, "three", 60));
    third
        .0
        .set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let mut byte = [0u8; 1];
    let waited = third.0.read(&mut byte);
    assert!(
        matches!(&waited, Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut)),
        "the third connection is not served while two are open: {waited:?}"
    );
    third.0.set_read_timeout(Some(WAIT)).unwrap();
    first.send(&[0xE0, 0x00]);
    assert!(first.until_closed().is_empty());
    assert_eq!(
        third.packet(),
        Some((0x20, vec![0, 0])),
        "served once one closed"
    );
    third.send(&publish_packet(4, "in/x", 1, 5, "late"));
    let (kind, body) = third.packet().expect("PUBACK");
    assert_eq!((kind, pkid(&body)), (0x40, 5));
    assert_eq!(chain.stop(), Some(0));
}

/// Issue 30, finding 8: clients holding many deep filters made each answer cost a pass over
/// every level of every filter of every client. Topic names, response topics and filters
/// have at most 32 levels now (the refusals are checked here with their codes), and 100
/// clients with 64 filters of 32 levels each do not keep answers from their subscribers.
/// (That the work is bounded is counted in the gateway's unit tests, not timed here.)
#[test]
fn deep_topics_and_filters_are_refused_and_answers_still_flow() {
    let chain = ChainProcess::start(
        &spec(
            &func("up", "upper", "", ""),
            "  - mqtt: ask/#\n    sequence: [up]\n",
            "{ listen: 127.0.0.1:0 }",
        ),
        &[],
    );
    let port = mqtt_port(&chain);
    let levels = |n: usize, level: &str| vec![level; n].join("/");

    // SUBSCRIBE: 33 levels is refused (0x80), 32 is granted, in one packet.
    let mut raw = Raw::session(port, 4, "deep-sub");
    raw.send(&subscribe_packet(
        1,
        &[
            (&levels(33, "+"), 0),
            (&levels(32, "+"), 0),
            (&levels(33, "a"), 1),
        ],
    ));
    let (kind, body) = raw.packet().expect("SUBACK");
    assert_eq!((kind, &body[2..]), (0x90, &[0x80u8, 0, 0x80][..]));
    // PUBLISH on a topic of 33 levels: MQTT 5 is told "topic name invalid", 3.1.1 closed.
    let deep33 = format!("ask/{}", levels(32, "x"));
    let mut v5 = Raw::session(port, 5, "deep-pub-5");
    v5.send(&publish_packet(5, &deep33, 1, 1, "x"));
    let said = v5.until_closed();
    assert_eq!(said.len(), 1, "{said:?}");
    assert_eq!((said[0].0, said[0].1[0]), (0xE0, 0x90));
    let mut v4 = Raw::session(port, 4, "deep-pub-4");
    v4.send(&publish_packet(4, &deep33, 1, 1, "x"));
    assert!(v4.until_closed().is_empty());
    // A response topic of 33 levels, from mosquitto_pub: refused, not answered.
    let (code, out) = publish(
        port,
        &[
            "-V",
            "mqttv5",
            "-q",
            "1",
            "-t",
            "ask/one",
            "-m",
            "x",
            "-D",
            "publish",
            "response-topic",
            &levels(33, "r"),
        ],
    );
    // The broker hangs up (DISCONNECT 0x90): mosquitto_pub's QoS 1 publish then fails with
    // MOSQ_ERR_NO_CONN (4), not with a timeout or a crash.
    assert_eq!(code, Some(4), "mosquitto_pub: {out}");
    assert!(
        out.contains("not currently connected"),
        "mosquitto_pub: {out}"
    );

    // 100 clients holding 64 deep filters each (6,400 subscriptions of 32 levels).
    let mut holders = Vec::new();
    for c in 0..100 {
        let mut h = Raw::session(port, 4, &format!("holder-{c}"));
        let filters: Vec<String> = (0..64)
            .map(|i| format!("{}/f{i}", levels(31, "+")))
            .collect();
        let pairs: Vec<(&str, u8)> = filters.iter().map(|f| (f.as_str(), 0)).collect();
        h.send(&subscribe_packet(2, &pairs));
        let (kind, body) = h.packet().expect("SUBACK");
        assert_eq!((kind, &body[2..]), (0x90, &[0u8; 64][..]), "client {c}");
        holders.push(h);
    }
    // A subscriber with the deepest filter there is gets the answer on the deepest topic,
    // through the real clients.
    let topic32 = format!("replies/{}", levels(31, "y"));
    let sub = Sub::start(port, &levels(32, "+"), &["-V", "mqttv5"]);
    publish_ok(
        port,
        &[
            "-V",
            "mqttv5",
            "-q",
            "1",
            "-t",
            "ask/deep",
            "-m",
            "deep",
            "-D",
            "publish",
            "response-topic",
            &topic32,
        ],
    );
    assert_eq!(sub.take(1), [format!("{topic32}|DEEP|status:200|")]);
    // The holders matched none of it (their filters end in f0..f63).
    holders[0].send(&[0xC0, 0x00]);
    assert_eq!(
        holders[0].packet(),
        Some((0xD0, vec![])),
        "PINGRESP, no answer"
    );
    assert_eq!(chain.stop(), Some(0));
}

/// A `mosquitto` broker on `port`, its log (stderr) in `dir`.
struct Broker {
    _guard: ChildGuard,
    log: std::path::PathBuf,
}

impl Broker {
    fn start(dir: &TempDir, port: u16, run: u32) -> Self {
        let conf = dir.path().join(format!("mosquitto-{run}.conf"));
        std::fs::write(
            &conf,
            format!(
                "listener {port} 127.0.0.1\nallow_anonymous true\nlog_dest stderr\nlog_type all\n"
            ),
        )
        .unwrap();
        let log = dir.path().join(format!("mosquitto-{run}.log"));
        let file = std::fs::File::create(&log).unwrap();
        let child = Command::new("/usr/sbin/mosquitto")
            .arg("-c")
            .arg(&conf)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .expect("run /usr/sbin/mosquitto");
        Self {
            _guard: ChildGuard::new(child),
            log,
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until the gateway (client id `id`) subscribed to `n` filters.
    fn wait_subscribed(&self, id: &str, n: usize) {
        let ok = wait_until(WAIT, || {
            self.log()
                .lines()
                .filter(|l| l.contains(&format!(": {id} 1 ")))
                .count()
                >= n
        });
        assert!(
            ok,
            "the gateway did not subscribe at the broker:\n{}",
            self.log()
        );
    }
}

#[test]
fn subscribe_mode_through_a_real_broker_survives_its_restarts() {
    let dir = TempDir::new("mqtt-broker");
    let port = free_port();
    // The chain comes up first: the broker is away, the gateway keeps trying.
    let functions = func("up", "upper", "", "") + &func("bad", "fail", "", "");
    let chain = ChainProcess::start(
        &spec(
            &functions,
            "  - mqtt: sensors/+/motion\n    mqtt_reply: lights/motion\n    sequence: [up]\n  - mqtt: ask/#\n    sequence: [up]\n  - mqtt: orders/#\n    mqtt_reply: orders-failed\n    sequence: [bad]\n",
            &format!("{{ broker: 127.0.0.1:{port} }}"),
        ),
        &[],
    );
    assert!(
        chain
            .ready_line
            .contains(&format!("mqtt://127.0.0.1:{port} (subscribing)")),
        "{}",
        chain.ready_line
    );
    for run in 0..2 {
        let broker = Broker::start(&dir, port, run);
        broker.wait_subscribed("zerohop-mq", 3);
        let lights = Sub::start(port, "lights/motion", &["-V", "mqttv5"]);
        let replies = Sub::start(port, "replies/#", &["-V", "mqttv5"]);
        let failed = Sub::start(port, "orders-failed", &[]);
        publish_ok(
            port,
            &[
                "-q",
                "1",
                "-t",
                "sensors/hall/motion",
                "-m",
                &format!("run {run}"),
            ],
        );
        publish_ok(
            port,
            &["-V", "mqttv311", "-t", "sensors/yard/motion", "-m", "v311"],
        );
        publish_ok(
            port,
            &[
                "-V",
                "mqttv5",
                "-q",
                "1",
                "-t",
                "ask/1",
                "-m",
                "question",
                "-D",
                "publish",
                "response-topic",
                "replies/1",
                "-D",
                "publish",
                "correlation-data",
                "c-9",
            ],
        );
        publish_ok(port, &["-q", "1", "-t", "orders/7", "-m", "o7"]);
        let mut got = lights.take(2);
        got.sort();
        assert_eq!(
            got,
            [
                format!("lights/motion|RUN {run}|status:200|"),
                "lights/motion|V311|status:200|".to_owned()
            ]
        );
        assert_eq!(replies.take(1), ["replies/1|QUESTION|status:200|c-9"]);
        assert_eq!(
            failed.take(1),
            ["orders-failed|function 'bad': refusing \"o7\""]
        );
        // The broker goes away (killed, no goodbye); the next one is subscribed to again.
        drop(broker);
    }
    assert_eq!(chain.stop(), Some(0), "stops cleanly");
}
