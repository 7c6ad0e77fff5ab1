//! The chain's HTTP side: one keep-alive connection to its listener, and the stamp the
//! function answers with.

use anyhow::{anyhow, bail, Context, Result};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use zerohop_pool::monotonic_ns;

use crate::daemon::WAIT;

/// One keep-alive connection to the chain's listener, reopened (outside any measured span)
/// when the gateway closed it.
pub(crate) struct Client {
    pub(crate) authority: String,
    pub(crate) conn: Option<http1::SendRequest<Full<Bytes>>>,
}

/// What the stamp function answered.
pub(crate) struct Stamp {
    pub(crate) take_ns: u64,
    pub(crate) main_ns: u64,
    pub(crate) pid: u32,
    pub(crate) nth: u64,
}

impl Client {
    /// A connection that can take a request now.
    pub(crate) async fn ready(&mut self) -> Result<()> {
        if let Some(c) = &mut self.conn {
            if !c.is_closed() && c.ready().await.is_ok() {
                return Ok(());
            }
        }
        let stream = TcpStream::connect(&self.authority)
            .await
            .with_context(|| format!("connecting to {}", self.authority))?;
        stream.set_nodelay(true)?;
        let (send, conn) = http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        self.conn = Some(send);
        Ok(())
    }

    /// POSTs to `path` on a ready connection; the stamp and the client's send and receive
    /// times (`CLOCK_MONOTONIC`, ns).
    pub(crate) async fn post(&mut self, path: &str) -> Result<(Stamp, u64, u64)> {
        self.ready().await?;
        let c = self.conn.as_mut().expect("connected above");
        let req = http::Request::post(path)
            .header(http::header::HOST, self.authority.as_str())
            .body(Full::new(Bytes::from_static(b"x")))?;
        let sent = monotonic_ns();
        let exchange = async {
            let resp = c.send_request(req).await?;
            let status = resp.status();
            let body = resp.into_body().collect().await?.to_bytes();
            anyhow::Ok((status, body))
        };
        let outcome = tokio::time::timeout(WAIT, exchange).await;
        let received = monotonic_ns();
        let (status, body) = match outcome {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => {
                self.conn = None;
                bail!("POST {path}: {e}");
            }
            Err(_) => {
                self.conn = None;
                bail!("POST {path}: no answer within {WAIT:?}");
            }
        };
        let text = String::from_utf8_lossy(&body);
        if status != http::StatusCode::OK {
            bail!("POST {path}: status {status}: {}", text.trim());
        }
        let fields: Vec<u64> = text
            .split_whitespace()
            .map(str::parse)
            .collect::<Result<_, _>>()
            .map_err(|_| anyhow!("POST {path}: not a stamp: {text:?}"))?;
        let [take_ns, main_ns, pid, nth] = fields[..] else {
            bail!("POST {path}: not a stamp: {text:?}");
        };
        Ok((
            Stamp {
                take_ns,
                main_ns,
                pid: pid as u32,
                nth,
            },
            sent,
            received,
        ))
    }
}
