//! `netcm check node NAME`: everything about one Node (its CIDRs and who wrote them, its claims, its
//! flannel lease, its route condition, the Events netcm recorded on it) and the verdict in one sentence.

use ipnet::IpNet;
use k8s_openapi::api::core::v1::Node;

use super::pools::Analysis;
use super::report::{Finding, Status};
use super::snapshot::{
    ago, annotations, event_time, name, pod_cidrs, ClaimRecord, ClaimsState, Snapshot,
};
use super::{allocators, flannel, pools};

/// The findings and the verdict for the Node `node_name`.
pub fn check(
    s: &Snapshot,
    analysis: Option<&Result<Analysis, String>>,
    node_name: &str,
) -> (Vec<Finding>, String) {
    let Some(node) = s.node(node_name) else {
        let f = Finding::fail(
            "node",
            format!("Node {node_name} does not exist"),
            "kubectl get nodes (names are case-sensitive); a Node appears when its kubelet registers",
        );
        return (vec![f], format!("no such Node: {node_name} does not exist"));
    };
    let mut report = NodeReport::default();
    let (good, bad) = pod_cidrs(node);
    let cidrs: Vec<String> = good
        .iter()
        .map(ToString::to_string)
        .chain(bad.iter().cloned())
        .collect();
    if cidrs.is_empty() {
        report.problem(pools::why_waiting(s, analysis, node), "no pod CIDR");
    } else {
        pod_cidr_findings(&mut report, s, analysis, node, node_name, &cidrs, &good);
    }
    if let ClaimsState::Listed(claims) = &s.claims {
        report.findings.push(claims_finding(claims, node));
    }
    subnet_lease_findings(&mut report, s, node, !good.is_empty());
    route_findings(&mut report, s, node, node_name);
    report.findings.extend(event_findings(s, node_name));
    let verdict = report.verdict.unwrap_or_else(|| healthy(s, node, &cidrs));
    (report.findings, verdict)
}

/// The findings about one Node so far, and its verdict: the first problem found, in the order the
/// sections run.
#[derive(Default)]
struct NodeReport {
    findings: Vec<Finding>,
    verdict: Option<String>,
}

impl NodeReport {
    /// A finding that is the verdict, as `what`, unless an earlier problem is.
    fn problem(&mut self, f: Finding, what: &str) {
        self.blame(&f, what);
        self.findings.push(f);
    }

    /// The verdict is `f`, as `what`, unless an earlier problem is.
    fn blame(&mut self, f: &Finding, what: &str) {
        self.verdict.get_or_insert_with(|| sentence(f, what));
    }
}

/// What the Node's pod CIDRs are and who wrote them; whether they are bad data, from its side or from a
/// Node whose CIDR overlaps it; and whether an allocator other than netcm wrote them.
fn pod_cidr_findings(
    report: &mut NodeReport,
    s: &Snapshot,
    analysis: Option<&Result<Analysis, String>>,
    node: &Node,
    node_name: &str,
    cidrs: &[String],
    good: &[IpNet],
) {
    let writers = allocators::pod_cidr_writers(node);
    report
        .findings
        .push(held_finding(s, node, node_name, cidrs, &writers));
    let bad_data = bad_data_findings(s, analysis, node_name);
    let others = overlaps_from_others(s, analysis, node_name);
    if let Some(first) = bad_data
        .iter()
        .chain(others.iter())
        .find(|f| f.status == Status::Fail)
    {
        report.blame(first, "bad pod CIDR");
    }
    report.findings.extend(bad_data);
    report.findings.extend(others);
    // Inside another Node's oversized CIDR: that Node is to blame, not this one.
    if let Some(Ok(a)) = analysis {
        report.findings.extend(pools::inside_of(a, node_name, good));
    }
    if let Some(foreign) = writers
        .iter()
        .find(|w| w.manager != allocators::NETCM_MANAGER)
    {
        let f = Finding::fail(
            "allocators",
            format!(
                "Node {node_name}'s pod CIDRs were written by field manager {:?}, not netcm",
                foreign.manager
            ),
            allocators::how_to_stop(&foreign.manager),
        )
        .about([node_name]);
        report.problem(f, "another allocator");
    }
}

/// The Node, its age and its pod CIDRs with the field managers that wrote them.
fn held_finding(
    s: &Snapshot,
    node: &Node,
    node_name: &str,
    cidrs: &[String],
    writers: &[allocators::Writer],
) -> Finding {
    let written_by: Vec<String> = writers
        .iter()
        .map(|w| match w.time {
            Some(t) => format!("{} ({} ago)", w.manager, ago(s.now, t)),
            None => w.manager.clone(),
        })
        .collect();
    let uid = node.metadata.uid.as_deref().unwrap_or("?");
    let age = node
        .metadata
        .creation_timestamp
        .as_ref()
        .map(|t| ago(s.now, t.0))
        .unwrap_or_else(|| "?".into());
    Finding::ok(
        "node",
        format!(
            "Node {node_name} (UID {uid}, {age} old) has pod CIDR(s) {}{}",
            cidrs.join(","),
            if written_by.is_empty() {
                String::new()
            } else {
                format!(", written by {}", written_by.join(", "))
            }
        ),
    )
}

/// The bad data found on the Node's own pod CIDRs: from the analysis when there is one, else every
/// bad-data check that is not Ok and names the Node.
fn bad_data_findings(
    s: &Snapshot,
    analysis: Option<&Result<Analysis, String>>,
    node_name: &str,
) -> Vec<Finding> {
    match analysis {
        Some(Ok(a)) => a
            .oversized
            .get(node_name)
            .map(|o| pools::oversized_finding(node_name, o))
            .into_iter()
            .chain(
                a.bad
                    .iter()
                    .filter(|(n, _)| n.as_str() == node_name)
                    .flat_map(|(n, (u, f))| pools::bad_data_finding(s, n, u, f)),
            )
            .collect(),
        _ => pools::check_bad_data(s, analysis)
            .into_iter()
            .filter(|f| f.status != Status::Ok && f.nodes.iter().any(|n| n == node_name))
            .collect(),
    }
}

/// Overlaps found from the other Node's side, which name this Node too.
fn overlaps_from_others(
    s: &Snapshot,
    analysis: Option<&Result<Analysis, String>>,
    node_name: &str,
) -> Vec<Finding> {
    match analysis {
        Some(Ok(a)) => a
            .bad
            .iter()
            .filter(|(n, _)| n.as_str() != node_name)
            .flat_map(|(n, (u, f))| pools::bad_data_finding(s, n, u, f))
            .filter(|f| f.nodes.iter().any(|n| n == node_name))
            .collect(),
        _ => Vec::new(),
    }
}

/// The PodCIDRClaims whose blocks hold the Node's pod CIDRs.
fn claims_finding(claims: &[ClaimRecord], node: &Node) -> Finding {
    let held = pod_cidrs(node).0;
    let covering: Vec<String> = claims
        .iter()
        .filter(|c| {
            c.cidr
                .parse::<IpNet>()
                .is_ok_and(|block| held.iter().any(|h| block.contains(h)))
        })
        .map(|c| format!("{} ({})", c.name, c.cidr))
        .collect();
    Finding::ok(
        "claims",
        if covering.is_empty() {
            "no PodCIDRClaim covers this Node's pod CIDRs".to_string()
        } else {
            format!(
                "its pod CIDRs lie in PodCIDRClaim(s): {}",
                covering.join(", ")
            )
        },
    )
}

/// The Node's flannel lease: its problem, or, for a Node with pod CIDRs, the public IPs it publishes.
fn subnet_lease_findings(report: &mut NodeReport, s: &Snapshot, node: &Node, has_pod_cidrs: bool) {
    match flannel::subnet_lease_problem(s, node) {
        Some(f) => report.problem(f, "lease"),
        None if has_pod_cidrs => {
            if let Ok(cfg) = &s.settings.syncer {
                let a = annotations(node);
                let ips: Vec<&str> = [&cfg.keys.public_ip, &cfg.keys.public_ipv6]
                    .iter()
                    .filter_map(|k| a.get(*k).map(String::as_str))
                    .collect();
                if !ips.is_empty() {
                    report.findings.push(Finding::ok(
                        "leases",
                        format!("flannel lease current, public IP {}", ips.join(", ")),
                    ));
                }
            }
        }
        None => {}
    }
}

/// The Node's NetworkUnavailable condition, and the route check that explains NoRouteCreated.
fn route_findings(report: &mut NodeReport, s: &Snapshot, node: &Node, node_name: &str) {
    let Some((status, reason, message)) = flannel::network_condition(node) else {
        return;
    };
    if status == "True" && reason == "NoRouteCreated" {
        let f = flannel::check_routes(s)
            .into_iter()
            .find(|f| f.nodes.iter().any(|n| n == node_name));
        if let Some(f) = f {
            report.problem(f, "no route");
        }
    } else {
        report.findings.push(Finding::ok(
            "routes",
            format!("NetworkUnavailable={status} ({reason}: {message})"),
        ));
    }
}

/// The latest Events netcm recorded about the Node, a Warning with the command that lists them all.
fn event_findings(s: &Snapshot, node_name: &str) -> Vec<Finding> {
    s.events_about(node_name)
        .into_iter()
        .take(5)
        .map(|e| {
            let when = event_time(e)
                .map(|t| format!("{} ago", ago(s.now, t)))
                .unwrap_or_default();
            let line = format!(
                "Event {} {} {when}: {}",
                e.type_.as_deref().unwrap_or("?"),
                e.reason.as_deref().unwrap_or("?"),
                e.note.as_deref().unwrap_or("")
            );
            if e.type_.as_deref() == Some("Warning") {
                Finding::warn("events", line, format!("kubectl get events.events.k8s.io -A --field-selector regarding.name={node_name}"))
            } else {
                Finding::ok("events", line)
            }
        })
        .collect()
}

/// The verdict of a Node with no problem.
fn healthy(s: &Snapshot, node: &Node, cidrs: &[String]) -> String {
    format!(
        "healthy: Node {} holds {}{}",
        name(node),
        cidrs.join(","),
        if s.has_leader() {
            ""
        } else {
            " (but no netcm leads: see netcm check)"
        }
    )
}

/// "what: message; fix" as one sentence.
fn sentence(f: &Finding, what: &str) -> String {
    let msg = f
        .message
        .split_once(": ")
        .map(|(_, m)| m)
        .unwrap_or(&f.message);
    match &f.fix {
        Some(fix) => format!("{what}: {msg}; {fix}"),
        None => format!("{what}: {msg}"),
    }
}

#[cfg(test)]
mod tests {
    use super::super::report::Report;
    use super::super::snapshot::fixtures::*;
    use super::*;

    #[test]
    fn a_node_waiting_on_a_full_pool_gets_that_as_its_verdict() {
        let s = snapshot(
            "10.244.0.0/24",
            vec![
                node("a", "192.0.2.1", &["10.244.0.0/24"]),
                node("b", "192.0.2.2", &[]),
            ],
        );
        let a = pools::analyse(&s);
        let (f, verdict) = check(&s, a.as_ref(), "b");
        assert!(
            verdict.starts_with(
                "no pod CIDR: IPv4 cluster CIDR 10.244.0.0/24 is full (1/1); append a second"
            ),
            "{verdict}"
        );
        assert_eq!(f[0].status, Status::Fail);
    }

    #[test]
    fn a_healthy_node_lists_its_cidrs_and_is_called_healthy() {
        let n = with_subnet_lease(node("a", "192.0.2.1", &["10.244.0.0/24"]), "192.0.2.1");
        let s = snapshot("10.244.0.0/16", vec![n]);
        let a = pools::analyse(&s);
        let (f, verdict) = check(&s, a.as_ref(), "a");
        assert_eq!(verdict, "healthy: Node a holds 10.244.0.0/24");
        assert!(f.iter().all(|f| f.status == Status::Ok), "{f:#?}");
        assert!(f.iter().any(|f| f.message.contains("public IP 192.0.2.1")));
    }

    #[test]
    fn an_overlap_is_the_verdict_of_both_nodes() {
        let s = snapshot(
            "10.244.0.0/16",
            vec![
                node("a", "192.0.2.1", &["10.244.1.0/24"]),
                node("b", "192.0.2.2", &["10.244.1.0/24"]),
            ],
        );
        let a = pools::analyse(&s);
        for n in ["a", "b"] {
            let (_, verdict) = check(&s, a.as_ref(), n);
            assert!(
                verdict.starts_with("bad pod CIDR:") && verdict.contains("overlaps"),
                "{n}: {verdict}"
            );
        }
    }

    #[test]
    fn an_oversized_pod_cidr_is_its_nodes_verdict_and_not_that_of_the_nodes_inside_it() {
        let s = snapshot(
            "10.0.0.0/16",
            vec![
                with_subnet_lease(node("n0", "192.0.2.1", &["10.0.0.0/24"]), "192.0.2.1"),
                node("hostile", "192.0.2.9", &["10.0.0.0/8"]),
            ],
        );
        let a = pools::analyse(&s);
        let (_, verdict) = check(&s, a.as_ref(), "hostile");
        assert!(
            verdict.starts_with("bad pod CIDR: ")
                && verdict.contains("10.0.0.0/8 is wider than the /24 node CIDRs")
                && verdict.contains("remove --pod-cidr from Node hostile's kubelet"),
            "{verdict}"
        );
        let (f, verdict) = check(&s, a.as_ref(), "n0");
        assert_eq!(verdict, "healthy: Node n0 holds 10.0.0.0/24", "{f:#?}");
        assert!(
            f.iter().any(|f| f.status == Status::Ok
                && f.message
                    .contains("inside Node hostile's pod CIDR 10.0.0.0/8")),
            "{f:#?}"
        );
    }

    #[test]
    fn terminal_escape_sequences_in_a_nodes_annotations_are_printed_escaped() {
        // A kubelet writes its own annotations: one that clears the screen and retitles the terminal.
        let hostile = "192.0.2.1\u{1b}[2J\u{1b}]0;owned\u{7}\u{9b}31m";
        let n = with_subnet_lease(node("a", "192.0.2.1", &["10.244.0.0/24"]), hostile);
        let s = snapshot("10.244.0.0/16", vec![n]);
        let a = pools::analyse(&s);
        let (f, verdict) = check(&s, a.as_ref(), "a");
        let text = Report::new(f, Some(verdict)).text();
        assert!(
            !text.chars().any(|c| c.is_control() && c != '\n'),
            "{text:?}"
        );
        assert!(
            text.contains(r"192.0.2.1\u{1b}[2J\u{1b}]0;owned\u{7}\u{9b}31m"),
            "{text}"
        );
    }

    #[test]
    fn an_unknown_node_is_said_not_to_exist() {
        let s = snapshot("10.244.0.0/16", vec![]);
        let (_, verdict) = check(&s, None, "ghost");
        assert_eq!(verdict, "no such Node: ghost does not exist");
    }
}
