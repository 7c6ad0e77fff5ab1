//! Prometheus metrics of every chain the daemon runs, in the text exposition format, from a
//! `prometheus-client` collector that reads the chains' counters at each scrape (chains come
//! and go; nothing is registered per chain).
//!
//! Every family is labelled `chain` and, where it is per function, `function`.

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http::{Response, StatusCode};
use http_body_util::Full;
use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::sync::watch;

use super::Daemon;
use crate::api::{ChainStatus, FunctionStatus};

/// The collector: reads every chain at scrape time.
#[derive(Debug)]
struct Chains(std::sync::Weak<Daemon>);

impl std::fmt::Debug for Daemon {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Daemon").finish_non_exhaustive()
    }
}

/// Label pairs of one sample.
type Labels = Vec<(&'static str, String)>;

/// Writes one family of counters or gauges: one sample per label set.
fn family(
    enc: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    kind: MetricType,
    samples: impl IntoIterator<Item = (Labels, u64)>,
) -> Result<(), std::fmt::Error> {
    let mut m = enc.encode_descriptor(name, help, None, kind)?;
    for (labels, v) in samples {
        let fam = m.encode_family(&labels)?;
        if matches!(kind, MetricType::Counter) {
            ConstCounter::new(v).encode(fam)?;
        } else {
            ConstGauge::new(v.min(i64::MAX as u64) as i64).encode(fam)?;
        }
    }
    Ok(())
}

/// Per-chain families: name, help, type, value.
type ChainFamily = (
    &'static str,
    &'static str,
    MetricType,
    fn(&ChainStatus) -> u64,
);
const CHAIN_FAMILIES: [ChainFamily; 8] = [
    (
        "zerohop_requests",
        "Requests the gateway sent into the chain",
        MetricType::Counter,
        |s| s.gateway.accepted,
    ),
    (
        "zerohop_answers_ok",
        "Requests answered with a 2xx or 3xx status",
        MetricType::Counter,
        |s| s.gateway.ok,
    ),
    (
        "zerohop_answers_error",
        "Requests answered with an error status, from any source",
        MetricType::Counter,
        |s| s.gateway.errors,
    ),
    (
        "zerohop_descriptors_refused",
        "Descriptors the gateway refused (wrong slot, generation, request, route or sender)",
        MetricType::Counter,
        |s| s.gateway.refused,
    ),
    (
        "zerohop_answers_late",
        "Answers that came after their request was already answered",
        MetricType::Counter,
        |s| s.gateway.late,
    ),
    (
        "zerohop_inflight",
        "Requests waiting for the chain now",
        MetricType::Gauge,
        |s| s.gateway.inflight,
    ),
    (
        "zerohop_slots_in_use",
        "Slots of the chain's pools in use now",
        MetricType::Gauge,
        |s| s.slots.in_use,
    ),
    (
        "zerohop_slots",
        "Slots in the chain's pools",
        MetricType::Gauge,
        |s| s.slots.total,
    ),
];

/// Per-function families: name, help, type, value.
type FunctionFamily = (
    &'static str,
    &'static str,
    MetricType,
    fn(&FunctionStatus) -> u64,
);
const FUNCTION_FAMILIES: [FunctionFamily; 12] = [
    (
        "zerohop_function_instances",
        "Instances of the function attached and receiving",
        MetricType::Gauge,
        |f| f.ready as u64,
    ),
    (
        "zerohop_function_instances_wanted",
        "Instances the scaler wants serving now",
        MetricType::Gauge,
        |f| f.desired as u64,
    ),
    (
        "zerohop_function_instances_parked",
        "Instances started and waiting for activation",
        MetricType::Gauge,
        |f| f.parked as u64,
    ),
    (
        "zerohop_function_activations",
        "Parked instances activated (no fork or exec)",
        MetricType::Counter,
        |f| f.activations,
    ),
    (
        "zerohop_function_cold_starts",
        "Instances started cold because the scaler wanted one more and none was parked",
        MetricType::Counter,
        |f| f.cold_starts,
    ),
    (
        "zerohop_function_slots_in_use",
        "Slots the function's instances hold now",
        MetricType::Gauge,
        |f| f.slots,
    ),
    (
        "zerohop_function_restarts",
        "Times the function's instances were restarted",
        MetricType::Counter,
        |f| f.restarts,
    ),
    (
        "zerohop_function_requests",
        "Requests the function's handlers finished",
        MetricType::Counter,
        |f| f.handled,
    ),
    (
        "zerohop_function_errors",
        "Requests the function's handlers ended with an error or a panic",
        MetricType::Counter,
        |f| f.failed,
    ),
    (
        "zerohop_function_inflight",
        "Requests in the function's handlers now",
        MetricType::Gauge,
        |f| f.busy,
    ),
    (
        "zerohop_function_log_lines",
        "Output lines the function's instances printed and the daemon stored",
        MetricType::Counter,
        |f| f.log_lines,
    ),
    (
        "zerohop_function_log_lines_dropped",
        "Output lines dropped because the function printed faster than its budget",
        MetricType::Counter,
        |f| f.log_dropped,
    ),
];

impl Collector for Chains {
    fn encode(&self, mut enc: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let Some(daemon) = self.0.upgrade() else {
            return Ok(());
        };
        let all: Vec<_> = daemon.views().iter().map(|v| v.status()).collect();
        for (name, help, kind, value) in CHAIN_FAMILIES {
            let samples = all
                .iter()
                .map(|s| (vec![("chain", s.name.clone())], value(s)));
            family(&mut enc, name, help, kind, samples)?;
        }
        for (name, help, counter, samples) in super::admin::dlq::families(&daemon.views()) {
            let kind = if counter {
                MetricType::Counter
            } else {
                MetricType::Gauge
            };
            let samples = samples.into_iter().map(|(c, v)| (vec![("chain", c)], v));
            family(&mut enc, name, help, kind, samples)?;
        }
        let functions = || {
            all.iter()
                .flat_map(|s| s.functions.iter().map(move |f| (s.name.as_str(), f)))
        };
        let fn_labels = |chain: &str, f: &FunctionStatus| -> Labels {
            vec![("chain", chain.to_owned()), ("function", f.name.clone())]
        };
        for (name, help, kind, value) in FUNCTION_FAMILIES {
            let samples = functions().map(|(c, f)| (fn_labels(c, f), value(f)));
            family(&mut enc, name, help, kind, samples)?;
        }
        // Per instance (cgroup figures restart with the instance: labelled by party, so a
        // restart is a counter reset, which Prometheus handles).
        let mut cpu = Vec::new();
        let mut mem = Vec::new();
        let mut throttled = Vec::new();
        for (c, fs) in functions() {
            for i in &fs.instances {
                let labels = || {
                    let mut l = fn_labels(c, fs);
                    l.push(("instance", i.party.to_string()));
                    l
                };
                if let Some(ns) = i.cpu_ns {
                    cpu.push((labels(), ns));
                }
                if let Some(b) = i.memory_bytes {
                    mem.push((labels(), b));
                }
                if let Some(t) = i.throttled {
                    throttled.push((labels(), t));
                }
            }
        }
        let mut m = enc.encode_descriptor(
            "zerohop_instance_cpu_seconds",
            "CPU time the instance's processes used since it started (its cgroup)",
            None,
            MetricType::Counter,
        )?;
        for (labels, ns) in &cpu {
            ConstCounter::new(*ns as f64 / 1e9).encode(m.encode_family(labels)?)?;
        }
        family(
            &mut enc,
            "zerohop_instance_memory_bytes",
            "Memory charged to the instance now (its cgroup)",
            MetricType::Gauge,
            mem,
        )?;
        family(
            &mut enc,
            "zerohop_instance_cpu_throttled_periods",
            "CFS periods in which the instance's CPU limit throttled it",
            MetricType::Counter,
            throttled,
        )?;
        const REASONS: [&str; 3] = ["wrong_function", "ownership", "malformed"];
        let rejected = functions().flat_map(|(c, f)| {
            REASONS.iter().zip(f.rejected).map(move |(r, n)| {
                let mut l = fn_labels(c, f);
                l.push(("reason", (*r).to_owned()));
                (l, n)
            })
        });
        family(
            &mut enc,
            "zerohop_function_descriptors_rejected",
            "Descriptors the function's instances dropped, by reason",
            MetricType::Counter,
            rejected,
        )?;
        // The sockmap transport's eBPF counters (only chains on that transport have them).
        let kernel = functions().filter_map(|(c, f)| f.kernel.as_ref().map(|k| (c, f, k)));
        let directions = kernel.clone().flat_map(|(c, f, k)| {
            [("in", k.received), ("out", k.sent)]
                .into_iter()
                .map(move |(d, n)| {
                    let mut l = fn_labels(c, f);
                    l.push(("direction", d.to_owned()));
                    (l, n)
                })
        });
        family(
            &mut enc,
            "zerohop_function_kernel_descriptors",
            "Descriptors the kernel delivered to (in) or from (out) the function's instances \
             (transport: sockmap)",
            MetricType::Counter,
            directions,
        )?;
        let drops = kernel.flat_map(|(c, f, k)| {
            k.dropped.iter().map(move |(r, n)| {
                let mut l = fn_labels(c, f);
                l.push(("reason", r.clone()));
                (l, *n)
            })
        });
        family(
            &mut enc,
            "zerohop_function_kernel_drops",
            "Descriptors the function's instances sent that the kernel refused, by reason \
             (transport: sockmap)",
            MetricType::Counter,
            drops,
        )?;
        let mut m = enc.encode_descriptor(
            "zerohop_function_duration_seconds",
            "Time requests spent in the function's handler",
            None,
            MetricType::Histogram,
        )?;
        for (c, fs) in functions() {
            let labels = fn_labels(c, fs);
            // Per bucket, not cumulative (the encoder adds them up); f64::MAX is its +Inf.
            let buckets: Vec<(f64, u64)> = fs
                .latency_buckets
                .iter()
                .enumerate()
                .map(|(k, &n)| {
                    let bound = zerohop_pool::latency_bucket_bound_us(k)
                        .map_or(f64::MAX, |us| us as f64 / 1e6);
                    (bound, n)
                })
                .collect();
            let count = buckets.iter().fold(0u64, |a, &(_, n)| a.saturating_add(n));
            m.encode_family(&labels)?
                .encode_histogram::<prometheus_client::encoding::NoLabelSet>(
                    fs.latency_us_sum as f64 / 1e6,
                    count,
                    &buckets,
                    None,
                )?;
        }
        Ok(())
    }
}

/// Which exposition format a scraper gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// OpenMetrics 1.0 text (what `prometheus-client` writes), for scrapers that ask for it.
    OpenMetrics,
    /// The Prometheus text format 0.0.4, for everyone else (curl, `promtool check metrics`).
    Prometheus,
}

impl Format {
    /// The format an `Accept` header asks for.
    pub fn from_accept(accept: Option<&str>) -> Self {
        match accept {
            Some(a) if a.contains("application/openmetrics-text") => Format::OpenMetrics,
            _ => Format::Prometheus,
        }
    }

    fn content_type(self) -> &'static str {
        match self {
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
            Format::Prometheus => "text/plain; version=0.0.4; charset=utf-8",
        }
    }
}

/// The metrics page now.
pub fn render(daemon: &Arc<Daemon>, format: Format) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(Chains(Arc::downgrade(daemon))));
    let mut out = String::new();
    if prometheus_client::encoding::text::encode(&mut out, &registry).is_err() {
        out.clear();
    }
    match format {
        Format::OpenMetrics => out,
        Format::Prometheus => to_prometheus_text(&out),
    }
}

/// OpenMetrics text to the Prometheus text format: a counter family `x` is described as
/// `x_total` there (its samples already are), and there is no `# EOF` line. Everything
/// else (gauges, histograms, labels, escaping) is the same in both.
pub fn to_prometheus_text(open: &str) -> String {
    let counters: std::collections::HashSet<&str> = open
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(open.len() + counters.len() * 16);
    for line in open.lines() {
        if line == "# EOF" {
            continue;
        }
        let rewritten = ["# HELP ", "# TYPE "].iter().find_map(|p| {
            let rest = line.strip_prefix(p)?;
            let (name, tail) = rest.split_once(' ')?;
            counters
                .contains(name)
                .then(|| format!("{p}{name}_total {tail}"))
        });
        out.push_str(rewritten.as_deref().unwrap_or(line));
        out.push('\n');
    }
    out
}

/// Serves `GET /metrics` on `listener` until `stop` turns true.
pub async fn serve(daemon: Arc<Daemon>, listener: TcpListener, mut stop: watch::Receiver<bool>) {
    loop {
        let stream = tokio::select! {
            a = listener.accept() => match a {
                Ok((s, _)) => s,
                Err(e) => {
                    tracing::warn!("metrics: accept failed: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = stop.changed() => return,
        };
        let daemon = daemon.clone();
        tokio::spawn(async move {
            let service =
                hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                    let daemon = daemon.clone();
                    async move {
                        let r = if req.uri().path() == "/metrics" {
                            let format = Format::from_accept(
                                req.headers()
                                    .get(http::header::ACCEPT)
                                    .and_then(|a| a.to_str().ok()),
                            );
                            let mut r =
                                Response::new(Full::new(Bytes::from(render(&daemon, format))));
                            r.headers_mut().insert(
                                http::header::CONTENT_TYPE,
                                http::HeaderValue::from_static(format.content_type()),
                            );
                            r
                        } else {
                            let mut r = Response::new(Full::new(Bytes::from_static(
                                b"metrics are at /metrics\n",
                            )));
                            *r.status_mut() = StatusCode::NOT_FOUND;
                            r
                        };
                        Ok::<_, Infallible>(r)
                    }
                });
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}
