//! The daemon's admin API: what goes over its unix socket, as JSON.
//!
//! HTTP/1.1 on a unix socket (mode 0600, peer credentials checked), so `curl --unix-socket`
//! works too:
//!
//! | method and path | body in | answer |
//! |---|---|---|
//! | `GET /v1/chains` | | `[ChainSummary]` |
//! | `POST /v1/chains` | [`ApplyRequest`] | [`ApplyResponse`] |
//! | `GET /v1/chains/NAME` | | [`ChainStatus`] |
//! | `DELETE /v1/chains/NAME` | | [`DownResponse`] |
//! | `POST /v1/chains/NAME/scale` | [`ScaleRequest`] | [`ChainStatus`] |
//! | `POST /v1/chains/NAME/invoke` | [`InvokeRequest`] | [`InvokeResponse`] |
//! | `GET /v1/chains/NAME/logs?function=F&lines=N&follow=1` | | [`LogEntry`] per line (JSON lines, streamed with `follow`) |
//! | `GET /v1/top` | | `[ChainStatus]` |
//! | `GET /v1/daemon` | | [`DaemonStatus`] |
//!
//! Errors answer a 4xx or 5xx status with [`ErrorBody`].

use serde::{Deserialize, Serialize};

/// Version prefix of every path.
pub const PREFIX: &str = "/v1";

/// `zerohop apply FILE`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ApplyRequest {
    /// Absolute path of the spec (relative program paths are resolved against its folder,
    /// errors name it).
    pub path: String,
    /// The spec's text, as the client read it.
    pub text: String,
    /// Address of the chain's HTTP listener (default: the spec's `listen`, else a free port
    /// on 127.0.0.1).
    #[serde(default)]
    pub listen: Option<String>,
    /// Run only part of the chain here (a chain split over nodes, see `zerohop_agent::split`):
    /// the functions of this node and where the others run. The daemon needs `--peer-secret`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub split: Option<SplitRequest>,
}

/// The part of a chain one node runs.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SplitRequest {
    /// The functions that run on this node.
    pub local: Vec<String>,
    /// Every other function, and the peer daemon (`IP:PORT`) of the node it runs on.
    pub peers: std::collections::BTreeMap<String, std::net::SocketAddr>,
}

/// What `apply` did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Applied {
    /// A new chain came up.
    Created,
    /// A running chain was changed in place.
    Updated,
    /// A running chain was replaced by a new one (blue-green) on the same listeners.
    Replaced,
    /// The spec is what already runs.
    Unchanged,
}

/// Answer to [`ApplyRequest`].
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ApplyResponse {
    /// What happened.
    pub applied: Applied,
    /// What changed, one line each (empty for `created` and `unchanged`).
    #[serde(default)]
    pub changes: Vec<String>,
    /// The chain now.
    pub status: ChainStatus,
}

/// One line of `zerohop ls`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ChainSummary {
    /// Chain name.
    pub name: String,
    /// Where it listens.
    pub listeners: Vec<String>,
    /// Functions.
    pub functions: usize,
    /// Active instances over all functions.
    pub instances: usize,
    /// Requests answered (2xx/3xx) and failed since it came up.
    pub ok: u64,
    /// Requests answered with an error.
    pub errors: u64,
    /// Seconds since it came up.
    pub uptime_s: u64,
}

/// `zerohop status CHAIN`, and one chain of `top`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ChainStatus {
    /// Chain name.
    pub name: String,
    /// The spec file it came from.
    pub spec: String,
    /// Every way in, as URLs.
    pub listeners: Vec<String>,
    /// The daemon's Prometheus endpoint, if it serves one.
    #[serde(default)]
    pub metrics_url: Option<String>,
    /// Transport backend.
    pub transport: String,
    /// Who instances run as, and their cgroup.
    pub confinement: String,
    /// Seconds since it came up.
    pub uptime_s: u64,
    /// Gateway counters.
    pub gateway: GatewayCounters,
    /// Slots of the chain's pools.
    pub slots: SlotCounters,
    /// Functions, in spec order.
    pub functions: Vec<FunctionStatus>,
    /// Routes, in spec order.
    pub routes: Vec<RouteStatus>,
}

/// The gateway's counters of a chain (all its threads).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct GatewayCounters {
    /// Requests sent into the chain.
    pub accepted: u64,
    /// Answered 2xx/3xx.
    pub ok: u64,
    /// Answered with an error status (any source).
    pub errors: u64,
    /// Requests waiting for the chain now.
    pub inflight: u64,
    /// Descriptors refused (wrong slot, generation, request, route or sender).
    pub refused: u64,
    /// Answers that came after their request was already answered.
    pub late: u64,
    /// What the kernel counted for the gateway's sends (`transport: sockmap` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel: Option<KernelCounters>,
}

/// Descriptors the sockmap transport's eBPF program counted for one function (or the
/// gateway), over the chain's life.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelCounters {
    /// Delivered to its instances.
    pub received: u64,
    /// Sent by its instances and delivered.
    pub sent: u64,
    /// Sent by its instances and refused, by reason (`malformed`, `edge_not_declared`,
    /// `no_instance`, `no_socket`, `unknown_sender`).
    pub dropped: std::collections::BTreeMap<String, u64>,
}

impl KernelCounters {
    /// From the program's counter row.
    pub fn from_row(row: &zerohop_transport::sockmap::abi::FnStats) -> Self {
        use zerohop_transport::sockmap::abi::DROP_NAMES;
        Self {
            received: row.received,
            sent: row.sent,
            dropped: DROP_NAMES
                .iter()
                .zip(row.dropped)
                .map(|(n, v)| ((*n).to_owned(), v))
                .collect(),
        }
    }
}

/// Slot accounting.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct SlotCounters {
    /// Slots in use now (small and large).
    pub in_use: u64,
    /// Slots in all pools (small and large).
    pub total: u64,
    /// Of `in_use`, slots of the large pools (bodies bigger than a small slot).
    #[serde(default)]
    pub large_in_use: u64,
    /// Of `total`, slots of the large pools.
    #[serde(default)]
    pub large_total: u64,
    /// The largest body a request or an answer may have (`max_body`), 0 when not known.
    #[serde(default)]
    pub max_body: u64,
}

/// One function of a chain.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct FunctionStatus {
    /// Name.
    pub name: String,
    /// Instances attached and receiving.
    pub ready: usize,
    /// Instances the scaler wants serving now.
    pub desired: usize,
    /// Instances started and waiting parked (activated without `fork` or `exec`).
    #[serde(default)]
    pub parked: usize,
    /// Scaling bounds.
    pub min: u16,
    /// Scaling bounds.
    pub max: u16,
    /// Requests in flight per instance the scaler aims for.
    #[serde(default)]
    pub target: u16,
    /// Parked instances activated so far.
    #[serde(default)]
    pub activations: u64,
    /// Instances started cold because the scaler wanted one more and none was parked.
    #[serde(default)]
    pub cold_starts: u64,
    /// Restarts over all its instances.
    pub restarts: u64,
    /// Slots its instances hold now.
    pub slots: u64,
    /// Requests in its handlers now.
    pub busy: u64,
    /// Requests its handlers finished (over its life, all instances).
    pub handled: u64,
    /// Of those, ended in an error (returned or a panic).
    pub failed: u64,
    /// Sum of handler times in microseconds.
    pub latency_us_sum: u64,
    /// Handler-time histogram, not cumulative: bucket `k` counts runs shorter than `2^k`
    /// microseconds (the last bucket: longer ones).
    pub latency_buckets: Vec<u64>,
    /// Descriptors its instances dropped: wrong function, ownership, malformed.
    pub rejected: [u64; 3],
    /// What the kernel counted for it (`transport: sockmap` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel: Option<KernelCounters>,
    /// The fused group it is a step of (`upper+exclaim`, `fuse:` in the spec), empty when it
    /// is not fused. The group's instances, counters and restarts are its first function's;
    /// the others have none of their own.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub fused: String,
    /// Output lines its instances printed and the daemon stored.
    pub log_lines: u64,
    /// Output lines dropped (the function printed faster than its budget).
    pub log_dropped: u64,
    /// Its instances.
    pub instances: Vec<InstanceStatus>,
}

impl FunctionStatus {
    /// The `q` quantile (0..1) of handler time in microseconds from histogram `buckets`
    /// (interpolated inside a bucket; `None` without samples).
    pub fn quantile_us(buckets: &[u64], q: f64) -> Option<f64> {
        let total: u64 = buckets.iter().sum();
        if total == 0 {
            return None;
        }
        let want = (q.clamp(0.0, 1.0) * total as f64).max(1.0);
        let mut seen = 0u64;
        for (k, &n) in buckets.iter().enumerate() {
            if n == 0 {
                continue;
            }
            if (seen + n) as f64 >= want {
                // Bucket k holds [bound(k-1), bound(k)); the last one, unbounded, is read as
                // one more doubling.
                let bound = zerohop_pool::latency_bucket_bound_us;
                let lo = k.checked_sub(1).and_then(bound).unwrap_or(0) as f64;
                let hi = match bound(k) {
                    Some(b) if k + 1 < buckets.len() => b as f64,
                    _ => lo * 2.0,
                };
                let frac = (want - seen as f64) / n as f64;
                return Some(lo + (hi - lo) * frac);
            }
            seen += n;
        }
        None
    }
}

/// One instance (party) of a function.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct InstanceStatus {
    /// Party number.
    pub party: u16,
    /// Process id, if it runs.
    pub pid: Option<u32>,
    /// `ready`, `parked`, `starting`, `draining`, `stopped`, `dead`.
    pub state: String,
    /// Times it was restarted.
    pub restarts: u32,
    /// CPU time its processes used since it started, nanoseconds (from its cgroup).
    #[serde(default)]
    pub cpu_ns: Option<u64>,
    /// Memory charged to it now, bytes (from its cgroup).
    #[serde(default)]
    pub memory_bytes: Option<u64>,
    /// CFS periods its CPU limit throttled it in.
    #[serde(default)]
    pub throttled: Option<u64>,
    /// When the scaler last decided to activate it (`CLOCK_MONOTONIC` nanoseconds, the
    /// machine's clock for every process), if it ever did.
    #[serde(default)]
    pub activated_ns: Option<u64>,
    /// How that activation went: `parked` (no fork or exec) or `cold`.
    #[serde(default)]
    pub activation: Option<String>,
    /// The CPU it runs on, in a chain with `cpus` (its lane's, `docs/pipelines.md`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<u16>,
}

/// One route of a chain.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct RouteStatus {
    /// How requests enter: `POST /hello`, `mqtt sensors/+`, `coap /x`.
    pub triggers: Vec<String>,
    /// Function names, in order.
    pub sequence: Vec<String>,
    /// What guards it and shapes its answers: `jwt (FILE)`, `api keys (FILE, in HEADER)`,
    /// `rate N per P, burst B`, `content type T`.
    #[serde(default)]
    pub guards: Vec<String>,
}

/// `zerohop down CHAIN`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DownResponse {
    /// Chain name.
    pub name: String,
    /// Requests it answered in its life.
    pub answered: u64,
}

/// `zerohop scale CHAIN FN N`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ScaleRequest {
    /// Function name.
    pub function: String,
    /// Instances it should run.
    pub instances: u16,
}

/// `zerohop invoke CHAIN ROUTE`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct InvokeRequest {
    /// `POST /hello`, `/hello`, an MQTT topic, a CoAP path, or `#N` (route index).
    pub route: String,
    /// The request body.
    #[serde(default)]
    pub data: String,
}

/// Answer to [`InvokeRequest`].
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct InvokeResponse {
    /// Status the chain answered with.
    pub status: u16,
    /// The body (lossy UTF-8).
    pub body: String,
    /// Microseconds from submit to answer.
    pub micros: u64,
}

/// One captured output line of an instance.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LogEntry {
    /// RFC 3339 UTC, milliseconds.
    pub time: String,
    /// Chain name.
    pub chain: String,
    /// Function name.
    pub function: String,
    /// Party number of the instance.
    pub instance: u16,
    /// `stdout` or `stderr`.
    pub stream: String,
    /// The line.
    pub text: String,
}

/// `GET /v1/daemon`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DaemonStatus {
    /// Daemon pid.
    pub pid: u32,
    /// Version of zerohop.
    pub version: String,
    /// The admin socket.
    pub socket: String,
    /// The Prometheus endpoint, if any.
    pub metrics_url: Option<String>,
    /// Chains it runs.
    pub chains: usize,
}

/// Body of an error answer.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ErrorBody {
    /// One line: what went wrong and what to do.
    pub error: String,
}

#[cfg(test)]
mod tests {
    use super::FunctionStatus;

    #[test]
    fn quantiles_interpolate_inside_power_of_two_buckets() {
        assert_eq!(FunctionStatus::quantile_us(&[0; 24], 0.5), None);
        // Ten runs in [4, 8) us: the median is half way in.
        let mut b = [0u64; 24];
        b[3] = 10;
        assert_eq!(FunctionStatus::quantile_us(&b, 0.5), Some(6.0));
        assert_eq!(FunctionStatus::quantile_us(&b, 1.0), Some(8.0));
        // One more, slow run in the last (unbounded) bucket sets p99.
        b[23] = 1;
        let p99 = FunctionStatus::quantile_us(&b, 0.99).unwrap();
        assert!(p99 > (1u64 << 22) as f64, "{p99}");
        assert!(FunctionStatus::quantile_us(&b, 0.5).unwrap() < 8.0);
    }
}
