//! The quarantine on earlier leaders' open claims: their free CIDRs are held until every Node they may
//! still be writing to is settled, and the Nodes are touched when no free CIDR is left outside.

use std::time::Duration;

use netcm_manager::test_support::harness::IDENTITY;

use super::*;

/// What the quarantine's Nodes gauge shows.
fn quarantined_nodes(t: &Allocating) -> Option<f64> {
    t.metric("netcm_pod_cidr_quarantine_nodes", &[])
}

/// `node` with the fence annotation the touch of it set, as the watch brings it after the touch.
fn touched(t: &Allocating, node: &Node) -> Node {
    let name = node.metadata.name.clone().unwrap_or_default();
    let stamp = fence_set(&t.api, &node_path(&name));
    let mut touched = node.clone();
    touched
        .metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(FENCED_AT_ANNOTATION.to_string(), stamp);
    touched
}

#[tokio::test(start_paused = true)]
async fn an_earlier_versions_smaller_block_inside_a_block_netcm_claims_keeps_its_free_cidrs_quarantined(
) {
    // An earlier version cut blocks of 64 and claimed 10.192.0.0/22; in a /12 of /28s this one cuts
    // blocks of 256, so its first block, 10.192.0.0/20 — another claim name, created without a 409 —
    // contains that one. "inflight" may still get the earlier leader's PATCH with any free CIDR of the
    // /22: the quarantine holds them by range, not by claim name.
    let settled = node("settled", &["10.192.0.0/28"], &[]);
    let inflight = node("inflight", &[], &[]);
    let mut t = Allocating::start(
        &["--cluster-cidr=10.192.0.0/12", "--node-cidr-mask-size=28"],
        vec![cached(&settled), cached(&inflight)],
    );
    t.prepare_with_claims(vec![claim("10.192.0.0/22", None)])
        .await;
    assert_eq!(quarantined_nodes(&t), Some(1.0));
    assert_eq!(
        t.holder_of("10.192.0.16/28").as_deref(),
        Some("claim:quarantine")
    );
    t.api.expect(
        claim_create("10.192.0.0/20", IDENTITY).reply(201, claim("10.192.0.0/20", Some(IDENTITY))),
    );
    t.api.expect(cidr_patch(&inflight, &["10.192.4.0/28"]));
    t.synced("inflight").await;
    // Its write landed, so nothing of an earlier leader's can land on it: the last Node is settled.
    assert_eq!(quarantined_nodes(&t), Some(0.0));
    assert_eq!(t.holder_of("10.192.0.16/28"), None, "usable again");
    // More Nodes come from the block already claimed: one claim per block, not per CIDR.
    for (i, cidr) in ["10.192.4.16/28", "10.192.4.32/28", "10.192.4.48/28"]
        .into_iter()
        .enumerate()
    {
        let m = node(&format!("m{i}"), &[], &[]);
        t.watch_shows(&m);
        t.api.expect(cidr_patch(&m, &[cidr]));
        t.synced(&format!("m{i}")).await;
    }
    let creates = t
        .api
        .requests()
        .iter()
        .filter(|r| r.method.as_str() == "POST")
        .count();
    assert_eq!(creates, 1, "only the block of 256 around the earlier one");
}

#[tokio::test(start_paused = true)]
async fn nodes_waiting_at_a_takeover_are_touched_and_served_when_earlier_leaders_blocks_hold_every_free_cidr(
) {
    // The whole cluster CIDR (64 /28s) is one block an earlier leader claimed, and two Nodes wait for
    // CIDRs: its PATCH for either may still be on its way, and no free CIDR lies outside its block.
    let (a, b) = (node("waiting-a", &[], &[]), node("waiting-b", &[], &[]));
    let mut t = Allocating::start(
        &["--cluster-cidr=10.202.0.0/22", "--node-cidr-mask-size=28"],
        vec![cached(&a), cached(&b)],
    );
    t.prepare_with_claims(vec![claim("10.202.0.0/22", Some(EARLIER))])
        .await;
    assert_eq!(quarantined_nodes(&t), Some(2.0));
    // A touch of each voids any PATCH of the earlier leader's (it tests the fence as it saw it) ...
    t.api.expect_in_any_order([
        touch("waiting-a").reply(200, body(&a)),
        touch("waiting-b").reply(200, body(&b)),
    ]);
    let outcome = t.sync("waiting-a").await;
    // ... and this Node's cache is older than its touch: a PATCH from it would be refused.
    assert!(
        matches!(outcome, Ok(SyncOutcome::RetryAfter(d)) if d == Duration::from_secs(1)),
        "{outcome:?}"
    );
    assert_eq!(quarantined_nodes(&t), Some(0.0));
    let (a, b) = (touched(&t, &a), touched(&t, &b));
    t.watch_shows(&a);
    t.watch_shows(&b);
    // The earlier leader's claim is adopted, testing it still names that leader, not created again.
    t.api.expect(
        Step::patch(&claim_path("10.202.0.0/22"))
            .content_type(JSON_PATCH)
            .json(json!([
                { "op": "test", "path": "/metadata/annotations/ipam.netcm.io~1term", "value": EARLIER },
                { "op": "add", "path": "/metadata/annotations/ipam.netcm.io~1term", "value": IDENTITY },
                { "op": "add", "path": "/metadata/annotations/ipam.netcm.io~1idle-since", "value": "" },
                { "op": "remove", "path": "/metadata/annotations/ipam.netcm.io~1idle-since" },
            ])),
    );
    t.api.expect(cidr_patch(&a, &["10.202.0.0/28"]));
    t.synced("waiting-a").await;
    t.api.expect(cidr_patch(&b, &["10.202.0.16/28"]));
    t.synced("waiting-b").await;
}

#[tokio::test(start_paused = true)]
async fn a_node_whose_touch_the_api_refuses_keeps_the_quarantine_on_until_a_late_write_to_it_is_recorded(
) {
    // A /26 of /28s, one block an earlier leader claimed: three Nodes hold CIDRs, two wait, and the last
    // free CIDR may be on its way to either in that leader's PATCH.
    let mut nodes: Vec<Node> = ["10.207.0.0/28", "10.207.0.16/28", "10.207.0.32/28"]
        .iter()
        .enumerate()
        .map(|(i, cidr)| node(&format!("held-{i}"), &[cidr], &[]))
        .collect();
    let untouchable = node("untouchable", &[], &[("example.com/agent", "present")]);
    let waiting = node("waiting", &[], &[]);
    nodes.extend([untouchable.clone(), waiting.clone()]);
    let mut t = Allocating::start(
        &["--cluster-cidr=10.207.0.0/26", "--node-cidr-mask-size=28"],
        nodes.iter().map(cached).collect(),
    );
    t.prepare_with_claims(vec![claim("10.207.0.0/26", Some(EARLIER))])
        .await;
    let policy = "admission policy: node untouchable may not be fenced";
    // An admission policy refuses the touch with 422, as for a re-created Node: the live Node tells.
    t.api.expect_in_any_order([
        touch("untouchable").reply_status(422, "Invalid", policy),
        touch("waiting").reply(200, body(&waiting)),
    ]);
    t.api
        .expect(Step::get("/api/v1/nodes/untouchable").reply(200, body(&untouchable)));
    let outcome = t.sync("waiting").await;
    assert!(
        matches!(outcome, Ok(SyncOutcome::RetryAfter(_))),
        "{outcome:?}"
    );
    assert_eq!(
        quarantined_nodes(&t),
        Some(1.0),
        "it still waits for untouchable"
    );
    let refused = t.events_on("untouchable");
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert_eq!(refused[0].0, "CIDRQuarantineTouchRefused");
    assert!(refused[0].1.contains(policy), "{refused:?}");
    // "waiting" is not served from the quarantine: it is touched again, then told none is free.
    let waiting = touched(&t, &waiting);
    t.watch_shows(&waiting);
    t.api
        .expect(touch("untouchable").reply_status(422, "Invalid", policy));
    t.api
        .expect(Step::get("/api/v1/nodes/untouchable").reply(200, body(&untouchable)));
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
        t.holder_of("10.207.0.48/28").as_deref(),
        Some("claim:quarantine")
    );
    // The earlier leader's write for "untouchable" lands: its touch never did, so its fence is unchanged.
    t.watch_shows(&node(
        "untouchable",
        &["10.207.0.48/28"],
        &[("example.com/agent", "present")],
    ));
    t.synced("untouchable").await;
    assert_eq!(
        quarantined_nodes(&t),
        Some(0.0),
        "recorded, it settles the quarantine"
    );
    assert_eq!(
        t.holder_of("10.207.0.48/28").as_deref(),
        Some("uid-untouchable"),
        "held by the node the earlier leader wrote it to"
    );
    let outcome = t.sync("waiting").await;
    assert!(
        matches!(outcome, Err(SyncError::NoCidrAvailable(_))),
        "no second node gets it: {outcome:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn an_earlier_leaders_write_the_watch_brings_while_the_claims_are_listed_is_recorded_before_the_quarantine_starts(
) {
    // A /26 of /28s, one block an earlier leader claimed. "late" had no pod CIDRs when the new leader
    // recorded the cache; that leader's PATCH for it lands, and the watch brings it, while the claims are
    // listed: the quarantine must not start with its CIDR free and "late" not waiting.
    let (late, other) = (node("late", &[], &[]), node("other", &[], &[]));
    let mut t = Allocating::start(
        &["--cluster-cidr=10.209.0.0/26", "--node-cidr-mask-size=28"],
        vec![cached(&late), cached(&other)],
    );
    let nodes = t.ctx.nodes.clone();
    let written = node("late", &["10.209.0.0/28"], &[]);
    t.api.expect(
        Step::get(CLAIMS)
            .check(move |_| nodes.apply(cached(&written)))
            .reply(200, claim_list(vec![claim("10.209.0.0/26", Some(EARLIER))])),
    );
    t.prepare().await;
    assert_eq!(
        t.holder_of("10.209.0.0/28").as_deref(),
        Some("uid-late"),
        "recorded for the node it landed on"
    );
    assert_eq!(quarantined_nodes(&t), Some(1.0), "only \"other\" waits");
    // No free CIDR outside the block: "other" is touched, which ends the quarantine ...
    t.api.expect(touch("other").reply(200, body(&other)));
    let outcome = t.sync("other").await;
    assert!(
        matches!(outcome, Ok(SyncOutcome::RetryAfter(_))),
        "{outcome:?}"
    );
    assert_eq!(quarantined_nodes(&t), Some(0.0));
    // ... and what it frees does not include the CIDR "late" holds.
    let other = touched(&t, &other);
    t.watch_shows(&other);
    t.api
        .expect(Step::patch(&claim_path("10.209.0.0/26")).content_type(JSON_PATCH));
    t.api.expect(cidr_patch(&other, &["10.209.0.16/28"]));
    t.synced("other").await;
}

/// A takeover where the API refuses for good (`code`, `message`) to touch "untouchable", a Node waiting
/// for pod CIDRs, while the only free CIDRs lie in an earlier leader's open block: "untouchable" is given
/// one of them first — its own PATCH voids the earlier leader's, since pod CIDRs are set once — and the
/// quarantine ends with it, so "waiting" is served from the rest.
async fn the_last_untouchable_node_is_served_first_from_the_quarantine(
    code: u16,
    reason: &str,
    message: &str,
) {
    // A /26 of /28s, one block an earlier leader claimed: two Nodes hold CIDRs, two wait.
    let held = [
        node("held-0", &["10.211.0.0/28"], &[]),
        node("held-1", &["10.211.0.16/28"], &[]),
    ];
    let untouchable = node("untouchable", &[], &[("example.com/agent", "present")]);
    let waiting = node("waiting", &[], &[]);
    let mut t = Allocating::start(
        &["--cluster-cidr=10.211.0.0/26", "--node-cidr-mask-size=28"],
        held.iter()
            .chain([&untouchable, &waiting])
            .map(cached)
            .collect(),
    );
    t.prepare_with_claims(vec![claim("10.211.0.0/26", Some(EARLIER))])
        .await;
    t.api.expect_in_any_order([
        touch("untouchable").reply_status(code, reason, message),
        touch("waiting").reply(200, body(&waiting)),
    ]);
    t.api
        .expect(Step::get("/api/v1/nodes/untouchable").reply(200, body(&untouchable)));
    let outcome = t.sync("waiting").await;
    assert!(
        matches!(outcome, Ok(SyncOutcome::RetryAfter(_))),
        "{outcome:?}"
    );
    assert_eq!(quarantined_nodes(&t), Some(1.0));
    assert_eq!(
        t.metric("netcm_pod_cidr_quarantine_touch_refused_nodes", &[]),
        Some(1.0)
    );
    let refused = t.events_on("untouchable");
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert_eq!(refused[0].0, "CIDRQuarantineTouchRefused");
    assert!(refused[0].1.contains(message), "{refused:?}");
    // Its own sync takes a CIDR of the quarantine: the earlier leader's claim is adopted as listed, and the
    // PATCH tests the fence the touch could not move.
    t.api.expect(
        Step::patch(&claim_path("10.211.0.0/26"))
            .content_type(JSON_PATCH)
            .json(json!([
                { "op": "test", "path": "/metadata/annotations/ipam.netcm.io~1term", "value": EARLIER },
                { "op": "add", "path": "/metadata/annotations/ipam.netcm.io~1term", "value": IDENTITY },
                { "op": "add", "path": "/metadata/annotations/ipam.netcm.io~1idle-since", "value": "" },
                { "op": "remove", "path": "/metadata/annotations/ipam.netcm.io~1idle-since" },
            ])),
    );
    t.api.expect(cidr_patch(&untouchable, &["10.211.0.32/28"]));
    t.synced("untouchable").await;
    assert_eq!(
        quarantined_nodes(&t),
        Some(0.0),
        "its CIDRs end the quarantine"
    );
    assert_eq!(
        t.metric("netcm_pod_cidr_quarantine_touch_refused_nodes", &[]),
        Some(0.0)
    );
    assert_eq!(
        t.holder_of("10.211.0.32/28").as_deref(),
        Some("uid-untouchable")
    );
    // The other Node is served from what the quarantine held.
    let waiting = touched(&t, &waiting);
    t.watch_shows(&waiting);
    t.api.expect(cidr_patch(&waiting, &["10.211.0.48/28"]));
    t.synced("waiting").await;
}

#[tokio::test(start_paused = true)]
async fn a_node_whose_touch_the_annotation_size_limit_refuses_is_served_first_from_the_quarantine_and_then_everyone_else(
) {
    the_last_untouchable_node_is_served_first_from_the_quarantine(
        422,
        "Invalid",
        "Node \"untouchable\" is invalid: metadata.annotations: Too long: must have at most 262144 bytes",
    )
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_node_whose_touch_an_admission_policy_forbids_is_served_first_from_the_quarantine_and_then_everyone_else(
) {
    the_last_untouchable_node_is_served_first_from_the_quarantine(
        403,
        "Forbidden",
        "admission webhook \"fence.example.com\" denied the request: netcm may not annotate this node",
    )
    .await;
}

#[tokio::test(start_paused = true)]
async fn two_nodes_whose_touch_is_refused_are_not_given_cidrs_of_the_quarantine_since_one_may_be_on_its_way_to_the_other(
) {
    let held = [
        node("held-0", &["10.212.0.0/28"], &[]),
        node("held-1", &["10.212.0.16/28"], &[]),
    ];
    let (a, b) = (
        node("untouchable-a", &[], &[("example.com/agent", "present")]),
        node("untouchable-b", &[], &[("example.com/agent", "present")]),
    );
    let mut t = Allocating::start(
        &["--cluster-cidr=10.212.0.0/26", "--node-cidr-mask-size=28"],
        held.iter().chain([&a, &b]).map(cached).collect(),
    );
    t.prepare_with_claims(vec![claim("10.212.0.0/26", Some(EARLIER))])
        .await;
    let policy = "admission webhook \"fence.example.com\" denied the request";
    t.api.expect_in_any_order([
        touch("untouchable-a").reply_status(403, "Forbidden", policy),
        touch("untouchable-b").reply_status(403, "Forbidden", policy),
        Step::get("/api/v1/nodes/untouchable-a").reply(200, body(&a)),
        Step::get("/api/v1/nodes/untouchable-b").reply(200, body(&b)),
    ]);
    let outcome = t.sync("untouchable-a").await;
    assert!(
        matches!(outcome, Err(SyncError::NoCidrAvailable(_))),
        "no PATCH: {outcome:?}"
    );
    assert_eq!(
        t.metric("netcm_pod_cidr_quarantine_touch_refused_nodes", &[]),
        Some(2.0)
    );
    assert_eq!(
        t.holder_of("10.212.0.32/28").as_deref(),
        Some("claim:quarantine")
    );
}
