//! A large (releasing) pool across processes: the memory of a slot a process wrote goes back
//! to the kernel when that process frees the slot, and a slot a dead process held is given
//! back by `release_free` after its reclaim. Measured on the memfd itself (its allocated
//! blocks), which is what the host pays whatever process maps it.
//!
//! Children are this test binary re-run in a role (`zerohop_test_support::spawn_self`),
//! inheriting the pool's memfd as the agent hands it to an instance.

use std::fs::File;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::sync::Arc;
use std::time::Duration;

use zerohop_pool::{Owner, Pool, PoolGeometry};
use zerohop_test_support::{inherited_fds, role, spawn_self, ChildLines};

const PHASE: Duration = Duration::from_secs(60);
const SLOT: u32 = 4 << 20;
/// The party the children are.
const CHILD: u16 = 1;

fn geometry() -> PoolGeometry {
    PoolGeometry {
        slots: 4,
        first_slot: 64,
        slot_size: SLOT,
        max_parties: 3,
        hugepages: false,
        release: true,
    }
}

fn dup(fd: BorrowedFd<'_>) -> OwnedFd {
    fd.try_clone_to_owned().expect("dup fd")
}

/// Bytes of memory the memfd holds now (its allocated 512-byte blocks).
fn resident(pool: &Pool) -> u64 {
    File::from(dup(pool.fd()))
        .metadata()
        .expect("fstat the memfd")
        .blocks()
        * 512
}

/// Writes a whole slot in a child, which then frees it (`free`) or exits holding it.
fn child_writes(test: &str, pool: &Pool, free: bool) {
    let role = if free { "free" } else { "die" };
    let mut child = spawn_self(test, role, &[], vec![dup(pool.fd())]);
    let out = ChildLines::new(&mut child);
    out.wait_for(role, "WROTE", PHASE);
    assert_eq!(
        child.wait_timeout(PHASE),
        Some(0),
        "{role} child's exit code"
    );
}

fn child() {
    let free = role().as_deref() == Some("free");
    let fd = inherited_fds(1).pop().expect("pool fd");
    let pool = Arc::new(Pool::attach(fd, &geometry()).expect("attach the large pool"));
    let mut slot = pool.alloc(Owner::party(CHILD)).expect("a free large slot");
    slot.data_mut().fill(0xAB);
    println!("WROTE {}", slot.index());
    if free {
        drop(slot);
    } else {
        // Dies with the slot held, as a killed instance does: no drop, no punch.
        std::process::exit(0);
    }
}

#[test]
fn a_large_slot_gives_its_memory_back_whichever_process_freed_it() {
    if role().is_some() {
        return child();
    }
    let test = "a_large_slot_gives_its_memory_back_whichever_process_freed_it";
    let pool = Arc::new(Pool::create("release", &geometry()).expect("create the large pool"));
    // Only the header, party table and owner words are written: less than a slot.
    let idle = resident(&pool);
    assert!(
        idle < u64::from(SLOT) / 4,
        "a new large pool holds {idle} bytes"
    );

    // Written and freed by another process: its pages are gone at the free.
    child_writes(test, &pool, true);
    assert_eq!(pool.owners().in_use(), 0);
    assert_eq!(
        resident(&pool),
        idle,
        "the child's free gave the slot's pages back"
    );

    // Written by a process that died holding it: reclaim frees the slot without a punch
    // (the agent is not its owner), release_free gives the memory back.
    child_writes(test, &pool, false);
    let written = resident(&pool);
    assert!(
        written >= idle + u64::from(SLOT) - 4096,
        "{written} bytes after the write"
    );
    assert_eq!(pool.reclaim(Owner::party(CHILD)).len(), 1);
    assert_eq!(resident(&pool), written, "reclaim alone does not punch");
    assert_eq!(pool.release_free(Owner::party(0)), 4);
    assert_eq!(resident(&pool), idle, "release_free gave it back");
    assert_eq!(pool.owners().in_use(), 0);
    let again = pool.alloc(Owner::party(0)).expect("a free slot");
    assert!(
        again.data().iter().all(|&b| b == 0),
        "the slot reads back zero"
    );
}
