//! The 16-byte descriptor that travels between parties instead of the payload (protocol
//! version 4).
//!
//! ```text
//!  byte  0          3    4        8        12       16
//!        +----------+----+--------+--------+--------+
//!        | slot     |next| len    | request| gen    |
//!        +----------+----+--------+--------+--------+
//!          u24 LE    u8   u32 LE   u32 LE   u32 LE
//! ```
//!
//! * `slot`: index of the slot in the chain's pool (pools have at most 2^24 slots).
//! * `next`: index of the function the descriptor is addressed to, [`Descriptor::GATEWAY`]
//!   for the gateway.
//! * `len`: payload bytes in the slot (after the slot header and metadata).
//! * `request`: the gateway's id for the request this slot belongs to.
//! * `gen`: the slot's full 32-bit generation when it was sent; a slot freed and reused since
//!   then has another generation, so a stale descriptor is refused. A generation moves on
//!   once per use of the slot (at least one request), so it comes round again only after 2^32
//!   uses of that one slot: hours at any rate a chain reaches, while a descriptor lingers at
//!   most until its receiver takes it or is killed (the request's timeout plus a grace).
//!
//! Ownership of the slot travels with the descriptor: a sender must not touch the slot after
//! sending it, and the receiver takes it over in the owner table (see [`crate::OwnerTable`]).

/// A descriptor. Every 16-byte pattern decodes to one; whether it is acceptable is decided by
/// the receiver's validation against the pool.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Descriptor {
    /// Slot index in the pool (24 bits on the wire).
    pub slot: u32,
    /// Function index of the receiver, or [`Descriptor::GATEWAY`].
    pub next: u8,
    /// Payload length in bytes.
    pub len: u32,
    /// Request id assigned by the gateway.
    pub request: u32,
    /// The slot's generation.
    pub generation: u32,
}

const _: () = assert!(
    cfg!(target_endian = "little"),
    "the ring stores descriptors as native words; the wire format is little-endian"
);

impl Descriptor {
    /// `next` value that addresses the chain's gateway.
    pub const GATEWAY: u8 = 0xFF;
    /// Size on the wire.
    pub const LEN: usize = 16;
    /// Largest slot index a descriptor can carry.
    pub const MAX_SLOT: u32 = (1 << 24) - 1;

    /// The descriptor as two words, as stored in a ring entry.
    pub fn to_words(self) -> [u64; 2] {
        let b = self.to_bytes();
        [
            u64::from_le_bytes(b[0..8].try_into().expect("8 bytes")),
            u64::from_le_bytes(b[8..16].try_into().expect("8 bytes")),
        ]
    }

    /// Inverse of [`Descriptor::to_words`].
    pub fn from_words(w: [u64; 2]) -> Self {
        let mut b = [0u8; 16];
        b[0..8].copy_from_slice(&w[0].to_le_bytes());
        b[8..16].copy_from_slice(&w[1].to_le_bytes());
        Self::from_bytes(b)
    }

    /// Wire bytes. A slot index above [`Descriptor::MAX_SLOT`] cannot be encoded; it is
    /// truncated to 24 bits (no pool has such a slot, so the receiver refuses it anyway).
    pub fn to_bytes(self) -> [u8; 16] {
        let mut b = [0u8; 16];
        let slot_next = (self.slot & Self::MAX_SLOT) | (u32::from(self.next) << 24);
        b[0..4].copy_from_slice(&slot_next.to_le_bytes());
        b[4..8].copy_from_slice(&self.len.to_le_bytes());
        b[8..12].copy_from_slice(&self.request.to_le_bytes());
        b[12..16].copy_from_slice(&self.generation.to_le_bytes());
        b
    }

    /// Parses wire bytes.
    pub fn from_bytes(b: [u8; 16]) -> Self {
        let word = |r: std::ops::Range<usize>| u32::from_le_bytes(b[r].try_into().expect("4"));
        let slot_next = word(0..4);
        Self {
            slot: slot_next & Self::MAX_SLOT,
            next: (slot_next >> 24) as u8,
            len: word(4..8),
            request: word(8..12),
            generation: word(12..16),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Byte-level test vector; `docs/protocol.md` carries the same one.
    #[test]
    fn wire_vector() {
        let d = Descriptor {
            slot: 0x0002_0304,
            next: 0x01,
            len: 0x0000_0400,
            request: 0xAABB_CCDD,
            generation: 0x1234_5678,
        };
        let bytes = d.to_bytes();
        assert_eq!(
            bytes,
            [
                0x04, 0x03, 0x02, 0x01, 0x00, 0x04, 0x00, 0x00, 0xDD, 0xCC, 0xBB, 0xAA, 0x78, 0x56,
                0x34, 0x12
            ]
        );
        assert_eq!(Descriptor::from_bytes(bytes), d);
        assert_eq!(Descriptor::from_words(d.to_words()), d);
    }

    #[test]
    fn every_pattern_round_trips() {
        for seed in 0..1000u64 {
            let mut b = [0u8; 16];
            for (i, x) in b.iter_mut().enumerate() {
                *x = (seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (i * 3 % 56)) as u8;
            }
            let d = Descriptor::from_bytes(b);
            assert!(d.slot <= Descriptor::MAX_SLOT);
            assert_eq!(d.to_bytes(), b);
        }
    }
}
