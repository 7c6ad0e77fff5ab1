//! The spec's tests: every field, every error with its line and field, mutated specs.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::*;
use crate::plan::{JoinPolicy, StatePlan};

const HELLO: &str = "\
name: hello
pool: { slots: 64, slot_size: 8KiB }
timeout: 2s
functions:
  upper:   { command: [\"bin/upper\", \"-v\"], instances: 2, concurrency: 4 }
  exclaim:
    command: [/bin/exclaim]
    env: { MODE: loud, N: 3 }
    headers: [X-Trace]
    next: [upper]
    syscalls: [ptrace, setsid]
routes:
  - http: POST /hello
    sequence: [upper, exclaim]
";

fn err(yaml: &str) -> String {
    parse(Path::new("c.yaml"), yaml).unwrap_err().to_string()
}

#[test]
fn runtime_and_handler_expand_to_a_command() {
    let t = HELLO.replace(
        "  upper:   { command: [\"bin/upper\", \"-v\"], instances: 2, concurrency: 4 }",
        "  upper:   { runtime: python, handler: \"shouty.text:upper\" }",
    );
    let t = t.replace(
        "    command: [/bin/exclaim]",
        "    runtime: node\n    handler: js/bang.js:handle\n    interpreter: /usr/bin/node",
    );
    let s = parse(Path::new("/srv/c.yaml"), &t).unwrap();
    assert_eq!(
        s.functions[0].command,
        [
            "python3",
            "-m",
            "zerohop",
            "--path",
            "/srv",
            "shouty.text:upper"
        ]
    );
    assert_eq!(
        s.functions[1].command,
        [
            "/usr/bin/node",
            "-e",
            NODE_LOADER,
            "/srv/js/bang.js",
            "handle"
        ]
    );
    // A path without an export, relative to a spec in the current folder.
    let t = t.replace("js/bang.js:handle", "bang.js");
    let s = parse(Path::new("c.yaml"), &t).unwrap();
    let here = std::env::current_dir().unwrap();
    assert_eq!(
        s.functions[1].command[3],
        here.join("bang.js").display().to_string()
    );
    assert_eq!(s.functions[1].command.len(), 4);
    assert_eq!(s.functions[0].command[4], here.display().to_string());

    let py = "  upper:   { command: [\"bin/upper\", \"-v\"], instances: 2, concurrency: 4 }";
    for (with, expect) in [
        (
            "  upper: { runtime: ruby, handler: x }",
            "c.yaml:5: functions.upper.runtime: unknown runtime `ruby`; use python or node",
        ),
        (
            "  upper: { runtime: python }",
            "c.yaml:5: functions.upper.handler: missing",
        ),
        (
            "  upper: { runtime: python, handler: greet }",
            "c.yaml:5: functions.upper.handler: `greet` is not MODULE:FUNCTION",
        ),
        (
            "  upper: { runtime: python, handler: \"greet:1x\" }",
            "c.yaml:5: functions.upper.handler: `greet:1x` is not MODULE:FUNCTION",
        ),
        (
            "  upper: { runtime: python, handler: \"a:b\", command: [x] }",
            "c.yaml:5: functions.upper.command: give either `command` or `runtime`",
        ),
        (
            "  upper: { command: [x], handler: \"a:b\" }",
            "c.yaml:5: functions.upper.handler: only with `runtime`",
        ),
        (
            "  upper: { runtime: node, handler: \"\" }",
            "c.yaml:5: functions.upper.handler: empty",
        ),
    ] {
        let e = err(&HELLO.replace(py, with));
        assert!(e.starts_with(expect), "{with}: {e}");
    }
}

#[test]
fn a_data_folder_is_true_a_path_or_nothing() {
    assert_eq!(parse(Path::new("c.yaml"), HELLO).unwrap().data, None);
    let with = |v: &str| parse(Path::new("/srv/c.yaml"), &format!("{HELLO}data: {v}\n"));
    assert_eq!(with("true").unwrap().data, Some(DataSpec::Default));
    assert_eq!(with("false").unwrap().data, None);
    assert_eq!(
        with("/var/lib/x").unwrap().data,
        Some(DataSpec::At(PathBuf::from("/var/lib/x")))
    );
    assert_eq!(
        with("store").unwrap().data,
        Some(DataSpec::At(PathBuf::from("/srv/store"))),
        "relative to the spec's folder"
    );
    let e = with("3").unwrap_err().to_string();
    assert!(e.contains(": data: expected true"), "{e}");
    let e = with("\"\"").unwrap_err().to_string();
    assert!(e.contains(": data: expected true"), "{e}");
}

#[test]
fn scale_and_resources() {
    let s = parse(Path::new("c.yaml"), HELLO).unwrap();
    assert_eq!(s.functions[0].scale, ScaleSpec::fixed(2, 4));
    assert!(!s.functions[0].scale.scales());
    assert_eq!(s.functions[1].resources, ResourceSpec::default());
    let t = HELLO.replace(
        "    syscalls: [ptrace, setsid]\n",
        "    scale: { min: 0, max: 8, target: 3, cooldown: 5s }\n    \
             resources: { cpu: 500m, memory: 64MiB, pids: 32 }\n",
    );
    let ex = &parse(Path::new("c.yaml"), &t).unwrap().functions[1];
    let sc = ex.scale;
    assert_eq!(
        (sc.min, sc.max, sc.initial, sc.target, sc.parked),
        (0, 8, 1, 3, 1)
    );
    assert_eq!(ex.instances, 1, "comes up with one");
    assert_eq!(sc.cooldown, Duration::from_secs(5));
    assert_eq!(sc.zero_after, DEFAULT_ZERO_AFTER);
    assert!(sc.scales());
    assert_eq!(
        ex.resources,
        ResourceSpec {
            cpu_millis: Some(500),
            memory: Some(64 << 20),
            pids: Some(32)
        }
    );
    for (cpu, want) in [("0.25", Some(250)), ("2", Some(2000)), ("1.5", Some(1500))] {
        assert_eq!(parse_cpu(cpu), want, "{cpu}");
    }
    for bad in ["0", "5m", "-1", "x", "2000", "nan"] {
        assert_eq!(parse_cpu(bad), None, "{bad}");
    }
    // `instances` beside `scale` is the initial count, within the bounds.
    let t2 = HELLO.replace(
        "instances: 2, concurrency: 4",
        "instances: 3, scale: { max: 4 }",
    );
    let up = &parse(Path::new("c.yaml"), &t2).unwrap().functions[0];
    assert_eq!((up.instances, up.scale.min, up.scale.max), (3, 1, 4));
    for (from, to, want) in [
        (
            "instances: 2, concurrency: 4",
            "instances: 9, scale: { max: 4 }",
            "outside scale's min 1 and max 4",
        ),
        (
            "instances: 2, concurrency: 4",
            "scale: { min: 3, max: 2 }",
            "functions.upper.scale.max: max (2) is below min (3)",
        ),
        (
            "instances: 2, concurrency: 4",
            "scale: { mx: 2 }",
            "functions.upper.scale.mx",
        ),
        (
            "instances: 2, concurrency: 4",
            "resources: { cpu: lots }",
            "`lots` is not a CPU amount",
        ),
        (
            "instances: 2, concurrency: 4",
            "resources: { memory: 1KiB }",
            "at least 4MiB",
        ),
    ] {
        let e = err(&HELLO.replace(from, to));
        assert!(e.contains(want), "{to}: {e}");
        assert!(e.starts_with("c.yaml:5:"), "{e}");
    }
}

#[test]
fn parses_every_field() {
    let s = parse(Path::new("dir/c.yaml"), HELLO).unwrap();
    assert_eq!(s.name, "hello");
    assert_eq!(s.transport, "ring");
    assert_eq!(
        s.pool,
        PoolSpec {
            slots: 64,
            slot_size: 8192,
            hugepages: false,
            large_slots: DEFAULT_LARGE_SLOTS,
        }
    );
    assert_eq!(s.max_body, DEFAULT_MAX_BODY);
    assert_eq!(s.timeout, Duration::from_secs(2));
    assert_eq!(s.gateway_threads, None, "auto by default");
    for (text, want) in [("auto", None), ("3", Some(3))] {
        let t = HELLO.replace("timeout: 2s", &format!("gateway_threads: {text}"));
        assert_eq!(
            parse(Path::new("c.yaml"), &t).unwrap().gateway_threads,
            want
        );
    }
    assert!(s.cpus.is_empty(), "anywhere by default");
    for (text, want) in [
        ("\"0-2,5\"", vec![0, 1, 2, 5]),
        ("[3, 1]", vec![1, 3]),
        ("7", vec![7]),
    ] {
        let t = HELLO.replace("timeout: 2s", &format!("cpus: {text}"));
        let read = parse(Path::new("c.yaml"), &t).unwrap();
        assert_eq!(read.cpus, want, "{text}");
        assert_eq!(plan_from_spec(&read, "ring", 0, 2).cpus, want);
    }
    let up = &s.functions[0];
    assert_eq!(up.command, vec!["dir/bin/upper".to_owned(), "-v".into()]);
    assert_eq!((up.instances, up.concurrency, up.line), (2, 4, 5));
    let ex = &s.functions[1];
    assert_eq!(ex.command, vec!["/bin/exclaim".to_owned()]);
    assert_eq!(
        ex.env,
        vec![("MODE".into(), "loud".into()), ("N".into(), "3".into())]
    );
    assert_eq!(ex.headers, vec!["x-trace".to_owned()]);
    assert_eq!(ex.next, vec!["upper".to_owned()]);
    assert_eq!(ex.syscalls, vec!["ptrace".to_owned(), "setsid".to_owned()]);
    assert!(up.syscalls.is_empty());
    assert_eq!(s.routes.len(), 1);
    assert_eq!(
        (s.routes[0].method.as_str(), s.routes[0].path.as_str()),
        ("POST", "/hello")
    );
    assert_eq!(s.routes[0].sequence, vec!["upper", "exclaim"]);
}

#[test]
fn static_fan_out_and_state() {
    let t = HELLO
        .replace(
            "[upper, exclaim]",
            "[{ fan_out: [upper], join: exclaim, on_error: join }]",
        )
        .replace("    next: [upper]\n", "    state: true\n")
        + "state: { entries: 100, value_size: 1KiB }\n";
    let s = parse(Path::new("c.yaml"), &t).unwrap();
    let ex = &s.functions[1];
    assert_eq!(s.routes[0].sequence, vec!["exclaim"]);
    assert_eq!(ex.fan_out, vec!["upper"]);
    assert_eq!(ex.calls, vec!["upper"], "branches are calls of the join");
    assert_eq!(ex.join, JoinPolicy::Join);
    assert!(ex.state && !s.functions[0].state);
    assert_eq!(
        s.state,
        Some(StatePlan {
            entries: 100,
            value_size: 1024
        })
    );
    let cases = [
        (
            t.replace("join: exclaim", "join: upper"),
            "c.yaml:14: routes[0].sequence[0].join: the join cannot also be a branch",
        ),
        (
            t.replace("join: exclaim", "join: nobody"),
            "c.yaml:14: routes[0].sequence[0].join: unknown function `nobody`",
        ),
        (
            t.replace("fan_out: [upper]", "fan_out: []"),
            "c.yaml:14: routes[0].sequence[0].fan_out: empty",
        ),
        (
            t.replace("fan_out: [upper]", "fan_out: [upper, upper]"),
            "c.yaml:14: routes[0].sequence[0].fan_out[1]: `upper` is named twice",
        ),
        (
            t.replace("on_error: join", "on_error: maybe"),
            "c.yaml:14: routes[0].sequence[0].on_error: `maybe` is no policy",
        ),
        (
            t.replace("on_error: join", "policy: join"),
            "c.yaml:14: routes[0].sequence[0].policy: unknown field",
        ),
        (
            t.replace("state: { entries: 100, value_size: 1KiB }\n", ""),
            "c.yaml:6: functions.exclaim.state: the chain has no `state` section",
        ),
        (
            t.replace("    state: true\n", ""),
            "c.yaml:14: state: no function has `state: true`",
        ),
        (
            t.replace("entries: 100", "entries: 0"),
            "c.yaml:15: state.entries: 0 is out of range",
        ),
        (
            t.replace("1KiB", "2MiB"),
            "c.yaml:15: state.value_size: 2097152 bytes; a value may be 1 byte to 1MiB",
        ),
        // A branch calling its join back is a cycle.
        (
            t.replace(
                "  upper:   { command: [\"bin/upper\", \"-v\"],",
                "  upper:   { calls: [exclaim], command: [\"bin/upper\", \"-v\"],",
            ),
            "c.yaml:5: functions.upper.calls: calls form a cycle (upper -> exclaim -> upper)",
        ),
    ];
    for (yaml, want) in cases {
        let got = err(&yaml);
        assert!(got.starts_with(want), "got {got:?}\nwant {want:?}");
    }
}

#[test]
fn mqtt_and_coap_triggers() {
    let t = HELLO.replace(
            "  - http: POST /hello\n",
            "  - http: POST /hello\n    mqtt: sensors/+/motion\n    mqtt_reply: lights/1\n    coap: /motion\n",
        ) + "mqtt: { listen: 127.0.0.1:0 }\ncoap: { listen: \"127.0.0.1:5683\" }\n";
    let s = parse(Path::new("c.yaml"), &t).unwrap();
    let r = &s.routes[0];
    assert_eq!(
        (r.mqtt.as_str(), r.mqtt_reply.as_str(), r.coap.as_str()),
        ("sensors/+/motion", "lights/1", "/motion")
    );
    assert_eq!(
        s.mqtt,
        Some(MqttSpec::Listen("127.0.0.1:0".parse().unwrap()))
    );
    assert_eq!(s.coap, Some("127.0.0.1:5683".parse().unwrap()));
    // A route with no HTTP trigger is fine when it has another.
    let only = t.replace("  - http: POST /hello\n    mqtt", "  - mqtt");
    assert_eq!(
        parse(Path::new("c.yaml"), &only).unwrap().routes[0].path,
        ""
    );
    let broker = t.replace("{ listen: 127.0.0.1:0 }", "{ broker: \"localhost:1883\" }");
    assert_eq!(
        parse(Path::new("c.yaml"), &broker).unwrap().mqtt,
        Some(MqttSpec::Broker {
            addr: "localhost:1883".into(),
            client_id: "zerohop-hello".into()
        })
    );
    let cases = [
            (t.replace("sensors/+/motion", "sensors/x+/motion"), "c.yaml:14: routes[0].mqtt: `sensors/x+/motion` is not an MQTT topic filter: `+` stands for a whole level"),
            (t.replace("sensors/+/motion", "sensors/#/motion"), "c.yaml:14: routes[0].mqtt: `sensors/#/motion` is not an MQTT topic filter: `#` stands for the whole last level"),
            (t.replace("sensors/+/motion", &["s"; 33].join("/")), "c.yaml:14: routes[0].mqtt: `s/s/s/s/s/s/s/s/s/s/s/s/s/s/s/s/s/s/s/s/s/s/s/s/s/s/s/s/s/s/s/s/s` is not an MQTT topic filter: it has more than 32 levels"),
            (t.replace("lights/1", &["l"; 33].join("/")), "c.yaml:15: routes[0].mqtt_reply: `l/l/l/l/l/l/l/l/l/l/l/l/l/l/l/l/l/l/l/l/l/l/l/l/l/l/l/l/l/l/l/l/l` is not an MQTT topic name: it has more than 32 levels"),
            (t.replace("lights/1", "lights/+"), "c.yaml:15: routes[0].mqtt_reply: `lights/+` is not an MQTT topic name: a topic name has no wildcards"),
            (t.replace("coap: /motion", "coap: motion"), "c.yaml:16: routes[0].coap: `motion` is not a CoAP path"),
            (t.replace("mqtt: { listen: 127.0.0.1:0 }\n", ""), "c.yaml:13: mqtt: a route has an `mqtt` topic but the chain has no `mqtt` section"),
            (t.replace("coap: { listen: \"127.0.0.1:5683\" }\n", ""), "c.yaml:13: coap: a route has a `coap` path but the chain has no `coap` section"),
            (t.replace("{ listen: 127.0.0.1:0 }", "{ listen: localhost }"), "c.yaml:18: mqtt.listen: `localhost` is not IP:PORT"),
            (t.replace("{ listen: 127.0.0.1:0 }", "{ broker: nowhere }"), "c.yaml:18: mqtt.broker: `nowhere` is not HOST:PORT"),
            (t.replace("{ listen: 127.0.0.1:0 }", "{ listen: 127.0.0.1:0, broker: \"a:1\" }"), "c.yaml:18: mqtt: set exactly one of"),
            (t.replace("{ listen: 127.0.0.1:0 }", "{ listen: 127.0.0.1:0, client_id: me }"), "c.yaml:18: mqtt.client_id: only for `broker`"),
            (HELLO.to_owned() + "coap: { listen: 127.0.0.1:0 }\n", "c.yaml:15: coap: no route has a `coap` path"),
            (HELLO.replace("  - http: POST /hello\n", "  - sequence: [upper]\n  - http: POST /hello\n"), "c.yaml:13: routes[0]: a route needs a way in"),
            (HELLO.replace("    sequence: [upper, exclaim]", "    mqtt_reply: a\n    sequence: [upper, exclaim]"), "c.yaml:14: routes[0].mqtt_reply: a reply topic needs an `mqtt` topic filter"),
        ];
    for (yaml, want) in cases {
        let got = err(&yaml);
        assert!(got.starts_with(want), "got {got:?}\nwant {want:?}");
    }
}

#[test]
fn http_routes_take_parameters_a_catch_all_and_pseudo_headers() {
    let t = HELLO
        .replace("POST /hello", "GET /product/{id}")
        .replace("[X-Trace]", "[X-Trace, \":path\", \":query\", Cookie]");
    let t = format!("{t}  - http: GET /static/*\n    sequence: [upper]\n  - http: GET /product/top\n    sequence: [upper]\n");
    let s = parse(Path::new("c.yaml"), &t).unwrap();
    let paths: Vec<&str> = s.routes.iter().map(|r| r.path.as_str()).collect();
    assert_eq!(paths, ["/product/{id}", "/static/{*rest}", "/product/top"]);
    assert_eq!(
        s.functions[1].headers,
        ["x-trace", ":path", ":query", "cookie"]
    );
}

#[test]
fn routes_take_auth_and_rate_limits() {
    let t = HELLO.replace(
        "  - http: POST /hello\n",
        "  - http: POST /hello\n    auth: { jwt: { jwks: keys/jwks.json, issuer: https://id, audience: shop, algorithms: [EdDSA], leeway: 5s, scopes: [write] } }\n    rate_limit: { requests: 10, per: 1m, burst: 3, per_client: true }\n    sequence: [upper, exclaim]\n  - http: GET /hello\n    auth: { api_keys: keys.txt }\n    rate_limit: { requests: 5 }\n",
    );
    let s = parse(Path::new("/srv/c.yaml"), &t).unwrap();
    assert_eq!(
        s.routes[0].auth,
        Some(AuthSpec::Jwt(JwtSpec {
            jwks: JwksSource::File("/srv/keys/jwks.json".into()),
            issuer: Some("https://id".into()),
            audience: Some("shop".into()),
            algorithms: vec!["EdDSA".into()],
            leeway: Duration::from_secs(5),
            scopes: vec!["write".into()],
        }))
    );
    assert_eq!(
        s.routes[0].rate_limit,
        Some(RateLimitSpec {
            requests: 10,
            per: Duration::from_secs(60),
            burst: 3,
            per_client: true
        })
    );
    assert_eq!(
        s.routes[1].auth,
        Some(AuthSpec::ApiKeys {
            file: "/srv/keys.txt".into(),
            header: "x-api-key".into()
        })
    );
    assert_eq!(
        s.routes[1].rate_limit,
        Some(RateLimitSpec {
            requests: 5,
            per: Duration::from_secs(1),
            burst: 5,
            per_client: false
        })
    );
}

#[test]
fn errors_name_line_and_field() {
    let cases = [
            (HELLO.replace("timeout: 2s", "timeot: 2s"), "c.yaml:3: timeot: unknown field"),
            // Found by the `spec` fuzz target: an empty key named no field at all.
            (HELLO.replace("timeout: 2s", "\"\": 2s"), "c.yaml:3: \"\": unknown field"),
            (HELLO.replace("env: { MODE: loud, N: 3 }", "env: { \"\": v }"), "c.yaml:8: functions.exclaim.env.\"\": not a usable variable name"),
            (HELLO.replace("timeout: 2s", "timeout: soon"), "c.yaml:3: timeout: `soon` is not a duration"),
            (HELLO.replace("timeout: 2s", "body_timeout: 5ms"), "c.yaml:3: body_timeout: must be between 10ms and 1h"),
            (HELLO.replace("timeout: 2s", "max_connections: 0"), "c.yaml:3: max_connections: 0 is out of range"),
            (HELLO.replace("timeout: 2s", "gateway_threads: 65"), "c.yaml:3: gateway_threads: 65 is out of range; use 1 to 64"),
            (HELLO.replace("timeout: 2s", "cpus: \"3-1\""), "c.yaml:3: cpus: the range `3-1` runs backwards; write `1-3`"),
            (HELLO.replace("timeout: 2s", "cpus: [0, 5000]"), "c.yaml:3: cpus[1]: 5000 is out of range; use 0 to 4095"),
            (HELLO.replace("timeout: 2s", "cpus: []"), "c.yaml:3: cpus: names no CPU"),
            (HELLO.replace("timeout: 2s", "cpus: { a: 1 }"), "c.yaml:3: cpus: expected a CPU list such as `0-3,8`"),
            (HELLO.replace("timeout: 2s", "gateway_threads: many"), "c.yaml:3: gateway_threads: expected `auto` or a number of threads from 1 to 64"),
            (HELLO.replace("instances: 2", "instances: two"), "c.yaml:5: functions.upper.instances: expected a whole number, found a string"),
            (HELLO.replace("instances: 2", "instances: 0"), "c.yaml:5: functions.upper.instances: 0 is out of range"),
            (HELLO.replace("[ptrace, setsid]", "[ptrace, ptracee]"), "c.yaml:11: functions.exclaim.syscalls[1]: unknown system call `ptracee`"),
            (HELLO.replace("[ptrace, setsid]", "ptrace"), "c.yaml:11: functions.exclaim.syscalls: expected a list"),
            (HELLO.replace("[upper, exclaim]", "[upper, shout]"), "c.yaml:14: routes[0].sequence[1]: unknown function `shout`; known functions: upper, exclaim"),
            (HELLO.replace("next: [upper]", "next: [nobody]"), "c.yaml:10: functions.exclaim.next[0]: unknown function `nobody`"),
            (HELLO.replace("    command: [/bin/exclaim]\n", ""), "c.yaml:6: functions.exclaim.command: missing"),
            (HELLO.replace("[/bin/exclaim]", "[]"), "c.yaml:7: functions.exclaim.command: empty"),
            (HELLO.replace("POST /hello", "post hello"), "c.yaml:13: routes[0].http: `post hello` is not `METHOD /path`"),
            (HELLO.replace("slot_size: 8KiB", "slot_size: 8 lots"), "c.yaml:2: pool.slot_size: `8 lots` is not a size"),
            (HELLO.replace("slot_size: 8KiB", "slot_size: 1000"), "c.yaml:2: pool.slot_size: must be a multiple of 64"),
            (HELLO.replace("timeout: 2s", "max_body: 4GiB"), "c.yaml:3: max_body: 4294967296 bytes; a request body may be at most 3GiB"),
            (HELLO.replace("{ slots: 64,", "{ slots: 64, large_slots: 1025,"), "c.yaml:2: pool.large_slots: 1025 is out of range"),
            (HELLO.replace("timeout: 2s", "max_body: 1MiB").replace("{ slots: 64,", "{ slots: 64, large_slots: 0,"), "c.yaml:3: max_body: max_body (1048576 bytes) does not fit a slot of 8192 bytes (7136 bytes after the slot header and the 1024-byte metadata area) and pool.large_slots is 0"),
            (HELLO.replace("{ slots: 64,", "{ slots: 64, large_slots: 0,"), "c.yaml:2: pool.large_slots: max_body (67108864 bytes, the default) does not fit a slot of 8192 bytes"),
            (HELLO.replace("name: hello", "name: hello world"), "c.yaml:1: name: a chain name is"),
            (HELLO.replace("name: hello\n", ""), "c.yaml:1: name: missing"),
            (HELLO.replace("timeout: 2s", "transport: carrier-pigeon"), "c.yaml:3: transport: unknown transport `carrier-pigeon`; use one of: ring, socket, poll, sockmap"),
            (HELLO.replace("env: { MODE: loud, N: 3 }", "env: [MODE]"), "c.yaml:8: functions.exclaim.env: expected a mapping"),
            (HELLO.replace("{ slots: 64,", "{ slots: 64, hugepages: maybe,"), "c.yaml:2: pool.hugepages: expected true or false"),
            (format!("{HELLO}  - http: POST /hello\n    sequence: [upper]\n"), "c.yaml:15: routes[1].http: `POST /hello` is already routed"),
            (format!("{HELLO}  - http: POST /{{name}}\n    sequence: [upper]\n  - http: POST /{{who}}\n    sequence: [upper]\n"), "c.yaml:17: routes[2].http: `POST /{who}` cannot be told apart from an earlier route"),
            (HELLO.replace("POST /hello", "GET /product/{id}/{id}"), "c.yaml:13: routes[0].http: `/product/{id}/{id}` is not a route path: parameter `id` appears twice"),
            (HELLO.replace("POST /hello", "GET /static/*/x"), "c.yaml:13: routes[0].http: `/static/*/x` is not a route path: `*` matches the rest"),
            (HELLO.replace("POST /hello", "GET /hello?x=1"), "c.yaml:13: routes[0].http: `/hello?x=1` is not a route path: `?` has no place"),
            (HELLO.replace("[X-Trace]", "[\":cookie\"]"), "c.yaml:9: functions.exclaim.headers[0]: `:cookie` is not an HTTP header name, nor one of :path, :query, :client, :claim.NAME"),
            (HELLO.replace("POST /hello", "POST /hello\n    auth: { jwt: { jwks: k.json, algorithms: [HS256] } }"), "c.yaml:14: routes[0].auth.jwt.algorithms[0]: `HS256` is not an algorithm the gateway verifies"),
            (HELLO.replace("POST /hello", "POST /hello\n    auth: { jwt: { issuer: x } }"), "c.yaml:14: routes[0].auth.jwt.jwks: missing"),
            (HELLO.replace("POST /hello", "POST /hello\n    auth: {}"), "c.yaml:14: routes[0].auth: name one way to authenticate"),
            (HELLO.replace("POST /hello", "POST /hello\n    auth: { api_keys: k.txt, header: \"x y\" }"), "c.yaml:14: routes[0].auth.header: `x y` is not an HTTP header name"),
            (HELLO.replace("POST /hello", "POST /hello\n    rate_limit: { requests: 0 }"), "c.yaml:14: routes[0].rate_limit.requests: 0 is out of range"),
            (HELLO.replace("POST /hello", "POST /hello\n    rate_limit: { requests: 5, per: 2d }"), "c.yaml:14: routes[0].rate_limit.per: `2d` is not a duration"),
            (HELLO.replace("[upper, exclaim]", "[upper]"), "c.yaml:6: functions.exclaim: no route reaches this function"),
            ("name: x\nfunctions: {\n".into(), "c.yaml:3: (yaml): not valid YAML"),
            ("".into(), "c.yaml:1: (spec): the spec is empty"),
            ("- a\n".into(), "c.yaml:1: (spec): expected a mapping"),
        ];
    for (yaml, want) in cases {
        let got = err(&yaml);
        assert!(got.starts_with(want), "want {want:?}\n got {got:?}");
    }
}

/// A cheap stand-in for a fuzzer: thousands of mutated specs never panic, and every
/// error still names the file and a line.
#[test]
fn mutated_specs_never_panic_and_errors_stay_located() {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut rnd = |n: usize| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x % n as u64) as usize
    };
    let alphabet: Vec<char> = "{}[]:,-#&*!|>'\"\n x0aZ9%@`\t".chars().collect();
    let (mut ok, mut bad) = (0, 0);
    for _ in 0..20_000 {
        let mut text: Vec<char> = HELLO.chars().collect();
        for _ in 0..1 + rnd(4) {
            let at = rnd(text.len() + 1).min(text.len());
            match rnd(3) {
                0 if at < text.len() => {
                    text.remove(at);
                }
                1 => text.insert(at, alphabet[rnd(alphabet.len())]),
                _ => {
                    let from = rnd(text.len());
                    let to = (from + rnd(20)).min(text.len());
                    let chunk: Vec<char> = text[from..to].to_vec();
                    text.splice(at..at, chunk);
                }
            }
        }
        let text: String = text.into_iter().collect();
        match parse(Path::new("c.yaml"), &text) {
            Ok(_) => ok += 1,
            Err(e) => {
                bad += 1;
                assert_eq!(e.file, "c.yaml");
                assert!(
                    e.line >= 1 && e.line <= text.lines().count() + 1,
                    "line {} out of range for {text:?}: {e}",
                    e.line
                );
                assert!(!e.field.is_empty() && !e.message.is_empty(), "{e}");
            }
        }
    }
    assert!(
        ok > 0 && bad > 0,
        "mutations exercised both paths: {ok} ok, {bad} errors"
    );
}

#[test]
fn sizes_and_durations() {
    assert_eq!(parse_size("65536"), Some(65536));
    assert_eq!(parse_size("64KiB"), Some(65536));
    assert_eq!(parse_size("2 MiB"), Some(2 << 20));
    assert_eq!(parse_size("1G"), Some(1 << 30));
    assert_eq!(parse_size("12 parsecs"), None);
    assert_eq!(parse_size("99999999999999999999GiB"), None);
    assert_eq!(parse_duration("500ms"), Some(Duration::from_millis(500)));
    assert_eq!(parse_duration("2m"), Some(Duration::from_secs(120)));
    assert_eq!(parse_duration("10"), None);
    assert_eq!(parse_duration("s"), None);
}

const CALLS: &str = "\
name: shop
functions:
  front: { command: [/bin/f], calls: [cart, price] }
  cart: { command: [/bin/c], calls: [price] }
  price: { command: [/bin/p] }
routes:
  - http: GET /
    sequence: [front]
";

#[test]
fn calls_reach_functions_and_must_not_cycle() {
    let s = parse(Path::new("c.yaml"), CALLS).unwrap();
    assert_eq!(s.functions[0].calls, vec!["cart", "price"]);
    assert_eq!(s.functions[1].calls, vec!["price"]);
    assert!(err(&CALLS.replace("calls: [price] }", "calls: [nope] }"))
        .starts_with("c.yaml:4: functions.cart.calls[0]: unknown function `nope`"));
    assert!(err(&CALLS.replace("calls: [price] }", "calls: [cart] }"))
        .starts_with("c.yaml:4: functions.cart.calls[0]: a function cannot call itself"));
    let cycle = err(&CALLS.replace(
        "price: { command: [/bin/p] }",
        "price: { command: [/bin/p], calls: [front] }",
    ));
    assert!(
        cycle.starts_with(
            "c.yaml:3: functions.front.calls: calls form a cycle (front -> cart -> price -> front)"
        ),
        "{cycle}"
    );
    // Reached only by a call: fine; reached by nothing: refused.
    let orphan = err(&CALLS.replace("calls: [cart, price]", "calls: [price]"));
    assert!(
        orphan.contains("functions.cart: no route reaches"),
        "{orphan}"
    );
}

#[test]
fn grpc_routes_are_post_routes_of_their_method() {
    let t = HELLO.replace(
        "  - http: POST /hello\n",
        "  - grpc: helloworld.v1.Greeter/SayHello\n    sequence: [upper]\n  - http: POST /hello\n",
    );
    let s = parse(Path::new("c.yaml"), &t).unwrap();
    let r = &s.routes[0];
    assert_eq!(r.grpc, "helloworld.v1.Greeter/SayHello");
    assert_eq!(
        (r.method.as_str(), r.path.as_str()),
        ("POST", "/helloworld.v1.Greeter/SayHello")
    );
    let plan = plan_from_spec(&s, "ring", 0, 1);
    assert!(plan.routes[0].grpc);
    assert!(!plan.routes[1].grpc);
}

#[test]
fn grpc_route_errors_name_line_and_field() {
    // The routes after `routes:` (line 12): the first at line 13.
    let routes = |list: &str| {
        err(&HELLO.replace(
            "  - http: POST /hello\n    sequence: [upper, exclaim]\n",
            list,
        ))
    };
    for (entry, want) in [
        (
            "  - grpc: Greeter/SayHello\n",
            "c.yaml:15: routes[1].grpc: `Greeter/SayHello` is not a gRPC method: the service has \
             no package",
        ),
        (
            "  - grpc: a.Greeter\n",
            "c.yaml:15: routes[1].grpc: `a.Greeter` is not a gRPC method: it has no `/`",
        ),
        (
            "  - grpc: a.Greeter/Say-Hello\n",
            "the method is one identifier",
        ),
        ("  - grpc: a..Greeter/SayHello\n", "dotted identifiers"),
        (
            "  - grpc: a.Greeter/SayHello\n    http: POST /x\n",
            "c.yaml:15: routes[1].grpc: a route has `http` or `grpc`, not both",
        ),
        (
            "  - grpc: a.Greeter/SayHello\n    content_type: text/plain\n",
            "c.yaml:16: routes[1].content_type: only HTTP answers carry a content type (gRPC's",
        ),
    ] {
        let e = routes(&format!(
            "  - http: POST /hello\n    sequence: [upper]\n{entry}    sequence: [upper]\n"
        ));
        assert!(e.contains(want), "{entry}: {e}");
    }
    // Two routes of one method, and a gRPC method an `http` route already takes.
    let e = routes(
        "  - grpc: a.G/M\n    sequence: [upper]\n  - grpc: a.G/M\n    sequence: [exclaim]\n",
    );
    assert!(
        e.contains(
            "c.yaml:15: routes[1].grpc: gRPC method `a.G/M` is already routed by an earlier route"
        ),
        "{e}"
    );
    let e = routes(
        "  - http: POST /a.G/M\n    sequence: [upper]\n  - grpc: a.G/M\n    sequence: [upper]\n",
    );
    assert!(
        e.contains("c.yaml:15: routes[1].grpc:") && e.contains("(routes[0])"),
        "{e}"
    );
}

#[test]
fn a_max_body_beyond_a_slot_gets_a_large_pool_per_domain() {
    let plan = |yaml: &str| {
        let s = parse(Path::new("c.yaml"), yaml).unwrap();
        crate::plan_from_spec(&s, "ring", 0, 1)
    };
    // The default max_body (64 MiB) is beyond an 8 KiB slot: 16 large slots of 64 MiB and
    // the slot header and metadata reserve, rounded up to a page.
    let p = plan(HELLO);
    assert_eq!(
        (p.pool.large_slots, p.pool.large_slot_size),
        (16, (64 << 20) + 4096)
    );
    let small = p.pool_geometry(0).unwrap();
    let large = p.large_pool_geometry(0).unwrap();
    assert_eq!(
        (small.first_slot, small.slots, small.release),
        (0, 64, false)
    );
    assert_eq!(
        (
            large.first_slot,
            large.slots,
            large.slot_size,
            large.release,
            large.hugepages
        ),
        (64, 16, (64 << 20) + 4096, true, false)
    );
    assert_eq!(p.pool_geometries(0).unwrap(), vec![small, large]);
    // Domain 1 starts after domain 0's small and large slots.
    assert_eq!(p.pool_geometry(1).unwrap().first_slot, 80);
    assert_eq!(p.large_pool_geometry(1).unwrap().first_slot, 144);
    // A body that fits a slot needs no large pool, whatever large_slots says.
    let fits = plan(&HELLO.replace("timeout: 2s", "max_body: 7136"));
    assert_eq!((fits.pool.large_slots, fits.pool.large_slot_size), (0, 0));
    assert!(fits.large_pool_geometry(0).is_none());
    assert_eq!(fits.pool_geometries(0).unwrap().len(), 1);
    assert_eq!(fits.pool_geometry(1).unwrap().first_slot, 64);
    // One byte more, and a large pool of the size asked for.
    let one_more = plan(
        &HELLO
            .replace("timeout: 2s", "max_body: 7137")
            .replace("{ slots: 64,", "{ slots: 64, large_slots: 2,"),
    );
    assert_eq!(
        (one_more.pool.large_slots, one_more.pool.large_slot_size),
        (2, 12288),
        "7137 + 32 + 1024 bytes, in whole pages"
    );
    // The largest max_body still gives a slot size in u32.
    let huge = plan(&HELLO.replace("timeout: 2s", "max_body: 3GiB"));
    assert_eq!(huge.pool.large_slot_size, (3 << 30) + 4096);
    // A plan without the new fields (an older agent's JSON) has no large pool.
    let mut json: serde_json::Value = serde_json::from_str(&p.to_json()).unwrap();
    let pool = json["pool"].as_object_mut().unwrap();
    pool.remove("large_slots");
    pool.remove("large_slot_size");
    let old = crate::Plan::from_json(&json.to_string()).unwrap();
    assert!(old.large_pool_geometry(0).is_none());
}

#[test]
fn slot_numbers_beyond_24_bits_have_no_geometry() {
    let s = parse(
        Path::new("c.yaml"),
        &HELLO.replace(
            "{ slots: 64, slot_size: 8KiB",
            "{ slots: 16777200, slot_size: 2KiB",
        ),
    )
    .unwrap();
    let p = crate::plan_from_spec(&s, "ring", 0, 1);
    // 16777200 small + 16 large slots fill the 2^24 numbers exactly; domain 1 has none.
    assert!(p.pool_geometry(0).is_some());
    assert_eq!(p.large_pool_geometry(0).unwrap().first_slot, 16_777_200);
    assert!(p.pool_geometry(1).is_none());
    assert!(p.large_pool_geometry(1).is_none());
    assert!(p.pool_geometries(1).is_none());
}
