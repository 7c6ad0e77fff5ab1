//! The reading side: a pipe per instance stream, a reader task per pipe that files what it
//! reads into the book, and the echo thread (foreground `zerohop up`).

use std::cell::RefCell;
use std::io::Write;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::io::unix::AsyncFd;
use tokio::sync::broadcast::{self, error::RecvError, error::TryRecvError};
use tokio::sync::watch;

use super::{escape, Inner, LogLine, Splitter, Stream, CLOSE_READS, ECHO_BATCH, READ_CHUNK};

/// A pipe for an instance's output: the read end non-blocking, both ends close-on-exec (the
/// spawner places its copy of the write end on 1 or 2 of the child, which the child keeps).
/// Returns `(read, write)`.
pub(crate) fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    use nix::fcntl::{fcntl, FcntlArg, OFlag};
    let (read, write) = nix::unistd::pipe2(OFlag::O_CLOEXEC)?;
    // The write end stays blocking: programs expect their standard output to be.
    fcntl(&read, FcntlArg::F_SETFL(OFlag::O_NONBLOCK))?;
    Ok((read, write))
}

/// Where a reader's lines come from.
#[derive(Clone, Copy, Debug)]
pub(super) struct Source {
    /// The function's index.
    pub(super) function: usize,
    /// The instance's party.
    pub(super) party: u16,
    /// Which of its streams.
    pub(super) stream: Stream,
}

thread_local! {
    /// The read buffer of the readers running on this thread (used between two awaits only,
    /// so one per thread serves them all).
    static BUFFER: RefCell<Vec<u8>> = RefCell::new(vec![0; READ_CHUNK]);
}

/// What one read found.
enum Got {
    Data,
    Empty,
    End,
}

/// One reader: files the pipe's lines until end of file or the book closes.
pub(super) async fn read_pipe(
    inner: Arc<Inner>,
    source: Source,
    fd: AsyncFd<OwnedFd>,
    mut stop: watch::Receiver<bool>,
) {
    let mut split = Splitter::new(inner.limits.max_line);
    loop {
        tokio::select! {
            biased;
            ready = fd.readable() => {
                let Ok(mut guard) = ready else { break };
                let got = BUFFER.with_borrow_mut(|buf| {
                    match guard.try_io(|f| read(f.get_ref(), buf)) {
                        Ok(Ok(0)) => Got::End,
                        Ok(Ok(n)) => {
                            inner.file(source, &mut split, &buf[..n]);
                            Got::Data
                        }
                        Ok(Err(e)) if e.kind() == std::io::ErrorKind::Interrupted => Got::Empty,
                        Ok(Err(e)) => {
                            tracing::debug!(?source, "reading instance output: {e}");
                            Got::End
                        }
                        // Would block: readiness is cleared, wait again.
                        Err(_) => Got::Empty,
                    }
                });
                if let Got::End = got {
                    break;
                }
            }
            _ = stop.wait_for(|s| *s) => {
                drain(&inner, source, &mut split, fd.get_ref());
                break;
            }
        }
    }
    inner.finish(source, &mut split);
}

fn read(fd: &OwnedFd, buf: &mut [u8]) -> std::io::Result<usize> {
    nix::unistd::read(fd, buf).map_err(std::io::Error::from)
}

/// What the pipe holds right now, without waiting.
fn drain(inner: &Inner, source: Source, split: &mut Splitter, pipe: &OwnedFd) {
    for _ in 0..CLOSE_READS {
        let done = BUFFER.with_borrow_mut(|buf| match read(pipe, buf) {
            Ok(0) => true,
            Ok(n) => {
                inner.file(source, split, &buf[..n]);
                false
            }
            Err(e) => e.kind() != std::io::ErrorKind::Interrupted,
        });
        if done {
            return;
        }
    }
}

/// The echo thread: every line `rx` receives, as `[function/instance] text`, to `out`,
/// until the book and its readers are gone; `echoed` is the `seq` after the last line
/// written.
pub(super) fn echo(
    mut rx: broadcast::Receiver<Arc<LogLine>>,
    out: &mut dyn Write,
    echoed: &AtomicU64,
) {
    let mut batch = Vec::with_capacity(ECHO_BATCH);
    let mut next = 0;
    loop {
        let mut got = Some(match rx.blocking_recv() {
            Ok(l) => Ok(l),
            Err(RecvError::Lagged(n)) => Err(n),
            Err(RecvError::Closed) => return,
        });
        // Whatever else is queued goes in the same write.
        while let Some(one) = got.take() {
            match one {
                Ok(l) => {
                    let _ = writeln!(
                        batch,
                        "[{}/{}] {}",
                        escape(&l.function),
                        l.instance,
                        escape(&l.text)
                    );
                    next = l.seq + 1;
                }
                Err(n) => {
                    let _ = writeln!(
                        batch,
                        "[zerohop] {n} lines of instance output not echoed (standard error \
                         is too slow)"
                    );
                }
            }
            if batch.len() < ECHO_BATCH {
                got = match rx.try_recv() {
                    Ok(l) => Some(Ok(l)),
                    Err(TryRecvError::Lagged(n)) => Some(Err(n)),
                    Err(TryRecvError::Empty | TryRecvError::Closed) => None,
                };
            }
        }
        let _ = out.write_all(&batch);
        let _ = out.flush();
        batch.clear();
        // SYNC POINT: pairs with the Acquire load in `LogBook::close` (a progress mark
        // only; the lines themselves went to `out`).
        echoed.store(next, Ordering::Release);
    }
}
