//! Bodies of any size up to `max_body`, in and out, without holding them in the gateway's
//! memory.
//!
//! In ([`Sink`]): a request body is kept as hyper's chunks while it fits a slot of its
//! route's pool beside the metadata (a slow client then holds memory of its own, never a
//! slot); once it grows past that, or its `Content-Length` (a gRPC message's length prefix)
//! says it will, it goes into a slot of the route's large pool, each further frame copied
//! there as it arrives: the one copy in. Bounded by `max_body` (413) and, around the reading,
//! `body_timeout` (408): a body cut short frees its slot. A refused body is read on a little
//! (up to 1 MiB, 1 s) so that the client, still sending, gets the answer that says why.
//!
//! Out ([`AnswerBody`]): an answer is sent in pieces of at most [`PIECE`] bytes as hyper asks
//! for them; one over `ingress::COPY_UP_TO` (1 KiB) is a view of its slot
//! (`ingress::SlotBytes`), so its pieces go from the slot to the socket (HTTP/1.1 in clear:
//! a `writev` of the head and the slot's bytes) and the slot is freed when the answer is
//! written, or dropped with its connection or its HTTP/2 stream (see `stall` for a client
//! that stops reading, and `ingress::HeldSlots` for how many small slots answers may hold).

mod answer;
mod sink;

pub(crate) use answer::AnswerBody;
pub(crate) use sink::{linger, malformed, read, Received, Sink};
