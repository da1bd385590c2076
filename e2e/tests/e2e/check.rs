//! `netcm check` against a real control plane, tried as a new user would: each failure class is created
//! for real (a full pool, overlapping pod CIDRs, a Node's pod CIDR covering the cluster CIDR, no leader,
//! kube-controller-manager allocating beside netcm, the chart's RBAC missing a verb, the API server
//! down, a refused ClusterCIDR) and must be named with the right fix; a healthy cluster run by netcm as
//! the chart's ServiceAccount passes every check.

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};
use netcm_e2e::nodes::pod_cidrs;
use netcm_e2e::{serviceaccount_kubeconfig, wait_for, Netcm, TestEnv, LEASE_NAMESPACE};

mod access;
mod bad_pod_cidrs;
mod leadership;
mod migrations;
mod pools;
mod support;

use support::*;

const TIMEOUT: Duration = Duration::from_secs(30);
/// The chart release whose RBAC the healthy and RBAC tests install (its ServiceAccount runs netcm).
const RELEASE: &str = "netcm-check";
const SERVICE_ACCOUNT: &str = "system:serviceaccount:kube-system:netcm-check";

async fn wait_all_allocated(client: &kube::Client, n: usize) -> Vec<Node> {
    let api: Api<Node> = Api::all(client.clone());
    wait_for(&format!("{n} Nodes with pod CIDRs"), TIMEOUT, || async {
        let nodes = api.list(&ListParams::default()).await.ok()?.items;
        (nodes.iter().filter(|n| !pod_cidrs(n).is_empty()).count() == n).then_some(nodes)
    })
    .await
}

/// Waits until one of `nodes` has a Warning Event with `reason`.
async fn wait_warning(env: &TestEnv, nodes: &[&str], reason: &str) {
    wait_for(
        &format!("a {reason} Warning on one of {nodes:?}"),
        TIMEOUT,
        || async {
            for node in nodes {
                let events = env.node_events(node).await;
                if events.iter().any(|(t, r, _)| t == "Warning" && r == reason) {
                    return Some(());
                }
            }
            None
        },
    )
    .await;
}

#[tokio::test]
async fn a_healthy_cluster_run_by_the_charts_service_account_passes_every_check() {
    let env = TestEnv::new().await;
    apply_chart_rbac(&env.cp.kubeconfig, RELEASE, LEASE_NAMESPACE, None);
    let (sa_kubeconfig, _dir) = serviceaccount_kubeconfig(&env, LEASE_NAMESPACE, RELEASE).await;
    let netcm = Netcm::start(
        "healthy",
        &sa_kubeconfig,
        &[
            "--controllers=subnet-allocator,node-annotation-syncer",
            "--cluster-cidr=10.244.0.0/16",
        ],
    );
    for (i, name) in ["ok-0", "ok-1", "ok-2"].iter().enumerate() {
        register_node(&env.client, name, &format!("192.0.2.{}", 10 + i), &[]).await;
    }
    wait_all_allocated(&env.client, 3).await;
    let api: Api<Node> = Api::all(env.client.clone());
    wait_for("every Node's flannel lease", TIMEOUT, || async {
        let nodes = api.list(&ListParams::default()).await.ok()?.items;
        nodes
            .iter()
            .all(|n| {
                n.metadata
                    .annotations
                    .as_ref()
                    .is_some_and(|a| a.contains_key("flannel.alpha.coreos.com/public-ip"))
            })
            .then_some(())
    })
    .await;
    netcm.assert_running();

    let run = netcm_check(&env.cp.kubeconfig, &[&format!("--as={SERVICE_ACCOUNT}")]);
    assert_eq!(run.code, 0, "{}", run.text);
    for c in run.json["checks"].as_array().expect("checks") {
        assert!(
            c["status"] == "ok" || (c["status"] == "skip" && c["check"] == "routes"),
            "not healthy: {c}\n{}",
            run.text
        );
    }
    assert!(run.findings("rbac")[0]["message"]
        .as_str()
        .unwrap_or("")
        .contains(SERVICE_ACCOUNT));
    assert!(
        run.findings("pool")[0]["message"]
            .as_str()
            .unwrap_or("")
            .contains("3/256"),
        "{}",
        run.text
    );
    assert!(
        run.findings("allocators")[0]["message"]
            .as_str()
            .unwrap_or("")
            .contains("(3 Node(s)"),
        "{}",
        run.text
    );

    let node = netcm_check(&env.cp.kubeconfig, &["node", "ok-1"]);
    assert_eq!(node.code, 0);
    assert!(
        node.json["verdict"]
            .as_str()
            .unwrap_or("")
            .starts_with("healthy: Node ok-1 holds 10.244."),
        "{}",
        node.text
    );
}
