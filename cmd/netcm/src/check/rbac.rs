//! The RBAC netcm needs: one SelfSubjectAccessReview per verb of each rule of the chart's ClusterRole and
//! Role, asked as netcm's ServiceAccount (run as it, or `--as`). The table below is the chart's rules;
//! a unit test keeps the two equal.
//!
//! With `--daemonset-as`, the route DaemonSet's account too, by SubjectAccessReview (it is not the user
//! running the check): both that it may do what node mode needs ([`DAEMONSET_RULES`], the chart's
//! daemonset-rbac.yaml) and that it may do none of the controller's writes ([`DAEMONSET_FORBIDDEN`]).
//! Root on any Node reads that account's token, so a DaemonSet running as the controller's account, or
//! one given its rights, is a failure, not a warning.

use super::report::{Finding, Status};
use super::snapshot::Settings;

/// When a rule is needed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Needed {
    /// Always.
    Always,
    /// With the allocator.
    Allocator,
    /// With the allocator watching ClusterCIDR objects.
    ClusterCidrs,
    /// With the allocator or the node-annotation-syncer.
    NodeWriters,
    /// With the route controller (NetworkUnavailable).
    Routes,
    /// With the allocator's release hold, recorded on PodCIDRClaims; optional, as the flag's default is
    /// off (without it a hold lives in one leader's memory).
    ReleaseHold,
    /// With `--secure-port` (the chart's default).
    SecureMetrics,
    /// With the pod-cidr-migration controller (off by default).
    Migration,
}

/// One rule of the chart's RBAC.
#[derive(Debug, Clone, Copy)]
pub struct Rule {
    /// `ClusterRole` or `Role` (in the Lease's namespace).
    pub role: &'static str,
    /// API group ("" for core).
    pub group: &'static str,
    /// Resource (with subresource as `nodes/status`).
    pub resource: &'static str,
    /// Verbs.
    pub verbs: &'static [&'static str],
    /// Whether the rule names one object: the Lease.
    pub lease_only: bool,
    /// When it is needed.
    pub needed: Needed,
    /// What for.
    pub feature: &'static str,
}

/// The chart's rules (charts/netcm/templates/clusterrole.yaml and role.yaml).
pub const RULES: &[Rule] = &[
    Rule {
        role: "ClusterRole",
        group: "",
        resource: "nodes",
        verbs: &["get", "list", "watch"],
        lease_only: false,
        needed: Needed::Always,
        feature: "the Node informer",
    },
    Rule {
        role: "ClusterRole",
        group: "",
        resource: "nodes",
        verbs: &["patch"],
        lease_only: false,
        needed: Needed::NodeWriters,
        feature: "writing pod CIDRs and lease annotations",
    },
    Rule {
        role: "ClusterRole",
        group: "ipam.netcm.io",
        resource: "podcidrclaims",
        verbs: &["create", "list"],
        lease_only: false,
        needed: Needed::Allocator,
        feature: "PodCIDRClaims",
    },
    Rule {
        role: "ClusterRole",
        group: "ipam.netcm.io",
        resource: "podcidrclaims",
        verbs: &["patch"],
        lease_only: false,
        needed: Needed::ReleaseHold,
        feature: "release holds recorded on PodCIDRClaims (--cidr-release-hold)",
    },
    Rule {
        role: "ClusterRole",
        group: "networking.x-k8s.io",
        resource: "clustercidrs",
        verbs: &["get", "list", "patch", "watch"],
        lease_only: false,
        needed: Needed::ClusterCidrs,
        feature: "ClusterCIDR pools",
    },
    Rule {
        role: "ClusterRole",
        group: "networking.x-k8s.io",
        resource: "clustercidrs/status",
        verbs: &["patch"],
        lease_only: false,
        needed: Needed::ClusterCidrs,
        feature: "ClusterCIDR status",
    },
    Rule {
        role: "ClusterRole",
        group: "ipam.netcm.io",
        resource: "podcidrmigrations",
        verbs: &["list", "watch"],
        lease_only: false,
        needed: Needed::ClusterCidrs,
        feature: "PodCIDRMigrations (a running one closes every pool but its destination)",
    },
    Rule {
        role: "ClusterRole",
        group: "ipam.netcm.io",
        resource: "podcidrmigrations",
        verbs: &["patch"],
        lease_only: false,
        needed: Needed::Migration,
        feature: "pod-cidr-migration: a migration's finalizer",
    },
    Rule {
        role: "ClusterRole",
        group: "ipam.netcm.io",
        resource: "podcidrmigrations/status",
        verbs: &["patch"],
        lease_only: false,
        needed: Needed::Migration,
        feature: "pod-cidr-migration: a migration's progress",
    },
    Rule {
        role: "ClusterRole",
        group: "",
        resource: "nodes",
        verbs: &["delete"],
        lease_only: false,
        needed: Needed::Migration,
        feature: "pod-cidr-migration: deleting a drained Node",
    },
    Rule {
        role: "ClusterRole",
        group: "",
        resource: "pods",
        verbs: &["list"],
        lease_only: false,
        needed: Needed::Migration,
        feature: "pod-cidr-migration: the pods a drain evicts",
    },
    Rule {
        role: "ClusterRole",
        group: "",
        resource: "pods/eviction",
        verbs: &["create"],
        lease_only: false,
        needed: Needed::Migration,
        feature: "pod-cidr-migration: evictions",
    },
    Rule {
        role: "ClusterRole",
        group: "",
        resource: "nodes/status",
        verbs: &["patch"],
        lease_only: false,
        needed: Needed::Routes,
        feature: "the NetworkUnavailable condition",
    },
    Rule {
        role: "ClusterRole",
        group: "events.k8s.io",
        resource: "events",
        verbs: &["create", "patch"],
        lease_only: false,
        needed: Needed::Always,
        feature: "Events on Nodes",
    },
    Rule {
        role: "ClusterRole",
        group: "authentication.k8s.io",
        resource: "tokenreviews",
        verbs: &["create"],
        lease_only: false,
        needed: Needed::SecureMetrics,
        feature: "secure metrics (TokenReview)",
    },
    Rule {
        role: "ClusterRole",
        group: "authorization.k8s.io",
        resource: "subjectaccessreviews",
        verbs: &["create"],
        lease_only: false,
        needed: Needed::SecureMetrics,
        feature: "secure metrics (SubjectAccessReview)",
    },
    Rule {
        role: "Role",
        group: "coordination.k8s.io",
        resource: "leases",
        verbs: &["create"],
        lease_only: false,
        needed: Needed::Always,
        feature: "creating the Lease",
    },
    Rule {
        role: "Role",
        group: "coordination.k8s.io",
        resource: "leases",
        verbs: &["get", "list", "watch", "update"],
        lease_only: true,
        needed: Needed::Always,
        feature: "holding the Lease",
    },
    Rule {
        role: "Role",
        group: "",
        resource: "pods",
        verbs: &["get"],
        lease_only: false,
        needed: Needed::Always,
        feature: "finding its Node from POD_NAME",
    },
];

/// One access review to ask.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// Verb.
    pub verb: &'static str,
    /// API group.
    pub group: &'static str,
    /// Resource.
    pub resource: &'static str,
    /// Subresource.
    pub subresource: &'static str,
    /// Namespace (Role rules).
    pub namespace: Option<String>,
    /// Object name (the Lease).
    pub name: Option<String>,
    /// Which role the chart puts it in.
    pub role: &'static str,
    /// What for.
    pub feature: &'static str,
    /// Missing it is a warning only (features the chart can turn off).
    pub optional: bool,
}

impl Request {
    /// `verb resource[/sub] [name] [-n ns]` as kubectl auth can-i takes it.
    pub fn can_i(&self) -> String {
        let mut r = self.resource.to_string();
        if !self.group.is_empty() {
            r = format!("{r}.{}", self.group);
        }
        if !self.subresource.is_empty() {
            r = format!("{r}/{}", self.subresource);
        }
        if let Some(n) = &self.name {
            r = format!("{r}/{n}");
        }
        match &self.namespace {
            Some(ns) => format!("{} {r} -n {ns}", self.verb),
            None => format!("{} {r}", self.verb),
        }
    }
}

/// The requests to review for the settings (unknown settings: everything the chart's defaults need).
pub fn requests(settings: &Settings, lease_namespace: &str, lease_name: &str) -> Vec<Request> {
    let mut out = Vec::new();
    for rule in RULES {
        let (applies, optional) = match rule.needed {
            Needed::Always => (true, false),
            Needed::Allocator => (
                settings.allocates != Some(false) && settings.pod_cidr_claims != Some(false),
                false,
            ),
            Needed::ClusterCidrs => (
                settings.allocates != Some(false) && settings.cluster_cidr_objects != Some(false),
                false,
            ),
            Needed::NodeWriters => (
                settings.allocates != Some(false) || settings.syncs_subnet_leases != Some(false),
                false,
            ),
            Needed::Routes => (settings.routes == Some(true), false),
            Needed::ReleaseHold => (
                settings.allocates != Some(false) && settings.pod_cidr_claims != Some(false),
                true,
            ),
            Needed::SecureMetrics => (true, true),
            Needed::Migration => (settings.migrates == Some(true), false),
        };
        if !applies {
            continue;
        }
        let (resource, subresource) = rule.resource.split_once('/').unwrap_or((rule.resource, ""));
        for verb in rule.verbs {
            out.push(Request {
                verb,
                group: rule.group,
                resource,
                subresource,
                namespace: (rule.role == "Role").then(|| lease_namespace.to_string()),
                name: rule.lease_only.then(|| lease_name.to_string()),
                role: rule.role,
                feature: rule.feature,
                optional,
            });
        }
    }
    out
}

/// Who the reviews were asked for, and how.
#[derive(Debug, Clone)]
pub enum Subject {
    /// Asked (as the user, or impersonating it).
    Reviewed(String),
    /// Not asked, and why (with the command that would ask).
    NotReviewed(String),
}

/// Findings from the reviews' answers (`Ok(allowed)` or the error asking).
pub fn check(
    subject: &Subject,
    answers: &[(Request, Result<bool, String>)],
    release_namespace: &str,
) -> Vec<Finding> {
    let who = match subject {
        Subject::NotReviewed(why) => return vec![Finding::skip("rbac", why.clone())],
        Subject::Reviewed(who) => who,
    };
    let mut out = Vec::new();
    for (req, answer) in answers {
        match answer {
            Ok(true) => {}
            Ok(false) => {
                let f = format!(
                    "{who} may not {} (needed for {}; the chart's {} has it)",
                    req.can_i(),
                    req.feature,
                    req.role
                );
                let fix = format!(
                    "give {who} the chart's {}: helm upgrade netcm charts/netcm -n {release_namespace} --reuse-values (or add verb {:?} on {:?} to the {} bound to it); verify: kubectl auth can-i {} --as={who}",
                    req.role, req.verb, req.resource, req.role, req.can_i()
                );
                out.push(if req.optional {
                    Finding::warn("rbac", format!("{f}; only needed with --secure-port"), fix)
                } else {
                    Finding::fail("rbac", f, fix)
                });
            }
            Err(e) => out.push(Finding::warn(
                "rbac",
                format!("could not review {} for {who}: {e}", req.can_i()),
                "run netcm check as a user who may create selfsubjectaccessreviews (and impersonate, with --as)",
            )),
        }
    }
    if out.iter().all(|f| f.status != Status::Fail) && out.iter().all(|f| f.status != Status::Warn)
    {
        out.push(Finding::ok(
            "rbac",
            format!("{who} may make all {} requests netcm needs", answers.len()),
        ));
    }
    out
}

/// The check name of the DaemonSet's findings.
const DAEMONSET_CHECK: &str = "rbac";

/// One rule of the route DaemonSet's RBAC (charts/netcm/templates/daemonset-rbac.yaml).
#[derive(Debug, Clone, Copy)]
pub struct DaemonSetRule {
    /// `ClusterRole`, or `Role` in `namespace`.
    pub role: &'static str,
    /// API group ("" for core).
    pub group: &'static str,
    /// Resource (with subresource as `nodes/status`).
    pub resource: &'static str,
    /// Verbs.
    pub verbs: &'static [&'static str],
    /// The Role's namespace.
    pub namespace: Option<&'static str>,
    /// Missing it is a warning only (`--set-node-network-unavailable=false` needs no nodes/status).
    pub optional: bool,
    /// What for.
    pub feature: &'static str,
}

/// What `netcm --route-mode=node --leader-elect=false --controllers=route-controller` asks the API for.
pub const DAEMONSET_RULES: &[DaemonSetRule] = &[
    DaemonSetRule {
        role: "ClusterRole",
        group: "",
        resource: "nodes",
        verbs: &["list", "watch"],
        namespace: None,
        optional: false,
        feature: "the Node informer (its peers' pod CIDRs and gateways)",
    },
    DaemonSetRule {
        role: "ClusterRole",
        group: "networking.x-k8s.io",
        resource: "clustercidrs",
        verbs: &["list", "watch"],
        namespace: None,
        optional: true,
        feature:
            "the ClusterCIDR pools' ranges, routed like --cluster-cidr's (--cluster-cidr-objects)",
    },
    DaemonSetRule {
        role: "ClusterRole",
        group: "",
        resource: "nodes/status",
        verbs: &["patch"],
        namespace: None,
        optional: true,
        feature: "its own Node's NetworkUnavailable condition",
    },
    DaemonSetRule {
        role: "Role",
        group: "events.k8s.io",
        resource: "events",
        verbs: &["create", "patch"],
        namespace: Some("default"),
        optional: false,
        feature: "FailedToCreateRoute Events on peer Nodes (namespace default)",
    },
];

/// A write of the controller's that the DaemonSet's account must not have.
#[derive(Debug, Clone, Copy)]
pub struct Forbidden {
    /// Verb.
    pub verb: &'static str,
    /// API group.
    pub group: &'static str,
    /// Resource (with subresource as `clustercidrs/status`).
    pub resource: &'static str,
    /// Asked about netcm's Lease (in its namespace, by name).
    pub lease: bool,
    /// What root on any Node could do with it.
    pub harm: &'static str,
}

/// The controller's writes, each a way for a Node's root to corrupt allocation or leadership.
pub const DAEMONSET_FORBIDDEN: &[Forbidden] = &[
    Forbidden {
        verb: "patch",
        group: "",
        resource: "nodes",
        lease: false,
        harm: "write a used pod CIDR or a forged lease annotation into another Node",
    },
    Forbidden {
        verb: "update",
        group: "",
        resource: "nodes",
        lease: false,
        harm: "rewrite another Node's pod CIDRs and annotations",
    },
    Forbidden {
        verb: "create",
        group: "ipam.netcm.io",
        resource: "podcidrclaims",
        lease: false,
        harm: "claim blocks of pod CIDRs",
    },
    Forbidden {
        verb: "patch",
        group: "ipam.netcm.io",
        resource: "podcidrclaims",
        lease: false,
        harm: "forge release holds and idle marks on PodCIDRClaims",
    },
    Forbidden {
        verb: "patch",
        group: "networking.x-k8s.io",
        resource: "clustercidrs",
        lease: false,
        harm: "change ClusterCIDR pools and their finalizers",
    },
    Forbidden {
        verb: "patch",
        group: "networking.x-k8s.io",
        resource: "clustercidrs/status",
        lease: false,
        harm: "forge ClusterCIDR status",
    },
    Forbidden {
        verb: "delete",
        group: "",
        resource: "nodes",
        lease: false,
        harm: "delete any Node",
    },
    Forbidden {
        verb: "create",
        group: "",
        resource: "pods/eviction",
        lease: false,
        harm: "evict any pod",
    },
    Forbidden {
        verb: "patch",
        group: "ipam.netcm.io",
        resource: "podcidrmigrations",
        lease: false,
        harm: "change a PodCIDRMigration's destination or finalizer",
    },
    Forbidden {
        verb: "create",
        group: "ipam.netcm.io",
        resource: "podcidrmigrations",
        lease: false,
        harm: "start a PodCIDRMigration, which drains and deletes Nodes",
    },
    Forbidden {
        verb: "patch",
        group: "ipam.netcm.io",
        resource: "podcidrmigrations/status",
        lease: false,
        harm: "forge a migration's progress, which the controller acts on (cordon, evict, delete Nodes)",
    },
    Forbidden {
        verb: "create",
        group: "coordination.k8s.io",
        resource: "leases",
        lease: true,
        harm: "create netcm's Lease and hold it so no allocator leads",
    },
    Forbidden {
        verb: "update",
        group: "coordination.k8s.io",
        resource: "leases",
        lease: true,
        harm: "take netcm's Lease and hold it so no allocator leads",
    },
];

/// What the DaemonSet's account is asked, and which answer is right.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DaemonSetReview {
    /// The access asked about (`role`: where the chart grants it, or "none" for a forbidden write).
    pub request: Request,
    /// `true`: the account must have it; `false`: it must not.
    pub needed: bool,
    /// For a forbidden write: what it would let a Node's root do.
    pub harm: &'static str,
}

/// The reviews of the DaemonSet's account: its own rules, then the controller's writes.
pub fn daemonset_requests(lease_namespace: &str, lease_name: &str) -> Vec<DaemonSetReview> {
    let split = |r: &'static str| r.split_once('/').unwrap_or((r, ""));
    let mut out = Vec::new();
    for rule in DAEMONSET_RULES {
        let (resource, subresource) = split(rule.resource);
        for verb in rule.verbs {
            out.push(DaemonSetReview {
                request: Request {
                    verb,
                    group: rule.group,
                    resource,
                    subresource,
                    namespace: rule.namespace.map(str::to_string),
                    name: None,
                    role: rule.role,
                    feature: rule.feature,
                    optional: rule.optional,
                },
                needed: true,
                harm: "",
            });
        }
    }
    for f in DAEMONSET_FORBIDDEN {
        let (resource, subresource) = split(f.resource);
        // The create of a Lease cannot name it (RBAC has no name on create); the update is asked by name.
        let name = (f.lease && f.verb != "create").then(|| lease_name.to_string());
        out.push(DaemonSetReview {
            request: Request {
                verb: f.verb,
                group: f.group,
                resource,
                subresource,
                namespace: f.lease.then(|| lease_namespace.to_string()),
                name,
                role: "none",
                feature: f.harm,
                optional: false,
            },
            needed: false,
            harm: f.harm,
        });
    }
    out
}

/// Findings from the answers about the DaemonSet's account `who` (`Ok(allowed)` or the error asking).
pub fn check_daemonset(
    who: &str,
    answers: &[(DaemonSetReview, Result<bool, String>)],
    release_namespace: &str,
) -> Vec<Finding> {
    let mut out = Vec::new();
    let verify = format!("kubectl auth can-i --list --as={who}");
    for (review, answer) in answers {
        let req = &review.request;
        match (answer, review.needed) {
            (Ok(true), true) | (Ok(false), false) => {}
            (Ok(false), true) => {
                let f = format!(
                    "the route DaemonSet's account {who} may not {} (needed for {}; the chart's daemonset-rbac.yaml {} has it)",
                    req.can_i(),
                    req.feature,
                    req.role
                );
                let fix = format!(
                    "helm upgrade netcm charts/netcm -n {release_namespace} --reuse-values (or add verb {:?} on {:?} to the {} bound to {who}); verify: kubectl auth can-i {} --as={who}",
                    req.verb, req.resource, req.role, req.can_i()
                );
                out.push(if req.optional {
                    Finding::warn(
                        DAEMONSET_CHECK,
                        format!("{f}; only needed with --set-node-network-unavailable"),
                        fix,
                    )
                } else {
                    Finding::fail(DAEMONSET_CHECK, f, fix)
                });
            }
            (Ok(true), false) => out.push(Finding::fail(
                DAEMONSET_CHECK,
                format!(
                    "the route DaemonSet's account {who} may {}: its token is readable by root on every Node, who could {}",
                    req.can_i(),
                    review.harm
                ),
                format!(
                    "run the DaemonSet as a ServiceAccount of its own with only the chart's daemonset-rbac.yaml rights (never the controller's): helm upgrade netcm charts/netcm -n {release_namespace} --reuse-values, and remove any other binding of {who}; verify: {verify}"
                ),
            )),
            (Err(e), _) => {
                out.push(Finding::warn(
                    DAEMONSET_CHECK,
                    format!("could not review the route DaemonSet's account {who}: {e}"),
                    format!("run netcm check as a user who may create subjectaccessreviews, or ask yourself: {verify}"),
                ));
                // Every other review would fail the same way: one line says it.
                break;
            }
        }
    }
    if out.is_empty() {
        let (needed, forbidden) = answers.iter().partition::<Vec<_>, _>(|(r, _)| r.needed);
        out.push(Finding::ok(
            DAEMONSET_CHECK,
            format!(
                "the route DaemonSet's account {who} may make the {} requests node mode needs and none of the controller's {} writes",
                needed.len(),
                forbidden.len()
            ),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::snapshot::fixtures::*;
    use super::*;
    use std::collections::BTreeSet;

    /// (role, group, resource, verb) of every rule in one YAML document of a chart template, read from
    /// its lines (the rules are plain flow sequences; template directives around them only switch them
    /// on and off).
    fn document_rules(role: &str, document: &str) -> BTreeSet<(String, String, String, String)> {
        let list = |line: &str, key: &str| -> Option<Vec<String>> {
            let rest = line
                .trim()
                .trim_start_matches("- ")
                .strip_prefix(key)?
                .trim();
            let inner = rest.strip_prefix('[')?.strip_suffix(']')?;
            Some(
                inner
                    .split(',')
                    .map(|s| s.trim().trim_matches('"').to_string())
                    .collect(),
            )
        };
        let mut out = BTreeSet::new();
        let (mut groups, mut resources) = (Vec::new(), Vec::new());
        for line in document.lines() {
            if let Some(g) = list(line, "apiGroups:") {
                groups = g;
            } else if let Some(r) = list(line, "resources:") {
                resources = r;
            } else if let Some(verbs) = list(line, "verbs:") {
                for g in &groups {
                    for r in &resources {
                        for v in &verbs {
                            out.insert((role.to_string(), g.clone(), r.clone(), v.clone()));
                        }
                    }
                }
            }
        }
        out
    }

    fn template(file: &str) -> String {
        let root =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../charts/netcm/templates");
        std::fs::read_to_string(root.join(file)).expect("chart template")
    }

    /// The rules of the chart's ClusterRole and Role for the controller.
    fn chart_rules() -> BTreeSet<(String, String, String, String)> {
        let mut out = BTreeSet::new();
        for (file, role) in [("clusterrole.yaml", "ClusterRole"), ("role.yaml", "Role")] {
            let text = template(file);
            // Only the first document: the metrics-reader ClusterRole is for scrapers, not netcm.
            let first = text.split("\n---").next().unwrap_or_default();
            out.extend(document_rules(role, first));
        }
        out
    }

    /// The rules of the DaemonSet's ClusterRole and Role (daemonset-rbac.yaml; the bindings have none).
    fn chart_daemonset_rules() -> BTreeSet<(String, String, String, String)> {
        let mut out = BTreeSet::new();
        for document in template("daemonset-rbac.yaml").split("\n---") {
            let kind = document
                .lines()
                .find_map(|l| l.strip_prefix("kind: "))
                .unwrap_or_default();
            if kind == "ClusterRole" || kind == "Role" {
                out.extend(document_rules(kind, document));
            }
        }
        out
    }

    fn daemonset_rule_set() -> BTreeSet<(String, String, String, String)> {
        DAEMONSET_RULES
            .iter()
            .flat_map(|r| {
                r.verbs.iter().map(|v| {
                    (
                        r.role.to_string(),
                        r.group.to_string(),
                        r.resource.to_string(),
                        v.to_string(),
                    )
                })
            })
            .collect()
    }

    #[test]
    fn the_daemonsets_rules_checked_are_exactly_the_charts_and_none_is_forbidden() {
        assert_eq!(daemonset_rule_set(), chart_daemonset_rules());
        for (_, group, resource, verb) in daemonset_rule_set() {
            assert!(
                !DAEMONSET_FORBIDDEN
                    .iter()
                    .any(|f| f.group == group && f.resource == resource && f.verb == verb),
                "{verb} {resource} is both needed and forbidden"
            );
        }
        // The Events Role is in namespace default, where Events about Nodes go.
        assert!(template("daemonset-rbac.yaml").contains("  namespace: default\n"));
    }

    #[test]
    fn every_write_of_the_controllers_but_events_is_forbidden_to_the_daemonset() {
        let writes = ["create", "patch", "update", "delete"];
        for (_, group, resource, verb) in chart_rules() {
            if !writes.contains(&verb.as_str()) {
                continue;
            }
            let daemonsets = daemonset_rule_set()
                .into_iter()
                .any(|(_, g, r, v)| (g, r, v) == (group.clone(), resource.clone(), verb.clone()));
            let forbidden = DAEMONSET_FORBIDDEN
                .iter()
                .any(|f| f.group == group && f.resource == resource && f.verb == verb);
            // Reviews (TokenReview, SubjectAccessReview) write nothing; the rest is the DaemonSet's own or
            // forbidden to it.
            assert!(
                daemonsets || forbidden || resource.ends_with("reviews"),
                "the controller's {verb} {group}/{resource} is neither the DaemonSet's nor forbidden to it"
            );
        }
    }

    fn daemonset_answers(
        allowed: impl Fn(&DaemonSetReview) -> bool,
    ) -> Vec<(DaemonSetReview, Result<bool, String>)> {
        daemonset_requests("kube-system", "netcm")
            .into_iter()
            .map(|r| {
                let a = allowed(&r);
                (r, Ok(a))
            })
            .collect()
    }

    #[test]
    fn a_daemonset_with_exactly_its_own_rights_is_one_line() {
        let f = check_daemonset(
            "system:serviceaccount:kube-system:netcm-node",
            &daemonset_answers(|r| r.needed),
            "kube-system",
        );
        assert_eq!(f.len(), 1, "{f:#?}");
        assert_eq!(f[0].status, Status::Ok);
        assert!(
            f[0].message.contains("none of the controller's 13 writes"),
            "{}",
            f[0].message
        );
    }

    #[test]
    fn a_daemonset_running_as_the_controllers_account_fails_on_every_write_of_the_controllers() {
        // The controller's account may do everything asked: the DaemonSet holds all of it.
        let who = "system:serviceaccount:kube-system:netcm";
        let f = check_daemonset(who, &daemonset_answers(|_| true), "kube-system");
        assert_eq!(f.len(), DAEMONSET_FORBIDDEN.len(), "{f:#?}");
        assert!(f.iter().all(|f| f.status == Status::Fail));
        assert!(
            f[0].message
                .contains("may patch nodes: its token is readable by root on every Node"),
            "{}",
            f[0].message
        );
        assert!(f.iter().any(|f| f
            .message
            .contains("may update leases.coordination.k8s.io/netcm -n kube-system")));
        assert!(f[0]
            .fix
            .as_deref()
            .unwrap_or_default()
            .contains(&format!("kubectl auth can-i --list --as={who}")));
    }

    #[test]
    fn a_daemonset_missing_a_right_fails_and_without_node_status_only_warns() {
        let f = check_daemonset(
            "sa",
            &daemonset_answers(|r| r.needed && r.request.resource != "events"),
            "kube-system",
        );
        assert_eq!(f.len(), 2, "{f:#?}");
        assert!(f.iter().all(|f| f.status == Status::Fail));
        assert!(
            f[0].message
                .contains("may not create events.events.k8s.io -n default"),
            "{}",
            f[0].message
        );
        let f = check_daemonset(
            "sa",
            &daemonset_answers(|r| r.needed && r.request.subresource != "status"),
            "kube-system",
        );
        assert_eq!(f.len(), 1, "{f:#?}");
        assert_eq!(f[0].status, Status::Warn);
    }

    #[test]
    fn a_daemonset_review_that_cannot_be_asked_is_one_warning() {
        let answers: Vec<_> = daemonset_requests("kube-system", "netcm")
            .into_iter()
            .map(|r| {
                (
                    r,
                    Err("subjectaccessreviews is forbidden (403 Forbidden)".to_string()),
                )
            })
            .collect();
        let f = check_daemonset("sa", &answers, "kube-system");
        assert_eq!(f.len(), 1, "{f:#?}");
        assert_eq!(f[0].status, Status::Warn);
    }

    #[test]
    fn the_rules_checked_are_exactly_the_charts_rules() {
        let ours: BTreeSet<_> = RULES
            .iter()
            .flat_map(|r| {
                r.verbs.iter().map(|v| {
                    (
                        r.role.to_string(),
                        r.group.to_string(),
                        r.resource.to_string(),
                        v.to_string(),
                    )
                })
            })
            .collect();
        assert_eq!(ours, chart_rules());
    }

    #[test]
    fn the_lease_rules_name_the_lease_in_its_namespace_and_routes_only_count_when_on() {
        let s = snapshot("10.244.0.0/16", vec![]);
        let reqs = requests(&s.settings, "kube-system", "netcm");
        let get_lease = reqs
            .iter()
            .find(|r| r.resource == "leases" && r.verb == "get")
            .expect("get lease");
        assert_eq!(
            get_lease.can_i(),
            "get leases.coordination.k8s.io/netcm -n kube-system"
        );
        assert!(!reqs
            .iter()
            .any(|r| r.resource == "nodes" && r.subresource == "status"));
        let mut routes = s.settings.clone();
        routes.routes = Some(true);
        assert!(requests(&routes, "kube-system", "netcm")
            .iter()
            .any(|r| r.can_i() == "patch nodes/status"));
    }

    #[test]
    fn a_denied_verb_fails_naming_it_the_feature_and_the_fix() {
        let s = snapshot("10.244.0.0/16", vec![]);
        let reqs = requests(&s.settings, "kube-system", "netcm");
        let answers: Vec<_> = reqs
            .into_iter()
            .map(|r| {
                let ok = !(r.resource == "nodes" && r.verb == "patch");
                (r, Ok(ok))
            })
            .collect();
        let f = check(
            &Subject::Reviewed("system:serviceaccount:kube-system:netcm".into()),
            &answers,
            "kube-system",
        );
        assert_eq!(f.len(), 1, "{f:#?}");
        assert_eq!(f[0].status, Status::Fail);
        assert!(
            f[0].message.contains("may not patch nodes"),
            "{}",
            f[0].message
        );
        assert!(f[0].fix.as_deref().unwrap_or_default().contains(
            "kubectl auth can-i patch nodes --as=system:serviceaccount:kube-system:netcm"
        ));
    }

    #[test]
    fn all_allowed_is_one_line() {
        let s = snapshot("10.244.0.0/16", vec![]);
        let answers: Vec<_> = requests(&s.settings, "kube-system", "netcm")
            .into_iter()
            .map(|r| (r, Ok(true)))
            .collect();
        let f = check(&Subject::Reviewed("sa".into()), &answers, "kube-system");
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].status, Status::Ok);
    }
}
