//! The RBAC minimality table: each rule of the chart, the feature that needs it and how netcm fails without it.

use super::*;

pub(super) const COORDINATION: &str = "coordination.k8s.io";

pub(super) static CASES: [Case; 12] = [
    Case {
        role: "ClusterRole",
        resource: "tokenreviews",
        verbs: &["create"],
        feature: "secure metrics: authenticating scrapers (TokenReview)",
        probe: Probe(
            "create",
            "authentication.k8s.io",
            "tokenreviews",
            None,
            None,
        ),
        message: "secure metrics: token review failed",
        error: "cannot create resource \"tokenreviews\"",
    },
    Case {
        role: "ClusterRole",
        resource: "subjectaccessreviews",
        verbs: &["create"],
        feature: "secure metrics: authorizing scrapers (SubjectAccessReview)",
        probe: Probe(
            "create",
            "authorization.k8s.io",
            "subjectaccessreviews",
            None,
            None,
        ),
        message: "secure metrics: subject access review failed",
        error: "cannot create resource \"subjectaccessreviews\"",
    },
    Case {
        role: "ClusterRole",
        resource: "nodes",
        verbs: &["get", "list", "watch"],
        feature: "the Node informer",
        probe: Probe("list", "", "nodes", None, None),
        message: "watch failed",
        error: "cannot list resource \"nodes\"",
    },
    Case {
        role: "ClusterRole",
        resource: "nodes",
        verbs: &["patch"],
        feature: "pod CIDR allocation (PATCH spec.podCIDRs)",
        probe: Probe("patch", "", "nodes", None, None),
        message: "sync failed",
        error: "cannot patch resource \"nodes\"",
    },
    Case {
        role: "ClusterRole",
        resource: "podcidrclaims",
        verbs: &["create", "list", "patch"],
        feature: "PodCIDRClaims (one claim per block of CIDRs handed out of; release holds recorded on them)",
        probe: Probe("list", "ipam.netcm.io", "podcidrclaims", None, None),
        message: "a list this leader must read before its first allocation failed",
        error: "cannot list resource \"podcidrclaims\"",
    },
    Case {
        role: "ClusterRole",
        resource: "clustercidrs",
        verbs: &["get", "list", "patch", "watch"],
        feature: "ClusterCIDR pools (watched; their finalizer set and released)",
        probe: Probe("list", "networking.x-k8s.io", "clustercidrs", None, None),
        message: "watching ClusterCIDRs failed",
        error: "cannot list resource \"clustercidrs\"",
    },
    Case {
        role: "ClusterRole",
        resource: "clustercidrs/status",
        verbs: &["patch"],
        feature: "ClusterCIDR status (allocated, capacity, waiting)",
        probe: Probe(
            "patch",
            "networking.x-k8s.io",
            "clustercidrs/status",
            None,
            None,
        ),
        message: "could not update a ClusterCIDR's status",
        error: "cannot patch resource \"clustercidrs/status\"",
    },
    Case {
        role: "ClusterRole",
        resource: "podcidrmigrations",
        verbs: &["list", "watch"],
        feature: "PodCIDRMigrations (a running one closes every pool but its destination)",
        probe: Probe("list", "ipam.netcm.io", "podcidrmigrations", None, None),
        message: "cannot read PodCIDRMigrations",
        error: "cannot list resource \"podcidrmigrations\"",
    },
    Case {
        role: "ClusterRole",
        resource: "events",
        verbs: &["create", "patch"],
        feature: "Events on Nodes",
        probe: Probe("create", "events.k8s.io", "events", Some("default"), None),
        message: "failed to record event",
        error: "cannot create resource \"events\"",
    },
    Case {
        role: "Role",
        resource: "leases",
        verbs: &["create"],
        feature: "leader election: creating the Lease",
        probe: Probe("create", COORDINATION, "leases", Some(NAMESPACE), None),
        message: "failed to acquire the lease",
        error: "cannot create resource \"leases\"",
    },
    Case {
        role: "Role",
        resource: "leases",
        verbs: &["get", "list", "update", "watch"],
        feature: "leader election: reading and renewing the Lease",
        probe: Probe(
            "get",
            COORDINATION,
            "leases",
            Some(NAMESPACE),
            Some("netcm"),
        ),
        message: "failed to acquire the lease",
        error: "cannot get resource \"leases\"",
    },
    Case {
        role: "Role",
        resource: "pods",
        verbs: &["get"],
        feature: "finding this replica's Node from POD_NAME",
        probe: Probe("get", "", "pods", Some(NAMESPACE), Some(POD)),
        message: "could not look up this pod's node",
        error: "cannot get resource \"pods\"",
    },
];

/// The case a rendered rule belongs to (by role kind, resource and verbs).
pub(super) fn case_for(role: &str, rule: &Value) -> Option<&'static Case> {
    let strings = |v: &Value| -> Vec<String> {
        let mut s: Vec<String> = serde_json::from_value(v.clone()).unwrap_or_default();
        s.sort();
        s
    };
    let resources = strings(&rule["resources"]);
    let verbs = strings(&rule["verbs"]);
    CASES
        .iter()
        .find(|c| c.role == role && resources == [c.resource] && verbs.iter().eq(c.verbs.iter()))
}
