//! `boutique-http`: the boutique as ten HTTP microservices, one process each, on free
//! 127.0.0.1 ports. Prints `boutique-http: frontend at URL`; Ctrl-C or SIGTERM stops them
//! all. `boutique-http serve SERVICE ...` runs one of them (what the supervisor starts).

use std::collections::BTreeMap;
use std::net::SocketAddr;

use anyhow::{anyhow, Context, Result};
use clap::{Parser, Subcommand};
use zerohop_app_boutique::deploy::http::server::{self, ServeOptions};
use zerohop_app_boutique::deploy::http::supervisor::{self, SuperviseOptions};
use zerohop_app_boutique::rpc::Service;

#[derive(Parser)]
#[command(about = "Online Boutique as HTTP microservices, one process per service")]
struct Args {
    /// Address of the frontend (port 0: a free port).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    #[command(subcommand)]
    command: Option<Cmd>,
}

#[derive(Subcommand)]
enum Cmd {
    /// Runs one service (the supervisor starts these).
    #[command(hide = true)]
    Serve {
        /// Which service.
        service: String,
        /// Where to listen.
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: SocketAddr,
        /// A callee's base URL, `NAME=http://HOST:PORT` (repeat).
        #[arg(long = "peer")]
        peers: Vec<String>,
        /// Exit with this process.
        #[arg(long)]
        parent: Option<u32>,
    },
}

fn service(name: &str) -> Result<Service> {
    Service::from_name(name).ok_or_else(|| anyhow!("unknown service {name:?}"))
}

fn main() -> Result<()> {
    let args = Args::parse();
    match args.command {
        None => supervisor::supervise(&SuperviseOptions {
            listen: args.listen,
        })
        .context("boutique-http"),
        Some(Cmd::Serve {
            service: name,
            listen,
            peers,
            parent,
        }) => {
            let service = service(&name)?;
            let peers = peers
                .iter()
                .map(|p| {
                    let (name, url) = p
                        .split_once('=')
                        .ok_or_else(|| anyhow!("--peer {p:?}: expected NAME=URL"))?;
                    Ok((self::service(name)?, url.to_owned()))
                })
                .collect::<Result<BTreeMap<_, _>>>()?;
            server::serve(ServeOptions {
                service,
                listen,
                peers,
                parent,
            })
            .with_context(|| format!("boutique-http serve {name}"))
        }
    }
}
