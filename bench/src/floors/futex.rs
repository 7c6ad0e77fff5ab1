//! `futex_rtt`: two futex words in a shared memfd (on separate cache lines), `FUTEX_WAIT` and
//! `FUTEX_WAKE` without `FUTEX_PRIVATE`, as the ring's sleep path uses them. Both sides sleep
//! every time: the waker always makes the wake call, the woken side always finds nothing
//! yet when it looks and waits.
//!
//! The timed side stores `n` in `ping` and wakes it, then waits until `pong == n`; the peer
//! waits on `ping`, copies it to `pong` and wakes that.

use std::os::fd::OwnedFd;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use zerohop_pool::region::Region;

use super::peer::{one_fd, Peer, Role, PEER_IDLE};
use super::{sys, Floor, Pinning, Plan, PAUSE};

/// Tells the peer to exit.
const QUIT: u32 = u32::MAX;
/// Offsets of the two words: one cache line each.
const PING: usize = 0;
const PONG: usize = 64;
/// The timed side's waits are cut into slices so that it sees the watchdog's alarm.
const SLICE: Duration = Duration::from_millis(100);

pub(super) fn measure(name: &str, plan: &Plan, pinning: Pinning) -> Result<Floor> {
    let region = Region::create("zerohop-floor-futex", 4096, false)?;
    let mut peer = Peer::spawn(
        Role::Futex,
        pinning,
        vec![region.fd().try_clone_to_owned()?],
        // The sliced wait below polls the alarm itself.
        || {},
    )?;
    let alarm = peer.fired();
    let (ping, pong) = (
        sys::atomic_u32_at(&region, PING),
        sys::atomic_u32_at(&region, PONG),
    );
    let mut n = 0u32;
    let mut samples = peer.time(plan.asleep, Some(PAUSE), || {
        n += 1;
        // SYNC POINT: Release pairs with the peer's Acquire load of `ping` in `echo`.
        ping.store(n, Ordering::Release);
        sys::futex_wake(ping);
        loop {
            // SYNC POINT: Acquire pairs with the peer's Release store of `pong` in `echo`.
            let seen = pong.load(Ordering::Acquire);
            if seen == n {
                return Ok(());
            }
            if alarm.is_fired() {
                bail!("interrupted");
            }
            sys::futex_wait(pong, seen, SLICE);
        }
    })?;
    peer.finish(|| {
        // SYNC POINT: Release pairs with the peer's Acquire load of `ping` in `echo`.
        ping.store(QUIT, Ordering::Release);
        sys::futex_wake(ping);
    })?;
    Ok(Floor::from_samples(
        name,
        format!(
            "round trip through two futex words in a shared memfd (FUTEX_WAKE, then \
             FUTEX_WAIT, shared), both sides asleep in the kernel when woken; {} us pause \
             before each round trip (not timed); {}",
            PAUSE.as_micros(),
            pinning.two_processes()
        ),
        &mut samples,
        None,
    ))
}

pub(super) fn echo(pinning: Pinning, fds: Vec<OwnedFd>) -> Result<()> {
    pinning.pin_peer()?;
    let region = Region::attach(one_fd(fds)?)?;
    let (ping, pong) = (
        sys::atomic_u32_at(&region, PING),
        sys::atomic_u32_at(&region, PONG),
    );
    let mut last = 0u32;
    let mut idle_since = Instant::now();
    loop {
        // SYNC POINT: Acquire pairs with the timed side's Release store of `ping`.
        let seen = ping.load(Ordering::Acquire);
        if seen == QUIT {
            return Ok(());
        }
        if seen != last {
            last = seen;
            // SYNC POINT: Release pairs with the timed side's Acquire load of `pong`.
            pong.store(seen, Ordering::Release);
            sys::futex_wake(pong);
            idle_since = Instant::now();
            continue;
        }
        if idle_since.elapsed() > PEER_IDLE {
            bail!("no message for {PEER_IDLE:?}");
        }
        sys::futex_wait(ping, seen, Duration::from_secs(1));
    }
}
