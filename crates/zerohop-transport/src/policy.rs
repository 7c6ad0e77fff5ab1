//! Who may send to whom: the chain's allowed edges, derived from its routes.

use std::collections::HashSet;

use crate::PartyId;

pub use zerohop_spec::GATEWAY_FN;

/// Instances of the next function each instance may send to, at least. With many
/// instances on both sides of a hop a full mesh would give every instance a queue to and
/// from each instance of the neighbouring functions: memory, start time and the receiver's
/// scan would all grow with the square of the instances.
pub const FAN_OUT: usize = 8;

/// How many of `b` instances each of `a` senders may send to: [`FAN_OUT`], or more where
/// there are too few senders to reach every receiver, never more than `b`.
pub fn fan_out(a: usize, b: usize) -> usize {
    FAN_OUT.max(b.div_ceil(a.max(1))).min(b)
}

/// Errors building a policy.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PolicyError {
    /// Too many functions for the one-byte function index.
    #[error("a chain may have at most 254 functions, this one has {0}")]
    TooManyFunctions(usize),
}

/// The chain's allowed edges between functions, and which function each party runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Policy {
    /// Function index of each party; party 0 (the gateway) is [`GATEWAY_FN`].
    party_function: Vec<u8>,
    /// Allowed (from function, to function) pairs; the gateway is [`GATEWAY_FN`].
    edges: HashSet<(u8, u8)>,
    /// Per function index (256 entries, the gateway's last), its parties, ascending.
    by_function: Vec<Vec<PartyId>>,
    /// Per function index, the functions it may send to, ascending.
    fn_targets: Vec<Vec<u8>>,
    /// Per function index, the functions that may send to it, ascending.
    fn_senders: Vec<Vec<u8>>,
}

impl Policy {
    /// Builds a policy from each party's function and the allowed function edges.
    pub fn new(
        party_function: Vec<u8>,
        edges: impl IntoIterator<Item = (u8, u8)>,
    ) -> Result<Self, PolicyError> {
        if let Some(&max) = party_function.iter().filter(|&&f| f != GATEWAY_FN).max() {
            if max as usize >= 254 {
                return Err(PolicyError::TooManyFunctions(max as usize + 1));
            }
        }
        // Kept per function, not per party: with a thousand instances a party table of
        // every party's targets would cost each instance hundreds of KiB and a million
        // lookups at start.
        let edges: HashSet<(u8, u8)> = edges.into_iter().collect();
        let mut by_function: Vec<Vec<PartyId>> = vec![Vec::new(); 256];
        for (p, &f) in party_function.iter().enumerate() {
            by_function[f as usize].push(p as PartyId);
        }
        let mut fn_targets: Vec<Vec<u8>> = vec![Vec::new(); 256];
        let mut fn_senders: Vec<Vec<u8>> = vec![Vec::new(); 256];
        for &(from, to) in &edges {
            fn_targets[from as usize].push(to);
            fn_senders[to as usize].push(from);
        }
        for l in fn_targets.iter_mut().chain(fn_senders.iter_mut()) {
            l.sort_unstable();
        }
        Ok(Self {
            party_function,
            edges,
            by_function,
            fn_targets,
            fn_senders,
        })
    }

    /// Two parties, the gateway and one function (index 0), each allowed to send to the
    /// other: the smallest chain, for benchmarks and tests of the transports alone.
    pub fn pair() -> Self {
        Self::new(vec![GATEWAY_FN, 0], [(GATEWAY_FN, 0), (0, GATEWAY_FN)])
            .expect("one function is within the limit")
    }

    /// Parties `party` may send to, ascending (empty for an unknown party). Computed on
    /// each call: for setting up, not for the request path.
    pub fn targets(&self, party: PartyId) -> Vec<PartyId> {
        let Some(f) = self.function_of(party) else {
            return Vec::new();
        };
        let mut out: Vec<PartyId> = self.fn_targets[f as usize]
            .iter()
            .flat_map(|&g| self.targets_running(party, g))
            .collect();
        out.sort_unstable();
        out
    }

    /// Parties that may send to `party`, ascending (empty for an unknown party). Computed on
    /// each call, like [`targets`](Policy::targets).
    pub fn senders(&self, party: PartyId) -> Vec<PartyId> {
        let Some(g) = self.function_of(party) else {
            return Vec::new();
        };
        let mut out: Vec<PartyId> = self.fn_senders[g as usize]
            .iter()
            .flat_map(|&f| self.senders_running(party, f))
            .collect();
        out.sort_unstable();
        out
    }

    /// The parties running function `g` that `party` may send to, ascending: all of them
    /// where the gateway is either end, else the block of [`fan_out`] instances its
    /// position gives it (see [`Policy::allows_parties`]).
    pub fn targets_running(&self, party: PartyId, g: u8) -> Vec<PartyId> {
        let Some(f) = self.function_of(party) else {
            return Vec::new();
        };
        if !self.allows(f, g) {
            return Vec::new();
        }
        let to = &self.by_function[g as usize];
        match self.capped(f, g) {
            None => to.clone(),
            Some(k) => {
                let Ok(i) = self.by_function[f as usize].binary_search(&party) else {
                    return Vec::new();
                };
                let mut out: Vec<PartyId> = (0..k).map(|j| to[(i * k + j) % to.len()]).collect();
                out.sort_unstable();
                out
            }
        }
    }

    /// The parties running function `f` that may send to `party`, ascending.
    fn senders_running(&self, party: PartyId, f: u8) -> Vec<PartyId> {
        let Some(g) = self.function_of(party) else {
            return Vec::new();
        };
        if !self.allows(f, g) {
            return Vec::new();
        }
        let from = &self.by_function[f as usize];
        match self.capped(f, g) {
            None => from.clone(),
            Some(k) => {
                // The arithmetic of `allows_parties` with the receiver's index found once:
                // a start-up of many instances asks this for every party.
                let to = &self.by_function[g as usize];
                let Ok(j) = to.binary_search(&party) else {
                    return Vec::new();
                };
                let b = to.len();
                from.iter()
                    .enumerate()
                    .filter(|&(i, _)| (j + b - (i * k) % b) % b < k)
                    .map(|(_, &s)| s)
                    .collect()
            }
        }
    }

    /// Instances per sender on the function edge `f -> g` when it is capped (neither end is
    /// the gateway, and `g` has more instances than [`fan_out`] gives each sender); `None`
    /// when every instance of `f` may send to every instance of `g`.
    fn capped(&self, f: u8, g: u8) -> Option<usize> {
        if f == GATEWAY_FN || g == GATEWAY_FN {
            return None;
        }
        let (a, b) = (
            self.by_function[f as usize].len(),
            self.by_function[g as usize].len(),
        );
        let k = fan_out(a, b);
        (k < b).then_some(k)
    }

    /// Position of `from` among [`senders`](Policy::senders)`(to)`; `None` when the edge is
    /// not allowed. Builds that list: for setting up.
    pub fn sender_index(&self, from: PartyId, to: PartyId) -> Option<usize> {
        if !self.allows_parties(from, to) {
            return None;
        }
        self.senders(to).binary_search(&from).ok()
    }

    /// Position of `to` among [`targets`](Policy::targets)`(from)`; `None` when the edge is
    /// not allowed. Builds that list: for setting up.
    pub fn target_index(&self, from: PartyId, to: PartyId) -> Option<usize> {
        if !self.allows_parties(from, to) {
            return None;
        }
        self.targets(from).binary_search(&to).ok()
    }

    /// Number of parties.
    pub fn parties(&self) -> u16 {
        self.party_function.len() as u16
    }

    /// Function index run by `party`.
    pub fn function_of(&self, party: PartyId) -> Option<u8> {
        self.party_function.get(party as usize).copied()
    }

    /// Parties running function `f`, ascending.
    pub fn parties_of(&self, f: u8) -> impl Iterator<Item = PartyId> + '_ {
        self.by_function[f as usize].iter().copied()
    }

    /// Whether function `from` may send to function `to`.
    pub fn allows(&self, from: u8, to: u8) -> bool {
        // A short sorted list, cheaper than hashing on paths asked per party.
        self.fn_targets[from as usize].binary_search(&to).is_ok()
    }

    /// Whether party `from` may send to party `to`: their functions are an allowed edge
    /// and, where that edge is capped, `to` is in `from`'s block. With `a` instances of `f`
    /// and `b` of `g` (each in ascending party order) and `k = fan_out(a, b)`, instance `i`
    /// of `f` sends to instances `(i*k + j) mod b` of `g` for `j` in `0..k`: consecutive
    /// blocks that wrap around, so every instance of `g` has about `a*k/b` senders and at
    /// least one. A hop from or to the gateway is never capped.
    pub fn allows_parties(&self, from: PartyId, to: PartyId) -> bool {
        let (Some(f), Some(g)) = (self.function_of(from), self.function_of(to)) else {
            return false;
        };
        if !self.allows(f, g) {
            return false;
        }
        let Some(k) = self.capped(f, g) else {
            return true;
        };
        let (a, b) = (&self.by_function[f as usize], &self.by_function[g as usize]);
        match (a.binary_search(&from), b.binary_search(&to)) {
            (Ok(i), Ok(j)) => (j + b.len() - (i * k) % b.len()) % b.len() < k,
            _ => false,
        }
    }

    /// All allowed edges (unordered).
    pub fn edges(&self) -> impl Iterator<Item = (u8, u8)> + '_ {
        self.edges.iter().copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edges_by_party() {
        // gateway, upper (fn 0) x2, exclaim (fn 1)
        let p = Policy::new(
            vec![GATEWAY_FN, 0, 0, 1],
            [(GATEWAY_FN, 0), (0, 1), (1, GATEWAY_FN)],
        )
        .unwrap();
        assert!(p.allows_parties(0, 1));
        assert!(p.allows_parties(2, 3));
        assert!(p.allows_parties(3, 0));
        assert!(!p.allows_parties(0, 3), "gateway may not skip to exclaim");
        assert!(!p.allows_parties(3, 1), "no edge back");
        assert!(!p.allows_parties(9, 0), "unknown party");
        assert_eq!(p.parties_of(0).collect::<Vec<_>>(), vec![1, 2]);
        assert_eq!(p.targets(0), [1, 2]);
        assert_eq!(p.targets(1), [3]);
        assert_eq!(p.senders(3), [1, 2]);
        assert_eq!(p.senders(0), [3]);
        assert!(p.targets(9).is_empty());
        for s in 0..5 {
            for r in 0..5 {
                let t = p.targets(s);
                assert_eq!(
                    p.target_index(s, r),
                    t.iter().position(|&x| x == r),
                    "{s}->{r}"
                );
                let f = p.senders(r);
                assert_eq!(
                    p.sender_index(s, r),
                    f.iter().position(|&x| x == s),
                    "{s}->{r}"
                );
            }
        }
    }

    /// Many instances on both sides of a hop: each sender reaches `fan_out` of the next
    /// function's instances, every receiver is reached, the load spreads evenly, and the
    /// lists, indices and `allows_parties` agree; the gateway's hops stay a full mesh.
    #[test]
    fn capped_fan_out() {
        for (a, b) in [
            (20usize, 30usize),
            (63, 63),
            (1, 40),
            (3, 100),
            (40, 5),
            (9, 9),
        ] {
            // gateway, a instances of fn 0, b of fn 1; route gateway -> 0 -> 1 -> gateway.
            let mut pf = vec![GATEWAY_FN];
            pf.extend(std::iter::repeat_n(0u8, a));
            pf.extend(std::iter::repeat_n(1u8, b));
            let p = Policy::new(pf, [(GATEWAY_FN, 0), (0, 1), (1, GATEWAY_FN)]).unwrap();
            let first: Vec<PartyId> = (1..=a as PartyId).collect();
            let second: Vec<PartyId> = (a as PartyId + 1..=(a + b) as PartyId).collect();
            let k = fan_out(a, b);
            assert!(k == b || k >= FAN_OUT.min(b), "{a}x{b}: k {k}");
            assert_eq!(
                p.targets(0),
                first,
                "the gateway reaches every head instance"
            );
            for &s in &first {
                let t = p.targets(s);
                assert_eq!(t.len(), k, "{a}x{b}: instance {s} targets {t:?}");
                assert!(t.iter().all(|x| second.contains(x)));
                assert_eq!(p.senders(s), [0], "{a}x{b}");
            }
            let mut fan_in = Vec::new();
            for &r in &second {
                let from = p.senders(r);
                assert!(!from.is_empty(), "{a}x{b}: instance {r} has no sender");
                fan_in.push(from.len());
                assert_eq!(p.targets(r), [0], "every instance answers the gateway");
            }
            let (lo, hi) = (fan_in.iter().min().unwrap(), fan_in.iter().max().unwrap());
            assert!(hi - lo <= 1, "{a}x{b}: fan-in {lo}..{hi}");
            let parties = (a + b + 2) as PartyId;
            for s in 0..parties {
                let t = p.targets(s);
                for r in 0..parties {
                    let allowed = p.allows_parties(s, r);
                    assert_eq!(allowed, t.contains(&r), "{a}x{b}: {s}->{r}");
                    assert_eq!(allowed, p.senders(r).contains(&s), "{a}x{b}: {s}->{r}");
                    assert_eq!(p.target_index(s, r), t.iter().position(|&x| x == r));
                    assert_eq!(
                        p.sender_index(s, r),
                        p.senders(r).iter().position(|&x| x == s)
                    );
                }
            }
        }
    }
}
