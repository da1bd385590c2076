//! A Node whose pod CIDR covers a whole pool: named once, with its fix first, and nobody inside it blamed.

use super::*;

fn aged(mut n: k8s_openapi::api::core::v1::Node, secs: i64) -> k8s_openapi::api::core::v1::Node {
    n.metadata.creation_timestamp = Some(Time(before(secs)));
    n
}

/// Three Nodes netcm served, `hostile` registered with a kubelet's `--pod-cidr=10.0.0.0/8` over the
/// whole cluster CIDR 10.0.0.0/16 (older or newer than they are), and one Node waiting.
fn hostile_cluster(hostile_first: bool) -> Snapshot {
    let hostile_age = if hostile_first { 7200 } else { 60 };
    snapshot(
        "10.0.0.0/16",
        vec![
            aged(node("n0", "192.0.2.1", &["10.0.0.0/24"]), 3600),
            aged(node("n1", "192.0.2.2", &["10.0.1.0/24"]), 3500),
            aged(node("n2", "192.0.2.3", &["10.0.2.0/24"]), 3400),
            aged(node("hostile", "192.0.2.9", &["10.0.0.0/8"]), hostile_age),
            aged(node("w", "192.0.2.4", &[]), 30),
        ],
    )
}

fn fix(f: &Finding) -> &str {
    f.fix.as_deref().unwrap_or_default()
}

#[test]
fn a_node_whose_pod_cidr_covers_the_cluster_cidr_is_named_on_the_full_pool_with_its_fix_first() {
    for hostile_first in [true, false] {
        let f = run(&hostile_cluster(hostile_first));
        let pool = &f[0];
        assert_eq!(pool.status, Status::Fail, "{f:#?}");
        assert!(
            pool.message.contains("256/256")
                && pool.message.ends_with(
                    ": full — Node hostile holds 10.0.0.0/8, which keeps all 256 of its node CIDRs reserved"
                ),
            "hostile first: {hostile_first}: {}",
            pool.message
        );
        assert_eq!(pool.nodes, ["hostile"]);
        assert!(
            fix(pool).starts_with("remove --pod-cidr from Node hostile's kubelet")
                && fix(pool).contains("kubectl delete node hostile;"),
            "{}",
            fix(pool)
        );
        let (recreate, append) = (
            fix(pool).find("kubectl delete node hostile"),
            fix(pool).find("append a second, unused cluster CIDR"),
        );
        assert!(
            matches!((recreate, append), (Some(r), Some(a)) if r < a),
            "the re-create fix comes before appending a cluster CIDR: {}",
            fix(pool)
        );
        let waiting = f.iter().find(|f| f.check == "waiting").expect("waiting");
        assert_eq!(waiting.nodes, ["w"]);
        assert!(
            waiting.message.contains("Node hostile holds 10.0.0.0/8")
                && fix(waiting).starts_with("remove --pod-cidr from Node hostile's kubelet"),
            "{waiting:#?}"
        );
    }
}

#[test]
fn a_node_whose_pod_cidr_covers_the_cluster_cidr_is_one_cidrs_line_and_the_nodes_inside_it_are_not_blamed(
) {
    for hostile_first in [true, false] {
        let f = run(&hostile_cluster(hostile_first));
        let bad: Vec<&Finding> = f
            .iter()
            .filter(|f| f.check == "cidrs" && f.status != Status::Ok)
            .collect();
        assert_eq!(bad.len(), 1, "hostile first: {hostile_first}: {bad:#?}");
        let hostile = bad[0];
        assert_eq!(hostile.status, Status::Fail);
        assert_eq!(hostile.nodes, ["hostile"]);
        assert_eq!(
            hostile.message,
            "Node hostile's pod CIDR 10.0.0.0/8 is wider than the /24 node CIDRs of pool default-cluster-cidr and covers 256 of them, so netcm hands out no address inside it; it overlaps the pod CIDRs of Nodes n0 (10.0.0.0/24), n1 (10.0.1.0/24) and n2 (10.0.2.0/24)"
        );
        assert_eq!(
            fix(hostile),
            "remove --pod-cidr from Node hostile's kubelet (or stop what wrote spec.podCIDR: see the allocators check), then kubectl delete node hostile; it registers again and netcm gives it a /24"
        );
        for victim in ["n0", "n1", "n2"] {
            assert!(
                !f.iter()
                    .any(|f| fix(f).contains(&format!("kubectl delete node {victim}"))),
                "{victim} is told to re-create itself: {f:#?}"
            );
        }
    }
}

#[test]
fn more_nodes_inside_an_oversized_cidr_than_are_named_are_counted() {
    let mut nodes: Vec<_> = (0..40)
        .map(|i| {
            aged(
                node(
                    &format!("n{i:02}"),
                    "192.0.2.1",
                    &[&format!("10.0.{i}.0/24")],
                ),
                3600 - i,
            )
        })
        .collect();
    nodes.push(node("hostile", "192.0.2.9", &["10.0.0.0/16"]));
    let f = run(&snapshot("10.0.0.0/8", nodes));
    let bad: Vec<&Finding> = f
        .iter()
        .filter(|f| f.check == "cidrs" && f.status != Status::Ok)
        .collect();
    assert_eq!(bad.len(), 1, "{bad:#?}");
    assert!(
        bad[0].message.ends_with(
            "covers 256 of them, so netcm hands out no address inside it; it overlaps the pod CIDRs of 40 Nodes, e.g. n00 (10.0.0.0/24), n01 (10.0.1.0/24), n02 (10.0.2.0/24)"
        ),
        "{}",
        bad[0].message
    );
    // 256 of 65536 in use: the pool line names no one.
    assert_eq!(f[0].status, Status::Ok, "{:#?}", f[0]);
}

#[test]
fn a_clustercidr_inside_an_oversized_pod_cidr_is_full_and_names_the_node() {
    let mut s = snapshot(
        "10.244.0.0/16",
        vec![node("hostile", "192.0.2.9", &["10.0.0.0/8"])],
    );
    s.object_pools = ObjectPoolsState::Listed(vec![cluster_cidr_object("rack-a", "10.128.0.0/16")]);
    let f = run(&s);
    let rack = f
        .iter()
        .find(|f| f.message.starts_with("ClusterCIDR rack-a"))
        .expect("rack-a's usage");
    assert_eq!(rack.status, Status::Fail, "{f:#?}");
    assert!(
        rack.message.ends_with(
            "full — Node hostile holds 10.0.0.0/8, which keeps all 256 of its node CIDRs reserved"
        ),
        "{}",
        rack.message
    );
    assert_eq!(rack.nodes, ["hostile"]);
    assert!(
        fix(rack).starts_with("remove --pod-cidr from Node hostile's kubelet")
            && fix(rack).contains("create another ClusterCIDR"),
        "{}",
        fix(rack)
    );
    // Outside the flag pool's range: wider than a node CIDR says what to do, "add it to --cluster-cidr"
    // would not.
    assert!(
        !f.iter()
            .any(|f| f.message.contains("outside every cluster CIDR")),
        "{f:#?}"
    );
}
