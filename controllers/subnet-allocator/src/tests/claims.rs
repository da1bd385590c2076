//! Claiming blocks: a create that finds the block claimed by another leader.

use netcm_manager::test_support::harness::IDENTITY;

use super::*;

/// A /20 of /28s: 256 CIDRs in blocks of 64 (/22s).
const ARGS: [&str; 2] = ["--cluster-cidr=10.244.0.0/20", "--node-cidr-mask-size=28"];

/// The answer to the create of a claim another leader made first.
fn already_exists(block: &str) -> Step {
    let name = claim_name(&block.parse().expect("a CIDR"));
    claim_create(block, IDENTITY).reply_status(
        409,
        "AlreadyExists",
        &format!("podcidrclaims.ipam.netcm.io \"{name}\" already exists"),
    )
}

#[tokio::test(start_paused = true)]
async fn a_block_whose_claim_create_is_answered_409_during_the_quarantine_is_left_to_the_leader_that_claimed_it(
) {
    // An earlier leader claimed the first block; "inflight-1" and "inflight-2" have no CIDRs, so its
    // PATCH for either may be on its way.
    let settled = node("settled", &["10.244.0.0/28"], &[]);
    let (first, second) = (node("inflight-1", &[], &[]), node("inflight-2", &[], &[]));
    let mut t = Allocating::start(
        &ARGS,
        vec![cached(&settled), cached(&first), cached(&second)],
    );
    t.prepare_with_claims(vec![claim("10.244.0.0/22", Some(EARLIER))])
        .await;
    // The next block was claimed too, after this leader's list (another leader is writing from it).
    t.api.expect(already_exists("10.244.4.0/22"));
    t.api.expect(
        claim_create("10.244.8.0/22", IDENTITY).reply(201, claim("10.244.8.0/22", Some(IDENTITY))),
    );
    t.api.expect(cidr_patch(&first, &["10.244.8.0/28"]));
    t.synced("inflight-1").await;
    for free in ["10.244.0.16/28", "10.244.4.0/28", "10.244.7.240/28"] {
        assert_eq!(
            t.holder_of(free).as_deref(),
            Some("claim:quarantine"),
            "{free}: the free CIDRs of both claimed blocks are held while inflight-2 waits"
        );
    }
    t.api.expect(cidr_patch(&second, &["10.244.8.16/28"]));
    t.synced("inflight-2").await;
    assert_eq!(
        t.holder_of("10.244.4.0/28"),
        None,
        "once no earlier write can land, the block is free to adopt"
    );
}

#[tokio::test(start_paused = true)]
async fn a_block_found_claimed_when_no_earlier_write_can_land_is_adopted_under_this_term() {
    let n1 = node("n1", &[], &[]);
    let mut t = Allocating::start(&ARGS, vec![cached(&n1)]);
    t.prepare_with_claims(vec![]).await;
    // Claimed since the list, and no quarantine: whoever claimed it decided after this leader's first
    // list, so none of its writes can target a Node this leader serves (`blocks.rs`).
    t.api.expect(already_exists("10.244.0.0/22"));
    t.api.expect(
        Step::patch(&claim_path("10.244.0.0/22"))
            .content_type("application/merge-patch+json")
            .json(json!({
                "metadata": { "annotations": {
                    "ipam.netcm.io/term": IDENTITY,
                    "ipam.netcm.io/idle-since": null,
                } }
            })),
    );
    t.api.expect(cidr_patch(&n1, &["10.244.0.0/28"]));
    t.synced("n1").await;
}
