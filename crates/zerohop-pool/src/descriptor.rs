//! The 16-byte descriptor that travels between parties instead of the payload.
//!
//! ```text
//!  byte  0        4        8        12     14   15   16
//!        +--------+--------+--------+------+----+----+
//!        | slot   | len    | request| gen  |next|flag|
//!        +--------+--------+--------+------+----+----+
//!          u32 LE   u32 LE   u32 LE  u16 LE  u8   u8
//! ```
//!
//! * `slot`: index of the slot in the chain's pool.
//! * `len`: payload bytes in the slot (after the slot header and metadata).
//! * `request`: the gateway's id for the request this slot belongs to.
//! * `gen`: low 16 bits of the slot's generation when it was sent; a slot freed and reused
//!   since then has another generation, so a stale descriptor is refused.
//! * `next`: index of the function the descriptor is addressed to, [`Descriptor::GATEWAY`]
//!   for the gateway.
//! * `flags`: reserved, must be zero in protocol version 1.
//!
//! Ownership of the slot travels with the descriptor: a sender must not touch the slot after
//! sending it, and the receiver takes it over in the owner table (see [`crate::OwnerTable`]).

/// A descriptor, laid out exactly as on the wire (little-endian hosts only).
#[repr(C, align(8))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Descriptor {
    /// Slot index in the pool.
    pub slot: u32,
    /// Payload length in bytes.
    pub len: u32,
    /// Request id assigned by the gateway.
    pub request: u32,
    /// Low 16 bits of the slot generation.
    pub generation: u16,
    /// Function index of the receiver, or [`Descriptor::GATEWAY`].
    pub next: u8,
    /// Reserved flags, zero.
    pub flags: u8,
}

const _: () = assert!(core::mem::size_of::<Descriptor>() == 16);
const _: () = assert!(core::mem::align_of::<Descriptor>() == 8);
const _: () = assert!(
    cfg!(target_endian = "little"),
    "the wire format is little-endian"
);

impl Descriptor {
    /// `next` value that addresses the chain's gateway.
    pub const GATEWAY: u8 = 0xFF;
    /// Size on the wire.
    pub const LEN: usize = 16;

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

    /// Wire bytes (little-endian fields, in declaration order).
    pub fn to_bytes(self) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[0..4].copy_from_slice(&self.slot.to_le_bytes());
        b[4..8].copy_from_slice(&self.len.to_le_bytes());
        b[8..12].copy_from_slice(&self.request.to_le_bytes());
        b[12..14].copy_from_slice(&self.generation.to_le_bytes());
        b[14] = self.next;
        b[15] = self.flags;
        b
    }

    /// Parses wire bytes. Every bit pattern is a syntactically valid descriptor; whether it
    /// is acceptable is decided by the receiver's validation against the pool.
    pub fn from_bytes(b: [u8; 16]) -> Self {
        Self {
            slot: u32::from_le_bytes(b[0..4].try_into().expect("4 bytes")),
            len: u32::from_le_bytes(b[4..8].try_into().expect("4 bytes")),
            request: u32::from_le_bytes(b[8..12].try_into().expect("4 bytes")),
            generation: u16::from_le_bytes(b[12..14].try_into().expect("2 bytes")),
            next: b[14],
            flags: b[15],
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
            slot: 0x0102_0304,
            len: 0x0000_0400,
            request: 0xAABB_CCDD,
            generation: 0x1234,
            next: 0x01,
            flags: 0,
        };
        let bytes = d.to_bytes();
        assert_eq!(
            bytes,
            [
                0x04, 0x03, 0x02, 0x01, 0x00, 0x04, 0x00, 0x00, 0xDD, 0xCC, 0xBB, 0xAA, 0x34, 0x12,
                0x01, 0x00
            ]
        );
        // The in-memory representation is the wire representation.
        // SAFETY: Descriptor is repr(C), 16 bytes, all fields plain integers, no padding.
        let raw: [u8; 16] = unsafe { core::mem::transmute(d) };
        assert_eq!(raw, bytes);
        assert_eq!(Descriptor::from_bytes(bytes), d);
        assert_eq!(Descriptor::from_words(d.to_words()), d);
    }
}
