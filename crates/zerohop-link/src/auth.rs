//! Mutual authentication of a peer connection with a secret both nodes hold (protocol 2).
//!
//! ```text
//! each side, at once:  MAGIC (15 B) node id (16 B) nonce (32 B, fresh from the system RNG)
//! then, at once:       tag = HMAC-SHA256(secret, CONTEXT | signer
//!                                        | dialer's id | acceptor's id
//!                                        | dialer's nonce | acceptor's nonce)
//! signer = b'c' (the side that dialed) or b's' (the side that accepted)
//! ```
//!
//! A tag signs the whole session: both nodes' identities and both nonces, in the order of
//! the direction (who dialed whom), and which end signs. Each side checks the other's tag in
//! constant time (`ring::hmac::verify`) against the message the *other* end of this very
//! session signs. So a proof is good for one session, one direction and one signer only:
//!
//! * replay: the nonces are fresh on both ends, a recorded tag covers other nonces;
//! * reflection within a session (a peer echoing our bytes): the peer would present our own
//!   node id or nonce, which is refused ([`AuthFailure::Reflected`]); the signer byte makes
//!   our own tag useless as the other end's anyway;
//! * reflection across sessions (an attacker gets node A to dial it and dials A at the same
//!   time, then feeds each session A's nonce and proof of the other): every tag A makes has
//!   A's node id in A's own place, so A would accept it only from a peer that presented A's
//!   id, which A refuses. Version 1 signed `signer | own nonce | other's nonce` and fell to
//!   this (the test `a_proof_reflected_between_two_sessions_of_one_node_does_not_pass`).
//!
//! A node id is random, made with the [`Secret`] (a daemon's dialer and acceptor share one
//! `Secret`, hence one id; another daemon, even with the same key, has another). A wrong
//! secret fails on both ends, as each verifies a tag made with the other key. The whole
//! exchange is bounded by [`HANDSHAKE_TIMEOUT`] and reads exactly [`HELLO_LEN`] +
//! [`TAG_LEN`] bytes.
//!
//! Limits: this authenticates the two ends when the connection opens; it neither encrypts
//! nor protects the frames that follow, so an attacker on the path between the nodes can
//! read and alter them. Node ids are not tied to an address the dialer expected, so an
//! attacker that gets node A to dial it and can reach node B may relay the handshake
//! between A and B unchanged (a man in the middle, which the unencrypted connection admits
//! anyway). The connection is meant for the cluster's own network.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// What each side sends first: says what speaks and which version of the protocol.
pub const MAGIC: &[u8; 15] = b"zerohop-peer/2\n";

/// What the tags are about, so a tag made with the same secret for another purpose (or by
/// version 1 of this handshake) never passes here.
const CONTEXT: &[u8] = b"zerohop peer connection authentication v2";

/// Length of a node's id.
pub const NODE_ID_LEN: usize = 16;

/// Length of each side's nonce.
pub const NONCE_LEN: usize = 32;

/// Length of a hello: [`MAGIC`], node id, nonce.
pub const HELLO_LEN: usize = MAGIC.len() + NODE_ID_LEN + NONCE_LEN;

/// Length of a tag (HMAC-SHA256).
pub const TAG_LEN: usize = 32;

/// The bound on the whole handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// The shortest secret accepted from a file.
pub const MIN_SECRET_LEN: usize = 16;

/// The secret the nodes of a cluster share (typically a Kubernetes Secret mounted into the
/// agent's pod), and the random id of the node that holds it. Its `Debug` shows only the
/// key's length.
pub struct Secret {
    key: hmac::Key,
    len: usize,
    node: [u8; NODE_ID_LEN],
}

impl Secret {
    /// A secret from its bytes, as they are (no length check: [`Secret::from_file`] makes
    /// that one), with a fresh node id.
    pub fn new(bytes: &[u8]) -> Secret {
        let key = hmac::Key::new(hmac::HMAC_SHA256, bytes);
        let node = node_id();
        Secret {
            key,
            len: bytes.len(),
            node,
        }
    }

    /// Reads the secret from `path`, without its trailing whitespace (a newline an editor or
    /// `kubectl create secret --from-file` left), and refuses one shorter than
    /// [`MIN_SECRET_LEN`] bytes.
    pub fn from_file(path: &Path) -> Result<Secret, SecretError> {
        let bytes = std::fs::read(path).map_err(|source| SecretError::Read {
            path: path.to_owned(),
            source,
        })?;
        let key = bytes.trim_ascii_end();
        if key.len() < MIN_SECRET_LEN {
            return Err(SecretError::TooShort {
                path: path.to_owned(),
                len: key.len(),
            });
        }
        Ok(Secret::new(key))
    }

    /// The id this node presents in its handshakes (random, one per `Secret`).
    pub fn node_id(&self) -> [u8; NODE_ID_LEN] {
        self.node
    }
}

/// Why the peer secret could not be read from its file ([`Secret::from_file`]). Apart from
/// [`AuthFailure`]: that one is about a connection, this one about the node's own setup.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    /// The file could not be read.
    #[error("cannot read the peer secret {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// What reading it said.
        source: std::io::Error,
    },
    /// The file holds fewer than [`MIN_SECRET_LEN`] bytes.
    #[error(
        "the peer secret {} holds {len} bytes (without trailing whitespace); at least \
         {MIN_SECRET_LEN} are needed, e.g. `head -c 32 /dev/urandom | base64 > {}`",
        path.display(),
        path.display()
    )]
    TooShort {
        /// The file.
        path: PathBuf,
        /// How many bytes it holds, without trailing whitespace.
        len: usize,
    },
}

/// A fresh node id, from the system's RNG. Should the RNG fail here, it fails for every
/// handshake's nonce too (`AuthFailure::Random`), so an id made without it never reaches a
/// peer.
fn node_id() -> [u8; NODE_ID_LEN] {
    let mut id = [0u8; NODE_ID_LEN];
    let _ = SystemRandom::new().fill(&mut id);
    id
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Secret({} bytes)", self.len)
    }
}

/// Which end of the connection a side is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// The side that connected (dialed).
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
    /// The peer presented this node's own id or nonce: our own bytes sent back, or those of
    /// another session of ours.
    #[error("the peer presented this node's own identity or nonce (a reflection)")]
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
    let reason = match tokio::time::timeout(limit, authenticate(io, secret, role)).await {
        Ok(Ok(())) => return Ok(()),
        Ok(Err(reason)) => reason,
        Err(_) => AuthFailure::Timeout(limit),
    };
    Err(AuthError { peer, reason })
}

/// The handshake itself, without a bound in time: [`handshake`] bounds it (the fuzz target
/// drives it directly). Writes [`HELLO_LEN`] + [`TAG_LEN`] bytes and reads as many, no more.
pub async fn authenticate<S>(io: &mut S, secret: &Secret, role: Role) -> Result<(), AuthFailure>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut ours = [0u8; NONCE_LEN];
    SystemRandom::new()
        .fill(&mut ours)
        .map_err(|_| AuthFailure::Random)?;
    let mut hello = [0u8; HELLO_LEN];
    hello[..MAGIC.len()].copy_from_slice(MAGIC);
    hello[MAGIC.len()..MAGIC.len() + NODE_ID_LEN].copy_from_slice(&secret.node);
    hello[MAGIC.len() + NODE_ID_LEN..].copy_from_slice(&ours);
    // Both sides write before they read: the few bytes fit any socket buffer, so neither
    // waits for the other.
    io.write_all(&hello).await?;
    io.flush().await?;
    let mut theirs = [0u8; HELLO_LEN];
    io.read_exact(&mut theirs).await?;
    if &theirs[..MAGIC.len()] != MAGIC {
        return Err(AuthFailure::WrongMagic);
    }
    let mut their_node = [0u8; NODE_ID_LEN];
    their_node.copy_from_slice(&theirs[MAGIC.len()..MAGIC.len() + NODE_ID_LEN]);
    let mut their_nonce = [0u8; NONCE_LEN];
    their_nonce.copy_from_slice(&theirs[MAGIC.len() + NODE_ID_LEN..]);
    if their_node == secret.node || their_nonce == ours {
        return Err(AuthFailure::Reflected);
    }
    let ours = Side {
        node: secret.node,
        nonce: ours,
    };
    let theirs = Side {
        node: their_node,
        nonce: their_nonce,
    };
    let session = match role {
        Role::Client => Session {
            dialer: ours,
            acceptor: theirs,
        },
        Role::Server => Session {
            dialer: theirs,
            acceptor: ours,
        },
    };

    let tag = hmac::sign(&secret.key, &session.message(role));
    io.write_all(tag.as_ref()).await?;
    io.flush().await?;
    let mut their_tag = [0u8; TAG_LEN];
    io.read_exact(&mut their_tag).await?;
    hmac::verify(&secret.key, &session.message(role.other()), &their_tag)
        .map_err(|_| AuthFailure::WrongSecret)
}

/// One end of a session: what its hello said.
#[derive(Clone, Copy)]
struct Side {
    node: [u8; NODE_ID_LEN],
    nonce: [u8; NONCE_LEN],
}

/// A session as both ends see it, in the order of its direction.
struct Session {
    dialer: Side,
    acceptor: Side,
}

impl Session {
    /// What `signer` signs: the context, the signer, both ids and both nonces, the dialer's
    /// first (fixed lengths, so the concatenation is unambiguous).
    fn message(&self, signer: Role) -> Vec<u8> {
        let mut m = Vec::with_capacity(CONTEXT.len() + 1 + 2 * (NODE_ID_LEN + NONCE_LEN));
        m.extend_from_slice(CONTEXT);
        m.push(signer.byte());
        m.extend_from_slice(&self.dialer.node);
        m.extend_from_slice(&self.acceptor.node);
        m.extend_from_slice(&self.dialer.nonce);
        m.extend_from_slice(&self.acceptor.nonce);
        m
    }
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
            // As long as a hello: the preamble is what is wrong.
            let mut http = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec();
            http.resize(HELLO_LEN, b'.');
            s.write_all(&http).await.unwrap();
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

    /// A peer without the secret that sends back whatever it receives: our hello (as it
    /// came, or with another nonce, or with another node id too), then our own tag.
    async fn mirror(mut s: DuplexStream, change: usize) {
        let mut hello = [0u8; HELLO_LEN];
        if s.read_exact(&mut hello).await.is_err() {
            return;
        }
        if change >= 1 {
            hello[HELLO_LEN - 1] ^= 1;
        }
        if change >= 2 {
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
        for change in 0..3 {
            for role in [Role::Client, Role::Server] {
                let (mut c, s) = duplex(1024);
                let m = tokio::spawn(mirror(s, change));
                let e = handshake(&mut c, &Secret::new(KEY), role, addr())
                    .await
                    .unwrap_err();
                if change < 2 {
                    // Our own id (and nonce) coming back is refused before any tag.
                    assert!(matches!(e.reason, AuthFailure::Reflected), "{e}");
                } else {
                    // Under another id, our own tag is not the other end's.
                    assert!(matches!(e.reason, AuthFailure::WrongSecret), "{e}");
                }
                drop(c);
                m.await.unwrap();
            }
        }
    }

    /// A tag recorded from one connection does not open another: the nonces differ.
    #[tokio::test]
    async fn a_replayed_tag_does_not_pass() {
        let server_secret = Secret::new(KEY);
        // What a genuine client (another node with the key) sent on an earlier connection
        // to this server: its hello and its tag.
        let client = Secret::new(KEY);
        let client_nonce = [7u8; NONCE_LEN];
        let then = Session {
            dialer: Side {
                node: client.node_id(),
                nonce: client_nonce,
            },
            acceptor: Side {
                node: server_secret.node_id(),
                nonce: [9u8; NONCE_LEN],
            },
        };
        let recorded = hmac::sign(&client.key, &then.message(Role::Client));
        // Replay it to the server, which picks a fresh nonce.
        let (mut attacker, mut server) = duplex(1024);
        let replay = async {
            let mut hello = MAGIC.to_vec();
            hello.extend_from_slice(&client.node_id());
            hello.extend_from_slice(&client_nonce);
            attacker.write_all(&hello).await.unwrap();
            let mut theirs = [0u8; HELLO_LEN];
            attacker.read_exact(&mut theirs).await.unwrap();
            attacker.write_all(recorded.as_ref()).await.unwrap();
            attacker
        };
        let (r, _attacker) = tokio::join!(
            handshake(&mut server, &server_secret, Role::Server, addr()),
            replay
        );
        let e = r.unwrap_err();
        assert!(matches!(e.reason, AuthFailure::WrongSecret), "{e}");
    }

    /// What the two ends sign differs by signer, by direction, by either id and by either
    /// nonce: a proof stands for exactly one session and one end of it.
    #[test]
    fn every_part_of_the_session_changes_what_is_signed() {
        let side = |n: u8| Side {
            node: [n; NODE_ID_LEN],
            nonce: [n + 100; NONCE_LEN],
        };
        let base = Session {
            dialer: side(1),
            acceptor: side(2),
        };
        let m = base.message(Role::Client);
        assert_ne!(m, base.message(Role::Server));
        let reversed = Session {
            dialer: side(2),
            acceptor: side(1),
        };
        assert_ne!(m, reversed.message(Role::Client));
        assert_ne!(m, reversed.message(Role::Server));
        for change in 0..4 {
            let mut s = Session {
                dialer: side(1),
                acceptor: side(2),
            };
            match change {
                0 => s.dialer.node[0] ^= 1,
                1 => s.acceptor.node[NODE_ID_LEN - 1] ^= 1,
                2 => s.dialer.nonce[0] ^= 1,
                _ => s.acceptor.nonce[NONCE_LEN - 1] ^= 1,
            }
            assert_ne!(m, s.message(Role::Client), "change {change}");
        }
        assert!(m.starts_with(CONTEXT));
        assert_eq!(m.len(), CONTEXT.len() + 1 + 2 * (NODE_ID_LEN + NONCE_LEN));
    }

    #[test]
    fn each_secret_is_a_node_of_its_own() {
        let (a, b) = (Secret::new(KEY), Secret::new(KEY));
        assert_ne!(a.node_id(), b.node_id());
        assert_ne!(node_id(), node_id());
    }

    /// Node A dials the attacker (session 1) while the attacker dials A (session 2); the
    /// attacker, without the key, hands each session A's own nonce of the other and
    /// forwards A's proofs between them. Neither session may pass.
    #[tokio::test]
    async fn a_proof_reflected_between_two_sessions_of_one_node_does_not_pass() {
        let a = Secret::new(KEY);
        let (a_dials, mut m1) = duplex(1024);
        let (a_accepts, mut m2) = duplex(1024);
        let attacker = async {
            let mut h1 = [0u8; HELLO_LEN];
            let mut h2 = [0u8; HELLO_LEN];
            m1.read_exact(&mut h1).await.unwrap();
            m2.read_exact(&mut h2).await.unwrap();
            // Each session gets the other's hello, nonce and all: the attacker claims to be
            // whoever A is in the other session.
            let _ = m1.write_all(&h2).await;
            let _ = m2.write_all(&h1).await;
            let mut t1 = [0u8; TAG_LEN];
            let mut t2 = [0u8; TAG_LEN];
            let (r1, r2) = tokio::join!(m1.read_exact(&mut t1), m2.read_exact(&mut t2));
            if r1.is_ok() && r2.is_ok() {
                let _ = m2.write_all(&t1).await;
                let _ = m1.write_all(&t2).await;
            }
            (m1, m2)
        };
        // Each session closes its connection when it ends, as a real one does.
        let dialer = async {
            let mut io = a_dials;
            handshake(&mut io, &a, Role::Client, addr()).await
        };
        let acceptor = async {
            let mut io = a_accepts;
            handshake(&mut io, &a, Role::Server, addr()).await
        };
        let (dialer, acceptor, _m) = tokio::join!(dialer, acceptor, attacker);
        for r in [dialer, acceptor] {
            let e = r.expect_err("a session passed without the key");
            assert!(matches!(e.reason, AuthFailure::Reflected), "{e}");
        }
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
        assert!(matches!(e, SecretError::TooShort { len: 15, .. }), "{e}");
        let e = e.to_string();
        assert!(e.contains(&short.display().to_string()), "{e}");
        assert!(e.contains("15 bytes"), "{e}");
        assert!(e.contains("at least 16"), "{e}");

        let missing = dir.path().join("missing");
        let e = Secret::from_file(&missing).unwrap_err();
        assert!(matches!(e, SecretError::Read { .. }), "{e}");
        let e = e.to_string();
        assert!(e.contains(&missing.display().to_string()), "{e}");
    }

    #[test]
    fn debug_does_not_show_the_key() {
        let shown = format!("{:?}", Secret::new(KEY));
        assert!(!shown.contains("0123"), "{shown}");
    }
}
