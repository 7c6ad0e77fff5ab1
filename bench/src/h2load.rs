//! h2load (nghttp2's load generator) as the client of the protocol rows: HTTP/1.1 and HTTP/2,
//! each in clear or over TLS, from one tool, so that the rows differ only in the protocol.
//!
//! Our own load generator ([`crate::loadgen`]) speaks HTTP/1.1 in clear only. h2load does not
//! compare bodies, so a run is held to what its summary shows: every request done and
//! answered 2xx, none failed, errored or timed out, the protocol ALPN chose (or prior
//! knowledge, for h2c) the one asked for, and `expected_len` bytes of body per answer. h2load
//! counts the body bytes of the requests in flight when the window closes but not those
//! requests, so the bytes may exceed `requests * expected_len` by up to one answer per request
//! in flight; an answer one byte short or long shows once the requests outnumber the bytes of
//! the answers in flight (a few thousand here).
//! The system's exact answer over each protocol is checked beforehand with curl
//! ([`crate::systems::tls::probe`]).
//!
//! h2load runs as a child of this process and inherits its affinity (CPU 0 when the matrix
//! pins); its CPU is read from `getrusage(RUSAGE_CHILDREN)` around the run, so nothing else
//! may be reaped meanwhile.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use nix::sys::resource::{getrusage, UsageWho};

/// Where Debian's `nghttp2-client` installs it.
pub const H2LOAD: &str = "h2load";

/// How a request reaches the system.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    /// HTTP/1.1 in clear.
    Http1,
    /// HTTP/2 in clear with prior knowledge.
    H2c,
    /// HTTP/1.1 over TLS (ALPN `http/1.1`).
    Https,
    /// HTTP/2 over TLS (ALPN `h2`).
    H2,
}

impl Protocol {
    /// Name in reports: `http/1.1`, `h2c`, `https`, `h2`.
    pub fn name(self) -> &'static str {
        match self {
            Protocol::Http1 => "http/1.1",
            Protocol::H2c => "h2c",
            Protocol::Https => "https",
            Protocol::H2 => "h2",
        }
    }

    /// Whether it runs over TLS.
    pub fn tls(self) -> bool {
        matches!(self, Protocol::Https | Protocol::H2)
    }

    /// Whether it is HTTP/2.
    pub fn http2(self) -> bool {
        matches!(self, Protocol::H2c | Protocol::H2)
    }

    /// What h2load must print as `Application protocol:`.
    fn application_protocol(self) -> &'static str {
        match self {
            Protocol::Http1 | Protocol::Https => "http/1.1",
            Protocol::H2c => "h2c",
            Protocol::H2 => "h2",
        }
    }
}

/// One h2load run.
#[derive(Clone, Debug)]
pub struct Point {
    /// The protocol (the URL's scheme must match: `https://` for TLS).
    pub protocol: Protocol,
    /// Connections (`-c`).
    pub connections: usize,
    /// Requests in flight per connection (`-m`; 1 for HTTP/1.1: no pipelining).
    pub streams: usize,
    /// Measured duration (`-D`).
    pub duration: Duration,
}

/// What one run measured, from h2load's summary.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct H2loadResult {
    /// Requests done in the measured window.
    pub requests: u64,
    /// Of which answered (any status).
    pub succeeded: u64,
    /// Failed, errored or timed out.
    pub failed: u64,
    /// Answered with a 2xx status.
    pub status_2xx: u64,
    /// Response body bytes received.
    pub data_bytes: u64,
    /// Length of the measured window in seconds.
    pub seconds: f64,
    /// Requests done per second.
    pub rps: f64,
    /// Mean latency of a request (h2load gives no percentiles of it).
    pub mean_us: f64,
    /// `TLS Protocol:` (empty in clear).
    pub tls_version: String,
    /// `Cipher:` (empty in clear).
    pub cipher: String,
    /// `Application protocol:` (`h2`, `h2c`, `http/1.1`).
    pub application_protocol: String,
    /// CPU seconds of h2load itself.
    pub cpu_s: f64,
}

impl H2loadResult {
    /// Why this run cannot be counted, or None when every answer was right; `in_flight`
    /// requests were in flight at a time.
    pub fn fault(
        &self,
        protocol: Protocol,
        expected_len: usize,
        in_flight: usize,
    ) -> Option<String> {
        if self.requests == 0 {
            return Some("no request done".into());
        }
        if self.failed > 0 || self.succeeded != self.requests || self.status_2xx != self.requests {
            return Some(format!(
                "{} requests done, {} succeeded, {} failed, {} answered 2xx",
                self.requests, self.succeeded, self.failed, self.status_2xx
            ));
        }
        if self.application_protocol != protocol.application_protocol() {
            return Some(format!(
                "spoke {:?}, expected {}",
                self.application_protocol,
                protocol.application_protocol()
            ));
        }
        let least = self.requests * expected_len as u64;
        let most = (self.requests + in_flight as u64) * expected_len as u64;
        if self.data_bytes < least || self.data_bytes > most {
            return Some(format!(
                "{} body bytes for {} answers of {expected_len} bytes ({in_flight} in flight)",
                self.data_bytes, self.requests
            ));
        }
        None
    }
}

/// Runs h2load against `url` with `body_file` as every request's POST body.
pub fn run(url: &str, point: &Point, body_file: &Path) -> Result<H2loadResult> {
    if url.starts_with("https://") != point.protocol.tls() {
        bail!("{url} does not fit protocol {}", point.protocol.name());
    }
    let mut cmd = Command::new(H2LOAD);
    cmd.args(["-t", "1"])
        .arg("-c")
        .arg(point.connections.to_string())
        .arg("-m")
        .arg(point.streams.max(1).to_string())
        .arg("-D")
        .arg(format!("{}ms", point.duration.as_millis().max(1)))
        .arg("-d")
        .arg(body_file);
    if !point.protocol.http2() {
        cmd.arg("--h1");
    }
    cmd.arg(url);
    let before = children_cpu_s()?;
    let out = cmd.output().with_context(|| {
        format!("starting {H2LOAD} (Debian: `apt-get install -y nghttp2-client`)")
    })?;
    let cpu_s = children_cpu_s()? - before;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!(
            "{H2LOAD} {url} failed ({}): {} {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim(),
            stdout.lines().last().unwrap_or_default()
        );
    }
    let mut result = parse(&stdout)
        .with_context(|| format!("reading {H2LOAD}'s summary of {url}:\n{stdout}"))?;
    result.cpu_s = cpu_s;
    Ok(result)
}

/// Whether h2load can be started, or what to install.
pub fn available() -> Result<(), String> {
    match Command::new(H2LOAD).arg("--version").output() {
        Ok(o) if o.status.success() => Ok(()),
        _ => Err(format!(
            "{H2LOAD} not found: the HTTPS and HTTP/2 rows need it; install it with \
             `apt-get install -y nghttp2-client` (Debian/Ubuntu, as root)"
        )),
    }
}

/// CPU seconds (user + system) of this process's reaped children so far.
fn children_cpu_s() -> Result<f64> {
    let u = getrusage(UsageWho::RUSAGE_CHILDREN).context("getrusage(RUSAGE_CHILDREN)")?;
    let s = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 + t.tv_usec() as f64 / 1e6;
    Ok(s(u.user_time()) + s(u.system_time()))
}

/// Reads h2load's summary (`finished in`, `requests:`, `status codes:`, `traffic:`,
/// `time for request:` and the TLS lines).
fn parse(out: &str) -> Result<H2loadResult> {
    let mut r = H2loadResult::default();
    let mut seen = 0;
    for line in out.lines() {
        let line = line.trim();
        if let Some(v) = line.strip_prefix("TLS Protocol:") {
            r.tls_version = v.trim().to_owned();
        } else if let Some(v) = line.strip_prefix("Cipher:") {
            r.cipher = v.trim().to_owned();
        } else if let Some(v) = line.strip_prefix("Application protocol:") {
            r.application_protocol = v.trim().to_owned();
        } else if let Some(v) = line.strip_prefix("finished in ") {
            // `1.00s, 17395.00 req/s, 2.09MB/s`
            let mut parts = v.split(", ");
            r.seconds = duration_us(parts.next().unwrap_or_default())? / 1e6;
            r.rps = number_before(parts.next().unwrap_or_default(), " req/s")?;
            seen += 1;
        } else if let Some(v) = line.strip_prefix("requests:") {
            // `N total, N started, N done, N succeeded, N failed, N errored, N timeout`
            r.requests = count(v, "done")?;
            r.succeeded = count(v, "succeeded")?;
            r.failed = count(v, "failed")? + count(v, "errored")? + count(v, "timeout")?;
            seen += 1;
        } else if let Some(v) = line.strip_prefix("status codes:") {
            r.status_2xx = count(v, "2xx")?;
            seen += 1;
        } else if let Some(v) = line.strip_prefix("traffic:") {
            // `..., 1.68MB (1756895) data`
            let data = v
                .split(", ")
                .find(|p| p.ends_with(" data"))
                .context("no data bytes")?;
            r.data_bytes = data
                .split_once('(')
                .and_then(|(_, rest)| rest.split_once(')'))
                .context("no exact data bytes")?
                .0
                .parse()
                .context("data bytes")?;
            seen += 1;
        } else if let Some(v) = line.strip_prefix("time for request:") {
            // min, max, mean, sd, +/- sd
            let mean = v.split_whitespace().nth(2).context("no mean")?;
            r.mean_us = duration_us(mean)?;
            seen += 1;
        }
    }
    if seen != 5 {
        bail!("summary incomplete");
    }
    Ok(r)
}

/// `N WORD` in a comma-separated list.
fn count(list: &str, word: &str) -> Result<u64> {
    list.split(',')
        .map(str::trim)
        .find_map(|p| p.strip_suffix(word).map(str::trim))
        .with_context(|| format!("no `{word}` count in {list:?}"))?
        .parse()
        .with_context(|| format!("`{word}` count in {list:?}"))
}

fn number_before(s: &str, suffix: &str) -> Result<f64> {
    s.trim()
        .strip_suffix(suffix)
        .with_context(|| format!("no {suffix:?} in {s:?}"))?
        .parse()
        .with_context(|| format!("number in {s:?}"))
}

/// h2load's durations: `224us`, `1.75ms`, `1.00s`.
fn duration_us(s: &str) -> Result<f64> {
    let s = s.trim();
    let (n, scale) = if let Some(n) = s.strip_suffix("us") {
        (n, 1.0)
    } else if let Some(n) = s.strip_suffix("ms") {
        (n, 1e3)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1e6)
    } else {
        bail!("no unit in duration {s:?}");
    };
    Ok(n.parse::<f64>()
        .with_context(|| format!("duration {s:?}"))?
        * scale)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// h2load 1.52's output for `-c4 -m8 -D 1` against zerohop over TLS (progress lines cut).
    const H2_TLS: &str = "starting benchmark...
spawning thread #0: 4 total client(s). Timing-based test with 0s of warm-up time and 1s of main duration for measurements.
TLS Protocol: TLSv1.3
Cipher: TLS_AES_128_GCM_SHA256
Server Temp Key: X25519 253 bits
Application protocol: h2

finished in 1.00s, 17395.00 req/s, 2.09MB/s
requests: 17395 total, 17427 started, 17395 done, 17395 succeeded, 0 failed, 0 errored, 0 timeout
status codes: 17395 2xx, 0 3xx, 0 4xx, 0 5xx
traffic: 2.09MB (2192234) total, 119.10KB (121957) headers (space savings 88.31%), 1.68MB (1756895) data
                     min         max         mean         sd        +/- sd
time for request:      224us     15.90ms      1.75ms      2.67ms    83.63%
time for connect:     4.17ms      6.29ms      5.28ms       922us    50.00%
time to 1st byte:    12.94ms     13.03ms     12.99ms        40us    50.00%
req/s           :    4339.26     4348.10     4341.98        4.11    75.00%
";

    #[test]
    fn the_summary_is_read_and_a_clean_run_has_no_fault() {
        let r = parse(H2_TLS).unwrap();
        assert_eq!(r.requests, 17395);
        assert_eq!(r.succeeded, 17395);
        assert_eq!(r.failed, 0);
        assert_eq!(r.status_2xx, 17395);
        assert_eq!(r.data_bytes, 1_756_895);
        assert_eq!(r.rps, 17395.0);
        assert_eq!(r.seconds, 1.0);
        assert_eq!(r.mean_us, 1750.0);
        assert_eq!(r.tls_version, "TLSv1.3");
        assert_eq!(r.cipher, "TLS_AES_128_GCM_SHA256");
        assert_eq!(r.fault(Protocol::H2, 101, 32), None);
        // The answers in flight at the end: their bytes counted, not them.
        let late = parse(&H2_TLS.replace("(1756895) data", "(1760127) data")).unwrap();
        assert_eq!(late.fault(Protocol::H2, 101, 32), None);
        assert!(late.fault(Protocol::H2, 101, 31).is_some());
    }

    #[test]
    fn wrong_lengths_statuses_and_protocols_are_faults() {
        let r = parse(H2_TLS).unwrap();
        assert!(r
            .fault(Protocol::H2, 100, 32)
            .unwrap()
            .contains("body bytes"));
        assert!(r
            .fault(Protocol::H2, 102, 32)
            .unwrap()
            .contains("body bytes"));
        assert!(r.fault(Protocol::Https, 101, 32).unwrap().contains("spoke"));
        let failed = parse(&H2_TLS.replace("0 failed", "3 failed")).unwrap();
        assert!(failed
            .fault(Protocol::H2, 101, 32)
            .unwrap()
            .contains("3 failed"));
        let not_ok = parse(&H2_TLS.replace("17395 2xx, 0 3xx", "17000 2xx, 395 3xx")).unwrap();
        assert!(not_ok.fault(Protocol::H2, 101, 32).is_some());
        assert!(parse("finished in 1.00s, 3.00 req/s, 1MB/s\n").is_err());
    }
}
