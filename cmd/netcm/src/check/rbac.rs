//! The RBAC netcm needs: one SelfSubjectAccessReview per verb of each rule of the chart's ClusterRole and
//! Role, asked as netcm's ServiceAccount (run as it, or `--as`). The table below is the chart's rules;
//! a unit test keeps the two equal.

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

#[cfg(test)]
mod tests {
    use super::super::snapshot::fixtures::*;
    use super::*;
    use std::collections::BTreeSet;

    /// (role, group, resource, verb) of every rule in the chart's templates, read from their YAML lines
    /// (the rules are plain flow sequences; template directives around them only switch them on and off).
    fn chart_rules() -> BTreeSet<(String, String, String, String)> {
        let root =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../charts/netcm/templates");
        let mut out = BTreeSet::new();
        for (file, role) in [("clusterrole.yaml", "ClusterRole"), ("role.yaml", "Role")] {
            let text = std::fs::read_to_string(root.join(file)).expect("chart template");
            // Only the first document: the metrics-reader ClusterRole is for scrapers, not netcm.
            let first = text.split("\n---").next().unwrap_or_default();
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
            let (mut groups, mut resources) = (Vec::new(), Vec::new());
            for line in first.lines() {
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
        }
        out
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
