//! The HTTPS and HTTP/2 rows of the matrix: zerohop's gateway over HTTP/1.1 in clear, h2c,
//! HTTPS (HTTP/1.1 over TLS) and h2 over TLS, and nginx terminating TLS in front of the
//! monolith (`nginx-tls`) over HTTPS and h2, all with the hello chain and 100-byte bodies,
//! driven by [`h2load`] in the same run.
//!
//! Every point keeps the same number of requests in flight ([`Plan::in_flight`]): HTTP/1.1
//! needs a connection for each; HTTP/2 runs twice, once with them as streams on a few
//! connections ([`Plan::h2_connections`]), as HTTP/2 clients do, and once with one stream per
//! connection as HTTP/1.1 (the protocol's cost apart from multiplexing). Before each point one request over that
//! protocol is checked with curl (exact body, and the protocol curl spoke); then a warm-up run,
//! then the measured run with the CPU of every process of the system read around it.
//!
//! Ratios ([`Ratio`]): zerohop over each protocol against its own clear HTTP/1.1, and zerohop
//! against nginx-tls over the same TLS protocol and connections. On two cores h2load (CPU 0) and the system
//! (CPU 1) each have one core, and the system's gateway, functions or nginx and monolith share
//! theirs: the ratios show what a protocol costs per request on one busy core, not how any of
//! them scales.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};

use crate::h2load::{self, H2loadResult, Point, Protocol};
use crate::procstat::{CpuSnapshot, LOADGEN};
use crate::systems::tls::{self, Certificate};
use crate::systems::{self, RunningSystem, StartOpts, SystemId};
use crate::Step;

/// How long and how hard each point runs.
#[derive(Clone, Debug)]
pub struct Plan {
    /// Unmeasured run before each point.
    pub warmup: Duration,
    /// Measured run of each point.
    pub duration: Duration,
    /// Requests in flight at every point.
    pub in_flight: usize,
    /// Connections that carry them over HTTP/2 when multiplexed.
    pub h2_connections: usize,
}

impl Plan {
    /// The h2load point for `protocol`: HTTP/2 `multiplexed` on [`Plan::h2_connections`],
    /// else (and always for HTTP/1.1) one request in flight per connection.
    pub fn point(&self, protocol: Protocol, multiplexed: bool) -> Point {
        let (connections, streams) = if protocol.http2() && multiplexed {
            let c = self.h2_connections.clamp(1, self.in_flight.max(1));
            (c, self.in_flight.max(1).div_ceil(c))
        } else {
            (self.in_flight.max(1), 1)
        };
        Point {
            protocol,
            connections,
            streams,
            duration: self.duration,
        }
    }
}

/// One measured point.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ProtocolRun {
    /// `zerohop-ring` or `nginx-tls`.
    pub system: String,
    /// `http/1.1`, `h2c`, `https`, `h2`.
    pub protocol: String,
    /// Connections.
    pub connections: usize,
    /// Requests in flight per connection.
    pub streams: usize,
    /// What h2load measured.
    pub result: H2loadResult,
    /// CPU seconds per component over the measured run, h2load as `loadgen`.
    pub cpu_s: BTreeMap<String, f64>,
    /// CPU milliseconds per 1,000 answers, per component.
    pub cpu_ms_per_1k: BTreeMap<String, f64>,
    /// CPU milliseconds per 1,000 answers of the system (h2load excluded).
    pub sut_cpu_ms_per_1k: f64,
    /// Why the run's answers cannot be trusted (None: every answer right).
    pub fault: Option<String>,
}

/// One ratio of the rows.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Ratio {
    /// `zerohop-ring https / zerohop-ring http/1.1`.
    pub name: String,
    /// Requests per second, numerator over denominator.
    pub rps: f64,
    /// CPU per request of the system, numerator over denominator.
    pub cpu_per_request: f64,
}

/// The rows of one run.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Protocols {
    /// Measured points.
    pub runs: Vec<ProtocolRun>,
    /// Ratios between them.
    pub ratios: Vec<Ratio>,
}

/// The points on one system: (protocol, multiplexed).
type Points = [(Protocol, bool); 3];

/// The systems (served over TLS or not) and their points, in the order run.
const ROWS: [(SystemId, bool, Points); 3] = [
    (
        SystemId::Zerohop(zerohop_transport::Backend::Ring),
        false,
        [
            (Protocol::Http1, false),
            (Protocol::H2c, true),
            (Protocol::H2c, false),
        ],
    ),
    (
        SystemId::Zerohop(zerohop_transport::Backend::Ring),
        true,
        [
            (Protocol::Https, false),
            (Protocol::H2, true),
            (Protocol::H2, false),
        ],
    ),
    (
        SystemId::NginxTls,
        true,
        [
            (Protocol::Https, false),
            (Protocol::H2, true),
            (Protocol::H2, false),
        ],
    ),
];

/// A row: system name, protocol, multiplexed.
type Row = (&'static str, Protocol, bool);

const ZEROHOP: &str = "zerohop-ring";
const NGINX: &str = "nginx-tls";

/// The ratios reported: a row over another.
const RATIOS: [(Row, Row); 8] = [
    (
        (ZEROHOP, Protocol::Https, false),
        (ZEROHOP, Protocol::Http1, false),
    ),
    (
        (ZEROHOP, Protocol::H2, false),
        (ZEROHOP, Protocol::Http1, false),
    ),
    (
        (ZEROHOP, Protocol::H2, true),
        (ZEROHOP, Protocol::Http1, false),
    ),
    (
        (ZEROHOP, Protocol::H2c, false),
        (ZEROHOP, Protocol::Http1, false),
    ),
    (
        (ZEROHOP, Protocol::H2c, true),
        (ZEROHOP, Protocol::Http1, false),
    ),
    (
        (ZEROHOP, Protocol::Https, false),
        (NGINX, Protocol::Https, false),
    ),
    ((ZEROHOP, Protocol::H2, false), (NGINX, Protocol::H2, false)),
    ((ZEROHOP, Protocol::H2, true), (NGINX, Protocol::H2, true)),
];

/// Points [`run`] measures (for progress).
pub const POINTS: usize = 9;
/// Runs every row with `chain` and 100-byte bodies; what could not run goes to `failures`.
/// `say` gets a line per point.
pub fn run(
    chain: &[Step],
    opts: &StartOpts,
    plan: &Plan,
    say: &mut dyn FnMut(&str),
    failures: &mut Vec<String>,
) -> Protocols {
    let mut out = Protocols::default();
    if let Err(why) = h2load::available() {
        failures.push(format!("HTTPS and HTTP/2 rows: {why}"));
        return out;
    }
    let prepared = prepare(&opts.work_dir.join("protocols"), chain);
    let (cert, body_file, body) = match prepared {
        Ok(p) => p,
        Err(e) => {
            failures.push(format!("HTTPS and HTTP/2 rows: {e:#}"));
            return out;
        }
    };
    let expected = Step::expected(chain, &body);
    for (id, with_tls, protocols) in ROWS {
        let label = id.name();
        let opts = StartOpts {
            tls: with_tls.then(|| cert.clone()),
            ..opts.clone()
        };
        let sys = match systems::start(id, chain, &opts) {
            Ok(s) => s,
            Err(e) => {
                failures.push(format!("{label}: {e:#}"));
                continue;
            }
        };
        for (protocol, multiplexed) in protocols {
            let point = plan.point(protocol, multiplexed);
            let what = format!(
                "{label} {} ({} x {})",
                protocol.name(),
                point.connections,
                point.streams
            );
            say(&what);
            match measure(&sys, &opts, &point, plan, &body_file, &body, &expected) {
                Ok(r) => {
                    if let Some(f) = &r.fault {
                        failures.push(format!("{what}: {f}"));
                    }
                    out.runs.push(r);
                }
                Err(e) => failures.push(format!("{what}: {e:#}")),
            }
        }
        sys.stop();
    }
    out.ratios = ratios(&out.runs);
    out
}

/// A certificate, the body file and the body.
fn prepare(dir: &Path, chain: &[Step]) -> Result<(Certificate, PathBuf, Vec<u8>)> {
    anyhow::ensure!(!chain.is_empty(), "a chain needs at least one step");
    let cert = Certificate::generate(dir)?;
    let text = b"zero hop payload ";
    let body: Vec<u8> = (0..100).map(|i| text[i % text.len()]).collect();
    let file = dir.join("body");
    std::fs::write(&file, &body).with_context(|| format!("writing {}", file.display()))?;
    Ok((cert, file, body))
}

fn measure(
    sys: &RunningSystem,
    opts: &StartOpts,
    point: &Point,
    plan: &Plan,
    body_file: &Path,
    body: &[u8],
    expected: &[u8],
) -> Result<ProtocolRun> {
    let ca = opts.tls.as_ref().map(|c| c.cert.as_path());
    match tls::probe(&sys.url, ca, point.protocol, body) {
        Ok((200, answer)) if answer == expected => {}
        Ok((status, answer)) => anyhow::bail!(
            "curl got status {status} and {:?}, expected {:?}",
            String::from_utf8_lossy(&answer[..answer.len().min(200)]),
            String::from_utf8_lossy(expected)
        ),
        Err(e) => anyhow::bail!("{e}"),
    }
    if !plan.warmup.is_zero() {
        let warm = Point {
            duration: plan.warmup,
            ..point.clone()
        };
        h2load::run(&sys.url, &warm, body_file)?;
    }
    let before = CpuSnapshot::take(&sys.components);
    let result = h2load::run(&sys.url, point, body_file)?;
    let mut cpu_s = CpuSnapshot::take(&sys.components).since(&before);
    // The snapshot's own entry is this process, idle meanwhile; h2load is the client.
    cpu_s.insert(LOADGEN.into(), result.cpu_s);
    let answers = (result.requests as f64).max(1.0);
    let cpu_ms_per_1k: BTreeMap<String, f64> = cpu_s
        .iter()
        .map(|(k, v)| (k.clone(), v * 1e6 / answers))
        .collect();
    let sut_cpu_ms_per_1k = cpu_ms_per_1k
        .iter()
        .filter(|(k, _)| k.as_str() != LOADGEN)
        .map(|(_, v)| v)
        .sum();
    let fault = result.fault(
        point.protocol,
        expected.len(),
        point.connections * point.streams,
    );
    Ok(ProtocolRun {
        system: sys.id.name(),
        protocol: point.protocol.name().into(),
        connections: point.connections,
        streams: point.streams,
        result,
        cpu_s,
        cpu_ms_per_1k,
        sut_cpu_ms_per_1k,
        fault,
    })
}

/// [`RATIOS`] of the runs that were measured without a fault.
fn ratios(runs: &[ProtocolRun]) -> Vec<Ratio> {
    let find = |(system, protocol, multiplexed): Row| {
        runs.iter().find(|r| {
            r.system == system
                && r.protocol == protocol.name()
                && (r.streams > 1) == multiplexed
                && r.fault.is_none()
        })
    };
    let row = |r: &ProtocolRun| {
        format!(
            "{} {} ({} x {})",
            r.system, r.protocol, r.connections, r.streams
        )
    };
    RATIOS
        .iter()
        .filter_map(|&(a, b)| {
            let (ra, rb) = (find(a)?, find(b)?);
            Some(Ratio {
                name: format!("{} / {}", row(ra), row(rb)),
                rps: ra.result.rps / rb.result.rps.max(1e-9),
                cpu_per_request: ra.sut_cpu_ms_per_1k / rb.sut_cpu_ms_per_1k.max(1e-9),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_of(system: &str, protocol: Protocol, streams: usize, rps: f64, cpu: f64) -> ProtocolRun {
        ProtocolRun {
            system: system.into(),
            protocol: protocol.name().into(),
            connections: 32 / streams,
            streams,
            result: H2loadResult {
                rps,
                ..Default::default()
            },
            cpu_s: BTreeMap::new(),
            cpu_ms_per_1k: BTreeMap::new(),
            sut_cpu_ms_per_1k: cpu,
            fault: None,
        }
    }

    #[test]
    fn http2_carries_the_same_requests_in_flight_on_fewer_connections() {
        let plan = Plan {
            warmup: Duration::ZERO,
            duration: Duration::from_secs(1),
            in_flight: 32,
            h2_connections: 4,
        };
        let h1 = plan.point(Protocol::Https, true);
        assert_eq!((h1.connections, h1.streams), (32, 1));
        let h2 = plan.point(Protocol::H2c, true);
        assert_eq!((h2.connections, h2.streams), (4, 8));
        let h2 = plan.point(Protocol::H2, false);
        assert_eq!((h2.connections, h2.streams), (32, 1));
    }

    #[test]
    fn ratios_compare_the_named_rows_and_skip_faulty_or_missing_ones() {
        let mut runs = vec![
            run_of("zerohop-ring", Protocol::Http1, 1, 100.0, 10.0),
            run_of("zerohop-ring", Protocol::Https, 1, 80.0, 12.0),
            run_of("zerohop-ring", Protocol::H2, 8, 90.0, 11.0),
            run_of("nginx-tls", Protocol::Https, 1, 40.0, 24.0),
            run_of("nginx-tls", Protocol::H2, 8, 45.0, 22.0),
        ];
        runs[4].fault = Some("wrong".into());
        let r = ratios(&runs);
        let names: Vec<&str> = r.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "zerohop-ring https (32 x 1) / zerohop-ring http/1.1 (32 x 1)",
                "zerohop-ring h2 (4 x 8) / zerohop-ring http/1.1 (32 x 1)",
                "zerohop-ring https (32 x 1) / nginx-tls https (32 x 1)",
            ]
        );
        assert_eq!(r[0].rps, 0.8);
        assert_eq!(r[0].cpu_per_request, 1.2);
        assert_eq!(r[2].rps, 2.0);
        assert_eq!(r[2].cpu_per_request, 0.5);
    }
}
