//! `boutique-fn SERVICE`: one service of the boutique as a zerohop function (started by
//! `zerohop up apps/boutique/chain.yaml`). The service is the first argument, or
//! `BOUTIQUE_SERVICE` without one.

use zerohop_app_boutique::deploy::zerohop;
use zerohop_app_boutique::rpc::Service;

fn main() {
    let name = std::env::args()
        .nth(1)
        .or_else(|| std::env::var("BOUTIQUE_SERVICE").ok());
    let Some(name) = name else {
        eprintln!("usage: boutique-fn SERVICE (or BOUTIQUE_SERVICE=SERVICE)");
        std::process::exit(2);
    };
    let Some(service) = Service::from_name(&name) else {
        let known: Vec<&str> = Service::ALL.iter().map(|s| s.name()).collect();
        eprintln!(
            "boutique-fn: unknown service {name:?}; known: {}",
            known.join(", ")
        );
        std::process::exit(2);
    };
    zerohop::run(service)
}
