//! `unix_socket_rtt`: a unix `SOCK_SEQPACKET` socketpair, 16-byte messages (a descriptor's
//! size), blocking `write` and `read` on both sides: the `socket` transport's floor.
//!
//! The socket is driven through [`UnixStream`] only for its safe `read`/`write`, timeout and
//! `shutdown` (all plain socket calls); the sequenced-packet semantics come from the socket.

use std::io::{Read, Write};
use std::net::Shutdown;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;

use anyhow::{bail, Context, Result};

use super::peer::{one_fd, Peer, Role, PEER_IDLE};
use super::{sys, Floor, Pinning, Plan, PAUSE};

/// Message size.
const LEN: usize = 16;

pub(super) fn measure(name: &str, plan: &Plan, pinning: Pinning) -> Result<Floor> {
    let (mine, theirs) = sys::seqpacket_pair().context("socketpair")?;
    let sock = UnixStream::from(mine);
    let kick = sock.try_clone()?;
    let mut peer = Peer::spawn(
        Role::UnixSocket,
        pinning,
        vec![theirs],
        // A shut-down socket makes the timed side's read return 0 at once.
        move || {
            let _ = kick.shutdown(Shutdown::Both);
        },
    )?;
    let msg = [0x5au8; LEN];
    let mut buf = [0u8; LEN];
    let mut samples = peer.time(plan.asleep, Some(PAUSE), || {
        (&sock).write_all(&msg)?;
        let n = (&sock).read(&mut buf)?;
        if n != LEN || buf != msg {
            bail!("unexpected answer of {n} bytes");
        }
        Ok(())
    })?;
    // End of stream tells the peer to exit.
    peer.finish(|| {
        let _ = sock.shutdown(Shutdown::Both);
    })?;
    Ok(Floor::from_samples(
        name,
        format!(
            "round trip of a {LEN}-byte message over a unix SOCK_SEQPACKET socketpair, \
             blocking write and read, both sides asleep in read when woken; {} us pause \
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
    let mut sock = UnixStream::from(one_fd(fds)?);
    // SO_RCVTIMEO: bounds the blocking read at no cost per message.
    sock.set_read_timeout(Some(PEER_IDLE))?;
    let mut buf = [0u8; LEN];
    loop {
        let n = sock.read(&mut buf).context("reading the socket")?;
        if n == 0 {
            return Ok(());
        }
        sock.write_all(&buf[..n]).context("writing the socket")?;
    }
}
