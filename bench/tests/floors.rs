//! The floors measure what they say, between real processes, and leave none behind.
//!
//! `floors::measure` re-runs this test binary as its peer processes; every test here calls
//! `maybe_run_echo_role` first so that such a re-run becomes the peer. Relations between
//! floors are checked only where they hold by orders of magnitude (a cache-line handoff
//! against a futex sleep), never absolute times.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use zerohop_bench::floors::{self, Floor};
use zerohop_test_support::{children, signal_pid, wait_until, Signal};

const NAMES: [&str; 13] = [
    "cacheline_rtt",
    "futex_rtt",
    "eventfd_rtt",
    "unix_socket_rtt",
    "memcpy_64KiB",
    "memcpy_1MiB",
    "hop_ring_busy_rtt",
    "hop_ring_asleep_rtt",
    "hop_socket_busy_rtt",
    "hop_socket_asleep_rtt",
    "hop_poll_busy_rtt",
    "hop_sockmap_busy_rtt",
    "hop_sockmap_asleep_rtt",
];

/// The tests count this process's children and compete for two CPUs: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn p50(floors: &[Floor], name: &str) -> f64 {
    floors
        .iter()
        .find(|f| f.name == name)
        .unwrap_or_else(|| panic!("{name} missing"))
        .p50_ns
}

/// Whether `pid` has exec'd as a floor peer.
fn is_peer(pid: u32) -> bool {
    std::fs::read(format!("/proc/{pid}/environ")).is_ok_and(|env| {
        env.split(|&b| b == 0)
            .any(|kv| kv.starts_with(b"ZEROHOP_BENCH_FLOOR_PEER="))
    })
}

#[test]
fn quick_floors_are_complete_sane_and_leave_no_process() {
    floors::maybe_run_echo_role();
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut said = Vec::new();
    let start = Instant::now();
    let floors = floors::measure(true, &mut |s| said.push(s.to_owned())).expect("measure");
    eprintln!("quick floors took {:?}", start.elapsed());
    for f in &floors {
        eprintln!(
            "{:24} p50 {:>10.0} ns  p99 {:>10.0} ns  n {:>6}  {}",
            f.name,
            f.p50_ns,
            f.p99_ns,
            f.samples,
            f.gb_per_s
                .map(|g| format!("{g:.1} GB/s"))
                .unwrap_or_default()
        );
    }

    for name in NAMES {
        assert_eq!(
            floors.iter().filter(|f| f.name == name).count(),
            1,
            "{name} must appear exactly once"
        );
        assert!(
            said.contains(&format!("floors: {name}")),
            "no progress line for {name}: {said:?}"
        );
    }
    assert_eq!(floors.len(), NAMES.len(), "unexpected floors");
    for f in &floors {
        assert!(f.p50_ns > 0.0, "{}: p50 {}", f.name, f.p50_ns);
        assert!(f.p99_ns >= f.p50_ns, "{}: p99 < p50", f.name);
        assert!(f.samples > 0, "{}: no samples", f.name);
        assert!(!f.what.is_empty(), "{}: no description", f.name);
        assert_eq!(
            f.gb_per_s.is_some(),
            f.name.starts_with("memcpy_"),
            "{}: gb_per_s only for memcpy",
            f.name
        );
        if let Some(g) = f.gb_per_s {
            assert!(g > 0.0 && g.is_finite(), "{}: {g} GB/s", f.name);
        }
        if f.name.ends_with("_rtt") {
            assert!(
                f.what.contains("two processes"),
                "{}: what must say between what: {}",
                f.name,
                f.what
            );
        }
    }

    // Polling against sleeping: 100 ns against microseconds, with room for a loaded VM.
    assert!(p50(&floors, "cacheline_rtt") < p50(&floors, "futex_rtt"));
    assert!(p50(&floors, "hop_ring_busy_rtt") < p50(&floors, "hop_ring_asleep_rtt"));
    // Copying 16 times the bytes takes longer.
    assert!(p50(&floors, "memcpy_64KiB") < p50(&floors, "memcpy_1MiB"));

    assert_eq!(
        children(std::process::id()),
        Vec::<u32>::new(),
        "a peer process outlived measure"
    );
}

/// A peer that stops answering (SIGSTOP) fails the measurement within the answer timeout,
/// and is killed and reaped.
#[test]
fn stuck_peer_fails_the_measurement_and_is_reaped() {
    floors::maybe_run_echo_role();
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let me = std::process::id();
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        let stopper = s.spawn(|| {
            // Freeze every peer seen (each lives at least a few milliseconds), but only once
            // it runs as a peer: stopped between fork and exec, it would hold up `spawn`.
            let mut stopped = Vec::new();
            while !done.load(Ordering::SeqCst) {
                for pid in children(me) {
                    if !stopped.contains(&pid) && is_peer(pid) {
                        signal_pid(pid, Signal::SIGSTOP);
                        stopped.push(pid);
                    }
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            stopped
        });
        let start = Instant::now();
        let result = floors::measure(true, &mut |_| {});
        let took = start.elapsed();
        done.store(true, Ordering::SeqCst);
        let stopped = stopper.join().expect("stopper thread");
        let err = result.expect_err("a frozen peer must fail the measurement");
        eprintln!("after {took:?}: {err:#}");
        assert!(!stopped.is_empty(), "no peer was seen");
        // Frozen while timed, or (rarely) frozen after its last round trip.
        let msg = format!("{err:#}");
        assert!(
            msg.contains("did not answer") || msg.contains("did not quit"),
            "unexpected error: {msg}"
        );
    });
    assert!(
        wait_until(Duration::from_secs(1), || children(me).is_empty()),
        "peers left: {:?}",
        children(me)
    );
}
