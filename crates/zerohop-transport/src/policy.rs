//! Who may send to whom: the chain's allowed edges, derived from its routes.

use std::collections::HashSet;

use zerohop_pool::Descriptor;

use crate::PartyId;

/// The gateway's function index in edges (same value as [`Descriptor::GATEWAY`]).
pub const GATEWAY_FN: u8 = Descriptor::GATEWAY;

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

    /// The parties running any of `functions`, ascending.
    fn parties_running(&self, functions: &[u8]) -> Vec<PartyId> {
        let mut out: Vec<PartyId> = functions
            .iter()
            .flat_map(|&f| self.by_function[f as usize].iter().copied())
            .collect();
        out.sort_unstable();
        out
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
        match self.function_of(party) {
            Some(f) => self.parties_running(&self.fn_targets[f as usize]),
            None => Vec::new(),
        }
    }

    /// Parties that may send to `party`, ascending (empty for an unknown party). Computed on
    /// each call, like [`targets`](Policy::targets).
    pub fn senders(&self, party: PartyId) -> Vec<PartyId> {
        match self.function_of(party) {
            Some(f) => self.parties_running(&self.fn_senders[f as usize]),
            None => Vec::new(),
        }
    }

    /// Position of `from` among [`senders`](Policy::senders)`(to)`, without building the
    /// list; `None` when the edge is not allowed.
    pub fn sender_index(&self, from: PartyId, to: PartyId) -> Option<usize> {
        let t = self.edge(from, to)?.1;
        Some(self.rank(&self.fn_senders[t as usize], from))
    }

    /// Position of `to` among [`targets`](Policy::targets)`(from)`, without building the
    /// list; `None` when the edge is not allowed.
    pub fn target_index(&self, from: PartyId, to: PartyId) -> Option<usize> {
        let f = self.edge(from, to)?.0;
        Some(self.rank(&self.fn_targets[f as usize], to))
    }

    /// The functions of `from` and `to` when `from` may send to `to`.
    fn edge(&self, from: PartyId, to: PartyId) -> Option<(u8, u8)> {
        let e = (self.function_of(from)?, self.function_of(to)?);
        self.edges.contains(&e).then_some(e)
    }

    /// How many parties running any of `functions` come before `party`: its position in
    /// [`parties_running`](Policy::parties_running)`(functions)`.
    fn rank(&self, functions: &[u8], party: PartyId) -> usize {
        functions
            .iter()
            .map(|&g| self.by_function[g as usize].partition_point(|&p| p < party))
            .sum()
    }

    /// Number of parties.
    pub fn parties(&self) -> u16 {
        self.party_function.len() as u16
    }

    /// Function index run by `party`.
    pub fn function_of(&self, party: PartyId) -> Option<u8> {
        self.party_function.get(party as usize).copied()
    }

    /// Parties running function `f`.
    pub fn parties_of(&self, f: u8) -> impl Iterator<Item = PartyId> + '_ {
        self.party_function
            .iter()
            .enumerate()
            .filter(move |(_, &g)| g == f)
            .map(|(p, _)| p as PartyId)
    }

    /// Whether function `from` may send to function `to`.
    pub fn allows(&self, from: u8, to: u8) -> bool {
        self.edges.contains(&(from, to))
    }

    /// Whether party `from` may send to party `to`.
    pub fn allows_parties(&self, from: PartyId, to: PartyId) -> bool {
        match (self.function_of(from), self.function_of(to)) {
            (Some(f), Some(t)) => self.allows(f, t),
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
}
