//! One hop, both ways: descriptor ping-pong round trips over every backend, between two
//! threads of one process and between two processes.
//!
//! The timed side (party 0) sends a descriptor to party 1 and waits for it to come back; the
//! echo side returns everything it receives. Variants: `ring` (default options: a 20 us
//! spin, then a futex sleep), `ring/busy` (receivers that never sleep, the `poll` mode of
//! the design) and `socket`. Raw transport cost only: no pool, no validation.
//!
//! For the process variants this binary re-runs itself with `ZEROHOP_BENCH_ECHO` set and
//! the transport's fds mapped to 3, 4, ...; the child is told to quit after the benchmark,
//! is killed when its guard drops, and exits by itself when this process goes away.

use std::hint::black_box;
use std::process::{Command, Stdio};
use std::time::Duration;

use criterion::Criterion;
use zerohop_pool::Descriptor;
use zerohop_test_support::{inherited_fds, spawn_with_fds};
use zerohop_transport::{Backend, Options, Policy, Receiver, Sender};

/// Set in the echo child: `"<backend> <spin_us> <number of fds>"`.
const ECHO_ENV: &str = "ZEROHOP_BENCH_ECHO";
/// Request id that tells the echo side to stop.
const QUIT: u32 = u32::MAX;

struct Variant {
    name: &'static str,
    backend: Backend,
    opts: Options,
}

fn variants() -> Vec<Variant> {
    let busy = Options {
        // Longer than any benchmark: the receivers never reach the futex.
        spin_us: 60_000_000,
        ..Options::default()
    };
    vec![
        Variant {
            name: "ring",
            backend: Backend::Ring,
            opts: Options::default(),
        },
        Variant {
            name: "ring/busy",
            backend: Backend::Ring,
            opts: busy,
        },
        Variant {
            name: "socket",
            backend: Backend::Socket,
            opts: Options::default(),
        },
    ]
}

/// Party 1: returns every descriptor to party 0 until told to quit or stopped.
fn echo(rx: &mut dyn Receiver, tx: &dyn Sender) {
    while let Some(raw) = rx.recv() {
        if raw.desc.request == QUIT || tx.send(0, raw.desc).is_err() {
            break;
        }
    }
}

/// Party 0: one round trip.
fn round_trip(tx: &dyn Sender, rx: &mut dyn Receiver, desc: Descriptor) {
    tx.send(1, desc).expect("send to the echo side");
    black_box(rx.recv().expect("echo came back"));
}

fn quit_desc() -> Descriptor {
    Descriptor {
        request: QUIT,
        ..Descriptor::default()
    }
}

fn desc() -> Descriptor {
    Descriptor {
        slot: 1,
        len: 64,
        request: 7,
        generation: 1,
        next: 0,
    }
}

fn bench_threads(c: &mut Criterion, v: &Variant) {
    let t =
        zerohop_transport::create(v.backend, "bench", &Policy::pair(), v.opts).expect("transport");
    let (tx0, mut rx0) = (
        t.sender(0).expect("sender"),
        t.receiver(0).expect("receiver"),
    );
    let (tx1, mut rx1) = (
        t.sender(1).expect("sender"),
        t.receiver(1).expect("receiver"),
    );
    let stop = rx1.stopper();
    std::thread::scope(|s| {
        s.spawn(move || echo(&mut *rx1, &*tx1));
        c.bench_function(&format!("hop/{}/threads", v.name), |b| {
            b.iter(|| round_trip(&*tx0, &mut *rx0, desc()))
        });
        stop.stop();
    });
}

fn bench_processes(c: &mut Criterion, v: &Variant) {
    let t =
        zerohop_transport::create(v.backend, "bench", &Policy::pair(), v.opts).expect("transport");
    let fds = t.fds_for(1).expect("fds");
    let mut cmd = Command::new(std::env::current_exe().expect("current_exe"));
    cmd.env(
        ECHO_ENV,
        format!("{} {} {}", v.backend, v.opts.spin_us, fds.len()),
    )
    .stdin(Stdio::null())
    .stdout(Stdio::null());
    let mut child = spawn_with_fds(cmd, fds);
    let (tx0, mut rx0) = (
        t.sender(0).expect("sender"),
        t.receiver(0).expect("receiver"),
    );
    c.bench_function(&format!("hop/{}/processes", v.name), |b| {
        b.iter(|| round_trip(&*tx0, &mut *rx0, desc()))
    });
    tx0.send(1, quit_desc())
        .expect("tell the echo child to quit");
    assert_eq!(
        child.wait_timeout(Duration::from_secs(10)),
        Some(0),
        "echo child exit code"
    );
}

/// The echo side in its own process.
fn echo_child(spec: &str) {
    let mut words = spec.split_whitespace();
    let mut next = || {
        words
            .next()
            .unwrap_or_else(|| panic!("bad {ECHO_ENV}={spec:?}"))
    };
    let backend: Backend = next().parse().expect("backend");
    let spin_us: u32 = next().parse().expect("spin_us");
    let nfds: usize = next().parse().expect("number of fds");
    let opts = Options {
        spin_us,
        ..Options::default()
    };
    // Never outlive the benchmark, even when it is interrupted.
    let parent = std::os::unix::process::parent_id();
    std::thread::spawn(move || loop {
        std::thread::sleep(Duration::from_millis(200));
        if std::os::unix::process::parent_id() != parent {
            std::process::exit(0);
        }
    });
    let t = zerohop_transport::attach(backend, &Policy::pair(), 1, inherited_fds(nfds), opts)
        .expect("attach");
    let (tx, mut rx) = (
        t.sender(1).expect("sender"),
        t.receiver(1).expect("receiver"),
    );
    echo(&mut *rx, &*tx);
}

fn main() {
    if let Ok(spec) = std::env::var(ECHO_ENV) {
        return echo_child(&spec);
    }
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .configure_from_args();
    for v in variants() {
        bench_threads(&mut c, &v);
        bench_processes(&mut c, &v);
    }
    c.final_summary();
}
