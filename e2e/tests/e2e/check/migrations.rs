//! PodCIDRMigrations as `netcm check` reads them from the API: a stalled one fails the run naming its
//! failed Node and why; a complete one is a ✓ line. The controller's own behaviour is
//! `e2e/tests/e2e/pod_cidr_migration.rs`; here the status is written as the controller would.

use kube::api::{DynamicObject, Patch, PatchParams, PostParams};
use netcm_e2e::pod_cidr_migrations;
use serde_json::json;

use super::*;

async fn migration_with_status(env: &TestEnv, name: &str, status: serde_json::Value) {
    let api = pod_cidr_migrations(&env.client);
    let obj: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "ipam.netcm.io/v1alpha1",
        "kind": "PodCIDRMigration",
        "metadata": {"name": name},
        "spec": {"destination": "wide"},
    }))
    .expect("PodCIDRMigration");
    api.create(&PostParams::default(), &obj)
        .await
        .expect("create PodCIDRMigration");
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({ "status": status })),
    )
    .await
    .expect("write its status");
}

#[tokio::test]
async fn a_stalled_migration_fails_the_check_naming_its_node_and_a_complete_one_passes() {
    let env = TestEnv::new().await;
    migration_with_status(&env, "finished", json!({"phase": "Complete", "done": 3})).await;
    migration_with_status(
        &env,
        "stuck",
        json!({"phase": "Stalled", "failed": 1, "waiting": 2, "nodes": {"mig-0": {
            "step": "Failed", "toward": "wide", "since": "2026-01-01T00:00:00Z",
            "reason": "DrainTimedOut", "podsLeft": 1}}}),
    )
    .await;
    let run = netcm_check(&env.cp.kubeconfig, &["--cluster-cidr=10.244.0.0/16"]);
    assert_eq!(run.code, 1, "{}", run.text);
    let findings = run.findings("migrations");
    assert_eq!(findings.len(), 2, "{}", run.text);
    let stuck = findings
        .iter()
        .find(|f| f["message"].as_str().unwrap_or("").contains("stuck"))
        .expect("the stalled migration's line");
    assert_eq!(stuck["status"], "fail", "{}", run.text);
    assert!(
        stuck["message"]
            .as_str()
            .unwrap_or("")
            .contains("mig-0 (DrainTimedOut)"),
        "{}",
        run.text
    );
    let finished = findings
        .iter()
        .find(|f| f["message"].as_str().unwrap_or("").contains("finished"))
        .expect("the complete migration's line");
    assert_eq!(finished["status"], "ok", "{}", run.text);
}
