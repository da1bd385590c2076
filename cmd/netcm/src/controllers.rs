//! The controller registry, assembled here as KCM's lives in `cmd/kube-controller-manager/app`: each
//! controller's flags on the command line and its descriptor in start order. This file is the only
//! place in `cmd` that names a controller.

use clap::Args;
use netcm_manager::Registry;

/// Every controller's flags, each under its own help heading.
#[derive(Debug, Clone, Args)]
pub struct ControllerFlags {
    #[command(flatten, next_help_heading = "subnet-allocator")]
    allocator: netcm_subnet_allocator::Flags,
    #[command(flatten, next_help_heading = "node-annotation-syncer")]
    annotations: netcm_node_annotation_syncer::Flags,
    #[command(flatten, next_help_heading = "route-controller")]
    routes: netcm_route_controller::Flags,
    #[command(flatten, next_help_heading = "pod-cidr-migration")]
    migration: netcm_pod_cidr_migration::Flags,
}

/// Every controller netcm knows, in start order: the allocator writes pod CIDRs, the syncer publishes
/// them as lease annotations, the route controller programs routes from those.
/// A command line that gives `--annotation-prefix` and its deprecated alias with different values is
/// refused here, whichever controllers are enabled: it contradicts itself.
pub fn registry(flags: &ControllerFlags) -> anyhow::Result<Registry> {
    let (prefix_flag, prefix) = flags.annotations.annotation_prefix()?;
    Ok(Registry::new(vec![
        netcm_subnet_allocator::descriptor(flags.allocator.clone()),
        netcm_node_annotation_syncer::descriptor(flags.annotations.clone()),
        // The route controller owns only routes inside the allocator's cluster CIDRs (the flag's and its
        // ClusterCIDR objects'), and reads
        // gateways from the lease annotations under the syncer's prefix.
        netcm_route_controller::descriptor(
            flags.routes.clone(),
            &flags.allocator.cluster_cidr,
            flags.allocator.cluster_cidr_objects,
            prefix,
            prefix_flag,
        ),
        // Off by default. Nodes move from and to the allocator's pools, the flag's among them.
        netcm_pod_cidr_migration::descriptor(
            flags.migration.clone(),
            &flags.allocator.cluster_cidr,
            flags.allocator.cluster_cidr_objects,
        ),
    ])?)
}

/// Warnings about deprecated flags on the command line, logged once logging is up.
pub fn deprecation_warnings(flags: &ControllerFlags) -> Vec<String> {
    flags
        .annotations
        .deprecation_warning()
        .into_iter()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Cli;
    use clap::{CommandFactory, Parser};

    #[test]
    fn the_command_line_of_every_controller_fits_together() {
        Cli::command().debug_assert();
    }

    #[test]
    fn every_controller_name_and_alias_follows_the_rules_and_maps_to_a_real_controller() {
        let cli = Cli::parse_from(["netcm"]);
        let r = registry(&cli.controllers).expect("registry is valid");
        assert_eq!(
            r.names(),
            [
                "subnet-allocator",
                "node-annotation-syncer",
                "route-controller",
                "pod-cidr-migration"
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

    #[test]
    fn the_migration_controller_is_refused_when_the_allocator_would_not_close_its_pools() {
        let cli = Cli::parse_from([
            "netcm",
            "--controllers=*,pod-cidr-migration",
            "--cluster-cidr=10.244.0.0/16",
            "--cluster-cidr-objects=false",
        ]);
        let err = registry(&cli.controllers)
            .expect("registry is valid")
            .validate_flags(&cli.generic)
            .expect_err("no ClusterCIDR objects");
        assert!(err.to_string().contains("--cluster-cidr-objects"), "{err}");
        // Off (the default), it asks nothing of the allocator's flags.
        let cli = Cli::parse_from([
            "netcm",
            "--cluster-cidr=10.244.0.0/16",
            "--cluster-cidr-objects=false",
        ]);
        registry(&cli.controllers)
            .expect("registry is valid")
            .validate_flags(&cli.generic)
            .expect("the migration controller is off");
    }

    #[test]
    fn the_route_controller_is_checked_against_the_allocators_cluster_cidr() {
        let cli = Cli::parse_from([
            "netcm",
            "--cluster-cidr=0.0.0.0/0",
            "--allocate-node-cidrs=false",
        ]);
        let err = registry(&cli.controllers)
            .expect("registry is valid")
            .validate_flags(&cli.generic)
            .expect_err("a default-like cluster CIDR");
        assert!(
            err.to_string().starts_with("--cluster-cidr 0.0.0.0/0"),
            "{err}"
        );
    }
}
