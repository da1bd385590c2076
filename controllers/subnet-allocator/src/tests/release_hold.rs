//! `--cidr-release-hold`: a deleted Node's CIDRs are held for its name, recorded on their block's claim,
//! and handed to another Node only by a pool with nothing else free.

use netcm_manager::test_support::harness::IDENTITY;
use netcm_manager::Key;

use super::*;

/// A /28 of /30s: four pod CIDRs, one block; holds last an hour.
const ARGS: [&str; 3] = [
    "--cluster-cidr=10.251.0.0/28",
    "--node-cidr-mask-size=30",
    "--cidr-release-hold=1h",
];

/// The one block of [`ARGS`].
const BLOCK: &str = "10.251.0.0/28";

/// The CIDRs in release hold, as the gauge shows them.
fn held(t: &Allocating) -> Option<f64> {
    t.metric(
        "netcm_pool_release_hold_cidrs",
        &[("family", "IPv4"), ("pool", "default-cluster-cidr")],
    )
}

/// The holds handed out before they ended, as the counter shows them.
fn cut_short(t: &Allocating) -> f64 {
    t.metric(
        "netcm_pool_release_hold_cut_short_total",
        &[("pool", "default-cluster-cidr")],
    )
    .unwrap_or_default()
}

/// The write of the hold of `name`'s `cidr` on the block's claim, for a new leader to find.
fn hold_recorded(name: &'static str, cidr: &'static str) -> Step {
    let key = format!("release-hold.ipam.netcm.io/v4-{}", cidr.replace('/', "-"));
    Step::patch(&claim_path(BLOCK))
        .content_type("application/merge-patch+json")
        .check(move |patch| {
            let value = patch["metadata"]["annotations"][key.as_str()]
                .as_str()
                .unwrap_or_else(|| panic!("no {key} in {patch}"));
            let record: Value = serde_json::from_str(value).expect("the record is JSON");
            assert_eq!(record["node"], name, "{record}");
            assert_eq!(record["cidrs"], json!([cidr]), "{record}");
            assert!(
                record["until"]
                    .as_str()
                    .is_some_and(|u| u.parse::<jiff::Timestamp>().is_ok()),
                "{record}"
            );
        })
}

/// The allocator of [`ARGS`] with `names` allocated in order, the cache holding them and `more`.
async fn four_allocated(names: [&str; 4], more: &[Node]) -> Allocating {
    let nodes: Vec<Node> = names.iter().map(|n| node(n, &[], &[])).collect();
    let mut t = Allocating::start(&ARGS, nodes.iter().chain(more).map(cached).collect());
    t.prepare_with_claims(vec![]).await;
    t.api
        .expect(claim_create(BLOCK, IDENTITY).reply(201, json!({})));
    for (i, n) in nodes.iter().enumerate() {
        t.api
            .expect(cidr_patch(n, &[&format!("10.251.0.{}/30", 4 * i)]));
        t.synced(names[i]).await;
    }
    t
}

/// The watch tells the Node `name` is gone, and its sync releases it into the hold.
async fn deleted(t: &Allocating, name: &'static str, cidr: &'static str) {
    t.ctx.nodes.remove(name);
    t.api.expect(hold_recorded(name, cidr));
    t.synced(name).await;
}

#[tokio::test(start_paused = true)]
async fn a_deleted_nodes_cidr_comes_back_to_its_name_and_goes_to_another_node_only_from_a_full_pool(
) {
    let t = four_allocated(["hold-a", "hold-b", "hold-c", "hold-d"], &[]).await;
    // a first, then b: a's hold is the older one.
    deleted(&t, "hold-a", "10.251.0.0/30").await;
    deleted(&t, "hold-b", "10.251.0.4/30").await;
    assert_eq!(held(&t), Some(2.0));
    // Round-robin alone would give the next Node a's CIDR, the first free one after d's.
    let b = recreated(node("hold-b", &[], &[]));
    t.watch_shows(&b);
    t.api.expect(cidr_patch(&b, &["10.251.0.4/30"]));
    t.synced("hold-b").await;
    assert_eq!(held(&t), Some(1.0));
    assert_eq!(cut_short(&t), 0.0);
    // Nothing else is free: the full pool hands out a's CIDR before its hold ends, and says so.
    let newcomer = node("newcomer", &[], &[]);
    t.watch_shows(&newcomer);
    t.api.expect(cidr_patch(&newcomer, &["10.251.0.0/30"]));
    t.synced("newcomer").await;
    assert!(t
        .events_on("newcomer")
        .iter()
        .any(|(reason, _)| reason == "CIDRReleaseHoldCutShort"));
    assert_eq!(cut_short(&t), 1.0);
    assert_eq!(held(&t), Some(0.0));
}

#[tokio::test(start_paused = true)]
async fn a_node_waiting_on_a_full_pool_is_woken_by_a_release_hold_and_gets_the_held_cidr_before_its_backoff(
) {
    let waiting = node("waiting", &[], &[]);
    let t = four_allocated(
        ["wake-a", "wake-b", "wake-c", "wake-d"],
        std::slice::from_ref(&waiting),
    )
    .await;
    let outcome = t.sync("waiting").await;
    assert!(
        matches!(outcome, Err(SyncError::NoCidrAvailable(_))),
        "{outcome:?}"
    );
    // Parked at a backoff of seconds, as a worker's retries leave it.
    let (queue, key): (_, Key) = (&t.allocator.queue, "waiting".into());
    for _ in 0..10 {
        queue.add_rate_limited(key.clone());
        assert_eq!(queue.get().await, Some(key.clone()));
        queue.done(&key);
    }
    queue.add_rate_limited(key.clone());
    deleted(&t, "wake-c", "10.251.0.8/30").await;
    let woken = tokio::time::Instant::now();
    assert_eq!(queue.get().await, Some(key.clone()));
    assert!(
        woken.elapsed() < std::time::Duration::from_secs(1),
        "woken after {:?}, by its backoff rather than the hold",
        woken.elapsed()
    );
    queue.done(&key);
    t.api.expect(cidr_patch(&waiting, &["10.251.0.8/30"]));
    t.synced("waiting").await;
    assert_eq!(cut_short(&t), 1.0, "the pool had nothing else free");
}
