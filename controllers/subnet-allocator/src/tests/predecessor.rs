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
