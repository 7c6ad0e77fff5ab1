//! A chain's log book: every instance's standard output and error, line by line.
//!
//! Each instance writes its standard output and error into two pipes of its own; the agent
//! keeps the read ends (non-blocking, close-on-exec) and the write ends exist only in the
//! instance and what it starts, so a pipe reports end of file once all of them are gone. A
//! reader task per pipe ([`LogBook::attach`]) reads up to 64 KiB at a time, splits on `\n`,
//! and files the lines under their function:
//!
//! * a ring of the last [`LogLimits::capacity`] lines per function (2000 by default): a full
//!   ring forgets its oldest line for each new one ("evicted", the ring's normal working);
//! * a line is its text as lossy UTF-8 with a trailing `\r\n` or `\n` removed, at most
//!   [`LogLimits::max_line`] bytes (4 KiB) of it, then [`CUT_MARKER`]; what follows the cut
//!   up to the next newline is discarded (a line is cut as soon as its first 4 KiB have
//!   arrived, so memory per pipe stays bounded however long a line is);
//! * what a terminal would act on is escaped in the text as it is stored ([`escape`]:
//!   control characters but tab, `\r` and ESC among them, DEL, C1 controls, and the
//!   characters that reorder or break lines), so no consumer (`zerohop logs`, its `--json`,
//!   the echo, the API) ever passes a function's control bytes to a terminal, and a line
//!   always starts with the origin the agent gave it: a function cannot move the cursor
//!   back over its prefix or start a line of its own;
//! * a rate budget per function: at most [`LogLimits::rate_budget`] lines (20 000) per
//!   [`LogLimits::rate_window`] (1 s, fixed windows) are stored; the rest of the window's
//!   lines are only counted ("dropped", never stored, never followed, never echoed), and the
//!   first drop of a window is logged as a warning;
//! * followers ([`LogBook::follow`]) get every stored line through a broadcast channel of
//!   4096 lines; one that falls further behind skips lines (its `recv` says how many, per
//!   follower) and never holds up anyone else;
//! * echo (foreground `zerohop up`): a thread of its own, a follower like any other, writes
//!   each stored line to the agent's standard error as `[function/instance] text`.
//!
//! Reading never waits on anything but the pipe: a reader formats and stores at most the
//! rate budget's lines per second per function and only counts the rest (a `memchr` per
//! line), takes one short lock per 64 KiB read, and hands lines to followers without waiting
//! for them. So an instance's `write(2)` blocks only while its pipe (64 KiB, the kernel's
//! default) is full and until the agent's runtime gets to its reader. The limit: the
//! readers run on the agent's runtime, so on a host whose CPUs are all busy, or with more
//! flooding instances than the agent's threads can drain, a flooding instance is paced by
//! the agent (its writes wait, nothing it wrote is lost to it), while every other instance
//! keeps its own pipe, and a busy reader yields to the runtime's other tasks (tokio's
//! cooperative budget), so requests keep flowing.
//!
//! Memory: per function at most `capacity` lines of at most `max_line` bytes (about 8 MiB
//! at the defaults, usually far less); per pipe a partial line of at most `max_line`; one
//! 64 KiB read buffer per runtime thread.

mod pipe;
#[cfg(test)]
mod tests;

use std::collections::VecDeque;
use std::fmt;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::sync::broadcast;
use tokio::sync::watch;
use tokio::task::JoinHandle;

// The line format is pure and lives in a crate of its own, so that tools (the `log_line` fuzz
// target) check it without linking the agent.
pub(crate) use self::pipe::pipe;
use self::pipe::{echo, read_pipe, Source};
pub use zerohop_logline::{
    escape, is_escaped, terminal_line, text_of, Splitter, CUT_MARKER, ESCAPE_GROWTH,
};

/// Lines kept per function by default.
pub const DEFAULT_CAPACITY: usize = 2000;
/// Bytes of a line kept by default; the rest is cut.
pub const DEFAULT_MAX_LINE: usize = 4096;
/// Lines stored per function and rate window by default.
pub const DEFAULT_RATE_BUDGET: u32 = 20_000;
/// Bytes read from a pipe at a time.
const READ_CHUNK: usize = 64 * 1024;
/// Lines a follower may fall behind before it skips.
const FOLLOW_CAPACITY: usize = 4096;
/// Reads a reader still makes once the book closes (what was written before the instance
/// ended: 4 MiB at most).
const CLOSE_READS: usize = 64;
/// How long [`LogBook::close`] waits for its readers before it aborts them.
const CLOSE_GRACE: Duration = Duration::from_secs(1);
/// Bytes of echo written to standard error at a time.
const ECHO_BATCH: usize = 64 * 1024;

/// Which of an instance's outputs a line came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Stream {
    /// Standard output (descriptor 1).
    Stdout,
    /// Standard error (descriptor 2).
    Stderr,
}

impl Stream {
    /// `stdout` or `stderr`.
    pub fn as_str(self) -> &'static str {
        match self {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
        }
    }
}

impl fmt::Display for Stream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One line an instance wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogLine {
    /// Position among the book's stored lines (from 0, in the order they were stored; a
    /// follower can line a snapshot up with what it receives).
    pub seq: u64,
    /// When the agent read it (lines of one read share it).
    pub time: SystemTime,
    /// The chain's name.
    pub chain: Arc<str>,
    /// The function's name.
    pub function: Arc<str>,
    /// The instance: its party number.
    pub instance: u16,
    /// Standard output or error.
    pub stream: Stream,
    /// The text (lossy UTF-8, without the line end, [`escape`]d; ends with [`CUT_MARKER`]
    /// when cut).
    pub text: String,
    /// Whether it was cut at the maximum length.
    pub cut: bool,
}

impl fmt::Display for LogLine {
    /// `TIME function/instance stream text`, the time as [`rfc3339`].
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {}/{} {} {}",
            rfc3339(self.time),
            self.function,
            self.instance,
            self.stream,
            self.text
        )
    }
}

/// A function's counters. Every line read is kept, evicted or dropped:
/// `kept + evicted + dropped` lines were read in all.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LogStats {
    /// Lines in the ring now (at most the capacity).
    pub kept: u64,
    /// Lines stored, then pushed out of the full ring by newer ones.
    pub evicted: u64,
    /// Lines never stored: over the rate budget.
    pub dropped: u64,
    /// Stored lines that were cut at the maximum length (what followed the cut is gone).
    pub cut: u64,
    /// Bytes read from the function's pipes, all of them (dropped lines included).
    pub bytes: u64,
}

/// The bounds of a log book.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogLimits {
    /// Lines kept per function.
    pub capacity: usize,
    /// Bytes of a line kept.
    pub max_line: usize,
    /// Lines stored per function per window; the rest of the window's are dropped.
    pub rate_budget: u32,
    /// The rate budget's window.
    pub rate_window: Duration,
}

impl Default for LogLimits {
    fn default() -> Self {
        LogLimits {
            capacity: DEFAULT_CAPACITY,
            max_line: DEFAULT_MAX_LINE,
            rate_budget: DEFAULT_RATE_BUDGET,
            rate_window: Duration::from_secs(1),
        }
    }
}

/// A chain's log book: see the module documentation.
pub struct LogBook {
    inner: Arc<Inner>,
    /// Turns true when the book closes: readers drain what is there and end.
    stop: watch::Sender<bool>,
    /// The reader tasks (finished ones pruned at each attach).
    readers: Mutex<Vec<JoinHandle<()>>>,
    /// With echo: lines the echo thread is done with (`seq` of the last one + 1).
    echoed: Option<Arc<AtomicU64>>,
}

/// What the readers share with the book.
struct Inner {
    chain: Arc<str>,
    names: Vec<Arc<str>>,
    /// Per function, in spec order.
    rings: Vec<Mutex<Ring>>,
    limits: LogLimits,
    /// The next line's `seq`.
    seq: AtomicU64,
    follow: broadcast::Sender<Arc<LogLine>>,
}

impl LogBook {
    /// A book for chain `chain` with `functions` (in spec order: [`attach`](Self::attach)
    /// takes their index), keeping `capacity` lines per function, other limits at their
    /// defaults, no echo.
    pub fn new<S: AsRef<str>>(chain: &str, functions: &[S], capacity: usize) -> LogBook {
        LogBook::with_limits(
            chain,
            functions,
            LogLimits {
                capacity,
                ..LogLimits::default()
            },
        )
    }

    /// A book with the given limits, no echo.
    pub fn with_limits<S: AsRef<str>>(chain: &str, functions: &[S], limits: LogLimits) -> LogBook {
        let (follow, _) = broadcast::channel(FOLLOW_CAPACITY);
        LogBook {
            inner: Arc::new(Inner {
                chain: chain.into(),
                names: functions.iter().map(|f| f.as_ref().into()).collect(),
                rings: functions
                    .iter()
                    .map(|_| Mutex::new(Ring::default()))
                    .collect(),
                limits,
                seq: AtomicU64::new(0),
                follow,
            }),
            stop: watch::channel(false).0,
            readers: Mutex::new(Vec::new()),
            echoed: None,
        }
    }

    /// Also writes every stored line to the agent's standard error as
    /// `[function/instance] text`, from a thread of its own that skips (and says how many)
    /// lines when standard error is slower than the instances. The thread ends with the
    /// book. Without a thread (the system refused one) the book runs without echo.
    pub fn with_echo(mut self) -> LogBook {
        let rx = self.inner.follow.subscribe();
        let echoed = Arc::new(AtomicU64::new(0));
        let progress = echoed.clone();
        match std::thread::Builder::new()
            .name("zerohop-log-echo".into())
            .spawn(move || echo(rx, &mut std::io::stderr(), &progress))
        {
            Ok(_) => self.echoed = Some(echoed),
            Err(e) => tracing::warn!("no thread for echoing instance output ({e}); not echoing it"),
        }
        self
    }

    /// The chain's name.
    pub fn chain(&self) -> &str {
        &self.inner.chain
    }

    /// The functions, in spec order.
    pub fn functions(&self) -> impl Iterator<Item = &str> {
        self.inner.names.iter().map(|n| &**n)
    }

    /// The limits the book keeps to.
    pub fn limits(&self) -> LogLimits {
        self.inner.limits
    }

    /// Reads `stdout` and `stderr` (the read ends of an instance's output pipes, made with
    /// `pipe`) as instance `party` of function `function` (its index in spec order) until
    /// each reports end of file, or the book closes. Spawns a task per pipe on the current
    /// tokio runtime (call it from inside one).
    pub fn attach(
        &self,
        function: usize,
        party: u16,
        stdout: OwnedFd,
        stderr: OwnedFd,
    ) -> std::io::Result<()> {
        if function >= self.inner.rings.len() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!(
                    "no function {function} in the log book of {}",
                    self.inner.chain
                ),
            ));
        }
        let out = crate::confine::async_fd(stdout)?;
        let err = crate::confine::async_fd(stderr)?;
        let mut readers = lock(&self.readers);
        readers.retain(|h| !h.is_finished());
        for (fd, stream) in [(out, Stream::Stdout), (err, Stream::Stderr)] {
            let source = Source {
                function,
                party,
                stream,
            };
            readers.push(tokio::spawn(read_pipe(
                self.inner.clone(),
                source,
                fd,
                self.stop.subscribe(),
            )));
        }
        Ok(())
    }

    /// The last `last_n` stored lines of `function` (`None`: of every function, merged in
    /// the order they were stored), oldest first. Empty for an unknown function.
    pub fn snapshot(&self, function: Option<&str>, last_n: usize) -> Vec<LogLine> {
        let tail = |ring: &Mutex<Ring>| -> Vec<Arc<LogLine>> {
            let ring = lock(ring);
            let skip = ring.lines.len().saturating_sub(last_n);
            ring.lines.iter().skip(skip).cloned().collect()
        };
        let mut lines: Vec<Arc<LogLine>> = match function {
            Some(name) => self
                .index(name)
                .map_or_else(Vec::new, |i| tail(&self.inner.rings[i])),
            None => self.inner.rings.iter().flat_map(tail).collect(),
        };
        lines.sort_unstable_by_key(|l| l.seq);
        let skip = lines.len().saturating_sub(last_n);
        lines[skip..].iter().map(|l| LogLine::clone(l)).collect()
    }

    /// Every line stored from now on. A follower more than 4096 lines behind skips the
    /// oldest: its `recv` answers `RecvError::Lagged(n)` with the number it skipped, then
    /// goes on with the oldest line still there.
    pub fn follow(&self) -> broadcast::Receiver<Arc<LogLine>> {
        self.inner.follow.subscribe()
    }

    /// The counters of `function` (`None` for an unknown one).
    pub fn stats(&self, function: &str) -> Option<LogStats> {
        let ring = lock(&self.inner.rings[self.index(function)?]);
        Some(LogStats {
            kept: ring.lines.len() as u64,
            ..ring.stats
        })
    }

    /// Reader tasks still running.
    pub fn readers(&self) -> usize {
        lock(&self.readers)
            .iter()
            .filter(|h| !h.is_finished())
            .count()
    }

    /// Stops reading: each reader takes what its pipe holds now (at most 4 MiB), files it
    /// and ends; readers still running after a second are aborted. With echo, then waits
    /// (as long again at most) until the echo thread has written every stored line, so
    /// what a failed instance said is out before the agent reports the failure. Pipes
    /// attached later are drained the same way at once. Call it once the instances are
    /// gone.
    pub async fn close(&self) {
        self.stop.send_replace(true);
        let readers = std::mem::take(&mut *lock(&self.readers));
        let deadline = tokio::time::Instant::now() + CLOSE_GRACE;
        for r in readers {
            let abort = r.abort_handle();
            if tokio::time::timeout_at(deadline, r).await.is_err() {
                abort.abort();
            }
        }
        if let Some(echoed) = &self.echoed {
            let deadline = tokio::time::Instant::now() + CLOSE_GRACE;
            // SYNC POINT: Acquire pairs with the Release store of `echoed` in the echo thread.
            while echoed.load(Ordering::Acquire) < self.inner.seq.load(Ordering::Relaxed)
                && tokio::time::Instant::now() < deadline
            {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }
    }

    fn index(&self, function: &str) -> Option<usize> {
        self.inner.names.iter().position(|n| &**n == function)
    }
}

impl Drop for LogBook {
    fn drop(&mut self) {
        for r in lock(&self.readers).drain(..) {
            r.abort();
        }
    }
}

impl fmt::Debug for LogBook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LogBook")
            .field("chain", &self.inner.chain)
            .field("functions", &self.inner.names)
            .field("limits", &self.inner.limits)
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Inner {
    /// Files the lines `chunk` completes.
    fn file(&self, source: Source, split: &mut Splitter, chunk: &[u8]) {
        let (now, time) = (Instant::now(), SystemTime::now());
        let mut ring = lock(&self.rings[source.function]);
        ring.stats.bytes += chunk.len() as u64;
        split.feed(chunk, |line, cut| {
            self.store(&mut ring, source, now, time, line, cut);
        });
    }

    /// Files the last line of a pipe that ended without a newline.
    fn finish(&self, source: Source, split: &mut Splitter) {
        let (now, time) = (Instant::now(), SystemTime::now());
        let mut ring = lock(&self.rings[source.function]);
        split.finish(|line, cut| self.store(&mut ring, source, now, time, line, cut));
    }

    fn store(
        &self,
        ring: &mut Ring,
        source: Source,
        now: Instant,
        time: SystemTime,
        bytes: &[u8],
        cut: bool,
    ) {
        match ring.admit(&self.limits, now) {
            Admit::Yes => {}
            Admit::No => return,
            Admit::FirstNo => {
                tracing::warn!(
                    chain = %self.chain,
                    function = %self.names[source.function],
                    "more than {} lines in {:?}: dropping this function's output until the \
                     window ends",
                    self.limits.rate_budget,
                    self.limits.rate_window,
                );
                return;
            }
        }
        let line = Arc::new(LogLine {
            seq: self.seq.fetch_add(1, Ordering::Relaxed),
            time,
            chain: self.chain.clone(),
            function: self.names[source.function].clone(),
            instance: source.party,
            stream: source.stream,
            text: text_of(bytes, cut),
            cut,
        });
        ring.push(line.clone(), self.limits.capacity);
        // Sent under the ring's lock: followers see a function's lines in `seq` order. No
        // follower is not an error.
        let _ = self.follow.send(line);
    }
}

/// A function's stored lines and counters.
#[derive(Default)]
struct Ring {
    lines: VecDeque<Arc<LogLine>>,
    /// `kept` unused here (the ring's length).
    stats: LogStats,
    /// The current rate window: when it began, lines stored in it.
    window: Option<Instant>,
    in_window: u32,
}

/// Whether a line may be stored.
#[derive(Debug, PartialEq, Eq)]
enum Admit {
    Yes,
    No,
    /// No, and it is the window's first refusal.
    FirstNo,
}

impl Ring {
    /// Counts a line against the rate budget at `now`; a refused line counts as dropped.
    fn admit(&mut self, limits: &LogLimits, now: Instant) -> Admit {
        match self.window {
            Some(start) if now.saturating_duration_since(start) < limits.rate_window => {}
            _ => {
                self.window = Some(now);
                self.in_window = 0;
            }
        }
        if self.in_window < limits.rate_budget {
            self.in_window += 1;
            return Admit::Yes;
        }
        self.stats.dropped += 1;
        if self.in_window == limits.rate_budget {
            // Marks the refusal as reported for this window.
            self.in_window += 1;
            return Admit::FirstNo;
        }
        Admit::No
    }

    /// Stores a line, evicting the oldest when the ring holds `capacity`.
    fn push(&mut self, line: Arc<LogLine>, capacity: usize) {
        if line.cut {
            self.stats.cut += 1;
        }
        if capacity == 0 {
            self.stats.evicted += 1;
            return;
        }
        while self.lines.len() >= capacity {
            self.lines.pop_front();
            self.stats.evicted += 1;
        }
        self.lines.push_back(line);
    }
}

/// `t` as RFC 3339 in UTC with milliseconds: `2024-02-29T12:34:56.789Z` (times before 1970
/// show as 1970).
pub fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t.max(UNIX_EPOCH)).to_string()
}
