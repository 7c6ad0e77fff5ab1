//! Block-wise transfers (RFC 7959): request bodies that arrive in Block1 pieces are put
//! together here, and responses larger than a block are held here for the Block2 requests
//! that fetch their other blocks.
//!
//! Both tables are bounded: at most [`MAX_UPLOADS`] bodies being assembled holding at most
//! [`MAX_UPLOAD_BYTES`] together (each at most the chain's `max_body`, each dropped
//! `body_timeout` after its first block), and at most [`MAX_HELD`] responses holding at most
//! [`MAX_HELD_BYTES`] together, each for [`HOLD`].

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use super::message::{codes, Block, Response};

/// Most request bodies assembled at once.
pub(super) const MAX_UPLOADS: usize = 64;
/// Most bytes of request bodies assembled at once.
pub(super) const MAX_UPLOAD_BYTES: usize = 64 << 20;
/// Most responses held for Block2 requests.
pub(super) const MAX_HELD: usize = 256;
/// Most bytes of responses held for Block2 requests.
pub(super) const MAX_HELD_BYTES: usize = 64 << 20;
/// How long a response is held for the Block2 requests of its other blocks.
pub(super) const HOLD: Duration = Duration::from_secs(60);
/// What a client is told to wait (Max-Age, seconds) when the tables are full.
pub(super) const RETRY_SECONDS: u32 = 1;

/// A body in assembly is its sender's, for one path, told apart from the sender's other
/// uploads to that path by the Request-Tag option (RFC 9175; empty without one). Tokens do
/// not take part: a client may use a new token for every block.
pub(super) type UploadKey = (SocketAddr, String, Vec<u8>);

/// A held response is its requester's, for one path.
pub(super) type HeldKey = (SocketAddr, String);

/// The chain's limits that apply to a body.
#[derive(Clone, Copy, Debug)]
pub(super) struct Limits {
    pub max_body: u64,
    pub body_timeout: Duration,
}

impl Limits {
    /// 4.13 with Size1 saying how much the chain takes (RFC 7959 section 4).
    pub fn too_large(&self) -> Response {
        let mut r = Response::diagnostic(
            codes::TOO_LARGE,
            format!(
                "gateway: request body exceeds the chain's limit of {} bytes (max_body)",
                self.max_body
            ),
        );
        r.size1 = Some(u32::try_from(self.max_body).unwrap_or(u32::MAX));
        r
    }
}

/// What a Block1 request leads to.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Step {
    /// More blocks to come: 2.31 Continue with this Block1 option.
    Continue(Block),
    /// The last block arrived: the whole body, and the Block1 option of the final response.
    Complete { chunks: Vec<Vec<u8>>, block: Block },
    /// The transfer failed (its state is gone): this error.
    Fail(Response),
}

struct Upload {
    chunks: Vec<Vec<u8>>,
    len: usize,
    deadline: Instant,
}

fn busy(what: String) -> Response {
    let mut r = Response::diagnostic(codes::UNAVAILABLE, what);
    r.max_age = Some(RETRY_SECONDS);
    r
}

/// Request bodies being assembled from Block1 requests.
pub(super) struct Uploads {
    map: HashMap<UploadKey, Upload>,
    bytes: usize,
    max_uploads: usize,
    max_bytes: usize,
}

impl Default for Uploads {
    fn default() -> Self {
        Self::new(MAX_UPLOADS, MAX_UPLOAD_BYTES)
    }
}

impl Uploads {
    pub fn new(max_uploads: usize, max_bytes: usize) -> Self {
        Self {
            map: HashMap::new(),
            bytes: 0,
            max_uploads,
            max_bytes,
        }
    }

    fn remove(&mut self, key: &UploadKey) -> Option<Upload> {
        let u = self.map.remove(key)?;
        self.bytes -= u.len;
        Some(u)
    }

    /// Takes block `block` of the body `key` (RFC 7959 section 2.5). Block 0 starts a body
    /// (again); each later block must start where the body so far ends (a repeated earlier
    /// block is acknowledged again and not appended); a block with the M bit set carries
    /// exactly its size. A gap is 4.08, a body over `max_body` 4.13 (also when Size1 says
    /// so up front).
    pub fn block(
        &mut self,
        key: UploadKey,
        block: Block,
        payload: Vec<u8>,
        size1: Option<u32>,
        limits: &Limits,
        now: Instant,
    ) -> Step {
        let size = block.size();
        if (block.more && payload.len() != size) || payload.len() > size {
            self.remove(&key);
            return Step::Fail(Response::diagnostic(
                codes::BAD_REQUEST,
                format!(
                    "gateway: block {} carries {} bytes; a block of {size} bytes{} carries {}",
                    block.num,
                    payload.len(),
                    if block.more { " with more to come" } else { "" },
                    if block.more {
                        "exactly that"
                    } else {
                        "at most that"
                    }
                ),
            ));
        }
        if block.num == 0 {
            self.remove(&key);
            if size1.is_some_and(|s| u64::from(s) > limits.max_body)
                || payload.len() as u64 > limits.max_body
            {
                return Step::Fail(limits.too_large());
            }
            if !block.more {
                return Step::Complete {
                    chunks: vec![payload],
                    block,
                };
            }
            if self.map.len() >= self.max_uploads {
                return Step::Fail(busy(format!(
                    "gateway: {} block-wise uploads are open already; retry",
                    self.map.len()
                )));
            }
            if self.bytes + payload.len() > self.max_bytes {
                return Step::Fail(busy(format!(
                    "gateway: block-wise uploads hold {} bytes already; retry",
                    self.bytes
                )));
            }
            self.bytes += payload.len();
            self.map.insert(
                key,
                Upload {
                    len: payload.len(),
                    chunks: vec![payload],
                    deadline: now + limits.body_timeout,
                },
            );
            return Step::Continue(block);
        }
        let Some(up) = self.map.get(&key) else {
            return Step::Fail(Response::diagnostic(
                codes::INCOMPLETE,
                format!(
                    "gateway: block {} arrived without the blocks before it; start again from block 0",
                    block.num
                ),
            ));
        };
        if now >= up.deadline {
            self.remove(&key);
            return Step::Fail(Response::diagnostic(
                codes::INCOMPLETE,
                format!(
                    "gateway: the request body did not arrive within {:?} (body_timeout); start again from block 0",
                    limits.body_timeout
                ),
            ));
        }
        let offset = block.offset();
        if offset < up.len && offset + payload.len() <= up.len && block.more {
            // A block already taken, sent again under a new message id.
            return Step::Continue(block);
        }
        if offset != up.len {
            let have = up.len;
            self.remove(&key);
            return Step::Fail(Response::diagnostic(
                codes::INCOMPLETE,
                format!(
                    "gateway: block {} starts at byte {offset}, but {have} bytes arrived so far; \
                     start again from block 0",
                    block.num
                ),
            ));
        }
        if (up.len + payload.len()) as u64 > limits.max_body {
            self.remove(&key);
            return Step::Fail(limits.too_large());
        }
        if self.bytes + payload.len() > self.max_bytes {
            self.remove(&key);
            return Step::Fail(busy(format!(
                "gateway: block-wise uploads hold {} bytes already; retry",
                self.bytes
            )));
        }
        self.bytes += payload.len();
        let up = self.map.get_mut(&key).expect("looked up above");
        up.len += payload.len();
        up.chunks.push(payload);
        if block.more {
            return Step::Continue(block);
        }
        let up = self.remove(&key).expect("looked up above");
        Step::Complete {
            chunks: up.chunks,
            block,
        }
    }

    /// Drops bodies whose `body_timeout` passed.
    pub fn expire(&mut self, now: Instant) {
        let mut freed = 0;
        self.map.retain(|_, u| {
            let keep = now < u.deadline;
            if !keep {
                freed += u.len;
            }
            keep
        });
        self.bytes -= freed;
    }

    #[cfg(test)]
    fn bytes(&self) -> usize {
        self.bytes
    }
}

struct HeldResponse {
    response: Response,
    until: Instant,
}

/// Whole responses kept for the Block2 requests of their later blocks.
pub(super) struct Held {
    map: HashMap<HeldKey, HeldResponse>,
    bytes: usize,
    max_entries: usize,
    max_bytes: usize,
}

impl Default for Held {
    fn default() -> Self {
        Self::new(MAX_HELD, MAX_HELD_BYTES)
    }
}

impl Held {
    pub fn new(max_entries: usize, max_bytes: usize) -> Self {
        Self {
            map: HashMap::new(),
            bytes: 0,
            max_entries: max_entries.max(1),
            max_bytes,
        }
    }

    /// Drops the response held for `key`, if any.
    pub fn forget(&mut self, key: &HeldKey) {
        if let Some(h) = self.map.remove(key) {
            self.bytes -= h.response.payload.len();
        }
    }

    /// Takes the response held for `key`, if it is still held.
    pub fn take(&mut self, key: &HeldKey, now: Instant) -> Option<Response> {
        let h = self.map.remove(key)?;
        self.bytes -= h.response.payload.len();
        (now < h.until).then_some(h.response)
    }

    /// Keeps `response` for `key` (replacing the one it had), making room by dropping the
    /// responses that would expire first. A response larger than all the room there is is
    /// not kept: its later blocks then get 4.08.
    pub fn hold(&mut self, key: HeldKey, response: Response, now: Instant) -> bool {
        self.forget(&key);
        let len = response.payload.len();
        if len > self.max_bytes {
            return false;
        }
        while !self.map.is_empty()
            && (self.map.len() >= self.max_entries || self.bytes + len > self.max_bytes)
        {
            let oldest = self
                .map
                .iter()
                .min_by_key(|(_, h)| h.until)
                .map(|(k, _)| k.clone());
            match oldest {
                Some(k) => self.forget(&k),
                None => break,
            }
        }
        self.bytes += len;
        self.map.insert(
            key,
            HeldResponse {
                response,
                until: now + HOLD,
            },
        );
        true
    }

    /// The answer to a Block2 request for block `block` of the response held for `key`.
    pub fn block(&self, key: &HeldKey, block: Block, now: Instant) -> Response {
        let Some(h) = self.map.get(key).filter(|h| now < h.until) else {
            return Response::diagnostic(
                codes::INCOMPLETE,
                format!(
                    "gateway: no response to {} is held for block {} (it expired or never was); \
                     send the request again",
                    key.1, block.num
                ),
            );
        };
        h.response.block(block).unwrap_or_else(|| {
            Response::diagnostic(
                codes::BAD_OPTION,
                format!(
                    "gateway: block {} of {} bytes is past the end of the {}-byte response",
                    block.num,
                    block.size(),
                    h.response.payload.len()
                ),
            )
        })
    }

    /// Drops responses held for longer than [`HOLD`].
    pub fn expire(&mut self, now: Instant) {
        let mut freed = 0;
        self.map.retain(|_, h| {
            let keep = now < h.until;
            if !keep {
                freed += h.response.payload.len();
            }
            keep
        });
        self.bytes -= freed;
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;

    const LIMITS: Limits = Limits {
        max_body: 100,
        body_timeout: Duration::from_secs(10),
    };

    fn key(tag: &[u8]) -> UploadKey {
        (
            SocketAddr::from(([127, 0, 0, 1], 5000)),
            "/up".into(),
            tag.to_vec(),
        )
    }

    fn b(num: u32, more: bool) -> Block {
        Block { num, more, szx: 0 }
    }

    fn code(s: &Step) -> u8 {
        match s {
            Step::Fail(r) => r.code,
            _ => 0,
        }
    }

    #[test]
    fn blocks_in_order_make_the_body() {
        let now = Instant::now();
        let mut u = Uploads::default();
        assert_eq!(
            u.block(key(b""), b(0, true), vec![1; 16], None, &LIMITS, now),
            Step::Continue(b(0, true))
        );
        assert_eq!(
            u.block(key(b""), b(1, true), vec![2; 16], None, &LIMITS, now),
            Step::Continue(b(1, true))
        );
        // Block 1 again (a new message id): acknowledged, not appended.
        assert_eq!(
            u.block(key(b""), b(1, true), vec![2; 16], None, &LIMITS, now),
            Step::Continue(b(1, true))
        );
        // Another upload by the same peer to the same path, told apart by its Request-Tag.
        assert_eq!(
            u.block(key(b"t"), b(0, true), vec![9; 16], None, &LIMITS, now),
            Step::Continue(b(0, true))
        );
        match u.block(key(b""), b(2, false), vec![3; 5], None, &LIMITS, now) {
            Step::Complete { chunks, block } => {
                assert_eq!(chunks, vec![vec![1; 16], vec![2; 16], vec![3; 5]]);
                assert_eq!(block, b(2, false));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(u.bytes(), 16);
        u.expire(now + Duration::from_secs(11));
        assert_eq!(u.bytes(), 0);
        // A single block with M unset is a whole body.
        assert!(matches!(
            u.block(key(b""), b(0, false), vec![1; 3], None, &LIMITS, now),
            Step::Complete { .. }
        ));
    }

    #[test]
    fn gaps_sizes_limits_and_timeouts_fail_and_forget_the_body() {
        let now = Instant::now();
        let mut u = Uploads::new(2, 40);
        // A later block with no start.
        let s = u.block(key(b""), b(3, true), vec![0; 16], None, &LIMITS, now);
        assert_eq!(code(&s), codes::INCOMPLETE);
        // A gap.
        u.block(key(b""), b(0, true), vec![0; 16], None, &LIMITS, now);
        let s = u.block(key(b""), b(2, true), vec![0; 16], None, &LIMITS, now);
        assert_eq!(code(&s), codes::INCOMPLETE);
        assert_eq!(u.bytes(), 0);
        // A short block with M set.
        let s = u.block(key(b""), b(0, true), vec![0; 15], None, &LIMITS, now);
        assert_eq!(code(&s), codes::BAD_REQUEST);
        // Size1 over max_body, up front.
        let s = u.block(key(b""), b(0, true), vec![0; 16], Some(101), &LIMITS, now);
        assert_eq!(code(&s), codes::TOO_LARGE);
        let Step::Fail(r) = s else { unreachable!() };
        assert_eq!(r.size1, Some(100));
        // Over max_body on the way.
        let big = Limits {
            max_body: 40,
            ..LIMITS
        };
        u.block(key(b""), b(0, true), vec![0; 16], None, &big, now);
        u.block(key(b""), b(1, true), vec![0; 16], None, &big, now);
        let s = u.block(key(b""), b(2, true), vec![0; 16], None, &big, now);
        assert_eq!(code(&s), codes::TOO_LARGE);
        assert_eq!(u.bytes(), 0);
        // Too many uploads at once, too many bytes at once.
        u.block(key(b"1"), b(0, true), vec![0; 16], None, &LIMITS, now);
        u.block(key(b"2"), b(0, true), vec![0; 16], None, &LIMITS, now);
        let s = u.block(key(b"3"), b(0, true), vec![0; 16], None, &LIMITS, now);
        assert_eq!(code(&s), codes::UNAVAILABLE);
        let s = u.block(key(b"1"), b(1, true), vec![0; 16], None, &LIMITS, now);
        assert_eq!(code(&s), codes::UNAVAILABLE, "40-byte cap");
        // Past body_timeout.
        let s = u.block(
            key(b"2"),
            b(1, true),
            vec![0; 16],
            None,
            &LIMITS,
            now + Duration::from_secs(10),
        );
        assert_eq!(code(&s), codes::INCOMPLETE);
        assert_eq!(u.bytes(), 0);
    }

    #[test]
    fn held_responses_serve_blocks_and_stay_bounded() {
        let now = Instant::now();
        let peer = SocketAddr::from(([127, 0, 0, 1], 1));
        let mut h = Held::new(2, 3000);
        let resp = |n: usize| Response {
            code: codes::CHANGED,
            payload: Bytes::from(vec![7; n]),
            ..Response::default()
        };
        assert!(h.hold((peer, "/a".into()), resp(2000), now));
        let r = h.block(
            &(peer, "/a".into()),
            Block {
                num: 1,
                more: false,
                szx: 6,
            },
            now,
        );
        assert_eq!(r.payload.len(), 976);
        assert_eq!(r.block2.map(|b| b.more), Some(false));
        // Past the end.
        let r = h.block(
            &(peer, "/a".into()),
            Block {
                num: 2,
                more: false,
                szx: 6,
            },
            now,
        );
        assert_eq!(r.code, codes::BAD_OPTION);
        // Room is made by dropping the oldest.
        assert!(h.hold(
            (peer, "/b".into()),
            resp(2000),
            now + Duration::from_secs(1)
        ));
        assert_eq!(h.bytes, 2000);
        let r = h.block(
            &(peer, "/a".into()),
            Block {
                num: 1,
                more: false,
                szx: 6,
            },
            now,
        );
        assert_eq!(r.code, codes::INCOMPLETE);
        // Larger than all the room: not held.
        assert!(!h.hold((peer, "/c".into()), resp(3001), now));
        h.expire(now + HOLD + Duration::from_secs(2));
        assert_eq!((h.map.len(), h.bytes), (0, 0));
    }
}
