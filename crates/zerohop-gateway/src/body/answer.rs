//! The body of an HTTP or gRPC answer: data in pieces of at most [`PIECE`] bytes (from
//! memory or a slot, or read from a file as the client takes them), then the trailers (gRPC's
//! status).

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::HeaderMap;
use hyper::body::{Frame, SizeHint};
use tokio::io::{AsyncRead, ReadBuf};

/// Largest data frame an answer hands hyper: hyper's HTTP/1.1 writer copies a frame into its
/// buffer when the connection cannot write vectored (TLS), so a frame is never the whole of a
/// large answer.
pub(crate) const PIECE: usize = 64 * 1024;

/// Data in order, cut into pieces, then trailers. Empty, it ends the stream with the headers
/// (a gRPC Trailers-Only answer).
#[derive(Debug, Default)]
pub(crate) struct AnswerBody {
    /// Data still to send, in order (a gRPC message's prefix, then the message).
    data: [Option<Bytes>; 2],
    /// Then the rest of a file: its bytes still to send (an async request's result, read
    /// piece by piece, so many readers of large results hold no more than a piece each).
    file: Option<(tokio::fs::File, u64)>,
    trailers: Option<HeaderMap>,
}

impl AnswerBody {
    /// A body of `data` alone.
    pub(crate) fn new(data: Bytes) -> Self {
        Self {
            data: [Some(data).filter(|d| !d.is_empty()), None],
            file: None,
            trailers: None,
        }
    }

    /// A body of the next `len` bytes of `file` (from where it is positioned).
    pub(crate) fn file(file: std::fs::File, len: u64) -> Self {
        Self {
            data: [None, None],
            file: (len > 0).then(|| (tokio::fs::File::from_std(file), len)),
            trailers: None,
        }
    }

    /// `prefix` and `message` as data, then `trailers`.
    pub(crate) fn message(prefix: Bytes, message: Bytes, trailers: HeaderMap) -> Self {
        Self {
            data: [Some(prefix), Some(message).filter(|m| !m.is_empty())],
            file: None,
            trailers: Some(trailers),
        }
    }

    fn left(&self) -> u64 {
        self.data
            .iter()
            .flatten()
            .map(|d| d.len() as u64)
            .sum::<u64>()
            + self.file.as_ref().map_or(0, |(_, n)| *n)
    }
}

impl hyper::body::Body for AnswerBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = &mut *self;
        if let Some(d) = this.data.iter_mut().find(|d| d.is_some()) {
            let rest = d.as_mut().expect("found as some");
            let piece = if rest.len() > PIECE {
                // A slice of the same buffer (of the slot): no copy.
                rest.split_to(PIECE)
            } else {
                d.take().expect("found as some")
            };
            return Poll::Ready(Some(Ok(Frame::data(piece))));
        }
        if let Some((file, left)) = &mut this.file {
            let mut buf = vec![0u8; PIECE.min(*left as usize)];
            let mut read = ReadBuf::new(&mut buf);
            match Pin::new(file).poll_read(cx, &mut read) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok(())) if !read.filled().is_empty() => {
                    let n = read.filled().len();
                    *left -= n as u64;
                    if *left == 0 {
                        this.file = None;
                    }
                    buf.truncate(n);
                    return Poll::Ready(Some(Ok(Frame::data(Bytes::from(buf)))));
                }
                outcome => {
                    // Short or unreadable: the body ends before its announced length, and
                    // hyper closes the connection rather than pass it off as whole.
                    tracing::warn!("an async result's file ended early: {outcome:?}");
                    this.file = None;
                    return Poll::Ready(None);
                }
            }
        }
        Poll::Ready(this.trailers.take().map(|t| Ok(Frame::trailers(t))))
    }

    fn is_end_stream(&self) -> bool {
        self.data.iter().all(Option::is_none) && self.file.is_none() && self.trailers.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.left())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use http_body_util::BodyExt;
    use zerohop_pool::{Owner, Pool, PoolGeometry};

    use super::*;
    use crate::ingress::SlotBytes;

    #[tokio::test]
    async fn data_in_order_then_the_trailers() {
        let mut t = HeaderMap::new();
        t.insert("grpc-status", http::HeaderValue::from_static("0"));
        let b = AnswerBody::message(
            Bytes::from_static(b"\0\0\0\0\x02"),
            Bytes::from_static(b"hi"),
            t,
        );
        assert_eq!(hyper::body::Body::size_hint(&b).exact(), Some(7));
        assert!(!hyper::body::Body::is_end_stream(&b));
        let all = b.collect().await.unwrap();
        assert_eq!(all.trailers().unwrap()["grpc-status"], "0");
        assert_eq!(&all.to_bytes()[..], b"\0\0\0\0\x02hi");
        assert!(hyper::body::Body::is_end_stream(&AnswerBody::default()));
        assert!(hyper::body::Body::is_end_stream(&AnswerBody::new(
            Bytes::new()
        )));
    }

    #[tokio::test]
    async fn a_large_body_goes_in_pieces_of_at_most_piece_bytes() {
        let data: Vec<u8> = (0..3 * PIECE + 17).map(|i| (i % 251) as u8).collect();
        let mut b = AnswerBody::new(Bytes::from(data.clone()));
        let mut got = Vec::new();
        let mut frames = 0;
        while let Some(f) = b.frame().await {
            let d = f.unwrap().into_data().unwrap();
            assert!(d.len() <= PIECE, "a frame of {} bytes", d.len());
            got.extend_from_slice(&d);
            frames += 1;
            assert_eq!(
                hyper::body::Body::size_hint(&b).exact(),
                Some((data.len() - got.len()) as u64)
            );
        }
        assert_eq!(frames, 4);
        assert_eq!(got, data);
    }

    #[tokio::test]
    async fn a_file_body_is_read_in_pieces_from_where_it_stands() {
        use std::io::{Seek, SeekFrom, Write};
        let data: Vec<u8> = (0..2 * PIECE + 5).map(|i| (i % 253) as u8).collect();
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(b"head\n").unwrap();
        f.write_all(&data).unwrap();
        f.seek(SeekFrom::Start(5)).unwrap();
        let mut b = AnswerBody::file(f, data.len() as u64);
        assert_eq!(
            hyper::body::Body::size_hint(&b).exact(),
            Some(data.len() as u64)
        );
        let mut got = Vec::new();
        while let Some(frame) = b.frame().await {
            let d = frame.unwrap().into_data().unwrap();
            assert!(d.len() <= PIECE);
            got.extend_from_slice(&d);
        }
        assert_eq!(got, data);
        assert!(hyper::body::Body::is_end_stream(&b));
        // A file shorter than announced ends the body early (hyper then drops the connection).
        let short = tempfile::tempfile().unwrap();
        let mut b = AnswerBody::file(short, 10);
        assert!(b.frame().await.is_none());
    }

    fn pool(name: &str) -> Arc<Pool> {
        let geometry = PoolGeometry {
            slots: 2,
            first_slot: 0,
            slot_size: 1024 * 1024,
            max_parties: 2,
            hugepages: false,
            // As a large pool's: pages given back when a slot is freed.
            release: true,
        };
        Arc::new(Pool::create(name, &geometry).unwrap())
    }

    #[tokio::test]
    async fn an_answer_kept_in_its_slot_frees_it_when_the_body_and_its_pieces_are_dropped() {
        let pool = pool("answer-slot");
        let me = Owner::party(0);
        let mut slot = pool.alloc(me).unwrap();
        let len = 3 * PIECE;
        slot.data_mut()[10..10 + len].fill(7);
        let mut b = AnswerBody::new(SlotBytes::bytes(slot, 10..10 + len));
        let first = b.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(first.len(), PIECE);
        assert!(first.iter().all(|&x| x == 7));
        assert_eq!(pool.held_by(me).len(), 1);
        // A client gone mid-answer: hyper drops the body; a piece it still holds keeps the
        // slot until it is dropped too.
        drop(b);
        assert_eq!(pool.held_by(me).len(), 1);
        drop(first);
        assert!(pool.held_by(me).is_empty());
        // Written to the end, the slot is freed as well.
        let slot = pool.alloc(me).unwrap();
        let all = AnswerBody::new(SlotBytes::bytes(slot, 0..len))
            .collect()
            .await
            .unwrap()
            .to_bytes();
        assert_eq!(all.len(), len);
        drop(all);
        assert!(pool.held_by(me).is_empty());
    }
}
