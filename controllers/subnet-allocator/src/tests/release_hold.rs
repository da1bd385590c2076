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

/// The annotation of a release-hold record of `node` holding `cidr` until `until`, as a leader writes it.
fn record(node: &str, cidr: &str, until: jiff::Timestamp) -> (String, String) {
    let key = format!("release-hold.ipam.netcm.io/v4-{}", cidr.replace('/', "-"));
    let value = json!({ "node": node, "until": until.to_string(), "cidrs": [cidr] });
    (key, value.to_string())
}

/// [`claim`] of `block` by the earlier leader, carrying `records`.
fn claim_with(block: &str, records: &[(String, String)]) -> Value {
    let mut c = claim(block, Some(EARLIER));
    for (k, v) in records {
        c["metadata"]["annotations"][k] = json!(v);
    }
    c
}

/// Minutes from now.
fn in_minutes(m: i64) -> jiff::Timestamp {
    jiff::Timestamp::now()
        .checked_add(jiff::SignedDuration::from_mins(m))
        .expect("a time")
}

#[tokio::test(start_paused = true)]
async fn a_node_back_under_its_name_during_the_quarantine_gets_its_restored_hold_not_a_fresh_cidr()
{
    // A /23 of /30s: blocks of 64 CIDRs, 10.251.0.0/24 and 10.251.1.0/24. The earlier leader's block holds
    // back's CIDR in release hold, and a Node waits: the block is quarantined, the hold restored in it.
    let waiting = node("waiting", &[], &[]);
    let mut t = Allocating::start(
        &[
            "--cluster-cidr=10.251.0.0/23",
            "--node-cidr-mask-size=30",
            "--cidr-release-hold=1h",
        ],
        vec![cached(&waiting)],
    );
    let back_held = record("back", "10.251.0.4/30", in_minutes(30));
    t.prepare_with_claims(vec![claim_with("10.251.0.0/24", &[back_held])])
        .await;
    assert_eq!(
        t.holder_of("10.251.0.4/30").as_deref(),
        Some("release-hold:back")
    );
    // back comes back: free CIDRs lie outside the quarantine, but its own is inside. The quarantine's Node
    // is touched (no earlier write can land any more), then back gets its CIDR from the adopted block.
    let back = node("back", &[], &[]);
    t.watch_shows(&back);
    t.api.expect(touch("waiting").reply(200, body(&waiting)));
    t.api.expect(
        Step::patch(&claim_path("10.251.0.0/24"))
            .content_type(JSON_PATCH)
            .check(|patch| assert_eq!(patch[1]["value"], json!(IDENTITY), "{patch}")),
    );
    t.api.expect(cidr_patch(&back, &["10.251.0.4/30"]));
    t.synced("back").await;
    assert_eq!(held(&t), Some(0.0));
    assert_eq!(
        t.metric(
            "netcm_pool_release_holds_ended_total",
            &[("pool", "default-cluster-cidr"), ("reason", "given_back")]
        ),
        Some(1.0)
    );
    assert!(t.events_on("back").is_empty(), "{:?}", t.events_on("back"));
}

#[tokio::test(start_paused = true)]
async fn hold_records_outside_their_block_are_ignored_far_off_ones_cut_and_a_stale_one_hides_no_live_one(
) {
    let live_node = node("held-now", &["10.251.0.8/30"], &[]);
    let mut t = Allocating::start(&ARGS, vec![cached(&live_node)]);
    let records = [
        // A record left behind: its CIDR went to held-now since, and it ends later than the live one.
        record("back", "10.251.0.8/30", in_minutes(50)),
        // back's live hold.
        record("back", "10.251.0.4/30", in_minutes(20)),
        // A CIDR of another block, written on this claim.
        record("elsewhere", "10.99.0.0/30", in_minutes(20)),
        // Years ahead: restored for one --cidr-release-hold at most.
        record("forever", "10.251.0.12/30", in_minutes(60 * 24 * 365 * 5)),
    ];
    t.prepare_with_claims(vec![claim_with(BLOCK, &records)])
        .await;
    let holds: Vec<(String, Vec<String>)> = {
        let state = t.allocator.state.lock();
        let mut holds: Vec<_> = state
            .pools
            .release_holds()
            .map(|(n, c)| (n.to_string(), c.iter().map(ToString::to_string).collect()))
            .collect();
        holds.sort();
        holds
    };
    assert_eq!(
        holds,
        [
            ("back".to_string(), vec!["10.251.0.4/30".to_string()]),
            ("forever".to_string(), vec!["10.251.0.12/30".to_string()]),
        ]
    );
    let next_end = t.allocator.state.lock().pools.next_release_hold_end();
    assert!(
        next_end.is_some_and(
            |end| end <= std::time::Instant::now() + std::time::Duration::from_secs(3600)
        ),
        "{next_end:?}"
    );
    let distrusted = |reason| {
        t.metric(
            "netcm_pod_cidr_release_hold_records_distrusted_total",
            &[("reason", reason)],
        )
    };
    assert_eq!(distrusted("outside_block"), Some(1.0));
    assert_eq!(distrusted("until_beyond_hold"), Some(1.0));
}

#[tokio::test(start_paused = true)]
async fn every_hold_that_ends_is_counted_and_one_ended_early_is_said_on_the_deleted_nodes_name() {
    let t = four_allocated(["twice-a", "twice-b", "twice-c", "twice-d"], &[]).await;
    deleted(&t, "twice-a", "10.251.0.0/30").await;
    // twice-a comes back while its CIDR is held, and gets it; then that Node is deleted again.
    let again = recreated(node("twice-a", &[], &[]));
    t.watch_shows(&again);
    t.api.expect(cidr_patch(&again, &["10.251.0.0/30"]));
    t.synced("twice-a").await;
    t.ctx.nodes.remove("twice-a");
    t.api.expect(hold_recorded("twice-a", "10.251.0.0/30"));
    t.synced("twice-a").await;
    let ended = |reason| {
        t.metric(
            "netcm_pool_release_holds_ended_total",
            &[("pool", "default-cluster-cidr"), ("reason", reason)],
        )
        .unwrap_or_default()
    };
    assert_eq!(ended("given_back"), 1.0);
    assert_eq!(
        ended("replaced"),
        0.0,
        "the first hold had ended: given back"
    );
    assert!(
        t.events_on("twice-a").is_empty(),
        "given back is no early end"
    );
    // A Node the API shows with twice-a's held CIDR ends the hold: counted, and said on twice-a.
    let restored = node("from-backup", &["10.251.0.0/30"], &[]);
    t.watch_shows(&restored);
    t.synced("from-backup").await;
    assert_eq!(ended("node_holds_cidr"), 1.0);
    let said = t.events_on("twice-a");
    assert!(
        said.iter()
            .any(|(reason, note)| reason == "CIDRReleaseHoldEnded" && note.contains("from-backup")),
        "{said:?}"
    );
    assert_eq!(held(&t), Some(0.0));
}
