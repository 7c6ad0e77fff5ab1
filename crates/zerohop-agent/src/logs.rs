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

use std::cell::RefCell;
use std::collections::VecDeque;
use std::fmt;
use std::io::Write;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::io::unix::AsyncFd;
use tokio::sync::broadcast::{self, error::RecvError, error::TryRecvError};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Lines kept per function by default.
pub const DEFAULT_CAPACITY: usize = 2000;
/// Bytes of a line kept by default; the rest is cut.
pub const DEFAULT_MAX_LINE: usize = 4096;
/// Lines stored per function and rate window by default.
pub const DEFAULT_RATE_BUDGET: u32 = 20_000;
/// Appended to the text of a line that was cut at the maximum length.
pub const CUT_MARKER: &str = " [zerohop: line cut]";
/// The most bytes [`escape`] makes of one byte of its input (`\u{202e}` for a character of
/// 3 bytes is 8; `\x1b` for 1 is 4).
pub const ESCAPE_GROWTH: usize = 4;
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
    /// [`pipe`]) as instance `party` of function `function` (its index in spec order) until
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

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Where a reader's lines come from.
#[derive(Clone, Copy, Debug)]
struct Source {
    function: usize,
    party: u16,
    stream: Stream,
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
async fn read_pipe(
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

/// The text of a line: lossy UTF-8, [`escape`]d, a character the cut split removed, the
/// marker added.
pub fn text_of(bytes: &[u8], cut: bool) -> String {
    let bytes = if cut {
        without_split_char(bytes)
    } else {
        bytes
    };
    let mut text = escape(&String::from_utf8_lossy(bytes)).into_owned();
    if cut {
        text.push_str(CUT_MARKER);
    }
    text
}

/// Whether a terminal would act on `c` rather than show it: C0 controls but tab (`\r`,
/// ESC, backspace, bell, ...), DEL, C1 controls (U+0080 to U+009F: in UTF-8, U+009B is CSI
/// to some terminals), and the characters that break a line or reorder it (U+2028, U+2029,
/// the bidirectional marks, embeddings, overrides and isolates).
pub fn is_escaped(c: char) -> bool {
    matches!(c,
        '\0'..='\x08' | '\n'..='\x1f' | '\x7f'..='\u{9f}'
        | '\u{61c}' | '\u{200e}' | '\u{200f}' | '\u{2028}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// `text` as a terminal shows it as is: every character [`is_escaped`] written as its code,
/// `\xHH` below U+0080 (`\x1b` for ESC, `\x0d` for `\r`) and `\u{HHHH}` from there
/// (`\u{9b}`, `\u{202e}`); the rest, backslashes included, unchanged. So the result holds no
/// character [`is_escaped`] accepts and escaping it again changes nothing (each layer that
/// prints may escape without doubling); the price is that a function's own text `\x1b`
/// reads the same as an ESC it printed. At most [`ESCAPE_GROWTH`] times as long as `text`.
pub fn escape(text: &str) -> std::borrow::Cow<'_, str> {
    use std::fmt::Write as _;
    let Some(first) = text.find(is_escaped) else {
        return std::borrow::Cow::Borrowed(text);
    };
    let mut out = String::with_capacity(text.len() + 16);
    out.push_str(&text[..first]);
    for c in text[first..].chars() {
        if !is_escaped(c) {
            out.push(c);
        } else if u32::from(c) < 0x80 {
            let _ = write!(out, "\\x{:02x}", u32::from(c));
        } else {
            let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
        }
    }
    std::borrow::Cow::Owned(out)
}

/// One line as `zerohop logs` prints it to a terminal: `TIME function/instance stream:
/// text` and a newline, every field [`escape`]d (what the daemon sends is escaped already;
/// the tool does not rely on it). The line's only newline is its last byte, so what comes
/// before its first space, `/` and `: ` is the origin the agent gave it.
pub fn terminal_line(
    time: &str,
    function: &str,
    instance: u16,
    stream: &str,
    text: &str,
) -> String {
    format!(
        "{} {}/{instance} {}: {}\n",
        escape(time),
        escape(function),
        escape(stream),
        escape(text)
    )
}

/// `b` without an incomplete UTF-8 sequence at its end.
fn without_split_char(b: &[u8]) -> &[u8] {
    let n = b.len();
    for back in 1..=n.min(3) {
        let c = b[n - back];
        if c & 0xc0 == 0x80 {
            continue;
        }
        let need = match c {
            0xf0.. => 4,
            0xe0.. => 3,
            0xc0.. => 2,
            _ => 1,
        };
        return if need > back { &b[..n - back] } else { b };
    }
    b
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

/// Splits a byte stream into lines of at most `max` bytes, the same lines however the
/// stream is cut into chunks.
pub struct Splitter {
    max: usize,
    /// The start of a line whose end has not arrived (at most `max` bytes).
    partial: Vec<u8>,
    /// The current line was cut and filed: discard up to the next newline.
    skipping: bool,
}

impl Splitter {
    /// A splitter for lines of at most `max` bytes.
    pub fn new(max: usize) -> Splitter {
        Splitter {
            max,
            partial: Vec::new(),
            skipping: false,
        }
    }

    /// Calls `line(text, cut)` for every line `chunk` completes (text without its `\n` or
    /// `\r\n`, at most `max` bytes; `cut` when there was more), and for a line that grows
    /// past `max` without an end (the rest of it is then discarded).
    pub fn feed(&mut self, mut chunk: &[u8], mut line: impl FnMut(&[u8], bool)) {
        while let Some(i) = memchr::memchr(b'\n', chunk) {
            let head = &chunk[..i];
            chunk = &chunk[i + 1..];
            if self.skipping {
                self.skipping = false;
                continue;
            }
            let full = self.partial.len() + head.len();
            let last = head.last().or(self.partial.last());
            let len = full - usize::from(last == Some(&b'\r'));
            let keep = len.min(self.max);
            if self.partial.is_empty() {
                line(&head[..keep], len > self.max);
                continue;
            }
            if keep <= self.partial.len() {
                self.partial.truncate(keep);
            } else {
                let more = keep - self.partial.len();
                self.partial.extend_from_slice(&head[..more]);
            }
            line(&self.partial, len > self.max);
            self.partial.clear();
        }
        if self.skipping || chunk.is_empty() {
            return;
        }
        // One byte more may wait if it is a `\r`: the `\n` that ends the line may follow.
        let total = self.partial.len() + chunk.len();
        if total <= self.max || (total == self.max + 1 && chunk.last() == Some(&b'\r')) {
            self.partial.extend_from_slice(chunk);
            return;
        }
        let room = self.max.saturating_sub(self.partial.len());
        self.partial.extend_from_slice(&chunk[..room]);
        self.partial.truncate(self.max);
        line(&self.partial, true);
        self.partial.clear();
        self.skipping = true;
    }

    /// The stream ended: a last line without a newline.
    pub fn finish(&mut self, mut line: impl FnMut(&[u8], bool)) {
        if !self.skipping && !self.partial.is_empty() {
            let len = self.partial.len() - usize::from(self.partial.last() == Some(&b'\r'));
            line(&self.partial[..len], false);
        }
        self.partial.clear();
        self.skipping = false;
    }
}

/// The echo thread: every line `rx` receives, as `[function/instance] text`, to `out`,
/// until the book and its readers are gone; `echoed` is the `seq` after the last line
/// written.
fn echo(mut rx: broadcast::Receiver<Arc<LogLine>>, out: &mut dyn Write, echoed: &AtomicU64) {
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

/// `t` as RFC 3339 in UTC with milliseconds: `2024-02-29T12:34:56.789Z` (times before 1970
/// show as 1970).
pub fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t.max(UNIX_EPOCH)).to_string()
}

#[cfg(test)]
mod tests {
    use std::fs::File;
    use std::io::Write as _;

    use super::*;

    /// Every line `chunks` make, fed in that order, then the end of the stream.
    fn split(max: usize, chunks: &[&[u8]]) -> Vec<(String, bool)> {
        let mut s = Splitter::new(max);
        let mut out = Vec::new();
        for c in chunks {
            s.feed(c, |l, cut| {
                out.push((String::from_utf8_lossy(l).into_owned(), cut));
            });
        }
        s.finish(|l, cut| out.push((String::from_utf8_lossy(l).into_owned(), cut)));
        out
    }

    fn lines(v: &[(&str, bool)]) -> Vec<(String, bool)> {
        v.iter().map(|(s, c)| (s.to_string(), *c)).collect()
    }

    #[test]
    fn splits_on_newlines_across_chunks_and_strips_crlf() {
        assert_eq!(
            split(100, &[b"one\ntw", b"o\r", b"\nthree\r\n\n", b"four"]),
            lines(&[
                ("one", false),
                ("two", false),
                ("three", false),
                ("", false),
                ("four", false)
            ])
        );
        // A lone \r inside a line stays; one at the very end of the stream goes.
        assert_eq!(
            split(100, &[b"a\rb\n", b"c\r"]),
            lines(&[("a\rb", false), ("c", false)])
        );
        assert!(split(100, &[b""]).is_empty());
    }

    #[test]
    fn long_lines_are_cut_and_their_rest_discarded() {
        // Complete in one chunk.
        assert_eq!(
            split(4, &[b"abcdefgh\nxy\n"]),
            lines(&[("abcd", true), ("xy", false)])
        );
        // Exactly the maximum, with \r\n: not cut.
        assert_eq!(split(4, &[b"abcd\r\n"]), lines(&[("abcd", false)]));
        // Growing past the maximum without a newline: filed at once, the rest up to the
        // next newline (chunks later) discarded.
        let mut s = Splitter::new(4);
        let mut out = Vec::new();
        s.feed(b"ab", |l, c| out.push((l.to_vec(), c)));
        assert!(out.is_empty());
        s.feed(b"cdef", |l, c| out.push((l.to_vec(), c)));
        assert_eq!(out, vec![(b"abcd".to_vec(), true)]);
        s.feed(b"ghijkl", |l, c| out.push((l.to_vec(), c)));
        s.feed(b"mn\nok\n", |l, c| out.push((l.to_vec(), c)));
        assert_eq!(out, vec![(b"abcd".to_vec(), true), (b"ok".to_vec(), false)]);
        // A partial line that ends up over the maximum when its newline comes.
        assert_eq!(split(4, &[b"abc", b"de\n"]), lines(&[("abcd", true)]));
    }

    #[test]
    fn cut_text_has_the_marker_and_no_split_character() {
        assert_eq!(text_of(b"abc", false), "abc");
        assert_eq!(text_of(b"abc", true), format!("abc{CUT_MARKER}"));
        // "é" is two bytes: cut after the first, it goes entirely.
        assert_eq!(
            text_of("abé".as_bytes()[..3].as_ref(), true),
            format!("ab{CUT_MARKER}")
        );
        assert_eq!(
            text_of("ab€".as_bytes()[..4].as_ref(), true),
            format!("ab{CUT_MARKER}")
        );
        assert_eq!(text_of("ab€".as_bytes(), true), format!("ab€{CUT_MARKER}"));
        // Invalid bytes elsewhere are replaced, not lost.
        assert_eq!(text_of(b"a\xffb", false), "a\u{fffd}b");
    }

    #[test]
    fn a_line_of_the_maximum_with_crlf_is_not_cut_however_it_arrives() {
        for chunks in [
            &[&b"abcd\r\n"[..]][..],
            &[b"abcd", b"\r", b"\n"],
            &[b"abcd\r", b"\n"],
            &[b"ab", b"cd\r", b"\n"],
        ] {
            assert_eq!(split(4, chunks), lines(&[("abcd", false)]), "{chunks:?}");
        }
        // A `\r` that is not the line's end: the line is longer than the maximum.
        assert_eq!(split(4, &[b"abcd\r", b"e\n"]), lines(&[("abcd", true)]));
        assert_eq!(
            split(4, &[b"abcd", b"\r", b"e\n"]),
            lines(&[("abcd", true)])
        );
        // At the end of the stream, a last `\r` goes as at the end of a line.
        assert_eq!(split(4, &[b"abcd", b"\r"]), lines(&[("abcd", false)]));
    }

    #[test]
    fn control_characters_are_stored_escaped_and_visible() {
        // A function that colours, clears, moves the cursor up, rewinds the line with \r to
        // print a fake origin over its own, rings the bell, sends a C1 CSI, and hides text
        // behind a bidi override.
        let hostile = "\x1b[31mred\x1b[0m \x1b[2K\x1b[1A\rexclaim/1 stdout: forged\x07 \u{9b}2J \
                       \u{202e}txet\x7f\0";
        let text = text_of(hostile.as_bytes(), false);
        assert_eq!(
            text,
            "\\x1b[31mred\\x1b[0m \\x1b[2K\\x1b[1A\\x0dexclaim/1 stdout: forged\\x07 \\u{9b}2J \
             \\u{202e}txet\\x7f\\x00"
        );
        assert!(!text.chars().any(is_escaped), "{text:?}");
        // Tabs, backslashes, ordinary Unicode and replaced invalid bytes stay as they are.
        assert_eq!(
            text_of(b"a\tb \\x1b caf\xc3\xa9 \xff", false),
            "a\tb \\x1b caf\u{e9} \u{fffd}"
        );
        // Escaping what is escaped changes nothing: layers may each escape.
        assert_eq!(escape(&text), text);
        assert!(matches!(
            escape("plain"),
            std::borrow::Cow::Borrowed("plain")
        ));
        // Every escaped character becomes ASCII starting with a backslash, within the
        // documented growth.
        for c in (0u32..0x2100)
            .filter_map(char::from_u32)
            .filter(|c| is_escaped(*c))
        {
            let e = escape(c.encode_utf8(&mut [0; 4])).into_owned();
            assert!(e.len() <= ESCAPE_GROWTH * c.len_utf8(), "{c:?} -> {e}");
            assert!(e.starts_with('\\') && e.is_ascii(), "{e}");
        }
        // Cut lines are escaped too.
        assert_eq!(
            text_of(b"\x1b[2J\x1b[2J", true),
            format!("\\x1b[2J\\x1b[2J{CUT_MARKER}")
        );
    }

    #[test]
    fn a_terminal_line_starts_with_its_origin_and_has_one_newline() {
        let l = terminal_line(
            "2024-02-29T12:34:56.789Z",
            "upper",
            3,
            "stdout",
            "x\r2024-02-29T12:34:56.789Z exclaim/1 stdout: forged\n\x1b[1Anext",
        );
        assert_eq!(
            l,
            "2024-02-29T12:34:56.789Z upper/3 stdout: x\\x0d2024-02-29T12:34:56.789Z exclaim/1 \
             stdout: forged\\x0a\\x1b[1Anext\n"
        );
        assert_eq!(l.matches('\n').count(), 1);
        assert!(!l[..l.len() - 1].chars().any(is_escaped));
    }

    fn line(seq: u64, cut: bool) -> Arc<LogLine> {
        Arc::new(LogLine {
            seq,
            time: UNIX_EPOCH,
            chain: "c".into(),
            function: "f".into(),
            instance: 1,
            stream: Stream::Stdout,
            text: seq.to_string(),
            cut,
        })
    }

    #[test]
    fn a_full_ring_evicts_its_oldest_lines_without_dropping() {
        let mut ring = Ring::default();
        for i in 0..5 {
            ring.push(line(i, i == 4), 3);
        }
        let seqs: Vec<u64> = ring.lines.iter().map(|l| l.seq).collect();
        assert_eq!(seqs, [2, 3, 4]);
        assert_eq!(ring.stats.evicted, 2);
        assert_eq!(ring.stats.dropped, 0);
        assert_eq!(ring.stats.cut, 1);
    }

    #[test]
    fn the_rate_budget_drops_the_rest_of_a_window() {
        let limits = LogLimits {
            rate_budget: 3,
            rate_window: Duration::from_secs(1),
            ..LogLimits::default()
        };
        let mut ring = Ring::default();
        let t0 = Instant::now();
        let admitted: Vec<Admit> = (0..6).map(|_| ring.admit(&limits, t0)).collect();
        assert_eq!(
            admitted,
            [
                Admit::Yes,
                Admit::Yes,
                Admit::Yes,
                Admit::FirstNo,
                Admit::No,
                Admit::No
            ]
        );
        assert_eq!(ring.stats.dropped, 3);
        // Still the same window just before its end; a new one at its end.
        let late = t0 + Duration::from_millis(999);
        assert_eq!(ring.admit(&limits, late), Admit::No);
        let next = t0 + Duration::from_secs(1);
        assert_eq!(ring.admit(&limits, next), Admit::Yes);
        assert_eq!(ring.stats.dropped, 4);
    }

    #[test]
    fn rfc3339_in_utc_with_milliseconds() {
        let at = |s: u64, ms: u64| {
            rfc3339(UNIX_EPOCH + Duration::from_secs(s) + Duration::from_millis(ms))
        };
        assert_eq!(at(0, 0), "1970-01-01T00:00:00.000Z");
        assert_eq!(at(951_782_400, 0), "2000-02-29T00:00:00.000Z");
        assert_eq!(at(1_709_210_096, 789), "2024-02-29T12:34:56.789Z");
        assert_eq!(at(1_234_567_890, 500), "2009-02-13T23:31:30.500Z");
        assert_eq!(at(4_102_444_799, 999), "2099-12-31T23:59:59.999Z");
        assert_eq!(
            rfc3339(UNIX_EPOCH - Duration::from_secs(5)),
            "1970-01-01T00:00:00.000Z"
        );
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
    }

    /// Waits (at most 10 s) until `book` holds `n` lines of `function`.
    async fn until_kept(book: &LogBook, function: &str, n: u64) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while book.stats(function).expect("known").kept < n {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{function}: {:?}, wanted {n} kept",
                book.stats(function)
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    #[test]
    fn readers_file_both_streams_and_end_at_end_of_file() {
        runtime().block_on(async {
            let book = LogBook::new("chain", &["a", "b"], 10);
            let mut follower = book.follow();
            let (out_r, out_w) = pipe().expect("pipe");
            let (err_r, err_w) = pipe().expect("pipe");
            book.attach(1, 7, out_r, err_r).expect("attach");
            assert_eq!(book.readers(), 2);
            let (mut out, mut err) = (File::from(out_w), File::from(err_w));
            out.write_all(b"first\nsecond\r\nthi").expect("write");
            err.write_all(b"oops\n").expect("write");
            until_kept(&book, "b", 3).await;
            out.write_all(b"rd").expect("write");
            drop((out, err));
            until_kept(&book, "b", 4).await;
            let all = book.snapshot(Some("b"), 100);
            let mut texts: Vec<(&str, Stream)> = all.iter().map(|l| (&*l.text, l.stream)).collect();
            // The two pipes are read independently: only each stream's order is given.
            texts.sort_by_key(|(_, s)| *s == Stream::Stderr);
            assert_eq!(
                texts,
                [
                    ("first", Stream::Stdout),
                    ("second", Stream::Stdout),
                    ("third", Stream::Stdout),
                    ("oops", Stream::Stderr)
                ]
            );
            assert!(all.iter().all(|l| l.instance == 7 && &*l.function == "b"));
            assert!(all.windows(2).all(|w| w[0].seq < w[1].seq));
            assert_eq!(book.snapshot(None, 2), all[2..].to_vec());
            assert!(book.snapshot(Some("a"), 10).is_empty());
            assert!(book.snapshot(Some("nope"), 10).is_empty());
            let stats = book.stats("b").expect("b");
            assert_eq!((stats.kept, stats.evicted, stats.dropped), (4, 0, 0));
            assert_eq!(stats.bytes, 24);
            for want in &all {
                let got = tokio::time::timeout(Duration::from_secs(5), follower.recv())
                    .await
                    .expect("followed in time")
                    .expect("a line");
                assert_eq!(*got, *want);
            }
            let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
            while book.readers() > 0 {
                assert!(tokio::time::Instant::now() < deadline, "readers ended");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        });
    }

    #[test]
    fn close_drains_what_is_there_and_ends_readers_whose_writer_lives_on() {
        runtime().block_on(async {
            let book = LogBook::new("chain", &["a"], 10);
            let (r, w) = pipe().expect("pipe");
            let (r2, _w2) = pipe().expect("pipe");
            book.attach(0, 3, r, r2).expect("attach");
            let mut w = File::from(w);
            w.write_all(b"one\ntwo").expect("write");
            book.close().await;
            assert_eq!(book.readers(), 0);
            let texts: Vec<String> = book
                .snapshot(None, 10)
                .into_iter()
                .map(|l| l.text)
                .collect();
            assert_eq!(texts, ["one", "two"]);
            // Attached after closing: drained at once.
            let (r3, w3) = pipe().expect("pipe");
            let (r4, _w4) = pipe().expect("pipe");
            File::from(w3).write_all(b"late\n").expect("write");
            book.attach(0, 4, r3, r4).expect("attach");
            until_kept(&book, "a", 3).await;
            assert!(book
                .attach(1, 4, pipe().unwrap().0, pipe().unwrap().0)
                .is_err());
        });
    }

    #[test]
    fn a_flood_is_bounded_by_the_ring_and_the_budget() {
        runtime().block_on(async {
            let limits = LogLimits {
                capacity: 50,
                rate_budget: 200,
                rate_window: Duration::from_secs(3600),
                ..LogLimits::default()
            };
            let book = LogBook::with_limits("chain", &["f"], limits);
            let (r, w) = pipe().expect("pipe");
            let (r2, w2) = pipe().expect("pipe");
            book.attach(0, 2, r, r2).expect("attach");
            drop(w2);
            let writer = std::thread::spawn(move || {
                let mut w = std::io::BufWriter::new(File::from(w));
                for i in 0..100_000 {
                    writeln!(w, "line {i}").expect("write");
                }
            });
            let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
            while book.readers() > 0 {
                assert!(tokio::time::Instant::now() < deadline, "flood read");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            writer.join().expect("writer");
            let s = book.stats("f").expect("f");
            assert_eq!(s.kept, 50);
            assert_eq!(s.kept + s.evicted, 200);
            assert_eq!(s.dropped, 100_000 - 200);
            let kept = book.snapshot(Some("f"), 1000);
            assert_eq!(kept.len(), 50);
            assert_eq!(kept[0].text, "line 150");
            assert_eq!(kept[49].text, "line 199");
        });
    }

    #[test]
    fn echo_writes_function_and_instance_and_says_what_it_skipped() {
        let (tx, rx) = broadcast::channel(2);
        for i in 0..3 {
            tx.send(line(i, false)).expect("receiver");
        }
        drop(tx);
        let mut out = Vec::new();
        let echoed = AtomicU64::new(0);
        echo(rx, &mut out, &echoed);
        assert_eq!(echoed.load(Ordering::Relaxed), 3);
        let out = String::from_utf8(out).expect("utf-8");
        assert_eq!(
            out,
            "[zerohop] 1 lines of instance output not echoed (standard error is too slow)\n\
             [f/1] 1\n[f/1] 2\n"
        );
        // Raw bytes in a line (not stored by a book, which escapes) are escaped all the same.
        let (tx, rx) = broadcast::channel(2);
        let mut raw = LogLine::clone(&line(0, false));
        raw.text = "\r[g/2] forged\x1b[2K".into();
        tx.send(Arc::new(raw)).expect("receiver");
        drop(tx);
        let mut out = Vec::new();
        echo(rx, &mut out, &echoed);
        assert_eq!(out, b"[f/1] \\x0d[g/2] forged\\x1b[2K\n");
    }
}
