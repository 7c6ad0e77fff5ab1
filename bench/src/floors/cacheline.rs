//! `cacheline_rtt`: one counter on one 64-byte line of a shared memfd, bounced between two
//! busy-polling processes. The floor of any polling transport: nothing can hand a
//! descriptor to another core faster than the line itself moves.
//!
//! The timed side writes an odd value `n` and spins until it reads `n + 1`; the peer spins
//! until it reads `n`, then writes `n + 1`. Each round trip moves the line there and back.

use std::hint::spin_loop;
use std::os::fd::OwnedFd;
use std::sync::atomic::Ordering;
use std::time::Instant;

use anyhow::{bail, Result};
use zerohop_pool::region::Region;

use super::peer::{one_fd, Peer, Role, PEER_IDLE};
use super::{sys, Floor, Pinning, Plan};

/// Tells the peer to exit.
const QUIT: u64 = u64::MAX;
/// Empty polls between two looks at the clock in the peer.
const SPINS_PER_CLOCK: u32 = 1 << 16;

pub(super) fn measure(name: &str, plan: &Plan, pinning: Pinning) -> Result<Floor> {
    let region = Region::create("zerohop-floor-cacheline", 4096, false)?;
    let mut peer = Peer::spawn(
        Role::Cacheline,
        pinning,
        vec![region.fd().try_clone_to_owned()?],
        // The spin below polls the alarm itself.
        || {},
    )?;
    let alarm = peer.fired();
    let line = sys::atomic_u64_at(&region, 0);
    let mut next = 1u64;
    let mut samples = peer.time(plan.busy, None, || {
        // SYNC POINT: Release pairs with the peer's Acquire load in `echo`.
        line.store(next, Ordering::Release);
        // SYNC POINT: Acquire pairs with the peer's Release store of `next + 1` in `echo`.
        while line.load(Ordering::Acquire) != next + 1 {
            if alarm.is_fired() {
                bail!("interrupted");
            }
            spin_loop();
        }
        next += 2;
        Ok(())
    })?;
    // SYNC POINT: Release pairs with the peer's Acquire load in `echo`.
    peer.finish(|| line.store(QUIT, Ordering::Release))?;
    Ok(Floor::from_samples(
        name,
        format!(
            "round trip of a counter on one 64-byte cache line of a shared memfd, both sides \
             busy-polling (spin_loop); {}",
            pinning.two_processes()
        ),
        &mut samples,
        None,
    ))
}

pub(super) fn echo(pinning: Pinning, fds: Vec<OwnedFd>) -> Result<()> {
    pinning.pin_peer()?;
    let region = Region::attach(one_fd(fds)?)?;
    let line = sys::atomic_u64_at(&region, 0);
    let mut expect = 1u64;
    let mut spins = 0u32;
    let mut idle_since: Option<Instant> = None;
    loop {
        // SYNC POINT: Acquire pairs with the timed side's Release store of `next` (or QUIT).
        let v = line.load(Ordering::Acquire);
        if v == expect {
            // SYNC POINT: Release pairs with the timed side's Acquire load of `next + 1`.
            line.store(v + 1, Ordering::Release);
            expect += 2;
            spins = 0;
            idle_since = None;
        } else if v == QUIT {
            return Ok(());
        } else {
            spin_loop();
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(SPINS_PER_CLOCK)
                && idle_since.get_or_insert_with(Instant::now).elapsed() > PEER_IDLE
            {
                bail!("no message for {PEER_IDLE:?}");
            }
        }
    }
}
