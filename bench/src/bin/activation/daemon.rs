//! The node daemon (`zerohop agent`) this benchmark runs, its admin API, and the part of the
//! chain's status it reads.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use serde::Deserialize;
use tokio::net::UnixStream;

use crate::spec::CHAIN;

/// Bound on any single wait: the daemon's start, a function reaching zero, a request.
pub(crate) const WAIT: Duration = Duration::from_secs(20);

// The daemon's status, as far as this benchmark reads it (a subset of
// `zerohop_agent::api::ChainStatus`; unknown fields are ignored, so the bench does not
// depend on the agent crate).

#[derive(Deserialize, Debug)]
pub(crate) struct ChainStatus {
    pub(crate) listeners: Vec<String>,
    pub(crate) functions: Vec<FunctionStatus>,
}

#[derive(Deserialize, Debug)]
pub(crate) struct FunctionStatus {
    pub(crate) name: String,
    pub(crate) ready: usize,
    #[serde(default)]
    pub(crate) parked: usize,
    pub(crate) instances: Vec<InstanceStatus>,
}

#[derive(Deserialize, Debug)]
pub(crate) struct InstanceStatus {
    pub(crate) pid: Option<u32>,
    pub(crate) state: String,
    #[serde(default)]
    pub(crate) activated_ns: Option<u64>,
    #[serde(default)]
    pub(crate) activation: Option<String>,
}

#[derive(Deserialize)]
pub(crate) struct ApplyResponse {
    pub(crate) status: ChainStatus,
}

impl ChainStatus {
    pub(crate) fn function(&self, name: &str) -> Result<&FunctionStatus> {
        self.functions
            .iter()
            .find(|f| f.name == name)
            .ok_or_else(|| anyhow!("the chain's status has no function {name:?}"))
    }
}

/// `zerohop agent` on a socket of its own: SIGTERM on drop (it stops the chain and every
/// instance), SIGKILL if it lingers.
pub(crate) struct Daemon {
    pub(crate) child: Child,
    pub(crate) socket: PathBuf,
}

impl Daemon {
    pub(crate) fn start(zerohop: &Path, dir: &Path) -> Result<Self> {
        let socket = dir.join("admin.sock");
        let log = std::fs::File::create(dir.join("daemon.log"))?;
        let mut child = Command::new(zerohop)
            .arg("agent")
            .arg("--socket")
            .arg(&socket)
            .args(["--metrics", "none"])
            .env_remove("ZEROHOP_SOCKET")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .context("starting zerohop agent")?;
        let out = child.stdout.take().context("stdout")?;
        let daemon = Self { child, socket };
        zerohop_bench::wait_line(out, "daemon ready on ", WAIT).map_err(|_| {
            anyhow!(
                "zerohop agent did not say it was ready within {WAIT:?}; see {}",
                dir.join("daemon.log").display()
            )
        })?;
        Ok(daemon)
    }

    /// One admin API call; the answer's body. A connection each, as the CLI does.
    pub(crate) async fn call(
        &self,
        method: http::Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<Bytes> {
        let stream = UnixStream::connect(&self.socket)
            .await
            .with_context(|| format!("connecting to {}", self.socket.display()))?;
        let (mut sender, conn) = http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let req = http::Request::builder()
            .method(method)
            .uri(format!("/v1{path}"))
            .header(http::header::HOST, "zerohop")
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body.unwrap_or_default())))?;
        let resp = tokio::time::timeout(WAIT, async {
            let resp = sender.send_request(req).await?;
            let status = resp.status();
            let bytes = resp.into_body().collect().await?.to_bytes();
            anyhow::Ok((status, bytes))
        })
        .await
        .map_err(|_| anyhow!("the daemon did not answer {path} within {WAIT:?}"))??;
        if !resp.0.is_success() {
            bail!(
                "the daemon answered {path} with {}: {}",
                resp.0,
                String::from_utf8_lossy(&resp.1).trim()
            );
        }
        Ok(resp.1)
    }

    pub(crate) async fn status(&self) -> Result<ChainStatus> {
        let bytes = self
            .call(http::Method::GET, &format!("/chains/{CHAIN}"), None)
            .await?;
        serde_json::from_slice(&bytes).context("the daemon's status is not the JSON expected")
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        zerohop_bench::stop_child(&mut self.child, "zerohop-bench-activation: zerohop agent");
    }
}
