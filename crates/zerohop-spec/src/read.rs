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
//! pool: { slots: 1024, slot_size: 64KiB, hugepages: false, large_slots: 16 }   # optional
//! max_body: 64MiB                       # optional: largest request body (one beyond a
//!                                       # slot goes into one of the large slots)
//! timeout: 10s                          # optional: a request's answer deadline
//! functions:
//!   upper:   { command: ["./upper"], instances: 1, concurrency: 1 }
//!   exclaim: { command: ["./exclaim"], env: { K: v }, headers: [X-Trace], next: [upper] }
//!   tracer:  { command: ["./tracer"], syscalls: [ptrace] }   # beyond the seccomp allow-list
//! routes:
//!   - http: POST /hello
//!     sequence: [upper, exclaim]
//! ```

use std::path::{Path, PathBuf};
use std::time::Duration;

use saphyr::{LoadableYamlNode, MarkedYaml, Scalar, YamlData};
use zerohop_pool::META_RESERVE;

use crate::functions::absolute;
use crate::yaml::{get, kind, line, shown_key, Cx};
use crate::*;

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
        "cpus",
        "functions",
        "routes",
        "mqtt",
        "coap",
        "state",
        "listen",
        "data",
        "tls",
        "fuse",
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
            large_slots: DEFAULT_LARGE_SLOTS,
        },
        Some(n) => cx.pool(n)?,
    };
    // What one slot can carry after the header and the reserved metadata area; a larger
    // body goes into a large slot of its domain (docs/protocol.md, "Large pools").
    let body_room = pool.body_room();
    let max_body_node = get(&top, "max_body");
    let max_body = match max_body_node {
        None => DEFAULT_MAX_BODY,
        Some(n) => {
            let v = cx.size(n, "max_body")?;
            if v > MAX_MAX_BODY {
                return Err(cx.err(
                    line(n),
                    "max_body",
                    format!("{v} bytes; a request body may be at most 3GiB"),
                ));
            }
            v
        }
    };
    // The line of `pool.large_slots` (or of `pool`, or 1), for errors that name it.
    let large_slots_line = || {
        let pool = get(&top, "pool")?;
        let map = cx.mapping(pool, "pool").ok()?;
        Some(get(&map, "large_slots").map_or(line(pool), line))
    };
    if max_body > body_room && pool.large_slots == 0 {
        let (at, field) = match max_body_node {
            Some(n) => (line(n), "max_body"),
            None => (large_slots_line().unwrap_or(1), "pool.large_slots"),
        };
        return Err(cx.err(
            at,
            field,
            format!(
                "max_body ({max_body} bytes{}) does not fit a slot of {} bytes ({body_room} bytes \
                 after the slot header and the {META_RESERVE}-byte metadata area) and \
                 pool.large_slots is 0, so there is no large slot for it; set pool.large_slots \
                 to 1 or more, or max_body to at most {body_room}",
                if max_body_node.is_none() {
                    ", the default"
                } else {
                    ""
                },
                pool.slot_size
            ),
        ));
    }
    let (large_slots, large_slot_size) = pool.large(max_body);
    let large_total = u64::from(large_slots) * u64::from(large_slot_size);
    if large_total > 1 << 40 {
        return Err(cx.err(
            large_slots_line().unwrap_or(1),
            "pool.large_slots",
            format!(
                "{large_slots} large slots of {large_slot_size} bytes (for max_body {max_body}) \
                 are {large_total} bytes of address space per security domain, more than 1TiB; \
                 lower pool.large_slots or max_body"
            ),
        ));
    }
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

    let cpus = match get(&top, "cpus") {
        None => Vec::new(),
        Some(n) => {
            let field = |i: usize| format!("cpus[{i}]");
            let max = i64::from(crate::cpus::MAX_CPU);
            let listed = match &n.data {
                YamlData::Value(Scalar::String(s)) => crate::cpus::parse_list(s),
                YamlData::Value(Scalar::Integer(_)) => {
                    crate::cpus::from_numbers([cx.integer(n, "cpus", 0, max)?])
                }
                YamlData::Sequence(items) => crate::cpus::from_numbers(
                    items
                        .iter()
                        .enumerate()
                        .map(|(i, e)| cx.integer(e, &field(i), 0, max))
                        .collect::<Result<Vec<_>, _>>()?,
                ),
                _ => Err(format!(
                    "expected a CPU list such as `0-3,8` or a list of CPU numbers, found {}",
                    kind(n)
                )),
            };
            match listed {
                Ok(cpus) if !cpus.is_empty() => cpus,
                Ok(_) => {
                    return Err(cx.err(
                        line(n),
                        "cpus",
                        "names no CPU; leave `cpus` out to run anywhere",
                    ))
                }
                Err(m) => return Err(cx.err(line(n), "cpus", m)),
            }
        }
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
    let fuse = cx.fuse(&top, &mut functions, &routes)?;
    let state = cx.state(&top, &functions)?;
    let tls = cx.tls(&top, dir)?;
    // `mqtt.listen_tls` is read apart from the rest of `mqtt`.
    let (mqtt_tls, mqtt_node) = cx.mqtt_tls(&top)?;
    let mqtt = match &mqtt_node {
        None => cx.mqtt(&top, &routes, &name)?,
        Some(node) => {
            let rest: crate::yaml::Map<'_, '_> = top
                .iter()
                .map(|&(k, v)| match crate::yaml::scalar_text(k).as_deref() {
                    Some("mqtt") => (k, node),
                    _ => (k, v),
                })
                .collect();
            cx.mqtt(&rest, &routes, &name)?
        }
    };
    if let Some((_, at)) = mqtt_tls {
        cx.check_mqtt_tls(at, mqtt.as_ref(), tls.as_ref())?;
    }
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
        cpus,
        functions,
        routes,
        mqtt,
        coap,
        state,
        listen,
        data,
        tls,
        mqtt_tls: mqtt_tls.map(|(a, _)| a),
        fuse,
    })
}
