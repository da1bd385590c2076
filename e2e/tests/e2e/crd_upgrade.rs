//! The CRD upgrade netcm documents (docs/helm.md, "Upgrading"): Helm never touches `crds/` after the first
//! install, so an upgrade applies the next version's CRDs first (`kubectl apply --server-side -f
//! charts/netcm/crds/`), then rolls the pods (`helm upgrade`). In between, this version's replicas run
//! against the next version's schema and read objects the next version wrote. Here the next version adds
//! a field to PodCIDRClaim, a claim carrying it is written, and the rollout is a leader change: no Node
//! loses or changes its CIDR, new Nodes are allocated before and after the leader change, and the new
//! field survives (it is neither pruned nor dropped by this version's reads).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams, PostParams};
use netcm_e2e::nodes::{create_node, pod_cidrs, NodeFixture};
use netcm_e2e::overlaps::overlapping_pairs;
use netcm_e2e::{apply_crds, pod_cidr_claims, repo_root, wait_for, Netcm, ReinstallCrds, TestEnv};

const TIMEOUT: Duration = Duration::from_secs(60);
const ARGS: [&str; 5] = [
    "--controllers=subnet-allocator",
    "--cluster-cidr=10.244.0.0/16",
    "--leader-elect-lease-duration=4s",
    "--leader-elect-renew-deadline=3s",
    "--leader-elect-retry-period=1s",
];
/// Where the next version's field goes: beside the claim's other spec properties.
const SPEC_PROPERTIES: &str = "                nodeName:\n";
const NEXT_FIELD: &str = "                term:\n                  type: string\n                  description: The leader term that claimed the block (the next version's field).\n                  maxLength: 128\n";

/// The chart's CRDs as the next version ships them: PodCIDRClaim's spec gains `term`.
fn next_version_crds(dir: &Path) {
    let crds = repo_root().join("charts/netcm/crds");
    for entry in std::fs::read_dir(&crds).expect("read crds/") {
        let path = entry.expect("crds/ entry").path();
        let mut text = std::fs::read_to_string(&path).expect("read a CRD");
        if path.file_name().is_some_and(|n| n == "podcidrclaims.yaml") {
            assert_eq!(text.matches(SPEC_PROPERTIES).count(), 1, "{text}");
            text = text.replace(SPEC_PROPERTIES, &format!("{NEXT_FIELD}{SPEC_PROPERTIES}"));
        }
        std::fs::write(dir.join(path.file_name().expect("a file name")), text).expect("write");
    }
}

/// Every Node's pod CIDRs, by name, once `n` Nodes hold one.
async fn allocated(client: &kube::Client, n: usize) -> BTreeMap<String, Vec<String>> {
    let api: Api<Node> = Api::all(client.clone());
    wait_for(&format!("{n} Nodes with pod CIDRs"), TIMEOUT, || async {
        let nodes = api.list(&ListParams::default()).await.ok()?.items;
        let held: BTreeMap<_, _> = nodes
            .iter()
            .filter(|n| !pod_cidrs(n).is_empty())
            .map(|n| (n.metadata.name.clone().unwrap_or_default(), pod_cidrs(n)))
            .collect();
        (held.len() == n).then_some(held)
    })
    .await
}

async fn add_nodes(client: &kube::Client, prefix: &str, n: usize) {
    for i in 0..n {
        create_node(client, &NodeFixture::named(format!("{prefix}-{i}"))).await;
    }
}

#[tokio::test]
async fn the_next_versions_crds_applied_under_running_replicas_change_no_cidr_and_allocation_goes_on_across_the_rollout(
) {
    let env = TestEnv::new().await;
    let _reinstall = ReinstallCrds(env.cp.kubeconfig.clone());
    let mut first = Netcm::start("crd-upgrade-a", &env.cp.kubeconfig, &ARGS);
    first.wait_leading(TIMEOUT).await;
    let second = Netcm::start("crd-upgrade-b", &env.cp.kubeconfig, &ARGS);
    add_nodes(&env.client, "before", 4).await;
    let before = allocated(&env.client, 4).await;

    // Step 1 of the upgrade: the next version's CRDs, under this version's running replicas.
    let next = tempfile::tempdir().expect("tempdir");
    next_version_crds(next.path());
    apply_crds(&env.cp.kubeconfig, next.path());
    // An object as the next version writes it: a claim with the new field, outside the cluster CIDR so
    // it reserves nothing this test allocates from.
    let claims = pod_cidr_claims(&env.client);
    let written: kube::api::DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "ipam.netcm.io/v1alpha1",
        "kind": "PodCIDRClaim",
        "metadata": {"name": "next-version-claim"},
        "spec": {"cidr": "10.250.0.0/18", "term": "next-leader/1"},
    }))
    .expect("a claim");
    claims
        .create(&PostParams::default(), &written)
        .await
        .expect("create a claim with the next version's field");
    add_nodes(&env.client, "between", 3).await;
    let between = allocated(&env.client, 7).await;

    // Step 2, the rollout: the leader goes (as a pod replaced by `helm upgrade` does), the other leads.
    first.signal("TERM");
    first.wait_exit(TIMEOUT).await;
    second.wait_leading(TIMEOUT).await;
    add_nodes(&env.client, "after", 3).await;
    let after = allocated(&env.client, 10).await;

    for (name, cidrs) in before.iter().chain(between.iter()) {
        assert_eq!(
            after.get(name),
            Some(cidrs),
            "{name}'s pod CIDRs changed across the upgrade"
        );
    }
    let held = after.iter().flat_map(|(n, cidrs)| {
        cidrs
            .iter()
            .map(move |c| (c.parse().expect("a CIDR"), n.clone()))
    });
    assert_eq!(overlapping_pairs(held), vec![], "overlapping pod CIDRs");
    let kept = claims
        .get("next-version-claim")
        .await
        .expect("the next version's claim");
    assert_eq!(
        kept.data["spec"]["term"], "next-leader/1",
        "the new field was dropped"
    );
    second.assert_running();
}
