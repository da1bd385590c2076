//! A write the API refuses for good (an admission policy of the cluster's own): its CIDR is released,
//! a Warning names it, and the allocation metrics stay consistent.

use super::*;

/// Refuses every pod CIDR of the Node "refused".
fn deny_policy() -> String {
    node_update_policy(
        DENY_POLICY,
        &[(
            "object.metadata.name != 'refused' || !has(object.spec.podCIDR)",
            "e2e policy: node refused may not get a pod CIDR",
        )],
    )
}

const DENY_POLICY: &str = "netcm-e2e-deny-pod-cidr";

#[tokio::test]
async fn a_write_the_api_refuses_for_good_releases_its_cidr_warns_and_keeps_the_metrics_consistent()
{
    let env = TestEnv::new().await;
    kubectl(&env, &["apply", "-f", "-"], Some(&deny_policy()));
    create_node(&env.client, &NodeFixture::named("refused")).await;
    // The policy is enforced once the API server has compiled it.
    wait_for(
        "the admission policy to refuse a pod CIDR",
        TIMEOUT,
        || async {
            let api: Api<Node> = Api::all(env.client.clone());
            let patch = serde_json::json!({"spec": {"podCIDR": "10.1.0.0/24"}});
            let pp = kube::api::PatchParams {
                dry_run: true,
                ..Default::default()
            };
            api.patch("refused", &pp, &kube::api::Patch::Merge(&patch))
                .await
                .is_err()
                .then_some(())
        },
    )
    .await;
    create_plain_nodes(&env.client, "ok-", 3).await;
    let netcm = start_allocator(&env, "refused", &["--cluster-cidr=10.202.0.0/16"]);
    wait_for(
        "a CIDRAssignmentFailed Warning on the refused node with the API's message",
        TIMEOUT,
        || async {
            env.node_events("refused")
                .await
                .iter()
                .any(|(t, reason, note)| {
                    t == "Warning"
                        && reason == "CIDRAssignmentFailed"
                        && note.contains("e2e policy")
                })
                .then_some(())
        },
    )
    .await;
    // Let it be refused a few more times, then lift the policy: the node gets a CIDR after its backoff.
    tokio::time::sleep(Duration::from_secs(4)).await;
    remove_node_update_policy(&env, DENY_POLICY);
    let nodes = wait_all_allocated(&env.client, 4, TIMEOUT).await;
    assert_no_overlaps(&nodes);
    let cluster = "{clusterCIDR=\"10.202.0.0/16\"}";
    let allocations = netcm
        .metric(&format!(
            "node_ipam_controller_cidrset_cidrs_allocations_total{cluster}"
        ))
        .await
        .unwrap_or_default();
    let releases = netcm
        .metric(&format!(
            "node_ipam_controller_cidrset_cidrs_releases_total{cluster}"
        ))
        .await
        .unwrap_or_default();
    assert!(
        releases >= 1.0,
        "the refused allocations were released ({releases})"
    );
    assert_eq!(
        allocations - releases,
        4.0,
        "allocations ({allocations}) minus releases ({releases}) is the 4 nodes holding CIDRs"
    );
    netcm.assert_running();
}
