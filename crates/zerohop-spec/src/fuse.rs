//! The `fuse` section: groups of consecutive functions of one program that one set of
//! instances runs, each hop between them a function call on the same slot (Serpens' "chains
//! as function calls").
//!
//! ```yaml
//! fuse:
//!   - [upper, exclaim]       # upper's instances run exclaim too
//! ```
//!
//! What a group must be, each refused with its line and field otherwise:
//!
//! - **One program**: the same `command` (a binary that registers a handler per function
//!   name), or the same `runtime` and `interpreter` (one Python or Node.js interpreter that
//!   loads each function's module). A runtime group's first function gets the command that
//!   loads them all.
//! - **One security domain**: every route that runs one of its functions runs all of them,
//!   consecutively and in the group's order (so they see the same requests and map the same
//!   pools), and none of them forwards, calls, joins a fan-out or is reached by `next` or
//!   `calls`: a fused function is reached only along its group's routes.
//! - **One confinement**: the same `env`, `syscalls`, `resources` and `state`.
//! - **One failure unit, scaled as one**: `instances`, `concurrency` and `scale` are the
//!   first function's; the others may not set them.

use saphyr::MarkedYaml;

use crate::yaml::{get, line, Cx, Map};
use crate::*;

/// What a function's program is, for telling whether functions can share one process.
#[derive(Debug, PartialEq, Eq)]
enum Program<'a> {
    /// `runtime: python`: the interpreter, the spec's folder, and `MODULE:FUNCTION`.
    Python {
        interpreter: &'a str,
        dir: &'a str,
        handler: &'a str,
    },
    /// `runtime: node`: the interpreter, the handler's file and its export.
    Node {
        interpreter: &'a str,
        file: &'a str,
        export: &'a str,
    },
    /// Any other program, with its arguments.
    Command(&'a [String]),
}

impl<'a> Program<'a> {
    fn of(command: &'a [String]) -> Self {
        match command {
            [i, m, z, p, dir, handler] if m == "-m" && z == "zerohop" && p == "--path" => {
                Program::Python {
                    interpreter: i,
                    dir,
                    handler,
                }
            }
            [i, e, loader, file, rest @ ..] if e == "-e" && loader == NODE_LOADER => {
                Program::Node {
                    interpreter: i,
                    file,
                    export: rest.first().map_or("", String::as_str),
                }
            }
            _ => Program::Command(command),
        }
    }

    /// Whether `self` and `other` can be one process.
    fn shares_with(&self, other: &Program<'_>) -> bool {
        match (self, other) {
            (
                Program::Python {
                    interpreter: a,
                    dir: x,
                    ..
                },
                Program::Python {
                    interpreter: b,
                    dir: y,
                    ..
                },
            ) => a == b && x == y,
            (Program::Node { interpreter: a, .. }, Program::Node { interpreter: b, .. }) => a == b,
            (Program::Command(a), Program::Command(b)) => a == b,
            _ => false,
        }
    }

    fn shown(&self) -> String {
        match self {
            Program::Python {
                interpreter,
                handler,
                ..
            } => format!("runtime python ({interpreter}), handler {handler}"),
            Program::Node {
                interpreter, file, ..
            } => format!("runtime node ({interpreter}), handler {file}"),
            Program::Command(c) => format!("command {c:?}"),
        }
    }
}

impl Cx {
    /// Reads `fuse` and checks it against the functions and routes; marks the groups on the
    /// functions ([`FunctionSpec::fused_with`], [`FunctionSpec::fused_into`]) and gives a
    /// runtime group's first function the command that loads every handler of the group.
    pub(crate) fn fuse(
        &self,
        top: &Map<'_, '_>,
        functions: &mut [FunctionSpec],
        routes: &[RouteSpec],
    ) -> Result<Vec<FuseSpec>, SpecError> {
        let Some(node) = get(top, "fuse") else {
            return Ok(Vec::new());
        };
        let groups = self.sequence(node, "fuse")?;
        let mut out: Vec<FuseSpec> = Vec::new();
        for (g, group) in groups.iter().enumerate() {
            let at = format!("fuse[{g}]");
            let items = self.sequence(group, &at)?;
            if items.len() < 2 {
                return Err(self.err(
                    line(group),
                    &at,
                    "a fused group is a list of two or more functions that run one after \
                     the other, e.g. [upper, exclaim]",
                ));
            }
            let mut names: Vec<String> = Vec::new();
            for (j, item) in items.iter().enumerate() {
                let field = format!("{at}[{j}]");
                let name = self.string(item, &field)?;
                if !functions.iter().any(|f| f.name == name) {
                    let known: Vec<&str> = functions.iter().map(|f| f.name.as_str()).collect();
                    return Err(self.err(
                        line(item),
                        &field,
                        format!(
                            "unknown function `{name}`; known functions: {}",
                            known.join(", ")
                        ),
                    ));
                }
                if names.contains(&name) {
                    return Err(self.err(
                        line(item),
                        &field,
                        format!("`{name}` is listed twice; a function is one step of its group"),
                    ));
                }
                if let Some((k, _)) = out
                    .iter()
                    .enumerate()
                    .find(|(_, o)| o.functions.contains(&name))
                {
                    return Err(self.err(
                        line(item),
                        &field,
                        format!(
                            "`{name}` is already fused in fuse[{k}]; a function belongs to one \
                             group (merge the two groups if they run one after the other)"
                        ),
                    ));
                }
                names.push(name);
            }
            let spec = FuseSpec {
                line: line(group),
                functions: names,
            };
            self.one_program(&spec, g, items, functions)?;
            self.one_confinement(&spec, g, top, functions)?;
            self.reached_only_along_routes(&spec, g, items, functions)?;
            self.consecutive_in_routes(&spec, g, routes)?;
            out.push(spec);
        }
        for group in &out {
            mark(group, functions);
        }
        Ok(out)
    }

    /// The group's functions are one program (see the module's docs).
    fn one_program(
        &self,
        group: &FuseSpec,
        g: usize,
        items: &[MarkedYaml<'_>],
        functions: &[FunctionSpec],
    ) -> Result<(), SpecError> {
        let first = find(functions, &group.functions[0]);
        let program = Program::of(&first.command);
        for (j, name) in group.functions.iter().enumerate().skip(1) {
            let f = find(functions, name);
            let other = Program::of(&f.command);
            if !program.shares_with(&other) {
                return Err(self.err(
                    line(&items[j]),
                    &format!("fuse[{g}][{j}]"),
                    format!(
                        "`{name}` runs another program ({}) than `{}` ({}); fused functions \
                         are handlers of one program: give them the same `command` (a binary \
                         that registers a handler per function name), or the same `runtime` \
                         and `interpreter` (each function's module loaded into one \
                         interpreter)",
                        other.shown(),
                        first.name,
                        program.shown()
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The group's functions share their confinement, and only the first sets how many
    /// instances the group runs.
    fn one_confinement(
        &self,
        group: &FuseSpec,
        g: usize,
        top: &Map<'_, '_>,
        functions: &[FunctionSpec],
    ) -> Result<(), SpecError> {
        let first = find(functions, &group.functions[0]);
        let map = get(top, "functions").and_then(|n| self.mapping(n, "functions").ok());
        for name in &group.functions[1..] {
            let f = find(functions, name);
            let node = map.as_ref().and_then(|m| get(m, name));
            let fields = node.and_then(|n| self.mapping(n, "functions").ok());
            for field in ["instances", "concurrency", "scale"] {
                if let Some(n) = fields.as_ref().and_then(|m| get(m, field)) {
                    return Err(self.err(
                        line(n),
                        &format!("functions.{name}.{field}"),
                        format!(
                            "`{name}` runs in the instances of `{}`, the first function of its \
                             fused group (fuse[{g}]): the group scales as one, so set \
                             `instances`, `concurrency` and `scale` on `{}` only",
                            first.name, first.name
                        ),
                    ));
                }
            }
            let differs = [
                ("env", f.env != first.env),
                ("syscalls", f.syscalls != first.syscalls),
                ("resources", f.resources != first.resources),
                ("state", f.state != first.state),
            ];
            if let Some((field, _)) = differs.iter().find(|(_, d)| *d) {
                let at = fields
                    .as_ref()
                    .and_then(|m| get(m, field))
                    .map_or(f.line, line);
                return Err(self.err(
                    at,
                    &format!("functions.{name}.{field}"),
                    format!(
                        "`{name}` is fused with `{}` (fuse[{g}]) but its `{field}` differs; a \
                         fused group is one process, so one confinement: give its functions \
                         the same env, syscalls, resources and state",
                        first.name
                    ),
                ));
            }
        }
        Ok(())
    }

    /// No function of the group forwards, calls or joins, and none is reached by `next` or
    /// `calls` (a static fan-out's branches are its join's calls).
    fn reached_only_along_routes(
        &self,
        group: &FuseSpec,
        g: usize,
        items: &[MarkedYaml<'_>],
        functions: &[FunctionSpec],
    ) -> Result<(), SpecError> {
        let unsupported = "fused functions run one after the other along their routes; \
                           dynamic routing (`next`), calls and fan-outs are not supported \
                           inside a fused group: keep such functions out of `fuse`";
        for (j, name) in group.functions.iter().enumerate() {
            let f = find(functions, name);
            for (field, set) in [
                ("next", !f.next.is_empty()),
                ("calls", !f.calls.is_empty() && f.fan_out.is_empty()),
            ] {
                if set {
                    return Err(self.err(
                        f.line,
                        &format!("functions.{name}.{field}"),
                        format!("`{name}` is fused (fuse[{g}]); {unsupported}"),
                    ));
                }
            }
            if !f.fan_out.is_empty() {
                return Err(self.err(
                    line(&items[j]),
                    &format!("fuse[{g}][{j}]"),
                    format!("`{name}` joins a route's fan_out; {unsupported}"),
                ));
            }
            if let Some(other) = functions
                .iter()
                .find(|o| o.next.contains(name) || o.calls.contains(name))
            {
                let how = if other.next.contains(name) {
                    "forwards to"
                } else if other.fan_out.contains(name) {
                    "fans out to"
                } else {
                    "calls"
                };
                return Err(self.err(
                    line(&items[j]),
                    &format!("fuse[{g}][{j}]"),
                    format!("`{}` {how} `{name}`; {unsupported}", other.name),
                ));
            }
        }
        Ok(())
    }

    /// Every route that runs a function of the group runs the whole group there,
    /// consecutively and in order: so its functions see the same requests, and are one
    /// security domain.
    fn consecutive_in_routes(
        &self,
        group: &FuseSpec,
        g: usize,
        routes: &[RouteSpec],
    ) -> Result<(), SpecError> {
        let n = group.functions.len();
        for (r, route) in routes.iter().enumerate() {
            let seq = &route.sequence;
            let mut k = 0;
            while k < seq.len() {
                if !group.functions.contains(&seq[k]) {
                    k += 1;
                    continue;
                }
                if seq.get(k..k + n) == Some(&group.functions[..]) {
                    k += n;
                    continue;
                }
                return Err(self.err(
                    route.line,
                    &format!("routes[{r}].sequence"),
                    format!(
                        "runs `{}` at step {} without the rest of its fused group in order \
                         ([{}], fuse[{g}]); a fused group is one security domain, so every \
                         route that runs one of its functions runs all of them, one right \
                         after the other in the group's order (routes with other functions \
                         form other domains, which a group may not span)",
                        seq[k],
                        k + 1,
                        group.functions.join(", ")
                    ),
                ));
            }
        }
        Ok(())
    }
}

fn find<'a>(functions: &'a [FunctionSpec], name: &str) -> &'a FunctionSpec {
    functions
        .iter()
        .find(|f| f.name == name)
        .expect("names checked against the functions")
}

/// Marks `group` on its functions; the others take the first's instances, and a runtime
/// group's first function gets the command that loads every handler.
fn mark(group: &FuseSpec, functions: &mut [FunctionSpec]) {
    let first = find(functions, &group.functions[0]).clone();
    let command = match Program::of(&first.command) {
        Program::Python {
            interpreter, dir, ..
        } => {
            let mut c: Vec<String> = vec![
                interpreter.into(),
                "-m".into(),
                "zerohop".into(),
                "--path".into(),
                dir.into(),
            ];
            for name in &group.functions {
                if let Program::Python { handler, .. } = Program::of(&find(functions, name).command)
                {
                    c.push(format!("{name}={handler}"));
                }
            }
            c
        }
        Program::Node { interpreter, .. } => {
            let mut c: Vec<String> =
                vec![interpreter.into(), "-e".into(), NODE_FUSED_LOADER.into()];
            for name in &group.functions {
                if let Program::Node { file, export, .. } =
                    Program::of(&find(functions, name).command)
                {
                    c.extend([name.clone(), file.into(), export.into()]);
                }
            }
            c
        }
        Program::Command(c) => c.to_vec(),
    };
    for f in functions.iter_mut() {
        if f.name == first.name {
            f.command = command.clone();
            f.fused_with = group.functions[1..].to_vec();
        } else if group.functions.contains(&f.name) {
            f.fused_into = Some(first.name.clone());
            f.instances = first.instances;
            f.concurrency = first.concurrency;
            f.scale = first.scale;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::*;

    const FUSED: &str = "\
name: hello
functions:
  upper:   { command: [bin/hello-fused], instances: 2, concurrency: 4 }
  exclaim: { command: [bin/hello-fused] }
  audit:   { command: [bin/audit] }
routes:
  - http: POST /hello
    sequence: [upper, exclaim]
  - http: POST /audited
    sequence: [audit, upper, exclaim, audit]
fuse:
  - [upper, exclaim]
";

    fn err(yaml: &str) -> String {
        parse(Path::new("c.yaml"), yaml).unwrap_err().to_string()
    }

    #[test]
    fn a_fused_group_runs_in_its_first_functions_instances() {
        let s = parse(Path::new("/srv/c.yaml"), FUSED).unwrap();
        assert_eq!(s.fuse.len(), 1);
        assert_eq!(
            (s.fuse[0].line, s.fuse[0].name()),
            (12, "upper+exclaim".into())
        );
        let (upper, exclaim) = (&s.functions[0], &s.functions[1]);
        assert_eq!(upper.fused_with, ["exclaim"]);
        assert_eq!(exclaim.fused_into.as_deref(), Some("upper"));
        assert_eq!((exclaim.instances, exclaim.concurrency), (2, 4));
        assert_eq!(reserved(upper), 3);
        assert_eq!(reserved(exclaim), 0, "no parties of its own");
        let plan = plan_from_spec(&s, "ring", 0, 1);
        assert_eq!(plan.party_function, [GATEWAY_FN, 0, 0, 0, 2, 2]);
        assert_eq!(plan.functions[0].fused, [0, 1]);
        assert_eq!(plan.functions[1].host, Some(0));
        assert_eq!((plan.host_of(1), plan.host_of(2)), (0, 2));
        assert_eq!(plan.group_name(0), "upper+exclaim");
        assert_eq!(plan.group_of(2), [2]);
        // No edge inside the group; into it to upper, out of it from upper.
        assert_eq!(
            plan.edges(),
            vec![
                (0, 2),
                (0, GATEWAY_FN),
                (2, 0),
                (2, GATEWAY_FN),
                (GATEWAY_FN, 0),
                (GATEWAY_FN, 2)
            ]
        );
        // The group's functions are in the same domains: its instances map those pools.
        assert_eq!(plan.domains_of(0), plan.domains_of(1));
        assert_eq!(Plan::from_json(&plan.to_json()).unwrap(), plan);
        // Without `fuse`, the plan's JSON has neither field.
        let plain = parse(
            Path::new("c.yaml"),
            &FUSED.replace("fuse:\n  - [upper, exclaim]\n", ""),
        )
        .unwrap();
        let json = plan_from_spec(&plain, "ring", 0, 1).to_json();
        assert!(!json.contains("fused") && !json.contains("host"), "{json}");
    }

    #[test]
    fn runtime_groups_load_every_handler_into_one_interpreter() {
        let py = "\
name: p
functions:
  upper:   { runtime: python, handler: \"text:upper\" }
  exclaim: { runtime: python, handler: \"bang:exclaim\" }
routes:
  - { http: POST /hello, sequence: [upper, exclaim] }
fuse: [[upper, exclaim]]
";
        let s = parse(Path::new("/srv/c.yaml"), py).unwrap();
        assert_eq!(
            s.functions[0].command,
            [
                "python3",
                "-m",
                "zerohop",
                "--path",
                "/srv",
                "upper=text:upper",
                "exclaim=bang:exclaim"
            ]
        );
        let node = py
            .replace(
                "runtime: python, handler: \"text:upper\"",
                "runtime: node, handler: up.js",
            )
            .replace(
                "runtime: python, handler: \"bang:exclaim\"",
                "runtime: node, handler: \"bang.js:exclaim\"",
            );
        let s = parse(Path::new("/srv/c.yaml"), &node).unwrap();
        assert_eq!(
            s.functions[0].command,
            [
                "node",
                "-e",
                NODE_FUSED_LOADER,
                "upper",
                "/srv/up.js",
                "",
                "exclaim",
                "/srv/bang.js",
                "exclaim"
            ]
        );
        let mixed = node.replace(
            "runtime: node, handler: up.js",
            "runtime: python, handler: \"t:u\"",
        );
        assert!(
            err(&mixed)
                .starts_with("c.yaml:7: fuse[0][1]: `exclaim` runs another program (runtime node"),
            "{}",
            err(&mixed)
        );
    }

    #[test]
    fn groups_that_are_not_one_program_domain_or_confinement_are_refused() {
        let cases: &[(&str, &str, &str)] = &[
            ("  - [upper, exclaim]", "  - [upper]", "c.yaml:12: fuse[0]: a fused group is a list of two or more"),
            ("  - [upper, exclaim]", "  - [upper, shout]", "c.yaml:12: fuse[0][1]: unknown function `shout`; known functions: upper, exclaim, audit"),
            ("  - [upper, exclaim]", "  - [upper, upper]", "c.yaml:12: fuse[0][1]: `upper` is listed twice"),
            ("  - [upper, exclaim]", "  - [upper, exclaim]\n  - [exclaim, audit]", "c.yaml:13: fuse[1][0]: `exclaim` is already fused in fuse[0]"),
            ("fuse:\n  - [upper, exclaim]", "fuse: upper", "c.yaml:11: fuse: expected a list"),
            // Another program.
            ("exclaim: { command: [bin/hello-fused] }", "exclaim: { command: [bin/exclaim] }", "c.yaml:12: fuse[0][1]: `exclaim` runs another program (command [\"bin/exclaim\"]) than `upper` (command [\"bin/hello-fused\"])"),
            // The group scales as one.
            ("exclaim: { command: [bin/hello-fused] }", "exclaim: { command: [bin/hello-fused], instances: 3 }", "c.yaml:4: functions.exclaim.instances: `exclaim` runs in the instances of `upper`"),
            ("exclaim: { command: [bin/hello-fused] }", "exclaim: { command: [bin/hello-fused], scale: { max: 4 } }", "c.yaml:4: functions.exclaim.scale: `exclaim` runs in the instances of `upper`"),
            // One confinement.
            ("exclaim: { command: [bin/hello-fused] }", "exclaim: { command: [bin/hello-fused], syscalls: [ptrace] }", "c.yaml:4: functions.exclaim.syscalls: `exclaim` is fused with `upper` (fuse[0]) but its `syscalls` differs"),
            ("exclaim: { command: [bin/hello-fused] }", "exclaim: { command: [bin/hello-fused], env: { A: b } }", "c.yaml:4: functions.exclaim.env: `exclaim` is fused with `upper` (fuse[0]) but its `env` differs"),
            // One security domain: a route that runs a part of the group, or runs it out of order.
            ("    sequence: [upper, exclaim]\n", "    sequence: [upper, exclaim]\n  - http: POST /shout\n    sequence: [exclaim]\n", "c.yaml:9: routes[1].sequence: runs `exclaim` at step 1 without the rest of its fused group in order ([upper, exclaim], fuse[0]); a fused group is one security domain"),
            ("[audit, upper, exclaim, audit]", "[audit, upper, audit, exclaim]", "c.yaml:9: routes[1].sequence: runs `upper` at step 2 without the rest"),
            ("[audit, upper, exclaim, audit]", "[audit, exclaim, upper]", "c.yaml:9: routes[1].sequence: runs `exclaim` at step 2"),
            // Dynamic routing and calls.
            ("exclaim: { command: [bin/hello-fused] }", "exclaim: { command: [bin/hello-fused], next: [audit] }", "c.yaml:4: functions.exclaim.next: `exclaim` is fused (fuse[0]); fused functions run one after the other along their routes; dynamic routing (`next`), calls and fan-outs are not supported"),
            ("audit:   { command: [bin/audit] }", "audit:   { command: [bin/audit], calls: [exclaim] }", "c.yaml:12: fuse[0][1]: `audit` calls `exclaim`; fused functions"),
            ("audit:   { command: [bin/audit] }", "audit:   { command: [bin/audit], next: [upper] }", "c.yaml:12: fuse[0][0]: `audit` forwards to `upper`"),
        ];
        for (from, to, want) in cases {
            assert!(FUSED.contains(from), "{from}");
            let e = err(&FUSED.replace(from, to));
            assert!(e.starts_with(want), "{to}:\n got {e}\nwant {want}");
        }
    }
}
