//! `eventfd_rtt`: two eventfds, one per direction, blocking `read`s on both sides.
//!
//! The timed side writes 1 to `ping` and reads `pong`; the peer reads `ping` and writes 1 to
//! `pong`. The peer's blocking read has no timeout of its own: it ends when the timed side
//! writes [`QUIT`], when the watchdog kills the peer, or with the thread that started it.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::sync::Arc;

use anyhow::{bail, Context, Result};

use super::peer::{two_fds, Peer, Role};
use super::{sys, Floor, Pinning, Plan, PAUSE};

/// Value that tells the peer to exit (a ping is 1).
const QUIT: u64 = 2;

pub(super) fn measure(name: &str, plan: &Plan, pinning: Pinning) -> Result<Floor> {
    let ping = File::from(sys::eventfd().context("eventfd")?);
    let pong = Arc::new(File::from(sys::eventfd().context("eventfd")?));
    let kick = pong.clone();
    let mut peer = Peer::spawn(
        Role::Eventfd,
        pinning,
        vec![ping.try_clone()?.into(), pong.as_ref().try_clone()?.into()],
        // Wakes the timed side's read; it then sees the alarm.
        move || {
            let _ = kick.as_ref().write(&1u64.to_ne_bytes());
        },
    )?;
    let mut buf = [0u8; 8];
    let mut samples = peer.time(plan.asleep, Some(PAUSE), || {
        (&ping).write_all(&1u64.to_ne_bytes())?;
        pong.as_ref().read_exact(&mut buf)?;
        Ok(())
    })?;
    peer.finish(|| {
        let _ = (&ping).write_all(&QUIT.to_ne_bytes());
    })?;
    Ok(Floor::from_samples(
        name,
        format!(
            "round trip through two eventfds (write, then blocking read), both sides asleep \
             in read when woken; {} us pause before each round trip (not timed); {}",
            PAUSE.as_micros(),
            pinning.two_processes()
        ),
        &mut samples,
        None,
    ))
}

pub(super) fn echo(pinning: Pinning, fds: Vec<OwnedFd>) -> Result<()> {
    pinning.pin_peer()?;
    let (ping, pong) = two_fds(fds)?;
    let (mut ping, mut pong) = (File::from(ping), File::from(pong));
    let mut buf = [0u8; 8];
    loop {
        ping.read_exact(&mut buf)
            .context("reading the ping eventfd")?;
        match u64::from_ne_bytes(buf) {
            1 => pong
                .write_all(&1u64.to_ne_bytes())
                .context("writing the pong eventfd")?,
            QUIT => return Ok(()),
            other => bail!("unexpected eventfd count {other}"),
        }
    }
}
