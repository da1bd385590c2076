//! `--cidr-release-hold` on the real control plane: a deleted Node's pod CIDR is free again once the hold
//! ends, and the hold survives a leader change (recorded on the block's PodCIDRClaim), as does the
//! `spec.providerID` a Node back on the same machine under another name is recognised by (with
//! `--cidr-release-hold-rejoin-by-provider-id`). How a hold
//! gives a CIDR back to its name, or early to a full pool's waiting Node, is the allocator's logic alone,
//! tested in-process (controllers/subnet-allocator/src/tests/release_hold.rs).

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DeleteParams};
use netcm_e2e::nodes::{
    all_nodes, assert_no_overlaps, create_node, create_nodes, pod_cidrs, wait_all_allocated,
    NodeFixture,
};
use netcm_e2e::{pod_cidr_claims, wait_for, Netcm, TestEnv};

const HELD: &str = r#"netcm_pool_release_hold_cidrs{family="IPv4",pool="default-cluster-cidr"}"#;
const CUT_SHORT: &str = r#"netcm_pool_release_hold_cut_short_total{pool="default-cluster-cidr"}"#;

/// A /28 of /30s: four pod CIDRs.
fn args(hold: &str) -> Vec<String> {
    [
        "--controllers=subnet-allocator",
        "--cluster-cidr=10.251.0.0/28",
        "--node-cidr-mask-size=30",
    ]
    .into_iter()
    .map(String::from)
    .chain([format!("--cidr-release-hold={hold}")])
    .collect()
}

fn start(env: &TestEnv, label: &str, hold: &str) -> Netcm {
    start_with(env, label, hold, &[])
}

/// [`start`] with `extra` flags.
fn start_with(env: &TestEnv, label: &str, hold: &str, extra: &[&str]) -> Netcm {
    let args = args(hold);
    let args: Vec<&str> = args
        .iter()
        .map(String::as_str)
        .chain(extra.iter().copied())
        .collect();
    Netcm::start(label, &env.cp.kubeconfig, &args)
}

/// Holds go back by `spec.providerID` too (off by default: it is the Node's own word).
const BY_PROVIDER_ID: &str = "--cidr-release-hold-rejoin-by-provider-id";

/// Creates `names` and waits until every Node has its CIDR; returns them by name.
async fn allocate_all(env: &TestEnv, names: &[&str]) -> BTreeMap<String, String> {
    let fixtures = names.iter().map(|n| NodeFixture::named(*n)).collect();
    allocate_fixtures(env, fixtures).await
}

/// [`allocate_all`] for Nodes built by the caller.
async fn allocate_fixtures(env: &TestEnv, fixtures: Vec<NodeFixture>) -> BTreeMap<String, String> {
    let count = fixtures.len();
    create_nodes(&env.client, fixtures, count).await;
    wait_all_allocated(&env.client, count, Duration::from_secs(30)).await;
    all_nodes(&env.client)
        .await
        .iter()
        .map(|n| {
            let cidrs = pod_cidrs(n);
            (n.metadata.name.clone().unwrap_or_default(), cidrs.join(","))
        })
        .collect()
}

async fn delete_and_wait_gone(env: &TestEnv, name: &str) {
    let api: Api<Node> = Api::all(env.client.clone());
    api.delete(name, &DeleteParams::default())
        .await
        .expect("delete node");
    wait_for("the node to be gone", Duration::from_secs(20), || async {
        api.get_opt(name).await.ok()?.is_none().then_some(())
    })
    .await;
}

async fn cidr_of(env: &TestEnv, name: &str) -> String {
    let api: Api<Node> = Api::all(env.client.clone());
    wait_for("the node's pod CIDR", Duration::from_secs(30), || async {
        let node = api.get_opt(name).await.ok()??;
        let cidrs = pod_cidrs(&node);
        (!cidrs.is_empty()).then(|| cidrs.join(","))
    })
    .await
}

#[tokio::test]
async fn a_cidr_is_free_for_any_node_once_its_release_hold_ends() {
    let env = TestEnv::new().await;
    let n = start(&env, "release-hold-ends", "3s");
    let before = allocate_all(&env, &["end-a", "end-b", "end-c", "end-d"]).await;
    let releases =
        r#"node_ipam_controller_cidrset_cidrs_releases_total{clusterCIDR="10.251.0.0/28"}"#;
    let released_before = n.metric(releases).await.unwrap_or(0.0);
    delete_and_wait_gone(&env, "end-c").await;
    n.wait_metric(
        HELD,
        "c's CIDR in release hold",
        |v| v == 1.0,
        Duration::from_secs(10),
    )
    .await;
    // Counted as released only when the hold ends.
    assert_eq!(n.metric(releases).await.unwrap_or(0.0), released_before);
    n.wait_metric(
        HELD,
        "the hold to end",
        |v| v == 0.0,
        Duration::from_secs(20),
    )
    .await;
    assert_eq!(
        n.metric(releases).await.unwrap_or(0.0),
        released_before + 1.0
    );
    create_node(&env.client, &NodeFixture::named("after")).await;
    assert_eq!(cidr_of(&env, "after").await, before["end-c"]);
    assert_eq!(
        n.metric(CUT_SHORT).await.unwrap_or(0.0),
        0.0,
        "the hold had ended: nothing was cut short"
    );
    assert_no_overlaps(&all_nodes(&env.client).await);
}

/// The release-hold records on every PodCIDRClaim.
async fn hold_records(env: &TestEnv) -> usize {
    let list = pod_cidr_claims(&env.client)
        .list(&kube::api::ListParams::default())
        .await
        .expect("list claims");
    list.items
        .iter()
        .flat_map(|c| c.metadata.annotations.iter().flatten())
        .filter(|(k, _)| k.starts_with("release-hold.ipam.netcm.io/"))
        .count()
}

#[tokio::test]
async fn a_hold_survives_a_leader_change_and_its_node_still_gets_its_cidr_back() {
    let env = TestEnv::new().await;
    let mut first = start_with(&env, "release-hold-first", "1h", &[BY_PROVIDER_ID]);
    let fixtures = ["lead-a", "lead-b", "lead-c", "lead-d"]
        .map(|n| NodeFixture::named(n).provider_id(&format!("netcm-e2e:///machine-{n}")));
    let before = allocate_fixtures(&env, fixtures.into()).await;
    delete_and_wait_gone(&env, "lead-a").await;
    delete_and_wait_gone(&env, "lead-b").await;
    first
        .wait_metric(
            HELD,
            "two CIDRs in release hold",
            |v| v == 2.0,
            Duration::from_secs(20),
        )
        .await;
    wait_for(
        "both holds recorded on their claim",
        Duration::from_secs(20),
        || async { (hold_records(&env).await == 2).then_some(()) },
    )
    .await;
    // A hand-over as a rolling update does it: SIGTERM, the lease released, a new process leads.
    first.signal("TERM");
    first.wait_exit(Duration::from_secs(30)).await;
    let second = start_with(&env, "release-hold-second", "1h", &[BY_PROVIDER_ID]);
    second
        .wait_metric(
            HELD,
            "the new leader restored both holds",
            |v| v == 2.0,
            Duration::from_secs(60),
        )
        .await;
    create_node(&env.client, &NodeFixture::named("lead-b")).await;
    assert_eq!(
        cidr_of(&env, "lead-b").await,
        before["lead-b"],
        "lead-b, back after the hand-over, gets its own CIDR, not lead-a's"
    );
    second
        .wait_metric(
            HELD,
            "lead-a's hold still running",
            |v| v == 1.0,
            Duration::from_secs(20),
        )
        .await;
    // lead-a's machine registers again under another name: its providerID, recorded on the claim before
    // the hand-over, names the hold.
    create_node(
        &env.client,
        &NodeFixture::named("renamed-a").provider_id("netcm-e2e:///machine-lead-a"),
    )
    .await;
    assert_eq!(
        cidr_of(&env, "renamed-a").await,
        before["lead-a"],
        "the Node on lead-a's machine gets lead-a's CIDR back"
    );
    second
        .wait_metric(HELD, "no hold left", |v| v == 0.0, Duration::from_secs(20))
        .await;
    assert_eq!(second.metric(CUT_SHORT).await.unwrap_or(0.0), 0.0);
    assert_no_overlaps(&all_nodes(&env.client).await);
}
