//! The Rust mirror of `bpf/zerohop.h`, the header the eBPF programs include: every struct,
//! map key and constant both sides use. The header is the source of truth; the test
//! `header_matches` compiles it with the C compiler and compares every size, offset and
//! value below with what C says.

/// Bytes of a descriptor.
pub const DESC_LEN: usize = 16;
/// Bytes of a message on a party's socket: the descriptor and a [`Trailer`].
pub const MSG_LEN: usize = 20;
/// Offset of the descriptor's `next` byte.
pub const DESC_NEXT: usize = 3;
/// Offset of the descriptor's request id.
pub const DESC_REQUEST: usize = 8;
/// The gateway's function index.
pub const GATEWAY_FN: u32 = 255;
/// Counter row of senders the program does not know.
pub const UNKNOWN_SENDER: u32 = 256;
/// Counter rows: one per function index, then [`UNKNOWN_SENDER`].
pub const STAT_ROWS: u32 = 257;
/// Instances per function the program can pick from.
pub const MAX_INSTANCES: u32 = 4096;
/// Trailer verdict: delivered along a declared edge.
pub const VERDICT_DELIVERED: u8 = 0;
/// Trailer verdict: the edge is not declared; the descriptor came back to the gateway.
pub const VERDICT_REFUSED_EDGE: u8 = 1;
/// Drop reason: not exactly one message of [`MSG_LEN`] bytes.
pub const DROP_MALFORMED: usize = 0;
/// Drop reason: the edge is not declared.
pub const DROP_EDGE: usize = 1;
/// Drop reason: the next function has no instance.
pub const DROP_NO_INSTANCE: usize = 2;
/// Drop reason: the chosen party has no socket in the map.
pub const DROP_NO_SOCKET: usize = 3;
/// Drop reason: the sender's socket is not registered.
pub const DROP_UNKNOWN: usize = 4;
/// Drop reasons.
pub const DROPS: usize = 5;

/// Names of the drop reasons, by index, as metrics label them.
pub const DROP_NAMES: [&str; DROPS] = [
    "malformed",
    "edge_not_declared",
    "no_instance",
    "no_socket",
    "unknown_sender",
];

/// `struct zh_trailer`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Trailer {
    /// Sender writes the instance it chose; the receiver reads the sender.
    pub party: u16,
    /// `VERDICT_*`, written by the program.
    pub verdict: u8,
    /// Zero.
    pub reserved: u8,
}

impl Trailer {
    /// Wire bytes (little-endian, as the program reads them on this machine).
    pub fn to_bytes(self) -> [u8; 4] {
        let p = self.party.to_le_bytes();
        [p[0], p[1], self.verdict, self.reserved]
    }

    /// Parses wire bytes.
    pub fn from_bytes(b: [u8; 4]) -> Self {
        Self {
            party: u16::from_le_bytes([b[0], b[1]]),
            verdict: b[2],
            reserved: b[3],
        }
    }
}

/// `struct zh_sender`: value of `zh_senders`, keyed by the socket's local port.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SenderEntry {
    /// The party owning the socket.
    pub party: u16,
    /// Its function index.
    pub function: u8,
    /// Zero.
    pub reserved: u8,
}

/// `struct zh_config`: the only entry of `zh_config`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Config {
    /// Gateway parties.
    pub gateways: u32,
    /// Parties in the chain.
    pub parties: u32,
}

/// `struct zh_fn_stats`: one function's counters (per CPU in the map).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FnStats {
    /// Descriptors this function's instances sent that were delivered.
    pub sent: u64,
    /// Descriptors delivered to this function's instances.
    pub received: u64,
    /// Refused, by reason, counted on the sender's function.
    pub dropped: [u64; DROPS],
}

impl FnStats {
    /// Adds `other` in (summing the per-CPU values).
    pub fn add(&mut self, other: &FnStats) {
        self.sent += other.sent;
        self.received += other.received;
        for (a, b) in self.dropped.iter_mut().zip(other.dropped) {
            *a += b;
        }
    }
}

/// `zh_edge_key`.
pub fn edge_key(from: u32, to: u32) -> u32 {
    (from << 8) | to
}

/// `zh_instance_key`.
pub fn instance_key(f: u32, i: u32) -> u32 {
    f * MAX_INSTANCES + i
}

// SAFETY: a plain `repr(C)` struct of integers with no padding (the sizes are checked
// against C in `header_matches`), so every bit pattern is a valid value.
unsafe impl aya::Pod for SenderEntry {}
// SAFETY: as above.
unsafe impl aya::Pod for Config {}
// SAFETY: as above.
unsafe impl aya::Pod for FnStats {}
// SAFETY: as above.
unsafe impl aya::Pod for Trailer {}
