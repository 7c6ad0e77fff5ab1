//! The HTTP server: listeners, connections, winding down; each request goes to
//! [`Gateway::handle`].

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use http::{header, Request};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};

use crate::handle::Answer;
use crate::Gateway;

/// The gateway as hyper's service (a named type, so connections of it can be named too).
struct Service(Arc<Gateway>);

impl hyper::service::Service<Request<Incoming>> for Service {
    type Response = Answer;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Answer, Infallible>> + Send>>;

    fn call(&self, req: Request<Incoming>) -> Self::Future {
        let gw = self.0.clone();
        Box::pin(async move {
            let mut answer = gw.handle(req).await;
            // Relaxed: a late sight of the flag costs one more keep-alive answer, no more.
            if gw.closing.load(Ordering::Relaxed) {
                // hyper closes the connection once this answer is written.
                answer.headers_mut().insert(
                    header::CONNECTION,
                    header::HeaderValue::from_static("close"),
                );
            }
            Ok(answer)
        })
    }
}

/// How long a client may take to send a request's headers.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);
const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(5);
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);
/// After [`Gateway::close_connections`], how long connections get to close after their next
/// answer (a client between two requests sends its next one and is told to close) before
/// the rest are shut down gracefully (idle ones closed, busy ones after their answer).
const IDLE_GRACE: Duration = Duration::from_secs(1);
/// How often the winding down looks at the connections.
const CLOSE_POLL: Duration = Duration::from_millis(5);

impl Gateway {
    /// Serves HTTP on `listener` until `shutdown` turns true, then lets open requests finish
    /// (up to the chain timeout) and returns. At most `max_connections` connections are
    /// served at once; the next waits in the listen backlog until one closes.
    ///
    /// After [`Gateway::close_connections`] it first waits, once stopped, for its
    /// connections to close after their next answer: until none is left or [`IDLE_GRACE`]
    /// has passed; the graceful shutdown then closes the idle ones and lets busy ones
    /// finish their request.
    pub async fn serve(
        self: Arc<Self>,
        listener: TcpListener,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let graceful = GracefulShutdown::new();
        let slots = Arc::new(Semaphore::new(self.config.max_connections.max(1) as usize));
        let mut backoff = ACCEPT_BACKOFF_MIN;
        loop {
            let permit = tokio::select! {
                p = slots.clone().acquire_owned() => p.expect("the semaphore is never closed"),
                _ = shutdown.changed() => break,
            };
            let stream = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => {
                        backoff = ACCEPT_BACKOFF_MIN;
                        stream
                    }
                    Err(e) => {
                        // EMFILE, ENFILE, ENOBUFS...: retrying at once would spin.
                        tracing::warn!("gateway: accept failed: {e}; retrying in {backoff:?}");
                        tokio::select! {
                            _ = tokio::time::sleep(backoff) => {}
                            _ = shutdown.changed() => break,
                        }
                        backoff = (backoff * 2).min(ACCEPT_BACKOFF_MAX);
                        continue;
                    }
                },
                _ = shutdown.changed() => break,
            };
            let _ = stream.set_nodelay(true);
            let conn = graceful.watch(self.connection(stream, true));
            tokio::spawn(async move {
                let _ = conn.await;
                drop(permit);
            });
        }
        // Relaxed: `close_connections` is called before the shutdown signal this loop was
        // stopped by, and the watch channel orders the two.
        let handed_over = self.closing.load(Ordering::Relaxed);
        let mut last = Vec::new();
        if !handed_over {
            // Connections the kernel completed that nobody accepted yet would be reset when
            // the listener closes, though their clients already sent their requests: serve
            // them too. (Handed over, the listener lives on in the new chain, which takes
            // them.) `timeout(ZERO, ..)` polls the accept once: only what is waiting now.
            // Each gets one answer and is closed (a graceful shutdown would close a
            // connection whose request was not read yet).
            while let Ok(Ok((stream, _))) =
                tokio::time::timeout(Duration::ZERO, listener.accept()).await
            {
                let Ok(permit) = slots.clone().try_acquire_owned() else {
                    break;
                };
                let _ = stream.set_nodelay(true);
                let conn = self.connection(stream, false);
                last.push(tokio::spawn(async move {
                    let _ = conn.await;
                    drop(permit);
                }));
            }
        }
        drop(listener);
        if handed_over {
            let all = self.config.max_connections.max(1) as usize;
            let started = tokio::time::Instant::now();
            loop {
                let waited = started.elapsed();
                let open = all - slots.available_permits();
                if open == 0 || waited >= IDLE_GRACE {
                    tracing::debug!(
                        open,
                        "gateway {}: connections wound down in {waited:?}",
                        self.party
                    );
                    break;
                }
                tokio::time::sleep(CLOSE_POLL).await;
            }
        }
        let _ = tokio::time::timeout(self.config.timeout, async {
            graceful.shutdown().await;
            for c in last {
                let _ = c.await;
            }
        })
        .await;
    }

    /// Serves one connection over any byte stream (the fuzz target of the HTTP ingress feeds
    /// it arbitrary bytes this way); returns when the connection ends.
    pub async fn serve_io<I>(self: &Arc<Self>, io: I)
    where
        I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let _ = self.connection(io, true).await;
    }

    /// One HTTP/1.1 connection over `io`, answering with [`Gateway::handle`].
    fn connection<I>(
        self: &Arc<Self>,
        io: I,
        keep_alive: bool,
    ) -> http1::Connection<TokioIo<I>, Service>
    where
        I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(HEADER_READ_TIMEOUT)
            .keep_alive(keep_alive)
            .serve_connection(TokioIo::new(io), Service(self.clone()))
    }
}
