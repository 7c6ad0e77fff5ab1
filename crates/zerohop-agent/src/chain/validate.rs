//! Stage 1 of bringing a chain up: what the spec and the options make of it, checked before
//! anything is made (programs found, transport and gateway threads resolved, the plan
//! derived, the chain's size within what a chain can number).

use std::path::{Path, PathBuf};

use zerohop_transport::Backend;
use zerohop_transport::Plan;

use super::{AgentError, UpOptions};
use crate::spec::{plan_from_spec, ChainSpec, SpecError, MAX_GATEWAY_THREADS, MAX_PARTIES};

/// What [`validate`] found: everything later stages need from the spec and the options.
pub(super) struct Validated {
    /// Each function's program, in spec order.
    pub paths: Vec<PathBuf>,
    /// The transport.
    pub backend: Backend,
    /// The gateway's threads (= its parties, 0..).
    pub gateway_threads: u16,
    /// The plan every party is told.
    pub plan: Plan,
}

/// Checks `spec` against this host and `opts` and derives its plan.
pub(super) fn validate(spec: &ChainSpec, opts: &UpOptions) -> Result<Validated, AgentError> {
    let mut paths = Vec::new();
    for f in &spec.functions {
        paths.push(check_program(spec, f)?);
    }
    let spec_error = |field: &str, message: String| {
        AgentError::Spec(SpecError {
            file: spec.file.display().to_string(),
            line: 1,
            field: field.into(),
            message,
        })
    };
    let backend = match opts.transport {
        Some(b) => b,
        None => spec
            .transport
            .parse()
            .map_err(|message| spec_error("transport", message))?,
    };
    let spin_us = opts
        .spin_us
        .unwrap_or(zerohop_transport::Options::default().spin_us);
    if !spec.cpus.is_empty() {
        usable_cpus(&spec.cpus, &allowed_cpus()).map_err(|m| spec_error("cpus", m))?;
    }
    // With `cpus`, one gateway thread per core of the chain unless told otherwise.
    let auto = || match spec.cpus.len() {
        0 => auto_gateway_threads(),
        n => n.min(MAX_GATEWAY_THREADS.into()) as u16,
    };
    let gateway_threads = opts
        .gateway_threads
        .or(spec.gateway_threads)
        .unwrap_or_else(auto)
        .clamp(1, MAX_GATEWAY_THREADS);
    let instances: usize = spec.functions.iter().map(crate::spec::reserved).sum();
    if usize::from(gateway_threads) + instances > MAX_PARTIES {
        return Err(spec_error(
            "gateway_threads",
            format!(
                "{gateway_threads} gateway threads and {instances} instances exceed the \
                 {MAX_PARTIES} parties of a chain; set gateway_threads lower"
            ),
        ));
    }
    let plan = plan_from_spec(spec, backend.name(), spin_us, gateway_threads);
    // One pool per security domain, numbered in disjoint slot ranges.
    let domains = plan.domains().len();
    let per_domain = u64::from(plan.pool.slots) + u64::from(plan.pool.large_slots);
    if per_domain * domains as u64 > 1 << 24 {
        return Err(spec_error(
            "pool.slots",
            format!(
                "{} slots ({} small, {} large) in each of the chain's {} security domains \
                 exceed the 16777216 slots a chain can number; lower pool.slots",
                per_domain, plan.pool.slots, plan.pool.large_slots, domains
            ),
        ));
    }
    Ok(Validated {
        paths,
        backend,
        gateway_threads,
        plan,
    })
}

/// The gateway threads a chain gets when the spec says `auto`: one per core the agent may
/// run on, at most [`MAX_GATEWAY_THREADS`].
pub fn auto_gateway_threads() -> u16 {
    std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(MAX_GATEWAY_THREADS.into()) as u16
}

/// The CPUs this agent may run on (and so its instances): its affinity mask.
fn allowed_cpus() -> Vec<u16> {
    use nix::sched::{sched_getaffinity, CpuSet};
    match sched_getaffinity(nix::unistd::Pid::from_raw(0)) {
        Ok(set) => (0..CpuSet::count().min(usize::from(crate::spec::cpus::MAX_CPU) + 1))
            .filter(|&c| set.is_set(c).unwrap_or(false))
            .map(|c| c as u16)
            .collect(),
        // Cannot tell: let the kernel refuse a CPU later, naming it.
        Err(_) => (0..=crate::spec::cpus::MAX_CPU).collect(),
    }
}

/// Whether a chain's `cpus` are all among the `allowed` ones, else which are not, in a
/// message that says what to do.
fn usable_cpus(cpus: &[u16], allowed: &[u16]) -> Result<(), String> {
    let outside: Vec<u16> = cpus
        .iter()
        .copied()
        .filter(|c| allowed.binary_search(c).is_err())
        .collect();
    if outside.is_empty() {
        return Ok(());
    }
    use crate::spec::cpus::format_list;
    Err(format!(
        "CPU {} {} not among the CPUs this agent may run on ({}); name CPUs from that list",
        format_list(&outside),
        if outside.len() == 1 { "is" } else { "are" },
        format_list(allowed),
    ))
}

/// Finds a function's program before anything is started: a path with a `/` as given, a
/// bare name in the agent's `PATH`.
pub(crate) fn check_program(
    spec: &ChainSpec,
    f: &crate::spec::FunctionSpec,
) -> Result<std::path::PathBuf, SpecError> {
    if f.command.get(1).map(String::as_str) == Some("-e")
        && f.command.get(2).map(String::as_str) == Some(crate::spec::NODE_LOADER)
    {
        // `runtime: node`: the handler file too.
        let file = &f.command[3];
        if !Path::new(file).is_file() {
            return Err(SpecError {
                file: spec.file.display().to_string(),
                line: f.line,
                field: format!("functions.{}.handler", f.name),
                message: format!(
                    "`{file}` not found (relative paths are resolved against the spec's folder)"
                ),
            });
        }
    }
    let prog = &f.command[0];
    let found = if prog.contains('/') {
        Some(Path::new(prog).to_owned()).filter(|p| p.is_file())
    } else {
        std::env::var_os("PATH").and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|d| d.join(prog))
                .find(|p| p.is_file())
        })
    };
    if let Some(path) = found {
        return Ok(path);
    }
    Err(SpecError {
        file: spec.file.display().to_string(),
        line: f.line,
        field: format!("functions.{}.command", f.name),
        message: format!(
            "program `{prog}` not found; build it first (e.g. `cargo build --release`) or fix the path (relative paths are resolved against the spec's folder)"
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::usable_cpus;

    #[test]
    fn a_chain_may_only_name_cpus_the_agent_runs_on() {
        assert_eq!(usable_cpus(&[0, 1], &[0, 1, 2, 3]), Ok(()));
        assert_eq!(
            usable_cpus(&[1, 4], &[0, 1, 2, 3]).unwrap_err(),
            "CPU 4 is not among the CPUs this agent may run on (0-3); name CPUs from that list"
        );
        assert!(usable_cpus(&[4, 5, 7], &[0, 1])
            .unwrap_err()
            .starts_with("CPU 4-5,7 are not among"));
    }
}
