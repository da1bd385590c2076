//! Unit tests of the lease plan, with Nodes built in memory.

use super::*;
use crate::flags::Flags;

const P: &str = "flannel.alpha.coreos.com/";

fn cfg(args: &[&str]) -> Config {
    netcm_manager::test_support::parse_flags::<Flags>(args)
        .expect("flags parse")
        .config()
        .expect("valid flags")
}

fn node(cidrs: &[&str], addrs: &[(&str, &str)]) -> CachedNode {
    netcm_node::test_support::node("n1", cidrs, addrs, &[])
}

/// A dual-stack Node with an InternalIP of each family.
fn dual_stack() -> CachedNode {
    node(
        &["10.244.1.0/24", "fd00::/64"],
        &[("InternalIP", "192.0.2.10"), ("InternalIP", "2001:db8::a")],
    )
}

fn ann(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (format!("{P}{k}"), v.to_string()))
        .collect()
}

/// What `plan` writes under the lease key `key` (flannel's prefix), if anything.
fn change<'a>(plan: &'a Plan, key: &str) -> Option<&'a str> {
    plan.changes.get(&format!("{P}{key}")).map(String::as_str)
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
    assert_eq!(change(&p, "public-ip"), Some("192.0.2.10"));
    assert_eq!(change(&p, "public-ipv6"), Some("2001:db8::a"));
    assert_eq!(change(&p, "backend-v6-data"), Some("null"));
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
    assert_eq!(change(&p, "public-ip"), None);
    assert_eq!(change(&p, "public-ipv6"), Some("2001:db8::a"));
}

#[test]
fn address_types_are_tried_in_flag_order_not_node_order() {
    let n = node(
        &["10.244.1.0/24"],
        &[("ExternalIP", "198.51.100.1"), ("InternalIP", "192.0.2.10")],
    );
    let default = plan(&cfg(&[]), &n, &BTreeMap::new());
    assert_eq!(change(&default, "public-ip"), Some("192.0.2.10"));
    let external_first = plan(
        &cfg(&["--public-ip-address-types=ExternalIP,InternalIP"]),
        &n,
        &BTreeMap::new(),
    );
    assert_eq!(change(&external_first, "public-ip"), Some("198.51.100.1"));
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
    assert_eq!(change(&p, "public-ip"), Some("198.51.100.1"));
}

#[test]
fn a_valid_overwrite_wins_and_is_written_in_canonical_form() {
    let current = ann(&[
        ("public-ipv6-overwrite", "2001:DB8:0::0001"),
        ("public-ip-overwrite", "203.0.113.5"),
    ]);
    let p = plan(&cfg(&[]), &dual_stack(), &current);
    assert_eq!(change(&p, "public-ip"), Some("203.0.113.5"));
    assert_eq!(change(&p, "public-ipv6"), Some("2001:db8::1"));
    assert!(p.invalid.is_empty());
}

#[test]
fn an_empty_overwrite_counts_as_unset() {
    let p = plan(
        &cfg(&[]),
        &node(&["10.244.1.0/24"], &[("InternalIP", "192.0.2.10")]),
        &ann(&[("public-ip-overwrite", "")]),
    );
    assert_eq!(change(&p, "public-ip"), Some("192.0.2.10"));
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
    assert_eq!(change(&p, "public-ip"), Some("192.0.2.10"));
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
    assert_eq!(change(&p, "public-ip"), Some("192.0.2.10"));
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
    let mut full =
        netcm_node::test_support::full_node("n1", &[], &[("InternalIP", "192.0.2.10")], &[]);
    if let Some(spec) = full.spec.as_mut() {
        spec.pod_cidr = Some("10.244.1.0/24".into());
    }
    let n = CachedNode::from(&full);
    assert_eq!(n.raw_pod_cidrs().collect::<Vec<_>>(), ["10.244.1.0/24"]);
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
    let p = plan(&cfg(&[]), &dual_stack(), &current);
    assert_eq!(p, Plan::default());
}

#[test]
fn a_vxlan_lease_never_writes_backend_data_and_keeps_the_agents() {
    let vxlan = cfg(&["--backend-type=vxlan"]);
    let n = dual_stack();
    let fresh = plan(&vxlan, &n, &BTreeMap::new());
    assert_eq!(change(&fresh, "backend-type"), Some("vxlan"));
    assert_eq!(change(&fresh, "backend-data"), None);
    assert_eq!(change(&fresh, "backend-v6-data"), None);
    let agent = ann(&[("backend-data", r#"{"VNI":1,"VtepMAC":"12:c6:65:8e:3a:01"}"#)]);
    let kept = plan(&vxlan, &n, &agent);
    assert_eq!(change(&kept, "backend-data"), None);
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
    let owned = c.keys.lease();
    assert!(p.changes.keys().all(|k| owned.contains(&k.as_str())));
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
