//! Part of wiring a chain: its deferred requests (async invocations, retries, the dead-letter
//! queue; see [`zerohop_gateway::Deferred`]) and the folder they are kept in.
//!
//! The folder is the agent's, never the functions' (a function must not forge or read other
//! requests' results): `$ZEROHOP_STATE_DIR/CHAIN/async` when that variable is set (the daemon
//! and `zerohop up` read their own environment), else `/var/lib/zerohop/state/CHAIN/async`
//! as root and `$XDG_STATE_HOME/zerohop/CHAIN/async` (`~/.local/state/...`) otherwise.
//! The chain's `data` folder is not used: it belongs to the chain's uid.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use zerohop_gateway::{Deferred, Gateways};

use super::AgentError;
use crate::spec::ChainSpec;

/// The environment variable that moves every chain's async folder.
pub const STATE_DIR_ENV: &str = "ZEROHOP_STATE_DIR";

/// Where chain `chain` keeps its deferred requests; `env`: `$ZEROHOP_STATE_DIR`, `root`: the
/// agent runs as root, `xdg` and `home`: `$XDG_STATE_HOME` and `$HOME`.
pub fn async_dir(
    chain: &str,
    env: Option<&Path>,
    root: bool,
    xdg: Option<&Path>,
    home: Option<&Path>,
) -> PathBuf {
    let base = match (env.filter(|p| p.is_absolute()), root) {
        (Some(e), _) => e.to_owned(),
        (None, true) => PathBuf::from("/var/lib/zerohop/state"),
        (None, false) => match (xdg.filter(|p| p.is_absolute()), home) {
            (Some(x), _) => x.join("zerohop"),
            (None, Some(h)) => h.join(".local/state/zerohop"),
            (None, None) => PathBuf::from(format!("/tmp/zerohop-{}/state", nix::unistd::geteuid())),
        },
    };
    base.join(chain).join("async")
}

/// Opens `spec`'s folder of deferred requests (what a previous run left is queued again or
/// kept) and gives it to `gateways`; [`start`] runs them. `None` when the folder cannot be
/// used and no route needs it (`Prefer: respond-async` is then answered synchronously).
pub(super) fn open(
    spec: &ChainSpec,
    gateways: &Gateways,
) -> Result<Option<Arc<Deferred>>, AgentError> {
    let env = std::env::var_os(STATE_DIR_ENV);
    let xdg = std::env::var_os("XDG_STATE_HOME");
    let home = std::env::var_os("HOME");
    let dir = async_dir(
        &spec.name,
        env.as_deref().map(Path::new),
        nix::unistd::geteuid().is_root(),
        xdg.as_deref().map(Path::new),
        home.as_deref().map(Path::new),
    );
    let deferred = match Deferred::open(&dir, &spec.routes) {
        Ok(d) => d,
        // Only an `async: true` route needs the folder to start; elsewhere `Prefer:
        // respond-async` is a preference, and the chain answers at once instead (an agent run
        // as another user than its $HOME's, say).
        Err(e) if !spec.routes.iter().any(|r| r.delivery.is_async) => {
            tracing::warn!(
                chain = %spec.name,
                "async requests are answered synchronously: {e}; set {STATE_DIR_ENV} to a \
                 folder this agent may write"
            );
            return Ok(None);
        }
        Err(e) => return Err(e.into()),
    };
    let left = deferred.pending();
    if left > 0 {
        tracing::info!(chain = %spec.name, dir = %dir.display(), "{left} async requests left by the last run are queued again");
    }
    deferred.attach(gateways);
    Ok(Some(deferred))
}

/// Starts running the deferred requests of the chain of `gateways` (its instances are ready).
pub(super) fn start(gateways: &Gateways) {
    if let Some(d) = gateways.iter().next().and_then(|g| g.deferred()) {
        d.start();
    }
}

/// Stops running them (the chain goes down): what runs stays queued for the next start.
pub(super) fn stop(gateways: &Gateways) {
    if let Some(d) = gateways.iter().next().and_then(|g| g.deferred()) {
        d.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn async_dir_table() {
        let p = |s: &str| Some(PathBuf::from(s));
        for (env, root, xdg, home, want) in [
            (p("/srv/zh"), true, None, None, "/srv/zh/c/async"),
            (p("/srv/zh"), false, p("/x"), p("/h"), "/srv/zh/c/async"),
            (
                p("relative"),
                true,
                None,
                None,
                "/var/lib/zerohop/state/c/async",
            ),
            (
                None,
                true,
                p("/x"),
                p("/h"),
                "/var/lib/zerohop/state/c/async",
            ),
            (None, false, p("/x"), p("/h"), "/x/zerohop/c/async"),
            (
                None,
                false,
                p("rel"),
                p("/h"),
                "/h/.local/state/zerohop/c/async",
            ),
            (
                None,
                false,
                None,
                p("/h"),
                "/h/.local/state/zerohop/c/async",
            ),
        ] {
            let got = async_dir("c", env.as_deref(), root, xdg.as_deref(), home.as_deref());
            assert_eq!(got, PathBuf::from(want), "{env:?} {root} {xdg:?} {home:?}");
        }
    }
}
