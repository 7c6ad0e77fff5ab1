//! A request body read as it arrives, into memory while it is small and into a large slot
//! once it is not (see the parent module).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;
use http_body_util::BodyExt;
use zerohop_pool::{Owner, Pool};

use crate::grpc::{FrameError, Unframe};
use crate::ingress::{no_free_slot, too_large, Filled};
use crate::{ErrorSource, GatewayError};

/// A whole request body, as the functions get it (a gRPC message without its prefix).
pub(crate) enum Received {
    /// hyper's chunks (or slices of them): the body fits a slot of the route's pool beside
    /// its metadata, and is copied into one when it is sent.
    Chunks(Vec<Bytes>),
    /// Already in a slot of the route's large pool, behind its metadata.
    Slot(Filled),
}

impl Received {
    /// Bytes of body.
    pub(crate) fn len(&self) -> u64 {
        match self {
            Received::Chunks(c) => c.iter().map(|c| c.len() as u64).sum(),
            Received::Slot(f) => f.len() as u64,
        }
    }
}

/// Where a request body goes while it arrives.
pub(crate) struct Sink<'a> {
    /// The metadata lines the slot starts with.
    meta: &'a str,
    /// Body bytes a slot of the route's pool takes beside `meta`.
    room: u64,
    /// The route's large pool (`None`: `max_body` fits a slot of its pool).
    large: Option<&'a Arc<Pool>>,
    /// Who takes the large slot (the gateway's party).
    owner: Owner,
    /// `max_body`: bytes the client may send, a gRPC message's prefix included.
    max: u64,
    /// Bytes the client sent so far.
    read: u64,
    /// For a gRPC call, what takes its message out of the body.
    unframe: Option<Unframe>,
    body: Received,
}

impl<'a> Sink<'a> {
    /// A sink for a request whose slot starts with `meta`, on a route whose pool's slots
    /// hold `capacity` bytes and whose large pool is `large`; `grpc`: the body is a gRPC
    /// call's, whose message alone is kept.
    pub(crate) fn new(
        meta: &'a str,
        capacity: usize,
        large: Option<&'a Arc<Pool>>,
        owner: Owner,
        max: u64,
        grpc: bool,
    ) -> Self {
        Self {
            meta,
            room: capacity.saturating_sub(meta.len()) as u64,
            large,
            owner,
            max,
            read: 0,
            unframe: grpc.then(Unframe::default),
            body: Received::Chunks(Vec::new()),
        }
    }

    /// Takes a large slot at once when the client announced (`Content-Length`) a body that
    /// will not fit a slot of the route's pool.
    pub(crate) fn expect(&mut self, content_length: Option<u64>) -> Result<(), GatewayError> {
        let Some(len) = content_length else {
            return Ok(());
        };
        if len > self.max {
            return Err(too_large(self.max));
        }
        // A gRPC body's prefix does not go into the slot.
        let body = match self.unframe {
            Some(_) => len.saturating_sub(crate::grpc::PREFIX as u64),
            None => len,
        };
        if body > self.room {
            self.go_large()?;
        }
        Ok(())
    }

    /// Takes one frame's data.
    pub(crate) fn push(&mut self, data: Bytes) -> Result<(), GatewayError> {
        self.read += data.len() as u64;
        if self.read > self.max {
            return Err(too_large(self.max));
        }
        let data = match &mut self.unframe {
            Some(u) => {
                let message = u.push(data).map_err(FrameError::into_gateway)?;
                if u.message_len().is_some_and(|n| n > self.room) {
                    self.go_large()?;
                }
                message
            }
            None => data,
        };
        if data.is_empty() {
            return Ok(());
        }
        if let Received::Chunks(_) = &self.body {
            if self.body.len() + data.len() as u64 > self.room {
                self.go_large()?;
            }
        }
        match &mut self.body {
            Received::Chunks(chunks) => chunks.push(data),
            // The one copy in, as the frame arrives.
            Received::Slot(filled) => filled.append(&data).map_err(|_| too_large(self.max))?,
        }
        Ok(())
    }

    /// The whole body, once the client sent it all.
    pub(crate) fn finish(self) -> Result<Received, GatewayError> {
        if let Some(u) = &self.unframe {
            u.finish().map_err(FrameError::into_gateway)?;
        }
        Ok(self.body)
    }

    /// Moves the body into a slot of the large pool, with what came so far.
    fn go_large(&mut self) -> Result<(), GatewayError> {
        let Received::Chunks(chunks) = &self.body else {
            return Ok(());
        };
        // Without a large pool `max_body` fits a slot: a body that does not is too large.
        let large = self.large.ok_or_else(|| too_large(self.max))?;
        let Some(slot) = large.alloc(self.owner) else {
            tracing::debug!("every large slot is in use; answered 503");
            return Err(no_free_slot(large, true));
        };
        let mut filled = Filled::start(slot, self.meta).map_err(|_| too_large(self.max))?;
        for c in chunks {
            filled.append(c).map_err(|_| too_large(self.max))?;
        }
        self.body = Received::Slot(filled);
        Ok(())
    }
}

/// Body bytes read and dropped after a body was refused on its way in ([`linger`]).
pub(crate) const LINGER_BYTES: u64 = 1 << 20;
/// How long [`linger`] reads at most.
pub(crate) const LINGER_TIME: Duration = Duration::from_secs(1);

/// A request body hyper could not read (bad chunking, a reset stream): 400.
pub(crate) fn malformed(e: impl std::fmt::Display) -> GatewayError {
    GatewayError::new(
        StatusCode::BAD_REQUEST,
        ErrorSource::Gateway,
        format!("malformed request body: {e}"),
    )
}

/// Reads `body` into `sink` to its end. Not bounded in time: the caller bounds it with
/// `body_timeout` (dropping the future frees a slot taken).
pub(crate) async fn read<B>(mut sink: Sink<'_>, mut body: B) -> Result<Received, GatewayError>
where
    B: hyper::body::Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Display,
{
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(malformed)?;
        if let Ok(data) = frame.into_data() {
            if let Err(e) = sink.push(data) {
                // The slot (if one was taken) is freed before the client is heard out.
                drop(sink);
                linger(&mut body).await;
                return Err(e);
            }
        }
    }
    sink.finish()
}

/// Reads and drops what the client is still sending of a refused body, at most
/// [`LINGER_BYTES`] within [`LINGER_TIME`]: an HTTP/1.1 connection closed with unread bytes
/// in its socket is reset by the kernel, and a client still sending often loses the answer
/// (the 413 or 503 that says why) with it. What is past the bound is cut, as nginx's
/// lingering close does.
pub(crate) async fn linger<B>(body: &mut B)
where
    B: hyper::body::Body<Data = Bytes> + Unpin,
{
    let drain = async {
        let mut left = LINGER_BYTES;
        while let Some(Ok(frame)) = body.frame().await {
            if let Ok(data) = frame.into_data() {
                left = left.saturating_sub(data.len() as u64);
                if left == 0 {
                    return;
                }
            }
        }
    };
    let _ = tokio::time::timeout(LINGER_TIME, drain).await;
}

#[cfg(test)]
mod tests {
    use http_body_util::Full;
    use hyper::body::Frame;
    use zerohop_pool::PoolGeometry;

    use super::*;

    const OWNER: Owner = Owner::party(0);

    fn pool(name: &str, slots: u32, slot_size: u32) -> Arc<Pool> {
        let geometry = PoolGeometry {
            slots,
            first_slot: 0,
            slot_size,
            max_parties: 2,
            hugepages: false,
            // As a large pool's: pages given back when a slot is freed.
            release: true,
        };
        Arc::new(Pool::create(name, &geometry).unwrap())
    }

    fn bytes(n: usize, seed: u8) -> Vec<u8> {
        (0..n).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect()
    }

    /// `data` pushed in chunks of `cut` bytes.
    fn push_all(sink: &mut Sink<'_>, data: &[u8], cut: usize) -> Result<(), GatewayError> {
        for c in data.chunks(cut) {
            sink.push(Bytes::copy_from_slice(c))?;
        }
        Ok(())
    }

    #[test]
    fn a_body_that_fits_a_slot_stays_in_the_chunks_hyper_read() {
        let large = pool("sink-small", 1, 1 << 20);
        let mut sink = Sink::new("a: b\n", 4096, Some(&large), OWNER, 1 << 20, false);
        let data = bytes(4091, 1);
        push_all(&mut sink, &data, 1000).unwrap();
        let Received::Chunks(chunks) = sink.finish().unwrap() else {
            panic!("a body that fits went to a large slot");
        };
        assert_eq!(chunks.concat(), data);
        assert!(large.held_by(OWNER).is_empty());
    }

    #[test]
    fn a_body_that_grows_past_a_slot_streams_into_a_large_one_with_what_came_before() {
        let large = pool("sink-grows", 1, 1 << 20);
        let mut sink = Sink::new("a: b\n", 4096, Some(&large), OWNER, 1 << 20, false);
        let data = bytes(300_000, 2);
        push_all(&mut sink, &data, 777).unwrap();
        assert_eq!(large.held_by(OWNER).len(), 1);
        let Received::Slot(filled) = sink.finish().unwrap() else {
            panic!("a large body stayed in memory");
        };
        assert_eq!(filled.body(), &data[..]);
        drop(filled);
        assert!(large.held_by(OWNER).is_empty(), "the slot is freed on drop");
    }

    #[test]
    fn an_announced_large_body_takes_its_slot_before_any_byte() {
        let large = pool("sink-announced", 1, 1 << 20);
        let mut sink = Sink::new("", 4096, Some(&large), OWNER, 1 << 20, false);
        sink.expect(Some(4096)).unwrap();
        assert!(large.held_by(OWNER).is_empty(), "4096 bytes fit the slot");
        sink.expect(Some(4097)).unwrap();
        assert_eq!(large.held_by(OWNER).len(), 1);
        let e = sink.expect(Some((1 << 20) + 1)).unwrap_err();
        assert_eq!(e.status, StatusCode::PAYLOAD_TOO_LARGE);
    }

    #[test]
    fn a_body_over_max_body_is_413_and_its_slot_is_freed() {
        let large = pool("sink-over", 1, 1 << 20);
        let mut sink = Sink::new("", 4096, Some(&large), OWNER, 100_000, false);
        let e = push_all(&mut sink, &bytes(100_001, 3), 10_000).unwrap_err();
        assert_eq!(e.status, StatusCode::PAYLOAD_TOO_LARGE);
        assert!(e.message.contains("100000 bytes (max_body)"), "{e}");
        assert_eq!(large.held_by(OWNER).len(), 1, "held while the sink lives");
        drop(sink);
        assert!(large.held_by(OWNER).is_empty());
    }

    #[test]
    fn with_every_large_slot_taken_a_large_body_is_503_naming_the_large_slots() {
        let large = pool("sink-busy", 1, 1 << 20);
        let _held = large.alloc(OWNER).unwrap();
        let mut sink = Sink::new("", 4096, Some(&large), OWNER, 1 << 20, false);
        let e = push_all(&mut sink, &bytes(5000, 4), 5000).unwrap_err();
        assert_eq!(e.status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(e.message.contains("all 1 large slots"), "{e}");
        assert!(e
            .headers
            .iter()
            .any(|(n, v)| n == "retry-after" && v == "1"));
        // Without a large pool, a body past the slot is too large.
        let mut sink = Sink::new("", 4096, None, OWNER, 1 << 20, false);
        let e = push_all(&mut sink, &bytes(5000, 4), 5000).unwrap_err();
        assert_eq!(e.status, StatusCode::PAYLOAD_TOO_LARGE);
    }

    #[test]
    fn a_grpc_message_goes_into_the_slot_without_its_prefix_however_it_is_cut() {
        let large = pool("sink-grpc", 1, 1 << 20);
        let message = bytes(200_000, 5);
        let mut body = crate::grpc::prefix(message.len()).to_vec();
        body.extend_from_slice(&message);
        for cut in [1, 3, 5, 4096, 65_536, body.len()] {
            let mut sink = Sink::new("x: y\n", 4096, Some(&large), OWNER, 1 << 20, true);
            push_all(&mut sink, &body, cut).unwrap();
            let Received::Slot(filled) = sink.finish().unwrap() else {
                panic!("cut {cut}: a large message stayed in memory");
            };
            assert!(filled.body() == &message[..], "cut {cut}");
        }
        // The length prefix alone sends a large message to a slot.
        let mut sink = Sink::new("", 4096, Some(&large), OWNER, 1 << 20, true);
        sink.push(Bytes::copy_from_slice(&body[..5])).unwrap();
        assert_eq!(large.held_by(OWNER).len(), 1);
        drop(sink);
        // A small message stays in memory, prefix stripped; a second message is refused.
        let mut sink = Sink::new("", 4096, Some(&large), OWNER, 1 << 20, true);
        push_all(&mut sink, &[0, 0, 0, 0, 2, b'h', b'i'], 3).unwrap();
        let Received::Chunks(c) = sink.finish().unwrap() else {
            panic!("a small message went to a large slot");
        };
        assert_eq!(c.concat(), b"hi");
        let mut sink = Sink::new("", 4096, Some(&large), OWNER, 1 << 20, true);
        let e = push_all(&mut sink, &[0, 0, 0, 0, 1, b'h', 0, 0, 0, 0, 1, b'i'], 12).unwrap_err();
        assert_eq!(e.status, StatusCode::NOT_IMPLEMENTED);
        // Cut short inside the message.
        let mut sink = Sink::new("", 4096, Some(&large), OWNER, 1 << 20, true);
        push_all(&mut sink, &body[..10_000], 4096).unwrap();
        let Err(e) = sink.finish() else {
            panic!("a message cut short was taken");
        };
        assert_eq!(e.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert!(large.held_by(OWNER).is_empty());
    }

    #[tokio::test]
    async fn read_takes_a_body_frame_by_frame_and_reports_a_broken_one() {
        let large = pool("sink-read", 1, 1 << 20);
        let data = bytes(100_000, 6);
        let sink = Sink::new("", 4096, Some(&large), OWNER, 1 << 20, false);
        let Received::Slot(f) = read(sink, Full::new(Bytes::from(data.clone())))
            .await
            .unwrap()
        else {
            panic!("a large body stayed in memory");
        };
        assert!(f.body() == &data[..]);
        drop(f);
        let frames = vec![
            Ok(Frame::data(Bytes::from(data.clone()))),
            Err(std::io::Error::other("connection reset")),
        ];
        let sink = Sink::new("", 4096, Some(&large), OWNER, 1 << 20, false);
        let Err(e) = read(sink, Frames(frames.into_iter())).await else {
            panic!("a broken body was taken");
        };
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert!(e.message.contains("connection reset"), "{e}");
        assert!(large.held_by(OWNER).is_empty(), "the slot is freed");
    }

    #[tokio::test]
    async fn a_body_refused_on_its_way_in_is_heard_out_a_little_then_cut() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let large = pool("sink-linger", 1, 1 << 20);
        let polled = Arc::new(AtomicUsize::new(0));
        let counted = polled.clone();
        // 100 frames of 64 KiB, over a max_body of 200 KB after the fourth.
        let frames = (0..100).map(move |_| {
            counted.fetch_add(1, Ordering::Relaxed);
            Ok(Frame::data(Bytes::from(vec![7u8; 64 * 1024])))
        });
        let sink = Sink::new("", 4096, Some(&large), OWNER, 200_000, false);
        let Err(e) = read(sink, Frames(frames)).await else {
            panic!("a body over max_body was taken");
        };
        assert_eq!(e.status, StatusCode::PAYLOAD_TOO_LARGE);
        let read_in_all = polled.load(Ordering::Relaxed) as u64;
        let lingered = (read_in_all - 4) * 64 * 1024;
        assert!(
            (LINGER_BYTES..LINGER_BYTES + 64 * 1024).contains(&lingered),
            "{lingered} bytes read after the refusal"
        );
        assert!(large.held_by(OWNER).is_empty(), "the slot is freed first");
    }

    /// A body of the frames (or errors) of an iterator, as hyper's `Incoming` can give them.
    struct Frames<I>(I);

    impl<I> hyper::body::Body for Frames<I>
    where
        I: Iterator<Item = Result<Frame<Bytes>, std::io::Error>> + Unpin,
    {
        type Data = Bytes;
        type Error = std::io::Error;

        fn poll_frame(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
            std::task::Poll::Ready(self.0.next())
        }
    }
}
