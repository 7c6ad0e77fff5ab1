//! Bodies larger than a slot, end to end with `zerohop up`: requests and answers of up to
//! `max_body` through a two-function chain (`upper` then `exclaim`, each working on the
//! whole body in its slot), streamed in and out by the gateway. What comes back is
//! byte-exact over HTTP/1.1 and h2c; a 1 GiB upload leaves the gateway's anonymous memory
//! flat; clients that stop reading hold their large slot at most `body_timeout`; over
//! `max_body` is 413 and no free large slot is 503. Driven with curl and raw sockets.

mod common;

use std::fs::File;
use std::io::{BufReader, Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::func;
use zerohop_test_support::{wait_until, ChainProcess, TempDir};

/// The chain: `POST /big` runs `upper` then `exclaim` (the body upper-cased, then `!`).
fn spec(name: &str, max_body: &str, large_slots: u32, body_timeout: &str) -> String {
    format!(
        "name: {name}\npool: {{ slots: 64, slot_size: 64KiB, large_slots: {large_slots} }}\n\
         max_body: {max_body}\nbody_timeout: {body_timeout}\ntimeout: 120s\nfunctions:\n{}{}\
         routes:\n  - {{ http: POST /big, sequence: [upper, exclaim] }}\n",
        func("upper", "upper", "", ""),
        func("exclaim", "exclaim", "", ""),
    )
}

/// What a command printed, bounded in time.
fn run(cmd: &mut Command, limit: Duration) -> (bool, String, String) {
    let mut child = zerohop_test_support::ChildGuard::new(
        cmd.stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("run the client"),
    );
    let mut out = child.child_mut().stdout.take().unwrap();
    let mut err = child.child_mut().stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let code = child.wait_timeout(limit);
    (
        code == Some(0),
        reader.join().unwrap(),
        err_reader.join().unwrap(),
    )
}

/// `curl -T file -X POST` (a streamed upload with its length) to `url`, the answer into
/// `out`: the status and the bytes downloaded.
fn upload(url: &str, file: &Path, out: &Path, extra: &[&str], limit: Duration) -> (u16, u64) {
    let (ok, stdout, stderr) = run(
        Command::new("curl")
            .args(["-sS", "--max-time", &limit.as_secs().to_string()])
            .args(extra)
            .args(["-X", "POST", "-T"])
            .arg(file)
            .arg("-o")
            .arg(out)
            .args(["-w", "%{http_code} %{size_download}"])
            .arg(url),
        limit + Duration::from_secs(5),
    );
    assert!(ok, "curl failed: {stderr}");
    let mut words = stdout.split_whitespace();
    let status = words.next().and_then(|w| w.parse().ok()).expect("a status");
    let size = words.next().and_then(|w| w.parse().ok()).expect("a size");
    (status, size)
}

/// Byte `i` of a test body: lower-case letters, digits and punctuation (so `upper` changes
/// most of them), without a period shorter than a slot.
fn byte_at(i: u64) -> u8 {
    const CHARS: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789-_.,;ABCXYZ";
    let x = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40 ^ (i >> 13);
    CHARS[(x % CHARS.len() as u64) as usize]
}

/// Writes a test body of `len` bytes to `path`.
fn write_body(path: &Path, len: u64) {
    let mut f = std::io::BufWriter::new(File::create(path).unwrap());
    let mut buf = Vec::with_capacity(1 << 20);
    let mut i = 0;
    while i < len {
        buf.clear();
        let n = (len - i).min(1 << 20);
        buf.extend((i..i + n).map(byte_at));
        f.write_all(&buf).unwrap();
        i += n;
    }
    f.flush().unwrap();
}

/// Whether `out` is the chain's answer to the body of [`write_body`] of `len` bytes: each
/// byte upper-cased, then `!`. Read in pieces: a 256 MiB answer is not held whole.
fn is_answer(out: &Path, len: u64) -> Result<(), String> {
    let got = std::fs::metadata(out).map_err(|e| e.to_string())?.len();
    if got != len + 1 {
        return Err(format!("{got} bytes, not {}", len + 1));
    }
    let mut r = BufReader::with_capacity(1 << 20, File::open(out).unwrap());
    let mut buf = vec![0u8; 1 << 20];
    let mut at = 0u64;
    while at < len {
        let n = ((len - at) as usize).min(buf.len());
        r.read_exact(&mut buf[..n]).map_err(|e| e.to_string())?;
        for (k, &b) in buf[..n].iter().enumerate() {
            let i = at + k as u64;
            if b != byte_at(i).to_ascii_uppercase() {
                return Err(format!("byte {i} is {b:#x}"));
            }
        }
        at += n as u64;
    }
    let mut last = [0u8; 1];
    r.read_exact(&mut last).map_err(|e| e.to_string())?;
    if &last != b"!" {
        return Err(format!("ends with {:?}, not `!`", last[0] as char));
    }
    Ok(())
}

#[test]
fn bodies_of_16_and_256_mib_come_back_byte_exact_over_http1_and_h2c() {
    let chain = ChainProcess::start(&spec("large-exact", "300MiB", 2, "60s"), &[]);
    let url = format!("{}/big", chain.url);
    let dir = TempDir::new("large-exact");
    let (body, out) = (dir.path().join("body"), dir.path().join("out"));
    for len in [16u64 << 20, 256 << 20] {
        write_body(&body, len);
        for extra in [&[][..], &["--http2-prior-knowledge"][..]] {
            let started = Instant::now();
            let (status, size) = upload(&url, &body, &out, extra, Duration::from_secs(120));
            eprintln!(
                "{} MiB {extra:?}: {status}, {size} bytes in {:?}",
                len >> 20,
                started.elapsed()
            );
            assert_eq!(status, 200, "{} MiB {extra:?}", len >> 20);
            if let Err(e) = is_answer(&out, len) {
                panic!("{} MiB {extra:?}: the answer differs: {e}", len >> 20);
            }
        }
    }
    assert_eq!(chain.stop(), Some(0));
}

/// `RssAnon` of process `pid`, in bytes.
fn rss_anon(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("RssAnon:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

#[test]
fn a_1_gib_upload_is_answered_and_the_gateway_memory_stays_flat() {
    let chain = ChainProcess::start(&spec("large-gib", "2GiB", 1, "120s"), &[]);
    let url = format!("{}/big", chain.url);
    let dir = TempDir::new("large-gib");
    // A sparse file: curl streams 1 GiB of zeros from it, the disk holds nothing.
    let body = dir.path().join("body");
    File::create(&body).unwrap().set_len(1 << 30).unwrap();
    // Warm up (the first request allocates the gateway's per-connection state).
    let small = dir.path().join("small");
    std::fs::write(&small, b"warm").unwrap();
    let (status, _) = upload(
        &url,
        &small,
        &dir.path().join("out"),
        &[],
        Duration::from_secs(20),
    );
    assert_eq!(status, 200);
    let pid = chain.pid();
    let before = rss_anon(pid);
    assert!(
        before > 0,
        "RssAnon of the zerohop process {pid} is readable"
    );
    let peak = Arc::new(AtomicU64::new(before));
    let done = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (peak, done) = (peak.clone(), done.clone());
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                peak.fetch_max(rss_anon(pid), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    let started = Instant::now();
    let (status, size) = upload(
        &url,
        &body,
        Path::new("/dev/null"),
        &[],
        Duration::from_secs(300),
    );
    let took = started.elapsed();
    done.store(true, Ordering::Relaxed);
    sampler.join().unwrap();
    let peak = peak.load(Ordering::Relaxed);
    let after = rss_anon(pid);
    eprintln!(
        "1 GiB upload: {status}, {size} bytes back in {took:?}; gateway RssAnon {} KiB before, \
         {} KiB at the peak (+{} KiB), {} KiB after",
        before >> 10,
        peak >> 10,
        peak.saturating_sub(before) >> 10,
        after >> 10
    );
    assert_eq!((status, size), (200, (1 << 30) + 1));
    assert!(
        peak.saturating_sub(before) < 64 << 20,
        "the gateway's RssAnon grew by {} MiB",
        peak.saturating_sub(before) >> 20
    );
    assert_eq!(chain.stop(), Some(0));
}

/// Bytes of the largest memfd process `pid` holds actually has pages for (the large pool:
/// a freed large slot's pages are given back), and its size.
fn large_pool_pages(pid: u32) -> (u64, u64) {
    let mut best = (0, 0);
    for fd in std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let Ok(target) = std::fs::read_link(fd.path()) else {
            continue;
        };
        if !target.to_string_lossy().starts_with("/memfd:") {
            continue;
        }
        if let Ok(m) = std::fs::metadata(fd.path()) {
            if m.size() > best.1 {
                best = (m.blocks() * 512, m.size());
            }
        }
    }
    best
}

/// Sends a POST of `body` to `/big` on `addr` and reads nothing back.
fn post_and_stall(addr: &str, body: &[u8]) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    write!(
        s,
        "POST /big HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\n\r\n",
        body.len()
    )
    .unwrap();
    s.write_all(body).unwrap();
    s
}

#[test]
fn clients_that_stop_reading_hold_their_large_slot_at_most_body_timeout() {
    const N: usize = 3;
    let body_timeout = Duration::from_secs(3);
    let chain = ChainProcess::start(&spec("large-stall", "32MiB", N as u32 + 1, "3s"), &[]);
    let url = format!("{}/big", chain.url);
    let addr = chain.url.trim_start_matches("http://").to_owned();
    let pid = chain.pid();
    let (idle, pool_len) = large_pool_pages(pid);
    assert!(
        pool_len >= (N as u64 + 1) * (32 << 20),
        "the large pool is found"
    );
    let body: Vec<u8> = (0..16u64 << 20).map(byte_at).collect();
    // Each asks for a 16 MiB answer and never reads it.
    let stalled: Vec<TcpStream> = (0..N).map(|_| post_and_stall(&addr, &body)).collect();
    let all_sent = Instant::now();
    // Their answers sit in their large slots.
    assert!(
        wait_until(Duration::from_secs(20), || large_pool_pages(pid).0
            >= idle + N as u64 * (8 << 20)),
        "the stalled answers hold their slots: {} MiB in the large pool",
        large_pool_pages(pid).0 >> 20
    );
    // Meanwhile a normal request is answered, and a large one too: N slots are held, no
    // more.
    let dir = TempDir::new("large-stall");
    let (file, out) = (dir.path().join("body"), dir.path().join("out"));
    std::fs::write(&file, b"still here").unwrap();
    let (status, _) = upload(&url, &file, &out, &[], Duration::from_secs(20));
    assert_eq!(status, 200);
    assert_eq!(std::fs::read(&out).unwrap(), b"STILL HERE!");
    write_body(&file, 4 << 20);
    let (status, _) = upload(&url, &file, &out, &[], Duration::from_secs(20));
    assert_eq!(status, 200, "one large slot is left for others");
    is_answer(&out, 4 << 20).unwrap();
    // Within body_timeout (plus slack) of the stall, every large slot is free again: its
    // pages are given back, and N + 1 large requests at once are all served.
    let freed = wait_until(body_timeout * 2 + Duration::from_secs(10), || {
        large_pool_pages(pid).0 <= idle + (1 << 20)
    });
    let at = all_sent.elapsed();
    assert!(
        freed,
        "{} MiB of the large pool still in use {at:?} after the clients stalled",
        large_pool_pages(pid).0 >> 20
    );
    eprintln!("the stalled answers' slots were freed within {at:?}");
    let clients: Vec<_> = (0..=N)
        .map(|k| {
            let (url, file) = (url.clone(), file.clone());
            let out = dir.path().join(format!("out{k}"));
            std::thread::spawn(move || upload(&url, &file, &out, &[], Duration::from_secs(30)).0)
        })
        .collect();
    for c in clients {
        assert_eq!(c.join().unwrap(), 200, "N + 1 large requests at once");
    }
    drop(stalled);
    assert_eq!(chain.stop(), Some(0));
}

/// Starts a POST of `len` bytes to `/big` on `addr` and sends `sent` bytes of it.
fn start_post(addr: &str, len: u64, sent: &[u8]) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    write!(
        s,
        "POST /big HTTP/1.1\r\nhost: x\r\ncontent-length: {len}\r\n\r\n"
    )
    .unwrap();
    s.write_all(sent).unwrap();
    s
}

#[test]
fn over_max_body_is_413_and_with_every_large_slot_busy_503() {
    let chain = ChainProcess::start(&spec("large-limits", "8MiB", 2, "20s"), &[]);
    let url = format!("{}/big", chain.url);
    let addr = chain.url.trim_start_matches("http://").to_owned();
    let dir = TempDir::new("large-limits");
    let (file, out) = (dir.path().join("body"), dir.path().join("out"));
    write_body(&file, (8 << 20) + 1);
    let (status, _) = upload(&url, &file, &out, &[], Duration::from_secs(20));
    assert_eq!(status, 413);
    assert_eq!(
        std::fs::read_to_string(&out).unwrap(),
        format!(
            "gateway: request body exceeds the chain's limit of {} bytes (max_body)\n",
            8 << 20
        )
    );
    // Both large slots taken by bodies on their way in.
    let first: Vec<u8> = (0..1u64 << 20).map(byte_at).collect();
    let busy: Vec<TcpStream> = (0..2).map(|_| start_post(&addr, 4 << 20, &first)).collect();
    std::thread::sleep(Duration::from_millis(500));
    write_body(&file, 2 << 20);
    let (status, _) = upload(&url, &file, &out, &[], Duration::from_secs(20));
    assert_eq!(status, 503);
    let text = std::fs::read_to_string(&out).unwrap();
    assert_eq!(
        text,
        "gateway: all 2 large slots (for bodies larger than a slot) are in use; retry\n"
    );
    // A small body is still served; once the slow senders are gone, a large one too.
    std::fs::write(&file, b"small").unwrap();
    let (status, _) = upload(&url, &file, &out, &[], Duration::from_secs(20));
    assert_eq!(
        (status, std::fs::read(&out).unwrap()),
        (200, b"SMALL!".to_vec())
    );
    drop(busy);
    write_body(&file, 2 << 20);
    let served = wait_until(Duration::from_secs(10), || {
        upload(&url, &file, &out, &[], Duration::from_secs(20)).0 == 200
    });
    assert!(served, "the large slots are freed when their senders leave");
    is_answer(&out, 2 << 20).unwrap();
    assert_eq!(chain.stop(), Some(0));
}

/// POSTs `body` to `url` with curl; the status, the answer and how long it took.
fn post(url: &str, body: &str, limit: Duration) -> (u16, Vec<u8>, Duration) {
    let dir = TempDir::new("large-post");
    let out = dir.path().join("out");
    let started = Instant::now();
    let (ok, stdout, stderr) = run(
        Command::new("curl")
            .args(["-sS", "--max-time", &limit.as_secs().to_string()])
            .args(["--data-binary", body, "-o"])
            .arg(&out)
            .args(["-w", "%{http_code}"])
            .arg(url),
        limit + Duration::from_secs(5),
    );
    assert!(ok, "curl failed: {stderr}");
    let status = stdout.trim().parse().expect("a status");
    (
        status,
        std::fs::read(&out).unwrap_or_default(),
        started.elapsed(),
    )
}

/// A small request whose answer outgrows its slot: the function moves the request into a
/// large slot of its domain, and the gateway takes the answer from there (its own slot was
/// freed); through a second function too. A function that dies holding a request it moved
/// gets its client a 502 at once, not a 504 at the chain's timeout.
#[test]
fn an_answer_that_outgrows_the_request_slot_comes_back_whole_and_a_crash_there_is_a_502() {
    const GROW: usize = 3_000_000;
    let spec = format!(
        "name: grow\npool: {{ slots: 64, slot_size: 64KiB, large_slots: 4 }}\nmax_body: 8MiB\n\
         timeout: 20s\nfunctions:\n{}{}{}routes:\n  - {{ http: POST /grow, sequence: [grow] }}\n\
         \x20 - {{ http: POST /grow-on, sequence: [grow, exclaim] }}\n\
         \x20 - {{ http: POST /die, sequence: [dier] }}\n",
        func("grow", "grow", &format!("TESTFN_GROW: \"{GROW}\""), ""),
        func("exclaim", "exclaim", "", ""),
        func(
            "dier",
            "grow-abort",
            &format!("TESTFN_GROW: \"{GROW}\""),
            ""
        ),
    );
    let chain = ChainProcess::start(&spec, &[]);
    let expected: Vec<u8> = b"ab".iter().copied().cycle().take(GROW).collect();
    let (status, body, _) = post(
        &format!("{}/grow", chain.url),
        "ab",
        Duration::from_secs(30),
    );
    assert_eq!(
        status,
        200,
        "{}",
        String::from_utf8_lossy(&body[..body.len().min(200)])
    );
    assert!(
        body == expected,
        "{} bytes, not the {GROW} expected",
        body.len()
    );
    let (status, body, _) = post(
        &format!("{}/grow-on", chain.url),
        "ab",
        Duration::from_secs(30),
    );
    assert_eq!(status, 200);
    assert_eq!(body.len(), GROW + 1);
    assert!(body[..GROW] == expected[..] && body[GROW] == b'!');
    let (status, body, took) = post(&format!("{}/die", chain.url), "ab", Duration::from_secs(30));
    assert_eq!(status, 502, "{}", String::from_utf8_lossy(&body));
    assert!(
        took < Duration::from_secs(15),
        "answered after {took:?}: the crash was not seen (the timeout is 20 s)"
    );
    // The chain still answers after the crash, from a large slot again.
    let (status, body, _) = post(
        &format!("{}/grow", chain.url),
        "ab",
        Duration::from_secs(30),
    );
    assert_eq!((status, body.len()), (200, GROW));
    assert_eq!(chain.stop(), Some(0), "zerohop up exits cleanly on SIGTERM");
}
