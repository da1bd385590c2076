//! The one PATCH of an allocation: its shape, and what each way it can fail leaves recorded.

use std::time::Duration;

use netcm_manager::test_support::harness::IDENTITY;

use super::*;

/// A /20 of /28s: 256 CIDRs in blocks of 64 (/22s), handed out in address order.
const ARGS: [&str; 2] = ["--cluster-cidr=10.244.0.0/20", "--node-cidr-mask-size=28"];

/// The first block of [`ARGS`].
const BLOCK: &str = "10.244.0.0/22";

/// The allocator of [`ARGS`] over `nodes`, prepared with no claims yet, its first block's claim
/// expected next.
async fn first_start(nodes: &[&Node]) -> Allocating {
    let mut t = Allocating::start(&ARGS, nodes.iter().map(|n| cached(n)).collect());
    t.prepare_with_claims(vec![]).await;
    t.api
        .expect(claim_create(BLOCK, IDENTITY).reply(201, claim(BLOCK, Some(IDENTITY))));
    t
}

#[tokio::test(start_paused = true)]
async fn a_node_without_pod_cidrs_is_given_them_by_one_json_patch_testing_its_uid_and_its_fence() {
    let mut t = Allocating::start(&ARGS, vec![plain("n1")]);
    t.prepare_with_claims(vec![]).await;
    t.api
        .expect(claim_create(BLOCK, IDENTITY).reply(201, claim(BLOCK, Some(IDENTITY))));
    t.api.expect(
        Step::patch("/api/v1/nodes/n1")
            .content_type("application/json-patch+json")
            .json(json!([
                { "op": "test", "path": "/metadata/uid", "value": "uid-n1" },
                { "op": "test", "path": "/metadata/annotations", "value": null },
                { "op": "add", "path": "/spec/podCIDR", "value": "10.244.0.0/28" },
                { "op": "add", "path": "/spec/podCIDRs", "value": ["10.244.0.0/28"] },
            ])),
    );
    t.synced("n1").await;
    assert_eq!(t.held_by("n1"), ["10.244.0.0/28"]);
}

#[tokio::test(start_paused = true)]
async fn the_patch_tests_the_fence_annotation_as_the_cache_saw_it_unset_or_set() {
    let agent = node("agent", &[], &[("example.com/agent", "present")]);
    let fenced = node("fenced", &[], &[(FENCED_AT_ANNOTATION, "an-earlier-touch")]);
    let t = first_start(&[&agent, &fenced]).await;
    t.api.expect(Step::patch("/api/v1/nodes/agent").json(json!([
        { "op": "test", "path": "/metadata/uid", "value": "uid-agent" },
        { "op": "test", "path": "/metadata/annotations/ipam.netcm.io~1fenced-at", "value": null },
        { "op": "add", "path": "/spec/podCIDR", "value": "10.244.0.0/28" },
        { "op": "add", "path": "/spec/podCIDRs", "value": ["10.244.0.0/28"] },
    ])));
    t.synced("agent").await;
    t.api.expect(
        Step::patch("/api/v1/nodes/fenced").json(json!([
            { "op": "test", "path": "/metadata/uid", "value": "uid-fenced" },
            { "op": "test", "path": "/metadata/annotations/ipam.netcm.io~1fenced-at", "value": "an-earlier-touch" },
            { "op": "add", "path": "/spec/podCIDR", "value": "10.244.0.16/28" },
            { "op": "add", "path": "/spec/podCIDRs", "value": ["10.244.0.16/28"] },
        ])),
    );
    t.synced("fenced").await;
}

#[tokio::test(start_paused = true)]
async fn a_node_synced_again_before_the_cache_shows_its_cidrs_is_not_written_twice() {
    let n1 = node("n1", &[], &[]);
    let t = first_start(&[&n1]).await;
    t.api.expect(cidr_patch(&n1, &["10.244.0.0/28"]));
    t.synced("n1").await;
    // Kubelet's status updates bring the Node back without the CIDRs the cache has not shown yet.
    t.watch_shows(&n1);
    t.synced("n1").await;
    t.synced("n1").await;
    assert_eq!(
        t.api.requests().len(),
        3,
        "the claims list, the claim, one PATCH"
    );
}

#[tokio::test(start_paused = true)]
async fn dual_stack_gives_one_cidr_per_family_with_pod_cidr_from_the_family_listed_first() {
    let nodes: Vec<Node> = (0..3)
        .map(|i| node(&format!("dual-{i}"), &[], &[]))
        .collect();
    let mut t = Allocating::start(
        &["--cluster-cidr=fd00:10:244::/56,10.244.0.0/16"],
        nodes.iter().map(cached).collect(),
    );
    t.prepare_with_claims(vec![]).await;
    // A block per family, each 64 node CIDRs: /58 of /64s, /18 of /24s.
    t.api
        .expect(claim_create("fd00:10:244::/58", IDENTITY).reply(201, json!({})));
    t.api
        .expect(claim_create("10.244.0.0/18", IDENTITY).reply(201, json!({})));
    for (i, n) in nodes.iter().enumerate() {
        let v6: ipnet::IpNet = format!("fd00:10:244:{i:x}::/64").parse().expect("a CIDR");
        let (v6, v4) = (v6.to_string(), format!("10.244.{i}.0/24"));
        t.api.expect(cidr_patch(n, &[&v6, &v4]));
        t.synced(&format!("dual-{i}")).await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_patch_refused_because_the_node_was_re_created_releases_its_cidr_and_the_next_write_tests_the_new_node(
) {
    let n1 = node("n1", &[], &[]);
    let t = first_start(&[&n1]).await;
    t.api.expect(cidr_patch(&n1, &["10.244.0.0/28"]).reply_status(
        422,
        "Invalid",
        "the server rejected our request due to an error in our request: testing value /metadata/uid failed",
    ));
    // A 422 does not say which test failed: the Node as it is now decides.
    let again = recreated(n1);
    t.api
        .expect(Step::get("/api/v1/nodes/n1").reply(200, body(&again)));
    let outcome = t.sync("n1").await;
    assert!(
        matches!(outcome, Ok(SyncOutcome::RetryAfter(d)) if d == Duration::from_millis(200)),
        "{outcome:?}"
    );
    assert_eq!(t.holder_of("10.244.0.0/28"), None, "released");
    // The retry decides from the cache, once its watch brings the new Node: a write for the new UID.
    t.watch_shows(&again);
    t.api.expect(cidr_patch(&again, &["10.244.0.16/28"]));
    t.synced("n1").await;
    assert_eq!(
        t.holder_of("10.244.0.16/28").as_deref(),
        Some("uid-n1-again")
    );
}

#[tokio::test(start_paused = true)]
async fn a_write_the_api_refuses_for_good_releases_its_cidr_warns_and_keeps_the_metrics_consistent()
{
    let (ok, refused) = (node("ok-1", &[], &[]), node("refused", &[], &[]));
    let t = first_start(&[&ok, &refused]).await;
    t.api.expect(cidr_patch(&ok, &["10.244.0.0/28"]));
    t.synced("ok-1").await;
    let policy = "admission policy: node refused may not get a pod CIDR";
    for cidr in ["10.244.0.16/28", "10.244.0.32/28"] {
        t.api
            .expect(cidr_patch(&refused, &[cidr]).reply_status(422, "Invalid", policy));
        t.api
            .expect(Step::get("/api/v1/nodes/refused").reply(200, body(&refused)));
        let outcome = t.sync("refused").await;
        assert!(
            matches!(&outcome, Err(SyncError::Rejected { message, .. }) if message == policy),
            "{outcome:?}"
        );
        assert_eq!(t.holder_of(cidr), None, "{cidr} released");
    }
    let warnings = t.events_on("refused");
    assert_eq!(
        warnings.len(),
        1,
        "one Warning in the dedup window: {warnings:?}"
    );
    assert_eq!(warnings[0].0, "CIDRAssignmentFailed");
    assert!(warnings[0].1.contains(policy), "{warnings:?}");
    // The policy is lifted: the next retry lands.
    t.api.expect(cidr_patch(&refused, &["10.244.0.48/28"]));
    t.synced("refused").await;
    let cluster = [("clusterCIDR", "10.244.0.0/20")];
    let counter = |name: &str| {
        t.metric(&format!("node_ipam_controller_{name}"), &cluster)
            .unwrap_or_default()
    };
    let (allocations, releases) = (
        counter("cidrset_cidrs_allocations_total"),
        counter("cidrset_cidrs_releases_total"),
    );
    assert_eq!(releases, 2.0, "the two refused allocations");
    assert_eq!(
        allocations - releases,
        2.0,
        "allocations ({allocations}) minus releases ({releases}) is the 2 nodes holding CIDRs"
    );
}

#[tokio::test(start_paused = true)]
async fn a_patch_answered_409_with_nothing_landed_releases_its_cidr_and_retries_soon() {
    let n1 = node("n1", &[], &[]);
    let t = first_start(&[&n1]).await;
    t.api
        .expect(cidr_patch(&n1, &["10.244.0.0/28"]).reply_status(
            409,
            "Conflict",
            "the object has been modified",
        ));
    t.api
        .expect(Step::get("/api/v1/nodes/n1").reply(200, body(&n1)));
    let outcome = t.sync("n1").await;
    assert!(
        matches!(outcome, Ok(SyncOutcome::RetryAfter(d)) if d == Duration::from_secs(1)),
        "{outcome:?}"
    );
    assert!(t.held_by("n1").is_empty(), "released");
    assert!(
        t.events_on("n1").is_empty(),
        "a conflict is not worth a Warning"
    );
}

#[tokio::test(start_paused = true)]
async fn a_patch_answered_409_that_had_landed_keeps_its_cidr_recorded_and_is_not_sent_again() {
    let n1 = node("n1", &[], &[]);
    let t = first_start(&[&n1]).await;
    t.api
        .expect(cidr_patch(&n1, &["10.244.0.0/28"]).reply_status(
            409,
            "Conflict",
            "the object has been modified",
        ));
    // An earlier attempt landed although its answer was lost: the Node holds the very CIDR chosen.
    t.api.expect(
        Step::get("/api/v1/nodes/n1").reply(200, body(&node("n1", &["10.244.0.0/28"], &[]))),
    );
    t.synced("n1").await;
    assert_eq!(t.held_by("n1"), ["10.244.0.0/28"]);
    // Until the cache shows it, a sync does not write it again.
    t.synced("n1").await;
}

#[tokio::test(start_paused = true)]
async fn a_patch_that_times_out_keeps_its_cidr_reserved_so_no_second_node_gets_it() {
    let (n1, n2) = (node("n1", &[], &[]), node("n2", &[], &[]));
    let mut t = first_start(&[&n1, &n2]).await;
    t.api.expect(
        cidr_patch(&n1, &["10.244.0.0/28"])
            .after(Duration::from_secs(10))
            .deadline_exceeded(),
    );
    let outcome = t.sync("n1").await;
    assert!(matches!(outcome, Err(SyncError::Patch(_))), "{outcome:?}");
    assert_eq!(t.held_by("n1"), ["10.244.0.0/28"], "it may still land");
    t.api.expect(cidr_patch(&n2, &["10.244.0.16/28"]));
    t.synced("n2").await;
    // The retry writes the same CIDR: nothing leaks.
    t.api.expect(cidr_patch(&n1, &["10.244.0.0/28"]));
    t.synced("n1").await;
    let warnings = t.events_on("n1");
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert_eq!(warnings[0].0, "CIDRAssignmentFailed");
    // The unanswered write may land any time: stepping down leaves the block's claim open (no idle mark).
    t.controller.stop_now().await;
}

#[tokio::test(start_paused = true)]
async fn a_leader_stepping_down_with_every_write_answered_marks_its_block_idle_under_its_term() {
    let n1 = node("n1", &[], &[]);
    let mut t = first_start(&[&n1]).await;
    t.api.expect(cidr_patch(&n1, &["10.244.0.0/28"]));
    t.synced("n1").await;
    t.api.expect(
        Step::patch(&claim_path(BLOCK))
            .content_type(JSON_PATCH)
            .check(|patch| {
                let ops = patch.as_array().expect("a JSON Patch");
                assert_eq!(
                    ops[0],
                    json!({ "op": "test", "path": "/metadata/annotations/ipam.netcm.io~1term", "value": IDENTITY }),
                    "the mark tests the claim is still this term's"
                );
                assert_eq!(ops[1]["value"], IDENTITY);
                assert_eq!(ops[2]["path"], "/metadata/annotations/ipam.netcm.io~1idle-since");
            }),
    );
    t.controller.stop_now().await;
}
