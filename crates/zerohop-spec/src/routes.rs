//! The `routes` section and the triggers it names: HTTP, MQTT (with the `mqtt` section),
//! CoAP (with the `coap` section), static fan-outs.

use std::collections::HashSet;
use std::net::SocketAddr;

use saphyr::{MarkedYaml, YamlData};

use crate::paths;
use crate::plan::JoinPolicy;
use crate::yaml::{get, line, Cx, Map};
use crate::*;

impl Cx {
    pub(crate) fn routes(
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
        let mut ambiguity = paths::Ambiguity::default();
        let mut out = Vec::new();
        for (i, r) in list.iter().enumerate() {
            let p = format!("routes[{i}].");
            let m = self.mapping(r, &format!("routes[{i}]"))?;
            self.only_known(
                &m,
                &p,
                &[
                    "http",
                    "grpc",
                    "mqtt",
                    "mqtt_reply",
                    "coap",
                    "content_type",
                    "auth",
                    "rate_limit",
                    "async",
                    "retry",
                    "idempotent",
                    "sequence",
                ],
            )?;
            let (mut method, mut path) = (String::new(), String::new());
            if let Some(http) = get(&m, "http") {
                let text = self.string(http, &format!("{p}http"))?;
                let (mt, pt) = text.split_once(' ').unwrap_or((&text, ""));
                let (mt, pt) = (mt.trim(), pt.trim());
                let method_ok =
                    !mt.is_empty() && mt.bytes().all(|b| b.is_ascii_uppercase()) && mt.len() <= 16;
                if !method_ok || !pt.starts_with('/') {
                    return Err(self.err(
                        line(http),
                        &format!("{p}http"),
                        format!(
                            "`{text}` is not `METHOD /path`; write e.g. `POST /hello`, \
                             `GET /product/{{id}}` or `GET /static/*`"
                        ),
                    ));
                }
                let pattern = paths::pattern(pt).map_err(|why| {
                    self.err(
                        line(http),
                        &format!("{p}http"),
                        format!("`{pt}` is not a route path: {why}"),
                    )
                })?;
                if let Err((earlier, why)) = ambiguity.add(mt, &pattern, i) {
                    return Err(self.err(
                        line(http),
                        &format!("{p}http"),
                        format!("{why} (routes[{earlier}])"),
                    ));
                }
                (method, path) = (mt.to_owned(), pattern);
            }
            let mut grpc = String::new();
            if let Some(n) = get(&m, "grpc") {
                grpc = self.string(n, &format!("{p}grpc"))?;
                if !path.is_empty() {
                    return Err(self.err(
                        line(n),
                        &format!("{p}grpc"),
                        "a route has `http` or `grpc`, not both (a gRPC method is the HTTP \
                         route `POST /package.Service/Method`)",
                    ));
                }
                if let Err(why) = check_grpc_method(&grpc) {
                    return Err(self.err(
                        line(n),
                        &format!("{p}grpc"),
                        format!(
                            "`{grpc}` is not a gRPC method: {why}; write e.g. \
                             `helloworld.Greeter/SayHello`"
                        ),
                    ));
                }
                if !seen.insert(("grpc", grpc.clone())) {
                    return Err(self.err(
                        line(n),
                        &format!("{p}grpc"),
                        format!("gRPC method `{grpc}` is already routed by an earlier route"),
                    ));
                }
                // Underneath, an HTTP route: it must not clash with an `http` one.
                let pattern = format!("/{grpc}");
                if let Err((earlier, why)) = ambiguity.add("POST", &pattern, i) {
                    return Err(self.err(
                        line(n),
                        &format!("{p}grpc"),
                        format!("{why} (routes[{earlier}])"),
                    ));
                }
                (method, path) = ("POST".to_owned(), pattern);
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
            let mut content_type = String::new();
            if let Some(n) = get(&m, "content_type") {
                content_type = self.string(n, &format!("{p}content_type"))?;
                let ok = content_type.contains('/')
                    && content_type.len() <= 256
                    && content_type
                        .bytes()
                        .all(|b| b == b'\t' || (b' '..=b'~').contains(&b));
                if !ok {
                    return Err(self.err(
                        line(n),
                        &format!("{p}content_type"),
                        format!(
                            "`{content_type}` is not a media type; write e.g. `application/json` \
                             or `text/html; charset=utf-8`"
                        ),
                    ));
                }
                if path.is_empty() || !grpc.is_empty() {
                    return Err(self.err(
                        line(n),
                        &format!("{p}content_type"),
                        "only HTTP answers carry a content type (gRPC's is `application/grpc`); \
                         this route has no `http`",
                    ));
                }
            }
            let auth = get(&m, "auth").map(|n| self.auth(n, &p)).transpose()?;
            let rate_limit = get(&m, "rate_limit")
                .map(|n| self.rate_limit(n, &p))
                .transpose()?;
            if path.is_empty() {
                for (field, set) in [
                    ("auth", auth.is_some()),
                    ("rate_limit", rate_limit.is_some()),
                ] {
                    if set {
                        return Err(self.err(
                            line(r),
                            &format!("{p}{field}"),
                            "only HTTP routes take it (MQTT and CoAP have their own ways: see \
                             docs/spec.md); this route has no `http`",
                        ));
                    }
                }
            }
            let delivery = self.delivery(&m, r, &p, !path.is_empty(), !grpc.is_empty())?;
            if path.is_empty() && mqtt.is_empty() && coap.is_empty() {
                return Err(self.err(
                    line(r),
                    &format!("routes[{i}]"),
                    "a route needs a way in: `http: METHOD /path`, `grpc: package.Service/Method`, \
                     `mqtt: topic/filter` or `coap: /path`",
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
                grpc,
                mqtt,
                mqtt_reply,
                coap,
                content_type,
                auth,
                rate_limit,
                delivery,
                sequence,
                relay_of: None,
            });
        }
        Ok(out)
    }
}

impl Cx {
    /// The top-level `mqtt` section, checked against the routes that use it.
    pub(crate) fn mqtt(
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
    pub(crate) fn coap(
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
    pub(crate) fn address(&self, n: &MarkedYaml<'_>, field: &str) -> Result<SocketAddr, SpecError> {
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
    pub(crate) fn fan_out(
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

/// Checks a gRPC method name, `package.Service/Method`: a dotted package and service (each
/// part a protobuf identifier), a `/`, a method name; at most 255 bytes.
pub fn check_grpc_method(m: &str) -> Result<(), &'static str> {
    let ident = |s: &str| {
        s.bytes()
            .next()
            .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
            && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
    };
    let Some((service, method)) = m.split_once('/') else {
        return Err("it has no `/` between the service and the method");
    };
    if m.len() > 255 {
        return Err("it is longer than 255 bytes");
    }
    if !service.contains('.') {
        return Err("the service has no package (`package.Service`)");
    }
    if !service.split('.').all(ident) {
        return Err("the package and service are dotted identifiers (letters, digits, `_`)");
    }
    if !ident(method) {
        return Err("the method is one identifier (letters, digits, `_`)");
    }
    Ok(())
}

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

pub(crate) fn http_header_name_invalid(h: &str) -> bool {
    h.is_empty()
        || !h
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}
