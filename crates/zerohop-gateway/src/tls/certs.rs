//! Certificates and keys from PEM files, checked so that every error names the file and
//! what is wrong with it, and the choice among several by SNI.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::crypto::ring::sign::any_supported_type;
use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

/// A certificate chain file and its private key file (PEM).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertFiles {
    /// The certificate, then the intermediates that chain it to a root (PEM
    /// `CERTIFICATE` blocks, leaf first).
    pub cert: PathBuf,
    /// The leaf's private key (PEM `PRIVATE KEY`, `RSA PRIVATE KEY` or `EC PRIVATE KEY`).
    pub key: PathBuf,
}

/// Why a certificate or key could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The file cannot be opened or read.
    #[error("{}: cannot read it: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// What the read said.
        source: std::io::Error,
    },
    /// The file is not PEM, or a PEM block of it is broken.
    #[error("{}: not a valid PEM file: {why}", path.display())]
    Pem {
        /// The file.
        path: PathBuf,
        /// What the PEM reader said.
        why: String,
    },
    /// The certificate file holds no `CERTIFICATE` block.
    #[error(
        "{}: no certificate in it (expected PEM `-----BEGIN CERTIFICATE-----` blocks, the \
         server's certificate first)",
        path.display()
    )]
    NoCertificate {
        /// The file.
        path: PathBuf,
    },
    /// The certificate is not a parsable X.509 certificate.
    #[error("{}: the certificate cannot be parsed: {why}", path.display())]
    BadCertificate {
        /// The file.
        path: PathBuf,
        /// What the parser said.
        why: String,
    },
    /// The key file holds no private key block.
    #[error(
        "{}: no private key in it (expected PEM `-----BEGIN PRIVATE KEY-----`, `RSA PRIVATE \
         KEY` or `EC PRIVATE KEY`)",
        path.display()
    )]
    NoKey {
        /// The file.
        path: PathBuf,
    },
    /// The key is of a type or curve rustls cannot sign with.
    #[error(
        "{}: unsupported key type ({why}); use RSA (2048 bits or more), ECDSA P-256 or P-384, \
         or Ed25519",
        path.display()
    )]
    UnsupportedKey {
        /// The file.
        path: PathBuf,
        /// What rustls said.
        why: String,
    },
    /// The key is not the private key of the certificate.
    #[error(
        "{}: this key does not match the certificate in {} (its public key differs); give \
         the key the certificate was issued for",
        key.display(),
        cert.display()
    )]
    KeyMismatch {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
    },
    /// No certificate was given at all.
    #[error("TLS needs at least one certificate and key")]
    Empty,
    /// The TLS configuration could not be built (never expected with the built-in
    /// provider).
    #[error("cannot configure TLS: {0}")]
    Config(String),
}

impl TlsError {
    /// The file the error is about, if it is about one.
    pub fn path(&self) -> Option<&Path> {
        match self {
            Self::Read { path, .. }
            | Self::Pem { path, .. }
            | Self::NoCertificate { path }
            | Self::BadCertificate { path, .. }
            | Self::NoKey { path }
            | Self::UnsupportedKey { path, .. } => Some(path),
            Self::KeyMismatch { key, .. } => Some(key),
            Self::Empty | Self::Config(_) => None,
        }
    }
}

/// One loaded certificate with its key.
#[derive(Debug)]
struct Loaded {
    key: Arc<CertifiedKey>,
}

/// The certificates in use, the first being the default.
#[derive(Debug)]
pub(super) struct CertSet {
    certs: Vec<Loaded>,
}

impl CertSet {
    /// Loads and checks every pair of `files`.
    pub(super) fn load(files: &[CertFiles]) -> Result<Self, TlsError> {
        if files.is_empty() {
            return Err(TlsError::Empty);
        }
        let certs = files
            .iter()
            .map(|f| Ok(Loaded { key: load_pair(f)? }))
            .collect::<Result<_, TlsError>>()?;
        Ok(Self { certs })
    }

    /// The certificate for `sni`: the first whose names cover it, else the first.
    pub(super) fn pick(&self, sni: Option<&str>) -> Arc<CertifiedKey> {
        if let Some(name) = sni.and_then(|s| ServerName::try_from(s.to_owned()).ok()) {
            for c in &self.certs {
                // Parsing the leaf is a walk over its DER, no allocation; a chain has a
                // handful of certificates.
                let valid = c
                    .key
                    .end_entity_cert()
                    .ok()
                    .and_then(|der| webpki::EndEntityCert::try_from(der).ok())
                    .is_some_and(|ee| ee.verify_is_valid_for_subject_name(&name).is_ok());
                if valid {
                    return c.key.clone();
                }
            }
        }
        self.certs[0].key.clone()
    }
}

/// Reads `files.cert` and `files.key` and checks that they belong together.
fn load_pair(files: &CertFiles) -> Result<Arc<CertifiedKey>, TlsError> {
    let chain = read_certs(&files.cert)?;
    let key = read_key(&files.key)?;
    let signer = any_supported_type(&key).map_err(|e| TlsError::UnsupportedKey {
        path: files.key.clone(),
        why: e.to_string(),
    })?;
    webpki::EndEntityCert::try_from(&chain[0]).map_err(|e| TlsError::BadCertificate {
        path: files.cert.clone(),
        why: format!("{e:?}"),
    })?;
    let certified = CertifiedKey::new(chain, signer);
    match certified.keys_match() {
        Ok(()) => Ok(Arc::new(certified)),
        Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch)) => {
            Err(TlsError::KeyMismatch {
                cert: files.cert.clone(),
                key: files.key.clone(),
            })
        }
        // The key's type cannot say its public key (`Unknown`): rustls cannot compare, and
        // a handshake would tell the client soon enough.
        Err(rustls::Error::InconsistentKeys(_)) => Ok(Arc::new(certified)),
        Err(e) => Err(TlsError::BadCertificate {
            path: files.cert.clone(),
            why: e.to_string(),
        }),
    }
}

fn pem_error(path: &Path, e: pem::Error) -> TlsError {
    match e {
        pem::Error::Io(source) => TlsError::Read {
            path: path.to_owned(),
            source,
        },
        other => TlsError::Pem {
            path: path.to_owned(),
            why: other.to_string(),
        },
    }
}

fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let text = read(path)?;
    let chain = CertificateDer::pem_slice_iter(&text)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem_error(path, e))?;
    if chain.is_empty() {
        return Err(TlsError::NoCertificate {
            path: path.to_owned(),
        });
    }
    Ok(chain)
}

fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let text = read(path)?;
    match PrivateKeyDer::from_pem_slice(&text) {
        Ok(k) => Ok(k),
        Err(pem::Error::NoItemsFound) => Err(TlsError::NoKey {
            path: path.to_owned(),
        }),
        Err(e) => Err(pem_error(path, e)),
    }
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_owned(),
        source,
    })
}

/// What rustls asks for a certificate: the current [`CertSet`], swapped whole on reload so
/// a handshake sees either the old set or the new one.
#[derive(Debug)]
pub(super) struct Resolver {
    pub(super) current: std::sync::RwLock<Arc<CertSet>>,
}

impl ResolvesServerCert for Resolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let set = self
            .current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        Some(set.pick(hello.server_name()))
    }
}
