//! PodCIDRClaims against Nodes: each claim is a block of CIDRs a leader handed out of (or, from earlier
//! versions, one CIDR), and every CIDR a Node holds should lie in a claimed block when netcm claims CIDRs.

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
    let mut blocks: Vec<IpNet> = Vec::with_capacity(claims.len());
    for c in claims {
        match c.cidr.parse::<IpNet>() {
            Ok(cidr) => blocks.push(cidr.trunc()),
            Err(_) => out.push(Finding::warn(
                "claims",
                format!(
                    "PodCIDRClaim {} has an unparsable spec.cidr {:?}",
                    c.name, c.cidr
                ),
                format!(
                    "kubectl delete podcidrclaim {} (netcm never writes such a claim)",
                    c.name
                ),
            )),
        }
    }
    if s.settings.pod_cidr_claims != Some(false) && !blocks.is_empty() {
        for node in &s.nodes {
            for cidr in pod_cidrs(node).0 {
                if !blocks.iter().any(|b| b.contains(&cidr)) {
                    out.push(
                        Finding::warn(
                            "claims",
                            format!("Node {} holds {cidr} outside every PodCIDRClaim (written by another writer, or by netcm with --pod-cidr-claims=false)", name(node)),
                            "no action needed for netcm's safety (it reserves every CIDR it sees); see the allocators check for who wrote it",
                        )
                        .about([name(node)]),
                    );
                }
            }
        }
    }
    if out.is_empty() {
        out.push(Finding::ok(
            "claims",
            format!(
                "{} PodCIDRClaim(s) cover every pod CIDR the Nodes hold",
                claims.len()
            ),
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

    fn claim(cidr: &str) -> ClaimRecord {
        ClaimRecord {
            name: netcm_subnet_allocator::claims::claim_name(&cidr.parse().expect("cidr")),
            cidr: cidr.into(),
        }
    }

    #[test]
    fn nodes_whose_cidrs_lie_in_claimed_blocks_are_fine_and_a_node_in_flight_too() {
        let mut s = snapshot(
            "10.244.0.0/16",
            vec![
                node("a", "192.0.2.1", &["10.244.0.0/24"]),
                node("b", "192.0.2.2", &["10.244.70.0/24"]),
                node("c", "192.0.2.3", &[]),
            ],
        );
        s.claims = ClaimsState::Listed(vec![claim("10.244.0.0/18"), claim("10.244.64.0/18")]);
        let f = check(&s);
        assert_eq!(f.len(), 1, "{f:#?}");
        assert_eq!(f[0].status, Status::Ok);
    }

    #[test]
    fn a_cidr_outside_every_claimed_block_and_an_unparsable_claim_are_warnings() {
        let mut s = snapshot(
            "10.244.0.0/16",
            vec![
                node("a", "192.0.2.1", &["10.244.0.0/24"]),
                node("b", "192.0.2.2", &["10.244.200.0/24"]),
            ],
        );
        s.claims = ClaimsState::Listed(vec![
            claim("10.244.0.0/18"),
            ClaimRecord {
                name: "x".into(),
                cidr: "nonsense".into(),
            },
        ]);
        let f = check(&s);
        assert_eq!(f.len(), 2, "{f:#?}");
        assert!(f.iter().all(|f| f.status == Status::Warn));
        assert!(f.iter().any(|f| f.nodes == ["b"]));
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
