//! Where a Chain's parts go: a pure function of the nodes, the parts that exist and the
//! ports taken, so that it can be tested without a cluster.
//!
//! Rules, in order:
//! - A part stays where it is while its node is eligible (alive, schedulable, matching the
//!   node selector) and it still belongs to the wanted shape (replica and part in range, the
//!   port still what the Chain asks): placement never moves a healthy part.
//! - A missing part goes to an eligible node that holds no other part of its replica (a
//!   split replica spans distinct nodes), has room under `maxPerNode`, and, for a gateway
//!   part, has its port free; among those the node with the fewest parts of this Chain, then
//!   the fewest parts of any Chain, then the first name.
//! - A gateway part's port is the Chain's `port`, else the lowest port of the controller's
//!   range free on that node.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::RangeInclusive;

/// A node as placement sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeInfo {
    /// Its name.
    pub name: String,
    /// Alive (its daemon's heartbeat is fresh), schedulable, Ready, and matching the
    /// Chain's node selector.
    pub eligible: bool,
    /// Parts of every Chain it holds.
    pub parts: usize,
    /// Gateway ports taken on it by every Chain's parts.
    pub ports: BTreeSet<u16>,
}

/// A part that exists.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Existing {
    /// Its object's name.
    pub name: String,
    /// Its replica.
    pub replica: u32,
    /// Its part number.
    pub part: u32,
    /// Its node.
    pub node: String,
    /// Its gateway port (part 0).
    pub port: Option<u16>,
}

/// What the Chain asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Want {
    /// Replicas.
    pub replicas: u32,
    /// Parts per replica (1 + `placement.parts`).
    pub parts: u32,
    /// The fixed gateway port, if any.
    pub port: Option<u16>,
    /// At most this many parts of the Chain on one node.
    pub max_per_node: Option<u32>,
}

/// Where one part goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placed {
    /// Its replica.
    pub replica: u32,
    /// Its part number.
    pub part: u32,
    /// Its node.
    pub node: String,
    /// Its gateway port (part 0).
    pub port: Option<u16>,
    /// The existing object it is, or `None` for a new one.
    pub existing: Option<String>,
}

/// The outcome: parts to keep or create, objects to delete, parts with nowhere to go.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Decision {
    /// Every part that has a node, kept or new, by (replica, part).
    pub placed: Vec<Placed>,
    /// Existing objects that go (their node was lost, or they are no longer wanted).
    pub delete: Vec<Existing>,
    /// `(replica, part)` that no node can take now.
    pub unplaced: Vec<(u32, u32)>,
}

/// Places `want` on `nodes`, given the Chain's `existing` parts; `ports` is the range
/// gateway ports are taken from when the Chain fixes none.
pub fn place(
    want: &Want,
    nodes: &[NodeInfo],
    existing: &[Existing],
    ports: RangeInclusive<u16>,
) -> Decision {
    let by_name: BTreeMap<&str, &NodeInfo> = nodes.iter().map(|n| (n.name.as_str(), n)).collect();
    let mut decision = Decision::default();
    // Per node: parts of this Chain, parts of all, ports taken (this Chain's own included).
    let mut ours: BTreeMap<String, usize> = BTreeMap::new();
    let mut total: BTreeMap<String, usize> =
        nodes.iter().map(|n| (n.name.clone(), n.parts)).collect();
    let mut taken: BTreeMap<String, BTreeSet<u16>> = nodes
        .iter()
        .map(|n| (n.name.clone(), n.ports.clone()))
        .collect();
    let mut kept: BTreeMap<(u32, u32), Placed> = BTreeMap::new();
    let mut sorted: Vec<&Existing> = existing.iter().collect();
    sorted.sort_by(|a, b| (a.replica, a.part, &a.name).cmp(&(b.replica, b.part, &b.name)));
    for e in sorted {
        let node_ok = by_name.get(e.node.as_str()).is_some_and(|n| n.eligible);
        let shape_ok = e.replica < want.replicas && e.part < want.parts;
        let port_ok = e.part != 0 || want.port.is_none() || e.port == want.port;
        let first = !kept.contains_key(&(e.replica, e.part));
        if node_ok && shape_ok && port_ok && first {
            *ours.entry(e.node.clone()).or_default() += 1;
            kept.insert(
                (e.replica, e.part),
                Placed {
                    replica: e.replica,
                    part: e.part,
                    node: e.node.clone(),
                    port: e.port,
                    existing: Some(e.name.clone()),
                },
            );
        } else {
            // Its node no longer counts it (the object goes now, the daemon stops it).
            if let Some(t) = total.get_mut(&e.node) {
                *t = t.saturating_sub(1);
            }
            if let (Some(p), Some(set)) = (e.port, taken.get_mut(&e.node)) {
                set.remove(&p);
            }
            decision.delete.push(e.clone());
        }
    }
    for replica in 0..want.replicas {
        for part in 0..want.parts {
            if let Some(p) = kept.get(&(replica, part)) {
                decision.placed.push(p.clone());
                continue;
            }
            let siblings: BTreeSet<&str> = kept
                .values()
                .filter(|p| p.replica == replica)
                .map(|p| p.node.as_str())
                .collect();
            let port_on = |node: &str| -> Option<Option<u16>> {
                if part != 0 {
                    return Some(None);
                }
                let set = taken.get(node)?;
                match want.port {
                    Some(p) => (!set.contains(&p)).then_some(Some(p)),
                    None => ports.clone().find(|p| !set.contains(p)).map(Some),
                }
            };
            let best = nodes
                .iter()
                .filter(|n| n.eligible && !siblings.contains(n.name.as_str()))
                .filter(|n| {
                    want.max_per_node
                        .is_none_or(|m| ours.get(&n.name).copied().unwrap_or(0) < m as usize)
                })
                .filter_map(|n| port_on(&n.name).map(|port| (n, port)))
                .min_by_key(|(n, _)| {
                    (
                        ours.get(&n.name).copied().unwrap_or(0),
                        total.get(&n.name).copied().unwrap_or(0),
                        n.name.clone(),
                    )
                });
            match best {
                Some((n, port)) => {
                    *ours.entry(n.name.clone()).or_default() += 1;
                    *total.entry(n.name.clone()).or_default() += 1;
                    if let Some(p) = port {
                        taken.entry(n.name.clone()).or_default().insert(p);
                    }
                    let p = Placed {
                        replica,
                        part,
                        node: n.name.clone(),
                        port,
                        existing: None,
                    };
                    kept.insert((replica, part), p.clone());
                    decision.placed.push(p);
                }
                None => decision.unplaced.push((replica, part)),
            }
        }
    }
    decision
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes(names: &[&str]) -> Vec<NodeInfo> {
        names
            .iter()
            .map(|n| NodeInfo {
                name: n.to_string(),
                eligible: true,
                parts: 0,
                ports: BTreeSet::new(),
            })
            .collect()
    }

    fn want(replicas: u32) -> Want {
        Want {
            replicas,
            parts: 1,
            port: None,
            max_per_node: None,
        }
    }

    fn existing(d: &Decision) -> Vec<Existing> {
        d.placed
            .iter()
            .map(|p| Existing {
                name: format!("c-{}-{}", p.replica, p.part),
                replica: p.replica,
                part: p.part,
                node: p.node.clone(),
                port: p.port,
            })
            .collect()
    }

    fn on(d: &Decision) -> Vec<(u32, &str, Option<u16>)> {
        d.placed
            .iter()
            .map(|p| (p.replica, p.node.as_str(), p.port))
            .collect()
    }

    #[test]
    fn replicas_spread_over_nodes_with_the_first_free_port() {
        let d = place(&want(3), &nodes(&["a", "b", "c"]), &[], 30100..=30102);
        assert_eq!(
            on(&d),
            vec![
                (0, "a", Some(30100)),
                (1, "b", Some(30100)),
                (2, "c", Some(30100))
            ]
        );
        assert!(d.delete.is_empty() && d.unplaced.is_empty());
    }

    #[test]
    fn a_lost_node_moves_only_its_replica_and_two_share_a_node_on_other_ports() {
        let all = nodes(&["a", "b", "c"]);
        let first = place(&want(3), &all, &[], 30100..=30199);
        let mut now = all.clone();
        now[1].eligible = false;
        // What runs on the live nodes is counted where it is.
        for n in &mut now {
            let here: Vec<_> = first.placed.iter().filter(|p| p.node == n.name).collect();
            n.parts = here.len();
            n.ports = here.iter().filter_map(|p| p.port).collect();
        }
        let d = place(&want(3), &now, &existing(&first), 30100..=30199);
        assert_eq!(d.delete.len(), 1);
        assert_eq!(d.delete[0].node, "b");
        assert_eq!(
            on(&d),
            vec![
                (0, "a", Some(30100)),
                (1, "a", Some(30101)),
                (2, "c", Some(30100))
            ]
        );
        assert_eq!(
            d.placed[0].existing.as_deref(),
            Some("c-0-0"),
            "kept in place"
        );
        assert_eq!(d.placed[1].existing, None, "a new part");
    }

    #[test]
    fn max_per_node_and_a_fixed_port_leave_replicas_unplaced() {
        let mut w = want(3);
        w.max_per_node = Some(1);
        let d = place(&w, &nodes(&["a", "b"]), &[], 30100..=30199);
        assert_eq!(d.placed.len(), 2);
        assert_eq!(d.unplaced, vec![(2, 0)]);
        let mut w = want(2);
        w.port = Some(8080);
        let mut n = nodes(&["a", "b"]);
        n[0].ports.insert(8080);
        let d = place(&w, &n, &[], 30100..=30199);
        assert_eq!(on(&d), vec![(0, "b", Some(8080))]);
        assert_eq!(d.unplaced, vec![(1, 0)]);
    }

    #[test]
    fn a_split_replica_spans_distinct_nodes_and_only_its_gateway_has_a_port() {
        let w = Want {
            replicas: 2,
            parts: 2,
            port: None,
            max_per_node: None,
        };
        let d = place(&w, &nodes(&["a", "b", "c"]), &[], 30100..=30199);
        assert_eq!(d.placed.len(), 4);
        for r in 0..2 {
            let parts: Vec<_> = d.placed.iter().filter(|p| p.replica == r).collect();
            assert_ne!(parts[0].node, parts[1].node, "replica {r}");
            assert!(parts[0].port.is_some() && parts[1].port.is_none());
        }
        let d = place(&w, &nodes(&["a"]), &[], 30100..=30199);
        assert_eq!(d.placed.len(), 2, "one gateway part per replica fits");
        assert_eq!(d.unplaced, vec![(0, 1), (1, 1)]);
    }

    #[test]
    fn fewer_replicas_delete_the_highest_and_a_new_port_replaces_the_gateway() {
        let all = nodes(&["a", "b", "c"]);
        let first = place(&want(3), &all, &[], 30100..=30199);
        let d = place(&want(1), &all, &existing(&first), 30100..=30199);
        assert_eq!(on(&d), vec![(0, "a", Some(30100))]);
        assert_eq!(
            d.delete.iter().map(|e| e.replica).collect::<Vec<_>>(),
            vec![1, 2]
        );
        let mut w = want(1);
        w.port = Some(9000);
        let d = place(&w, &all, &existing(&first)[..1], 30100..=30199);
        assert_eq!(d.delete.len(), 1);
        assert_eq!(on(&d), vec![(0, "a", Some(9000))]);
    }
}
