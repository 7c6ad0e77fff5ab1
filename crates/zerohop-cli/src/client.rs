//! The admin API client: HTTP/1.1 over the daemon's unix socket.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::net::UnixStream;
use zerohop_agent::api::ErrorBody;

/// A connection to the daemon.
pub struct Client {
    socket: PathBuf,
}

impl Client {
    /// A client of the daemon at `socket`.
    pub fn new(socket: &Path) -> Self {
        Self {
            socket: socket.to_owned(),
        }
    }

    async fn send(
        &self,
        method: http::Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<http::Response<hyper::body::Incoming>> {
        // Before anything is sent: in a folder someone else owns or can write, whoever
        // listens on the socket may not be the daemon, and would read the specs and data.
        zerohop_agent::daemon::admin::socket::check_socket_for_client(&self.socket)?;
        let stream = UnixStream::connect(&self.socket).await.with_context(|| {
            format!(
                "cannot reach the zerohop daemon at {} (is `zerohop agent` running? pass \
                 --socket or set ZEROHOP_SOCKET if it listens elsewhere)",
                self.socket.display()
            )
        })?;
        let (mut sender, conn) = http1::handshake(TokioIo::new(stream))
            .await
            .context("talking to the daemon")?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let req = http::Request::builder()
            .method(method)
            .uri(format!("{}{path}", zerohop_agent::api::PREFIX))
            .header(http::header::HOST, "zerohop")
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body.unwrap_or_default())))?;
        let resp = sender
            .send_request(req)
            .await
            .context("the daemon closed the connection")?;
        if resp.status().is_success() {
            return Ok(resp);
        }
        let status = resp.status();
        let bytes = resp.into_body().collect().await?.to_bytes();
        match serde_json::from_slice::<ErrorBody>(&bytes) {
            Ok(e) => bail!("{}", e.error),
            Err(_) => bail!(
                "the daemon answered {status}: {}",
                String::from_utf8_lossy(&bytes).trim()
            ),
        }
    }

    /// A call with a JSON answer.
    pub async fn call<T: DeserializeOwned>(
        &self,
        method: http::Method,
        path: &str,
        body: Option<&impl Serialize>,
    ) -> Result<T> {
        let body = body.map(serde_json::to_vec).transpose()?;
        let resp = self.send(method, path, body).await?;
        let bytes = resp.into_body().collect().await?.to_bytes();
        serde_json::from_slice(&bytes)
            .map_err(|e| anyhow!("the daemon's answer is not what this zerohop expects: {e}"))
    }

    /// A call whose answer is JSON lines, handed to `line` as they arrive.
    pub async fn stream<T: DeserializeOwned>(
        &self,
        path: &str,
        mut line: impl FnMut(T) -> Result<()>,
    ) -> Result<()> {
        let mut body = self.send(http::Method::GET, path, None).await?.into_body();
        let mut buf: Vec<u8> = Vec::new();
        while let Some(frame) = body.frame().await {
            let frame = frame.context("reading from the daemon")?;
            let Ok(data) = frame.into_data() else {
                continue;
            };
            buf.extend_from_slice(&data);
            while let Some(at) = buf.iter().position(|&b| b == b'\n') {
                let one: Vec<u8> = buf.drain(..=at).collect();
                if one.len() > 1 {
                    line(serde_json::from_slice(&one[..one.len() - 1])?)?;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    /// A scratch folder under the temp dir, removed on drop.
    struct Scratch(PathBuf);

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[tokio::test]
    async fn the_cli_sends_nothing_through_a_socket_in_a_folder_others_can_write() {
        let dir = Scratch(std::env::temp_dir().join(format!(
            "zerohop-cli-test-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        )));
        std::fs::create_dir(&dir.0).unwrap();
        std::fs::set_permissions(&dir.0, std::fs::Permissions::from_mode(0o777)).unwrap();
        // Someone listens there; whatever connects would be theirs to read.
        let socket = dir.0.join("admin.sock");
        let stranger = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        stranger.set_nonblocking(true).unwrap();
        let err = Client::new(&socket)
            .call::<serde_json::Value>(http::Method::GET, "/chains", None::<&()>)
            .await
            .expect_err("refused");
        let text = format!("{err:#}");
        assert!(text.contains(&dir.0.display().to_string()), "{text}");
        assert!(text.contains("mode 0777"), "{text}");
        assert!(text.contains("--socket"), "{text}");
        assert_eq!(
            stranger.accept().map(|_| ()).unwrap_err().kind(),
            std::io::ErrorKind::WouldBlock,
            "the CLI never connected"
        );
    }
}
