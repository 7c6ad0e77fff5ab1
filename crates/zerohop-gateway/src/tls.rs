//! TLS on the gateway's listeners (HTTP and MQTT), with rustls and its `ring` provider.
//!
//! * TLS 1.2 and 1.3 only; ALPN `h2` and `http/1.1` on HTTP, none on MQTT.
//! * Several certificates: the one whose names cover the client's SNI, else the first.
//! * A handshake gets [`HANDSHAKE_TIMEOUT`]: a client that stalls it costs that long and one
//!   connection permit, no more.
//! * [`Tls::watch`] reloads the files when they change (inotify on their folders: no
//!   polling, no CPU while nothing changes). New handshakes use the new certificates, open
//!   connections keep theirs; a reload that fails keeps the old ones and logs why.
//!
//! Every error names the file and what is wrong with it ([`TlsError`]).

mod certs;
mod reload;

use std::sync::{Arc, RwLock};
use std::time::Duration;

pub use certs::{CertFiles, TlsError};
use rustls::server::ServerConfig;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

use certs::{CertSet, Resolver};

/// How long a client may take to complete a TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The certificates of a chain and the server configurations built on them; shared by every
/// gateway thread and listener of the chain.
pub struct Tls {
    files: Vec<CertFiles>,
    resolver: Arc<Resolver>,
    http: TlsAcceptor,
    mqtt: TlsAcceptor,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls").field("files", &self.files).finish()
    }
}

/// What a listener speaks inside TLS (it decides the ALPN offered).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Inside {
    /// HTTP/2 or HTTP/1.1, by ALPN.
    Http,
    /// MQTT (no ALPN).
    Mqtt,
}

impl Tls {
    /// Loads every certificate and key of `files` (the first is the default); an error
    /// names the file and what is wrong with it.
    pub fn load(files: Vec<CertFiles>) -> Result<Arc<Self>, TlsError> {
        let set = CertSet::load(&files)?;
        let resolver = Arc::new(Resolver {
            current: RwLock::new(Arc::new(set)),
        });
        let config = |alpn: Vec<Vec<u8>>| -> Result<TlsAcceptor, TlsError> {
            let mut c = ServerConfig::builder_with_provider(Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
            .map_err(|e| TlsError::Config(e.to_string()))?
            .with_no_client_auth()
            .with_cert_resolver(resolver.clone());
            c.alpn_protocols = alpn;
            Ok(TlsAcceptor::from(Arc::new(c)))
        };
        Ok(Arc::new(Self {
            http: config(vec![b"h2".to_vec(), b"http/1.1".to_vec()])?,
            mqtt: config(Vec::new())?,
            files,
            resolver,
        }))
    }

    /// Loads the files again; on success new handshakes use them, on failure the old
    /// certificates stay.
    pub fn reload(&self) -> Result<(), TlsError> {
        let set = CertSet::load(&self.files)?;
        *self
            .resolver
            .current
            .write()
            .unwrap_or_else(|p| p.into_inner()) = Arc::new(set);
        Ok(())
    }

    /// The certificate and key files, the default first.
    pub fn files(&self) -> &[CertFiles] {
        &self.files
    }

    /// The server side of a handshake on `io`, bounded by [`HANDSHAKE_TIMEOUT`]; `None` (and
    /// a debug line) when it fails or takes too long.
    pub(crate) async fn accept<IO>(&self, io: IO, inside: Inside) -> Option<TlsStream<IO>>
    where
        IO: AsyncRead + AsyncWrite + Unpin,
    {
        let acceptor = match inside {
            Inside::Http => &self.http,
            Inside::Mqtt => &self.mqtt,
        };
        match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(io)).await {
            Ok(Ok(s)) => Some(s),
            Ok(Err(e)) => {
                tracing::debug!("tls: handshake failed: {e}");
                None
            }
            Err(_) => {
                tracing::debug!("tls: no handshake within {HANDSHAKE_TIMEOUT:?}; closed");
                None
            }
        }
    }
}
