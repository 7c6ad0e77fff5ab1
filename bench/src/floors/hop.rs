//! `hop_{ring,socket,poll,sockmap}_{busy,asleep}_rtt`: a 16-byte descriptor from party 0 to party 1 and
//! back over a real zerohop transport, raw `Receiver::recv` (no pool, no validation).
//!
//! The timed side creates the transport (`zerohop_transport::create`, two parties) and hands
//! the peer `fds_for(1)`; the peer rebuilds it with `zerohop_transport::attach`. "busy": the
//! ring's receivers spin [`BUSY_SPIN_US`], far longer than a round trip, so they never
//! sleep; the socket has no spin, busy means back-to-back round trips. "asleep": the ring
//! with no spin, so every receive takes the futex sleep path, and for both backends a
//! [`PAUSE`] before each round trip so the receiver is really asleep (futex or `poll`) when
//! the descriptor arrives.
//!
//! Receivers are created while their thread may run on both CPUs: a ring receiver created on
//! a thread allowed one CPU only never spins (it would keep a sender needing that CPU off
//! it), which is right for a deployment but not for two processes on two CPUs.

use std::os::fd::OwnedFd;

use anyhow::{bail, Context, Result};
use zerohop_pool::Descriptor;
use zerohop_transport::{Backend, Options, Policy};

use super::peer::{Peer, Role};
use super::{Floor, Pinning, Plan, PAUSE};

/// Spin budget of a busy ring receiver, microseconds.
const BUSY_SPIN_US: u32 = 100_000;
/// Request id that tells the peer to exit.
const QUIT: u32 = u32::MAX;
/// The descriptor bounced: addressed to function 0 (party 1) on the way out, to the
/// gateway (party 0) on the way back, as the sockmap transport's kernel program checks.
const DESC: Descriptor = Descriptor {
    slot: 1,
    len: 64,
    request: 7,
    generation: 1,
    next: 0,
};
const BACK: Descriptor = Descriptor {
    next: Descriptor::GATEWAY,
    ..DESC
};

fn options(spin_us: u32) -> Options {
    Options {
        spin_us,
        ..Options::default()
    }
}

pub(super) fn measure(
    name: &str,
    plan: &Plan,
    pinning: Pinning,
    backend: Backend,
    busy: bool,
) -> Result<Floor> {
    let spin_us = if busy { BUSY_SPIN_US } else { 0 };
    let t = zerohop_transport::create(
        backend,
        "zerohop-floor-hop",
        &Policy::pair(),
        options(spin_us),
    )
    .context("creating the transport")?;
    let fds = t.fds_for(1)?;
    // Before `Peer::spawn` pins this thread (see the module doc).
    let tx = t.sender(0)?;
    let mut rx = t.receiver(0)?;
    let stop = rx.stopper();
    let mut peer = Peer::spawn(Role::Hop { backend, spin_us }, pinning, fds, move || {
        stop.stop()
    })?;
    let (counts, pause) = if busy {
        (plan.busy, None)
    } else {
        (plan.asleep, Some(PAUSE))
    };
    let mut samples = peer.time(counts, pause, || {
        tx.send(1, DESC)?;
        match rx.recv() {
            Some(raw) if raw.desc == BACK && !raw.refused => Ok(()),
            Some(raw) => bail!("unexpected descriptor {:?}", raw.desc),
            None => bail!("the receiver was stopped"),
        }
    })?;
    peer.finish(|| {
        let _ = tx.send(
            1,
            Descriptor {
                request: QUIT,
                ..DESC
            },
        );
    })?;
    let how = match (backend, busy) {
        (Backend::Ring, true) => format!(
            "receivers spinning (spin_us = {BUSY_SPIN_US}), never asleep, back-to-back round trips"
        ),
        (Backend::Ring, false) => format!(
            "spin_us = 0: every receive sleeps on the futex; {} us pause before each round trip \
             (not timed)",
            PAUSE.as_micros()
        ),
        (Backend::Socket | Backend::Sockmap, true) => {
            "back-to-back round trips (no spin on this backend)".into()
        }
        (Backend::Socket | Backend::Sockmap, false) => format!(
            "receivers blocked in poll; {} us pause before each round trip (not timed)",
            PAUSE.as_micros()
        ),
        (Backend::Poll, _) => "receivers polling, never asleep (poll mode)".into(),
    };
    Ok(Floor::from_samples(
        name,
        format!(
            "zerohop {backend} transport, a 16-byte descriptor party 0 -> party 1 -> party 0 \
             (raw Receiver::recv, no pool); {how}; {}",
            pinning.two_processes()
        ),
        &mut samples,
        None,
    ))
}

pub(super) fn echo(
    pinning: Pinning,
    fds: Vec<OwnedFd>,
    backend: Backend,
    spin_us: u32,
) -> Result<()> {
    // Receivers first, then pin (see the module doc).
    pinning.widen()?;
    let t = zerohop_transport::attach(backend, &Policy::pair(), 1, fds, options(spin_us))
        .context("attaching to the transport")?;
    let tx = t.sender(1)?;
    let mut rx = t.receiver(1)?;
    pinning.pin_peer()?;
    while let Some(raw) = rx.recv() {
        if raw.desc.request == QUIT {
            return Ok(());
        }
        tx.send(
            0,
            Descriptor {
                next: Descriptor::GATEWAY,
                ..raw.desc
            },
        )?;
    }
    bail!("the transport closed before the quit descriptor")
}
