//! flannel's subnet leases (the node-annotation-syncer's output): every Node with a pod CIDR should carry
//! the lease annotations flannel reads, matching what the syncer would publish now (its own pure
//! `subnet_lease::plan`); a public IP no address of the Node backs (and no overwrite asks for) is stale.
//! Also the route controller's `NetworkUnavailable` condition, from the API (not the host's routing table).

use k8s_openapi::api::core::v1::Node;
use netcm_node_annotation_syncer::subnet_lease::plan;

use super::report::Finding;
use super::snapshot::{annotations, name, Snapshot};

/// What is wrong with one Node's lease, if anything.
pub fn subnet_lease_problem(s: &Snapshot, node: &Node) -> Option<Finding> {
    let cfg = s.settings.syncer.as_ref().ok()?;
    let n = name(node).to_string();
    let current = annotations(node);
    let p = plan(cfg, &netcm_node::CachedNode::from(node), &current);
    let syncer_fix = |what: &str| {
        if s.settings.syncs_subnet_leases == Some(false) {
            format!("the leader does not run node-annotation-syncer: add it to --controllers (chart: annotationSyncer.enabled=true) {what}")
        } else {
            format!("the node-annotation-syncer has not caught up: see the leader's log (kubectl -n {} logs <leader pod> | grep node={n}) {what}", s.lease_namespace)
        }
    };
    if let Some(w) = &p.waiting {
        if netcm_node::raw_pod_cidrs(node).is_empty() {
            return None; // the pools check reports Nodes without pod CIDRs.
        }
        return Some(
            Finding::fail(
                "leases",
                format!("Node {n} has a pod CIDR but no flannel lease: {w}"),
                match w {
                    netcm_node_annotation_syncer::subnet_lease::Waiting::NoAddress(_) => format!(
                        "give Node {n} an address of the configured types ({}; kubelet --node-ip) or set {} to its public IP",
                        cfg.address_types.join(","),
                        cfg.keys.public_ip_overwrite
                    ),
                    _ => format!("re-create Node {n} with a usable pod CIDR (kubectl delete node {n})"),
                },
            )
            .about([n]),
        );
    }
    if p.changes.is_empty() {
        return None;
    }
    let missing = !current.contains_key(&cfg.keys.kube_subnet_manager);
    let mut what: Vec<String> = Vec::new();
    for key in [&cfg.keys.public_ip, &cfg.keys.public_ipv6] {
        if let (Some(want), Some(have)) = (p.changes.get(key), current.get(key)) {
            what.push(format!(
                "{key} is {have}, which no address of the Node backs (want {want})"
            ));
        }
    }
    let message = if missing {
        format!(
            "Node {n} has a pod CIDR but no flannel lease ({} missing)",
            cfg.keys.kube_subnet_manager
        )
    } else if what.is_empty() {
        let keys: Vec<&str> = p.changes.keys().map(String::as_str).collect();
        format!(
            "Node {n}'s flannel lease is stale: {} differ(s) from what netcm publishes",
            keys.join(", ")
        )
    } else {
        format!("Node {n}'s flannel lease is stale: {}", what.join("; "))
    };
    Some(Finding::fail("leases", message, syncer_fix("")).about([n]))
}

/// Lease findings for every Node, or one ✓/- line.
pub fn check(s: &Snapshot) -> Vec<Finding> {
    let cfg = match &s.settings.syncer {
        Ok(c) => c,
        Err(e) => {
            return vec![Finding::warn(
                "leases",
                format!("cannot check flannel leases: {e}"),
                "pass netcm check the syncer's --annotation-prefix and --public-ip-address-types",
            )]
        }
    };
    // Without a published configuration, only clusters that already carry leases are judged.
    let any_subnet_lease = s
        .nodes
        .iter()
        .any(|n| annotations(n).contains_key(&cfg.keys.kube_subnet_manager));
    if s.settings.syncs_subnet_leases == Some(false)
        || (s.settings.syncs_subnet_leases.is_none() && !any_subnet_lease)
    {
        return vec![Finding::skip(
            "leases",
            "netcm does not publish flannel leases here (node-annotation-syncer not running)",
        )];
    }
    let out: Vec<Finding> = s
        .nodes
        .iter()
        .filter_map(|n| subnet_lease_problem(s, n))
        .collect();
    if out.is_empty() {
        let with = s
            .nodes
            .iter()
            .filter(|n| !netcm_node::raw_pod_cidrs(n).is_empty())
            .count();
        return vec![Finding::ok(
            "leases",
            format!(
                "every Node with a pod CIDR ({with}) carries a current flannel lease under {}",
                cfg.keys.prefix
            ),
        )];
    }
    out
}

/// The Node's `NetworkUnavailable` condition as (status, reason, message), if any.
pub fn network_condition(node: &Node) -> Option<(String, String, String)> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "NetworkUnavailable")
        .map(|c| {
            (
                c.status.clone(),
                c.reason.clone().unwrap_or_default(),
                c.message.clone().unwrap_or_default(),
            )
        })
}

/// Nodes whose route could not be created (NoRouteCreated), as the route controller reports them.
pub fn check_routes(s: &Snapshot) -> Vec<Finding> {
    let failing: Vec<Finding> = s
        .nodes
        .iter()
        .filter_map(|n| {
            let (status, reason, message) = network_condition(n)?;
            (status == "True" && reason == "NoRouteCreated").then(|| {
                Finding::fail(
                    "routes",
                    format!("Node {} has no route: NetworkUnavailable={status} ({reason}: {message})", name(n)),
                    "see the route controller's log on the gateway host (grep node=<name>) and netcm_route_errors_total; in host-gw every Node needs an address on a shared L2 segment",
                )
                .about([name(n)])
            })
        })
        .collect();
    if !failing.is_empty() {
        return failing;
    }
    let routed = s
        .nodes
        .iter()
        .filter(|n| {
            network_condition(n).is_some_and(|(st, r, _)| st == "False" && r == "RouteCreated")
        })
        .count();
    if routed == 0 && s.settings.routes != Some(true) {
        return vec![Finding::skip(
            "routes",
            "no route controller reports NetworkUnavailable conditions (the host's routing table is not read by netcm check)",
        )];
    }
    vec![Finding::ok(
        "routes",
        format!("{routed} Node(s) report RouteCreated, none NoRouteCreated"),
    )]
}

#[cfg(test)]
mod tests {
    use super::super::report::Status;
    use super::super::snapshot::fixtures::*;
    use super::*;

    #[test]
    fn current_leases_on_every_node_with_a_pod_cidr_are_fine() {
        let s = snapshot(
            "10.244.0.0/16",
            vec![
                with_subnet_lease(node("a", "192.0.2.1", &["10.244.0.0/24"]), "192.0.2.1"),
                node("b", "192.0.2.2", &[]),
            ],
        );
        let f = check(&s);
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].status, Status::Ok, "{f:#?}");
    }

    #[test]
    fn a_node_with_a_pod_cidr_and_no_lease_is_named() {
        let s = snapshot(
            "10.244.0.0/16",
            vec![node("a", "192.0.2.1", &["10.244.0.0/24"])],
        );
        let f = check(&s);
        assert_eq!(f[0].status, Status::Fail);
        assert!(
            f[0].message.contains("no flannel lease"),
            "{}",
            f[0].message
        );
    }

    #[test]
    fn a_lease_public_ip_no_address_backs_is_stale() {
        let s = snapshot(
            "10.244.0.0/16",
            vec![with_subnet_lease(
                node("a", "192.0.2.1", &["10.244.0.0/24"]),
                "198.51.100.7",
            )],
        );
        let f = check(&s);
        assert_eq!(f[0].status, Status::Fail);
        assert!(
            f[0].message
                .contains("198.51.100.7, which no address of the Node backs"),
            "{}",
            f[0].message
        );
    }

    #[test]
    fn a_node_without_an_address_cannot_get_a_lease_and_is_told_how_to_get_one() {
        let mut n = node("a", "192.0.2.1", &["10.244.0.0/24"]);
        n.status = None;
        let f = check(&snapshot("10.244.0.0/16", vec![n]));
        assert_eq!(f[0].status, Status::Fail);
        assert!(f[0]
            .fix
            .as_deref()
            .unwrap_or_default()
            .contains("public-ip-overwrite"));
    }

    #[test]
    fn a_node_reporting_no_route_created_fails_the_routes_check() {
        use k8s_openapi::api::core::v1::NodeCondition;
        let mut n = node("a", "192.0.2.1", &["10.244.0.0/24"]);
        n.status.get_or_insert_with(Default::default).conditions = Some(vec![NodeCondition {
            type_: "NetworkUnavailable".into(),
            status: "True".into(),
            reason: Some("NoRouteCreated".into()),
            message: Some("Failed to create a route".into()),
            ..Default::default()
        }]);
        let f = check_routes(&snapshot("10.244.0.0/16", vec![n]));
        assert_eq!(f[0].status, Status::Fail);
        assert_eq!(f[0].nodes, ["a"]);
    }
}
