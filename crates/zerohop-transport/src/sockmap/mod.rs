//! The `sockmap` backend, SPRIGHT's S-mode: descriptors travel through the kernel, where an
//! eBPF program enforces the chain's graph.
//!
//! Every party has one TCP loopback socket, put in a `SOCKMAP` with an `SK_MSG` verdict
//! program attached (`bpf/sockmap.bpf.c`). A sender writes one message, the descriptor and
//! a 4-byte trailer naming the instance it chose, to its own socket; in that `sendmsg` the
//! program finds the sender from its socket, checks the edge against the chain's declared
//! edges, stamps the sender's party into the trailer and redirects the message into the
//! receiver's socket (`BPF_F_INGRESS`), so it never touches TCP. The receiver reads it from
//! its socket and learns the sender from the kernel, not from the sender. An undeclared
//! edge is refused in the kernel: counted, and the descriptor goes back to the gateway
//! waiting for its request, marked refused, which answers it (no request hangs). Idle,
//! every party sleeps in `poll` on its socket: no CPU.
//!
//! Why TCP and `SK_MSG`, not AF_UNIX and `SK_SKB`: on this kernel an `SK_MSG` program never
//! runs for AF_UNIX sockets, and an `SK_SKB` verdict on AF_UNIX redirects but gives
//! spurious `EAGAIN` on blocking reads; a 16-byte ping-pong through an `SK_MSG` ingress
//! redirect costs about 14 us per round trip on TCP loopback, as much as a plain AF_UNIX
//! stream (13 us) and less than plain TCP (20 us) or an egress redirect (28 us). Nothing
//! crosses TCP: the peers of the parties' sockets are held by the agent and never read.
//!
//! The agent holds every party's socket, so a restarted instance inherits the very same
//! socket with whatever was queued in it (as with the other backends); a party's process
//! holds only its own socket. The programs and maps are pinned nowhere: they live as long
//! as the agent's descriptors of them, so a crashed agent leaves nothing loaded.
//!
//! The programs are loaded with [aya](https://aya-rs.dev): pure Rust (no libbpf, libelf or
//! zlib to build or link, which every function's runtime would otherwise carry), well kept,
//! and it reads the BTF map definitions clang emits for the C programs.

pub mod abi;
mod kernel;
mod recv;
mod send;

use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use self::kernel::Kernel;
pub use self::kernel::KernelCounters;
pub use self::recv::SockmapReceiver;
pub use self::send::SockmapSender;
use crate::{sys, Backend, Options, PartyId, Policy, Receiver, Sender, Transport, TransportError};

/// The sockmap transport of one chain: every party's socket and the loaded programs (agent
/// side), or one party's socket.
pub struct SockmapTransport {
    policy: Arc<Policy>,
    /// Each party's socket; a party's process holds only its own.
    socks: Vec<Option<Arc<OwnedFd>>>,
    /// Agent side: the other ends of the parties' TCP connections, held so they stay up.
    _peers: Vec<OwnedFd>,
    /// Agent side: the programs and maps (unloaded when dropped).
    kernel: Option<Kernel>,
}

impl SockmapTransport {
    /// Makes one socket per party of `policy`, loads the programs and fills their maps
    /// (agent side). Refuses with [`TransportError::Unsupported`], naming what is missing,
    /// where the kernel or the privileges do not allow it.
    pub fn create(policy: &Policy, opts: Options) -> Result<Self, TransportError> {
        if policy.parties() == 0 {
            return Err(TransportError::Layout(
                "a chain needs at least one party".into(),
            ));
        }
        kernel::preflight()?;
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).map_err(loopback)?;
        let pairs = pair(&listener, policy.parties().into(), PAIRING_WAIT)?;
        // Closed at once: whoever connects from now on is refused.
        drop(listener);
        let mut socks = Vec::with_capacity(pairs.len());
        let mut peers = Vec::with_capacity(pairs.len());
        let mut ports = Vec::with_capacity(pairs.len());
        for (sock, peer) in pairs {
            let port = sock.local_addr().map_err(loopback)?.port();
            let sock = OwnedFd::from(sock);
            sys::set_send_timeout(sock.as_fd(), opts.send_timeout_ms)?;
            ports.push(port);
            socks.push(Some(Arc::new(sock)));
            peers.push(OwnedFd::from(peer));
        }
        let all: Vec<&OwnedFd> = socks.iter().flatten().map(|s| &**s).collect();
        let kernel = Kernel::load(policy, &all, &ports)?;
        Ok(Self {
            policy: Arc::new(policy.clone()),
            socks,
            _peers: peers,
            kernel: Some(kernel),
        })
    }

    /// Takes the socket of party `me` (the one fd [`Transport::fds_for`] gives). The send
    /// timeout came with the socket.
    pub fn attach(
        policy: &Policy,
        me: PartyId,
        fds: Vec<OwnedFd>,
        _opts: Options,
    ) -> Result<Self, TransportError> {
        if me >= policy.parties() || fds.len() != 1 {
            return Err(TransportError::Layout(format!(
                "sockmap transport: party {me} of {} expects 1 fd, got {}",
                policy.parties(),
                fds.len()
            )));
        }
        let mut socks = vec![None; policy.parties() as usize];
        socks[me as usize] = fds.into_iter().next().map(Arc::new);
        Ok(Self {
            policy: Arc::new(policy.clone()),
            socks,
            _peers: Vec::new(),
            kernel: None,
        })
    }

    fn sock(&self, p: PartyId) -> Result<&Arc<OwnedFd>, TransportError> {
        match self.socks.get(p as usize) {
            None => Err(TransportError::NoSuchParty {
                party: p,
                parties: self.policy.parties(),
            }),
            Some(None) => Err(TransportError::Layout(format!(
                "this process does not hold party {p}'s socket"
            ))),
            Some(Some(s)) => Ok(s),
        }
    }
}

/// How long making every party's socket pair may take (microseconds, normally); past it the
/// transport is not made, rather than its creation hanging on a connection that never comes.
const PAIRING_WAIT: Duration = Duration::from_secs(5);

/// How many connections of other processes [`pair`] closes before it gives up.
const MAX_STRANGERS: usize = 64;

/// The byte each new socket sends to its peer end, which reads it back to prove the pair.
const PROOF: u8 = 0x5a;

/// Makes `count` TCP connections through `listener` (on 127.0.0.1): the party's socket and
/// the peer end it is connected to, in pairs.
///
/// Any local process may connect to the listener meanwhile, and the accept queue does not say
/// whose a connection is. An accepted end is taken only if it proves to be ours: its peer
/// address is the local address of the socket just connected (a TCP 4-tuple belongs to one
/// live connection, so no other process's connection can show it), and the byte that socket
/// sent arrives on it (which a dead connection of another process that once had the same
/// address cannot do). Anything else is closed at once, and after [`MAX_STRANGERS`] of them,
/// or when `wait` has passed, pairing fails, naming the port.
fn pair(
    listener: &TcpListener,
    count: usize,
    wait: Duration,
) -> Result<Vec<(TcpStream, TcpStream)>, TransportError> {
    let addr = listener.local_addr().map_err(loopback)?;
    listener.set_nonblocking(true).map_err(loopback)?;
    let deadline = Instant::now() + wait;
    let left = || deadline.saturating_duration_since(Instant::now());
    let late = |strangers| {
        TransportError::Unsupported(format!(
            "its sockets could not be paired on {addr} within {wait:?} ({strangers} \
             connections of other processes to that port were closed meanwhile); retry, and \
             if it fails again find who connects there (`ss -tnp`)"
        ))
    };
    let mut strangers = 0;
    let mut pairs = Vec::with_capacity(count);
    for _ in 0..count {
        if left().is_zero() {
            return Err(late(strangers));
        }
        let mut ours = TcpStream::connect_timeout(&addr, left()).map_err(|e| {
            if e.kind() == io::ErrorKind::TimedOut {
                late(strangers)
            } else {
                loopback(e)
            }
        })?;
        let me = ours.local_addr().map_err(loopback)?;
        ours.write_all(&[PROOF]).map_err(loopback)?;
        let peer = loop {
            let candidate = match listener.accept() {
                Ok((candidate, from)) if from == me => Some(candidate),
                Ok(_) => None,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if left().is_zero() {
                        return Err(late(strangers));
                    }
                    // Start-up only, and short: our connection is queued by the time connect
                    // returns but for its last ACK's trip through the loopback.
                    std::thread::sleep(Duration::from_millis(1));
                    continue;
                }
                // A connection reset before it was accepted, or a signal.
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::ConnectionAborted | io::ErrorKind::Interrupted
                    ) =>
                {
                    continue
                }
                Err(e) => return Err(loopback(e)),
            };
            if let Some(mut candidate) = candidate {
                // Bounded: our byte is there already; a dead end says so at once. (The peer
                // ends are never read again, so the timeout may stay.)
                let mut got = [0u8];
                let proved = candidate
                    .set_read_timeout(Some(left().max(Duration::from_millis(1))))
                    .and_then(|()| candidate.read_exact(&mut got))
                    .is_ok_and(|()| got == [PROOF]);
                if proved {
                    break candidate;
                }
            }
            // Not ours: dropped here, which closes it.
            strangers += 1;
            if strangers > MAX_STRANGERS {
                return Err(TransportError::Unsupported(format!(
                    "other processes connected {strangers} times to the port its sockets are \
                     paired on ({addr}), and their connections were closed; retry, and if it \
                     fails again find who connects there (`ss -tnp`)"
                )));
            }
        };
        pairs.push((ours, peer));
    }
    Ok(pairs)
}

fn loopback(e: std::io::Error) -> TransportError {
    TransportError::Unsupported(format!(
        "its sockets are TCP connections on 127.0.0.1, which failed ({e}); is the loopback \
         interface up?"
    ))
}

impl Transport for SockmapTransport {
    fn backend(&self) -> Backend {
        Backend::Sockmap
    }

    fn parties(&self) -> u16 {
        self.policy.parties()
    }

    fn fds_for(&self, party: PartyId) -> Result<Vec<OwnedFd>, TransportError> {
        let fd = self
            .sock(party)?
            .try_clone()
            .map_err(|source| TransportError::Syscall {
                call: "dup",
                source,
            })?;
        Ok(vec![fd])
    }

    fn queued(&self, party: PartyId) -> usize {
        // Every message is MSG_LEN bytes; the socket's byte count says how many.
        self.sock(party)
            .map_or(0, |s| sys::queued_bytes(s.as_fd()) / abi::MSG_LEN)
    }

    fn sender(&self, me: PartyId) -> Result<Box<dyn Sender>, TransportError> {
        Ok(Box::new(SockmapSender::new(
            self.sock(me)?.clone(),
            self.policy.clone(),
            me,
        )))
    }

    fn receiver(&self, me: PartyId) -> Result<Box<dyn Receiver>, TransportError> {
        Ok(Box::new(SockmapReceiver::new(self.sock(me)?.clone())?))
    }

    fn kernel_counters(&self) -> Option<KernelCounters> {
        self.kernel.as_ref().and_then(|k| k.counters().ok())
    }
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;

    const WAIT: Duration = Duration::from_secs(5);

    fn listener() -> (TcpListener, SocketAddr) {
        let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let addr = l.local_addr().unwrap();
        (l, addr)
    }

    /// Connects as another local process would; reads time out instead of hanging.
    fn stranger(addr: SocketAddr) -> TcpStream {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(WAIT)).unwrap();
        s
    }

    /// Whether the other end of `s` was closed (end of file or reset), not left open.
    fn closed(mut s: &TcpStream) -> bool {
        let mut b = [0u8; 1];
        match s.read(&mut b) {
            Ok(0) => true,
            Err(e) => e.kind() == io::ErrorKind::ConnectionReset,
            Ok(_) => false,
        }
    }

    #[test]
    fn pairing_takes_only_its_own_connections_and_closes_a_strangers() {
        let (listener, addr) = listener();
        // First in the accept queue: before, party 0 got this as its peer end and every
        // later party the previous one's.
        let first = stranger(addr);
        // And more while the pairs are being made.
        let done = AtomicBool::new(false);
        let (pairs, later) = std::thread::scope(|s| {
            let flood = s.spawn(|| {
                let mut later = Vec::new();
                while !done.load(Ordering::Relaxed) && later.len() < 32 {
                    later.push(stranger(addr));
                }
                later
            });
            let pairs = pair(&listener, 48, WAIT);
            done.store(true, Ordering::Relaxed);
            (pairs, flood.join().unwrap())
        });
        let pairs = pairs.expect("pairs made");
        // Whoever connected after the last pair waits in the queue until it is closed.
        drop(listener);
        assert_eq!(pairs.len(), 48);
        for (i, (ours, peer)) in pairs.iter().enumerate() {
            assert_eq!(peer.peer_addr().unwrap(), ours.local_addr().unwrap());
            let (mut ours, mut peer) = (ours, peer);
            ours.set_read_timeout(Some(WAIT)).unwrap();
            peer.set_read_timeout(Some(WAIT)).unwrap();
            let b = [i as u8];
            let mut got = [0u8];
            ours.write_all(&b).unwrap();
            peer.read_exact(&mut got)
                .expect("the peer end gets what the party sends");
            assert_eq!(got, b, "pair {i}: one byte, the proof consumed");
            peer.write_all(&b).unwrap();
            ours.read_exact(&mut got).expect("and the other way");
            assert_eq!(got, b, "pair {i}");
        }
        assert!(closed(&first), "the first stranger's connection is closed");
        for (i, s) in later.iter().enumerate() {
            assert!(closed(s), "stranger {i}'s connection is closed");
        }
    }

    #[test]
    fn pairing_gives_up_on_a_flood_of_strangers_instead_of_waiting_for_ever() {
        let (listener, addr) = listener();
        let flood: Vec<TcpStream> = (0..=MAX_STRANGERS).map(|_| stranger(addr)).collect();
        let err = pair(&listener, 1, WAIT).expect_err("gave up").to_string();
        assert!(err.contains(&addr.to_string()), "{err}");
        assert!(err.contains("other processes"), "{err}");
        assert!(
            flood.iter().all(closed),
            "every stranger's connection is closed"
        );
    }
}
