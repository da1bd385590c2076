//! A takeover from a leader whose writes claims cannot cover: waited out, then voided.

use std::time::Duration;

use netcm_manager::published::EffectiveConfiguration;
use netcm_manager::test_support::harness::IDENTITY;

use super::*;

/// How long after the takeover the earlier leader's writes may still land.
const WAIT: Duration = Duration::from_secs(20);

/// The earlier leader ran the allocator without PodCIDRClaims.
fn without_claims() -> Takeover {
    Takeover {
        previous_holder: EARLIER.into(),
        previous_configuration: Some(EffectiveConfiguration {
            identity: EARLIER.into(),
            version: "0.1.0".into(),
            controllers: vec!["subnet-allocator".into()],
            flags: [
                ("--pod-cidr-claims", "false"),
                ("--cluster-cidr", "10.244.0.0/20"),
                ("--node-cidr-mask-size", "28"),
            ]
            .map(|(f, v)| (f.to_string(), v.to_string()))
            .into(),
        }),
        writes_may_land_until: std::time::Instant::now() + WAIT,
        replaced: true,
    }
}

#[tokio::test(start_paused = true)]
async fn after_a_leader_without_claims_the_allocator_waits_lists_the_nodes_and_touches_every_one_without_pod_cidrs_before_its_first_patch(
) {
    let start = tokio::time::Instant::now();
    let (n1, n2, n3) = (
        node("n1", &[], &[]),
        node("n2", &[], &[]),
        node("n3", &[], &[]),
    );
    let mut t = Allocating::taking_over(
        &["--cluster-cidr=10.244.0.0/20", "--node-cidr-mask-size=28"],
        vec![cached(&n1), cached(&n2), cached(&n3)],
        Some(without_claims()),
    );
    // The earlier leader's write to n3 landed after this leader's cache saw n3: only a consistent
    // list shows it.
    let n3_written = node("n3", &["10.244.0.0/28"], &[]);
    t.api.expect(
        Step::get("/api/v1/nodes")
            .query("limit=500")
            .reply(200, node_list(&[n1.clone(), n2.clone(), n3_written])),
    );
    t.api.expect_in_any_order([
        touch("n1").reply(200, body(&n1)),
        touch("n2").reply(200, body(&n2)),
    ]);
    t.api
        .expect(Step::get(CLAIMS).reply(200, claim_list(vec![])));
    t.prepare().await;
    let seen = t.api.requests();
    assert!(
        seen[0].at >= start + WAIT,
        "nothing is sent before the earlier leader's writes can no longer land: the list came {:?} after the takeover",
        seen[0].at - start
    );
    assert_eq!(
        t.metric("netcm_pod_cidr_predecessor_quarantine", &[]),
        Some(0.0)
    );
    assert_eq!(t.holder_of("10.244.0.0/28").as_deref(), Some("uid-n3"));
    // The watch brings n1 as its touch left it; its PATCH tests that fence, and its CIDR is not n3's.
    let mut touched = n1.clone();
    touched.metadata.annotations = Some(
        [(
            FENCED_AT_ANNOTATION.to_string(),
            fence_set(&t.api, "/api/v1/nodes/n1"),
        )]
        .into(),
    );
    t.watch_shows(&touched);
    t.api
        .expect(claim_create("10.244.0.0/22", IDENTITY).reply(201, json!({})));
    t.api.expect(cidr_patch(&touched, &["10.244.0.16/28"]));
    t.synced("n1").await;
    let mut order: Vec<String> = t
        .api
        .requests()
        .iter()
        .map(|r| format!("{} {}", r.method, r.path))
        .collect();
    order[1..3].sort();
    assert_eq!(
        order,
        [
            "GET /api/v1/nodes",
            "PATCH /api/v1/nodes/n1",
            "PATCH /api/v1/nodes/n2",
            "GET /apis/ipam.netcm.io/v1alpha1/podcidrclaims",
            "POST /apis/ipam.netcm.io/v1alpha1/podcidrclaims",
            "PATCH /api/v1/nodes/n1",
        ]
    );
}

/// The flags of the allocator under test in this module.
const FLAGS: [&str; 2] = ["--cluster-cidr=10.244.0.0/20", "--node-cidr-mask-size=28"];

/// A takeover from a leader without claims where the API refuses for good (`code`, `reason`, `message`)
/// to touch "untouchable", a Node without pod CIDRs, and touches "waiting": "untouchable" is given its
/// CIDRs before the workers start — its own PATCH stands in for the touch — and "waiting" is served
/// after it.
async fn the_one_node_whose_touch_is_refused_is_allocated_first_then_everyone_else(
    code: u16,
    reason: &str,
    message: &str,
) {
    let held = node("held", &["10.244.0.0/28"], &[]);
    let untouchable = node("untouchable", &[], &[("example.com/agent", "present")]);
    let waiting = node("waiting", &[], &[]);
    let mut t = Allocating::taking_over(
        &FLAGS,
        [&held, &untouchable, &waiting].map(cached).into(),
        Some(without_claims()),
    );
    t.api
        .expect(Step::get("/api/v1/nodes").query("limit=500").reply(
            200,
            node_list(&[held, untouchable.clone(), waiting.clone()]),
        ));
    t.api.expect_in_any_order([
        touch("untouchable").reply_status(code, reason, message),
        touch("waiting").reply(200, body(&waiting)),
    ]);
    t.api
        .expect(Step::get("/api/v1/nodes/untouchable").reply(200, body(&untouchable)));
    t.api
        .expect(Step::get(CLAIMS).reply(200, claim_list(vec![])));
    t.api
        .expect(claim_create("10.244.0.0/22", IDENTITY).reply(201, json!({})));
    t.api.expect(cidr_patch(&untouchable, &["10.244.0.16/28"]));
    t.prepare().await;
    assert_eq!(
        t.holder_of("10.244.0.16/28").as_deref(),
        Some("uid-untouchable")
    );
    assert_eq!(
        t.metric("netcm_pod_cidr_predecessor_quarantine", &[]),
        Some(0.0)
    );
    assert_eq!(
        t.metric("netcm_pod_cidr_predecessor_touch_refused_nodes", &[]),
        Some(0.0)
    );
    let refused = t.events_on("untouchable");
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert_eq!(refused[0].0, "CIDRPredecessorTouchRefused");
    assert!(refused[0].1.contains(message), "{refused:?}");
    // The workers start: "waiting", as its touch left it, gets the next CIDR of the block claimed.
    let mut touched = waiting.clone();
    touched.metadata.annotations = Some(
        [(
            FENCED_AT_ANNOTATION.to_string(),
            fence_set(&t.api, "/api/v1/nodes/waiting"),
        )]
        .into(),
    );
    t.watch_shows(&touched);
    t.api.expect(cidr_patch(&touched, &["10.244.0.32/28"]));
    t.synced("waiting").await;
}

#[tokio::test(start_paused = true)]
async fn after_a_leader_without_claims_a_node_whose_touch_the_annotation_size_limit_refuses_is_allocated_first_and_then_everyone_else(
) {
    the_one_node_whose_touch_is_refused_is_allocated_first_then_everyone_else(
        422,
        "Invalid",
        "Node \"untouchable\" is invalid: metadata.annotations: Too long: must have at most 262144 bytes",
    )
    .await;
}

#[tokio::test(start_paused = true)]
async fn after_a_leader_without_claims_a_node_whose_touch_an_admission_webhook_forbids_is_allocated_first_and_then_everyone_else(
) {
    the_one_node_whose_touch_is_refused_is_allocated_first_then_everyone_else(
        403,
        "Forbidden",
        "admission webhook \"fence.example.com\" denied the request: netcm may not annotate this node",
    )
    .await;
}

/// A takeover from a leader without claims, scripted up to the claim of the first block: "untouchable"
/// and "waiting", both without pod CIDRs, are listed; the API refuses for good (`code`, `reason`,
/// `message`) to touch "untouchable" and touches "waiting"; "untouchable" is read back unchanged. What is
/// sent next is the test's to script. Returns the allocator and both Nodes.
fn taking_over_with_one_untouchable(
    code: u16,
    reason: &str,
    message: &str,
) -> (Allocating, Node, Node) {
    let untouchable = node("untouchable", &[], &[("example.com/agent", "present")]);
    let waiting = node("waiting", &[], &[]);
    let t = Allocating::taking_over(
        &FLAGS,
        [&untouchable, &waiting].map(cached).into(),
        Some(without_claims()),
    );
    t.api.expect(
        Step::get("/api/v1/nodes")
            .query("limit=500")
            .reply(200, node_list(&[untouchable.clone(), waiting.clone()])),
    );
    t.api.expect_in_any_order([
        touch("untouchable").reply_status(code, reason, message),
        touch("waiting").reply(200, body(&waiting)),
    ]);
    t.api
        .expect(Step::get("/api/v1/nodes/untouchable").reply(200, body(&untouchable)));
    t.api
        .expect(Step::get(CLAIMS).reply(200, claim_list(vec![])));
    t.api
        .expect(claim_create("10.244.0.0/22", IDENTITY).reply(201, json!({})));
    (t, untouchable, waiting)
}

#[tokio::test(start_paused = true)]
async fn when_the_earlier_leaders_write_lands_on_the_untouchable_node_before_ours_its_cidr_is_recorded_before_any_other_node_is_allocated(
) {
    let too_long = "Node \"untouchable\" is invalid: metadata.annotations: Too long: must have at most 262144 bytes";
    let (mut t, untouchable, waiting) = taking_over_with_one_untouchable(422, "Invalid", too_long);
    // The earlier leader's PATCH, carrying the CIDR "waiting" would be given next, landed first: the API
    // server refuses ours, which would change pod CIDRs once set.
    let theirs = node(
        "untouchable",
        &["10.244.0.16/28"],
        &[("example.com/agent", "present")],
    );
    t.api.expect(cidr_patch(&untouchable, &["10.244.0.0/28"]).reply_status(
        422,
        "Invalid",
        "Node \"untouchable\" is invalid: spec.podCIDRs: Forbidden: node updates may not change podCIDR except from \"\" to valid",
    ));
    t.api
        .expect(Step::get("/api/v1/nodes/untouchable").reply(200, body(&theirs)));
    t.api
        .expect(Step::get("/api/v1/nodes/untouchable").reply(200, body(&theirs)));
    t.prepare().await;
    assert_eq!(
        t.holder_of("10.244.0.16/28").as_deref(),
        Some("uid-untouchable"),
        "recorded before the workers start"
    );
    assert_eq!(t.holder_of("10.244.0.0/28"), None, "ours is released");
    let mut touched = waiting.clone();
    touched.metadata.annotations = Some(
        [(
            FENCED_AT_ANNOTATION.to_string(),
            fence_set(&t.api, "/api/v1/nodes/waiting"),
        )]
        .into(),
    );
    t.watch_shows(&touched);
    t.api.expect(cidr_patch(&touched, &["10.244.0.32/28"]));
    t.synced("waiting").await;
}

#[tokio::test(start_paused = true)]
async fn after_a_leader_without_claims_two_nodes_whose_touch_is_refused_hold_all_allocation_and_are_counted(
) {
    let held = node("held", &["10.244.0.0/28"], &[]);
    let (a, b) = (
        node("untouchable-a", &[], &[("example.com/agent", "present")]),
        node("untouchable-b", &[], &[("example.com/agent", "present")]),
    );
    let mut t = Allocating::taking_over(
        &FLAGS,
        [&held, &a, &b].map(cached).into(),
        Some(without_claims()),
    );
    let policy = "admission webhook \"fence.example.com\" denied the request";
    t.api.expect(
        Step::get("/api/v1/nodes")
            .query("limit=500")
            .reply(200, node_list(&[held, a.clone(), b.clone()])),
    );
    t.api.expect_in_any_order([
        touch("untouchable-a").reply_status(403, "Forbidden", policy),
        touch("untouchable-b").reply_status(403, "Forbidden", policy),
        Step::get("/api/v1/nodes/untouchable-a").reply(200, body(&a)),
        Step::get("/api/v1/nodes/untouchable-b").reply(200, body(&b)),
    ]);
    let shutdown = CancellationToken::new();
    let api = &t.api;
    let (prepared, ()) = tokio::join!(t.controller.prepare_now(shutdown.clone()), async {
        // The pass is done at the end of the wait; the retry after it comes half a second later.
        tokio::time::sleep(WAIT + Duration::from_millis(250)).await;
        shutdown.cancel();
    });
    assert_eq!(prepared, Prepared::ShutDown, "the workers never started");
    assert!(
        api.requests()
            .iter()
            .all(|r| r.content_type.as_deref() != Some(JSON_PATCH)),
        "no pod CIDR PATCH: {:?}",
        api.requests()
    );
    assert_eq!(
        t.metric("netcm_pod_cidr_predecessor_touch_refused_nodes", &[]),
        Some(2.0)
    );
    assert_eq!(
        t.metric("netcm_pod_cidr_predecessor_quarantine", &[]),
        Some(1.0)
    );
    for name in ["untouchable-a", "untouchable-b"] {
        let events = t.events_on(name);
        assert_eq!(events.len(), 1, "{name}: {events:?}");
        assert_eq!(events[0].0, "CIDRPredecessorTouchRefused");
    }
}

#[tokio::test(start_paused = true)]
async fn an_unanswered_patch_to_the_untouchable_node_keeps_every_other_node_waiting_until_it_is_sent_again_and_lands(
) {
    let policy = "admission webhook \"fence.example.com\" denied the request";
    let (mut t, untouchable, waiting) = taking_over_with_one_untouchable(403, "Forbidden", policy);
    // Unanswered, it may still land: the Node shows nothing yet, so the same CIDR is sent again.
    t.api
        .expect(cidr_patch(&untouchable, &["10.244.0.0/28"]).reply_status(
            503,
            "ServiceUnavailable",
            "etcdserver: request timed out",
        ));
    t.api
        .expect(Step::get("/api/v1/nodes/untouchable").reply(200, body(&untouchable)));
    t.api.expect(cidr_patch(&untouchable, &["10.244.0.0/28"]));
    t.prepare().await;
    assert_eq!(
        t.holder_of("10.244.0.0/28").as_deref(),
        Some("uid-untouchable")
    );
    let mut touched = waiting.clone();
    touched.metadata.annotations = Some(
        [(
            FENCED_AT_ANNOTATION.to_string(),
            fence_set(&t.api, "/api/v1/nodes/waiting"),
        )]
        .into(),
    );
    t.watch_shows(&touched);
    t.api.expect(cidr_patch(&touched, &["10.244.0.16/28"]));
    t.synced("waiting").await;
}
