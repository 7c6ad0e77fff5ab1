//! The `functions` section: each function's command (or runtime and handler), its
//! environment, headers, calls, scaling, resources and system calls.

use std::path::Path;
use std::time::Duration;

use saphyr::MarkedYaml;

use crate::plan::JoinPolicy;
use crate::routes::http_header_name_invalid;
use crate::yaml::{get, line, scalar_text, shown_key, Cx, Map};
use crate::*;

impl Cx {
    /// The command of a function given as `runtime` + `handler` (+ `interpreter`): the
    /// interpreter (`python3`, `node`, or `interpreter`) running the SDK's loader on the
    /// handler, which is found relative to the spec's folder.
    pub(crate) fn runtime_command(
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

    pub(crate) fn functions(
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
                        if http_header_name_invalid(h)
                            && !crate::meta::is_pseudo(&h.to_ascii_lowercase())
                        {
                            return Err(self.err(
                                line(n),
                                &format!("{p}headers[{i}]"),
                                format!(
                                    "`{h}` is not an HTTP header name, nor one of {}, \
                                     :claim.NAME",
                                    crate::meta::PSEUDO.join(", ")
                                ),
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
                fused_with: Vec::new(),
                fused_into: None,
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
    pub(crate) fn scale(
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
    pub(crate) fn resources(&self, n: &MarkedYaml<'_>, p: &str) -> Result<ResourceSpec, SpecError> {
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
}

/// `path` made absolute against the current directory (the handler of `runtime` is found by
/// the interpreter, which needs no `./` to tell a file from a package).
pub(crate) fn absolute(path: &Path) -> String {
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
