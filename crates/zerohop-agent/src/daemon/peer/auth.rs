//! Mutual authentication of a peer connection with a secret both nodes hold.
//!
//! ```text
//! each side, at once:  MAGIC (15 B) nonce (32 B, fresh from the system RNG)
//! then, at once:       tag = HMAC-SHA256(secret, CONTEXT | role | own nonce | other's nonce)
//! role = b'c' (the side that connected) or b's' (the side that accepted)
//! ```
//!
//! Each side checks the other's tag in constant time (`ring::hmac::verify`) against the
//! message the *other* role would have signed. Both nonces make a tag good for one
//! connection only (no replay); the role byte makes a side's own tag useless as the other's
//! (no reflection: a peer echoing our bytes back fails). A wrong secret fails on both ends,
//! as each verifies a tag made with the other key. The whole exchange is bounded by
//! [`HANDSHAKE_TIMEOUT`].
//!
//! Limits: this authenticates the two ends when the connection opens; it neither encrypts
//! nor protects the frames that follow, so an attacker on the path between the nodes can
//! read and alter them. The connection is meant for the cluster's own network.

use std::fmt;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// What each side sends first: says what speaks and which version of the protocol.
pub const MAGIC: &[u8; 15] = b"zerohop-peer/1\n";

/// What the tags are about, so a tag made with the same secret for another purpose never
/// passes here.
const CONTEXT: &[u8] = b"zerohop peer connection authentication v1";

/// Length of each side's nonce.
pub const NONCE_LEN: usize = 32;

/// Length of a tag (HMAC-SHA256).
const TAG_LEN: usize = 32;

/// The bound on the whole handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// The shortest secret accepted from a file.
pub const MIN_SECRET_LEN: usize = 16;

/// The secret the nodes of a cluster share (typically a Kubernetes Secret mounted into the
/// agent's pod). Its `Debug` shows only its length.
pub struct Secret {
    key: hmac::Key,
    len: usize,
}

impl Secret {
    /// A secret from its bytes, as they are (no length check: [`Secret::from_file`] makes
    /// that one).
    pub fn new(bytes: &[u8]) -> Secret {
        Secret {
            key: hmac::Key::new(hmac::HMAC_SHA256, bytes),
            len: bytes.len(),
        }
    }

    /// Reads the secret from `path`, without its trailing whitespace (a newline an editor or
    /// `kubectl create secret --from-file` left), and refuses one shorter than
    /// [`MIN_SECRET_LEN`] bytes.
    pub fn from_file(path: &Path) -> Result<Secret, String> {
        let bytes = std::fs::read(path)
            .map_err(|e| format!("cannot read the peer secret {}: {e}", path.display()))?;
        let key = bytes.trim_ascii_end();
        if key.len() < MIN_SECRET_LEN {
            return Err(format!(
                "the peer secret {} holds {} bytes (without trailing whitespace); at least \
                 {MIN_SECRET_LEN} are needed, e.g. `head -c 32 /dev/urandom | base64 > {}`",
                path.display(),
                key.len(),
                path.display(),
            ));
        }
        Ok(Secret::new(key))
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Secret({} bytes)", self.len)
    }
}

/// Which end of the connection a side is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// The side that connected.
    Client,
    /// The side that accepted.
    Server,
}

impl Role {
    fn byte(self) -> u8 {
        match self {
            Role::Client => b'c',
            Role::Server => b's',
        }
    }

    fn other(self) -> Role {
        match self {
            Role::Client => Role::Server,
            Role::Server => Role::Client,
        }
    }
}

/// A handshake that failed: the peer and why.
#[derive(Debug, thiserror::Error)]
#[error("peer {peer} failed authentication: {reason}")]
pub struct AuthError {
    /// The other end.
    pub peer: SocketAddr,
    /// Why.
    pub reason: AuthFailure,
}

/// Why a handshake failed.
#[derive(Debug, thiserror::Error)]
pub enum AuthFailure {
    /// The peer's tag does not match: it holds another secret (or none).
    #[error("wrong shared secret")]
    WrongSecret,
    /// The peer's first bytes are not [`MAGIC`].
    #[error("not a zerohop peer, or another protocol version (wrong preamble)")]
    WrongMagic,
    /// The peer sent our own nonce back.
    #[error("the peer echoed our nonce")]
    Reflected,
    /// The handshake did not finish in time.
    #[error("no complete handshake within {0:?}")]
    Timeout(Duration),
    /// Reading or writing the connection failed (or it closed).
    #[error("connection failed during the handshake: {0}")]
    Io(#[from] std::io::Error),
    /// The system's random number generator failed.
    #[error("no random nonce from the system")]
    Random,
}

/// Authenticates the connection `io` to `peer` as `role`, within [`HANDSHAKE_TIMEOUT`].
/// On success both ends hold the same secret and the connection is fresh.
pub async fn handshake<S>(
    io: &mut S,
    secret: &Secret,
    role: Role,
    peer: SocketAddr,
) -> Result<(), AuthError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    handshake_within(io, secret, role, peer, HANDSHAKE_TIMEOUT).await
}

/// [`handshake`] with another bound.
async fn handshake_within<S>(
    io: &mut S,
    secret: &Secret,
    role: Role,
    peer: SocketAddr,
    limit: Duration,
) -> Result<(), AuthError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let reason = match tokio::time::timeout(limit, exchange(io, secret, role)).await {
        Ok(Ok(())) => return Ok(()),
        Ok(Err(reason)) => reason,
        Err(_) => AuthFailure::Timeout(limit),
    };
    Err(AuthError { peer, reason })
}

async fn exchange<S>(io: &mut S, secret: &Secret, role: Role) -> Result<(), AuthFailure>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut ours = [0u8; NONCE_LEN];
    SystemRandom::new()
        .fill(&mut ours)
        .map_err(|_| AuthFailure::Random)?;
    let mut hello = [0u8; MAGIC.len() + NONCE_LEN];
    hello[..MAGIC.len()].copy_from_slice(MAGIC);
    hello[MAGIC.len()..].copy_from_slice(&ours);
    // Both sides write before they read: the few bytes fit any socket buffer, so neither
    // waits for the other.
    io.write_all(&hello).await?;
    io.flush().await?;
    let mut theirs_hello = [0u8; MAGIC.len() + NONCE_LEN];
    io.read_exact(&mut theirs_hello).await?;
    if &theirs_hello[..MAGIC.len()] != MAGIC {
        return Err(AuthFailure::WrongMagic);
    }
    let mut theirs = [0u8; NONCE_LEN];
    theirs.copy_from_slice(&theirs_hello[MAGIC.len()..]);
    if theirs == ours {
        return Err(AuthFailure::Reflected);
    }

    let tag = hmac::sign(&secret.key, &message(role, &ours, &theirs));
    io.write_all(tag.as_ref()).await?;
    io.flush().await?;
    let mut their_tag = [0u8; TAG_LEN];
    io.read_exact(&mut their_tag).await?;
    hmac::verify(
        &secret.key,
        &message(role.other(), &theirs, &ours),
        &their_tag,
    )
    .map_err(|_| AuthFailure::WrongSecret)
}

/// What `role` signs: its own nonce first.
fn message(role: Role, own: &[u8; NONCE_LEN], other: &[u8; NONCE_LEN]) -> Vec<u8> {
    let mut m = Vec::with_capacity(CONTEXT.len() + 1 + 2 * NONCE_LEN);
    m.extend_from_slice(CONTEXT);
    m.push(role.byte());
    m.extend_from_slice(own);
    m.extend_from_slice(other);
    m
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use tokio::io::{duplex, DuplexStream};

    use super::*;

    const KEY: &[u8] = b"0123456789abcdef0123456789abcdef";

    fn addr() -> SocketAddr {
        "10.0.0.2:7000".parse().unwrap()
    }

    async fn both(
        client_secret: &Secret,
        server_secret: &Secret,
    ) -> (Result<(), AuthError>, Result<(), AuthError>) {
        let (mut c, mut s) = duplex(1024);
        let limit = Duration::from_secs(5);
        tokio::join!(
            handshake_within(&mut c, client_secret, Role::Client, addr(), limit),
            handshake_within(&mut s, server_secret, Role::Server, addr(), limit),
        )
    }

    #[tokio::test]
    async fn same_secret_passes_on_both_ends() {
        let (c, s) = both(&Secret::new(KEY), &Secret::new(KEY)).await;
        c.unwrap();
        s.unwrap();
    }

    #[tokio::test]
    async fn wrong_secret_fails_on_both_ends() {
        let (c, s) = both(
            &Secret::new(KEY),
            &Secret::new(b"another secret, 16+ bytes"),
        )
        .await;
        for r in [c, s] {
            let e = r.unwrap_err();
            assert!(matches!(e.reason, AuthFailure::WrongSecret), "{e}");
            assert_eq!(
                e.to_string(),
                "peer 10.0.0.2:7000 failed authentication: wrong shared secret"
            );
        }
    }

    #[tokio::test]
    async fn wrong_magic_fails() {
        let (mut c, mut s) = duplex(1024);
        let peer = tokio::spawn(async move {
            s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n0123456789abcdefghij")
                .await
                .unwrap();
            s
        });
        let e = handshake(&mut c, &Secret::new(KEY), Role::Client, addr())
            .await
            .unwrap_err();
        assert!(matches!(e.reason, AuthFailure::WrongMagic), "{e}");
        drop(peer.await.unwrap());
    }

    #[tokio::test]
    async fn silent_peer_times_out() {
        let (mut c, _s) = duplex(1024);
        let limit = Duration::from_millis(100);
        let e = tokio::time::timeout(
            Duration::from_secs(5),
            handshake_within(&mut c, &Secret::new(KEY), Role::Client, addr(), limit),
        )
        .await
        .expect("the handshake bounds itself")
        .unwrap_err();
        assert!(matches!(e.reason, AuthFailure::Timeout(_)), "{e}");
    }

    #[tokio::test]
    async fn closed_peer_fails() {
        let (mut c, s) = duplex(1024);
        drop(s);
        let e = handshake(&mut c, &Secret::new(KEY), Role::Client, addr())
            .await
            .unwrap_err();
        assert!(matches!(e.reason, AuthFailure::Io(_)), "{e}");
    }

    /// A peer without the secret that sends back whatever it receives: our hello, then our
    /// own tag. Neither may pass.
    async fn mirror(mut s: DuplexStream, same_nonce: bool) {
        let mut hello = [0u8; MAGIC.len() + NONCE_LEN];
        if s.read_exact(&mut hello).await.is_err() {
            return;
        }
        if !same_nonce {
            hello[MAGIC.len()] ^= 1;
        }
        let _ = s.write_all(&hello).await;
        let mut tag = [0u8; TAG_LEN];
        if s.read_exact(&mut tag).await.is_err() {
            return;
        }
        let _ = s.write_all(&tag).await;
    }

    #[tokio::test]
    async fn a_reflected_hello_or_tag_does_not_pass() {
        for (same_nonce, role) in [
            (true, Role::Client),
            (false, Role::Client),
            (false, Role::Server),
        ] {
            let (mut c, s) = duplex(1024);
            let m = tokio::spawn(mirror(s, same_nonce));
            let e = handshake(&mut c, &Secret::new(KEY), role, addr())
                .await
                .unwrap_err();
            if same_nonce {
                assert!(matches!(e.reason, AuthFailure::Reflected), "{e}");
            } else {
                assert!(matches!(e.reason, AuthFailure::WrongSecret), "{e}");
            }
            drop(c);
            m.await.unwrap();
        }
    }

    /// A tag recorded from one connection does not open another: the nonces differ.
    #[tokio::test]
    async fn a_replayed_tag_does_not_pass() {
        let secret = Secret::new(KEY);
        // What a genuine client sent on an earlier connection, nonces and tag.
        let client_nonce = [7u8; NONCE_LEN];
        let server_nonce_then = [9u8; NONCE_LEN];
        let recorded = hmac::sign(
            &secret.key,
            &message(Role::Client, &client_nonce, &server_nonce_then),
        );
        // Replay it to a server, which picks a fresh nonce.
        let (mut attacker, mut server) = duplex(1024);
        let replay = async {
            let mut hello = MAGIC.to_vec();
            hello.extend_from_slice(&client_nonce);
            attacker.write_all(&hello).await.unwrap();
            let mut theirs = [0u8; MAGIC.len() + NONCE_LEN];
            attacker.read_exact(&mut theirs).await.unwrap();
            attacker.write_all(recorded.as_ref()).await.unwrap();
            attacker
        };
        let (r, _attacker) = tokio::join!(
            handshake(&mut server, &secret, Role::Server, addr()),
            replay
        );
        let e = r.unwrap_err();
        assert!(matches!(e.reason, AuthFailure::WrongSecret), "{e}");
    }

    #[test]
    fn secret_from_file_trims_and_refuses_short_ones() {
        let dir = tempfile::tempdir().unwrap();
        let good = dir.path().join("peer-secret");
        std::fs::File::create(&good)
            .unwrap()
            .write_all(b"0123456789abcdef\n")
            .unwrap();
        let s = Secret::from_file(&good).unwrap();
        assert_eq!(format!("{s:?}"), "Secret(16 bytes)");
        // The trimmed file and the bare bytes are the same key.
        let tag = hmac::sign(&s.key, b"m");
        hmac::verify(&Secret::new(b"0123456789abcdef").key, b"m", tag.as_ref()).unwrap();

        let short = dir.path().join("short");
        std::fs::write(&short, b"0123456789abcde \n\n").unwrap();
        let e = Secret::from_file(&short).unwrap_err();
        assert!(e.contains(&short.display().to_string()), "{e}");
        assert!(e.contains("15 bytes"), "{e}");
        assert!(e.contains("at least 16"), "{e}");

        let missing = dir.path().join("missing");
        let e = Secret::from_file(&missing).unwrap_err();
        assert!(e.contains(&missing.display().to_string()), "{e}");
    }

    #[test]
    fn debug_does_not_show_the_key() {
        let shown = format!("{:?}", Secret::new(KEY));
        assert!(!shown.contains("0123"), "{shown}");
    }
}
