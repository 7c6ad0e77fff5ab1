//! The chain spec parser on arbitrary text.
//!
//! A spec is written by the chain's author, but `zerohop check`/`up` read whatever file they
//! are given. On error, the message must name the file and a line of it (`docs/spec.md`: every
//! error names the file, the line, the field and what to do); on success, the spec must be one
//! the agent can run: the invariants `plan_from_spec` and the transports rely on hold.

#![no_main]

use std::collections::HashSet;
use std::path::Path;
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use zerohop_pool::{META_RESERVE, SLOT_HEADER_LEN};
use zerohop_spec::{self as spec, MAX_CONCURRENCY, MAX_FUNCTIONS, MAX_INSTANCES};
use zerohop_transport::{Plan, PlanExt, GATEWAY_FN};

const FILE: &str = "fuzz.yaml";

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match spec::parse(Path::new(FILE), text) {
        Err(e) => {
            let shown = e.to_string();
            assert!(
                shown.starts_with("fuzz.yaml:"),
                "error does not name the file: {shown}"
            );
            assert_eq!(e.file, FILE);
            // An error at the end of the text is on the line after the last one (the unit
            // tests of `spec` hold the parser to the same bound).
            let lines = yaml_lines(text);
            assert!(
                e.line >= 1 && e.line <= lines + 1,
                "line {} of a {lines}-line spec: {shown}",
                e.line
            );
            // An empty key once gave an empty field (`"":`, corpus/spec/empty-top-level-key.yaml);
            // empty keys are named `""` now (the unit tests of `spec` check the nested ones).
            assert!(!e.field.is_empty(), "no field: {shown}");
            assert!(!e.message.is_empty(), "no message: {shown}");
        }
        Ok(s) => check_spec(&s),
    }
});

/// Lines of `text` as YAML counts them: a line break is CR LF, LF or a lone CR (YAML 1.2,
/// 5.4), where `str::lines` knows only LF.
fn yaml_lines(text: &str) -> usize {
    let b = text.as_bytes();
    let is_break = |i: usize| b[i] == b'\n' || (b[i] == b'\r' && b.get(i + 1) != Some(&b'\n'));
    let breaks = (0..b.len()).filter(|&i| is_break(i)).count();
    let unterminated = !b.is_empty() && !is_break(b.len() - 1);
    breaks + usize::from(unterminated)
}

fn check_spec(s: &spec::ChainSpec) {
    assert!(
        !s.name.is_empty() && s.name.len() <= 64,
        "name {:?}",
        s.name
    );
    assert!(["ring", "socket"].contains(&s.transport.as_str()));
    assert!(s.pool.slots >= 1 && s.pool.slots <= 1 << 24);
    let min_slot = (SLOT_HEADER_LEN + META_RESERVE + 64) as u32;
    assert!(s.pool.slot_size >= min_slot && s.pool.slot_size.is_multiple_of(64));
    // A body past a small slot goes into a large one: then the chain has large slots, each
    // holding max_body with the slot header and the metadata reserve, in whole pages.
    assert!(s.max_body <= 3 << 30, "max_body {} over 3 GiB", s.max_body);
    let reserve = (SLOT_HEADER_LEN + META_RESERVE) as u64;
    if s.max_body > u64::from(s.pool.slot_size) - reserve {
        let (slots, size) = s.pool.large(s.max_body);
        assert!(
            (1..=1024).contains(&slots),
            "max_body {} past a slot of {} with {slots} large slots",
            s.max_body,
            s.pool.slot_size
        );
        assert!(
            u64::from(size) >= s.max_body + reserve && size.is_multiple_of(4096),
            "a large slot of {size} bytes for max_body {}",
            s.max_body
        );
    }
    assert!(s.timeout >= Duration::from_millis(10) && s.timeout <= Duration::from_secs(3600));

    assert!(!s.functions.is_empty() && s.functions.len() <= MAX_FUNCTIONS);
    let names: Vec<&str> = s.functions.iter().map(|f| f.name.as_str()).collect();
    let unique: HashSet<&str> = names.iter().copied().collect();
    assert_eq!(
        unique.len(),
        names.len(),
        "function names repeat: {names:?}"
    );
    for f in &s.functions {
        assert!(!f.command.is_empty() && !f.command[0].is_empty());
        assert!((1..=MAX_INSTANCES).contains(&f.instances));
        assert!((1..=MAX_CONCURRENCY).contains(&f.concurrency));
        for n in &f.next {
            assert!(unique.contains(n.as_str()), "next names unknown `{n}`");
        }
        for h in &f.headers {
            assert_eq!(*h, h.to_ascii_lowercase(), "header names are lower case");
        }
        for (k, _) in &f.env {
            assert!(!k.is_empty() && !k.contains('=') && !k.starts_with("ZEROHOP_"));
        }
    }
    let parties: usize = 1 + s
        .functions
        .iter()
        .map(|f| f.instances as usize)
        .sum::<usize>();
    assert!(parties <= 1024);

    assert!(!s.routes.is_empty());
    let mut seen = HashSet::new();
    for r in &s.routes {
        assert!(
            !r.sequence.is_empty() && r.sequence.len() <= 255,
            "sequence of {} functions",
            r.sequence.len()
        );
        for f in &r.sequence {
            assert!(unique.contains(f.as_str()), "sequence names unknown `{f}`");
        }
        assert!(r.path.starts_with('/') && !r.path.contains(char::is_whitespace));
        assert!(!r.method.is_empty() && r.method.bytes().all(|b| b.is_ascii_uppercase()));
        assert!(
            seen.insert((r.method.as_str(), r.path.as_str())),
            "{} {} routed twice",
            r.method,
            r.path
        );
    }

    // What the agent does next: the plan every party gets, and the policy from it.
    let plan = spec::plan_from_spec(s, "ring", 20, s.gateway_threads.unwrap_or(2));
    check_plan(s, &plan);
}

fn check_plan(s: &spec::ChainSpec, plan: &Plan) {
    assert_eq!(plan.functions.len(), s.functions.len());
    assert_eq!(plan.routes.len(), s.routes.len());
    for (f, fs) in plan.functions.iter().zip(&s.functions) {
        assert_eq!(f.name, fs.name);
        let i = plan
            .function_index(&f.name)
            .expect("every function has an index");
        assert_eq!(plan.function_name(i), f.name);
    }
    for (r, rs) in plan.routes.iter().zip(&s.routes) {
        assert_eq!(r.sequence.len(), rs.sequence.len());
        for (&i, name) in r.sequence.iter().zip(&rs.sequence) {
            assert_eq!(plan.function_name(i), name, "sequence index {i}");
            assert!(
                !plan.parties_of(i).is_empty(),
                "function `{name}` of a route has no instance"
            );
        }
    }
    let gateways = usize::from(plan.gateways());
    assert_eq!(gateways, usize::from(s.gateway_threads.unwrap_or(2)));
    assert!(plan.party_function[..gateways]
        .iter()
        .all(|&f| f == GATEWAY_FN));
    assert!(plan.party_function[gateways..]
        .iter()
        .all(|&f| (f as usize) < plan.functions.len()));
    // Each gateway party gets back exactly the answers to the requests it numbered.
    for g in 0..gateways as u16 {
        for k in [0, 1, 7, u32::MAX / 3, u32::MAX - 1, u32::MAX] {
            let id = plan.request_id(g, k);
            assert_ne!(id, 0);
            assert_eq!(plan.gateway_of(id), g, "request {id} of gateway {g}");
        }
    }
    let policy = match plan.policy() {
        Ok(p) => p,
        Err(e) => panic!("a valid spec gives a plan whose policy fails: {e}"),
    };
    // The gateway reaches every route's head, and every function of a route reaches the next
    // one and the gateway.
    for r in &plan.routes {
        let mut prev = GATEWAY_FN;
        for &f in &r.sequence {
            assert!(policy.allows(prev, f), "no edge {prev} -> {f}");
            assert!(policy.allows(f, GATEWAY_FN), "{f} cannot answer");
            prev = f;
        }
    }
    assert_eq!(Plan::from_json(&plan.to_json()).ok().as_ref(), Some(plan));
}
