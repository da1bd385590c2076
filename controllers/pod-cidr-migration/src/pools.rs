//! Which pool a Node's pod CIDR came from, read from the pools' ranges: the flag pool's
//! (`--cluster-cidr`, named [`DEFAULT_POOL`]) and each ClusterCIDR object's.
//!
//! The controller reads the pools from the API as any other client could, not from the allocator's
//! memory (controllers talk only through API objects). Pools may share a range — a new per-Node size
//! over the same range is exactly that — so a CIDR inside several ranges goes to the pool whose per-Node
//! size it has; pools alike in both are interchangeable for the migration, and it counts the CIDR as the
//! destination's if the destination is one of them.

use std::collections::BTreeMap;

use ipnet::IpNet;
use kube::api::DynamicObject;
use netcm_ipam::DEFAULT_POOL;

/// One pool's ranges, one per family, and the prefix length of the CIDRs it gives (when fixed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolRanges {
    /// Each family's range with the prefix length of its Node CIDRs, if the pool fixes one.
    pub families: Vec<(IpNet, Option<u8>)>,
}

/// Every pool the controller knows, by name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KnownPools(pub BTreeMap<String, PoolRanges>);

impl KnownPools {
    /// The flag pool from `--cluster-cidr` (its Node CIDR size is the allocator's flag's, not read
    /// here: containment decides), and one pool per ClusterCIDR object that names a range.
    pub fn new(flag_ranges: &[IpNet], objects: &[DynamicObject]) -> KnownPools {
        let mut pools = BTreeMap::new();
        if !flag_ranges.is_empty() {
            pools.insert(
                DEFAULT_POOL.to_string(),
                PoolRanges {
                    families: flag_ranges.iter().map(|r| (*r, None)).collect(),
                },
            );
        }
        for obj in objects {
            let Some(name) = obj.metadata.name.clone() else {
                continue;
            };
            let spec = &obj.data["spec"];
            let host_bits = spec["perNodeHostBits"].as_u64();
            let families: Vec<(IpNet, Option<u8>)> = ["ipv4", "ipv6"]
                .iter()
                .filter_map(|f| spec[*f].as_str())
                .filter_map(|s| s.trim().parse::<IpNet>().ok())
                .map(|net| {
                    let prefix = host_bits
                        .and_then(|b| u8::try_from(b).ok())
                        .and_then(|b| net.max_prefix_len().checked_sub(b));
                    (net.trunc(), prefix)
                })
                .collect();
            if !families.is_empty() {
                pools.insert(name, PoolRanges { families });
            }
        }
        KnownPools(pools)
    }

    /// How many families `pool` gives CIDRs of; `None` for a pool nobody defined.
    pub fn families(&self, pool: &str) -> Option<usize> {
        self.0.get(pool).map(|p| p.families.len())
    }

    /// The pool `cidr` came from, preferring `destination` among pools alike; `None` when no pool's
    /// range holds it (a CIDR someone else wrote).
    pub fn pool_of(&self, cidr: &IpNet, destination: &str) -> Option<String> {
        let holding: Vec<(&String, bool)> = self
            .0
            .iter()
            .filter_map(|(name, p)| {
                let (_, prefix) = p.families.iter().find(|(r, _)| r.contains(cidr))?;
                Some((name, prefix.is_none_or(|len| len == cidr.prefix_len())))
            })
            .collect();
        let best = if holding.iter().any(|(_, sized)| *sized) {
            holding.into_iter().filter(|(_, sized)| *sized).collect()
        } else {
            holding
        };
        best.iter()
            .find(|(name, _)| name.as_str() == destination)
            .or(best.first())
            .map(|(name, _)| (*name).clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::api::ApiResource;
    use serde_json::json;

    fn cluster_cidr(name: &str, spec: serde_json::Value) -> DynamicObject {
        let ar = ApiResource {
            group: "networking.x-k8s.io".into(),
            version: "v1".into(),
            api_version: "networking.x-k8s.io/v1".into(),
            kind: "ClusterCIDR".into(),
            plural: "clustercidrs".into(),
        };
        DynamicObject::new(name, &ar).data(json!({ "spec": spec }))
    }

    fn net(s: &str) -> IpNet {
        s.parse().expect("a CIDR")
    }

    #[test]
    fn a_cidr_belongs_to_the_pool_whose_range_holds_it() {
        let pools = KnownPools::new(
            &[net("10.244.0.0/16")],
            &[cluster_cidr(
                "new",
                json!({"ipv4": "10.96.0.0/12", "ipv6": "fd00::/48", "perNodeHostBits": 8}),
            )],
        );
        assert_eq!(
            pools.pool_of(&net("10.244.3.0/24"), "new").as_deref(),
            Some(DEFAULT_POOL)
        );
        assert_eq!(
            pools.pool_of(&net("10.96.1.0/24"), "new").as_deref(),
            Some("new")
        );
        assert_eq!(pools.pool_of(&net("192.168.0.0/24"), "new"), None);
        assert_eq!(pools.families("new"), Some(2));
        assert_eq!(pools.families(DEFAULT_POOL), Some(1));
        assert_eq!(pools.families("missing"), None);
    }

    #[test]
    fn over_a_shared_range_the_per_node_size_tells_the_pools_apart() {
        let pools = KnownPools::new(
            &[],
            &[
                cluster_cidr("wide", json!({"ipv4": "10.0.0.0/8", "perNodeHostBits": 8})),
                cluster_cidr(
                    "narrow",
                    json!({"ipv4": "10.0.0.0/8", "perNodeHostBits": 6}),
                ),
            ],
        );
        assert_eq!(
            pools.pool_of(&net("10.1.2.0/24"), "narrow").as_deref(),
            Some("wide")
        );
        assert_eq!(
            pools.pool_of(&net("10.1.2.64/26"), "wide").as_deref(),
            Some("narrow")
        );
    }

    #[test]
    fn a_cluster_cidr_with_no_range_that_parses_is_no_pool() {
        let pools = KnownPools::new(&[], &[cluster_cidr("bad", json!({"ipv4": "nonsense"}))]);
        assert_eq!(pools, KnownPools::default());
    }
}
