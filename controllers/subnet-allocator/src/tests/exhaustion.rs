//! A full pool: the Node that finds no CIDR is told so, and woken by the next release.

use std::time::Duration;

use netcm_manager::test_support::harness::IDENTITY;
use netcm_manager::Key;

use super::*;

#[tokio::test(start_paused = true)]
async fn an_exhausted_pool_reports_cidr_not_available_and_a_released_cidr_wakes_the_waiting_node_before_its_backoff(
) {
    // A /28 of /30s: four CIDRs, one block.
    let small: Vec<Node> = (0..4)
        .map(|i| node(&format!("small-{i}"), &[], &[]))
        .collect();
    let waiting = node("waiting", &[], &[]);
    let mut t = Allocating::start(
        &["--cluster-cidr=10.250.0.0/28", "--node-cidr-mask-size=30"],
        small.iter().chain([&waiting]).map(cached).collect(),
    );
    t.prepare_with_claims(vec![]).await;
    t.api
        .expect(claim_create("10.250.0.0/28", IDENTITY).reply(201, json!({})));
    for (i, n) in small.iter().enumerate() {
        t.api
            .expect(cidr_patch(n, &[&format!("10.250.0.{}/30", 4 * i)]));
        t.synced(&format!("small-{i}")).await;
    }
    let outcome = t.sync("waiting").await;
    assert!(
        matches!(outcome, Err(SyncError::NoCidrAvailable(_))),
        "{outcome:?}"
    );
    assert!(t
        .events_on("waiting")
        .iter()
        .any(|(reason, _)| reason == "CIDRNotAvailable"));
    assert_eq!(
        t.metric(
            "node_ipam_controller_cidrset_usage_cidrs",
            &[("clusterCIDR", "10.250.0.0/28")]
        ),
        Some(1.0),
        "a full pool shows usage 1"
    );
    // As a worker retries it, its backoff grows to seconds: parked.
    let queue = &t.allocator.queue;
    let key: Key = "waiting".into();
    for _ in 0..10 {
        queue.add_rate_limited(key.clone());
        assert_eq!(queue.get().await, Some(key.clone()));
        queue.done(&key);
    }
    queue.add_rate_limited(key.clone());
    // A Node is deleted: its release wakes the waiting one at once.
    t.ctx.nodes.remove("small-1");
    t.synced("small-1").await;
    let woken = tokio::time::Instant::now();
    assert_eq!(queue.get().await, Some(key.clone()));
    assert!(
        woken.elapsed() < Duration::from_secs(1),
        "woken after {:?}, by its backoff rather than the release",
        woken.elapsed()
    );
    queue.done(&key);
    t.api.expect(cidr_patch(&waiting, &["10.250.0.4/30"]));
    t.synced("waiting").await;
}

/// The pool "big": 10.251.0.0/28, one /28 node CIDR, for the Nodes named in `names` (by
/// `metadata.name`, so no labels are read).
fn big_pool(names: &[&str]) -> netcm_ipam::ObjectPool {
    netcm_ipam::ObjectPool {
        name: "big".into(),
        uid: "uid-big".into(),
        spec: Ok(netcm_ipam::PoolSpec {
            selector: netcm_ipam::NodeSelector::Terms(vec![netcm_ipam::SelectorTerm {
                match_expressions: vec![],
                match_fields: vec![netcm_ipam::Requirement {
                    key: "metadata.name".into(),
                    operator: "In".parse().expect("operator"),
                    values: names.iter().map(|n| n.to_string()).collect(),
                }],
            }]),
            per_node_host_bits: 4,
            ipv4: Some("10.251.0.0/28".parse().expect("range")),
            ipv6: None,
            sizing: None,
        }),
        deleting: false,
        modified: false,
    }
}

#[tokio::test(start_paused = true)]
async fn a_release_wakes_only_as_many_waiting_nodes_as_it_frees_cidrs_and_only_those_its_pool_serves(
) {
    // The flag pool: a /29 of /30s, f0 and f1 hold both. The pool "big": one /28, big-0 holds it.
    let names = ["f0", "f1", "big-0", "w1", "w2", "wb"];
    let nodes: Vec<Node> = names.iter().map(|n| node(n, &[], &[])).collect();
    let mut t = Allocating::start(
        &["--cluster-cidr=10.250.0.0/29", "--node-cidr-mask-size=30"],
        nodes.iter().map(cached).collect(),
    );
    t.allocator
        .state
        .lock()
        .pools
        .sync_objects(&[big_pool(&["big-0", "wb"])]);
    t.prepare_with_claims(vec![]).await;
    t.api
        .expect(claim_create("10.250.0.0/29", IDENTITY).reply(201, json!({})));
    t.api.expect(cidr_patch(&nodes[0], &["10.250.0.0/30"]));
    t.synced("f0").await;
    t.api.expect(cidr_patch(&nodes[1], &["10.250.0.4/30"]));
    t.synced("f1").await;
    t.api
        .expect(claim_create("10.251.0.0/28", IDENTITY).reply(201, json!({})));
    t.api.expect(cidr_patch(&nodes[2], &["10.251.0.0/28"]));
    t.synced("big-0").await;
    // w1, w2 wait on the flag pool; wb on "big" and the flag pool (a fallback serves every Node).
    for waiting in ["w1", "w2", "wb"] {
        let outcome = t.sync(waiting).await;
        assert!(
            matches!(outcome, Err(SyncError::NoCidrAvailable(_))),
            "{outcome:?}"
        );
    }
    let queue = &t.allocator.queue;
    assert_eq!(queue.len(), 0);

    // big-0's CIDR serves only wb.
    t.ctx.nodes.remove("big-0");
    t.synced("big-0").await;
    assert_eq!(queue.len(), 1, "one CIDR of big freed: only wb is woken");
    let wb: Key = "wb".into();
    assert_eq!(queue.get().await, Some(wb.clone()));
    queue.done(&wb);

    // One flag CIDR serves one of the three: the one waiting longest.
    t.ctx.nodes.remove("f1");
    t.synced("f1").await;
    assert_eq!(queue.len(), 1, "one CIDR freed: one Node woken");
    let w1: Key = "w1".into();
    assert_eq!(queue.get().await, Some(w1.clone()));
    queue.done(&w1);
}
