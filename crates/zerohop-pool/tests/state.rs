//! The chain state store across processes: concurrent increments lose nothing, writers
//! SIGKILLed at random instructions leave every value whole and the store usable.
//!
//! Children are this test binary re-run in a role (`spawn_self`), inheriting the store's
//! memfd as descriptor 3, as an instance inherits it from the agent.

use std::os::fd::OwnedFd;
use std::time::Duration;

use zerohop_pool::{State, StateConfig};
use zerohop_test_support::{inherited_fds, role, spawn_self, ChildGuard, ChildLines, Signal};

const CFG: StateConfig = StateConfig {
    entries: 512,
    value_size: 256,
};
/// Longest a phase may take before the test calls it hung.
const PHASE: Duration = Duration::from_secs(60);

fn dup(s: &State) -> Vec<OwnedFd> {
    vec![s.fd().try_clone_to_owned().expect("dup")]
}

fn counter(v: Option<&[u8]>) -> u64 {
    v.map_or(0, |v| {
        u64::from_le_bytes(v.try_into().expect("8-byte counter"))
    })
}

/// A value that proves it is whole: `n` as 8 bytes, then bytes derived from `n`, to `len`.
fn stamped(n: u64, len: usize) -> Vec<u8> {
    let mut v = n.to_le_bytes().to_vec();
    v.extend((8..len).map(|i| (n as u8).wrapping_mul(31).wrapping_add(i as u8)));
    v
}

fn whole(v: &[u8]) -> bool {
    v.len() >= 8 && stamped(u64::from_le_bytes(v[..8].try_into().unwrap()), v.len()) == v
}

#[test]
fn processes_lose_no_increment() {
    if role().as_deref() == Some("incrementer") {
        let s = State::attach(inherited_fds(1).pop().unwrap(), CFG).unwrap();
        let n: u64 = std::env::var("N").unwrap().parse().unwrap();
        for _ in 0..n {
            s.update(b"hits", |old| {
                Some((counter(old) + 1).to_le_bytes().to_vec())
            })
            .unwrap();
        }
        println!("done");
        return;
    }
    let s = State::create("incr", CFG).unwrap();
    let (procs, each) = (4, 5000u64);
    let mut kids: Vec<(ChildGuard, ChildLines)> = (0..procs)
        .map(|_| {
            let mut c = spawn_self(
                "processes_lose_no_increment",
                "incrementer",
                &[("N", each.to_string())],
                dup(&s),
            );
            let lines = ChildLines::new(&mut c);
            (c, lines)
        })
        .collect();
    for (c, lines) in &mut kids {
        lines.wait_for("incrementer", "done", PHASE);
        assert_eq!(c.wait_timeout(PHASE), Some(0));
    }
    assert_eq!(counter(s.get(b"hits").unwrap().as_deref()), procs * each);
}

#[test]
fn writers_killed_mid_update_leave_the_store_whole() {
    if role().as_deref() == Some("writer") {
        let s = State::attach(inherited_fds(1).pop().unwrap(), CFG).unwrap();
        let me: u64 = std::env::var("ME").unwrap().parse().unwrap();
        println!("writing");
        // Forever (until killed): rewrite shared keys with growing counters of varying
        // length, delete and re-insert keys of its own.
        let mut i = 0u64;
        loop {
            let key = format!("shared-{}", i % 7);
            s.update(key.as_bytes(), |old| {
                let n = old.map_or(0, |v| u64::from_le_bytes(v[..8].try_into().unwrap()));
                Some(stamped(n + 1, 8 + ((n + me) % 200) as usize))
            })
            .unwrap();
            let own = format!("own-{me}-{}", i % 13);
            if i.is_multiple_of(3) {
                s.delete(own.as_bytes()).unwrap();
            } else {
                s.put(own.as_bytes(), &stamped(i, 64)).unwrap();
            }
            i += 1;
        }
    }
    let s = State::create("kill", CFG).unwrap();
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut taken_over = 0;
    for round in 0..12u64 {
        let mut kids: Vec<(ChildGuard, ChildLines)> = (0..3u64)
            .map(|k| {
                let mut c = spawn_self(
                    "writers_killed_mid_update_leave_the_store_whole",
                    "writer",
                    &[("ME", (round * 3 + k).to_string())],
                    dup(&s),
                );
                let lines = ChildLines::new(&mut c);
                (c, lines)
            })
            .collect();
        for (_, lines) in &kids {
            lines.wait_for("writer", "writing", PHASE);
        }
        // Let them write a random while, then kill them all mid-stream.
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        std::thread::sleep(Duration::from_millis(5 + rng % 40));
        let pids: Vec<u32> = kids.iter().map(|(c, _)| c.pid()).collect();
        for (c, _) in &mut kids {
            c.signal(Signal::SIGKILL);
            assert!(c.wait_timeout(PHASE).is_none(), "killed, not exited");
        }
        // A writer killed while holding a lock leaves its pid in the lock word.
        taken_over += s.lock_holders().iter().filter(|h| pids.contains(h)).count();
        // Every value is whole, and the store still takes writes (a dead writer's lock is
        // taken over).
        for k in 0..7 {
            let key = format!("shared-{k}");
            if let Some(v) = s.get(key.as_bytes()).unwrap() {
                assert!(whole(&v), "round {round}: {key} torn: {v:?}");
            }
            s.update(key.as_bytes(), |old| {
                let n = old.map_or(0, |v| u64::from_le_bytes(v[..8].try_into().unwrap()));
                Some(stamped(n + 1, 16))
            })
            .unwrap();
        }
    }
    assert!(
        taken_over > 0,
        "no writer was killed holding a lock in 12 rounds; the test did not test takeover"
    );
    assert!(s.lock_holders().iter().all(|&h| h == 0));
    // Keys written by killed writers: each whole; none duplicated (one entry per key).
    let mut own = 0;
    for w in 0..36u64 {
        for j in 0..13 {
            if let Some(v) = s.get(format!("own-{w}-{j}").as_bytes()).unwrap() {
                assert!(whole(&v));
                own += 1;
            }
        }
    }
    assert_eq!(s.len(), 7 + own, "every key in exactly one entry");
}
