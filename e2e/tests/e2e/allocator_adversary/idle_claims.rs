//! Claims a leader leaves behind, and what the next leader pays for them: idle after a clean step-down
//! (the next leader uses them at once), open after a kill (the next leader quarantines them and touches
//! only the Nodes still waiting when it runs out of room), idle while it leads once it stopped writing to
//! a block (so even a killed leader leaves those idle), and an idle mark or an adoption that lands after
//! another term wrote the claim is refused.

use super::*;

use netcm_subnet_allocator::blocks::FENCED_AT_ANNOTATION;
use netcm_subnet_allocator::claims::{
    claim_name, ClaimWrite, Claims, IDLE_ANNOTATION, TERM_ANNOTATION,
};

/// One block: a cluster CIDR smaller than a block is one, so nothing is free outside an earlier claim.
const ONE_BLOCK: &str = "10.77.0.0/24";

fn one_block_args() -> [&'static str; 2] {
    ["--cluster-cidr=10.77.0.0/24", "--node-cidr-mask-size=28"]
}

/// The one block's claim, as the API has it.
async fn the_claim(client: &kube::Client) -> DynamicObject {
    let net: IpNet = ONE_BLOCK.parse().expect("cidr");
    pod_cidr_claims(client)
        .get(&claim_name(&net))
        .await
        .expect("the block's claim")
}

fn annotation<'a>(claim: &'a DynamicObject, key: &str) -> Option<&'a str> {
    claim
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

/// A first leader allocates four Nodes of the block and goes with `signal`; six more Nodes then wait.
async fn a_first_leader_goes(env: &TestEnv, signal: &str) {
    create_plain_nodes(&env.client, "first-", 4).await;
    let mut first = start_allocator(env, "first", &one_block_args());
    wait_all_allocated(&env.client, 4, TIMEOUT).await;
    first.signal(signal);
    first.wait_exit(TIMEOUT).await;
    create_plain_nodes(&env.client, "second-", 6).await;
}

/// The Nodes whose fence annotation a leader set: the ones a quarantine touched.
async fn touched_nodes(client: &kube::Client) -> Vec<String> {
    all_nodes(client)
        .await
        .iter()
        .filter(|n| {
            n.metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key(FENCED_AT_ANNOTATION))
        })
        .map(|n| n.metadata.name.clone().unwrap_or_default())
        .collect()
}

/// Every Node is served without an overlap, and the six that waited at the takeover were touched
/// before the one block's free CIDRs were used: the block was quarantined, for `why`.
async fn the_block_was_quarantined(env: &TestEnv, why: &str) {
    let nodes = wait_all_allocated(&env.client, 10, TIMEOUT).await;
    assert_no_overlaps(&nodes);
    let mut touched = touched_nodes(&env.client).await;
    touched.sort();
    let waiting: Vec<String> = (1..=6).map(|i| format!("second-{i}")).collect();
    assert_eq!(
        touched, waiting,
        "{why}: the block was quarantined, every Node waiting at the takeover touched before its free CIDRs were used"
    );
}

#[tokio::test]
async fn a_leader_that_steps_down_cleanly_leaves_its_claim_idle_and_the_next_serves_waiting_nodes_without_touching_them(
) {
    let env = TestEnv::new().await;
    a_first_leader_goes(&env, "TERM").await;
    let claim = the_claim(&env.client).await;
    assert!(
        annotation(&claim, IDLE_ANNOTATION).is_some(),
        "after SIGTERM the block's claim is idle: {:?}",
        claim.metadata.annotations
    );
    let first_term = annotation(&claim, TERM_ANNOTATION).map(str::to_string);
    assert!(first_term.is_some(), "the claim names its term");

    let _second = start_allocator(&env, "second", &one_block_args());
    let nodes = wait_all_allocated(&env.client, 10, TIMEOUT).await;
    assert_no_overlaps(&nodes);
    assert_eq!(
        touched_nodes(&env.client).await,
        Vec::<String>::new(),
        "an idle claim needs no quarantine, so no waiting Node is touched"
    );
    let claim = the_claim(&env.client).await;
    assert_eq!(
        annotation(&claim, IDLE_ANNOTATION),
        None,
        "the second leader took the block into use"
    );
    assert_ne!(
        annotation(&claim, TERM_ANNOTATION).map(str::to_string),
        first_term,
        "under its own term"
    );
}

#[tokio::test]
async fn a_killed_leader_leaves_its_claim_open_and_the_next_touches_the_waiting_nodes_before_using_it(
) {
    let env = TestEnv::new().await;
    a_first_leader_goes(&env, "KILL").await;
    let claim = the_claim(&env.client).await;
    assert_eq!(
        annotation(&claim, IDLE_ANNOTATION),
        None,
        "a killed leader's writes may still land: its claim stays open"
    );
    netcm_e2e::forget_the_leader(&env.client).await;

    let _second = start_allocator(&env, "second", &one_block_args());
    the_block_was_quarantined(&env, "a killed leader's writes may still land").await;
}

/// The one block's claim, created by term `earlier@1`, and the claims client a test writes it with.
async fn the_earlier_leaders_claim() -> (TestEnv, Claims, IpNet) {
    let env = TestEnv::new().await;
    let claims = Claims::new(env.client.clone());
    let block: IpNet = ONE_BLOCK.parse().expect("cidr");
    claims
        .claim_block(&block, "earlier@1")
        .await
        .expect("the earlier leader's claim");
    (env, claims, block)
}

#[tokio::test]
async fn an_idle_mark_that_lands_after_a_later_leader_adopted_the_block_is_refused() {
    let (env, claims, block) = the_earlier_leaders_claim().await;
    assert_eq!(
        claims
            .adopt(&block, "later@2", Some("earlier@1"), None)
            .await
            .expect("adopt"),
        ClaimWrite::Landed
    );
    assert_eq!(
        claims
            .mark_idle(&block, "earlier@1", "earlier@1", "2026-11-26T00:00:00Z")
            .await
            .expect("the API answers"),
        ClaimWrite::Refused,
        "the earlier term's mark, held back past the adoption"
    );
    let claim = the_claim(&env.client).await;
    assert_eq!(annotation(&claim, IDLE_ANNOTATION), None);
    assert_eq!(annotation(&claim, TERM_ANNOTATION), Some("later@2"));
    assert_eq!(
        claims
            .mark_idle(&block, "later@2", "later@2", "2026-11-26T00:00:01Z")
            .await
            .expect("the API answers"),
        ClaimWrite::Landed,
        "the term that adopted it may"
    );
    let claim = the_claim(&env.client).await;
    assert_eq!(
        annotation(&claim, IDLE_ANNOTATION),
        Some("2026-11-26T00:00:01Z")
    );
}

#[tokio::test]
async fn a_leader_out_of_room_touches_only_the_nodes_still_waiting_not_the_ones_it_already_gave_cidrs(
) {
    let env = TestEnv::new().await;
    // Two blocks of 64 /28s: the first an earlier leader's (killed), the second free.
    let cluster = ["--cluster-cidr=10.78.0.0/21", "--node-cidr-mask-size=28"];
    create_plain_nodes(&env.client, "first-", 4).await;
    let mut first = start_allocator(&env, "first", &cluster);
    wait_all_allocated(&env.client, 4, TIMEOUT).await;
    first.signal("KILL");
    first.wait_exit(TIMEOUT).await;
    netcm_e2e::forget_the_leader(&env.client).await;
    assert_eq!(claimed_cidrs(&env.client).await, ["10.78.0.0/22"]);

    // 70 waiting: 64 fit in the free block, 6 need the quarantined one. One worker, so every PATCH of
    // the free block has landed when the 65th Node finds no room.
    create_plain_nodes(&env.client, "second-", 70).await;
    let mut args = cluster.to_vec();
    args.push("--concurrent-node-cidr-syncs=1");
    let _second = start_allocator(&env, "second", &args);
    let nodes = wait_all_allocated(&env.client, 74, Duration::from_secs(120)).await;
    assert_no_overlaps(&nodes);
    let touched = touched_nodes(&env.client).await;
    assert_eq!(
        touched.len(),
        6,
        "only the Nodes still waiting when the free block ran out are touched, not the 64 just written: {touched:?}"
    );
}

/// What a leader of a build without idle claims leaves on the Lease when it takes it over and dies: its
/// own identity as holder, a short term that expires soon after, and no mark on any claim.
async fn a_leader_without_idle_claims_takes_over_and_dies(client: &kube::Client) {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(client.clone(), netcm_e2e::LEASE_NAMESPACE);
    let mut lease = leases
        .get(netcm_e2e::LEASE_NAME)
        .await
        .expect("the released Lease");
    let spec = lease.spec.get_or_insert_with(Default::default);
    let now = MicroTime(jiff::Timestamp::now());
    spec.holder_identity = Some("rolled-back_0".into());
    spec.lease_duration_seconds = Some(2);
    spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
    spec.acquire_time = Some(now.clone());
    spec.renew_time = Some(now);
    leases
        .replace(netcm_e2e::LEASE_NAME, &PostParams::default(), &lease)
        .await
        .expect("take the Lease over as the rolled-back leader");
}

#[tokio::test]
async fn an_idle_mark_older_than_the_last_leader_is_quarantined_since_a_rolled_back_leader_may_have_used_the_block(
) {
    let env = TestEnv::new().await;
    a_first_leader_goes(&env, "TERM").await;
    let claim = the_claim(&env.client).await;
    assert!(annotation(&claim, IDLE_ANNOTATION).is_some());
    // A build from before idle claims leads next: it hands out of the idle block without adopting its
    // claim, then dies with a PATCH a frozen API server may still land. Nothing on the claim shows it.
    a_leader_without_idle_claims_takes_over_and_dies(&env.client).await;

    let _third = start_allocator(&env, "third", &one_block_args());
    the_block_was_quarantined(&env, "the first leader's mark is not the last leader's").await;
}

#[tokio::test]
async fn a_clean_step_down_names_its_own_term_on_the_claim_it_used_so_the_next_leader_trusts_it() {
    let env = TestEnv::new().await;
    a_first_leader_goes(&env, "TERM").await;
    let first_term = annotation(&the_claim(&env.client).await, TERM_ANNOTATION).map(str::to_string);

    let mut second = start_allocator(&env, "second", &one_block_args());
    wait_all_allocated(&env.client, 10, TIMEOUT).await;
    let second_term = steps_down_marking_under_its_term(
        &env,
        &mut second,
        "the mark names the Lease holder that made it",
    )
    .await;
    assert_ne!(Some(second_term), first_term);

    a_third_leader_serves_without_touching_a_node(&env, 3, "the last leader's marks are trusted")
        .await;
}

/// The leader `leader` (holding the Lease) goes with SIGTERM; the block's claim is then idle under its
/// term (`why`), which is returned.
async fn steps_down_marking_under_its_term(env: &TestEnv, leader: &mut Netcm, why: &str) -> String {
    let term = netcm_e2e::lease_holder(&env.client, netcm_e2e::LEASE_NAME)
        .await
        .expect("the leader holds the Lease");
    leader.signal("TERM");
    leader.wait_exit(TIMEOUT).await;
    let claim = the_claim(&env.client).await;
    assert!(
        annotation(&claim, IDLE_ANNOTATION).is_some(),
        "idle: {:?}",
        claim.metadata.annotations
    );
    assert_eq!(
        annotation(&claim, TERM_ANNOTATION),
        Some(term.as_str()),
        "{why}"
    );
    term
}

/// `more` Nodes wait, then a third leader serves every Node without an overlap and without touching a
/// waiting Node: it trusted the idle mark (`why`), so there was no quarantine.
async fn a_third_leader_serves_without_touching_a_node(env: &TestEnv, more: usize, why: &str) {
    let before = all_nodes(&env.client).await.len();
    create_plain_nodes(&env.client, "third-", more).await;
    let _third = start_allocator(env, "third", &one_block_args());
    let nodes = wait_all_allocated(&env.client, before + more, TIMEOUT).await;
    assert_no_overlaps(&nodes);
    assert_eq!(
        touched_nodes(&env.client).await,
        Vec::<String>::new(),
        "{why}: no quarantine, no Node touched"
    );
}

#[tokio::test]
async fn a_leader_left_an_idle_claim_it_never_used_marks_it_again_under_its_own_term_so_the_next_trusts_it(
) {
    let env = TestEnv::new().await;
    create_plain_nodes(&env.client, "first-", 4).await;
    let mut first = start_allocator(&env, "first", &one_block_args());
    wait_all_allocated(&env.client, 4, TIMEOUT).await;
    first.signal("TERM");
    first.wait_exit(TIMEOUT).await;
    let first_term = annotation(&the_claim(&env.client).await, TERM_ANNOTATION).map(str::to_string);
    assert!(
        first_term.is_some(),
        "the first leader marked its claim idle"
    );

    // The second leader is left the idle claim and no Node to serve, so it never takes the block into
    // use. Its workers start only once its startup read the claims: four syncs of the four served Nodes.
    let mut second = start_allocator(&env, "second", &one_block_args());
    second.wait_http(TIMEOUT).await;
    let synced = [r#"controller="subnet-allocator""#, r#"result="success""#];
    wait_for(
        "the second leader's workers to sync the served Nodes",
        TIMEOUT,
        || async {
            (netcm_e2e::netcm::metric_sum(&second, "netcm_sync_total", &synced).await >= 4.0)
                .then_some(())
        },
    )
    .await;
    let second_term = steps_down_marking_under_its_term(
        &env,
        &mut second,
        "marked again under the term of the leader that stepped down, which never used the block",
    )
    .await;
    assert_ne!(Some(second_term), first_term);

    // Without the second mark the claim would name the first leader, not the one right before the
    // third, and the third would quarantine the block and touch every waiting Node.
    a_third_leader_serves_without_touching_a_node(
        &env,
        6,
        "the mark names the leader right before the third",
    )
    .await;
}

/// Two blocks of 64 /28s: 10.79.0.0/22 and 10.79.4.0/22.
const TWO_BLOCKS: [&str; 2] = ["--cluster-cidr=10.79.0.0/21", "--node-cidr-mask-size=28"];

/// A short lease, so the next leader takes over a killed one's within seconds.
const SHORT_LEASE: [&str; 3] = [
    "--leader-elect-lease-duration=4s",
    "--leader-elect-renew-deadline=3s",
    "--leader-elect-retry-period=1s",
];

/// The claim of `block`, as the API has it.
async fn claim_of(client: &kube::Client, block: &str) -> DynamicObject {
    let net: IpNet = block.parse().expect("cidr");
    pod_cidr_claims(client)
        .get(&claim_name(&net))
        .await
        .expect("the block's claim")
}

#[tokio::test]
async fn a_killed_leader_leaves_idle_the_block_it_stopped_writing_to_and_the_next_serves_waiting_nodes_from_it_untouched(
) {
    let env = TestEnv::new().await;
    let args: Vec<&str> = TWO_BLOCKS.iter().chain(&SHORT_LEASE).copied().collect();
    // The first block filled, then one Node in the second: the first leader stops writing to the first.
    create_plain_nodes(&env.client, "first-", 64).await;
    let mut first = start_allocator(&env, "first", &args);
    wait_all_allocated(&env.client, 64, TIMEOUT).await;
    create_plain_nodes(&env.client, "late-", 1).await;
    wait_all_allocated(&env.client, 65, TIMEOUT).await;
    wait_for(
        "the leader to mark the first block's claim idle while it leads",
        Duration::from_secs(60),
        || async {
            let claim = claim_of(&env.client, "10.79.0.0/22").await;
            annotation(&claim, IDLE_ANNOTATION).map(|_| ())
        },
    )
    .await;
    let api: Api<Node> = Api::all(env.client.clone());
    for i in 1..=64 {
        api.delete(&format!("first-{i}"), &DeleteParams::default())
            .await
            .expect("delete a Node of the first block");
    }
    first.signal("KILL");
    first.wait_exit(TIMEOUT).await;
    assert_eq!(
        annotation(
            &claim_of(&env.client, "10.79.4.0/22").await,
            IDLE_ANNOTATION
        ),
        None,
        "the block of the latest write stays open"
    );

    // Eight wait; the second block has 63 free CIDRs, but its claim is open, so they are quarantined.
    create_plain_nodes(&env.client, "second-", 8).await;
    let _second = start_allocator(&env, "second", &args);
    let nodes = wait_all_allocated(&env.client, 9, Duration::from_secs(90)).await;
    assert_no_overlaps(&nodes);
    assert_eq!(
        touched_nodes(&env.client).await,
        Vec::<String>::new(),
        "the idle block serves the waiting Nodes: nothing to touch"
    );
    let first_block: IpNet = "10.79.0.0/22".parse().expect("cidr");
    for n in nodes.iter().filter(|n| {
        n.metadata
            .name
            .as_deref()
            .is_some_and(|m| m.starts_with("second-"))
    }) {
        let cidr: IpNet = pod_cidrs(n)[0].parse().expect("a CIDR");
        assert!(
            first_block.contains(&cidr),
            "{:?} got {cidr}, outside the idle block",
            n.metadata.name
        );
    }
}

#[tokio::test]
async fn an_adoption_of_an_idle_claim_its_marking_term_took_back_into_use_since_is_refused() {
    let (env, claims, block) = the_earlier_leaders_claim().await;
    let since = "2026-11-29T09:00:00Z";
    assert_eq!(
        claims
            .mark_idle(&block, "earlier@1", "earlier@1", since)
            .await
            .expect("the API answers"),
        ClaimWrite::Landed,
        "marked idle while it leads"
    );
    // A later leader lists it idle; before its adoption lands, the earlier term takes the block back.
    assert_eq!(
        claims
            .adopt(&block, "earlier@1", Some("earlier@1"), Some(since))
            .await
            .expect("the API answers"),
        ClaimWrite::Landed
    );
    assert_eq!(
        claims
            .adopt(&block, "later@2", Some("earlier@1"), Some(since))
            .await
            .expect("the API answers"),
        ClaimWrite::Refused,
        "the claim is no longer idle as listed: an earlier write may land in the block"
    );
    let claim = the_claim(&env.client).await;
    assert_eq!(annotation(&claim, TERM_ANNOTATION), Some("earlier@1"));
    assert_eq!(annotation(&claim, IDLE_ANNOTATION), None);
}
