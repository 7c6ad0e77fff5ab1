//! The chain spec's types: what a validated spec holds, its defaults and bounds.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::plan::{JoinPolicy, StatePlan};

/// Default number of slots in a chain's pool.
pub const DEFAULT_SLOTS: u32 = 1024;
/// Default slot size (including the slot header).
pub const DEFAULT_SLOT_SIZE: u32 = 64 * 1024;
/// Default number of large slots per security domain (for bodies bigger than a slot).
pub const DEFAULT_LARGE_SLOTS: u32 = 16;
/// Most large slots per security domain.
pub const MAX_LARGE_SLOTS: u32 = 1024;
/// Default largest request body.
pub const DEFAULT_MAX_BODY: u64 = 64 << 20;
/// Largest `max_body` a spec may set: a large slot (body, slot header, metadata reserve,
/// rounded up to a page) must stay below 4 GiB, the slot size's `u32`.
pub const MAX_MAX_BODY: u64 = 3 << 30;
/// Default answer deadline of a request.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// Default time a client has to send a request body.
pub const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(10);
/// Default cap on the gateway's open client connections.
pub const DEFAULT_MAX_CONNECTIONS: u32 = 4096;
/// Keys a state store holds unless the spec says.
pub const DEFAULT_STATE_ENTRIES: u32 = 4096;
/// Largest state value unless the spec says.
pub const DEFAULT_STATE_VALUE: u32 = 4096;
/// Most parties (gateway threads and instances) a chain may have.
pub const MAX_PARTIES: usize = 1024;
/// Most gateway threads a chain may have.
pub const MAX_GATEWAY_THREADS: u16 = 64;
/// Most instances one function may have.
pub const MAX_INSTANCES: u16 = 64;
/// Most handler threads one instance may run.
pub const MAX_CONCURRENCY: u16 = 1024;
/// Default quiet period before an instance beyond the load's needs is parked.
pub const DEFAULT_COOLDOWN: Duration = Duration::from_secs(30);
/// Default time without requests before a `min: 0` function scales to zero.
pub const DEFAULT_ZERO_AFTER: Duration = Duration::from_secs(60);
/// What `runtime: node` runs (`node -e LOADER FILE [EXPORT]`): loads the handler file,
/// takes its export (`EXPORT`, else the module itself if it is a function, else its
/// `handler`) and runs it with the `zerohop` package found from the handler's folder, so
/// both share one copy of the package.
pub const NODE_LOADER: &str = "const [file, name] = process.argv.slice(1); \
const m = require(file); \
const h = name ? m[name] : typeof m === 'function' ? m : m.handler; \
if (typeof h !== 'function') { console.error(`zerohop: ${file} exports no function ${name || 'handler'}`); process.exit(2); } \
require('module').createRequire(file)('zerohop').run(h);";

/// What `node -e NODE_FUSED_LOADER NAME FILE EXPORT ...` runs: loads each function's file,
/// takes its export (`EXPORT`, else the module itself if it is a function, else its
/// `handler`), and serves them all by function name with the `zerohop` package found from
/// the first file's folder.
pub const NODE_FUSED_LOADER: &str = "const a = process.argv.slice(1); const hs = {}; \
for (let i = 0; i + 2 < a.length; i += 3) { \
const [name, file, exp] = [a[i], a[i + 1], a[i + 2]]; \
const m = require(file); \
const h = exp ? m[exp] : typeof m === 'function' ? m : m.handler; \
if (typeof h !== 'function') { console.error(`zerohop: ${file} exports no function ${exp || 'handler'}`); process.exit(2); } \
hs[name] = h; } \
require('module').createRequire(a[1])('zerohop').run(hs);";

/// Most functions in one chain (the descriptor's `next` is one byte, 0xFF is the gateway).
pub const MAX_FUNCTIONS: usize = 254;

/// A spec error: where, which field, what is wrong and what to do.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{file}:{line}: {field}: {message}")]
pub struct SpecError {
    /// The spec file as given.
    pub file: String,
    /// 1-based line.
    pub line: usize,
    /// Path of the field, e.g. `functions.upper.command`.
    pub field: String,
    /// What is wrong and what to do.
    pub message: String,
}

/// The chain's pool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolSpec {
    /// Number of slots.
    pub slots: u32,
    /// Bytes per slot, including the 32-byte slot header.
    pub slot_size: u32,
    /// Back the pool with 2 MiB huge pages.
    pub hugepages: bool,
    /// Large slots per security domain, for bodies bigger than a slot (used only when
    /// `max_body` does not fit a slot; 0: none, and then it must).
    pub large_slots: u32,
}

impl PoolSpec {
    /// Bytes of a slot left for a body after the slot header and the metadata reserve.
    pub fn body_room(&self) -> u64 {
        u64::from(self.slot_size)
            - (zerohop_pool::SLOT_HEADER_LEN + zerohop_pool::META_RESERVE) as u64
    }

    /// The large slots a chain whose largest body is `max_body` needs per security domain:
    /// `(large_slots, large_slot_size)`, `(0, 0)` when every body fits a small slot. A large
    /// slot holds the body, the slot header and the metadata reserve, rounded up to a page
    /// (a large pool punches freed slots, page by page).
    pub fn large(&self, max_body: u64) -> (u32, u32) {
        if max_body <= self.body_room() || self.large_slots == 0 {
            return (0, 0);
        }
        let size = (max_body + (zerohop_pool::SLOT_HEADER_LEN + zerohop_pool::META_RESERVE) as u64)
            .next_multiple_of(4096);
        // The reader bounds max_body to MAX_MAX_BODY, so this fits.
        (self.large_slots, u32::try_from(size).unwrap_or(!4095))
    }
}

/// One function.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FunctionSpec {
    /// Name (the key in `functions`).
    pub name: String,
    /// Line of its entry.
    pub line: usize,
    /// Program and arguments; a program path with a `/` is resolved against the spec's
    /// folder.
    pub command: Vec<String>,
    /// Processes it comes up with (`scale.initial`).
    pub instances: u16,
    /// Handler threads per process.
    pub concurrency: u16,
    /// Extra environment variables.
    pub env: Vec<(String, String)>,
    /// Request headers (lower case) the function wants to read.
    pub headers: Vec<String>,
    /// Functions it may forward to by dynamic routing.
    pub next: Vec<String>,
    /// Functions it may call (`Request::call`); never itself, and no cycle.
    pub calls: Vec<String>,
    /// System calls allowed beyond the default seccomp allow-list (validated names).
    pub syscalls: Vec<String>,
    /// Whether its instances map the chain's state store.
    pub state: bool,
    /// Branches of a static fan-out (a route's `{ fan_out: [..], join: THIS }`) that the
    /// runtime calls before this function's handler joins their outputs; also in `calls`.
    pub fan_out: Vec<String>,
    /// What a failed branch means.
    pub join: JoinPolicy,
    /// How many instances it runs and when that changes (`instances: N` alone is a fixed
    /// count: `min = max = N`).
    pub scale: ScaleSpec,
    /// CPU, memory and process limits of each instance (cgroups).
    pub resources: ResourceSpec,
    /// Set when the function runs on a peer node (a chain split over nodes, see
    /// the agent's `split`): the peer daemon's address. Its instances are then played by the
    /// agent itself, relaying each request to the peer; `command` is never run.
    pub relay: Option<std::net::SocketAddr>,
    /// On the first function of a fused group (`fuse:`): the group's other functions, in
    /// order. Its instances run them all, each step a function call on the same slot.
    pub fused_with: Vec<String>,
    /// On the other functions of a fused group: the group's first function, whose
    /// instances run this one (it has no instances of its own).
    pub fused_into: Option<String>,
}

/// A function's autoscaling bounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScaleSpec {
    /// Fewest active instances (0: scales to zero when idle).
    pub min: u16,
    /// Most instances; the chain reserves this many parties for the function.
    pub max: u16,
    /// Instances active when the chain comes up (between `min` and `max`).
    pub initial: u16,
    /// Requests in flight per instance the scaler aims for.
    pub target: u16,
    /// Started processes kept waiting, beyond the active ones, so activation needs no
    /// `fork`/`exec` (at most `max` minus the active ones).
    pub parked: u16,
    /// Low load this long parks an instance beyond what the load needs.
    pub cooldown: Duration,
    /// No request at all this long scales a `min: 0` function to zero.
    pub zero_after: Duration,
}

impl ScaleSpec {
    /// A fixed count of `n`: no scaling.
    pub fn fixed(n: u16, concurrency: u16) -> Self {
        Self {
            min: n,
            max: n,
            initial: n,
            target: concurrency,
            parked: 0,
            cooldown: DEFAULT_COOLDOWN,
            zero_after: DEFAULT_ZERO_AFTER,
        }
    }

    /// Whether the instance count can change at all.
    pub fn scales(&self) -> bool {
        self.min != self.max
    }
}

/// Per-instance resource limits; `None` is unlimited.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ResourceSpec {
    /// CPU time per second of wall time, in thousandths of a core (`500m` = half a core).
    pub cpu_millis: Option<u32>,
    /// Memory in bytes.
    pub memory: Option<u64>,
    /// Processes and threads.
    pub pids: Option<u32>,
}

impl ResourceSpec {
    /// Whether any limit is set.
    pub fn any(&self) -> bool {
        self.cpu_millis.is_some() || self.memory.is_some() || self.pids.is_some()
    }
}

/// One route into the chain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouteSpec {
    /// Line of its entry.
    pub line: usize,
    /// HTTP method, upper case (empty: no HTTP trigger).
    pub method: String,
    /// HTTP path, starting with `/` (empty: no HTTP trigger).
    pub path: String,
    /// gRPC method `package.Service/Method` (empty: none); such a route's `method` and
    /// `path` are `POST /package.Service/Method`.
    pub grpc: String,
    /// MQTT topic filter whose messages enter by this route (empty: none).
    pub mqtt: String,
    /// Topic the output of an MQTT request is published to (empty: the MQTT 5 response
    /// topic of the message, if it has one).
    pub mqtt_reply: String,
    /// CoAP path (POST and PUT) that enters by this route (empty: none).
    pub coap: String,
    /// `Content-Type` of the route's successful HTTP answers unless a function sets one
    /// (empty: none).
    pub content_type: String,
    /// Who may use the route (`auth`; HTTP only), if anyone may not.
    pub auth: Option<AuthSpec>,
    /// How often the route may be used (`rate_limit`; HTTP only).
    pub rate_limit: Option<RateLimitSpec>,
    /// How its requests are delivered (`async`, `retry`, `idempotent`; HTTP only).
    pub delivery: crate::delivery::DeliverySpec,
    /// Functions, in order.
    pub sequence: Vec<String>,
    /// Set on the routes the agent's `split` adds for hops a peer node relays (no trigger; see
    /// [`RoutePlan::relay_of`](crate::RoutePlan::relay_of)): the index of the route they stand for.
    pub relay_of: Option<usize>,
}

/// How the gateway speaks MQTT.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MqttSpec {
    /// Devices connect to the gateway itself, which acts as their broker.
    Listen(SocketAddr),
    /// The gateway connects to an existing broker as a client and subscribes to the
    /// routes' topic filters.
    Broker {
        /// `host:port` of the broker.
        addr: String,
        /// The client id it connects with.
        client_id: String,
    },
}

/// A validated chain spec.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChainSpec {
    /// The file it came from (for messages).
    pub file: PathBuf,
    /// Chain name.
    pub name: String,
    /// Transport name (`ring` unless set).
    pub transport: String,
    /// The pool.
    pub pool: PoolSpec,
    /// Largest accepted request body in bytes (a body that does not fit a slot goes into a
    /// large slot, [`PoolSpec::large`]).
    pub max_body: u64,
    /// How long a request may take end to end (also bounds the 502 after a crash).
    pub timeout: Duration,
    /// How long a client may take to send a request body once its headers are in (408).
    pub body_timeout: Duration,
    /// Most client connections the gateway serves at once.
    pub max_connections: u32,
    /// Gateway threads; `None` (`auto`): one per core the agent may run on.
    pub gateway_threads: Option<u16>,
    /// The chain's cores, ascending (empty: anywhere the agent runs). See [`crate::cpus`].
    pub cpus: Vec<u16>,
    /// Functions, in spec order.
    pub functions: Vec<FunctionSpec>,
    /// Routes, in spec order.
    pub routes: Vec<RouteSpec>,
    /// MQTT ingress, if any route has an `mqtt` topic.
    pub mqtt: Option<MqttSpec>,
    /// CoAP ingress address, if any route has a `coap` path.
    pub coap: Option<SocketAddr>,
    /// The chain's state store, if any function has `state: true`.
    pub state: Option<StatePlan>,
    /// Where the HTTP gateway listens (`zerohop up --listen` and `zerohop apply --listen`
    /// override it; `None`: 127.0.0.1:8080 for `up`, a free port for `apply`).
    pub listen: Option<SocketAddr>,
    /// The chain's data folder (`data:`), if it has one.
    pub data: Option<DataSpec>,
    /// TLS on the HTTP listener (and on `mqtt_tls`), if the spec has a `tls` section.
    pub tls: Option<TlsSpec>,
    /// Where the MQTT broker also listens over TLS (`mqtt.listen_tls`), beside
    /// [`MqttSpec::Listen`].
    pub mqtt_tls: Option<SocketAddr>,
    /// Fused groups (`fuse:`): consecutive functions of one program run by one set of
    /// instances, each hop between them a function call.
    pub fuse: Vec<FuseSpec>,
}

/// A fused group (`fuse: [[upper, exclaim]]`): functions of one program that one set of
/// instances runs, the hops between them function calls on the same slot. The group is one
/// security domain and one failure unit; its first function's `instances`, `concurrency`
/// and `scale` are the group's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FuseSpec {
    /// Line of the group in the spec.
    pub line: usize,
    /// The group's functions, in the order every route runs them.
    pub functions: Vec<String>,
}

impl FuseSpec {
    /// The group's name as shown to people: its functions joined by `+` (`upper+exclaim`).
    pub fn name(&self) -> String {
        self.functions.join("+")
    }
}

/// The certificates of the chain's listeners (`tls:`): with it the HTTP listener speaks
/// HTTPS (HTTP/2 and HTTP/1.1 by ALPN) instead of clear text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsSpec {
    /// Line of the section.
    pub line: usize,
    /// The certificates, the default first (used when the client's SNI names none of them).
    pub certificates: Vec<CertSpec>,
}

/// One certificate chain and its key (PEM files).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertSpec {
    /// Its field in the spec (`tls`, `tls[1]`), for messages.
    pub field: String,
    /// The certificate chain file (absolute: resolved against the spec's folder).
    pub cert: PathBuf,
    /// Line of `cert`.
    pub cert_line: usize,
    /// The private key file (absolute).
    pub key: PathBuf,
    /// Line of `key`.
    pub key_line: usize,
}

/// Where a chain keeps the files its functions write (`data:` in the spec): a folder the
/// agent creates and gives to the chain's uid, named to functions by `$ZEROHOP_DATA`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DataSpec {
    /// `data: true`: the default place (`/var/lib/zerohop/chains/NAME` as root).
    Default,
    /// `data: PATH`: this folder (a relative path is resolved against the spec's folder).
    At(PathBuf),
}

/// Who may use a route: the gateway checks it before it reads the body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AuthSpec {
    /// A JSON Web Token in `Authorization: Bearer ...`, signed by a key of a JWKS.
    Jwt(JwtSpec),
    /// A key from a file, in a header.
    ApiKeys {
        /// The file: one `NAME KEY` per line (`#` starts a comment).
        file: PathBuf,
        /// The header that carries the key (lower case; `x-api-key` unless set).
        header: String,
    },
}

/// How a route checks JSON Web Tokens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JwtSpec {
    /// Where the public keys are.
    pub jwks: JwksSource,
    /// The `iss` a token must carry, if set.
    pub issuer: Option<String>,
    /// An `aud` a token must carry, if set.
    pub audience: Option<String>,
    /// The signature algorithms accepted (of `RS256`, `ES256`, `EdDSA`; all three unless set).
    pub algorithms: Vec<String>,
    /// How far `exp` and `nbf` may be off (clock skew; 60s unless set).
    pub leeway: Duration,
    /// Scopes the token's `scope` claim must all hold (else 403), if any.
    pub scopes: Vec<String>,
}

/// Where a JWKS comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JwksSource {
    /// A file (re-read when it changes).
    File(PathBuf),
    /// An `http://` or `https://` URL (fetched at start and every `refresh`).
    Url(String),
}

/// A token bucket: `requests` per `per`, up to `burst` at once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RateLimitSpec {
    /// Requests the bucket refills per `per`.
    pub requests: u32,
    /// The period of `requests`.
    pub per: Duration,
    /// The bucket's size: requests allowed at once after a quiet time.
    pub burst: u32,
    /// One bucket per client (the authenticated name, else the address) instead of one for
    /// the route.
    pub per_client: bool,
}
