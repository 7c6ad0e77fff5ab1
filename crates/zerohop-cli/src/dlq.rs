//! `zerohop dlq ls|show|replay|drop CHAIN [ID]`: a chain's dead-letter queue, through the
//! daemon (see the agent's `daemon/admin/dlq.rs` for the API).

use anyhow::Result;
use clap::Subcommand;
use http::Method;
use serde_json::Value;

use crate::client::Client;
use crate::DaemonArgs;

/// What to do with the dead letters.
#[derive(Subcommand)]
pub enum DlqCommand {
    /// Lists a chain's dead letters, oldest first.
    Ls {
        /// Chain name.
        chain: String,
        #[command(flatten)]
        daemon: DaemonArgs,
    },
    /// Shows one dead letter: its route, last error, attempts and body.
    Show {
        /// Chain name.
        chain: String,
        /// Request id (as the 202 gave it).
        id: String,
        #[command(flatten)]
        daemon: DaemonArgs,
    },
    /// Runs a dead letter again, with all its attempts: to an answer or back to the queue.
    Replay {
        /// Chain name.
        chain: String,
        /// Request id.
        id: String,
        #[command(flatten)]
        daemon: DaemonArgs,
    },
    /// Forgets a dead letter.
    Drop {
        /// Chain name.
        chain: String,
        /// Request id.
        id: String,
        #[command(flatten)]
        daemon: DaemonArgs,
    },
}

impl DlqCommand {
    /// How to reach the daemon.
    pub fn daemon(&self) -> &DaemonArgs {
        match self {
            DlqCommand::Ls { daemon, .. }
            | DlqCommand::Show { daemon, .. }
            | DlqCommand::Replay { daemon, .. }
            | DlqCommand::Drop { daemon, .. } => daemon,
        }
    }
}

/// Runs `cmd` against the daemon `c`.
pub async fn run(c: Client, cmd: DlqCommand) -> Result<()> {
    let json = cmd.daemon().json;
    let none: Option<&Value> = None;
    match cmd {
        DlqCommand::Ls { chain, .. } => {
            let list: Vec<Value> = c
                .call(Method::GET, &format!("/chains/{chain}/dlq"), none)
                .await?;
            if json {
                return print(&Value::Array(list));
            }
            if list.is_empty() {
                println!("chain '{chain}': no dead letters");
                return Ok(());
            }
            println!(
                "{:<32}  {:>6}  {:>8}  {:<20}  ERROR",
                "ID", "STATUS", "ATTEMPTS", "ROUTE"
            );
            for l in &list {
                println!(
                    "{:<32}  {:>6}  {:>8}  {:<20}  {}",
                    text(&l["id"]),
                    l["status"],
                    l["attempts"],
                    text(&l["route"]),
                    text(&l["error"])
                );
            }
            Ok(())
        }
        DlqCommand::Show { chain, id, .. } => {
            let l: Value = c
                .call(Method::GET, &format!("/chains/{chain}/dlq/{id}"), none)
                .await?;
            if json {
                return print(&l);
            }
            println!("id:        {}", text(&l["id"]));
            println!("route:     {}", text(&l["route"]));
            println!("status:    {}", l["status"]);
            println!("error:     {}", text(&l["error"]));
            println!("attempts:  {}", l["attempts"]);
            if let Some(cb) = l["callback"].as_str() {
                println!("callback:  {cb}");
            }
            println!("body:      {} bytes", l["body_len"]);
            match (l["body"].as_str(), l["body_hex"].as_str()) {
                (Some(b), _) => println!("{b}"),
                (None, Some(h)) => println!("(not UTF-8; hex) {h}"),
                _ => {}
            }
            Ok(())
        }
        DlqCommand::Replay { chain, id, .. } => {
            let r: Value = c
                .call(
                    Method::POST,
                    &format!("/chains/{chain}/dlq/{id}/replay"),
                    none,
                )
                .await?;
            if json {
                return print(&r);
            }
            println!(
                "chain '{chain}': {id} queued again (GET /_zerohop/async/{id} for its answer)"
            );
            Ok(())
        }
        DlqCommand::Drop { chain, id, .. } => {
            let r: Value = c
                .call(Method::DELETE, &format!("/chains/{chain}/dlq/{id}"), none)
                .await?;
            if json {
                return print(&r);
            }
            println!("chain '{chain}': {id} dropped");
            Ok(())
        }
    }
}

fn text(v: &Value) -> &str {
    v.as_str().unwrap_or("")
}

fn print(v: &Value) -> Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}
