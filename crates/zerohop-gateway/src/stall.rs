//! Clients that stop reading: a connection whose answers make no progress for the chain's
//! `body_timeout` is closed, which drops its answers and frees the slots they stream from.
//!
//! hyper polls an answer's body only while the socket takes what it already has, so a client
//! that stops reading would hold the answer (and the slot a large one streams from) for as
//! long as it keeps the connection open. Two watches end that:
//!
//! - [`Stall`], around the connection's IO (under TLS too): a write (or flush) that stays
//!   blocked for `limit` fails with `TimedOut`, and hyper gives the connection up.
//! - [`Watched`], around each answer's body, for what the socket does not show: an HTTP/2
//!   client that reads its socket but never opens a stream's flow-control window. The
//!   connection's driver (`serve`) closes a connection one of whose answers produced no frame
//!   for `limit` ([`Progress::stalled`]), whatever its other answers do.
//!
//! Progress starts an answer's count again, so a slow reader keeps its answer as long as it
//! reads something every `limit`.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::body::{Body, Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;
use tokio::time::{Instant, Sleep};

/// The answers of one connection still being written, each with the time it last moved.
#[derive(Debug)]
pub(crate) struct Progress {
    born: Instant,
    /// Per open answer, when it last produced a frame (or was made), in ms after `born`.
    /// Locked when an answer starts or ends and when the driver looks, not per frame.
    answers: Mutex<Vec<Arc<AtomicU64>>>,
    /// Told when an answer starts: the driver then looks at the time again.
    pub(crate) started: Notify,
}

impl Progress {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Self {
            born: Instant::now(),
            answers: Mutex::new(Vec::new()),
            started: Notify::new(),
        })
    }

    fn now_ms(&self) -> u64 {
        self.born.elapsed().as_millis() as u64
    }

    fn answers(&self) -> std::sync::MutexGuard<'_, Vec<Arc<AtomicU64>>> {
        self.answers.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// When the answer that moved least recently counts as stalled if it does not move
    /// before: `None` while there is none.
    pub(crate) fn stalls_at(&self, limit: Duration) -> Option<Instant> {
        // Relaxed: timestamps only this driver reads, to decide a stall; a stale one delays
        // the decision by a look.
        let oldest = self
            .answers()
            .iter()
            .map(|m| m.load(Ordering::Relaxed))
            .min()?;
        Some(self.born + Duration::from_millis(oldest) + limit)
    }

    /// An answer has not moved for `limit`.
    pub(crate) fn stalled(&self, limit: Duration) -> bool {
        self.stalls_at(limit).is_some_and(|at| Instant::now() >= at)
    }
}

/// An answer's body that tells its connection's [`Progress`] when it moves and ends.
pub(crate) struct Watched<B> {
    body: B,
    progress: Arc<Progress>,
    /// Its entry in [`Progress`], until it is written to its end or dropped.
    moved: Option<Arc<AtomicU64>>,
}

impl<B: Body + Unpin> Watched<B> {
    pub(crate) fn new(body: B, progress: Arc<Progress>) -> Self {
        let moved = (!body.is_end_stream()).then(|| {
            let m = Arc::new(AtomicU64::new(progress.now_ms()));
            progress.answers().push(m.clone());
            progress.started.notify_one();
            m
        });
        Self {
            body,
            progress,
            moved,
        }
    }
}

impl<B> Watched<B> {
    /// Written to its end, or dropped: no longer watched.
    fn close(&mut self) {
        if let Some(m) = self.moved.take() {
            self.progress.answers().retain(|a| !Arc::ptr_eq(a, &m));
        }
    }
}

impl<B> Drop for Watched<B> {
    fn drop(&mut self) {
        self.close();
    }
}

impl<B: Body + Unpin> Body for Watched<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(_)) => {
                if let Some(m) = &self.moved {
                    m.store(self.progress.now_ms(), Ordering::Relaxed);
                }
                if self.body.is_end_stream() {
                    self.close();
                }
            }
            Poll::Ready(None) => self.close(),
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// `io` whose writes fail after `limit` without progress.
pub(crate) struct Stall<IO> {
    io: IO,
    limit: Duration,
    /// Runs out `limit` after the write that found the socket full; made once per
    /// connection, at its first blocked write.
    timer: Option<Pin<Box<Sleep>>>,
    /// The timer counts: the last write was blocked.
    blocked: bool,
}

impl<IO> Stall<IO> {
    pub(crate) fn new(io: IO, limit: Duration) -> Self {
        Self {
            io,
            limit,
            timer: None,
            blocked: false,
        }
    }

    /// What a write that made `progress` (or not) returns: `Pending` while blocked for less
    /// than the limit, then the error.
    fn watch<T>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        if polled.is_ready() {
            self.blocked = false;
            return polled;
        }
        let limit = self.limit;
        let timer = self
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        if !self.blocked {
            self.blocked = true;
            timer.as_mut().reset(Instant::now() + limit);
        }
        match timer.as_mut().poll(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the client read nothing for {limit:?} (body_timeout)"),
            ))),
        }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Stall<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Stall<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.io).poll_write(cx, buf);
        self.watch(cx, polled)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.watch(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.io).poll_flush(cx);
        self.watch(cx, polled)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.io).poll_shutdown(cx);
        self.watch(cx, polled)
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use http_body_util::{BodyExt, Full};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    #[tokio::test]
    async fn each_answer_counts_until_written_or_dropped_and_stalls_on_its_own() {
        let limit = Duration::from_millis(200);
        let progress = Progress::new();
        assert_eq!(progress.stalls_at(limit), None, "no answer, no stall");
        let written = Watched::new(Full::new(Bytes::from_static(b"a")), progress.clone());
        let stuck = Watched::new(Full::new(Bytes::from_static(b"b")), progress.clone());
        assert!(progress.stalls_at(limit).is_some());
        assert!(!progress.stalled(limit));
        tokio::time::sleep(limit + Duration::from_millis(50)).await;
        assert!(progress.stalled(limit), "two answers, none moved");
        assert_eq!(&written.collect().await.unwrap().to_bytes()[..], b"a");
        // A new answer, and another written to its end, do not excuse the one that waits.
        let fresh = Watched::new(Full::new(Bytes::from_static(b"c")), progress.clone());
        assert!(progress.stalled(limit), "the stuck answer still stalls");
        drop(stuck);
        assert!(!progress.stalled(limit), "the fresh one just started");
        drop(fresh);
        assert_eq!(progress.stalls_at(limit), None, "all ended");
        // An empty answer (a gRPC Trailers-Only one) is never watched.
        let _empty = Watched::new(Full::new(Bytes::new()), progress.clone());
        assert_eq!(progress.stalls_at(limit), None);
    }

    const LIMIT: Duration = Duration::from_millis(300);

    #[tokio::test]
    async fn a_write_blocked_for_the_limit_fails() {
        let (ours, _theirs) = tokio::io::duplex(1024);
        let mut io = Stall::new(ours, LIMIT);
        let started = Instant::now();
        let block = vec![7u8; 4096];
        let written = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                if let Err(e) = io.write_all(&block).await {
                    return e;
                }
            }
        })
        .await
        .expect("the write fails within its limit");
        assert_eq!(written.kind(), io::ErrorKind::TimedOut);
        assert!(written.to_string().contains("body_timeout"), "{written}");
        let took = started.elapsed();
        assert!(took >= LIMIT, "failed after {took:?}");
    }

    #[tokio::test]
    async fn a_slow_reader_that_keeps_reading_is_never_cut() {
        let (ours, mut theirs) = tokio::io::duplex(1024);
        let reader = tokio::spawn(async move {
            let mut got = 0;
            let mut buf = [0u8; 512];
            while got < 64 * 1024 {
                // Well within the limit each time, slower than the writer.
                tokio::time::sleep(LIMIT / 10).await;
                match theirs.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => got += n,
                }
            }
            got
        });
        let mut io = Stall::new(ours, LIMIT);
        let data = vec![1u8; 64 * 1024];
        // 128 reads of 512 bytes, 30 ms apart: about 4 s, far past the limit in total.
        tokio::time::timeout(Duration::from_secs(20), io.write_all(&data))
            .await
            .expect("bounded")
            .expect("a reader that makes progress is not cut");
        io.flush().await.unwrap();
        assert_eq!(reader.await.unwrap(), 64 * 1024);
    }
}
