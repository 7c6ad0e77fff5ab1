//! The body of a gRPC answer: the message's prefix, the message (the bytes the one copy out
//! made, not copied again), then the trailers.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::HeaderMap;
use hyper::body::{Frame, SizeHint};

/// Data frames in order, then trailers. Empty, it ends the stream with the headers (a
/// Trailers-Only answer).
#[derive(Debug, Default)]
pub(crate) struct Body {
    /// Data still to send, in order (at most the prefix and the message).
    data: [Option<Bytes>; 2],
    trailers: Option<HeaderMap>,
}

impl Body {
    /// `prefix` and `message` as data, then `trailers`.
    pub(crate) fn message(prefix: Bytes, message: Bytes, trailers: HeaderMap) -> Self {
        Self {
            data: [Some(prefix), Some(message).filter(|m| !m.is_empty())],
            trailers: Some(trailers),
        }
    }

    fn left(&self) -> u64 {
        self.data.iter().flatten().map(|d| d.len() as u64).sum()
    }
}

impl hyper::body::Body for Body {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = &mut *self;
        if let Some(d) = this.data.iter_mut().find_map(Option::take) {
            return Poll::Ready(Some(Ok(Frame::data(d))));
        }
        Poll::Ready(this.trailers.take().map(|t| Ok(Frame::trailers(t))))
    }

    fn is_end_stream(&self) -> bool {
        self.data.iter().all(Option::is_none) && self.trailers.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.left())
    }
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt;

    use super::*;

    #[tokio::test]
    async fn data_in_order_then_the_trailers() {
        let mut t = HeaderMap::new();
        t.insert("grpc-status", http::HeaderValue::from_static("0"));
        let b = Body::message(
            Bytes::from_static(b"\0\0\0\0\x02"),
            Bytes::from_static(b"hi"),
            t,
        );
        assert_eq!(hyper::body::Body::size_hint(&b).exact(), Some(7));
        assert!(!hyper::body::Body::is_end_stream(&b));
        let all = b.collect().await.unwrap();
        assert_eq!(all.trailers().unwrap()["grpc-status"], "0");
        assert_eq!(&all.to_bytes()[..], b"\0\0\0\0\x02hi");
        assert!(hyper::body::Body::is_end_stream(&Body::default()));
    }
}
