//! The example controller (`e2e/example-controller`, walked through in docs/adding-a-controller.md)
//! run by the real manager against the real control plane: a controller written against
//! netcm-manager's public API alone syncs Nodes, reads fields no built-in controller reads (taints, its
//! own label) because it declares them, and is counted like every controller.

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use netcm_e2e::netcm::{metric_sum, workspace_binary};
use netcm_e2e::nodes::{create_node, NodeFixture};
use netcm_e2e::{wait_for, Netcm, TestEnv};

const KEY: &str = "example.netcm.io/tainted";

async fn wait_label(api: &Api<Node>, name: &str, want: &str) {
    wait_for(
        &format!("node {name} to be labelled {KEY}={want}"),
        Duration::from_secs(60),
        || async {
            let node = api.get(name).await.ok()?;
            let labels = node.metadata.labels.unwrap_or_default();
            (labels.get(KEY).map(String::as_str) == Some(want)).then_some(())
        },
    )
    .await;
}

fn taints(taints: serde_json::Value) -> Patch<serde_json::Value> {
    Patch::Merge(serde_json::json!({ "spec": { "taints": taints } }))
}

#[tokio::test]
async fn a_controller_from_outside_the_tree_labels_nodes_by_their_taints_through_the_real_manager()
{
    let env = TestEnv::new().await;
    let api: Api<Node> = Api::all(env.client.clone());
    create_node(&env.client, &NodeFixture::named("ex-plain")).await;
    create_node(&env.client, &NodeFixture::named("ex-tainted")).await;
    // The API server's TaintNodesByCondition admission taints every new Node not-ready.
    api.patch(
        "ex-plain",
        &PatchParams::default(),
        &taints(serde_json::Value::Null),
    )
    .await
    .expect("untaint node");
    let maintenance =
        serde_json::json!([{ "key": "example.io/maintenance", "effect": "NoSchedule" }]);
    api.patch("ex-tainted", &PatchParams::default(), &taints(maintenance))
        .await
        .expect("taint node");

    let bin = workspace_binary("netcm-example-controller", "netcm-example");
    let n = Netcm::start_program("netcm-example", &bin, &env.cp.kubeconfig, &[]);
    wait_label(&api, "ex-plain", "false").await;
    wait_label(&api, "ex-tainted", "true").await;

    // A taint removed later is seen: the cache keeps taints because the controller declared them.
    api.patch(
        "ex-tainted",
        &PatchParams::default(),
        &taints(serde_json::Value::Null),
    )
    .await
    .expect("untaint node");
    wait_label(&api, "ex-tainted", "false").await;

    // Its own label is cached too, so the syncs its own writes cause find nothing to do: three label
    // writes in all, and every sync counted under the controller's name.
    let synced = [r#"controller="taint-labeler""#, r#"result="success""#];
    wait_for(
        "the syncs after the last write to be counted",
        Duration::from_secs(30),
        || async { (metric_sum(&n, "netcm_sync_total", &synced).await >= 6.0).then_some(()) },
    )
    .await;
    // A new leader whose warm cache was proven fresh wrote one Node twice for the proof (the Lease an
    // earlier test left makes this process a new leader); those PATCHes are the manager's, not the
    // controller's.
    let proof_patches = 2.0
        * metric_sum(
            &n,
            "netcm_node_cache_catch_ups_total",
            &[r#"result="proven""#],
        )
        .await;
    assert_eq!(
        metric_sum(&n, "rest_client_requests_total", &[r#"method="PATCH""#]).await - proof_patches,
        3.0,
        "one PATCH per label change"
    );
    assert_eq!(
        metric_sum(
            &n,
            "netcm_sync_total",
            &[r#"controller="taint-labeler""#, r#"result="error""#]
        )
        .await,
        0.0
    );
    assert_eq!(
        metric_sum(
            &n,
            "running_managed_controllers",
            &[r#"name="taint-labeler""#]
        )
        .await,
        1.0
    );
    n.assert_running();
}
