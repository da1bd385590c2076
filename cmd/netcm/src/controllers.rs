//! The controller registry, assembled here as KCM's lives in `cmd/kube-controller-manager/app`.

use netcm_manager::{ControllerDescriptor, Registry};

use crate::Cli;

/// Every controller netcm knows, in start order: the allocator writes pod CIDRs, the syncer publishes
/// them as lease annotations, the route controller programs routes from those.
/// `sweep` is the route controller's startup sweep, which its init takes over.
pub fn registry(
    cli: &Cli,
    sweep: &netcm_route_controller::StartupSweep,
) -> anyhow::Result<Registry> {
    let allocator = cli.allocator.clone();
    let annotations = cli.annotations.clone();
    let routes = cli.routes.clone();
    // The route controller owns only routes inside the allocator's cluster CIDRs.
    let cluster_cidr = cli.allocator.cluster_cidr.clone();
    let sweep = sweep.clone();
    Ok(Registry::new(vec![
        ControllerDescriptor {
            name: netcm_subnet_allocator::NAME,
            aliases: &["nodeipam", "node-ipam-controller"],
            disabled_by_default: false,
            init: Box::new(move |ctx| netcm_subnet_allocator::init(ctx, &allocator)),
        },
        ControllerDescriptor {
            name: netcm_node_annotation_syncer::NAME,
            aliases: &["annotations"],
            disabled_by_default: false,
            init: Box::new(move |ctx| netcm_node_annotation_syncer::init(ctx, &annotations)),
        },
        ControllerDescriptor {
            name: netcm_route_controller::NAME,
            aliases: &["route", "node-route-controller"],
            disabled_by_default: false,
            init: Box::new(move |ctx| {
                netcm_route_controller::init(ctx, &routes, &cluster_cidr, &sweep)
            }),
        },
    ])?)
}

/// Controller settings logged at startup as the effective configuration.
pub fn effective_config(cli: &Cli) -> Vec<(String, String)> {
    let a = &cli.allocator;
    let mask = |m: Option<u8>| m.map(|m| m.to_string()).unwrap_or_default();
    let mut out = vec![
        (
            "--allocate-node-cidrs".into(),
            a.allocate_node_cidrs.to_string(),
        ),
        ("--cluster-cidr".into(), a.cluster_cidr.clone()),
        ("--node-cidr-mask-size".into(), mask(a.node_cidr_mask_size)),
        (
            "--node-cidr-mask-size-ipv4".into(),
            mask(a.node_cidr_mask_size_ipv4),
        ),
        (
            "--node-cidr-mask-size-ipv6".into(),
            mask(a.node_cidr_mask_size_ipv6),
        ),
        (
            "--service-cluster-ip-range".into(),
            a.service_cluster_ip_range.clone(),
        ),
        ("--pod-cidr-claims".into(), a.pod_cidr_claims.to_string()),
        (
            "--cluster-cidr-objects".into(),
            a.cluster_cidr_objects.to_string(),
        ),
    ];
    out.extend(cli.annotations.effective_config());
    out.extend(cli.routes.effective_config());
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, Parser};

    #[test]
    fn the_command_line_of_every_controller_fits_together() {
        Cli::command().debug_assert();
    }

    #[test]
    fn every_controller_name_and_alias_follows_the_rules_and_maps_to_a_real_controller() {
        let cli = Cli::parse_from(["netcm"]);
        let r = registry(&cli, &netcm_route_controller::StartupSweep::new())
            .expect("registry is valid");
        assert_eq!(
            r.names(),
            [
                "subnet-allocator",
                "node-annotation-syncer",
                "route-controller"
            ]
        );
        for d in r.descriptors() {
            for alias in d.aliases {
                assert_eq!(r.canonical(alias), Some(d.name));
            }
        }
        assert_eq!(r.canonical("nodeipam"), Some("subnet-allocator"));
        assert_eq!(r.canonical("route"), Some("route-controller"));
    }
}
