//! Which client addresses have shown that they receive what the gateway sends them, so that
//! the gateway never amplifies towards an address that may be spoofed (RFC 9175 section 2.4).
//!
//! UDP's source address is whatever the sender wrote. Until an address proves it receives,
//! the gateway sends in reply to each of its datagrams at most as many bytes as that datagram
//! carried (amplification factor 1): the reply to a message and to each of its duplicates
//! fits the message; no empty ACK goes out ahead of a slow answer (the client's own
//! retransmissions fetch it) and no separate response is sent or retransmitted. An answer
//! that does not fit is replaced by a 4.01 Unauthorized carrying an Echo option (RFC 9175),
//! or by nothing when even that does not fit; a request that ran the chain keeps its answer
//! for [`super::blockwise::HOLD`] (`pending`), so the client's repetition gets it without
//! running the chain again.
//!
//! An address proves it receives by sending a request with an Echo value the gateway sent
//! it: [`ECHO_LEN`] bytes, a coarse time and a MAC over the address and that time under a
//! key drawn at start-up (SipHash-1-3 with a random 128-bit key, std's `RandomState`), so
//! only a receiver of the challenge can present it, for [`ECHO_FRESH`]. The address then
//! counts as verified for [`VERIFIED_FOR`], in a table of at most [`MAX_VERIFIED`] addresses
//! (the oldest goes first: it only has to prove itself again). Nothing an unverified address
//! sends changes the table, so spoofing cannot fill it.

use std::collections::hash_map::RandomState;
use std::collections::{HashMap, VecDeque};
use std::hash::BuildHasher;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// Bytes of an Echo value: a 2-byte time in [`TICK`]s and a 6-byte MAC.
pub(super) const ECHO_LEN: usize = 8;
/// How long an Echo value is accepted after it was sent.
pub(super) const ECHO_FRESH: Duration = Duration::from_secs(300);
/// How long an address counts as verified after it presented an Echo value.
pub(super) const VERIFIED_FOR: Duration = Duration::from_secs(600);
/// Most verified addresses remembered.
pub(super) const MAX_VERIFIED: usize = 16384;
/// The unit of an Echo value's time.
const TICK: Duration = Duration::from_secs(4);

/// The Echo key and the verified addresses.
pub(super) struct Reachability {
    key: RandomState,
    start: Instant,
    /// When each address was verified, and its place in `order`.
    verified: HashMap<SocketAddr, (Instant, u64)>,
    /// Addresses in the order they were verified, with their place (a stale one, of an
    /// address verified again since, is skipped).
    order: VecDeque<(SocketAddr, u64)>,
    next: u64,
    capacity: usize,
}

impl Default for Reachability {
    fn default() -> Self {
        Self::new(MAX_VERIFIED)
    }
}

impl Reachability {
    pub fn new(capacity: usize) -> Self {
        Self {
            key: RandomState::new(),
            start: Instant::now(),
            verified: HashMap::new(),
            order: VecDeque::new(),
            next: 0,
            capacity: capacity.max(1),
        }
    }

    fn tick(&self, now: Instant) -> u16 {
        (now.saturating_duration_since(self.start).as_secs() / TICK.as_secs()) as u16
    }

    fn mac(&self, peer: SocketAddr, tick: u16) -> [u8; 6] {
        let h = self.key.hash_one((peer, tick)).to_be_bytes();
        [h[0], h[1], h[2], h[3], h[4], h[5]]
    }

    /// The Echo value to challenge `peer` with.
    pub fn echo(&self, peer: SocketAddr, now: Instant) -> Vec<u8> {
        let tick = self.tick(now);
        let mut v = tick.to_be_bytes().to_vec();
        v.extend_from_slice(&self.mac(peer, tick));
        v
    }

    /// Whether `value` is an Echo value sent to `peer` within [`ECHO_FRESH`].
    pub fn check(&self, peer: SocketAddr, value: &[u8], now: Instant) -> bool {
        let Ok(v) = <[u8; ECHO_LEN]>::try_from(value) else {
            return false;
        };
        let tick = u16::from_be_bytes([v[0], v[1]]);
        let age = self.tick(now).wrapping_sub(tick);
        u64::from(age) * TICK.as_secs() <= ECHO_FRESH.as_secs() && v[2..] == self.mac(peer, tick)
    }

    /// Counts `peer` as verified from `now` (it presented a valid Echo value).
    pub fn verify(&mut self, peer: SocketAddr, now: Instant) {
        let seq = self.next;
        self.next += 1;
        self.verified.insert(peer, (now, seq));
        self.order.push_back((peer, seq));
        while self.verified.len() > self.capacity {
            let Some((p, q)) = self.order.pop_front() else {
                break;
            };
            if self.verified.get(&p).is_some_and(|&(_, s)| s == q) {
                self.verified.remove(&p);
            }
        }
        if self.order.len() > 2 * self.capacity {
            let verified = &self.verified;
            self.order
                .retain(|(p, q)| verified.get(p).is_some_and(|&(_, s)| s == *q));
        }
    }

    /// Whether `peer` proved within [`VERIFIED_FOR`] that it receives.
    pub fn is_verified(&self, peer: SocketAddr, now: Instant) -> bool {
        self.verified
            .get(&peer)
            .is_some_and(|&(t, _)| now.saturating_duration_since(t) < VERIFIED_FOR)
    }

    /// Forgets addresses verified longer ago than [`VERIFIED_FOR`].
    pub fn expire(&mut self, now: Instant) {
        while let Some(&(p, q)) = self.order.front() {
            match self.verified.get(&p) {
                Some(&(t, s)) if s == q => {
                    if now.saturating_duration_since(t) < VERIFIED_FOR {
                        break;
                    }
                    self.verified.remove(&p);
                }
                _ => {}
            }
            self.order.pop_front();
        }
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.verified.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(last: u8, port: u16) -> SocketAddr {
        SocketAddr::from(([192, 0, 2, last], port))
    }

    #[test]
    fn an_echo_value_is_good_for_its_address_and_only_while_fresh() {
        let r = Reachability::new(8);
        let now = r.start + Duration::from_secs(1000);
        let v = r.echo(addr(1, 5000), now);
        assert_eq!(v.len(), ECHO_LEN);
        assert!(r.check(addr(1, 5000), &v, now));
        assert!(r.check(addr(1, 5000), &v, now + ECHO_FRESH - TICK));
        assert!(!r.check(addr(1, 5000), &v, now + ECHO_FRESH + 2 * TICK));
        // Another address, another port, a changed byte, another length: refused.
        assert!(!r.check(addr(2, 5000), &v, now));
        assert!(!r.check(addr(1, 5001), &v, now));
        for i in 0..ECHO_LEN {
            let mut bad = v.clone();
            bad[i] ^= 1;
            assert!(!r.check(addr(1, 5000), &bad, now), "byte {i}");
        }
        assert!(!r.check(addr(1, 5000), &v[..7], now));
        // Another gateway (another key) does not take it either.
        let other = Reachability::new(8);
        assert!(!other.check(addr(1, 5000), &v, now));
    }

    #[test]
    fn verified_addresses_are_bounded_and_expire() {
        let mut r = Reachability::new(4);
        let t0 = Instant::now();
        for i in 0..10 {
            r.verify(addr(i, 1), t0);
            assert!(r.len() <= 4);
        }
        assert!(r.is_verified(addr(9, 1), t0));
        assert!(!r.is_verified(addr(0, 1), t0), "the oldest went");
        assert!(!r.is_verified(addr(9, 1), t0 + VERIFIED_FOR));
        // Verifying again and again keeps the queue bounded.
        for _ in 0..100 {
            r.verify(addr(9, 1), t0);
        }
        assert!(r.order.len() <= 2 * 4 + 1);
        r.expire(t0 + VERIFIED_FOR);
        assert_eq!(r.len(), 0);
    }
}
