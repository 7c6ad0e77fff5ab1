//! The motion workload end to end, as users run it: the chain under the real `zerohop up`
//! with MQTT ingress (and its HTTP route), and the HTTP-microservice baseline behind a real
//! mosquitto; `motion-gen` replays a short compressed trace against each and every event must
//! come back with the right light command. Every process is guarded, every wait bounded.
//!
//! Needs the release binaries (`cargo build --release --workspace`) and mosquitto.

use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use zerohop_app_motion::event::Light;
use zerohop_app_motion::trace::{expected, generate, TraceConfig};
use zerohop_test_support::{
    free_port, target_bin, wait_until, ChainProcess, ChildGuard, ChildLines, TempDir,
};

/// Quiet time before the light goes off, short enough that the short trace sees it.
const OFF_AFTER_MS: u64 = 20_000;
/// The trace every run replays: 4 rooms, 150 s of trace time, replayed at 25x (6 s).
const GEN_ARGS: &[&str] = &[
    "--sensors",
    "4",
    "--duration",
    "150",
    "--mean-idle",
    "30",
    "--burst-min",
    "10",
    "--burst-max",
    "25",
    "--heartbeat",
    "5",
    "--seed",
    "7",
    "--scale",
    "25",
    "--drain",
    "10",
    "--json",
];

/// The same trace as [`GEN_ARGS`] describes.
fn trace_config() -> TraceConfig {
    TraceConfig {
        sensors: 4,
        duration_s: 150.0,
        seed: 7,
        mean_idle_s: 30.0,
        burst_min_s: 10.0,
        burst_max_s: 25.0,
        heartbeat_s: 5.0,
        ..TraceConfig::default()
    }
}

/// Runs `motion-gen` with `target` args plus [`GEN_ARGS`]; its JSON report.
fn replay(target: &[&str], cpu_pids: &[u32]) -> Value {
    let mut cmd = Command::new(target_bin("motion-gen"));
    cmd.args(target)
        .args(GEN_ARGS)
        .args(["--off-after-ms", &OFF_AFTER_MS.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped());
    for p in cpu_pids {
        cmd.args(["--cpu-pid", &p.to_string()]);
    }
    let mut gen = ChildGuard::new(cmd.spawn().expect("run motion-gen"));
    let lines = ChildLines::new(&mut gen);
    let report = lines
        .next_line(Duration::from_secs(25))
        .expect("motion-gen printed its report within 25 s");
    let code = gen.wait_timeout(Duration::from_secs(5));
    let report: Value = serde_json::from_str(&report)
        .unwrap_or_else(|e| panic!("motion-gen's report is not JSON ({e}): {report}"));
    assert_eq!(code, Some(0), "motion-gen failed: {report}");
    report
}

/// Every event answered, every command the expected one.
fn assert_all_answered(report: &Value) {
    let trace = generate(&trace_config());
    let want = expected(&trace, "", OFF_AFTER_MS);
    let switched = |light| {
        want.iter()
            .filter(|c| c.changed && c.light == light)
            .count() as u64
    };
    // The trace exercises both transitions, so a light that never goes off would show.
    assert!(trace.len() > 100, "short trace: {} events", trace.len());
    assert!(switched(Light::Off) >= 2, "the trace turns no light off");
    let n = |k: &str| {
        report[k]
            .as_u64()
            .unwrap_or_else(|| panic!("no {k} in {report}"))
    };
    assert_eq!(n("events"), trace.len() as u64, "{report}");
    assert_eq!(n("answered"), trace.len() as u64, "{report}");
    for k in ["wrong", "missing", "errors", "unexpected"] {
        assert_eq!(n(k), 0, "{k}: {report}");
    }
    assert_eq!(n("switched_on"), switched(Light::On), "{report}");
    assert_eq!(n("switched_off"), switched(Light::Off), "{report}");
    let answered: u64 = report["buckets"]
        .as_array()
        .expect("buckets")
        .iter()
        .map(|b| b["answered"].as_u64().unwrap())
        .sum();
    assert_eq!(answered, trace.len() as u64, "buckets add up: {report}");
}

fn chain_spec() -> String {
    let bin = |n: &str| target_bin(n).display().to_string();
    format!(
        r#"name: motion
pool: {{ slots: 256, slot_size: 4KiB }}
timeout: 5s
state: {{ entries: 1024, value_size: 64B }}
functions:
  sensor:
    command: ["{sensor}"]
    env: {{ SENSOR_WORK_US: "1000" }}
    headers: [mqtt-topic]
  actuator:
    command: ["{actuator}"]
    env: {{ ACTUATOR_WORK_US: "1000", OFF_AFTER_MS: "{OFF_AFTER_MS}" }}
    state: true
routes:
  - mqtt: motion/+/event
    mqtt_reply: motion/lights
    http: POST /motion
    sequence: [sensor, actuator]
mqtt: {{ listen: 127.0.0.1:0 }}
"#,
        sensor = bin("motion-sensor"),
        actuator = bin("motion-actuator"),
    )
}

#[test]
fn zerohop_chain_answers_every_event_over_mqtt_and_http() {
    let chain = ChainProcess::start(&chain_spec(), &[]);
    let mqtt = chain
        .listener("mqtt://")
        .unwrap_or_else(|| panic!("no mqtt:// in {:?}", chain.ready_line));
    let report = replay(&["--mqtt", &mqtt], &[chain.pid()]);
    assert_all_answered(&report);
    // The deployment's CPU was measured (2 ms of work per event, over 100 events).
    assert!(report["cpu_s"].as_f64().unwrap() > 0.0, "{report}");

    // The same chain by its HTTP route (rooms of a run of their own: fresh state).
    let url = format!("{}/motion", chain.url);
    assert_all_answered(&replay(&["--http", &url], &[]));
    assert_eq!(chain.stop(), Some(0));
}

#[test]
fn http_baseline_answers_every_event_through_mosquitto() {
    let dir = TempDir::new("motion-mosquitto");
    let port = free_port();
    let conf = dir.path().join("mosquitto.conf");
    std::fs::write(
        &conf,
        format!(
            "listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\nset_tcp_nodelay true\n"
        ),
    )
    .unwrap();
    let mosquitto = ChildGuard::new(
        Command::new("/usr/sbin/mosquitto")
            .arg("-c")
            .arg(&conf)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("run mosquitto (apt-get install mosquitto)"),
    );
    assert!(
        wait_until(Duration::from_secs(10), || TcpStream::connect((
            "127.0.0.1",
            port
        ))
        .is_ok()),
        "mosquitto did not listen on {port} within 10 s"
    );
    let broker = format!("127.0.0.1:{port}");
    let mut up = ChildGuard::new(
        Command::new(target_bin("motion-http"))
            .args(["up", "--broker", &broker])
            .env("OFF_AFTER_MS", OFF_AFTER_MS.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .expect("run motion-http up"),
    );
    let lines = ChildLines::new(&mut up);
    let ready = lines.wait_for("motion-http up", "ready:", Duration::from_secs(20));
    assert!(ready.contains("adapter"), "{ready}");

    let report = replay(&["--mqtt", &broker], &[up.pid(), mosquitto.pid()]);
    assert_all_answered(&report);
    assert!(report["cpu_s"].as_f64().unwrap() > 0.0, "{report}");
}
