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
