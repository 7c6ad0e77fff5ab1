//! The chain spec: YAML in, a validated [`ChainSpec`] out.
//!
//! Every error names the file, the line, the field (as a path such as
//! `routes[0].sequence[1]`) and what to do: `chain.yaml:6: routes[0].sequence[1]: unknown
//! function `shout`; known functions: upper, exclaim`. Unknown fields are errors too, so a
//! typo never silently falls back to a default.
//!
//! The format, field by field, is in `docs/spec.md`:
//!
//! ```yaml
//! name: hello
//! transport: ring                       # optional: ring (default) or socket
//! pool: { slots: 1024, slot_size: 64KiB, hugepages: false }   # optional
//! max_body: 60KiB                       # optional: largest request body
//! timeout: 10s                          # optional: a request's answer deadline
//! functions:
//!   upper:   { command: ["./upper"], instances: 1, concurrency: 1 }
//!   exclaim: { command: ["./exclaim"], env: { K: v }, headers: [X-Trace], next: [upper] }
//!   tracer:  { command: ["./tracer"], syscalls: [ptrace] }   # beyond the seccomp allow-list
//! routes:
//!   - http: POST /hello
//!     sequence: [upper, exclaim]
//! ```

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::plan::{JoinPolicy, StatePlan};
use saphyr::{LoadableYamlNode, MarkedYaml, Scalar, YamlData};
use zerohop_pool::{META_RESERVE, SLOT_HEADER_LEN};

/// Default number of slots in a chain's pool.
pub const DEFAULT_SLOTS: u32 = 1024;
/// Default slot size (including the slot header).
pub const DEFAULT_SLOT_SIZE: u32 = 64 * 1024;
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
    /// MQTT topic filter whose messages enter by this route (empty: none).
    pub mqtt: String,
    /// Topic the output of an MQTT request is published to (empty: the MQTT 5 response
    /// topic of the message, if it has one).
    pub mqtt_reply: String,
    /// CoAP path (POST and PUT) that enters by this route (empty: none).
    pub coap: String,
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
    /// Largest accepted request body in bytes.
    pub max_body: u64,
    /// How long a request may take end to end (also bounds the 502 after a crash).
    pub timeout: Duration,
    /// How long a client may take to send a request body once its headers are in (408).
    pub body_timeout: Duration,
    /// Most client connections the gateway serves at once.
    pub max_connections: u32,
    /// Gateway threads; `None` (`auto`): one per core the agent may run on.
    pub gateway_threads: Option<u16>,
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

/// Reads and validates the spec at `path`.
pub fn load(path: &Path) -> Result<ChainSpec, SpecError> {
    let text = std::fs::read_to_string(path).map_err(|e| SpecError {
        file: path.display().to_string(),
        line: 0,
        field: "(file)".into(),
        message: format!("cannot read the spec: {e}"),
    })?;
    parse(path, &text)
}

/// Parses and validates spec `text` that came from `path` (relative program paths are
/// resolved against `path`'s folder).
pub fn parse(path: &Path, text: &str) -> Result<ChainSpec, SpecError> {
    let cx = Cx {
        file: path.display().to_string(),
    };
    let docs = MarkedYaml::load_from_str(text).map_err(|e| SpecError {
        file: cx.file.clone(),
        line: e.marker().line(),
        field: "(yaml)".into(),
        message: format!("not valid YAML: {}", e.info()),
    })?;
    let root = match docs.as_slice() {
        [] => return Err(cx.err(1, "(spec)", "the spec is empty; see docs/spec.md")),
        [one] => one,
        [_, second, ..] => {
            return Err(cx.err(
                line(second),
                "(spec)",
                "the file holds several YAML documents; one chain per file",
            ))
        }
    };
    let top = cx.mapping(root, "(spec)")?;
    let known = [
        "name",
        "transport",
        "pool",
        "max_body",
        "timeout",
        "body_timeout",
        "max_connections",
        "gateway_threads",
        "functions",
        "routes",
        "mqtt",
        "coap",
        "state",
        "listen",
        "data",
    ];
    cx.only_known(&top, "", &known)?;

    let name_node = cx.required(root, &top, "name", "")?;
    let name = cx.string(name_node, "name")?;
    if name.is_empty()
        || name.len() > 64
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        return Err(cx.err(
            line(name_node),
            "name",
            "a chain name is 1 to 64 letters, digits, `-` or `_`",
        ));
    }

    let transport = match get(&top, "transport") {
        None => "ring".to_owned(),
        Some(n) => {
            let t = cx.string(n, "transport")?;
            if t.parse::<crate::Backend>().is_err() {
                let names: Vec<&str> = crate::Backend::ALL.iter().map(|b| b.name()).collect();
                return Err(cx.err(
                    line(n),
                    "transport",
                    format!("unknown transport `{t}`; use one of: {}", names.join(", ")),
                ));
            }
            t
        }
    };

    let pool = match get(&top, "pool") {
        None => PoolSpec {
            slots: DEFAULT_SLOTS,
            slot_size: DEFAULT_SLOT_SIZE,
            hugepages: false,
        },
        Some(n) => cx.pool(n)?,
    };
    // What one slot can carry after the header and the reserved metadata area.
    let body_room = pool.slot_size as u64 - (SLOT_HEADER_LEN + META_RESERVE) as u64;
    let max_body = match get(&top, "max_body") {
        None => body_room,
        Some(n) => {
            let v = cx.size(n, "max_body")?;
            if v > body_room {
                return Err(cx.err(
                    line(n),
                    "max_body",
                    format!(
                        "{v} bytes do not fit a slot of {} bytes ({body_room} bytes after the slot \
                         header and the {META_RESERVE}-byte metadata area); raise pool.slot_size \
                         or lower max_body",
                        pool.slot_size
                    ),
                ));
            }
            v
        }
    };
    let bounded_duration = |field: &str, default: Duration| match get(&top, field) {
        None => Ok(default),
        Some(n) => {
            let d = cx.duration(n, field)?;
            if d < Duration::from_millis(10) || d > Duration::from_secs(3600) {
                return Err(cx.err(line(n), field, "must be between 10ms and 1h"));
            }
            Ok(d)
        }
    };
    let timeout = bounded_duration("timeout", DEFAULT_TIMEOUT)?;
    let body_timeout = bounded_duration("body_timeout", DEFAULT_BODY_TIMEOUT)?;
    let max_connections = match get(&top, "max_connections") {
        None => DEFAULT_MAX_CONNECTIONS,
        Some(n) => cx.integer(n, "max_connections", 1, 1_000_000)? as u32,
    };
    let gateway_threads = match get(&top, "gateway_threads") {
        None => None,
        Some(n) => match &n.data {
            YamlData::Value(Scalar::String(s)) if s == "auto" => None,
            YamlData::Value(Scalar::Integer(_)) => {
                Some(cx.integer(n, "gateway_threads", 1, MAX_GATEWAY_THREADS.into())? as u16)
            }
            _ => {
                return Err(cx.err(
                    line(n),
                    "gateway_threads",
                    format!(
                        "expected `auto` or a number of threads from 1 to {MAX_GATEWAY_THREADS}"
                    ),
                ))
            }
        },
    };

    let listen = match get(&top, "listen") {
        None => None,
        Some(n) => Some(cx.address(n, "listen")?),
    };
    let dir = path.parent().unwrap_or(Path::new(""));
    let data = match get(&top, "data") {
        None => None,
        Some(n) => match &n.data {
            YamlData::Value(Scalar::Boolean(true)) => Some(DataSpec::Default),
            YamlData::Value(Scalar::Boolean(false)) => None,
            YamlData::Value(Scalar::String(p)) if !p.is_empty() => {
                Some(DataSpec::At(PathBuf::from(absolute(&dir.join(&p[..])))))
            }
            _ => {
                return Err(cx.err(
                    line(n),
                    "data",
                    format!(
                        "expected true (a folder of the chain's own in the default place) or \
                         the folder's path, found {}",
                        kind(n)
                    ),
                ))
            }
        },
    };
    let mut functions = cx.functions(root, &top, dir)?;
    let routes = cx.routes(root, &top, &mut functions)?;
    cx.no_call_cycle(&functions)?;
    let state = cx.state(&top, &functions)?;
    let mqtt = cx.mqtt(&top, &routes, &name)?;
    let coap = cx.coap(&top, &routes)?;
    // Every function must be able to receive a request: on a route, or a dynamic `next`
    // target of one that is. (It would have no security domain, so no pool, either.)
    let mut reachable: Vec<&str> = routes
        .iter()
        .flat_map(|r| r.sequence.iter().map(String::as_str))
        .collect();
    let mut i = 0;
    while i < reachable.len() {
        if let Some(f) = functions.iter().find(|f| f.name == reachable[i]) {
            for n in f.next.iter().chain(&f.calls) {
                if !reachable.contains(&n.as_str()) {
                    reachable.push(n);
                }
            }
        }
        i += 1;
    }
    if let Some(f) = functions
        .iter()
        .find(|f| !reachable.contains(&f.name.as_str()))
    {
        return Err(cx.err(
            f.line,
            &format!("functions.{}", shown_key(&f.name)),
            "no route reaches this function (it is in no sequence, and no function of one \
             names it in `next` or `calls`), so it could never receive a request; add it to a \
             route or remove it",
        ));
    }
    let parties: usize = usize::from(gateway_threads.unwrap_or(1))
        + functions.iter().map(crate::derive::reserved).sum::<usize>();
    if parties > MAX_PARTIES {
        return Err(cx.err(
            line(cx.required(root, &top, "functions", "")?),
            "functions",
            format!(
                "{parties} parties (the gateway threads plus, per function, its scale.max and one more for rolling updates); at most {MAX_PARTIES}"
            ),
        ));
    }
    Ok(ChainSpec {
        file: path.to_owned(),
        name,
        transport,
        pool,
        max_body,
        timeout,
        body_timeout,
        max_connections,
        gateway_threads,
        functions,
        routes,
        mqtt,
        coap,
        state,
        listen,
        data,
    })
}

type Map<'a, 'y> = Vec<(&'a MarkedYaml<'y>, &'a MarkedYaml<'y>)>;

/// A mapping key as a field name: an empty key is shown quoted (`""`), so an error about it
/// still names a field.
fn shown_key(key: &str) -> &str {
    if key.is_empty() {
        "\"\""
    } else {
        key
    }
}

fn line(n: &MarkedYaml<'_>) -> usize {
    n.span.start.line()
}

/// The value of `key` in a mapping.
fn get<'a, 'y>(map: &Map<'a, 'y>, key: &str) -> Option<&'a MarkedYaml<'y>> {
    map.iter()
        .find(|(k, _)| scalar_text(k).as_deref() == Some(key))
        .map(|(_, v)| *v)
}

/// A scalar's text as written (strings, numbers and booleans alike); `None` for
/// collections and null.
fn scalar_text(n: &MarkedYaml<'_>) -> Option<String> {
    match &n.data {
        YamlData::Value(Scalar::String(s)) => Some(s.to_string()),
        YamlData::Value(Scalar::Integer(i)) => Some(i.to_string()),
        YamlData::Value(Scalar::FloatingPoint(f)) => Some(f.to_string()),
        YamlData::Value(Scalar::Boolean(b)) => Some(b.to_string()),
        YamlData::Representation(s, _, _) => Some(s.to_string()),
        _ => None,
    }
}

fn kind(n: &MarkedYaml<'_>) -> &'static str {
    match &n.data {
        YamlData::Value(Scalar::Null) => "nothing (null)",
        YamlData::Value(Scalar::String(_)) | YamlData::Representation(..) => "a string",
        YamlData::Value(Scalar::Integer(_)) => "a number",
        YamlData::Value(Scalar::FloatingPoint(_)) => "a number",
        YamlData::Value(Scalar::Boolean(_)) => "a boolean",
        YamlData::Sequence(_) => "a list",
        YamlData::Mapping(_) => "a mapping",
        YamlData::Tagged(..) => "a tagged value",
        YamlData::Alias(_) => "an alias",
        YamlData::BadValue => "an invalid value",
    }
}

/// Parsing context: the file name for messages.
struct Cx {
    file: String,
}

impl Cx {
    fn err(&self, line: usize, field: &str, message: impl Into<String>) -> SpecError {
        SpecError {
            file: self.file.clone(),
            line,
            field: field.to_owned(),
            message: message.into(),
        }
    }

    fn mapping<'a, 'y>(
        &self,
        n: &'a MarkedYaml<'y>,
        field: &str,
    ) -> Result<Map<'a, 'y>, SpecError> {
        match &n.data {
            YamlData::Mapping(m) => Ok(m.iter().collect()),
            _ => Err(self.err(
                line(n),
                field,
                format!(
                    "expected a mapping (`key: value` lines or `{{ ... }}`), found {}",
                    kind(n)
                ),
            )),
        }
    }

    fn sequence<'a, 'y>(
        &self,
        n: &'a MarkedYaml<'y>,
        field: &str,
    ) -> Result<&'a [MarkedYaml<'y>], SpecError> {
        match &n.data {
            YamlData::Sequence(s) => Ok(s),
            _ => Err(self.err(
                line(n),
                field,
                format!(
                    "expected a list (`[a, b]` or `- a` lines), found {}",
                    kind(n)
                ),
            )),
        }
    }

    fn string(&self, n: &MarkedYaml<'_>, field: &str) -> Result<String, SpecError> {
        match &n.data {
            YamlData::Value(Scalar::String(s)) => Ok(s.to_string()),
            YamlData::Representation(s, _, _) => Ok(s.to_string()),
            _ => Err(self.err(
                line(n),
                field,
                format!("expected a string, found {}", kind(n)),
            )),
        }
    }

    /// A string, number or boolean as text (environment values).
    fn text(&self, n: &MarkedYaml<'_>, field: &str) -> Result<String, SpecError> {
        scalar_text(n).ok_or_else(|| {
            self.err(
                line(n),
                field,
                format!("expected a string or number, found {}", kind(n)),
            )
        })
    }

    fn strings(&self, n: &MarkedYaml<'_>, field: &str) -> Result<Vec<String>, SpecError> {
        self.sequence(n, field)?
            .iter()
            .enumerate()
            .map(|(i, e)| self.string(e, &format!("{field}[{i}]")))
            .collect()
    }

    fn integer(
        &self,
        n: &MarkedYaml<'_>,
        field: &str,
        min: i64,
        max: i64,
    ) -> Result<i64, SpecError> {
        match &n.data {
            YamlData::Value(Scalar::Integer(i)) if (min..=max).contains(i) => Ok(*i),
            YamlData::Value(Scalar::Integer(i)) => Err(self.err(
                line(n),
                field,
                format!("{i} is out of range; use {min} to {max}"),
            )),
            _ => Err(self.err(
                line(n),
                field,
                format!("expected a whole number, found {}", kind(n)),
            )),
        }
    }

    fn boolean(&self, n: &MarkedYaml<'_>, field: &str) -> Result<bool, SpecError> {
        match &n.data {
            YamlData::Value(Scalar::Boolean(b)) => Ok(*b),
            _ => Err(self.err(
                line(n),
                field,
                format!("expected true or false, found {}", kind(n)),
            )),
        }
    }

    /// A byte size: a number of bytes, or a number with `B`, `KiB`, `MiB`, `GiB` (also `K`,
    /// `KB`, ... meaning the same powers of two).
    fn size(&self, n: &MarkedYaml<'_>, field: &str) -> Result<u64, SpecError> {
        let bad = |what: String| self.err(line(n), field, what);
        let text = match &n.data {
            YamlData::Value(Scalar::Integer(i)) if *i >= 0 => return Ok(*i as u64),
            _ => scalar_text(n).ok_or_else(|| {
                bad(format!(
                    "expected a size such as 65536 or 64KiB, found {}",
                    kind(n)
                ))
            })?,
        };
        parse_size(&text).ok_or_else(|| {
            bad(format!(
                "`{text}` is not a size; write bytes (65536) or a number with B, KiB, MiB or GiB (64KiB)"
            ))
        })
    }

    /// A duration: a number with `ms`, `s`, `m` or `h`.
    fn duration(&self, n: &MarkedYaml<'_>, field: &str) -> Result<Duration, SpecError> {
        let text = scalar_text(n).unwrap_or_default();
        parse_duration(&text).ok_or_else(|| {
            self.err(
                line(n),
                field,
                format!(
                    "`{text}` is not a duration; write a number with ms, s, m or h (10s, 500ms)"
                ),
            )
        })
    }

    fn only_known(&self, map: &Map<'_, '_>, prefix: &str, known: &[&str]) -> Result<(), SpecError> {
        for (k, _) in map {
            let key = scalar_text(k).unwrap_or_else(|| kind(k).to_owned());
            if !known.contains(&key.as_str()) {
                return Err(self.err(
                    line(k),
                    &format!("{prefix}{}", shown_key(&key)),
                    format!("unknown field; known fields here: {}", known.join(", ")),
                ));
            }
        }
        Ok(())
    }

    /// The command of a function given as `runtime` + `handler` (+ `interpreter`): the
    /// interpreter (`python3`, `node`, or `interpreter`) running the SDK's loader on the
    /// handler, which is found relative to the spec's folder.
    fn runtime_command(
        &self,
        key: &MarkedYaml<'_>,
        f: &Map<'_, '_>,
        rt: &MarkedYaml<'_>,
        p: &str,
        dir: &Path,
    ) -> Result<Vec<String>, SpecError> {
        if let Some(n) = get(f, "command") {
            return Err(self.err(
                line(n),
                &format!("{p}command"),
                "give either `command` or `runtime` with `handler`, not both",
            ));
        }
        let runtime = self.string(rt, &format!("{p}runtime"))?;
        let handler_node = self.required(key, f, "handler", p)?;
        let handler = self.string(handler_node, &format!("{p}handler"))?;
        let field = format!("{p}handler");
        let interpreter = match get(f, "interpreter") {
            Some(n) => {
                let i = self.string(n, &format!("{p}interpreter"))?;
                if i.is_empty() {
                    return Err(self.err(line(n), &format!("{p}interpreter"), "empty"));
                }
                Some(i)
            }
            None => None,
        };
        let ident = |s: &str| {
            !s.is_empty()
                && !s.starts_with(|c: char| c.is_ascii_digit())
                && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        };
        match runtime.as_str() {
            "python" => {
                let ok = handler
                    .split_once(':')
                    .is_some_and(|(m, f)| m.split('.').all(ident) && ident(f));
                if !ok {
                    return Err(self.err(
                        line(handler_node),
                        &field,
                        format!(
                            "`{handler}` is not MODULE:FUNCTION, e.g. `greet:handle` for the \
                             function `handle` of greet.py beside the spec"
                        ),
                    ));
                }
                Ok(vec![
                    interpreter.unwrap_or_else(|| "python3".into()),
                    "-m".into(),
                    "zerohop".into(),
                    "--path".into(),
                    absolute(dir),
                    handler,
                ])
            }
            "node" => {
                let (file, export) = match handler.rsplit_once(':') {
                    Some((file, export)) if ident(export) => (file, Some(export)),
                    _ => (handler.as_str(), None),
                };
                if file.is_empty() {
                    return Err(self.err(
                        line(handler_node),
                        &field,
                        "empty; give FILE or FILE:EXPORT, e.g. `shout.js:handle`",
                    ));
                }
                let file = absolute(&dir.join(file));
                let mut command = vec![
                    interpreter.unwrap_or_else(|| "node".into()),
                    "-e".into(),
                    NODE_LOADER.into(),
                    file,
                ];
                command.extend(export.map(str::to_owned));
                Ok(command)
            }
            other => Err(self.err(
                line(rt),
                &format!("{p}runtime"),
                format!(
                    "unknown runtime `{other}`; use python or node, or give the program \
                     itself as `command` (Rust, C, Go and any other language)"
                ),
            )),
        }
    }

    fn required<'a, 'y>(
        &self,
        parent: &MarkedYaml<'y>,
        map: &Map<'a, 'y>,
        key: &str,
        prefix: &str,
    ) -> Result<&'a MarkedYaml<'y>, SpecError> {
        get(map, key).ok_or_else(|| {
            self.err(
                line(parent),
                &format!("{prefix}{key}"),
                "missing; this field is required (see docs/spec.md)",
            )
        })
    }

    fn pool(&self, n: &MarkedYaml<'_>) -> Result<PoolSpec, SpecError> {
        let map = self.mapping(n, "pool")?;
        self.only_known(&map, "pool.", &["slots", "slot_size", "hugepages"])?;
        let slots = match get(&map, "slots") {
            None => DEFAULT_SLOTS,
            Some(v) => self.integer(v, "pool.slots", 1, 1 << 24)? as u32,
        };
        let slot_size = match get(&map, "slot_size") {
            None => DEFAULT_SLOT_SIZE,
            Some(v) => {
                let s = self.size(v, "pool.slot_size")?;
                let min = (SLOT_HEADER_LEN + META_RESERVE + 64) as u64;
                if s < min || s > (1 << 30) || s % 64 != 0 {
                    return Err(self.err(
                        line(v),
                        "pool.slot_size",
                        format!("must be a multiple of 64 bytes between {min} and 1GiB, got {s}"),
                    ));
                }
                s as u32
            }
        };
        let hugepages = match get(&map, "hugepages") {
            None => false,
            Some(v) => self.boolean(v, "pool.hugepages")?,
        };
        let total = slots as u64 * slot_size as u64;
        if total > 64 << 30 {
            return Err(self.err(
                line(n),
                "pool",
                format!("{slots} slots of {slot_size} bytes is {total} bytes, more than 64GiB"),
            ));
        }
        Ok(PoolSpec {
            slots,
            slot_size,
            hugepages,
        })
    }

    fn functions(
        &self,
        root: &MarkedYaml<'_>,
        top: &Map<'_, '_>,
        dir: &Path,
    ) -> Result<Vec<FunctionSpec>, SpecError> {
        let node = self.required(root, top, "functions", "")?;
        let map = self.mapping(node, "functions")?;
        if map.is_empty() {
            return Err(self.err(
                line(node),
                "functions",
                "a chain needs at least one function",
            ));
        }
        if map.len() > MAX_FUNCTIONS {
            return Err(self.err(
                line(node),
                "functions",
                format!(
                    "{} functions; a chain may have at most {MAX_FUNCTIONS}",
                    map.len()
                ),
            ));
        }
        let mut out = Vec::new();
        for (k, v) in &map {
            let name = self.string(k, "functions")?;
            if name.is_empty()
                || !name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
            {
                return Err(self.err(
                    line(k),
                    &format!("functions.{}", shown_key(&name)),
                    "a function name is letters, digits, `-` or `_`",
                ));
            }
            let p = format!("functions.{name}.");
            let f = self.mapping(v, &format!("functions.{name}"))?;
            self.only_known(
                &f,
                &p,
                &[
                    "command",
                    "runtime",
                    "handler",
                    "interpreter",
                    "instances",
                    "concurrency",
                    "env",
                    "headers",
                    "next",
                    "calls",
                    "syscalls",
                    "state",
                    "scale",
                    "resources",
                ],
            )?;
            let mut command = match get(&f, "runtime") {
                Some(rt) => self.runtime_command(k, &f, rt, &p, dir)?,
                None => {
                    for field in ["handler", "interpreter"] {
                        if let Some(n) = get(&f, field) {
                            return Err(self.err(
                                line(n),
                                &format!("{p}{field}"),
                                "only with `runtime` (python or node); a function with \
                                 `command` names its program there",
                            ));
                        }
                    }
                    let cmd_node = self.required(k, &f, "command", &p)?;
                    let command = self.strings(cmd_node, &format!("{p}command"))?;
                    if command.is_empty() || command[0].is_empty() {
                        return Err(self.err(
                            line(cmd_node),
                            &format!("{p}command"),
                            "empty; give the program and its arguments, e.g. \
                             [\"./target/release/upper\"]",
                        ));
                    }
                    command
                }
            };
            if command[0].contains('/') && Path::new(&command[0]).is_relative() {
                command[0] = dir.join(&command[0]).display().to_string();
            }
            // 0 only with `scale` (a function that comes up scaled to zero).
            let fewest = i64::from(get(&f, "scale").is_none());
            let instances = match get(&f, "instances") {
                None => 1,
                Some(n) => {
                    self.integer(n, &format!("{p}instances"), fewest, MAX_INSTANCES as i64)? as u16
                }
            };
            let concurrency = match get(&f, "concurrency") {
                None => 1,
                Some(n) => {
                    self.integer(n, &format!("{p}concurrency"), 1, MAX_CONCURRENCY as i64)? as u16
                }
            };
            let env = match get(&f, "env") {
                None => Vec::new(),
                Some(n) => {
                    let m = self.mapping(n, &format!("{p}env"))?;
                    let mut env = Vec::new();
                    for (ek, ev) in m {
                        let key = self.string(ek, &format!("{p}env"))?;
                        if key.is_empty() || key.contains('=') || key.starts_with("ZEROHOP_") {
                            return Err(self.err(
                                line(ek),
                                &format!("{p}env.{}", shown_key(&key)),
                                "not a usable variable name (no `=`, and ZEROHOP_* is reserved for the agent)",
                            ));
                        }
                        env.push((key.clone(), self.text(ev, &format!("{p}env.{key}"))?));
                    }
                    env
                }
            };
            let headers = match get(&f, "headers") {
                None => Vec::new(),
                Some(n) => {
                    let hs = self.strings(n, &format!("{p}headers"))?;
                    for (i, h) in hs.iter().enumerate() {
                        if http_header_name_invalid(h) {
                            return Err(self.err(
                                line(n),
                                &format!("{p}headers[{i}]"),
                                format!("`{h}` is not an HTTP header name"),
                            ));
                        }
                    }
                    hs.into_iter().map(|h| h.to_ascii_lowercase()).collect()
                }
            };
            let next = match get(&f, "next") {
                None => Vec::new(),
                Some(n) => self.strings(n, &format!("{p}next"))?,
            };
            let calls = match get(&f, "calls") {
                None => Vec::new(),
                Some(n) => self.strings(n, &format!("{p}calls"))?,
            };
            let syscalls = match get(&f, "syscalls") {
                None => Vec::new(),
                Some(n) => {
                    let names = self.strings(n, &format!("{p}syscalls"))?;
                    let items = self.sequence(n, &format!("{p}syscalls"))?;
                    for (i, (name, node)) in names.iter().zip(items).enumerate() {
                        if crate::syscalls::number(name).is_none() {
                            return Err(self.err(
                                line(node),
                                &format!("{p}syscalls[{i}]"),
                                format!(
                                    "unknown system call `{name}` (on {}); use Linux system call \
                                     names such as ptrace, bpf, setsid (see docs/spec.md)",
                                    std::env::consts::ARCH
                                ),
                            ));
                        }
                    }
                    names
                }
            };
            let state = match get(&f, "state") {
                None => false,
                Some(n) => self.boolean(n, &format!("{p}state"))?,
            };
            let scale = match get(&f, "scale") {
                None => ScaleSpec::fixed(instances, concurrency),
                Some(n) => {
                    self.scale(n, &p, get(&f, "instances").map(|_| instances), concurrency)?
                }
            };
            // With `scale`, the chain comes up with its initial count.
            let instances = scale.initial;
            let resources = match get(&f, "resources") {
                None => ResourceSpec::default(),
                Some(n) => self.resources(n, &p)?,
            };
            out.push(FunctionSpec {
                name,
                line: line(k),
                command,
                instances,
                concurrency,
                env,
                headers,
                next,
                calls,
                syscalls,
                state,
                fan_out: Vec::new(),
                join: JoinPolicy::Fail,
                scale,
                resources,
                relay: None,
            });
        }
        // Dynamic routing and call targets must exist; a function never calls itself.
        let names: Vec<&str> = out.iter().map(|f| f.name.as_str()).collect();
        for (k, v) in &map {
            let name = scalar_text(k).unwrap_or_default();
            let f = self.mapping(v, "functions")?;
            for field in ["next", "calls"] {
                let Some(n) = get(&f, field) else { continue };
                for (i, e) in self.sequence(n, field)?.iter().enumerate() {
                    let target = self.string(e, field)?;
                    let at = format!("functions.{name}.{field}[{i}]");
                    if !names.contains(&target.as_str()) {
                        return Err(self.err(
                            line(e),
                            &at,
                            format!(
                                "unknown function `{target}`; known functions: {}",
                                names.join(", ")
                            ),
                        ));
                    }
                    if field == "calls" && target == name {
                        return Err(self.err(
                            line(e),
                            &at,
                            "a function cannot call itself (its instance would wait for its own \
                             answer)",
                        ));
                    }
                }
            }
        }
        Ok(out)
    }

    /// `scale: { min, max, target, parked, cooldown, zero_after }`; `instances`, when also
    /// given, is the count the chain comes up with.
    fn scale(
        &self,
        n: &MarkedYaml<'_>,
        p: &str,
        instances: Option<u16>,
        concurrency: u16,
    ) -> Result<ScaleSpec, SpecError> {
        let at = format!("{p}scale");
        let m = self.mapping(n, &at)?;
        self.only_known(
            &m,
            &format!("{at}."),
            &["min", "max", "target", "parked", "cooldown", "zero_after"],
        )?;
        let int = |key: &str, min: i64, default: u16| match get(&m, key) {
            None => Ok(default),
            Some(v) => self
                .integer(v, &format!("{at}.{key}"), min, MAX_INSTANCES as i64)
                .map(|i| i as u16),
        };
        let min = int("min", 0, 1)?;
        let max = int("max", 1, min.max(1))?;
        if max < min {
            return Err(self.err(
                line(get(&m, "max").unwrap_or(n)),
                &format!("{at}.max"),
                format!("max ({max}) is below min ({min})"),
            ));
        }
        let initial = instances.unwrap_or(min.max(1));
        if !(min..=max).contains(&initial) {
            return Err(self.err(
                line(n),
                &format!("{p}instances"),
                format!(
                    "{initial} instances to start with, outside scale's min {min} and max {max}"
                ),
            ));
        }
        let target = match get(&m, "target") {
            None => concurrency,
            Some(v) => self.integer(v, &format!("{at}.target"), 1, MAX_CONCURRENCY as i64)? as u16,
        };
        let parked = int("parked", 0, u16::from(max > min))?;
        let dur = |key: &str, default: Duration| match get(&m, key) {
            None => Ok(default),
            Some(v) => self.duration(v, &format!("{at}.{key}")),
        };
        Ok(ScaleSpec {
            min,
            max,
            initial,
            target,
            parked: parked.min(max),
            cooldown: dur("cooldown", DEFAULT_COOLDOWN)?,
            zero_after: dur("zero_after", DEFAULT_ZERO_AFTER)?,
        })
    }

    /// `resources: { cpu, memory, pids }`: cpu in cores (`0.5`, `2`) or thousandths
    /// (`500m`), memory a size, pids a count.
    fn resources(&self, n: &MarkedYaml<'_>, p: &str) -> Result<ResourceSpec, SpecError> {
        let at = format!("{p}resources");
        let m = self.mapping(n, &at)?;
        self.only_known(&m, &format!("{at}."), &["cpu", "memory", "pids"])?;
        let cpu_millis = match get(&m, "cpu") {
            None => None,
            Some(v) => {
                let text = scalar_text(v).unwrap_or_default();
                Some(parse_cpu(&text).ok_or_else(|| {
                    self.err(
                        line(v),
                        &format!("{at}.cpu"),
                        format!(
                            "`{text}` is not a CPU amount; write cores (0.5, 2) or thousandths \
                             of a core (500m), at least 10m and at most 1024 cores"
                        ),
                    )
                })?)
            }
        };
        let memory = match get(&m, "memory") {
            None => None,
            Some(v) => {
                let b = self.size(v, &format!("{at}.memory"))?;
                if b < 4 << 20 {
                    return Err(self.err(
                        line(v),
                        &format!("{at}.memory"),
                        format!("{b} bytes is too little for a process; give at least 4MiB"),
                    ));
                }
                Some(b)
            }
        };
        let pids = match get(&m, "pids") {
            None => None,
            Some(v) => Some(self.integer(v, &format!("{at}.pids"), 1, 1 << 22)? as u32),
        };
        Ok(ResourceSpec {
            cpu_millis,
            memory,
            pids,
        })
    }

    /// Calls (including static fan-outs) form no cycle: a caller waits for its callee, so a
    /// cycle could wait forever.
    fn no_call_cycle(&self, functions: &[FunctionSpec]) -> Result<(), SpecError> {
        let Some(cycle) = call_cycle(functions) else {
            return Ok(());
        };
        let f = functions
            .iter()
            .find(|f| f.name == cycle[0])
            .expect("names from the list");
        Err(self.err(
            f.line,
            &format!("functions.{}.calls", shown_key(&f.name)),
            format!(
                "calls form a cycle ({}); a caller waits for its callee's answer, so calls \
                 must not lead back to a function waiting on them (a route's fan_out counts \
                 as calls of its join)",
                cycle.join(" -> ")
            ),
        ))
    }

    /// The top-level `state` section, checked against the functions that use it.
    fn state(
        &self,
        top: &Map<'_, '_>,
        functions: &[FunctionSpec],
    ) -> Result<Option<StatePlan>, SpecError> {
        let user = functions.iter().find(|f| f.state);
        let Some(n) = get(top, "state") else {
            if let Some(f) = user {
                return Err(self.err(
                    f.line,
                    &format!("functions.{}.state", shown_key(&f.name)),
                    "the chain has no `state` section; add e.g. `state: { entries: 4096, \
                     value_size: 4KiB }`",
                ));
            }
            return Ok(None);
        };
        let map = self.mapping(n, "state")?;
        self.only_known(&map, "state.", &["entries", "value_size"])?;
        if user.is_none() {
            return Err(self.err(
                line(n),
                "state",
                "no function has `state: true`, so nothing could use the store; add it to the \
                 functions that read or write state, or remove this section",
            ));
        }
        let entries = match get(&map, "entries") {
            None => DEFAULT_STATE_ENTRIES,
            Some(e) => self.integer(
                e,
                "state.entries",
                1,
                i64::from(zerohop_pool::state::ENTRIES_MAX),
            )? as u32,
        };
        let value_size = match get(&map, "value_size") {
            None => DEFAULT_STATE_VALUE,
            Some(v) => {
                let size = self.size(v, "state.value_size")?;
                let max = u64::from(zerohop_pool::state::VALUE_MAX);
                if size == 0 || size > max {
                    return Err(self.err(
                        line(v),
                        "state.value_size",
                        format!("{size} bytes; a value may be 1 byte to 1MiB"),
                    ));
                }
                size as u32
            }
        };
        Ok(Some(StatePlan {
            entries,
            value_size,
        }))
    }

    fn routes(
        &self,
        root: &MarkedYaml<'_>,
        top: &Map<'_, '_>,
        functions: &mut [FunctionSpec],
    ) -> Result<Vec<RouteSpec>, SpecError> {
        let node = self.required(root, top, "routes", "")?;
        let list = self.sequence(node, "routes")?;
        if list.is_empty() {
            return Err(self.err(line(node), "routes", "a chain needs at least one route"));
        }
        let owned: Vec<String> = functions.iter().map(|f| f.name.clone()).collect();
        let names: Vec<&str> = owned.iter().map(String::as_str).collect();
        let mut seen = HashSet::new();
        let mut out = Vec::new();
        for (i, r) in list.iter().enumerate() {
            let p = format!("routes[{i}].");
            let m = self.mapping(r, &format!("routes[{i}]"))?;
            self.only_known(&m, &p, &["http", "mqtt", "mqtt_reply", "coap", "sequence"])?;
            let (mut method, mut path) = (String::new(), String::new());
            if let Some(http) = get(&m, "http") {
                let text = self.string(http, &format!("{p}http"))?;
                let (mt, pt) = text.split_once(' ').unwrap_or((&text, ""));
                let (mt, pt) = (mt.trim(), pt.trim());
                let method_ok =
                    !mt.is_empty() && mt.bytes().all(|b| b.is_ascii_uppercase()) && mt.len() <= 16;
                if !method_ok || !pt.starts_with('/') || pt.contains(char::is_whitespace) {
                    return Err(self.err(
                        line(http),
                        &format!("{p}http"),
                        format!("`{text}` is not `METHOD /path`; write e.g. `POST /hello`"),
                    ));
                }
                if !seen.insert(("http", format!("{mt} {pt}"))) {
                    return Err(self.err(
                        line(http),
                        &format!("{p}http"),
                        format!("`{mt} {pt}` is already routed by an earlier route"),
                    ));
                }
                (method, path) = (mt.to_owned(), pt.to_owned());
            }
            let mut mqtt = String::new();
            if let Some(n) = get(&m, "mqtt") {
                mqtt = self.string(n, &format!("{p}mqtt"))?;
                if let Err(why) = check_topic(&mqtt, true) {
                    return Err(self.err(
                        line(n),
                        &format!("{p}mqtt"),
                        format!("`{mqtt}` is not an MQTT topic filter: {why}"),
                    ));
                }
                if !seen.insert(("mqtt", mqtt.clone())) {
                    return Err(self.err(
                        line(n),
                        &format!("{p}mqtt"),
                        format!("topic filter `{mqtt}` is already routed by an earlier route"),
                    ));
                }
            }
            let mut mqtt_reply = String::new();
            if let Some(n) = get(&m, "mqtt_reply") {
                mqtt_reply = self.string(n, &format!("{p}mqtt_reply"))?;
                if mqtt.is_empty() {
                    return Err(self.err(
                        line(n),
                        &format!("{p}mqtt_reply"),
                        "a reply topic needs an `mqtt` topic filter on the same route",
                    ));
                }
                if let Err(why) = check_topic(&mqtt_reply, false) {
                    return Err(self.err(
                        line(n),
                        &format!("{p}mqtt_reply"),
                        format!("`{mqtt_reply}` is not an MQTT topic name: {why}"),
                    ));
                }
            }
            let mut coap = String::new();
            if let Some(n) = get(&m, "coap") {
                coap = self.string(n, &format!("{p}coap"))?;
                let bad = !coap.starts_with('/')
                    || coap.contains(char::is_whitespace)
                    || coap.contains('?')
                    || coap.contains("//")
                    || coap.len() > 255;
                if bad {
                    return Err(self.err(
                        line(n),
                        &format!("{p}coap"),
                        format!(
                            "`{coap}` is not a CoAP path; write e.g. `/motion` (segments \
                             separated by `/`, no query, at most 255 bytes)"
                        ),
                    ));
                }
                if !seen.insert(("coap", coap.clone())) {
                    return Err(self.err(
                        line(n),
                        &format!("{p}coap"),
                        format!("CoAP path `{coap}` is already routed by an earlier route"),
                    ));
                }
            }
            if path.is_empty() && mqtt.is_empty() && coap.is_empty() {
                return Err(self.err(
                    line(r),
                    &format!("routes[{i}]"),
                    "a route needs a way in: `http: METHOD /path`, `mqtt: topic/filter` or \
                     `coap: /path`",
                ));
            }
            let seq_node = self.required(r, &m, "sequence", &p)?;
            let seq = self.sequence(seq_node, &format!("{p}sequence"))?;
            if seq.is_empty() {
                return Err(self.err(
                    line(seq_node),
                    &format!("{p}sequence"),
                    "empty; name the functions the request runs through, in order",
                ));
            }
            if seq.len() > 255 {
                return Err(self.err(
                    line(seq_node),
                    &format!("{p}sequence"),
                    "at most 255 functions in one sequence",
                ));
            }
            let mut sequence = Vec::new();
            for (j, e) in seq.iter().enumerate() {
                let at = format!("{p}sequence[{j}]");
                let known = |f: &str, n: &MarkedYaml<'_>, at: &str| {
                    if names.contains(&f) {
                        Ok(())
                    } else {
                        Err(self.err(
                            line(n),
                            at,
                            format!(
                                "unknown function `{f}`; known functions: {}",
                                names.join(", ")
                            ),
                        ))
                    }
                };
                if let YamlData::Mapping(_) = &e.data {
                    let (join, branches, policy) = self.fan_out(e, &at, &known)?;
                    let f = functions
                        .iter_mut()
                        .find(|f| f.name == join)
                        .expect("checked by known");
                    if !f.fan_out.is_empty() && (f.fan_out != branches || f.join != policy) {
                        return Err(self.err(
                            line(e),
                            &at,
                            format!(
                                "`{join}` already joins another fan-out ({}); a function joins one \
                                 fan-out, the same on every route",
                                f.fan_out.join(", ")
                            ),
                        ));
                    }
                    for b in &branches {
                        if !f.calls.contains(b) {
                            f.calls.push(b.clone());
                        }
                    }
                    f.fan_out = branches;
                    f.join = policy;
                    sequence.push(join);
                    continue;
                }
                let f = self.string(e, &at)?;
                known(&f, e, &at)?;
                sequence.push(f);
            }
            out.push(RouteSpec {
                line: line(r),
                method,
                path,
                mqtt,
                mqtt_reply,
                coap,
                sequence,
                relay_of: None,
            });
        }
        Ok(out)
    }
}

impl Cx {
    /// The top-level `mqtt` section, checked against the routes that use it.
    fn mqtt(
        &self,
        top: &Map<'_, '_>,
        routes: &[RouteSpec],
        chain: &str,
    ) -> Result<Option<MqttSpec>, SpecError> {
        let used = routes.iter().find(|r| !r.mqtt.is_empty());
        let Some(n) = get(top, "mqtt") else {
            if let Some(r) = used {
                return Err(self.err(
                    r.line,
                    "mqtt",
                    "a route has an `mqtt` topic but the chain has no `mqtt` section; add \
                     `mqtt: { listen: 127.0.0.1:1883 }` (devices connect to the gateway) or \
                     `mqtt: { broker: HOST:PORT }` (the gateway subscribes at a broker)",
                ));
            }
            return Ok(None);
        };
        let map = self.mapping(n, "mqtt")?;
        self.only_known(&map, "mqtt.", &["listen", "broker", "client_id"])?;
        if used.is_none() {
            return Err(self.err(
                line(n),
                "mqtt",
                "no route has an `mqtt` topic filter, so nothing would enter by MQTT; add \
                 `mqtt: topic/filter` to a route or remove this section",
            ));
        }
        match (get(&map, "listen"), get(&map, "broker")) {
            (Some(l), None) => {
                if let Some(c) = get(&map, "client_id") {
                    return Err(self.err(
                        line(c),
                        "mqtt.client_id",
                        "only for `broker` (subscribe mode); a listening gateway has no \
                         client id",
                    ));
                }
                Ok(Some(MqttSpec::Listen(self.address(l, "mqtt.listen")?)))
            }
            (None, Some(b)) => {
                let addr = self.string(b, "mqtt.broker")?;
                let ok = addr
                    .rsplit_once(':')
                    .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok_and(|p| p > 0));
                if !ok {
                    return Err(self.err(
                        line(b),
                        "mqtt.broker",
                        format!("`{addr}` is not HOST:PORT; write e.g. `127.0.0.1:1883`"),
                    ));
                }
                let client_id = match get(&map, "client_id") {
                    Some(c) => {
                        let id = self.string(c, "mqtt.client_id")?;
                        if id.is_empty() || id.len() > 64 {
                            return Err(self.err(
                                line(c),
                                "mqtt.client_id",
                                "a client id is 1 to 64 characters",
                            ));
                        }
                        id
                    }
                    None => format!("zerohop-{chain}"),
                };
                Ok(Some(MqttSpec::Broker { addr, client_id }))
            }
            _ => Err(self.err(
                line(n),
                "mqtt",
                "set exactly one of `listen: ADDRESS:PORT` (devices connect to the gateway) \
                 and `broker: HOST:PORT` (the gateway subscribes at a broker)",
            )),
        }
    }

    /// The top-level `coap` section, checked against the routes that use it.
    fn coap(
        &self,
        top: &Map<'_, '_>,
        routes: &[RouteSpec],
    ) -> Result<Option<SocketAddr>, SpecError> {
        let used = routes.iter().find(|r| !r.coap.is_empty());
        let Some(n) = get(top, "coap") else {
            if let Some(r) = used {
                return Err(self.err(
                    r.line,
                    "coap",
                    "a route has a `coap` path but the chain has no `coap` section; add \
                     `coap: { listen: 127.0.0.1:5683 }`",
                ));
            }
            return Ok(None);
        };
        let map = self.mapping(n, "coap")?;
        self.only_known(&map, "coap.", &["listen"])?;
        if used.is_none() {
            return Err(self.err(
                line(n),
                "coap",
                "no route has a `coap` path, so nothing would enter by CoAP; add `coap: /path` \
                 to a route or remove this section",
            ));
        }
        let l = self.required(n, &map, "listen", "coap.")?;
        Ok(Some(self.address(l, "coap.listen")?))
    }

    /// An `IP:PORT` socket address.
    fn address(&self, n: &MarkedYaml<'_>, field: &str) -> Result<SocketAddr, SpecError> {
        let text = self.text(n, field)?;
        text.parse().map_err(|_| {
            self.err(
                line(n),
                field,
                format!(
                    "`{text}` is not IP:PORT; write e.g. `127.0.0.1:1883` (port 0: any free port)"
                ),
            )
        })
    }
}

impl Cx {
    /// A static fan-out step of a sequence: `{ fan_out: [a, b], join: j, on_error: fail }`;
    /// returns the join, the branches and the policy.
    fn fan_out(
        &self,
        e: &MarkedYaml<'_>,
        at: &str,
        known: &dyn Fn(&str, &MarkedYaml<'_>, &str) -> Result<(), SpecError>,
    ) -> Result<(String, Vec<String>, JoinPolicy), SpecError> {
        let m = self.mapping(e, at)?;
        let p = format!("{at}.");
        self.only_known(&m, &p, &["fan_out", "join", "on_error"])?;
        let list = self.required(e, &m, "fan_out", &p)?;
        let branches = self.strings(list, &format!("{p}fan_out"))?;
        if branches.is_empty() {
            return Err(self.err(
                line(list),
                &format!("{p}fan_out"),
                "empty; name the functions that each get the request",
            ));
        }
        for (i, (b, n)) in branches
            .iter()
            .zip(self.sequence(list, &format!("{p}fan_out"))?)
            .enumerate()
        {
            known(b, n, &format!("{p}fan_out[{i}]"))?;
            if branches[..i].contains(b) {
                return Err(self.err(
                    line(n),
                    &format!("{p}fan_out[{i}]"),
                    format!("`{b}` is named twice"),
                ));
            }
        }
        let j = self.required(e, &m, "join", &p)?;
        let join = self.string(j, &format!("{p}join"))?;
        known(&join, j, &format!("{p}join"))?;
        if branches.contains(&join) {
            return Err(self.err(
                line(j),
                &format!("{p}join"),
                "the join cannot also be a branch (it would call itself)",
            ));
        }
        let policy = match get(&m, "on_error") {
            None => JoinPolicy::Fail,
            Some(n) => match self.string(n, &format!("{p}on_error"))?.as_str() {
                "fail" => JoinPolicy::Fail,
                "join" => JoinPolicy::Join,
                other => {
                    return Err(self.err(
                        line(n),
                        &format!("{p}on_error"),
                        format!(
                            "`{other}` is no policy; use `fail` (the request fails with the \
                             branch's error) or `join` (the join sees what arrived)"
                        ),
                    ))
                }
            },
        };
        Ok((join, branches, policy))
    }
}

/// Most levels of an MQTT topic name or filter (the gateway's broker holds the same bound).
pub const MAX_TOPIC_LEVELS: usize = 32;

/// Checks an MQTT topic name, or a filter when `filter` (`+` a whole level, `#` the whole
/// last level).
pub fn check_topic(t: &str, filter: bool) -> Result<(), &'static str> {
    if t.is_empty() {
        return Err("it is empty");
    }
    if t.len() > 65535 || t.contains('\0') {
        return Err("it is longer than 65535 bytes or holds a NUL");
    }
    let levels: Vec<&str> = t.split('/').collect();
    if levels.len() > MAX_TOPIC_LEVELS {
        // The gateway refuses deeper topics and filters: such a route could never match.
        return Err("it has more than 32 levels (`/`-separated), the gateway's limit");
    }
    for (i, l) in levels.iter().enumerate() {
        if !filter && (l.contains('+') || l.contains('#')) {
            return Err("a topic name has no wildcards (`+`, `#`)");
        }
        if l.contains('+') && *l != "+" {
            return Err("`+` stands for a whole level (`a/+/b`)");
        }
        if l.contains('#') && (*l != "#" || i + 1 != levels.len()) {
            return Err("`#` stands for the whole last level (`a/#`)");
        }
    }
    Ok(())
}

fn http_header_name_invalid(h: &str) -> bool {
    h.is_empty()
        || !h
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// `path` made absolute against the current directory (the handler of `runtime` is found by
/// the interpreter, which needs no `./` to tell a file from a package).
fn absolute(path: &Path) -> String {
    let path = if path.as_os_str().is_empty() {
        Path::new(".")
    } else {
        path
    };
    std::path::absolute(path)
        .unwrap_or_else(|_| path.to_owned())
        .display()
        .to_string()
}

/// Parses `65536`, `64KiB`, `64K`, `1MiB`, `2GB`, `100B` (powers of two for every unit).
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u64 = num.parse().ok()?;
    let mult: u64 = match unit.trim() {
        "" | "B" => 1,
        "K" | "KB" | "KiB" | "k" | "kB" => 1 << 10,
        "M" | "MB" | "MiB" => 1 << 20,
        "G" | "GB" | "GiB" => 1 << 30,
        _ => return None,
    };
    n.checked_mul(mult)
}

/// A CPU amount in thousandths of a core: `0.5`, `2` (cores) or `500m`; between 10m and
/// 1024 cores.
pub fn parse_cpu(s: &str) -> Option<u32> {
    let s = s.trim();
    let millis = match s.strip_suffix('m') {
        Some(m) => m.trim().parse::<u64>().ok()?,
        None => {
            let cores: f64 = s.parse().ok()?;
            if !cores.is_finite() || cores <= 0.0 {
                return None;
            }
            (cores * 1000.0).round() as u64
        }
    };
    (10..=1024 * 1000)
        .contains(&millis)
        .then_some(millis as u32)
}

/// Parses `500ms`, `10s`, `2m`, `1h`.
pub fn parse_duration(s: &str) -> Option<Duration> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit())?;
    let (num, unit) = s.split_at(split);
    let n: u64 = num.parse().ok()?;
    Some(match unit.trim() {
        "ms" => Duration::from_millis(n),
        "s" => Duration::from_secs(n),
        "m" => Duration::from_secs(n.checked_mul(60)?),
        "h" => Duration::from_secs(n.checked_mul(3600)?),
        _ => return None,
    })
}

/// A cycle of calls, as names from the first function back to it, if there is one.
fn call_cycle(functions: &[FunctionSpec]) -> Option<Vec<String>> {
    fn visit(
        f: usize,
        functions: &[FunctionSpec],
        state: &mut [u8],
        path: &mut Vec<usize>,
    ) -> Option<Vec<String>> {
        // 0 unseen, 1 on the current path, 2 done.
        match state[f] {
            2 => return None,
            1 => {
                let start = path.iter().position(|&p| p == f).expect("on the path");
                let mut cycle: Vec<String> = path[start..]
                    .iter()
                    .map(|&p| functions[p].name.clone())
                    .collect();
                cycle.push(functions[f].name.clone());
                return Some(cycle);
            }
            _ => {}
        }
        state[f] = 1;
        path.push(f);
        for c in &functions[f].calls {
            if let Some(t) = functions.iter().position(|g| &g.name == c) {
                if let Some(cycle) = visit(t, functions, state, path) {
                    return Some(cycle);
                }
            }
        }
        path.pop();
        state[f] = 2;
        None
    }
    let mut state = vec![0u8; functions.len()];
    (0..functions.len()).find_map(|f| visit(f, functions, &mut state, &mut Vec::new()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const HELLO: &str = "\
name: hello
pool: { slots: 64, slot_size: 8KiB }
timeout: 2s
functions:
  upper:   { command: [\"bin/upper\", \"-v\"], instances: 2, concurrency: 4 }
  exclaim:
    command: [/bin/exclaim]
    env: { MODE: loud, N: 3 }
    headers: [X-Trace]
    next: [upper]
    syscalls: [ptrace, setsid]
routes:
  - http: POST /hello
    sequence: [upper, exclaim]
";

    fn err(yaml: &str) -> String {
        parse(Path::new("c.yaml"), yaml).unwrap_err().to_string()
    }

    #[test]
    fn runtime_and_handler_expand_to_a_command() {
        let t = HELLO.replace(
            "  upper:   { command: [\"bin/upper\", \"-v\"], instances: 2, concurrency: 4 }",
            "  upper:   { runtime: python, handler: \"shouty.text:upper\" }",
        );
        let t = t.replace(
            "    command: [/bin/exclaim]",
            "    runtime: node\n    handler: js/bang.js:handle\n    interpreter: /usr/bin/node",
        );
        let s = parse(Path::new("/srv/c.yaml"), &t).unwrap();
        assert_eq!(
            s.functions[0].command,
            [
                "python3",
                "-m",
                "zerohop",
                "--path",
                "/srv",
                "shouty.text:upper"
            ]
        );
        assert_eq!(
            s.functions[1].command,
            [
                "/usr/bin/node",
                "-e",
                NODE_LOADER,
                "/srv/js/bang.js",
                "handle"
            ]
        );
        // A path without an export, relative to a spec in the current folder.
        let t = t.replace("js/bang.js:handle", "bang.js");
        let s = parse(Path::new("c.yaml"), &t).unwrap();
        let here = std::env::current_dir().unwrap();
        assert_eq!(
            s.functions[1].command[3],
            here.join("bang.js").display().to_string()
        );
        assert_eq!(s.functions[1].command.len(), 4);
        assert_eq!(s.functions[0].command[4], here.display().to_string());

        let py = "  upper:   { command: [\"bin/upper\", \"-v\"], instances: 2, concurrency: 4 }";
        for (with, expect) in [
            (
                "  upper: { runtime: ruby, handler: x }",
                "c.yaml:5: functions.upper.runtime: unknown runtime `ruby`; use python or node",
            ),
            (
                "  upper: { runtime: python }",
                "c.yaml:5: functions.upper.handler: missing",
            ),
            (
                "  upper: { runtime: python, handler: greet }",
                "c.yaml:5: functions.upper.handler: `greet` is not MODULE:FUNCTION",
            ),
            (
                "  upper: { runtime: python, handler: \"greet:1x\" }",
                "c.yaml:5: functions.upper.handler: `greet:1x` is not MODULE:FUNCTION",
            ),
            (
                "  upper: { runtime: python, handler: \"a:b\", command: [x] }",
                "c.yaml:5: functions.upper.command: give either `command` or `runtime`",
            ),
            (
                "  upper: { command: [x], handler: \"a:b\" }",
                "c.yaml:5: functions.upper.handler: only with `runtime`",
            ),
            (
                "  upper: { runtime: node, handler: \"\" }",
                "c.yaml:5: functions.upper.handler: empty",
            ),
        ] {
            let e = err(&HELLO.replace(py, with));
            assert!(e.starts_with(expect), "{with}: {e}");
        }
    }

    #[test]
    fn a_data_folder_is_true_a_path_or_nothing() {
        assert_eq!(parse(Path::new("c.yaml"), HELLO).unwrap().data, None);
        let with = |v: &str| parse(Path::new("/srv/c.yaml"), &format!("{HELLO}data: {v}\n"));
        assert_eq!(with("true").unwrap().data, Some(DataSpec::Default));
        assert_eq!(with("false").unwrap().data, None);
        assert_eq!(
            with("/var/lib/x").unwrap().data,
            Some(DataSpec::At(PathBuf::from("/var/lib/x")))
        );
        assert_eq!(
            with("store").unwrap().data,
            Some(DataSpec::At(PathBuf::from("/srv/store"))),
            "relative to the spec's folder"
        );
        let e = with("3").unwrap_err().to_string();
        assert!(e.contains(": data: expected true"), "{e}");
        let e = with("\"\"").unwrap_err().to_string();
        assert!(e.contains(": data: expected true"), "{e}");
    }

    #[test]
    fn scale_and_resources() {
        let s = parse(Path::new("c.yaml"), HELLO).unwrap();
        assert_eq!(s.functions[0].scale, ScaleSpec::fixed(2, 4));
        assert!(!s.functions[0].scale.scales());
        assert_eq!(s.functions[1].resources, ResourceSpec::default());
        let t = HELLO.replace(
            "    syscalls: [ptrace, setsid]\n",
            "    scale: { min: 0, max: 8, target: 3, cooldown: 5s }\n    \
             resources: { cpu: 500m, memory: 64MiB, pids: 32 }\n",
        );
        let ex = &parse(Path::new("c.yaml"), &t).unwrap().functions[1];
        let sc = ex.scale;
        assert_eq!(
            (sc.min, sc.max, sc.initial, sc.target, sc.parked),
            (0, 8, 1, 3, 1)
        );
        assert_eq!(ex.instances, 1, "comes up with one");
        assert_eq!(sc.cooldown, Duration::from_secs(5));
        assert_eq!(sc.zero_after, DEFAULT_ZERO_AFTER);
        assert!(sc.scales());
        assert_eq!(
            ex.resources,
            ResourceSpec {
                cpu_millis: Some(500),
                memory: Some(64 << 20),
                pids: Some(32)
            }
        );
        for (cpu, want) in [("0.25", Some(250)), ("2", Some(2000)), ("1.5", Some(1500))] {
            assert_eq!(parse_cpu(cpu), want, "{cpu}");
        }
        for bad in ["0", "5m", "-1", "x", "2000", "nan"] {
            assert_eq!(parse_cpu(bad), None, "{bad}");
        }
        // `instances` beside `scale` is the initial count, within the bounds.
        let t2 = HELLO.replace(
            "instances: 2, concurrency: 4",
            "instances: 3, scale: { max: 4 }",
        );
        let up = &parse(Path::new("c.yaml"), &t2).unwrap().functions[0];
        assert_eq!((up.instances, up.scale.min, up.scale.max), (3, 1, 4));
        for (from, to, want) in [
            (
                "instances: 2, concurrency: 4",
                "instances: 9, scale: { max: 4 }",
                "outside scale's min 1 and max 4",
            ),
            (
                "instances: 2, concurrency: 4",
                "scale: { min: 3, max: 2 }",
                "functions.upper.scale.max: max (2) is below min (3)",
            ),
            (
                "instances: 2, concurrency: 4",
                "scale: { mx: 2 }",
                "functions.upper.scale.mx",
            ),
            (
                "instances: 2, concurrency: 4",
                "resources: { cpu: lots }",
                "`lots` is not a CPU amount",
            ),
            (
                "instances: 2, concurrency: 4",
                "resources: { memory: 1KiB }",
                "at least 4MiB",
            ),
        ] {
            let e = err(&HELLO.replace(from, to));
            assert!(e.contains(want), "{to}: {e}");
            assert!(e.starts_with("c.yaml:5:"), "{e}");
        }
    }

    #[test]
    fn parses_every_field() {
        let s = parse(Path::new("dir/c.yaml"), HELLO).unwrap();
        assert_eq!(s.name, "hello");
        assert_eq!(s.transport, "ring");
        assert_eq!(
            s.pool,
            PoolSpec {
                slots: 64,
                slot_size: 8192,
                hugepages: false
            }
        );
        assert_eq!(s.max_body, 8192 - 32 - 1024);
        assert_eq!(s.timeout, Duration::from_secs(2));
        assert_eq!(s.gateway_threads, None, "auto by default");
        for (text, want) in [("auto", None), ("3", Some(3))] {
            let t = HELLO.replace("timeout: 2s", &format!("gateway_threads: {text}"));
            assert_eq!(
                parse(Path::new("c.yaml"), &t).unwrap().gateway_threads,
                want
            );
        }
        let up = &s.functions[0];
        assert_eq!(up.command, vec!["dir/bin/upper".to_owned(), "-v".into()]);
        assert_eq!((up.instances, up.concurrency, up.line), (2, 4, 5));
        let ex = &s.functions[1];
        assert_eq!(ex.command, vec!["/bin/exclaim".to_owned()]);
        assert_eq!(
            ex.env,
            vec![("MODE".into(), "loud".into()), ("N".into(), "3".into())]
        );
        assert_eq!(ex.headers, vec!["x-trace".to_owned()]);
        assert_eq!(ex.next, vec!["upper".to_owned()]);
        assert_eq!(ex.syscalls, vec!["ptrace".to_owned(), "setsid".to_owned()]);
        assert!(up.syscalls.is_empty());
        assert_eq!(s.routes.len(), 1);
        assert_eq!(
            (s.routes[0].method.as_str(), s.routes[0].path.as_str()),
            ("POST", "/hello")
        );
        assert_eq!(s.routes[0].sequence, vec!["upper", "exclaim"]);
    }

    #[test]
    fn static_fan_out_and_state() {
        let t = HELLO
            .replace(
                "[upper, exclaim]",
                "[{ fan_out: [upper], join: exclaim, on_error: join }]",
            )
            .replace("    next: [upper]\n", "    state: true\n")
            + "state: { entries: 100, value_size: 1KiB }\n";
        let s = parse(Path::new("c.yaml"), &t).unwrap();
        let ex = &s.functions[1];
        assert_eq!(s.routes[0].sequence, vec!["exclaim"]);
        assert_eq!(ex.fan_out, vec!["upper"]);
        assert_eq!(ex.calls, vec!["upper"], "branches are calls of the join");
        assert_eq!(ex.join, JoinPolicy::Join);
        assert!(ex.state && !s.functions[0].state);
        assert_eq!(
            s.state,
            Some(StatePlan {
                entries: 100,
                value_size: 1024
            })
        );
        let cases = [
            (
                t.replace("join: exclaim", "join: upper"),
                "c.yaml:14: routes[0].sequence[0].join: the join cannot also be a branch",
            ),
            (
                t.replace("join: exclaim", "join: nobody"),
                "c.yaml:14: routes[0].sequence[0].join: unknown function `nobody`",
            ),
            (
                t.replace("fan_out: [upper]", "fan_out: []"),
                "c.yaml:14: routes[0].sequence[0].fan_out: empty",
            ),
            (
                t.replace("fan_out: [upper]", "fan_out: [upper, upper]"),
                "c.yaml:14: routes[0].sequence[0].fan_out[1]: `upper` is named twice",
            ),
            (
                t.replace("on_error: join", "on_error: maybe"),
                "c.yaml:14: routes[0].sequence[0].on_error: `maybe` is no policy",
            ),
            (
                t.replace("on_error: join", "policy: join"),
                "c.yaml:14: routes[0].sequence[0].policy: unknown field",
            ),
            (
                t.replace("state: { entries: 100, value_size: 1KiB }\n", ""),
                "c.yaml:6: functions.exclaim.state: the chain has no `state` section",
            ),
            (
                t.replace("    state: true\n", ""),
                "c.yaml:14: state: no function has `state: true`",
            ),
            (
                t.replace("entries: 100", "entries: 0"),
                "c.yaml:15: state.entries: 0 is out of range",
            ),
            (
                t.replace("1KiB", "2MiB"),
                "c.yaml:15: state.value_size: 2097152 bytes; a value may be 1 byte to 1MiB",
            ),
            // A branch calling its join back is a cycle.
            (
                t.replace(
                    "  upper:   { command: [\"bin/upper\", \"-v\"],",
                    "  upper:   { calls: [exclaim], command: [\"bin/upper\", \"-v\"],",
                ),
                "c.yaml:5: functions.upper.calls: calls form a cycle (upper -> exclaim -> upper)",
            ),
        ];
        for (yaml, want) in cases {
            let got = err(&yaml);
            assert!(got.starts_with(want), "got {got:?}\nwant {want:?}");
        }
    }

    #[test]
    fn mqtt_and_coap_triggers() {
        let t = HELLO.replace(
            "  - http: POST /hello\n",
            "  - http: POST /hello\n    mqtt: sensors/+/motion\n    mqtt_reply: lights/1\n    coap: /motion\n",
        ) + "mqtt: { listen: 127.0.0.1:0 }\ncoap: { listen: \"127.0.0.1:5683\" }\n";
        let s = parse(Path::new("c.yaml"), &t).unwrap();
        let r = &s.routes[0];
        assert_eq!(
            (r.mqtt.as_str(), r.mqtt_reply.as_str(), r.coap.as_str()),
            ("sensors/+/motion", "lights/1", "/motion")
        );
        assert_eq!(
            s.mqtt,
            Some(MqttSpec::Listen("127.0.0.1:0".parse().unwrap()))
        );
        assert_eq!(s.coap, Some("127.0.0.1:5683".parse().unwrap()));
        // A route with no HTTP trigger is fine when it has another.
        let only = t.replace("  - http: POST /hello\n    mqtt", "  - mqtt");
        assert_eq!(
            parse(Path::new("c.yaml"), &only).unwrap().routes[0].path,
            ""
        );
        let broker = t.replace("{ listen: 127.0.0.1:0 }", "{ broker: \"localhost:1883\" }");
        assert_eq!(
            parse(Path::new("c.yaml"), &broker).unwrap().mqtt,
            Some(MqttSpec::Broker {
                addr: "localhost:1883".into(),
                client_id: "zerohop-hello".into()
            })
        );
        let cases = [
            (t.replace("sensors/+/motion", "sensors/x+/motion"), "c.yaml:14: routes[0].mqtt: `sensors/x+/motion` is not an MQTT topic filter: `+` stands for a whole level"),
            (t.replace("sensors/+/motion", "sensors/#/motion"), "c.yaml:14: routes[0].mqtt: `sensors/#/motion` is not an MQTT topic filter: `#` stands for the whole last level"),
            (t.replace("sensors/+/motion", &["s"; 33].join("/")), "c.yaml:14: routes[0].mqtt: `s/s/s/s/s/s/s/s/s/s/s/s/s/s/s/s/s/s/s/s/s/s/s/s/s/s/s/s/s/s/s/s/s` is not an MQTT topic filter: it has more than 32 levels"),
            (t.replace("lights/1", &["l"; 33].join("/")), "c.yaml:15: routes[0].mqtt_reply: `l/l/l/l/l/l/l/l/l/l/l/l/l/l/l/l/l/l/l/l/l/l/l/l/l/l/l/l/l/l/l/l/l` is not an MQTT topic name: it has more than 32 levels"),
            (t.replace("lights/1", "lights/+"), "c.yaml:15: routes[0].mqtt_reply: `lights/+` is not an MQTT topic name: a topic name has no wildcards"),
            (t.replace("coap: /motion", "coap: motion"), "c.yaml:16: routes[0].coap: `motion` is not a CoAP path"),
            (t.replace("mqtt: { listen: 127.0.0.1:0 }\n", ""), "c.yaml:13: mqtt: a route has an `mqtt` topic but the chain has no `mqtt` section"),
            (t.replace("coap: { listen: \"127.0.0.1:5683\" }\n", ""), "c.yaml:13: coap: a route has a `coap` path but the chain has no `coap` section"),
            (t.replace("{ listen: 127.0.0.1:0 }", "{ listen: localhost }"), "c.yaml:18: mqtt.listen: `localhost` is not IP:PORT"),
            (t.replace("{ listen: 127.0.0.1:0 }", "{ broker: nowhere }"), "c.yaml:18: mqtt.broker: `nowhere` is not HOST:PORT"),
            (t.replace("{ listen: 127.0.0.1:0 }", "{ listen: 127.0.0.1:0, broker: \"a:1\" }"), "c.yaml:18: mqtt: set exactly one of"),
            (t.replace("{ listen: 127.0.0.1:0 }", "{ listen: 127.0.0.1:0, client_id: me }"), "c.yaml:18: mqtt.client_id: only for `broker`"),
            (HELLO.to_owned() + "coap: { listen: 127.0.0.1:0 }\n", "c.yaml:15: coap: no route has a `coap` path"),
            (HELLO.replace("  - http: POST /hello\n", "  - sequence: [upper]\n  - http: POST /hello\n"), "c.yaml:13: routes[0]: a route needs a way in"),
            (HELLO.replace("    sequence: [upper, exclaim]", "    mqtt_reply: a\n    sequence: [upper, exclaim]"), "c.yaml:14: routes[0].mqtt_reply: a reply topic needs an `mqtt` topic filter"),
        ];
        for (yaml, want) in cases {
            let got = err(&yaml);
            assert!(got.starts_with(want), "got {got:?}\nwant {want:?}");
        }
    }

    #[test]
    fn errors_name_line_and_field() {
        let cases = [
            (HELLO.replace("timeout: 2s", "timeot: 2s"), "c.yaml:3: timeot: unknown field"),
            // Found by the `spec` fuzz target: an empty key named no field at all.
            (HELLO.replace("timeout: 2s", "\"\": 2s"), "c.yaml:3: \"\": unknown field"),
            (HELLO.replace("env: { MODE: loud, N: 3 }", "env: { \"\": v }"), "c.yaml:8: functions.exclaim.env.\"\": not a usable variable name"),
            (HELLO.replace("timeout: 2s", "timeout: soon"), "c.yaml:3: timeout: `soon` is not a duration"),
            (HELLO.replace("timeout: 2s", "body_timeout: 5ms"), "c.yaml:3: body_timeout: must be between 10ms and 1h"),
            (HELLO.replace("timeout: 2s", "max_connections: 0"), "c.yaml:3: max_connections: 0 is out of range"),
            (HELLO.replace("timeout: 2s", "gateway_threads: 65"), "c.yaml:3: gateway_threads: 65 is out of range; use 1 to 64"),
            (HELLO.replace("timeout: 2s", "gateway_threads: many"), "c.yaml:3: gateway_threads: expected `auto` or a number of threads from 1 to 64"),
            (HELLO.replace("instances: 2", "instances: two"), "c.yaml:5: functions.upper.instances: expected a whole number, found a string"),
            (HELLO.replace("instances: 2", "instances: 0"), "c.yaml:5: functions.upper.instances: 0 is out of range"),
            (HELLO.replace("[ptrace, setsid]", "[ptrace, ptracee]"), "c.yaml:11: functions.exclaim.syscalls[1]: unknown system call `ptracee`"),
            (HELLO.replace("[ptrace, setsid]", "ptrace"), "c.yaml:11: functions.exclaim.syscalls: expected a list"),
            (HELLO.replace("[upper, exclaim]", "[upper, shout]"), "c.yaml:14: routes[0].sequence[1]: unknown function `shout`; known functions: upper, exclaim"),
            (HELLO.replace("next: [upper]", "next: [nobody]"), "c.yaml:10: functions.exclaim.next[0]: unknown function `nobody`"),
            (HELLO.replace("    command: [/bin/exclaim]\n", ""), "c.yaml:6: functions.exclaim.command: missing"),
            (HELLO.replace("[/bin/exclaim]", "[]"), "c.yaml:7: functions.exclaim.command: empty"),
            (HELLO.replace("POST /hello", "post hello"), "c.yaml:13: routes[0].http: `post hello` is not `METHOD /path`"),
            (HELLO.replace("slot_size: 8KiB", "slot_size: 8 lots"), "c.yaml:2: pool.slot_size: `8 lots` is not a size"),
            (HELLO.replace("slot_size: 8KiB", "slot_size: 1000"), "c.yaml:2: pool.slot_size: must be a multiple of 64"),
            (HELLO.replace("timeout: 2s", "max_body: 1MiB"), "c.yaml:3: max_body: 1048576 bytes do not fit a slot of 8192 bytes"),
            (HELLO.replace("name: hello", "name: hello world"), "c.yaml:1: name: a chain name is"),
            (HELLO.replace("name: hello\n", ""), "c.yaml:1: name: missing"),
            (HELLO.replace("timeout: 2s", "transport: carrier-pigeon"), "c.yaml:3: transport: unknown transport `carrier-pigeon`; use one of: ring, socket, poll, sockmap"),
            (HELLO.replace("env: { MODE: loud, N: 3 }", "env: [MODE]"), "c.yaml:8: functions.exclaim.env: expected a mapping"),
            (HELLO.replace("{ slots: 64,", "{ slots: 64, hugepages: maybe,"), "c.yaml:2: pool.hugepages: expected true or false"),
            (format!("{HELLO}  - http: POST /hello\n    sequence: [upper]\n"), "c.yaml:15: routes[1].http: `POST /hello` is already routed"),
            (HELLO.replace("[upper, exclaim]", "[upper]"), "c.yaml:6: functions.exclaim: no route reaches this function"),
            ("name: x\nfunctions: {\n".into(), "c.yaml:3: (yaml): not valid YAML"),
            ("".into(), "c.yaml:1: (spec): the spec is empty"),
            ("- a\n".into(), "c.yaml:1: (spec): expected a mapping"),
        ];
        for (yaml, want) in cases {
            let got = err(&yaml);
            assert!(got.starts_with(want), "want {want:?}\n got {got:?}");
        }
    }

    /// A cheap stand-in for a fuzzer: thousands of mutated specs never panic, and every
    /// error still names the file and a line.
    #[test]
    fn mutated_specs_never_panic_and_errors_stay_located() {
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut rnd = |n: usize| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % n as u64) as usize
        };
        let alphabet: Vec<char> = "{}[]:,-#&*!|>'\"\n x0aZ9%@`\t".chars().collect();
        let (mut ok, mut bad) = (0, 0);
        for _ in 0..20_000 {
            let mut text: Vec<char> = HELLO.chars().collect();
            for _ in 0..1 + rnd(4) {
                let at = rnd(text.len() + 1).min(text.len());
                match rnd(3) {
                    0 if at < text.len() => {
                        text.remove(at);
                    }
                    1 => text.insert(at, alphabet[rnd(alphabet.len())]),
                    _ => {
                        let from = rnd(text.len());
                        let to = (from + rnd(20)).min(text.len());
                        let chunk: Vec<char> = text[from..to].to_vec();
                        text.splice(at..at, chunk);
                    }
                }
            }
            let text: String = text.into_iter().collect();
            match parse(Path::new("c.yaml"), &text) {
                Ok(_) => ok += 1,
                Err(e) => {
                    bad += 1;
                    assert_eq!(e.file, "c.yaml");
                    assert!(
                        e.line >= 1 && e.line <= text.lines().count() + 1,
                        "line {} out of range for {text:?}: {e}",
                        e.line
                    );
                    assert!(!e.field.is_empty() && !e.message.is_empty(), "{e}");
                }
            }
        }
        assert!(
            ok > 0 && bad > 0,
            "mutations exercised both paths: {ok} ok, {bad} errors"
        );
    }

    #[test]
    fn sizes_and_durations() {
        assert_eq!(parse_size("65536"), Some(65536));
        assert_eq!(parse_size("64KiB"), Some(65536));
        assert_eq!(parse_size("2 MiB"), Some(2 << 20));
        assert_eq!(parse_size("1G"), Some(1 << 30));
        assert_eq!(parse_size("12 parsecs"), None);
        assert_eq!(parse_size("99999999999999999999GiB"), None);
        assert_eq!(parse_duration("500ms"), Some(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Some(Duration::from_secs(120)));
        assert_eq!(parse_duration("10"), None);
        assert_eq!(parse_duration("s"), None);
    }

    const CALLS: &str = "\
name: shop
functions:
  front: { command: [/bin/f], calls: [cart, price] }
  cart: { command: [/bin/c], calls: [price] }
  price: { command: [/bin/p] }
routes:
  - http: GET /
    sequence: [front]
";

    #[test]
    fn calls_reach_functions_and_must_not_cycle() {
        let s = parse(Path::new("c.yaml"), CALLS).unwrap();
        assert_eq!(s.functions[0].calls, vec!["cart", "price"]);
        assert_eq!(s.functions[1].calls, vec!["price"]);
        assert!(err(&CALLS.replace("calls: [price] }", "calls: [nope] }"))
            .starts_with("c.yaml:4: functions.cart.calls[0]: unknown function `nope`"));
        assert!(err(&CALLS.replace("calls: [price] }", "calls: [cart] }"))
            .starts_with("c.yaml:4: functions.cart.calls[0]: a function cannot call itself"));
        let cycle = err(&CALLS.replace(
            "price: { command: [/bin/p] }",
            "price: { command: [/bin/p], calls: [front] }",
        ));
        assert!(
            cycle.starts_with("c.yaml:3: functions.front.calls: calls form a cycle (front -> cart -> price -> front)"),
            "{cycle}"
        );
        // Reached only by a call: fine; reached by nothing: refused.
        let orphan = err(&CALLS.replace("calls: [cart, price]", "calls: [price]"));
        assert!(
            orphan.contains("functions.cart: no route reaches"),
            "{orphan}"
        );
    }
}
