//! The effective-configuration annotation on the leader's Lease (`netcm.io/effective-configuration`),
//! as `netcm check` reads it: whatever the annotation holds, a configuration read from it writes back
//! to JSON that reads as itself, `flag` never answers empty, and the values `netcm check` builds its
//! settings from (`--cluster-cidr` and the masks, the lease-annotation flags) are read as the
//! controllers read their own flags: an accepted allocator configuration keeps its masks in bounds.

use std::collections::BTreeMap;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use netcm_ipam::{AllocatorConfig, AllocatorFlags};
use netcm_manager::published::{EffectiveConfiguration, ANNOTATION};

/// The checks, on one input as libFuzzer hands it over.
pub fn check(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let lease = Lease {
        metadata: ObjectMeta {
            annotations: Some(BTreeMap::from([(ANNOTATION.to_string(), text.to_string())])),
            ..Default::default()
        },
        spec: None,
    };
    let Some(config) = EffectiveConfiguration::from_lease(&lease) else {
        return;
    };
    let written = serde_json::to_string(&config).expect("the configuration writes as JSON");
    let again: EffectiveConfiguration = serde_json::from_str(&written).expect("reads back");
    assert_eq!(again, config);
    for (name, value) in &config.flags {
        assert_eq!(
            config.flag(name),
            (!value.is_empty()).then_some(value.as_str())
        );
    }
    // What `netcm check` makes of it (check/snapshot.rs: Settings::resolve).
    let mask = |flag: &str| config.flag(flag).and_then(|v| v.parse::<u8>().ok());
    if let Some(cluster_cidr) = config.flag("--cluster-cidr") {
        let flags = AllocatorFlags {
            cluster_cidr: cluster_cidr.to_string(),
            node_cidr_mask_size: mask("--node-cidr-mask-size"),
            node_cidr_mask_size_ipv4: mask("--node-cidr-mask-size-ipv4"),
            node_cidr_mask_size_ipv6: mask("--node-cidr-mask-size-ipv6"),
            service_cluster_ip_range: config
                .flag("--service-cluster-ip-range")
                .unwrap_or_default()
                .to_string(),
        };
        if let Ok(c) = AllocatorConfig::from_flags(&flags) {
            for f in &c.families {
                for net in &f.cluster_cidrs {
                    assert!(net.prefix_len() <= f.node_mask && f.node_mask <= f.family.bits());
                }
            }
        }
    }
    let syncer = netcm_node_annotation_syncer::Flags {
        annotation_prefix: config.flag("--annotation-prefix").map(str::to_string),
        route_lease_annotation_prefix: None,
        backend_type: config
            .flag("--backend-type")
            .unwrap_or("host-gw")
            .to_string(),
        public_ip_address_types: config
            .flag("--public-ip-address-types")
            .unwrap_or("InternalIP,ExternalIP")
            .split(',')
            .map(str::to_string)
            .collect(),
        concurrent_node_annotation_syncs: 1,
    };
    if let Ok(cfg) = syncer.config() {
        assert!(cfg
            .keys
            .all()
            .all(|k| k.starts_with(cfg.keys.prefix.as_str())));
        assert!(!cfg.address_types.is_empty());
    }
}
