//! Nodes whose pod CIDR is wider than the node CIDRs of a pool it overlaps (a kubelet's
//! `--pod-cidr=10.0.0.0/8` over the whole cluster CIDR): the allocator keeps all of it reserved, so
//! such a Node can fill a pool by itself. It is named once, with what it covers and the Nodes inside
//! it, on the pool it fills and to the Nodes waiting for that pool; the Nodes inside it are not to
//! blame and are not told to re-create themselves.

use std::collections::BTreeMap;

use ipnet::IpNet;
use netcm_ipam::{CidrFinding, Limits, Overlaps, Oversized, PoolStats, Pools};

use super::super::report::Finding;
use super::Analysis;

/// Nodes inside an oversized CIDR named in its line (the rest are counted).
const NAMED: usize = 3;
/// Holders of oversized CIDRs named on one pool line (the rest are counted).
const HOLDERS_NAMED: usize = 3;

/// A Node holding pod CIDRs wider than the node CIDRs of a pool they overlap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OversizedNode {
    /// Those CIDRs.
    pub cidrs: Vec<Oversized>,
    /// The Nodes whose pod CIDRs lie inside them.
    pub inside: Overlaps,
}

/// Whether `f`, found when a Node was held, is said by an oversized CIDR's own line instead: a
/// conflict between an oversized CIDR and a CIDR strictly inside it (from either side: the Node inside
/// is not to blame), or an oversized CIDR reaching outside every cluster CIDR (its fix is the same and
/// "add it to --cluster-cidr" would be wrong). Conflicts between equal CIDRs stay, as the allocator's
/// `CIDRConflict` Events keep them.
pub(super) fn summarised(pools: &Pools, f: &CidrFinding) -> bool {
    match f {
        CidrFinding::Conflict {
            cidr, other_cidr, ..
        } => {
            cidr != other_cidr
                && ((other_cidr.contains(cidr) && pools.oversized(other_cidr).is_some())
                    || (cidr.contains(other_cidr) && pools.oversized(cidr).is_some()))
        }
        CidrFinding::OutOfRange { cidr } => pools.oversized(cidr).is_some(),
        CidrFinding::ServiceRangeOverlap { .. } => false,
    }
}

/// The Nodes of `held` (name, pod CIDRs) with an oversized pod CIDR, with what `pools` (every Node
/// held) says about them.
pub(super) fn of_nodes(
    pools: &Pools,
    held: &[(String, Vec<IpNet>)],
) -> BTreeMap<String, OversizedNode> {
    held.iter()
        .filter(|(_, cidrs)| cidrs.iter().any(|c| pools.oversized(&c.trunc()).is_some()))
        .map(|(node, _)| {
            let limits = Limits {
                named: NAMED,
                visited: usize::MAX,
            };
            let p = pools.problems(node, limits, |_| false);
            let o = OversizedNode {
                cidrs: p.oversized,
                inside: p.inside_oversized,
            };
            (node.clone(), o)
        })
        .collect()
}

/// The one line for a Node with an oversized pod CIDR.
pub fn oversized_finding(node: &str, o: &OversizedNode) -> Finding {
    let what: Vec<String> = o.cidrs.iter().map(ToString::to_string).collect();
    let it = if o.cidrs.len() == 1 { "it" } else { "them" };
    Finding::fail(
        "cidrs",
        format!(
            "Node {node}'s {}, so netcm hands out no address inside {it}{}",
            what.join(" and its "),
            inside_text(&o.inside, it)
        ),
        recreate_fix(node, o),
    )
    .about([node])
}

/// "; it overlaps the pod CIDRs of Nodes a (…) and b (…)", "…of 2000 Nodes, e.g. a (…), b (…), c (…)",
/// or "" when none. No ": " in it: `netcm check node`'s verdict keeps what follows the first one.
fn inside_text(inside: &Overlaps, it: &str) -> String {
    if inside.is_empty() {
        return String::new();
    }
    let named: Vec<String> = inside
        .named
        .iter()
        .map(|o| format!("{} ({})", o.other, o.other_cidr))
        .collect();
    let at_least = if inside.more { "at least " } else { "" };
    let all = !inside.more && named.len() == inside.count;
    match (&named[..], all) {
        ([one], true) => format!("; {it} overlaps the pod CIDR of Node {one}"),
        ([first @ .., last], true) => format!(
            "; {it} overlaps the pod CIDRs of Nodes {} and {last}",
            first.join(", ")
        ),
        (_, _) => format!(
            "; {it} overlaps the pod CIDRs of {at_least}{} Nodes, e.g. {}",
            inside.count,
            named.join(", ")
        ),
    }
}

/// How to give `node` a pod CIDR of the right size.
pub fn recreate_fix(node: &str, o: &OversizedNode) -> String {
    let mut masks: Vec<u8> = Vec::new();
    for c in &o.cidrs {
        if !masks.contains(&c.node_mask) {
            masks.push(c.node_mask);
        }
    }
    let sizes: Vec<String> = masks.iter().map(|m| format!("a /{m}")).collect();
    format!(
        "remove --pod-cidr from Node {node}'s kubelet (or stop what wrote spec.podCIDR: see the allocators check), then kubectl delete node {node}; it registers again and netcm gives it {}",
        sizes.join(" and ")
    )
}

/// One oversized CIDR keeping node CIDRs of some cluster CIDRs reserved.
#[derive(Debug)]
struct Holder<'a> {
    node: &'a str,
    cidr: IpNet,
    /// Node CIDRs of those cluster CIDRs it keeps reserved.
    reserved: u64,
}

/// Every oversized CIDR overlapping one of `rows`, with how many of their node CIDRs it keeps
/// reserved; and how many node CIDRs the rows have.
fn holders<'a>(a: &'a Analysis, rows: &[&PoolStats]) -> (Vec<Holder<'a>>, u64) {
    let mut out: Vec<Holder<'a>> = Vec::new();
    let mut max = 0u64;
    for row in rows {
        max = max.saturating_add(row.max);
        let Ok(cluster) = row.cluster_cidr.parse::<IpNet>() else {
            continue;
        };
        // max is 2^(node mask - cluster prefix).
        let node_mask = cluster.prefix_len() + row.max.trailing_zeros() as u8;
        for (node, o) in &a.oversized {
            for c in &o.cidrs {
                if !(cluster.contains(&c.cidr) || c.cidr.contains(&cluster)) {
                    continue;
                }
                let widest = c.cidr.prefix_len().max(cluster.prefix_len());
                let reserved = 1u64
                    .checked_shl(u32::from(node_mask.saturating_sub(widest)))
                    .unwrap_or(u64::MAX)
                    .min(row.max);
                match out.iter_mut().find(|h| h.node == node && h.cidr == c.cidr) {
                    Some(h) => h.reserved = h.reserved.saturating_add(reserved),
                    None => out.push(Holder {
                        node,
                        cidr: c.cidr,
                        reserved,
                    }),
                }
            }
        }
    }
    (out, max)
}

/// What the pool line(s) `rows` (full or nearly) add when an oversized CIDR keeps some of their node
/// CIDRs reserved: " — Node h holds 10.0.0.0/8, which keeps all 256 of its node CIDRs reserved", the
/// Nodes named, and the fix to put before the fix for a full pool.
pub(super) struct Blame {
    pub(super) text: String,
    pub(super) nodes: Vec<String>,
    pub(super) fix: String,
}

/// [`Blame`] for `rows`, or `None` when no oversized CIDR overlaps them.
pub(super) fn blame(a: &Analysis, rows: &[&PoolStats]) -> Option<Blame> {
    let (holders, max) = holders(a, rows);
    if holders.is_empty() {
        return None;
    }
    let its = if rows.len() == 1 { "its" } else { "their" };
    let mut parts: Vec<String> = holders
        .iter()
        .take(HOLDERS_NAMED)
        .map(|h| {
            let all = if h.reserved >= max { "all " } else { "" };
            format!(
                "Node {} holds {}, which keeps {all}{} of {its} node CIDRs reserved",
                h.node, h.cidr, h.reserved
            )
        })
        .collect();
    if holders.len() > HOLDERS_NAMED {
        parts.push(format!(
            "and {} more such pod CIDRs (see the cidrs lines)",
            holders.len() - HOLDERS_NAMED
        ));
    }
    let mut nodes: Vec<String> = Vec::new();
    let mut fixes: Vec<String> = Vec::new();
    for h in holders.iter().take(HOLDERS_NAMED) {
        if nodes.iter().any(|n| n == h.node) {
            continue;
        }
        nodes.push(h.node.to_string());
        if let Some(o) = a.oversized.get(h.node) {
            fixes.push(recreate_fix(h.node, o));
        }
    }
    Some(Blame {
        text: format!(" — {}", parts.join("; ")),
        nodes,
        fix: fixes.join("; "),
    })
}

impl Blame {
    /// `fix` (for a full pool) after this blame's own.
    pub(super) fn before(&self, fix: &str) -> String {
        format!("{}; then, if the pool is still full, {fix}", self.fix)
    }
}

/// For a Node inside another Node's oversized CIDR: that it lies there and needs nothing itself.
pub fn inside_of(a: &Analysis, node: &str, cidrs: &[IpNet]) -> Vec<Finding> {
    let mut out = Vec::new();
    for (other, o) in a.oversized.iter().filter(|(n, _)| n.as_str() != node) {
        for c in &o.cidrs {
            for mine in cidrs
                .iter()
                .filter(|m| **m != c.cidr && c.cidr.contains(*m))
            {
                out.push(Finding::ok(
                    "cidrs",
                    format!(
                        "its pod CIDR {mine} lies inside Node {other}'s pod CIDR {}, which is wider than a node CIDR: Node {other} is to blame, this Node needs nothing (netcm check node {other})",
                        c.cidr
                    ),
                ));
            }
        }
    }
    out
}
