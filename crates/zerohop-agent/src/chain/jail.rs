//! Stage 2 of bringing a chain up: its jail (uid, cgroup, reaper, spawner, data folder) and
//! each function's program, opened once ([`crate::confine`]).

use std::path::{Path, PathBuf};

use super::{AgentError, UpOptions};
use crate::confine::{Jail, KeptData, Program};
use crate::spec::ChainSpec;

/// The jail of `spec`'s chain, with the data folder `kept` from a chain it replaces, and
/// its programs (`paths`, in spec order) opened for it.
pub(super) fn confine(
    spec: &ChainSpec,
    opts: &UpOptions,
    kept: Option<KeptData>,
    paths: &[PathBuf],
) -> Result<(Jail, Vec<Program>), AgentError> {
    let data_path = spec.data.as_ref().map(|d| match d {
        crate::spec::DataSpec::At(p) => p.clone(),
        crate::spec::DataSpec::Default => crate::confine::data::default_dir(
            &spec.name,
            nix::unistd::geteuid().is_root(),
            std::env::var_os("XDG_DATA_HOME").as_deref().map(Path::new),
            std::env::var_os("HOME").as_deref().map(Path::new),
        ),
    });
    let jail = Jail::new(
        &spec.name,
        opts.uid_range,
        opts.cgroups,
        data_path.as_deref(),
        kept,
    )
    .map_err(AgentError::Confine)?;
    let programs = spec
        .functions
        .iter()
        .zip(paths)
        .map(|(f, path)| {
            Program::open(path, &f.syscalls, &jail).map_err(|source| AgentError::Program {
                function: f.name.clone(),
                source,
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok((jail, programs))
}
