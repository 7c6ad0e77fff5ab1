//! The transport backends a chain may name (`transport:`); the transport crate implements
//! them.

use std::str::FromStr;

/// Which backend moves descriptors.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Backend {
    /// Shared-memory queues with spin-then-futex wakeup (default).
    #[default]
    Ring,
    /// Unix `SOCK_SEQPACKET` socketpair per allowed edge.
    Socket,
    /// The ring with function instances' receivers that never sleep (SPRIGHT's D-mode, for
    /// comparison): the lowest hop latency, a core per polling thread, busy when idle.
    Poll,
    /// A socket per party in a BPF sockmap; an eBPF program redirects descriptors and
    /// enforces the chain's edges in the kernel (SPRIGHT's S-mode). Needs root.
    Sockmap,
}

impl Backend {
    /// Every backend, for tests and benchmarks that run each.
    pub const ALL: [Backend; 4] = [
        Backend::Ring,
        Backend::Socket,
        Backend::Poll,
        Backend::Sockmap,
    ];

    /// Lower-case name as used in specs and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Ring => "ring",
            Backend::Socket => "socket",
            Backend::Poll => "poll",
            Backend::Sockmap => "sockmap",
        }
    }
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Backend {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "ring" => Ok(Backend::Ring),
            "socket" => Ok(Backend::Socket),
            "poll" => Ok(Backend::Poll),
            "sockmap" => Ok(Backend::Sockmap),
            other => Err(format!(
                "unknown transport {other:?}; use one of: ring, socket, poll, sockmap"
            )),
        }
    }
}
