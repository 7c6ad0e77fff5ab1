//! zerohop on Kubernetes.
//!
//! The API server stores what should run, a controller decides where, and the zerohop daemon
//! on each node makes it so:
//!
//! - [`resources`]: the `zerohop.dev/v1alpha1` kinds: `Chain` (a chain spec plus replicas and
//!   placement, written by users) and `ChainPart` (one replica, or one part of a split
//!   replica, placed on one node by the controller).
//! - [`placement`]: where parts go, as a pure function of nodes and existing parts.
//! - [`controller`]: `zerohop controller`, which places parts, moves them off lost nodes,
//!   publishes each Chain's Service and EndpointSlices and reports status and events.
//! - `desired`: what the controller decides besides placement (node eligibility, each
//!   part's spec and why one goes, the Chain's conditions and status, its Service's
//!   endpoints, which events to raise), as pure functions of what it read.
//! - [`node`]: the node daemon's side, `zerohop agent --kube-node NODE`: heartbeat, running
//!   the parts placed on its node as `zerohop apply` does, their status.
//!
//! No `unsafe`: this crate only talks to the API server and to the daemon's own API.
//! The manifests that install it are in `deploy/kubernetes/`; `docs/kubernetes.md` is the
//! user's guide.

#![forbid(unsafe_code)]

pub mod controller;
mod desired;
pub mod node;
pub mod placement;
pub mod resources;

/// A client of the API server: from `kubeconfig` when given, else as kubectl finds one
/// (`$KUBECONFIG`, `~/.kube/config`) or, in a pod, from its service account.
pub async fn client(kubeconfig: Option<&std::path::Path>) -> Result<kube::Client, String> {
    let config = match kubeconfig {
        Some(path) => {
            let file = kube::config::Kubeconfig::read_from(path)
                .map_err(|e| format!("cannot read the kubeconfig {}: {e}", path.display()))?;
            kube::Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|e| format!("the kubeconfig {}: {e}", path.display()))?
        }
        None => kube::Config::infer()
            .await
            .map_err(|e| format!("no Kubernetes API server found ({e}); pass --kubeconfig FILE"))?,
    };
    kube::Client::try_from(config).map_err(|e| format!("cannot make a Kubernetes client: {e}"))
}
