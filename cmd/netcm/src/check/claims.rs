//! PodCIDRClaims against Nodes: every claim should name a Node that exists, with its UID, and that Node
//! should hold the claimed CIDR (or still be waiting for it: a write in flight); every CIDR a Node holds
//! should be claimed for it when netcm claims CIDRs.

use std::collections::BTreeMap;

use ipnet::IpNet;

use super::report::Finding;
use super::snapshot::{name, pod_cidrs, ClaimsState, Snapshot};

/// Findings about claims, or one ✓/- line.
pub fn check(s: &Snapshot) -> Vec<Finding> {
    let claims = match &s.claims {
        ClaimsState::Listed(c) => c,
        ClaimsState::NotInstalled => {
            return vec![if s.settings.pod_cidr_claims == Some(true)
                && s.settings.allocates == Some(true)
            {
                Finding::fail(
                    "claims",
                    "the leader claims CIDRs but the PodCIDRClaim CRD is not installed: it cannot allocate",
                    "kubectl apply --server-side -f charts/netcm/crds/",
                )
            } else {
                Finding::skip("claims", "the PodCIDRClaim CRD is not installed")
            }]
        }
        ClaimsState::Unreadable(e) => {
            return vec![Finding::skip(
                "claims",
                format!("cannot list PodCIDRClaims: {e}"),
            )]
        }
    };
    let mut out = Vec::new();
    let nodes: BTreeMap<&str, _> = s.nodes.iter().map(|n| (name(n), n)).collect();
    let mut claimed: BTreeMap<IpNet, &str> = BTreeMap::new();
    for c in claims {
        let Ok(cidr) = c.cidr.parse::<IpNet>() else {
            out.push(Finding::warn(
                "claims",
                format!(
                    "PodCIDRClaim {} has an unparsable spec.cidr {:?}",
                    c.name, c.cidr
                ),
                format!(
                    "kubectl delete podcidrclaim {} (netcm never writes such a claim)",
                    c.name
                ),
            ));
            continue;
        };
        let cidr = cidr.trunc();
        claimed.insert(cidr, c.node_name.as_str());
        let Some(node) = nodes.get(c.node_name.as_str()) else {
            out.push(
                Finding::warn(
                    "claims",
                    format!("PodCIDRClaim {} ({cidr}) is for Node {}, which does not exist", c.name, c.node_name),
                    format!("nothing to do if netcm leads (its next leader start deletes it); or kubectl delete podcidrclaim {}", c.name),
                )
                .about([c.node_name.clone()]),
            );
            continue;
        };
        let (held, _) = pod_cidrs(node);
        let uid = node.metadata.uid.as_deref().unwrap_or("");
        if uid != c.node_uid {
            out.push(
                Finding::warn(
                    "claims",
                    format!("PodCIDRClaim {} ({cidr}) is for an earlier Node {} (UID {}, now {uid})", c.name, c.node_name, c.node_uid),
                    format!("nothing to do if netcm leads (its next leader start deletes it); or kubectl delete podcidrclaim {}", c.name),
                )
                .about([c.node_name.clone()]),
            );
        } else if !held.is_empty() && !held.contains(&cidr) {
            out.push(
                Finding::warn(
                    "claims",
                    format!(
                        "PodCIDRClaim {} claims {cidr} for Node {}, which holds {} instead",
                        c.name,
                        c.node_name,
                        held.iter()
                            .map(ToString::to_string)
                            .collect::<Vec<_>>()
                            .join(",")
                    ),
                    format!(
                        "kubectl delete podcidrclaim {} (stale: pod CIDRs cannot change once set)",
                        c.name
                    ),
                )
                .about([c.node_name.clone()]),
            );
        }
    }
    if s.settings.pod_cidr_claims != Some(false) && !claims.is_empty() {
        for node in &s.nodes {
            for cidr in pod_cidrs(node).0 {
                match claimed.get(&cidr) {
                    Some(owner) if *owner == name(node) => {}
                    Some(owner) => out.push(
                        Finding::fail(
                            "claims",
                            format!("Node {} holds {cidr}, but its PodCIDRClaim names Node {owner}", name(node)),
                            format!("someone other than netcm wrote {cidr} on Node {}: see the allocators check; re-create that Node (kubectl delete node {})", name(node), name(node)),
                        )
                        .about([name(node).to_string(), owner.to_string()]),
                    ),
                    None => out.push(
                        Finding::warn(
                            "claims",
                            format!("Node {} holds {cidr} without a PodCIDRClaim (written by another writer, or by netcm with --pod-cidr-claims=false)", name(node)),
                            "no action needed for netcm's safety (it reserves every CIDR it sees); see the allocators check for who wrote it",
                        )
                        .about([name(node)]),
                    ),
                }
            }
        }
    }
    if out.is_empty() {
        out.push(Finding::ok(
            "claims",
            format!("{} PodCIDRClaim(s) agree with the Nodes", claims.len()),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::report::Status;
    use super::super::snapshot::fixtures::*;
    use super::super::snapshot::ClaimRecord;
    use super::*;

    fn claim(cidr: &str, node: &str) -> ClaimRecord {
        ClaimRecord {
            name: netcm_subnet_allocator::claims::claim_name(&cidr.parse().expect("cidr")),
            cidr: cidr.into(),
            node_name: node.into(),
            node_uid: format!("{node}-uid"),
        }
    }

    #[test]
    fn claims_matching_the_nodes_are_fine_and_one_in_flight_too() {
        let mut s = snapshot(
            "10.244.0.0/16",
            vec![
                node("a", "192.0.2.1", &["10.244.0.0/24"]),
                node("b", "192.0.2.2", &[]),
            ],
        );
        s.claims = ClaimsState::Listed(vec![
            claim("10.244.0.0/24", "a"),
            claim("10.244.1.0/24", "b"),
        ]);
        let f = check(&s);
        assert_eq!(f.len(), 1, "{f:#?}");
        assert_eq!(f[0].status, Status::Ok);
    }

    #[test]
    fn a_cidr_claimed_for_another_node_names_both() {
        let mut s = snapshot(
            "10.244.0.0/16",
            vec![
                node("a", "192.0.2.1", &["10.244.0.0/24"]),
                node("b", "192.0.2.2", &["10.244.0.0/24"]),
            ],
        );
        s.claims = ClaimsState::Listed(vec![claim("10.244.0.0/24", "a")]);
        let f = check(&s);
        assert_eq!(f.len(), 1, "{f:#?}");
        assert_eq!(f[0].status, Status::Fail);
        assert_eq!(f[0].nodes, ["b", "a"]);
    }

    #[test]
    fn claims_for_gone_or_recreated_nodes_and_stale_cidrs_are_warnings() {
        let mut recreated = node("r", "192.0.2.3", &["10.244.2.0/24"]);
        recreated.metadata.uid = Some("new-uid".into());
        let mut s = snapshot(
            "10.244.0.0/16",
            vec![node("a", "192.0.2.1", &["10.244.0.0/24"]), recreated],
        );
        s.claims = ClaimsState::Listed(vec![
            claim("10.244.0.0/24", "a"),
            claim("10.244.5.0/24", "a"),
            claim("10.244.2.0/24", "r"),
            claim("10.244.9.0/24", "gone"),
        ]);
        let f = check(&s);
        let warns: Vec<_> = f.iter().filter(|f| f.status == Status::Warn).collect();
        assert_eq!(warns.len(), 3, "{f:#?}");
    }

    #[test]
    fn a_missing_crd_fails_only_when_the_leader_claims_cidrs() {
        let s = snapshot("10.244.0.0/16", vec![]);
        assert_eq!(check(&s)[0].status, Status::Fail);
        let mut s = s;
        s.settings.pod_cidr_claims = Some(false);
        assert_eq!(check(&s)[0].status, Status::Skip);
    }
}
