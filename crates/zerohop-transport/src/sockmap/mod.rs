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

use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

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
        let addr = listener.local_addr().map_err(loopback)?;
        let mut socks = Vec::with_capacity(policy.parties() as usize);
        let mut peers = Vec::with_capacity(policy.parties() as usize);
        let mut ports = Vec::with_capacity(policy.parties() as usize);
        for _ in 0..policy.parties() {
            let sock = TcpStream::connect(addr).map_err(loopback)?;
            let (peer, _) = listener.accept().map_err(loopback)?;
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
