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

use std::path::{Path, PathBuf};
use std::time::Duration;

use saphyr::{LoadableYamlNode, MarkedYaml, Scalar, YamlData};
use zerohop_pool::{META_RESERVE, SLOT_HEADER_LEN};

use crate::functions::absolute;
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

pub(crate) type Map<'a, 'y> = Vec<(&'a MarkedYaml<'y>, &'a MarkedYaml<'y>)>;

/// A mapping key as a field name: an empty key is shown quoted (`""`), so an error about it
/// still names a field.
pub(crate) fn shown_key(key: &str) -> &str {
    if key.is_empty() {
        "\"\""
    } else {
        key
    }
}

pub(crate) fn line(n: &MarkedYaml<'_>) -> usize {
    n.span.start.line()
}

/// The value of `key` in a mapping.
pub(crate) fn get<'a, 'y>(map: &Map<'a, 'y>, key: &str) -> Option<&'a MarkedYaml<'y>> {
    map.iter()
        .find(|(k, _)| scalar_text(k).as_deref() == Some(key))
        .map(|(_, v)| *v)
}

/// A scalar's text as written (strings, numbers and booleans alike); `None` for
/// collections and null.
pub(crate) fn scalar_text(n: &MarkedYaml<'_>) -> Option<String> {
    match &n.data {
        YamlData::Value(Scalar::String(s)) => Some(s.to_string()),
        YamlData::Value(Scalar::Integer(i)) => Some(i.to_string()),
        YamlData::Value(Scalar::FloatingPoint(f)) => Some(f.to_string()),
        YamlData::Value(Scalar::Boolean(b)) => Some(b.to_string()),
        YamlData::Representation(s, _, _) => Some(s.to_string()),
        _ => None,
    }
}

pub(crate) fn kind(n: &MarkedYaml<'_>) -> &'static str {
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
pub(crate) struct Cx {
    pub(crate) file: String,
}

impl Cx {
    pub(crate) fn err(&self, line: usize, field: &str, message: impl Into<String>) -> SpecError {
        SpecError {
            file: self.file.clone(),
            line,
            field: field.to_owned(),
            message: message.into(),
        }
    }

    pub(crate) fn mapping<'a, 'y>(
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

    pub(crate) fn sequence<'a, 'y>(
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

    pub(crate) fn string(&self, n: &MarkedYaml<'_>, field: &str) -> Result<String, SpecError> {
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
    pub(crate) fn text(&self, n: &MarkedYaml<'_>, field: &str) -> Result<String, SpecError> {
        scalar_text(n).ok_or_else(|| {
            self.err(
                line(n),
                field,
                format!("expected a string or number, found {}", kind(n)),
            )
        })
    }

    pub(crate) fn strings(
        &self,
        n: &MarkedYaml<'_>,
        field: &str,
    ) -> Result<Vec<String>, SpecError> {
        self.sequence(n, field)?
            .iter()
            .enumerate()
            .map(|(i, e)| self.string(e, &format!("{field}[{i}]")))
            .collect()
    }

    pub(crate) fn integer(
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

    pub(crate) fn boolean(&self, n: &MarkedYaml<'_>, field: &str) -> Result<bool, SpecError> {
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
    pub(crate) fn size(&self, n: &MarkedYaml<'_>, field: &str) -> Result<u64, SpecError> {
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
    pub(crate) fn duration(&self, n: &MarkedYaml<'_>, field: &str) -> Result<Duration, SpecError> {
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

    pub(crate) fn only_known(
        &self,
        map: &Map<'_, '_>,
        prefix: &str,
        known: &[&str],
    ) -> Result<(), SpecError> {
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

    pub(crate) fn required<'a, 'y>(
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
}
