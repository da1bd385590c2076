//! Tests of [`AllocatorConfig::from_flags`]: one per KCM rule, with its message.

use super::*;

fn net(s: &str) -> IpNet {
    s.parse().unwrap()
}

fn flags(cluster: &str) -> AllocatorFlags {
    AllocatorFlags {
        cluster_cidr: cluster.to_string(),
        ..AllocatorFlags::default()
    }
}

fn err(f: &AllocatorFlags) -> ConfigError {
    AllocatorConfig::from_flags(f).unwrap_err()
}

#[test]
fn single_stack_ipv4_defaults_to_slash_24() {
    let c = AllocatorConfig::from_flags(&flags("10.244.0.0/16")).unwrap();
    assert_eq!(
        c.families,
        vec![FamilyPool {
            family: Family::V4,
            node_mask: 24,
            cluster_cidrs: vec![net("10.244.0.0/16")],
            sizing: None,
        }]
    );
    assert!(c.service_ranges.is_empty());
    assert!(!c.is_dual_stack());
}

#[test]
fn single_stack_ipv6_defaults_to_slash_64() {
    let c = AllocatorConfig::from_flags(&flags("fd00:10::/56")).unwrap();
    assert_eq!(c.families[0].node_mask, 64);
    assert_eq!(c.primary_family(), Some(Family::V6));
}

#[test]
fn dual_stack_lists_families_primary_first_with_their_own_masks() {
    let mut f = flags(" fd00::/48 , 10.0.0.0/8 ");
    f.node_cidr_mask_size_ipv4 = Some(26);
    f.node_cidr_mask_size_ipv6 = Some(62);
    let c = AllocatorConfig::from_flags(&f).unwrap();
    assert!(c.is_dual_stack());
    assert_eq!(c.primary_family(), Some(Family::V6));
    assert_eq!(c.families[0].node_mask, 62);
    assert_eq!(c.families[1].family, Family::V4);
    assert_eq!(c.families[1].node_mask, 26);
}

#[test]
fn several_cluster_cidrs_of_one_family_are_kept_in_the_order_given() {
    let c = AllocatorConfig::from_flags(&flags("10.1.0.0/16,fd00::/48,10.0.0.0/16")).unwrap();
    assert_eq!(c.families.len(), 2);
    assert_eq!(
        c.families[0].cluster_cidrs,
        vec![net("10.1.0.0/16"), net("10.0.0.0/16")]
    );
}

#[test]
fn cluster_cidrs_are_normalized() {
    let c = AllocatorConfig::from_flags(&flags("10.244.3.9/16")).unwrap();
    assert_eq!(c.families[0].cluster_cidrs, vec![net("10.244.0.0/16")]);
}

#[test]
fn empty_cluster_cidr_is_refused() {
    let e = err(&flags("  "));
    assert_eq!(e, ConfigError::MissingClusterCidr);
    assert_eq!(
        e.to_string(),
        "Must specify --cluster-cidr if --allocate-node-cidrs is set"
    );
}

#[test]
fn an_unparsable_cluster_cidr_names_the_flag_and_value() {
    let e = err(&flags("10.0.0.0/16,banana"));
    let msg = e.to_string();
    assert!(msg.contains("--cluster-cidr"), "{msg}");
    assert!(msg.contains("\"banana\""), "{msg}");
    assert!(matches!(
        err(&flags("10.0.0.0/16,")),
        ConfigError::InvalidClusterCidr { .. }
    ));
}

#[test]
fn overlapping_cluster_cidrs_are_refused() {
    let e = err(&flags("10.0.0.0/8,10.1.0.0/16"));
    assert_eq!(
        e,
        ConfigError::OverlappingClusterCidrs {
            first: net("10.0.0.0/8"),
            second: net("10.1.0.0/16")
        }
    );
    assert!(e.to_string().contains("--cluster-cidr"));
}

#[test]
fn node_cidr_mask_size_is_not_allowed_with_dual_stack() {
    let mut f = flags("10.0.0.0/8,fd00::/48");
    f.node_cidr_mask_size = Some(24);
    let e = err(&f);
    assert_eq!(e, ConfigError::MaskSizeWithDualStack);
    assert_eq!(
        e.to_string(),
        "usage of --node-cidr-mask-size is not allowed with dual-stack clusters"
    );
}

#[test]
fn node_cidr_mask_size_zero_means_unset() {
    let mut f = flags("10.0.0.0/8,fd00::/48");
    f.node_cidr_mask_size = Some(0);
    assert!(AllocatorConfig::from_flags(&f).is_ok());
}

#[test]
fn node_cidr_mask_size_applies_to_a_single_stack_cluster() {
    let mut f = flags("fd00::/56");
    f.node_cidr_mask_size = Some(60);
    let c = AllocatorConfig::from_flags(&f).unwrap();
    assert_eq!(c.families[0].node_mask, 60);
}

#[test]
fn node_cidr_mask_size_with_a_family_flag_is_refused_on_single_stack() {
    let mut f = flags("10.0.0.0/8");
    f.node_cidr_mask_size = Some(24);
    f.node_cidr_mask_size_ipv4 = Some(25);
    let e = err(&f);
    assert_eq!(e, ConfigError::MaskSizeWithFamilyMaskSize);
    assert!(e.to_string().starts_with(
        "usage of --node-cidr-mask-size-ipv4 and --node-cidr-mask-size-ipv6 is not allowed if \
         --node-cidr-mask-size is set"
    ));
}

#[test]
fn ipv4_mask_flag_is_refused_on_single_stack_ipv6() {
    let mut f = flags("fd00::/48");
    f.node_cidr_mask_size_ipv4 = Some(24);
    assert_eq!(
        err(&f).to_string(),
        "usage of --node-cidr-mask-size-ipv4 is not allowed for a single-stack IPv6 cluster"
    );
}

#[test]
fn ipv6_mask_flag_is_refused_on_single_stack_ipv4() {
    let mut f = flags("10.0.0.0/8");
    f.node_cidr_mask_size_ipv6 = Some(64);
    assert_eq!(
        err(&f).to_string(),
        "usage of --node-cidr-mask-size-ipv6 is not allowed for a single-stack IPv4 cluster"
    );
}

#[test]
fn the_matching_family_flag_is_used_on_single_stack() {
    let mut f = flags("10.0.0.0/8");
    f.node_cidr_mask_size_ipv4 = Some(20);
    assert_eq!(
        AllocatorConfig::from_flags(&f).unwrap().families[0].node_mask,
        20
    );
}

#[test]
fn a_cluster_prefix_longer_than_the_node_mask_is_refused_with_kcm_wording() {
    let e = err(&flags("10.0.0.0/25"));
    let msg = e.to_string();
    assert!(msg.starts_with(
        "Controller: Invalid --cluster-cidr, mask size of cluster CIDR must be less than or \
         equal to --node-cidr-mask-size configured for CIDR family"
    ));
    assert!(msg.contains("10.0.0.0/25"), "{msg}");
    assert!(msg.contains("--node-cidr-mask-size-ipv4=24"), "{msg}");
}

#[test]
fn every_cluster_cidr_of_a_family_is_checked_against_its_mask() {
    let mut f = flags("fd00::/48,10.0.0.0/16,10.1.0.0/28");
    f.node_cidr_mask_size_ipv4 = Some(26);
    assert!(matches!(
        err(&f),
        ConfigError::ClusterPrefixLongerThanNodeMask { cluster, node_mask: 26, .. }
            if cluster == net("10.1.0.0/28")
    ));
}

#[test]
fn a_node_mask_longer_than_the_address_is_refused() {
    let mut f = flags("10.0.0.0/8");
    f.node_cidr_mask_size = Some(33);
    let msg = err(&f).to_string();
    assert!(msg.contains("--node-cidr-mask-size=33"), "{msg}");
}

#[test]
fn an_ipv6_cluster_with_more_than_65536_node_cidrs_is_refused() {
    let e = err(&flags("fd00::/47"));
    assert!(matches!(
        e,
        ConfigError::NodeCidrTooBig { max_diff: 16, .. }
    ));
    assert!(e
        .to_string()
        .starts_with("New CIDR set failed; the node CIDR size is too big"));
}

#[test]
fn an_ipv4_cluster_is_capped_at_2_pow_24_node_cidrs() {
    let mut f = flags("10.0.0.0/8");
    f.node_cidr_mask_size = Some(32);
    assert!(AllocatorConfig::from_flags(&f).is_ok());
    f.cluster_cidr = "10.0.0.0/7".into();
    assert!(matches!(
        err(&f),
        ConfigError::NodeCidrTooBig { max_diff: 24, .. }
    ));
}

#[test]
fn service_ranges_are_parsed_and_normalized() {
    let mut f = flags("10.0.0.0/8");
    f.service_cluster_ip_range = " 10.96.0.5/12 , fd00:96::/112 ".into();
    let c = AllocatorConfig::from_flags(&f).unwrap();
    assert_eq!(
        c.service_ranges,
        vec![net("10.96.0.0/12"), net("fd00:96::/112")]
    );
}

#[test]
fn an_empty_secondary_service_range_is_ignored() {
    let mut f = flags("10.0.0.0/8");
    f.service_cluster_ip_range = "10.96.0.0/12,".into();
    let c = AllocatorConfig::from_flags(&f).unwrap();
    assert_eq!(c.service_ranges, vec![net("10.96.0.0/12")]);
}

#[test]
fn more_than_two_service_ranges_are_refused() {
    let mut f = flags("10.0.0.0/8");
    f.service_cluster_ip_range = "10.96.0.0/12,fd00::/112,10.97.0.0/16".into();
    let e = err(&f);
    assert_eq!(e, ConfigError::TooManyServiceRanges { count: 3 });
    assert!(e
        .to_string()
        .starts_with("--service-cluster-ip-range can not contain more than two entries"));
}

#[test]
fn two_service_ranges_of_one_family_are_refused() {
    let mut f = flags("10.0.0.0/8");
    f.service_cluster_ip_range = "10.96.0.0/12,10.112.0.0/12".into();
    let msg = err(&f).to_string();
    assert!(msg.contains("--service-cluster-ip-range"), "{msg}");
    assert!(
        msg.contains("serviceCIDR and secondaryServiceCIDR are not dualstack"),
        "{msg}"
    );
}

#[test]
fn an_unparsable_service_range_names_the_flag_and_value() {
    let mut f = flags("10.0.0.0/8");
    f.service_cluster_ip_range = "10.96.0.0".into();
    let msg = err(&f).to_string();
    assert!(
        msg.starts_with("invalid --service-cluster-ip-range entry \"10.96.0.0\""),
        "{msg}"
    );
}

#[test]
fn every_config_error_is_one_line() {
    let mut f = flags("10.0.0.0/8");
    f.node_cidr_mask_size = Some(24);
    f.node_cidr_mask_size_ipv6 = Some(64);
    assert!(!err(&f).to_string().contains('\n'));
    assert!(!err(&flags("fd00::/47")).to_string().contains('\n'));
}
