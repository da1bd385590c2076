//! ClusterCIDR objects (`networking.x-k8s.io/v1`) as the subnet-allocator reads them: the JSON of up to
//! four specs, oldest first, read by `object_pool` into pools beside the flag pool. An active pool's
//! ranges are normalised, its node masks lie between the range's prefix and the family's size within
//! what netcm tracks, its capacity is what the masks give, it shares no address with a service range
//! and a range of another pool only by being the same range; a Node its selector matches gets CIDRs of
//! its families, inside its ranges, of its masks.

use std::collections::BTreeMap;

use ipnet::IpNet;
use kube::core::DynamicObject;
use netcm_ipam::{
    max_node_bits, AllocatorConfig, AllocatorFlags, Family, NodeView, PoolState, Pools,
};
use netcm_subnet_allocator::cluster_cidrs::object_pool;
use serde_json::{json, Value};

fn overlap(a: &IpNet, b: &IpNet) -> bool {
    a.contains(&b.network()) || b.contains(&a.network())
}

/// The checks, on one input as libFuzzer hands it over.
pub fn check(data: &[u8]) {
    let Ok(v) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    let specs = match v {
        Value::Array(a) => a,
        one => vec![one],
    };
    let mut labels = BTreeMap::new();
    let objects: Vec<_> = specs
        .iter()
        .take(4)
        .enumerate()
        .map(|(i, spec)| {
            // A Node that every `In` and `Exists` requirement names, so selectors get to match.
            for term in spec["nodeSelector"]["nodeSelectorTerms"].as_array().into_iter().flatten() {
                for r in term["matchExpressions"].as_array().into_iter().flatten() {
                    if let Some(k) = r["key"].as_str() {
                        let first = r["values"][0].as_str().unwrap_or("");
                        labels.insert(k.to_string(), first.to_string());
                    }
                }
            }
            let obj: DynamicObject = serde_json::from_value(json!({
                "apiVersion": "networking.x-k8s.io/v1", "kind": "ClusterCIDR",
                "metadata": {"name": format!("pool-{i}"), "uid": format!("uid-{i}"), "generation": 1},
                "spec": spec,
            }))
            .expect("a dynamic object");
            object_pool(&obj)
        })
        .collect();
    for o in &objects {
        if let Ok(spec) = &o.spec {
            for net in spec.ipv4.iter().chain(&spec.ipv6) {
                assert_eq!(*net, net.trunc(), "ranges are normalised");
            }
            let _ = spec.selector.summary();
        }
    }
    let config = AllocatorConfig::from_flags(&AllocatorFlags {
        cluster_cidr: "10.0.0.0/16,fd00::/56".into(),
        service_cluster_ip_range: "172.30.0.0/16".into(),
        ..Default::default()
    })
    .expect("the flag pool");
    let mut pools = Pools::new(&config).expect("pools");
    pools.sync_objects(&objects);
    let reports = pools.reports();
    let active: Vec<_> = reports
        .iter()
        .filter(|r| r.state == PoolState::Active)
        .collect();
    for r in &active {
        assert_eq!(r.ranges.len(), r.node_masks.len());
        let mut families = Vec::new();
        let mut capacity = u64::MAX;
        for (net, &mask) in r.ranges.iter().zip(&r.node_masks) {
            let family = Family::of(net);
            families.push(family);
            assert_eq!(*net, net.trunc());
            assert!(
                net.prefix_len() <= mask && mask <= family.bits(),
                "{net} /{mask}"
            );
            assert!(
                mask - net.prefix_len() <= max_node_bits(family),
                "{net} /{mask}"
            );
            for s in config.service_ranges.iter() {
                assert!(!overlap(net, s), "{net} overlaps the service range {s}");
            }
            for other in active.iter().filter(|o| o.name != r.name) {
                for o in &other.ranges {
                    assert!(
                        net == o || !overlap(net, o),
                        "{net} of {} and {o} of {}",
                        r.name,
                        other.name
                    );
                }
            }
            capacity = capacity.min(1u64 << (mask - net.prefix_len()));
        }
        if r.is_object {
            assert!(
                families.windows(2).all(|w| w[0] < w[1]),
                "one range per family, IPv4 first"
            );
            assert_eq!(r.capacity, capacity, "{}", r.name);
            assert_eq!(pools.pool_families(&r.name), families);
        }
    }
    let view = NodeView {
        name: "node",
        labels: &labels,
        provider_id: None,
    };
    if let Ok(got) = pools.allocate_for("node", &view) {
        let pool = reports
            .iter()
            .find(|r| r.name == got.pool)
            .expect("a known pool");
        assert_eq!(pool.state, PoolState::Active);
        assert_eq!(pools.pool_families(&got.pool).len(), got.cidrs.len());
        for cidr in &got.cidrs {
            let inside = pool
                .ranges
                .iter()
                .zip(&pool.node_masks)
                .any(|(net, &mask)| net.contains(cidr) && cidr.prefix_len() == mask);
            assert!(
                inside,
                "{cidr} is not a node CIDR of pool {}: {pool:?}",
                got.pool
            );
        }
        // Pools with the same range and mask cannot be told apart by a CIDR: any of them may be named.
        let named = pools
            .pool_of_cidrs(&got.cidrs)
            .expect("the pool of an allocation");
        let named = reports
            .iter()
            .find(|r| r.name == named)
            .expect("a known pool");
        let first = got.cidrs[0];
        assert!(named
            .ranges
            .iter()
            .zip(&named.node_masks)
            .any(|(net, &mask)| net.contains(&first) && first.prefix_len() == mask));
    }
}
