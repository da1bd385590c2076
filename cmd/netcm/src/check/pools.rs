//! Pools, waiting Nodes and bad data: capacity vs Nodes per cluster CIDR (as the allocator counts it,
//! with netcm-ipam's own `Pools`: the flag pool and, unless the leader ignores them, the ClusterCIDR
//! objects' pools), Nodes without a pod CIDR and why, and pod CIDRs that are unparsable, outside every
//! pool, or overlap another Node's (naming both), or are wider than a node CIDR (naming the Node on the
//! pool it fills, not the Nodes inside it).

use std::collections::BTreeMap;

use netcm_ipam::{CidrFinding, PoolState, PoolStats, Pools, DEFAULT_POOL};
use netcm_node::Family;

use super::report::Finding;
use super::snapshot::{ago, event_time, name, pod_cidrs, ObjectPoolsState, Snapshot, Source};

mod oversized;
mod space;

pub use oversized::{inside_of, oversized_finding, OversizedNode};
pub use space::space_findings;

/// Usage above which a pool is reported as nearly full.
pub const NEARLY_FULL: f64 = 0.9;
/// A Node without a pod CIDR younger than this is "being allocated", not "waiting".
pub const GRACE_SECS: i64 = 30;

/// The pools as the allocator would see them with every Node's CIDRs recorded.
pub struct Analysis {
    /// Usage per cluster CIDR, the flag pool's first.
    pub stats: Vec<PoolStats>,
    /// Families whose every cluster CIDR of the flag pool is full.
    pub full: Vec<Family>,
    /// ClusterCIDRs the allocator refuses, and why.
    pub refused: Vec<(String, String)>,
    /// Per Node: (unparsable CIDRs, findings), without what `oversized` says.
    pub bad: BTreeMap<String, (Vec<String>, Vec<CidrFinding>)>,
    /// Per Node with a pod CIDR wider than the node CIDRs of a pool it overlaps: those CIDRs and the
    /// Nodes inside them.
    pub oversized: BTreeMap<String, OversizedNode>,
}

/// Records every Node's CIDRs in a fresh `Pools` built from the settings; `None` without settings.
pub fn analyse(s: &Snapshot) -> Option<Result<Analysis, String>> {
    let config = match s.settings.allocator.as_ref()? {
        Ok(c) => c,
        Err(e) => return Some(Err(e.clone())),
    };
    let mut pools = match Pools::new(config) {
        Ok(p) => p,
        Err(e) => return Some(Err(e.to_string())),
    };
    // The leader counts ClusterCIDR pools unless it runs with --cluster-cidr-objects=false: a Node's CIDR
    // from one of them is neither out of range nor free for the flag pool.
    if let (ObjectPoolsState::Listed(objects), false) = (
        &s.object_pools,
        s.settings.cluster_cidr_objects == Some(false),
    ) {
        pools.sync_objects(objects);
    }
    let refused = pools
        .reports()
        .into_iter()
        .filter(|r| r.is_object)
        .filter_map(|r| match r.state {
            PoolState::Refused(why) => Some((r.name, why.to_string())),
            PoolState::Active | PoolState::Draining => None,
        })
        .collect();
    let mut bad = BTreeMap::new();
    let mut held = Vec::new();
    // Oldest first, so the Node that got a CIDR second is the one named as overlapping the first.
    let mut nodes: Vec<_> = s.nodes.iter().collect();
    nodes.sort_by_key(|n| n.metadata.creation_timestamp.as_ref().map(|t| t.0));
    for node in nodes {
        let (good, unparsable) = pod_cidrs(node);
        let outcome = pools.record_and_check(name(node), &good);
        let findings: Vec<CidrFinding> = outcome
            .findings
            .into_iter()
            .filter(|f| !oversized::summarised(&pools, f))
            .collect();
        if !unparsable.is_empty() || !findings.is_empty() {
            bad.insert(name(node).to_string(), (unparsable, findings));
        }
        if !good.is_empty() {
            held.push((name(node).to_string(), good));
        }
    }
    let oversized = oversized::of_nodes(&pools, &held);
    let stats = pools.stats();
    let full = config
        .families
        .iter()
        .map(|f| f.family)
        .filter(|fam| {
            stats
                .iter()
                .filter(|st| st.family == *fam && st.pool == DEFAULT_POOL)
                .all(|st| st.allocated >= st.max)
        })
        .collect();
    Some(Ok(Analysis {
        stats,
        full,
        refused,
        bad,
        oversized,
    }))
}

fn cluster_cidr_fix(s: &Snapshot, full: &[&PoolStats]) -> String {
    let shown: Vec<String> = full.iter().map(|p| p.cluster_cidr.clone()).collect();
    format!(
        "append a second, unused cluster CIDR of the same family to --cluster-cidr (now {}; e.g. --cluster-cidr={},<new range>, chart: --set allocator.clusterCIDR=…); full: {}",
        s.settings.cluster_cidr,
        s.settings.cluster_cidr,
        shown.join(", ")
    )
}

/// One line per cluster CIDR: usage, nearly full, full; then one `space` line per pool and family.
pub fn check_pools(s: &Snapshot, analysis: Option<&Result<Analysis, String>>) -> Vec<Finding> {
    let a = match analysis {
        None => {
            return vec![Finding::warn(
                "pool",
                "cluster CIDRs unknown: no leader has published its configuration and --cluster-cidr was not given",
                "netcm check --cluster-cidr=<the allocator's --cluster-cidr>",
            )]
        }
        Some(Err(e)) => {
            return vec![Finding::fail(
                "pool",
                format!("the cluster CIDR configuration {:?} is invalid: {e}", s.settings.cluster_cidr),
                "fix netcm's --cluster-cidr / --node-cidr-mask-size* flags (chart: allocator.clusterCIDR, allocator.nodeCIDRMaskSize*)",
            )]
        }
        Some(Ok(a)) => a,
    };
    let from = match s.settings.source {
        Source::Flags => "given",
        Source::Leader => "the leader's",
        Source::Defaults => "default",
    };
    let mut findings: Vec<Finding> = a
        .stats
        .iter()
        .map(|p| usage_finding(s, a, from, p))
        .collect();
    findings.extend(space_findings(&a.stats));
    for (pool, why) in &a.refused {
        findings.push(Finding::fail(
            "pool",
            format!("ClusterCIDR {pool} is refused, nothing is allocated from it: {why}"),
            format!("fix or delete it: kubectl describe clustercidr {pool} (its Events say why), kubectl edit clustercidr {pool}"),
        ));
    }
    if let Some(f) = conditions_finding(s) {
        findings.push(f);
    }
    // Unread objects matter only to a leader that counts them.
    if let (ObjectPoolsState::Unreadable(e), false) = (
        &s.object_pools,
        s.settings.cluster_cidr_objects == Some(false),
    ) {
        findings.push(Finding::warn(
            "pool",
            format!("ClusterCIDR objects could not be listed ({e}); their pools are not counted above"),
            "run netcm check as a user who may list clustercidrs.networking.x-k8s.io (kubectl auth can-i list clustercidrs.networking.x-k8s.io)",
        ));
    }
    findings
}

/// One pool's usage, `from` saying where its cluster CIDR came from: Ok, over 90 % (warn) or full
/// (fail), with the oversized pod CIDRs to blame and how to make room.
fn usage_finding(s: &Snapshot, a: &Analysis, from: &str, p: &PoolStats) -> Finding {
    let pct = p.usage * 100.0;
    let (line, fix) = if p.pool == DEFAULT_POOL {
        let line = format!(
            "{from} cluster CIDR {} ({}): {}/{} node CIDRs in use ({pct:.0} %)",
            p.cluster_cidr, p.family, p.allocated, p.max
        );
        (line, cluster_cidr_fix(s, &[p]))
    } else {
        let line = format!(
            "ClusterCIDR {}: {} ({}): {}/{} node CIDRs in use ({pct:.0} %)",
            p.pool, p.cluster_cidr, p.family, p.allocated, p.max
        );
        let fix = format!(
            "create another ClusterCIDR with an unused range for the Nodes that {} selects (kubectl get clustercidr {} -o yaml), or delete the Nodes that are gone",
            p.pool, p.pool
        );
        (line, fix)
    };
    let how = if p.allocated >= p.max {
        "full"
    } else if p.usage > NEARLY_FULL {
        "over 90 %"
    } else {
        return Finding::ok("pool", line);
    };
    let (line, fix, nodes) = match oversized::blame(a, &[p]) {
        Some(b) => (format!("{line}: {how}{}", b.text), b.before(&fix), b.nodes),
        None => (format!("{line}: {how}"), fix, Vec::new()),
    };
    if p.allocated >= p.max {
        Finding::fail("pool", line, fix).about(nodes)
    } else {
        Finding::warn("pool", line, fix).about(nodes)
    }
}

/// Whether a ClusterCIDR's `status` is one netcm wrote (it has a phase) without conditions: the
/// installed CRD prunes them (it predates them), or the leader is a netcm that writes none.
pub fn lacks_conditions(status: Option<&serde_json::Value>) -> bool {
    status.is_some_and(|s| s.get("phase").is_some() && s.get("conditions").is_none())
}

/// A warning when ClusterCIDRs carry a status without conditions: `kubectl wait` and GitOps health
/// checks cannot read them.
fn conditions_finding(s: &Snapshot) -> Option<Finding> {
    let names = &s.pools_without_conditions;
    if names.is_empty() || s.settings.cluster_cidr_objects == Some(false) {
        return None;
    }
    const SHOWN: usize = 3;
    let mut shown = names
        .iter()
        .take(SHOWN)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if names.len() > SHOWN {
        shown.push_str(&format!(" and {} more", names.len() - SHOWN));
    }
    Some(Finding::warn(
        "pool",
        format!("ClusterCIDR {shown}: a status without conditions, so `kubectl wait --for=condition=Ready` and GitOps health checks (Helm 4, Flux, Argo CD) cannot read it; the installed ClusterCIDR CRD predates status.conditions (helm upgrade never updates CRDs), or the leader runs an older netcm"),
        "kubectl apply --server-side -f charts/netcm/crds/clustercidrs.yaml, then restart netcm (kubectl -n kube-system rollout restart deployment/netcm); see docs/pools.md, Health",
    ))
}

/// Why a Node without a pod CIDR has none, and how bad that is.
pub fn why_waiting(
    s: &Snapshot,
    analysis: Option<&Result<Analysis, String>>,
    node: &k8s_openapi::api::core::v1::Node,
) -> Finding {
    let n = name(node).to_string();
    if s.settings.allocates == Some(false) {
        return Finding::fail(
            "waiting",
            format!("Node {n} has no pod CIDR: the leader does not run the allocator (--allocate-node-cidrs=false or subnet-allocator not in --controllers)"),
            "run netcm with --allocate-node-cidrs=true and subnet-allocator in --controllers (chart: allocator.enabled=true), or let another allocator do it",
        )
        .about([n]);
    }
    if !s.has_leader() {
        return Finding::fail(
            "waiting",
            format!("Node {n} has no pod CIDR: no netcm leads, so nothing allocates"),
            "see the leader check above",
        )
        .about([n]);
    }
    if let Some(full) = full_pool_finding(s, analysis, &n) {
        return full;
    }
    if let Some(warning) = warning_event_finding(s, &n) {
        return warning;
    }
    let age = node
        .metadata
        .creation_timestamp
        .as_ref()
        .map(|t| s.now.duration_since(t.0).as_secs())
        .unwrap_or(i64::MAX);
    if age < GRACE_SECS {
        return Finding::warn(
            "waiting",
            format!("Node {n} has no pod CIDR yet: created {age}s ago, being allocated"),
            "wait a few seconds and run netcm check again",
        )
        .about([n]);
    }
    Finding::fail(
        "waiting",
        format!(
            "Node {n} has had no pod CIDR for {} although netcm leads and no pool is full",
            ago(s.now, s.now - jiff::SignedDuration::from_secs(age))
        ),
        format!(
            "read the leader's log for it: kubectl -n {} logs <leader pod> | grep node={n}",
            s.lease_namespace
        ),
    )
    .about([n])
}

/// Node `n` waits on full cluster CIDRs (the first full family's): which are full, who is to blame if an
/// oversized pod CIDR filled the flag's pool, and how to make room; `None` when no pool is full.
fn full_pool_finding(
    s: &Snapshot,
    analysis: Option<&Result<Analysis, String>>,
    n: &str,
) -> Option<Finding> {
    let Some(Ok(a)) = analysis else {
        return None;
    };
    let fam = a.full.first()?;
    let full: Vec<&PoolStats> = a.stats.iter().filter(|p| p.family == *fam).collect();
    let sizes: Vec<String> = full
        .iter()
        .map(|p| format!("{} is full ({}/{})", p.cluster_cidr, p.allocated, p.max))
        .collect();
    let fix = cluster_cidr_fix(s, &full);
    let flag_pool: Vec<&PoolStats> = full
        .iter()
        .copied()
        .filter(|p| p.pool == DEFAULT_POOL)
        .collect();
    let (blame, fix) = match oversized::blame(a, &flag_pool) {
        Some(b) => {
            let fix = b.before(&fix);
            (b.text, fix)
        }
        None => (String::new(), fix),
    };
    Some(
        Finding::fail(
            "waiting",
            format!(
                "Node {n} has no pod CIDR: {} cluster CIDR {}{blame}",
                fam,
                sizes.join(", ")
            ),
            fix,
        )
        .about([n]),
    )
}

/// The first Warning Event netcm recorded about Node `n`, which says why it has no pod CIDR.
fn warning_event_finding(s: &Snapshot, n: &str) -> Option<Finding> {
    let e = s
        .events_about(n)
        .into_iter()
        .find(|e| e.type_.as_deref() == Some("Warning"))?;
    let when = event_time(e)
        .map(|t| format!(" {} ago", ago(s.now, t)))
        .unwrap_or_default();
    Some(
        Finding::fail(
            "waiting",
            format!(
                "Node {n} has no pod CIDR: netcm recorded {}{when}: {}",
                e.reason.as_deref().unwrap_or("?"),
                e.note.as_deref().unwrap_or("")
            ),
            format!("act on the Event's message; then kubectl get events.events.k8s.io -A --field-selector regarding.name={n}"),
        )
        .about([n]),
    )
}

/// Every Node without a pod CIDR, with why; one ✓ line when there is none.
pub fn check_waiting(s: &Snapshot, analysis: Option<&Result<Analysis, String>>) -> Vec<Finding> {
    let waiting: Vec<Finding> = s
        .nodes
        .iter()
        .filter(|n| netcm_node::raw_pod_cidrs(n).is_empty())
        .map(|n| why_waiting(s, analysis, n))
        .collect();
    if waiting.is_empty() {
        return vec![Finding::ok(
            "waiting",
            format!("every Node ({}) has a pod CIDR", s.nodes.len()),
        )];
    }
    waiting
}

/// The finding for one Node's bad data.
pub fn bad_data_finding(
    s: &Snapshot,
    node: &str,
    unparsable: &[String],
    findings: &[CidrFinding],
) -> Vec<Finding> {
    let mut out = Vec::new();
    for raw in unparsable {
        out.push(
            Finding::fail(
                "cidrs",
                format!("Node {node} has an unparsable pod CIDR {raw:?}"),
                format!("spec.podCIDR(s) cannot be changed once set: delete and re-create Node {node} (kubectl delete node {node}; its kubelet registers it again) and netcm gives it a valid one"),
            )
            .about([node]),
        );
    }
    for f in findings {
        let finding = match f {
            CidrFinding::Conflict { cidr, other_node, other_cidr } => Finding::fail(
                "cidrs",
                format!("Node {node}'s pod CIDR {cidr} overlaps {other_cidr} of Node {other_node}"),
                format!("re-create the Node that got it second ({node}): kubectl delete node {node}; netcm gives the re-registered Node a free CIDR (find who wrote it in the allocators check)"),
            )
            .about([node.to_string(), other_node.clone()]),
            CidrFinding::OutOfRange { cidr } => Finding::warn(
                "cidrs",
                format!("Node {node}'s pod CIDR {cidr} is outside every cluster CIDR ({})", s.settings.cluster_cidr),
                format!("if {cidr} belongs to the pod network, add it to --cluster-cidr; else re-create Node {node} (kubectl delete node {node})"),
            )
            .about([node]),
            CidrFinding::ServiceRangeOverlap { cidr, service_range } => Finding::fail(
                "cidrs",
                format!("Node {node}'s pod CIDR {cidr} overlaps the service range {service_range}"),
                format!("re-create Node {node} (kubectl delete node {node}); netcm never hands out service addresses"),
            )
            .about([node]),
        };
        out.push(finding);
    }
    out
}

/// Bad data on any Node; one ✓ line when there is none. Without pool settings only unparsable CIDRs and
/// overlaps between Nodes can be found.
pub fn check_bad_data(s: &Snapshot, analysis: Option<&Result<Analysis, String>>) -> Vec<Finding> {
    let mut out = Vec::new();
    match analysis {
        Some(Ok(a)) => {
            out.extend(
                a.oversized
                    .iter()
                    .map(|(node, o)| oversized_finding(node, o)),
            );
            for (node, (unparsable, findings)) in &a.bad {
                out.extend(bad_data_finding(s, node, unparsable, findings));
            }
        }
        _ => {
            // No pools known: a pairwise overlap check over the parsed CIDRs, oldest Node first.
            let mut held: Vec<(&str, ipnet::IpNet)> = Vec::new();
            let mut nodes: Vec<_> = s.nodes.iter().collect();
            nodes.sort_by_key(|n| n.metadata.creation_timestamp.as_ref().map(|t| t.0));
            for node in nodes {
                let (good, bad) = pod_cidrs(node);
                let mut findings = Vec::new();
                for c in &good {
                    for (other, oc) in &held {
                        if *other != name(node)
                            && (c.contains(&oc.network()) || oc.contains(&c.network()))
                        {
                            findings.push(CidrFinding::Conflict {
                                cidr: *c,
                                other_node: other.to_string(),
                                other_cidr: *oc,
                            });
                        }
                    }
                }
                out.extend(bad_data_finding(s, name(node), &bad, &findings));
                held.extend(good.into_iter().map(|c| (name(node), c)));
            }
        }
    }
    if out.is_empty() {
        out.push(Finding::ok(
            "cidrs",
            "no unparsable, out-of-range, oversized or overlapping pod CIDRs",
        ));
    }
    out
}

#[cfg(test)]
mod tests;
