//! `netcm check`'s pool, waiting and bad-data checks on snapshots built in memory.

use super::super::report::Status;
use super::super::snapshot::fixtures::*;
use super::*;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};

mod oversized;
mod space;

fn run(s: &Snapshot) -> Vec<Finding> {
    let a = analyse(s);
    let mut out = check_pools(s, a.as_ref());
    out.extend(check_waiting(s, a.as_ref()));
    out.extend(check_bad_data(s, a.as_ref()));
    out
}

#[test]
fn a_healthy_pool_reports_its_usage_and_every_node_served() {
    let s = snapshot(
        "10.244.0.0/16",
        vec![
            node("a", "192.0.2.1", &["10.244.0.0/24"]),
            node("b", "192.0.2.2", &["10.244.1.0/24"]),
        ],
    );
    let f = run(&s);
    assert!(f.iter().all(|f| f.status == Status::Ok), "{f:#?}");
    assert!(f[0].message.contains("2/256"), "{}", f[0].message);
}

#[test]
fn a_full_pool_names_the_waiting_node_and_says_to_append_a_cluster_cidr() {
    let s = snapshot(
        "10.244.0.0/23",
        vec![
            node("a", "192.0.2.1", &["10.244.0.0/24"]),
            node("b", "192.0.2.2", &["10.244.1.0/24"]),
            node("c", "192.0.2.3", &[]),
        ],
    );
    let f = run(&s);
    let pool = &f[0];
    assert_eq!(pool.status, Status::Fail);
    assert!(
        pool.message.contains("2/2") && pool.message.contains("full"),
        "{}",
        pool.message
    );
    let waiting = f.iter().find(|f| f.check == "waiting").expect("waiting");
    assert_eq!(waiting.status, Status::Fail);
    assert_eq!(waiting.nodes, ["c"]);
    assert!(
        waiting.message.contains("10.244.0.0/23 is full (2/2)"),
        "{}",
        waiting.message
    );
    assert!(waiting
        .fix
        .as_deref()
        .unwrap_or_default()
        .contains("--cluster-cidr"));
}

#[test]
fn a_pool_over_ninety_percent_is_a_warning() {
    let nodes: Vec<_> = (0..15)
        .map(|i| {
            node(
                &format!("n{i}"),
                "192.0.2.1",
                &[&format!("10.244.0.{}/28", i * 16)],
            )
        })
        .collect();
    let mut s = snapshot("10.244.0.0/24", nodes);
    s.settings = super::super::snapshot::Settings::resolve(
        &super::super::snapshot::GivenFlags {
            cluster_cidr: Some("10.244.0.0/24".into()),
            node_cidr_mask_size: Some(28),
            ..Default::default()
        },
        None,
    );
    let f = run(&s);
    assert_eq!(f[0].status, Status::Warn, "{f:#?}");
    assert!(f[0].message.contains("15/16"));
}

#[test]
fn overlapping_cidrs_name_both_nodes_and_the_later_one_is_to_be_recreated() {
    let mut older = node("old", "192.0.2.1", &["10.244.1.0/24"]);
    older.metadata.creation_timestamp = Some(Time(before(7200)));
    let s = snapshot(
        "10.244.0.0/16",
        vec![node("new", "192.0.2.2", &["10.244.1.0/25"]), older],
    );
    let f = run(&s);
    let bad = f.iter().find(|f| f.check == "cidrs").expect("cidrs");
    assert_eq!(bad.status, Status::Fail);
    assert_eq!(bad.nodes, ["new", "old"]);
    assert!(
        bad.message.contains("Node new") && bad.message.contains("Node old"),
        "{}",
        bad.message
    );
    assert!(bad
        .fix
        .as_deref()
        .unwrap_or_default()
        .contains("kubectl delete node new"));
}

#[test]
fn overlaps_are_found_even_without_known_cluster_cidrs() {
    let mut s = snapshot(
        "10.244.0.0/16",
        vec![
            node("a", "192.0.2.1", &["10.1.0.0/24"]),
            node("b", "192.0.2.2", &["10.1.0.0/24"]),
        ],
    );
    s.settings = super::super::snapshot::Settings::resolve(&Default::default(), None);
    let f = run(&s);
    assert_eq!(f[0].status, Status::Warn, "unknown pools: {f:#?}");
    assert!(f
        .iter()
        .any(|f| f.check == "cidrs" && f.status == Status::Fail));
}

#[test]
fn unparsable_and_out_of_range_cidrs_are_reported_with_their_node() {
    let s = snapshot(
        "10.244.0.0/16",
        vec![
            node("a", "192.0.2.1", &["banana"]),
            node("b", "192.0.2.2", &["10.9.0.0/24"]),
        ],
    );
    let f = run(&s);
    let bad: Vec<_> = f.iter().filter(|f| f.check == "cidrs").collect();
    assert_eq!(bad.len(), 2, "{bad:#?}");
    assert!(bad[0].message.contains("unparsable") && bad[0].nodes == ["a"]);
    assert!(bad[1].message.contains("outside every cluster CIDR") && bad[1].nodes == ["b"]);
}

#[test]
fn a_node_waiting_for_no_known_reason_is_a_warning_while_young_and_a_failure_later() {
    let mut young = node("young", "192.0.2.1", &[]);
    young.metadata.creation_timestamp = Some(Time(before(3)));
    let s = snapshot("10.244.0.0/16", vec![young, node("old", "192.0.2.2", &[])]);
    let f = run(&s);
    let waiting: Vec<_> = f.iter().filter(|f| f.check == "waiting").collect();
    assert_eq!(waiting[0].status, Status::Warn);
    assert_eq!(waiting[1].status, Status::Fail);
    assert!(waiting[1]
        .fix
        .as_deref()
        .unwrap_or_default()
        .contains("grep node=old"));
}

#[test]
fn a_waiting_node_shows_the_warning_event_netcm_recorded_on_it() {
    let mut s = snapshot("10.244.0.0/16", vec![node("a", "192.0.2.1", &[])]);
    s.events.push(Event {
        type_: Some("Warning".into()),
        reason: Some("CIDRAssignmentFailed".into()),
        note: Some("denied by policy".into()),
        event_time: Some(MicroTime(before(5))),
        regarding: Some(ObjectReference {
            name: Some("a".into()),
            ..Default::default()
        }),
        ..Default::default()
    });
    let f = run(&s);
    let w = f.iter().find(|f| f.check == "waiting").expect("waiting");
    assert!(
        w.message
            .contains("CIDRAssignmentFailed 5s ago: denied by policy"),
        "{}",
        w.message
    );
}

#[test]
fn without_a_leader_waiting_nodes_point_at_the_leader_check() {
    let mut s = snapshot("10.244.0.0/16", vec![node("a", "192.0.2.1", &[])]);
    s.lease = super::super::snapshot::LeaseState::NotFound;
    let f = run(&s);
    let w = f.iter().find(|f| f.check == "waiting").expect("waiting");
    assert!(w.message.contains("no netcm leads"), "{}", w.message);
}

fn cluster_cidr_object(name: &str, ipv4: &str) -> netcm_ipam::ObjectPool {
    netcm_ipam::ObjectPool {
        name: name.into(),
        uid: format!("{name}-uid"),
        spec: Ok(netcm_ipam::PoolSpec {
            selector: netcm_ipam::NodeSelector::Terms(Vec::new()),
            per_node_host_bits: 8,
            ipv4: Some(ipv4.parse().expect("test CIDR")),
            ipv6: None,
            sizing: None,
        }),
        deleting: false,
        modified: false,
    }
}

#[test]
fn a_cidr_from_a_clustercidr_pool_is_counted_in_that_pool_not_reported_out_of_range() {
    let mut s = snapshot(
        "10.244.0.0/16",
        vec![
            node("a", "192.0.2.1", &["10.244.0.0/24"]),
            node("rack", "192.0.2.2", &["10.128.0.0/24"]),
        ],
    );
    s.object_pools = ObjectPoolsState::Listed(vec![cluster_cidr_object("rack-a", "10.128.0.0/16")]);
    let f = run(&s);
    assert!(f.iter().all(|f| f.status == Status::Ok), "{f:#?}");
    let pool = f
        .iter()
        .find(|f| f.message.starts_with("ClusterCIDR rack-a"))
        .expect("the ClusterCIDR pool's usage");
    assert!(pool.message.contains("1/256"), "{}", pool.message);
    assert!(
        f[0].message.contains("1/256"),
        "flag pool: {}",
        f[0].message
    );
}

#[test]
fn without_clustercidr_objects_the_same_cidr_is_out_of_range() {
    let mut s = snapshot(
        "10.244.0.0/16",
        vec![node("rack", "192.0.2.2", &["10.128.0.0/24"])],
    );
    s.object_pools = ObjectPoolsState::Listed(vec![cluster_cidr_object("rack-a", "10.128.0.0/16")]);
    s.settings.cluster_cidr_objects = Some(false);
    let f = run(&s);
    let bad = f.iter().find(|f| f.check == "cidrs").expect("cidrs");
    assert_ne!(bad.status, Status::Ok, "{f:#?}");
    assert_eq!(bad.nodes, ["rack"]);
}

#[test]
fn a_refused_or_full_clustercidr_and_unlistable_objects_are_reported() {
    let mut s = snapshot(
        "10.244.0.0/16",
        vec![node("rack", "192.0.2.2", &["10.128.0.0/24"])],
    );
    // A /24 of /24s: room for one Node, which rack holds.
    let tiny = cluster_cidr_object("tiny", "10.128.0.0/24");
    s.object_pools =
        ObjectPoolsState::Listed(vec![tiny, cluster_cidr_object("clash", "10.244.0.0/17")]);
    let f = run(&s);
    let full = f
        .iter()
        .find(|f| f.message.starts_with("ClusterCIDR tiny"))
        .expect("tiny's usage");
    assert_eq!(full.status, Status::Fail, "{}", full.message);
    assert!(full.message.contains("1/1") && full.message.contains("full"));
    let refused = f
        .iter()
        .find(|f| f.message.starts_with("ClusterCIDR clash is refused"))
        .expect("clash refused");
    assert_eq!(refused.status, Status::Fail);

    s.object_pools = ObjectPoolsState::Unreadable("forbidden (403 Forbidden)".into());
    let f = run(&s);
    let unread = f
        .iter()
        .find(|f| {
            f.message
                .starts_with("ClusterCIDR objects could not be listed")
        })
        .expect("unreadable");
    assert_eq!(unread.status, Status::Warn);
    s.settings.cluster_cidr_objects = Some(false);
    let f = run(&s);
    assert!(
        !f.iter().any(|f| f.message.starts_with("ClusterCIDR")),
        "a leader that ignores ClusterCIDRs: {f:#?}"
    );
}

/// `name` created `secs` seconds before the fixtures' now.
#[test]
fn a_status_netcm_wrote_without_conditions_is_one_an_older_crd_pruned() {
    use serde_json::json;
    assert!(super::lacks_conditions(Some(&json!({"phase": "Active"}))));
    assert!(!super::lacks_conditions(Some(
        &json!({"phase": "Active", "conditions": []})
    )));
    assert!(
        !super::lacks_conditions(Some(&json!({}))),
        "a status netcm did not write"
    );
    assert!(
        !super::lacks_conditions(None),
        "no status subresource (node-ipam-controller's CRD)"
    );
}

#[test]
fn clustercidrs_without_conditions_are_a_warning_that_names_them_and_the_crd_to_apply() {
    let mut s = snapshot(
        "10.244.0.0/16",
        vec![node("a", "192.0.2.1", &["10.244.0.0/24"])],
    );
    s.object_pools = ObjectPoolsState::Listed(vec![cluster_cidr_object("rack-a", "10.128.0.0/16")]);
    assert!(run(&s).iter().all(|f| f.status == Status::Ok));
    s.pools_without_conditions = ["rack-a", "rack-b", "rack-c", "rack-d"]
        .map(String::from)
        .into();
    let f = run(&s);
    let warn = f
        .iter()
        .find(|f| f.message.contains("without conditions"))
        .expect("the warning");
    assert_eq!(warn.status, Status::Warn, "{}", warn.message);
    assert!(
        warn.message
            .starts_with("ClusterCIDR rack-a, rack-b, rack-c and 1 more:"),
        "{}",
        warn.message
    );
    let fix = warn.fix.as_deref().unwrap_or_default();
    assert!(fix.contains("charts/netcm/crds/clustercidrs.yaml"), "{fix}");
    s.settings.cluster_cidr_objects = Some(false);
    assert!(run(&s)
        .iter()
        .all(|f| !f.message.contains("without conditions")));
}
