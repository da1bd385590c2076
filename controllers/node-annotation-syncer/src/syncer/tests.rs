//! The sync handler's own bookkeeping: netcm's writes, invalid overwrites counted once, deferred agent leases, the waiting gauge.
//! Syncs themselves run against the real API server (e2e/tests/e2e/node_annotation_syncer*).

use super::*;
use netcm_node::Family;

const P: &str = "flannel.alpha.coreos.com/";

/// A syncer whose client points at a closed port: nothing here reaches an API server.
fn syncer() -> Arc<Syncer> {
    let registry = prometheus::Registry::new();
    let config = kube::Config::new("http://127.0.0.1:9".parse().expect("uri"));
    let client = kube::Client::try_from(config).expect("client");
    let flags = crate::Flags {
        annotation_prefix: None,
        route_lease_annotation_prefix: None,
        backend_type: "host-gw".into(),
        public_ip_address_types: vec!["InternalIP".into(), "ExternalIP".into()],
        concurrent_node_annotation_syncs: 1,
    };
    Syncer::new(
        SharedInformer::new(),
        Api::all(client.clone()),
        flags.config().expect("config"),
        EventRecorder::new(client, "netcm", "test"),
        LeaderGuard::disabled(&registry).expect("guard"),
        SyncerMetrics::register(&registry).expect("metrics"),
        netcm_manager::AllocationBacklog::default(),
    )
}

/// The cached Node `n1` with `uid`, at `rv`, with these lease annotations (keys without the prefix).
fn node_of(uid: &str, rv: &str, annotations: &[(&str, &str)]) -> CachedNode {
    let mut b = CachedNode::builder("n1", uid, rv);
    for (k, v) in annotations {
        b.annotation(&format!("{P}{k}"), v);
    }
    b.build()
}

fn node(rv: &str, annotations: &[(&str, &str)]) -> CachedNode {
    node_of("uid-1", rv, annotations)
}

#[tokio::test]
async fn netcms_own_write_counts_until_the_cache_moves_past_the_version_it_was_based_on() {
    let s = syncer();
    let written: BTreeMap<String, String> =
        [(format!("{P}public-ip"), "192.0.2.10".to_string())].into();
    s.state()
        .written
        .insert(name_key("n1"), write_digest("n1", "5", &written));
    assert!(
        s.already_written("n1", &node("5", &[]), &written),
        "the same values planned on the same version are the write the cache has not shown yet"
    );
    assert!(
        !s.already_written("n2", &node("5", &[]), &written),
        "another Node's write is not this one's"
    );
    let other: BTreeMap<String, String> =
        [(format!("{P}public-ip"), "192.0.2.11".to_string())].into();
    assert!(!s.already_written("n1", &node("6", &[]), &other));
    assert!(
        s.state().written.is_empty(),
        "the memory is dropped once the cache moved on"
    );
    assert!(
        !s.already_written("n1", &node("5", &[]), &written),
        "a forgotten write is written again"
    );
}

#[tokio::test]
async fn an_invalid_overwrite_is_counted_once_per_value_and_again_when_it_changes() {
    let s = syncer();
    let bad = |value: &str| InvalidOverwrite {
        family: Family::V4,
        key: format!("{P}public-ip-overwrite"),
        value: value.into(),
        why: "not an IP address",
        instead: Instead::Nothing,
    };
    let n = node("1", &[]);
    let count = || s.metrics.invalid.with_label_values(&["ipv4"]).get();
    s.report_invalid(&n, "n1", &[bad("x")]).await;
    s.report_invalid(&n, "n1", &[bad("x")]).await;
    assert_eq!(count(), 1);
    s.report_invalid(&n, "n1", &[bad("y")]).await;
    assert_eq!(count(), 2);
    // Fixed, then broken again with the first value: that is news again.
    s.report_invalid(&n, "n1", &[]).await;
    s.report_invalid(&n, "n1", &[bad("x")]).await;
    assert_eq!(count(), 3);
}

#[tokio::test]
async fn a_lease_left_to_its_agent_is_counted_once_until_it_is_netcms_again() {
    let s = syncer();
    let gauge = || s.metrics.agent_managed.get();
    let agent = AgentLease {
        managers: ["flanneld".to_string()].into(),
        keys: [format!("{P}backend-type")].into(),
    };
    s.defer("n1", agent.clone(), &Plan::default());
    s.defer("n1", agent, &Plan::default());
    assert_eq!(
        gauge(),
        1,
        "a re-sync of the same verdict counts the Node once"
    );
    s.undefer("n1");
    assert_eq!(gauge(), 0);
    assert!(s.state().deferred.is_empty());
}

#[tokio::test]
async fn the_waiting_gauge_follows_each_node_and_forgets_deleted_ones() {
    let s = syncer();
    let gauge = |r: &str| s.metrics.waiting.with_label_values(&[r]).get();
    s.set_waiting("n1", Some(&Waiting::NoPodCidr));
    s.set_waiting("n2", Some(&Waiting::NoPodCidr));
    assert_eq!(gauge("no_pod_cidr"), 2);
    s.set_waiting("n1", Some(&Waiting::NoAddress(vec![Family::V6])));
    assert_eq!((gauge("no_pod_cidr"), gauge("no_address")), (1, 1));
    s.set_waiting("n1", None);
    s.forget("n2");
    assert_eq!((gauge("no_pod_cidr"), gauge("no_address")), (0, 0));
}
