//! Unit tests of the lease plan, with Nodes built in memory.

use super::*;
use crate::flags::Flags;
use clap::Parser;
use k8s_openapi::api::core::v1::{NodeAddress, NodeSpec, NodeStatus};

const P: &str = "flannel.alpha.coreos.com/";

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    flags: Flags,
}

fn cfg(args: &[&str]) -> Config {
    let mut argv = vec!["netcm"];
    argv.extend_from_slice(args);
    Cli::parse_from(argv).flags.config().expect("valid flags")
}

fn node(cidrs: &[&str], addrs: &[(&str, &str)]) -> Node {
    Node {
        spec: Some(NodeSpec {
            pod_cidr: cidrs.first().map(|s| s.to_string()),
            pod_cidrs: Some(cidrs.iter().map(|s| s.to_string()).collect()),
            ..Default::default()
        }),
        status: Some(NodeStatus {
            addresses: Some(
                addrs
                    .iter()
                    .map(|(t, a)| NodeAddress {
                        type_: t.to_string(),
                        address: a.to_string(),
                    })
                    .collect(),
            ),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn ann(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (format!("{P}{k}"), v.to_string()))
        .collect()
}

#[test]
fn an_ipv4_node_gets_the_full_host_gw_lease() {
    let p = plan(
        &cfg(&[]),
        &node(&["10.244.1.0/24"], &[("InternalIP", "192.0.2.10")]),
        &BTreeMap::new(),
    );
    assert_eq!(p.waiting, None);
    assert_eq!(
        p.changes,
        ann(&[
            ("kube-subnet-manager", "true"),
            ("backend-type", "host-gw"),
            ("backend-data", "null"),
            ("public-ip", "192.0.2.10"),
        ])
    );
}

#[test]
fn a_dual_stack_node_also_gets_the_ipv6_public_ip_and_v6_backend_data() {
    let p = plan(
        &cfg(&[]),
        &node(
            &["10.244.1.0/24", "fd00:10:244:1::/64"],
            &[("InternalIP", "2001:db8::a"), ("InternalIP", "192.0.2.10")],
        ),
        &BTreeMap::new(),
    );
    assert_eq!(
        p.changes.get(&format!("{P}public-ip")).map(String::as_str),
        Some("192.0.2.10")
    );
    assert_eq!(
        p.changes
            .get(&format!("{P}public-ipv6"))
            .map(String::as_str),
        Some("2001:db8::a")
    );
    assert_eq!(
        p.changes
            .get(&format!("{P}backend-v6-data"))
            .map(String::as_str),
        Some("null")
    );
}

#[test]
fn an_ipv6_only_node_gets_no_ipv4_public_ip() {
    let p = plan(
        &cfg(&[]),
        &node(
            &["fd00:10:244:1::/64"],
            &[("InternalIP", "192.0.2.10"), ("InternalIP", "2001:db8::a")],
        ),
        &BTreeMap::new(),
    );
    assert!(!p.changes.contains_key(&format!("{P}public-ip")));
    assert_eq!(
        p.changes
            .get(&format!("{P}public-ipv6"))
            .map(String::as_str),
        Some("2001:db8::a")
    );
}

#[test]
fn address_types_are_tried_in_flag_order_not_node_order() {
    let n = node(
        &["10.244.1.0/24"],
        &[("ExternalIP", "198.51.100.1"), ("InternalIP", "192.0.2.10")],
    );
    let default = plan(&cfg(&[]), &n, &BTreeMap::new());
    assert_eq!(
        default
            .changes
            .get(&format!("{P}public-ip"))
            .map(String::as_str),
        Some("192.0.2.10")
    );
    let external_first = plan(
        &cfg(&["--public-ip-address-types=ExternalIP,InternalIP"]),
        &n,
        &BTreeMap::new(),
    );
    assert_eq!(
        external_first
            .changes
            .get(&format!("{P}public-ip"))
            .map(String::as_str),
        Some("198.51.100.1")
    );
}

#[test]
fn a_type_that_has_no_address_of_the_family_falls_through_to_the_next_type() {
    let p = plan(
        &cfg(&[]),
        &node(
            &["10.244.1.0/24"],
            &[
                ("InternalIP", "2001:db8::a"),
                ("Hostname", "n1"),
                ("ExternalIP", "198.51.100.1"),
            ],
        ),
        &BTreeMap::new(),
    );
    assert_eq!(
        p.changes.get(&format!("{P}public-ip")).map(String::as_str),
        Some("198.51.100.1")
    );
}

#[test]
fn a_valid_overwrite_wins_and_is_written_in_canonical_form() {
    let current = ann(&[
        ("public-ipv6-overwrite", "2001:DB8:0::0001"),
        ("public-ip-overwrite", "203.0.113.5"),
    ]);
    let p = plan(
        &cfg(&[]),
        &node(
            &["10.244.1.0/24", "fd00::/64"],
            &[("InternalIP", "192.0.2.10"), ("InternalIP", "2001:db8::a")],
        ),
        &current,
    );
    assert_eq!(
        p.changes.get(&format!("{P}public-ip")).map(String::as_str),
        Some("203.0.113.5")
    );
    assert_eq!(
        p.changes
            .get(&format!("{P}public-ipv6"))
            .map(String::as_str),
        Some("2001:db8::1")
    );
    assert!(p.invalid.is_empty());
}

#[test]
fn an_empty_overwrite_counts_as_unset() {
    let p = plan(
        &cfg(&[]),
        &node(&["10.244.1.0/24"], &[("InternalIP", "192.0.2.10")]),
        &ann(&[("public-ip-overwrite", "")]),
    );
    assert_eq!(
        p.changes.get(&format!("{P}public-ip")).map(String::as_str),
        Some("192.0.2.10")
    );
    assert!(p.invalid.is_empty());
}

#[test]
fn an_invalid_overwrite_keeps_the_last_good_public_ip_and_is_reported() {
    let current = ann(&[
        ("kube-subnet-manager", "true"),
        ("backend-type", "host-gw"),
        ("backend-data", "null"),
        ("public-ip", "203.0.113.5"),
        ("public-ip-overwrite", "not-an-ip"),
    ]);
    let p = plan(
        &cfg(&[]),
        &node(&["10.244.1.0/24"], &[("InternalIP", "192.0.2.10")]),
        &current,
    );
    assert!(p.changes.is_empty(), "{:?}", p.changes);
    assert_eq!(p.invalid.len(), 1);
    assert_eq!(p.invalid[0].key, format!("{P}public-ip-overwrite"));
    assert_eq!(p.invalid[0].value, "not-an-ip");
    assert_eq!(p.invalid[0].instead, Instead::Kept("203.0.113.5".into()));
}

#[test]
fn an_invalid_overwrite_on_a_fresh_lease_uses_the_address() {
    let p = plan(
        &cfg(&[]),
        &node(&["10.244.1.0/24"], &[("InternalIP", "192.0.2.10")]),
        &ann(&[("public-ip-overwrite", "2001:db8::1")]),
    );
    assert_eq!(
        p.changes.get(&format!("{P}public-ip")).map(String::as_str),
        Some("192.0.2.10")
    );
    assert_eq!(
        p.invalid[0].instead,
        Instead::FromAddresses("192.0.2.10".into())
    );
    assert_eq!(p.invalid[0].why, "an IPv6 address where IPv4 is expected");
}

#[test]
fn an_invalid_overwrite_replaces_a_broken_lease_value_with_the_address() {
    let p = plan(
        &cfg(&[]),
        &node(&["10.244.1.0/24"], &[("InternalIP", "192.0.2.10")]),
        &ann(&[("public-ip-overwrite", "x"), ("public-ip", "garbage")]),
    );
    assert_eq!(
        p.changes.get(&format!("{P}public-ip")).map(String::as_str),
        Some("192.0.2.10")
    );
}

#[test]
fn a_node_without_pod_cidrs_waits_and_gets_nothing() {
    let p = plan(
        &cfg(&[]),
        &node(&[], &[("InternalIP", "192.0.2.10")]),
        &BTreeMap::new(),
    );
    assert_eq!(p.waiting, Some(Waiting::NoPodCidr));
    assert!(p.changes.is_empty());
}

#[test]
fn a_node_without_an_address_of_a_pod_cidr_family_waits_and_gets_nothing() {
    let p = plan(
        &cfg(&[]),
        &node(
            &["10.244.1.0/24", "fd00::/64"],
            &[("InternalIP", "192.0.2.10")],
        ),
        &BTreeMap::new(),
    );
    assert_eq!(p.waiting, Some(Waiting::NoAddress(vec![Family::V6])));
    assert!(p.changes.is_empty());
}

#[test]
fn a_node_that_lost_its_address_keeps_its_published_public_ip() {
    let current = ann(&[
        ("kube-subnet-manager", "true"),
        ("backend-type", "host-gw"),
        ("backend-data", "null"),
        ("public-ip", "192.0.2.10"),
    ]);
    let p = plan(&cfg(&[]), &node(&["10.244.1.0/24"], &[]), &current);
    assert_eq!(p.waiting, None);
    assert!(p.changes.is_empty());
}

#[test]
fn unusable_pod_cidrs_are_not_published() {
    let three = plan(
        &cfg(&[]),
        &node(
            &["10.0.0.0/24", "10.0.1.0/24", "fd00::/64"],
            &[("InternalIP", "192.0.2.10")],
        ),
        &BTreeMap::new(),
    );
    assert!(matches!(three.waiting, Some(Waiting::UnusablePodCidrs(_))));
    let garbage = plan(
        &cfg(&[]),
        &node(&["banana"], &[("InternalIP", "192.0.2.10")]),
        &BTreeMap::new(),
    );
    assert!(matches!(
        garbage.waiting,
        Some(Waiting::UnusablePodCidrs(_))
    ));
}

#[test]
fn the_single_pod_cidr_field_is_read_when_the_list_is_empty() {
    let mut n = node(&[], &[("InternalIP", "192.0.2.10")]);
    if let Some(spec) = n.spec.as_mut() {
        spec.pod_cidr = Some("10.244.1.0/24".into());
    }
    assert_eq!(netcm_node::raw_pod_cidrs(&n), ["10.244.1.0/24"]);
    assert_eq!(plan(&cfg(&[]), &n, &BTreeMap::new()).waiting, None);
}

#[test]
fn only_the_keys_that_differ_are_written() {
    let current = ann(&[
        ("kube-subnet-manager", "true"),
        ("backend-type", "host-gw"),
        ("backend-data", "null"),
        ("public-ip", "192.0.2.9"),
        ("custom", "mine"),
    ]);
    let p = plan(
        &cfg(&[]),
        &node(&["10.244.1.0/24"], &[("InternalIP", "192.0.2.10")]),
        &current,
    );
    assert_eq!(p.changes, ann(&[("public-ip", "192.0.2.10")]));
}

#[test]
fn a_node_that_already_carries_the_lease_needs_no_write() {
    let current = ann(&[
        ("kube-subnet-manager", "true"),
        ("backend-type", "host-gw"),
        ("backend-data", "null"),
        ("backend-v6-data", "null"),
        ("public-ip", "192.0.2.10"),
        ("public-ipv6", "2001:db8::a"),
    ]);
    let p = plan(
        &cfg(&[]),
        &node(
            &["10.244.1.0/24", "fd00::/64"],
            &[("InternalIP", "192.0.2.10"), ("InternalIP", "2001:db8::a")],
        ),
        &current,
    );
    assert_eq!(p, Plan::default());
}

#[test]
fn a_vxlan_lease_never_writes_backend_data_and_keeps_the_agents() {
    let vxlan = cfg(&["--backend-type=vxlan"]);
    let n = node(
        &["10.244.1.0/24", "fd00::/64"],
        &[("InternalIP", "192.0.2.10"), ("InternalIP", "2001:db8::a")],
    );
    let fresh = plan(&vxlan, &n, &BTreeMap::new());
    assert_eq!(
        fresh
            .changes
            .get(&format!("{P}backend-type"))
            .map(String::as_str),
        Some("vxlan")
    );
    assert!(!fresh.changes.contains_key(&format!("{P}backend-data")));
    assert!(!fresh.changes.contains_key(&format!("{P}backend-v6-data")));
    let agent = ann(&[("backend-data", r#"{"VNI":1,"VtepMAC":"12:c6:65:8e:3a:01"}"#)]);
    let kept = plan(&vxlan, &n, &agent);
    assert!(!kept.changes.contains_key(&format!("{P}backend-data")));
}

#[test]
fn a_custom_prefix_is_used_for_every_key_and_other_annotations_are_never_written() {
    let c = cfg(&["--annotation-prefix=netcm.example.com/lease"]);
    let p = plan(
        &c,
        &node(&["10.244.1.0/24"], &[("InternalIP", "192.0.2.10")]),
        &BTreeMap::new(),
    );
    assert!(p
        .changes
        .keys()
        .all(|k| k.starts_with("netcm.example.com/lease-")));
    let owned = [
        &c.keys.kube_subnet_manager,
        &c.keys.backend_type,
        &c.keys.backend_data,
        &c.keys.backend_v6_data,
        &c.keys.public_ip,
        &c.keys.public_ipv6,
    ];
    assert!(p.changes.keys().all(|k| owned.contains(&k)));
}

#[test]
fn addresses_that_can_never_be_a_nodes_public_ip_are_refused() {
    for (raw, fam) in [
        ("0.0.0.0", Family::V4),
        ("127.0.0.1", Family::V4),
        ("224.0.0.1", Family::V4),
        ("255.255.255.255", Family::V4),
        ("192.0.2.1 ", Family::V4),
        ("192.0.2.01", Family::V4),
        ("::", Family::V6),
        ("::1", Family::V6),
        ("ff02::1", Family::V6),
        ("fe80::1", Family::V6),
        ("::ffff:192.0.2.1", Family::V6),
        ("::ffff:192.0.2.1", Family::V4),
        ("fe80::1%eth0", Family::V6),
        ("", Family::V4),
    ] {
        assert!(
            usable_ip(raw, fam).is_err(),
            "{raw:?} as {fam:?} must be refused"
        );
    }
    assert_eq!(usable_ip("192.0.2.1", Family::V4), Ok("192.0.2.1".into()));
    assert_eq!(
        usable_ip("2001:0db8::0:1", Family::V6),
        Ok("2001:db8::1".into())
    );
}
