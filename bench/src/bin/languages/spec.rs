//! The spec of one language's chain: K pass-through functions of that language and the two
//! routes of the same shape, `/one` and `/chain`.

use std::fmt::Write as _;

use anyhow::Result;
use zerohop_bench::systems::FUNCTION_ENV;

use crate::language::Language;
use crate::prepare::Function;

/// Gateway threads of every chain.
pub(crate) const GATEWAY_THREADS: usize = 1;

pub(crate) fn spec(language: Language, f: &Function, k: usize) -> Result<String> {
    let q = |s: &str| serde_json::to_string(s);
    let command = f
        .command
        .iter()
        .map(|c| q(c))
        .collect::<Result<Vec<_>, _>>()?
        .join(", ");
    let mut s = format!(
        "name: lang-{}\ngateway_threads: {GATEWAY_THREADS}\ntimeout: 10s\nfunctions:\n",
        language.name()
    );
    let names: Vec<String> = (1..=k).map(|i| format!("p{i}")).collect();
    for name in &names {
        let mut env = format!("{FUNCTION_ENV}: {}", q(name)?);
        for (key, value) in &f.env {
            let _ = write!(env, ", {key}: {}", q(value)?);
        }
        let _ = writeln!(s, "  {name}: {{ command: [{command}], env: {{ {env} }} }}");
    }
    let _ = writeln!(
        s,
        "routes:\n  - http: POST /one\n    sequence: [p1]\n  - http: POST /chain\n    \
         sequence: [{}]",
        names.join(", ")
    );
    Ok(s)
}
