//! A hostile function for the flood tests (issue 30, findings 3 and 12): given a body, it
//! answers at once, then abuses what the agent handed over, past its SDK, from a thread of
//! its own.
//!
//! * `flood`: answers `flooding PID`, then keeps every queue of its own to a gateway party
//!   full of invalid descriptors (slot out of range, addressed to the gateway) for as long as
//!   it lives: as fast as the gateway drains them, through a second sender on its own outbox
//!   (ring) or socket.
//! * `flood-next`: answers `flooding PID` (the request goes on to the next function), then
//!   keeps its queues to the instances of the functions it sends to full of invalid
//!   descriptors (addressed to that function, slot out of range): garbage only the
//!   receiving instance and the agent's look into its outbox see.
//! * `wake MS`: answers `waking PID`, then for MS milliseconds bumps its first pool's wake
//!   word in a loop (what a sender does when it sent to a party with no ready instance), with
//!   a futex wake each time; answers `woke N` to the next request (how many bumps).
//! * anything else: answers `alive PID`.
//!
//! `unsafe` for duplicating the inherited descriptors before the runtime takes them over;
//! this is a test fixture, never a function to copy.

use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use zerohop_pool::{Descriptor, Pool};
use zerohop_runtime::{run, HandlerError, Next, Request};
use zerohop_transport::PlanExt;
use zerohop_transport::{handover, Plan, Sender};

/// What this instance was handed, duplicated for its own abuse.
struct Handed {
    plan: Plan,
    me: u16,
    /// Its first pool.
    pool: Arc<Pool>,
    /// A second sender of this party's (its own queues, not the SDK's).
    sender: Box<dyn Sender>,
}

/// Duplicates inherited descriptor `fd` (close-on-exec, above the hand-over range).
fn dup(fd: i32) -> OwnedFd {
    // SAFETY: fcntl on a descriptor number only reads the process's table; a failure is -1.
    let new = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 100) };
    assert!(new >= 0, "dup of inherited fd {fd} failed");
    // SAFETY: `new` is a fresh descriptor this process owns and nothing else closes.
    unsafe { OwnedFd::from_raw_fd(new) }
}

/// Reads the hand-over as the runtime will, and attaches a second time to its pool and
/// transport.
fn handed() -> Handed {
    let var = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("{k} not set"));
    let plan = Plan::from_json(&var(handover::PLAN)).expect("plan");
    let me: u16 = var(handover::PARTY).parse().expect("party");
    let nfds: i32 = var(handover::FDS).parse().expect("fds");
    let function = plan.party_function[usize::from(me)];
    let domains = plan.domains_of(function);
    let state = usize::from(plan.state.is_some() && plan.functions[usize::from(function)].state);
    // The pools (per domain small, then large), the state store (if any), the progress
    // records, then the transport's.
    let pools: usize = domains
        .iter()
        .map(|&d| plan.pool_geometries(d).expect("geometry").len())
        .sum();
    let transport_from = (pools + state + 1) as i32;
    let geometry = plan.pool_geometry(domains[0]).expect("geometry");
    let pool = Arc::new(Pool::attach(dup(handover::FIRST_FD), &geometry).expect("pool"));
    let fds = (transport_from..nfds)
        .map(|i| dup(handover::FIRST_FD + i))
        .collect();
    let policy = plan.policy().expect("policy");
    let backend = plan.transport.parse().expect("backend");
    let transport =
        zerohop_transport::attach(backend, &policy, me, fds, plan.options()).expect("transport");
    let sender = transport.sender(me).expect("sender");
    // The regions stay mapped through the sender; the transport object itself can go.
    std::mem::forget(transport);
    Handed {
        plan,
        me,
        pool,
        sender,
    }
}

/// Floods every gateway party with invalid descriptors until the process dies.
fn flood(h: &Handed) -> ! {
    let bad = Descriptor {
        slot: Descriptor::MAX_SLOT,
        len: 1,
        request: 0,
        generation: 0,
        next: Descriptor::GATEWAY,
    };
    loop {
        let mut sent = false;
        for g in 0..h.plan.gateways() {
            sent |= h.sender.try_send(g, bad).is_ok();
        }
        if !sent {
            std::thread::yield_now();
        }
    }
}

/// Floods every instance this one sends to (not the gateway's parties) with invalid
/// descriptors until the process dies.
fn flood_next(h: &Handed) -> ! {
    let policy = h.plan.policy().expect("policy");
    let bad: Vec<(u16, Descriptor)> = policy
        .targets(h.me)
        .into_iter()
        .filter(|&t| t >= h.plan.gateways())
        .map(|t| {
            let next = h.plan.party_function[usize::from(t)];
            let d = Descriptor {
                slot: Descriptor::MAX_SLOT,
                len: 1,
                request: 0,
                generation: 0,
                next,
            };
            (t, d)
        })
        .collect();
    assert!(!bad.is_empty(), "flood-next needs a function after it");
    loop {
        let mut sent = false;
        for &(t, d) in &bad {
            sent |= h.sender.try_send(t, d).is_ok();
        }
        if !sent {
            std::thread::yield_now();
        }
    }
}

fn main() {
    let h = Arc::new(handed());
    let bumps = Arc::new(AtomicU64::new(0));
    let started = Mutex::new(false);
    run(move |req: &mut Request<'_>| {
        let body = String::from_utf8_lossy(req.body()).into_owned();
        let pid = std::process::id();
        let mut words = body.split_whitespace();
        let answer = match words.next().unwrap_or("") {
            mode @ ("flood" | "flood-next") => {
                let mut once = started.lock().unwrap_or_else(|p| p.into_inner());
                if !*once {
                    *once = true;
                    let (h, next) = (h.clone(), mode == "flood-next");
                    std::thread::spawn(move || {
                        // After this answer went out: the SDK's sender and ours share the
                        // queue, which has one producer at a time.
                        std::thread::sleep(Duration::from_millis(200));
                        if next {
                            flood_next(&h)
                        }
                        flood(&h)
                    });
                }
                format!("flooding {pid} party {}", h.me)
            }
            "wake" => {
                let ms: u64 = words.next().and_then(|w| w.parse().ok()).unwrap_or(3000);
                let (h, bumps) = (h.clone(), bumps.clone());
                std::thread::spawn(move || {
                    let until = Instant::now() + Duration::from_millis(ms);
                    while Instant::now() < until {
                        for _ in 0..1000 {
                            h.pool.want_instance();
                        }
                        bumps.fetch_add(1000, Ordering::Relaxed);
                    }
                });
                format!("waking {pid}")
            }
            "woke" => format!("woke {}", bumps.load(Ordering::Relaxed)),
            _ => format!("alive {pid}"),
        };
        req.set_body(answer.as_bytes())
            .map_err(|e| HandlerError::internal(e.to_string()))?;
        Ok(Next::Continue)
    })
}
