//! The listening gateway's subscriptions, indexed by topic level: which connections an
//! answer goes to.
//!
//! A trie whose edges are the filters' levels, with `+` as an edge of its own and `#` kept
//! at the node it follows. Level texts are interned: one number per distinct level, counted
//! by the edges that use it. Matching a topic looks each of its levels up once (a hash of its
//! bytes) and then walks the trie by number, level by level, keeping only the nodes whose
//! path matches so far. So one match costs
//!
//! * the topic's bytes, once;
//! * one step per trie node on a path that matches the topic so far (a node is shared by
//!   every filter that starts with its path, whoever holds it: a thousand clients with the
//!   same filter cost one path, not a thousand comparisons);
//! * one step per matching subscription (each is a delivery).
//!
//! and nothing per subscription that does not match. Filters are valid (`valid_filter`: at
//! most `MAX_TOPIC_LEVELS` levels), so a trie path is at most that deep; the caller bounds
//! how many subscriptions there are.

use std::collections::HashMap;

/// A connection of the hub.
pub(super) type ConnId = u64;

/// One trie node: the filters whose levels so far are its path.
#[derive(Default)]
struct Node {
    /// By the interned number of the next level.
    children: HashMap<u32, Node>,
    /// The next level is `+`.
    plus: Option<Box<Node>>,
    /// Subscribers of this path followed by `/#` (at the root: of `#`), with their QoS.
    hash: HashMap<ConnId, u8>,
    /// Subscribers of exactly this path.
    exact: HashMap<ConnId, u8>,
}

impl Node {
    fn is_empty(&self) -> bool {
        self.children.is_empty()
            && self.plus.is_none()
            && self.hash.is_empty()
            && self.exact.is_empty()
    }
}

/// Distinct level texts, each with its number and how many trie edges use it.
#[derive(Default)]
struct Levels {
    ids: HashMap<Box<str>, (u32, usize)>,
    free: Vec<u32>,
    next: u32,
}

impl Levels {
    fn id(&self, level: &str) -> Option<u32> {
        self.ids.get(level).map(|&(id, _)| id)
    }

    /// The number of `level`, counting one more edge that uses it.
    fn hold(&mut self, level: &str) -> u32 {
        if let Some((id, refs)) = self.ids.get_mut(level) {
            *refs += 1;
            return *id;
        }
        let id = self.free.pop().unwrap_or_else(|| {
            self.next += 1;
            self.next
        });
        self.ids.insert(level.into(), (id, 1));
        id
    }

    /// One edge fewer uses `level`; its number is free again when none does.
    fn release(&mut self, level: &str) {
        if let Some((id, refs)) = self.ids.get_mut(level) {
            *refs -= 1;
            if *refs == 0 {
                self.free.push(*id);
                self.ids.remove(level);
            }
        }
    }
}

/// Every subscription of the hub, by filter.
#[derive(Default)]
pub(super) struct Index {
    root: Node,
    levels: Levels,
}

impl Index {
    /// Adds (or, with another QoS, replaces) `conn`'s subscription to the valid filter
    /// `filter`.
    pub fn insert(&mut self, conn: ConnId, filter: &str, qos: u8) {
        let levels = &mut self.levels;
        let mut node = &mut self.root;
        for level in filter.split('/') {
            node = match level {
                "#" => {
                    node.hash.insert(conn, qos);
                    return;
                }
                "+" => node.plus.get_or_insert_with(Box::default),
                text => {
                    let id = match levels.id(text) {
                        Some(id) if node.children.contains_key(&id) => id,
                        _ => levels.hold(text),
                    };
                    node.children.entry(id).or_default()
                }
            };
        }
        node.exact.insert(conn, qos);
    }

    /// Removes `conn`'s subscription to `filter`; whether it had it. Nodes left without
    /// filters go, and so do level texts no edge uses any more.
    pub fn remove(&mut self, conn: ConnId, filter: &str) -> bool {
        let parts: Vec<&str> = filter.split('/').collect();
        remove_in(&mut self.root, &parts, &mut self.levels, conn)
    }

    /// Adds to `out` every connection with a filter that matches the topic name `topic`,
    /// at the highest QoS among its matching filters (MQTT 4.7: `+` is one whole level, `#`
    /// the parent level and everything below, and a filter that starts with a wildcard does
    /// not match a topic that starts with `$`). Returns the steps it took (nodes visited and
    /// subscribers added), which tests hold to the bound of the module's header.
    pub fn matches(&self, topic: &str, out: &mut HashMap<ConnId, u8>) -> usize {
        let mut steps = 0;
        let mut add = |subscribers: &HashMap<ConnId, u8>, steps: &mut usize| {
            for (&conn, &qos) in subscribers {
                *steps += 1;
                let q = out.entry(conn).or_insert(qos);
                *q = (*q).max(qos);
            }
        };
        let dollar = topic.starts_with('$');
        let mut frontier: Vec<&Node> = vec![&self.root];
        let mut next: Vec<&Node> = Vec::new();
        for (depth, level) in topic.split('/').enumerate() {
            // Unknown text: only `+` edges can take this level.
            let id = self.levels.id(level);
            let wildcards = !(depth == 0 && dollar);
            for node in frontier.drain(..) {
                steps += 1;
                if wildcards {
                    add(&node.hash, &mut steps);
                    if let Some(plus) = &node.plus {
                        next.push(plus);
                    }
                }
                if let Some(child) = id.and_then(|id| node.children.get(&id)) {
                    next.push(child);
                }
            }
            std::mem::swap(&mut frontier, &mut next);
            if frontier.is_empty() {
                return steps;
            }
        }
        for node in frontier {
            steps += 1;
            add(&node.exact, &mut steps);
            // `a/#` matches `a` too.
            add(&node.hash, &mut steps);
        }
        steps
    }

    /// Trie nodes (the root included) and distinct level texts, for tests.
    #[cfg(test)]
    fn size(&self) -> (usize, usize) {
        fn count(n: &Node) -> usize {
            1 + n.children.values().map(count).sum::<usize>() + n.plus.as_deref().map_or(0, count)
        }
        (count(&self.root), self.levels.ids.len())
    }
}

fn remove_in(node: &mut Node, parts: &[&str], levels: &mut Levels, conn: ConnId) -> bool {
    let Some((&first, rest)) = parts.split_first() else {
        return node.exact.remove(&conn).is_some();
    };
    match first {
        "#" if rest.is_empty() => node.hash.remove(&conn).is_some(),
        "+" => {
            let Some(child) = node.plus.as_deref_mut() else {
                return false;
            };
            let found = remove_in(child, rest, levels, conn);
            if child.is_empty() {
                node.plus = None;
            }
            found
        }
        text => {
            let Some(id) = levels.id(text) else {
                return false;
            };
            let Some(child) = node.children.get_mut(&id) else {
                return false;
            };
            let found = remove_in(child, rest, levels, conn);
            if child.is_empty() {
                node.children.remove(&id);
                levels.release(text);
            }
            found
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{topic_matches, MAX_TOPIC_LEVELS};
    use super::*;

    fn matched(index: &Index, topic: &str) -> Vec<(ConnId, u8)> {
        let mut out = HashMap::new();
        index.matches(topic, &mut out);
        let mut v: Vec<_> = out.into_iter().collect();
        v.sort_unstable();
        v
    }

    /// The index agrees with `topic_matches` (the rules of MQTT 4.7, tested there) on every
    /// pair of these filters and topics.
    #[test]
    fn the_index_matches_what_topic_matches_matches() {
        let filters = [
            "#",
            "+",
            "+/+",
            "a",
            "a/#",
            "a/+",
            "a/b",
            "a/b/#",
            "a/+/c",
            "+/b/#",
            "/",
            "/#",
            "+/",
            "$SYS/#",
            "$SYS/+/load",
            "a//b",
            "//",
            "+/+/+",
        ];
        let topics = [
            "a",
            "a/b",
            "a/b/c",
            "a/x/c",
            "/",
            "/a",
            "a/",
            "$SYS/broker/load",
            "$SYS",
            "b",
            "a//b",
            "//",
            "x/b",
            "x/b/y/z",
            "a/b/c/d",
        ];
        let mut index = Index::default();
        for (i, f) in filters.iter().enumerate() {
            index.insert(i as ConnId, f, (i % 2) as u8);
        }
        for t in topics {
            let want: Vec<(ConnId, u8)> = filters
                .iter()
                .enumerate()
                .filter(|(_, f)| topic_matches(f, t))
                .map(|(i, _)| (i as ConnId, (i % 2) as u8))
                .collect();
            assert_eq!(matched(&index, t), want, "topic {t:?}");
        }
    }

    #[test]
    fn a_client_gets_the_highest_qos_of_its_matching_filters_once() {
        let mut index = Index::default();
        index.insert(1, "a/+", 0);
        index.insert(1, "a/#", 1);
        index.insert(2, "a/b", 0);
        assert_eq!(matched(&index, "a/b"), [(1, 1), (2, 0)]);
        // A new QoS for the same filter replaces the old one.
        index.insert(1, "a/#", 0);
        assert_eq!(matched(&index, "a/b"), [(1, 0), (2, 0)]);
    }

    #[test]
    fn removing_every_filter_leaves_an_empty_index() {
        let mut index = Index::default();
        let filters = ["a/b/c", "a/+/c", "a/#", "x", "+/+", "#", "a/b"];
        for (conn, f) in [1u64, 2]
            .iter()
            .flat_map(|c| filters.iter().map(move |f| (*c, *f)))
        {
            index.insert(conn, f, 1);
        }
        assert!(!index.remove(1, "a/b/d"), "never subscribed");
        assert!(!index.remove(3, "a/b"), "another connection's");
        for (conn, f) in [1u64, 2]
            .iter()
            .flat_map(|c| filters.iter().map(move |f| (*c, *f)))
        {
            assert!(index.remove(conn, f), "{conn} {f}");
            assert!(!index.remove(conn, f), "only once");
        }
        assert_eq!(index.size(), (1, 0), "only the root is left");
        assert!(matched(&index, "a/b").is_empty());
        // Numbers of released level texts are used again.
        index.insert(1, "q/r", 0);
        assert!(index.levels.next <= 4);
    }

    /// Finding 8 of the security review: many connections with deep filters made one
    /// answer cost a comparison per level of every filter of every connection. Through the
    /// index, filters that share a path cost it once, and filters that do not match cost
    /// nothing beyond their common prefix with the topic.
    #[test]
    fn matching_costs_the_matching_paths_not_the_number_of_subscriptions() {
        let deep = |last: &str| format!("{}/{last}", vec!["+"; MAX_TOPIC_LEVELS - 1].join("/"));
        let topic = deep("t");
        let mut index = Index::default();
        // 1000 connections, each holding the same 64 deep filters, none of which matches.
        for conn in 0..1000 {
            for f in 0..64 {
                index.insert(conn, &deep(&format!("f{f}")), 1);
            }
        }
        let mut out = HashMap::new();
        let steps = index.matches(&topic, &mut out);
        assert!(out.is_empty());
        // One node per level of the shared `+/+/...` path: 64,000 filters of 32 levels each
        // were 2,048,000 level comparisons per answer before the index.
        assert_eq!(steps, MAX_TOPIC_LEVELS);
        // Distinct filters, each a different mix of `+` and the topic's own levels: the
        // work grows with the paths that match, bounded by their levels.
        let mut index = Index::default();
        let levels: Vec<String> = (0..MAX_TOPIC_LEVELS).map(|i| format!("l{i}")).collect();
        let topic = levels.join("/");
        for conn in 0..64u64 {
            let filter: Vec<&str> = levels
                .iter()
                .enumerate()
                .map(|(i, l)| {
                    if i < 6 && conn >> i & 1 == 1 {
                        "+"
                    } else {
                        l.as_str()
                    }
                })
                .collect();
            index.insert(conn, &filter.join("/"), 0);
        }
        let mut out = HashMap::new();
        let steps = index.matches(&topic, &mut out);
        assert_eq!(out.len(), 64, "every filter matches");
        let (nodes, _) = index.size();
        assert!(
            steps <= nodes + out.len(),
            "{steps} steps for {nodes} nodes"
        );
        assert!(steps <= 64 * (MAX_TOPIC_LEVELS + 1) + 64, "{steps}");
        // A topic no filter shares a first level with costs one step, however long it is
        // and however many subscriptions there are.
        let mut index = Index::default();
        for conn in 0..1000 {
            index.insert(conn, "a/b/c", 0);
        }
        let mut out = HashMap::new();
        let far = format!("{}/x", "y".repeat(60_000));
        assert_eq!(index.matches(&far, &mut out), 1);
    }
}
