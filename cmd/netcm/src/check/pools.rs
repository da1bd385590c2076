//! Pools, waiting Nodes and bad data: capacity vs Nodes per cluster CIDR (as the allocator counts it,
//! with netcm-ipam's own `Pools`), Nodes without a pod CIDR and why, and pod CIDRs that are unparsable,
//! outside every cluster CIDR, or overlap another Node's (naming both).

use std::collections::BTreeMap;

use netcm_ipam::{HoldFinding, PoolStats, Pools};
use netcm_node::Family;

use super::report::Finding;
use super::snapshot::{ago, event_time, name, pod_cidrs, Snapshot, Source};

/// Usage above which a pool is reported as nearly full.
pub const NEARLY_FULL: f64 = 0.9;
/// A Node without a pod CIDR younger than this is "being allocated", not "waiting".
pub const GRACE_SECS: i64 = 30;

/// The pools as the allocator would see them with every Node's CIDRs recorded.
pub struct Analysis {
    /// Usage per cluster CIDR.
    pub stats: Vec<PoolStats>,
    /// Families whose every cluster CIDR is full.
    pub full: Vec<Family>,
    /// Per Node: (unparsable CIDRs, findings).
    pub bad: BTreeMap<String, (Vec<String>, Vec<HoldFinding>)>,
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
    let mut bad = BTreeMap::new();
    // Oldest first, so the Node that got a CIDR second is the one named as overlapping the first.
    let mut nodes: Vec<_> = s.nodes.iter().collect();
    nodes.sort_by_key(|n| n.metadata.creation_timestamp.as_ref().map(|t| t.0));
    for node in nodes {
        let (good, unparsable) = pod_cidrs(node);
        let outcome = pools.hold(name(node), &good);
        if !unparsable.is_empty() || !outcome.findings.is_empty() {
            bad.insert(name(node).to_string(), (unparsable, outcome.findings));
        }
    }
    let stats = pools.stats();
    let full = config
        .families
        .iter()
        .map(|f| f.family)
        .filter(|fam| {
            stats
                .iter()
                .filter(|st| st.family == *fam)
                .all(|st| st.allocated >= st.max)
        })
        .collect();
    Some(Ok(Analysis { stats, full, bad }))
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

/// One line per cluster CIDR: usage, nearly full, full.
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
    a.stats
        .iter()
        .map(|p| {
            let pct = p.usage * 100.0;
            let line = format!(
                "{from} cluster CIDR {} ({}): {}/{} node CIDRs in use ({pct:.0} %)",
                p.cluster_cidr, p.family, p.allocated, p.max
            );
            if p.allocated >= p.max {
                Finding::fail("pool", format!("{line}: full"), cluster_cidr_fix(s, &[p]))
            } else if p.usage > NEARLY_FULL {
                Finding::warn(
                    "pool",
                    format!("{line}: over 90 %"),
                    cluster_cidr_fix(s, &[p]),
                )
            } else {
                Finding::ok("pool", line)
            }
        })
        .collect()
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
    if let Some(Ok(a)) = analysis {
        if let Some(fam) = a.full.first() {
            let full: Vec<&PoolStats> = a.stats.iter().filter(|p| p.family == *fam).collect();
            let sizes: Vec<String> = full
                .iter()
                .map(|p| format!("{} is full ({}/{})", p.cluster_cidr, p.allocated, p.max))
                .collect();
            return Finding::fail(
                "waiting",
                format!(
                    "Node {n} has no pod CIDR: {} cluster CIDR {}",
                    fam,
                    sizes.join(", ")
                ),
                cluster_cidr_fix(s, &full),
            )
            .about([n]);
        }
    }
    let warning = s
        .events_about(&n)
        .into_iter()
        .find(|e| e.type_.as_deref() == Some("Warning"));
    if let Some(e) = warning {
        let when = event_time(e)
            .map(|t| format!(" {} ago", ago(s.now, t)))
            .unwrap_or_default();
        return Finding::fail(
            "waiting",
            format!(
                "Node {n} has no pod CIDR: netcm recorded {}{when}: {}",
                e.reason.as_deref().unwrap_or("?"),
                e.note.as_deref().unwrap_or("")
            ),
            format!("act on the Event's message; then kubectl get events.events.k8s.io -A --field-selector regarding.name={n}"),
        )
        .about([n]);
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
    findings: &[HoldFinding],
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
            HoldFinding::Conflict { cidr, other_node, other_cidr } => Finding::fail(
                "cidrs",
                format!("Node {node}'s pod CIDR {cidr} overlaps {other_cidr} of Node {other_node}"),
                format!("re-create the Node that got it second ({node}): kubectl delete node {node}; netcm gives the re-registered Node a free CIDR (find who wrote it in the allocators check)"),
            )
            .about([node.to_string(), other_node.clone()]),
            HoldFinding::OutOfRange { cidr } => Finding::warn(
                "cidrs",
                format!("Node {node}'s pod CIDR {cidr} is outside every cluster CIDR ({})", s.settings.cluster_cidr),
                format!("if {cidr} belongs to the pod network, add it to --cluster-cidr; else re-create Node {node} (kubectl delete node {node})"),
            )
            .about([node]),
            HoldFinding::ServiceRangeOverlap { cidr, service_range } => Finding::fail(
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
                            findings.push(HoldFinding::Conflict {
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
            "no unparsable, out-of-range or overlapping pod CIDRs",
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::report::Status;
    use super::super::snapshot::fixtures::*;
    use super::*;
    use k8s_openapi::api::core::v1::ObjectReference;
    use k8s_openapi::api::events::v1::Event;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};

    fn run(s: &Snapshot) -> Vec<Finding> {
        let a = analyse(s);
        let mut out = check_pools(s, a.as_ref());
        out.extend(check_waiting(s, a.as_ref()));
        out.extend(check_bad_data(s, a.as_ref()));
        out
    }

    #[test]
    fn a_healthy_pool_reports_its_usage_and_every_node_served() {
        let s = snapshot(
            "10.244.0.0/16",
            vec![
                node("a", "192.0.2.1", &["10.244.0.0/24"]),
                node("b", "192.0.2.2", &["10.244.1.0/24"]),
            ],
        );
        let f = run(&s);
        assert!(f.iter().all(|f| f.status == Status::Ok), "{f:#?}");
        assert!(f[0].message.contains("2/256"), "{}", f[0].message);
    }

    #[test]
    fn a_full_pool_names_the_waiting_node_and_says_to_append_a_cluster_cidr() {
        let s = snapshot(
            "10.244.0.0/23",
            vec![
                node("a", "192.0.2.1", &["10.244.0.0/24"]),
                node("b", "192.0.2.2", &["10.244.1.0/24"]),
                node("c", "192.0.2.3", &[]),
            ],
        );
        let f = run(&s);
        let pool = &f[0];
        assert_eq!(pool.status, Status::Fail);
        assert!(
            pool.message.contains("2/2") && pool.message.contains("full"),
            "{}",
            pool.message
        );
        let waiting = f.iter().find(|f| f.check == "waiting").expect("waiting");
        assert_eq!(waiting.status, Status::Fail);
        assert_eq!(waiting.nodes, ["c"]);
        assert!(
            waiting.message.contains("10.244.0.0/23 is full (2/2)"),
            "{}",
            waiting.message
        );
        assert!(waiting
            .fix
            .as_deref()
            .unwrap_or_default()
            .contains("--cluster-cidr"));
    }

    #[test]
    fn a_pool_over_ninety_percent_is_a_warning() {
        let nodes: Vec<_> = (0..15)
            .map(|i| {
                node(
                    &format!("n{i}"),
                    "192.0.2.1",
                    &[&format!("10.244.0.{}/28", i * 16)],
                )
            })
            .collect();
        let mut s = snapshot("10.244.0.0/24", nodes);
        s.settings = super::super::snapshot::Settings::resolve(
            &super::super::snapshot::GivenFlags {
                cluster_cidr: Some("10.244.0.0/24".into()),
                node_cidr_mask_size: Some(28),
                ..Default::default()
            },
            None,
        );
        let f = run(&s);
        assert_eq!(f[0].status, Status::Warn, "{f:#?}");
        assert!(f[0].message.contains("15/16"));
    }

    #[test]
    fn overlapping_cidrs_name_both_nodes_and_the_later_one_is_to_be_recreated() {
        let mut older = node("old", "192.0.2.1", &["10.244.1.0/24"]);
        older.metadata.creation_timestamp = Some(Time(before(7200)));
        let s = snapshot(
            "10.244.0.0/16",
            vec![node("new", "192.0.2.2", &["10.244.1.0/25"]), older],
        );
        let f = run(&s);
        let bad = f.iter().find(|f| f.check == "cidrs").expect("cidrs");
        assert_eq!(bad.status, Status::Fail);
        assert_eq!(bad.nodes, ["new", "old"]);
        assert!(
            bad.message.contains("Node new") && bad.message.contains("Node old"),
            "{}",
            bad.message
        );
        assert!(bad
            .fix
            .as_deref()
            .unwrap_or_default()
            .contains("kubectl delete node new"));
    }

    #[test]
    fn overlaps_are_found_even_without_known_cluster_cidrs() {
        let mut s = snapshot(
            "10.244.0.0/16",
            vec![
                node("a", "192.0.2.1", &["10.1.0.0/24"]),
                node("b", "192.0.2.2", &["10.1.0.0/24"]),
            ],
        );
        s.settings = super::super::snapshot::Settings::resolve(&Default::default(), None);
        let f = run(&s);
        assert_eq!(f[0].status, Status::Warn, "unknown pools: {f:#?}");
        assert!(f
            .iter()
            .any(|f| f.check == "cidrs" && f.status == Status::Fail));
    }

    #[test]
    fn unparsable_and_out_of_range_cidrs_are_reported_with_their_node() {
        let s = snapshot(
            "10.244.0.0/16",
            vec![
                node("a", "192.0.2.1", &["banana"]),
                node("b", "192.0.2.2", &["10.9.0.0/24"]),
            ],
        );
        let f = run(&s);
        let bad: Vec<_> = f.iter().filter(|f| f.check == "cidrs").collect();
        assert_eq!(bad.len(), 2, "{bad:#?}");
        assert!(bad[0].message.contains("unparsable") && bad[0].nodes == ["a"]);
        assert!(bad[1].message.contains("outside every cluster CIDR") && bad[1].nodes == ["b"]);
    }

    #[test]
    fn a_node_waiting_for_no_known_reason_is_a_warning_while_young_and_a_failure_later() {
        let mut young = node("young", "192.0.2.1", &[]);
        young.metadata.creation_timestamp = Some(Time(before(3)));
        let s = snapshot("10.244.0.0/16", vec![young, node("old", "192.0.2.2", &[])]);
        let f = run(&s);
        let waiting: Vec<_> = f.iter().filter(|f| f.check == "waiting").collect();
        assert_eq!(waiting[0].status, Status::Warn);
        assert_eq!(waiting[1].status, Status::Fail);
        assert!(waiting[1]
            .fix
            .as_deref()
            .unwrap_or_default()
            .contains("grep node=old"));
    }

    #[test]
    fn a_waiting_node_shows_the_warning_event_netcm_recorded_on_it() {
        let mut s = snapshot("10.244.0.0/16", vec![node("a", "192.0.2.1", &[])]);
        s.events.push(Event {
            type_: Some("Warning".into()),
            reason: Some("CIDRAssignmentFailed".into()),
            note: Some("denied by policy".into()),
            event_time: Some(MicroTime(before(5))),
            regarding: Some(ObjectReference {
                name: Some("a".into()),
                ..Default::default()
            }),
            ..Default::default()
        });
        let f = run(&s);
        let w = f.iter().find(|f| f.check == "waiting").expect("waiting");
        assert!(
            w.message
                .contains("CIDRAssignmentFailed 5s ago: denied by policy"),
            "{}",
            w.message
        );
    }

    #[test]
    fn without_a_leader_waiting_nodes_point_at_the_leader_check() {
        let mut s = snapshot("10.244.0.0/16", vec![node("a", "192.0.2.1", &[])]);
        s.lease = super::super::snapshot::LeaseState::NotFound;
        let f = run(&s);
        let w = f.iter().find(|f| f.check == "waiting").expect("waiting");
        assert!(w.message.contains("no netcm leads"), "{}", w.message);
    }
}
