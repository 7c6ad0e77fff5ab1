//! How the daemon runs ([`DaemonOptions`]), how it reaches peer daemons ([`PeerOptions`]),
//! and where its admin socket is when none is given ([`default_socket`]).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::{CgroupMode, UidRange};

/// How the daemon runs.
#[derive(Clone, Debug)]
pub struct DaemonOptions {
    /// The admin socket.
    pub socket: PathBuf,
    /// Where Prometheus metrics are served (`None`: nowhere).
    pub metrics: Option<SocketAddr>,
    /// Uids chains may run under when the daemon is root (one per chain).
    pub uid_range: UidRange,
    /// Which cgroup hierarchy instances are put in.
    pub cgroups: CgroupMode,
    /// Where peer daemons reach this one, and the secret they share (chains split over
    /// nodes); `None`: no hops to or from other nodes.
    pub peer: Option<PeerOptions>,
}

/// How daemons of a cluster reach each other (see [`zerohop_link`]).
#[derive(Clone, Debug)]
pub struct PeerOptions {
    /// The address peer daemons connect to.
    pub listen: SocketAddr,
    /// What they authenticate each other with.
    pub secret: Arc<zerohop_link::Secret>,
}

/// The admin socket when none is given: `/run/zerohop/admin.sock` as root, else
/// `$XDG_RUNTIME_DIR/zerohop/admin.sock`, else `/tmp/zerohop-UID/admin.sock`. Anyone can make
/// `/tmp/zerohop-UID` first, so its folder is never trusted for its name: the daemon and the
/// CLI check who owns it and who may write it ([`admin::socket`](super::admin::socket)).
pub fn default_socket() -> PathBuf {
    if nix::unistd::geteuid().is_root() {
        return PathBuf::from("/run/zerohop/admin.sock");
    }
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(d) if !d.is_empty() => Path::new(&d).join("zerohop/admin.sock"),
        _ => PathBuf::from(format!(
            "/tmp/zerohop-{}/admin.sock",
            nix::unistd::geteuid()
        )),
    }
}
