//! The controller registry, assembled here as KCM's lives in `cmd/kube-controller-manager/app`.

use netcm_manager::{ControllerDescriptor, Registry};

use crate::Cli;

/// Every controller netcm knows, in start order.
pub fn registry(cli: &Cli) -> anyhow::Result<Registry> {
    let allocator_flags = cli.allocator.clone();
    Ok(Registry::new(vec![ControllerDescriptor {
        name: netcm_subnet_allocator::NAME,
        aliases: &["nodeipam", "node-ipam-controller"],
        disabled_by_default: false,
        init: Box::new(move |ctx| netcm_subnet_allocator::init(ctx, &allocator_flags)),
    }])?)
}

/// Controller settings logged at startup as the effective configuration.
pub fn effective_config(cli: &Cli) -> Vec<(String, String)> {
    let a = &cli.allocator;
    vec![
        ("--allocate-node-cidrs".into(), a.allocate_node_cidrs.to_string()),
        ("--cluster-cidr".into(), a.cluster_cidr.clone()),
        ("--node-cidr-mask-size".into(), a.node_cidr_mask_size.map(|m| m.to_string()).unwrap_or_default()),
        ("--node-cidr-mask-size-ipv4".into(), a.node_cidr_mask_size_ipv4.map(|m| m.to_string()).unwrap_or_default()),
        ("--node-cidr-mask-size-ipv6".into(), a.node_cidr_mask_size_ipv6.map(|m| m.to_string()).unwrap_or_default()),
        ("--service-cluster-ip-range".into(), a.service_cluster_ip_range.clone()),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[test]
    fn every_controller_name_and_alias_follows_the_rules_and_maps_to_a_real_controller() {
        let cli = Cli::parse_from(["netcm"]);
        let r = registry(&cli).expect("registry is valid");
        for d in r.descriptors() {
            for alias in d.aliases {
                assert_eq!(r.canonical(alias), Some(d.name));
            }
        }
        assert_eq!(r.canonical("nodeipam"), Some("subnet-allocator"));
    }
}
