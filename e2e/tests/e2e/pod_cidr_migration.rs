//! Re-numbering on the real control plane: a PodCIDRMigration moves every Node to a new pool, Node by
//! Node (cordon, eviction through the real Eviction API, delete with a UID precondition), while the
//! test plays each kubelet and registers its Node again once deleted. Which Node moves next and what
//! each step waits for is the planner's logic, tested in-process
//! (`controllers/pod-cidr-migration/src/plan/tests.rs`); here the API server decides: what an eviction
//! a PodDisruptionBudget blocks answers, what a delete does, what the allocator gives a Node that
//! comes back while the other pools are closed.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::{Container, Node, Pod, PodSpec};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{
    Api, DeleteParams, DynamicObject, ListParams, ObjectMeta, Patch, PatchParams, PostParams,
};
use netcm_e2e::nodes::{all_nodes, assert_no_overlaps, create_node, wait_allocated, NodeFixture};
use netcm_e2e::{cluster_cidrs, pod_cidr_migrations, wait_for, Netcm, TestEnv};
use serde_json::{json, Value};

const TIMEOUT: Duration = Duration::from_secs(120);
const NAMESPACE: &str = "netcm-migration-e2e";
const FLAG_RANGE: &str = "10.244.0.0/16";
const NEW_RANGE: &str = "10.96.0.0/16";

fn netcm(label: &str, env: &TestEnv) -> Netcm {
    Netcm::start(
        label,
        &env.cp.kubeconfig,
        &[
            "--controllers=subnet-allocator,pod-cidr-migration",
            &format!("--cluster-cidr={FLAG_RANGE}"),
        ],
    )
}

async fn create_new_pool(env: &TestEnv) {
    let obj: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "networking.x-k8s.io/v1",
        "kind": "ClusterCIDR",
        "metadata": {"name": "new"},
        "spec": {"perNodeHostBits": 8, "ipv4": NEW_RANGE},
    }))
    .expect("ClusterCIDR");
    cluster_cidrs(&env.client)
        .create(&PostParams::default(), &obj)
        .await
        .expect("create ClusterCIDR");
}

async fn create_migration(env: &TestEnv, name: &str, spec: Value) {
    let obj: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "ipam.netcm.io/v1alpha1",
        "kind": "PodCIDRMigration",
        "metadata": {"name": name},
        "spec": spec,
    }))
    .expect("PodCIDRMigration");
    pod_cidr_migrations(&env.client)
        .create(&PostParams::default(), &obj)
        .await
        .expect("create PodCIDRMigration");
}

/// Waits until the migration's status says `phase`, and returns the status.
async fn wait_phase(env: &TestEnv, name: &str, phase: &str) -> Value {
    let api = pod_cidr_migrations(&env.client);
    wait_for(
        &format!("migration {name} to be {phase}"),
        TIMEOUT,
        || async {
            let obj = api.get_opt(name).await.ok()??;
            let status = obj.data.get("status")?.clone();
            (status["phase"] == phase).then_some(status)
        },
    )
    .await
}

/// A fresh namespace of test pods (a failed run's pods are force-deleted first).
async fn pods(env: &TestEnv) -> Api<Pod> {
    env.ensure_namespace(NAMESPACE).await;
    let api: Api<Pod> = Api::namespaced(env.client.clone(), NAMESPACE);
    let now = DeleteParams {
        grace_period_seconds: Some(0),
        ..Default::default()
    };
    api.delete_collection(&now, &ListParams::default())
        .await
        .expect("delete old pods");
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(env.client.clone(), NAMESPACE);
    pdbs.delete_collection(&now, &ListParams::default())
        .await
        .expect("delete old PDBs");
    wait_for("old test pods to go", TIMEOUT, || async {
        api.list(&ListParams::default())
            .await
            .ok()?
            .items
            .is_empty()
            .then_some(())
    })
    .await;
    api
}

/// A pod bound to `node` (no kubelet runs it: only the API's view of it matters).
async fn create_pod(api: &Api<Pod>, name: &str, node: &str, app: &str) {
    let pod = Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some([("app".to_string(), app.to_string())].into()),
            ..Default::default()
        },
        spec: Some(PodSpec {
            node_name: Some(node.into()),
            containers: vec![Container {
                name: "app".into(),
                image: Some("netcm.invalid/never-pulled".into()),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    };
    api.create(&PostParams::default(), &pod)
        .await
        .expect("create pod");
}

/// A running, ready pod on `node` whose PodDisruptionBudget allows no eviction.
async fn guarded_pod(env: &TestEnv, pods: &Api<Pod>, node: &str) {
    create_pod(pods, "guarded", node, "guarded").await;
    // Running and Ready, as its kubelet would report: the API server lets a Pending pod be evicted
    // whatever its budget says.
    pods.patch_status(
        "guarded",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": "Running",
            "conditions": [{"type": "Ready", "status": "True"}]}})),
    )
    .await
    .expect("the pod runs");
    // No disruption controller runs here, so the budget never allows an eviction: the API server
    // answers every one with 429.
    let pdb: PodDisruptionBudget = serde_json::from_value(json!({
        "metadata": {"name": "guarded"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "guarded"}}}
    }))
    .expect("PDB");
    Api::<PodDisruptionBudget>::namespaced(env.client.clone(), NAMESPACE)
        .create(&PostParams::default(), &pdb)
        .await
        .expect("create PDB");
}

async fn cordon(env: &TestEnv, node: &str) {
    let nodes: Api<Node> = Api::all(env.client.clone());
    nodes
        .patch(
            node,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"unschedulable": true}})),
        )
        .await
        .expect("cordon");
}

fn unschedulable(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false)
}

fn uid(node: &Node) -> String {
    node.metadata.uid.clone().unwrap_or_default()
}

/// The test's kubelets: a Node deleted comes back under its name (a new UID), as a kubelet registers
/// again. Counts the most Nodes seen out of service (deleted or cordoned by the migration) at once.
struct Kubelets {
    most_out: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Kubelets {
    fn start(env: &TestEnv, names: &[String], cordoned_by_operator: &[&str]) -> Kubelets {
        let nodes: Api<Node> = Api::all(env.client.clone());
        let client = env.client.clone();
        let names = names.to_vec();
        let operator: Vec<String> = cordoned_by_operator.iter().map(|s| s.to_string()).collect();
        let most_out = Arc::new(AtomicUsize::new(0));
        let most = most_out.clone();
        let task = tokio::spawn(async move {
            loop {
                let mut out = 0;
                for name in &names {
                    match nodes.get_opt(name).await {
                        Ok(Some(node)) => {
                            if unschedulable(&node) && !operator.contains(name) {
                                out += 1;
                            }
                        }
                        Ok(None) => {
                            out += 1;
                            create_node(&client, &NodeFixture::named(name)).await;
                        }
                        Err(_) => {}
                    }
                }
                most.fetch_max(out, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        Kubelets { most_out, task }
    }
}

impl Drop for Kubelets {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A Node registered now is given a CIDR inside `range`: which pools are open.
async fn assert_served_from(env: &TestEnv, name: &str, range: &str) {
    create_node(&env.client, &NodeFixture::named(name)).await;
    let got = wait_allocated(&env.client, &[name.to_string()], TIMEOUT).await;
    assert!(inside(range, &got), "{name} served from {range}: {got:?}");
}

fn inside(range: &str, cidrs: &BTreeMap<String, Vec<IpNet>>) -> bool {
    let range: IpNet = range.parse().expect("range");
    cidrs
        .values()
        .all(|c| c.len() == 1 && range.contains(&c[0]))
}

#[tokio::test]
async fn every_node_moves_to_the_new_pool_two_at_a_time_and_the_old_pool_serves_again_once_done() {
    let env = TestEnv::new().await;
    let pods = pods(&env).await;
    let n = netcm("migration-moves", &env);
    let names: Vec<String> = (0..4).map(|i| format!("mig-{i}")).collect();
    for name in &names {
        create_node(&env.client, &NodeFixture::named(name)).await;
    }
    let before = wait_allocated(&env.client, &names, TIMEOUT).await;
    assert!(inside(FLAG_RANGE, &before), "{before:?}");
    let uids_before: BTreeMap<String, String> = all_nodes(&env.client)
        .await
        .iter()
        .map(|n| (n.metadata.name.clone().unwrap_or_default(), uid(n)))
        .collect();
    // An operator's cordon, which the migration must leave in place.
    cordon(&env, "mig-3").await;
    create_pod(&pods, "app-on-mig-0", "mig-0", "plain").await;
    create_new_pool(&env).await;
    let kubelets = Kubelets::start(&env, &names, &["mig-3"]);
    create_migration(
        &env,
        "to-new",
        json!({"destination": "new", "maxUnavailable": 2}),
    )
    .await;

    let status = wait_phase(&env, "to-new", "Complete").await;
    let most_out = kubelets.most_out.load(Ordering::SeqCst);
    drop(kubelets);
    assert_eq!(status["done"], 4, "{status}");
    assert_eq!(status["nodes"], json!({}), "{status}");
    // KEP-1623 conditions: what an operator's `kubectl wait` reads.
    let waited = netcm_e2e::kubectl(&env.cp.kubeconfig)
        .args([
            "wait",
            "--for=condition=Complete",
            "podcidrmigration/to-new",
            "--timeout=30s",
        ])
        .output()
        .expect("run kubectl wait");
    assert!(
        waited.status.success(),
        "kubectl wait: {}",
        String::from_utf8_lossy(&waited.stderr)
    );
    wait_for(
        "a finished migration to drop its finalizer",
        TIMEOUT,
        || async {
            let obj = pod_cidr_migrations(&env.client).get("to-new").await.ok()?;
            obj.metadata
                .finalizers
                .unwrap_or_default()
                .is_empty()
                .then_some(())
        },
    )
    .await;
    let after = wait_allocated(&env.client, &names, TIMEOUT).await;
    assert!(
        inside(NEW_RANGE, &after),
        "every Node in the new pool: {after:?}"
    );
    let nodes = all_nodes(&env.client).await;
    assert_no_overlaps(&nodes);
    for node in &nodes {
        let name = node.metadata.name.clone().unwrap_or_default();
        // The scenario ran: every Node left and registered again.
        assert_ne!(
            uids_before.get(&name),
            Some(&uid(node)),
            "{name} never moved"
        );
        assert_eq!(unschedulable(node), name == "mig-3", "{name}'s cordon");
    }
    assert!(
        (1..=2).contains(&most_out),
        "at most maxUnavailable Nodes out of service at once, and some: {most_out}"
    );
    // The pod was evicted through the API (no kubelet finishes its termination here).
    let pod = pods.get_opt("app-on-mig-0").await.expect("get pod");
    assert!(
        pod.is_none_or(|p| p.metadata.deletion_timestamp.is_some()),
        "the drain evicted the pod"
    );
    assert_eq!(
        n.metric(r#"netcm_pod_cidr_migration_nodes{state="done"}"#)
            .await,
        Some(4.0)
    );
    let deletes = n
        .metric(r#"netcm_pod_cidr_migration_actions_total{action="delete",result="ok"}"#)
        .await
        .unwrap_or(0.0);
    assert!(
        deletes >= 4.0,
        "every Node deleted once at least: {deletes}"
    );
    assert_eq!(
        n.metric("netcm_pod_cidr_migration_node_registered_seconds_count")
            .await,
        Some(4.0),
        "each Node's return observed once"
    );
    // Complete: the flag pool, which the tie-break prefers, serves again.
    assert_served_from(&env, "late", FLAG_RANGE).await;
    drop(n);
}

#[tokio::test]
async fn a_drain_a_disruption_budget_blocks_fails_its_node_back_into_service_and_a_rollback_completes(
) {
    let env = TestEnv::new().await;
    let pods = pods(&env).await;
    let n = netcm("migration-stalls", &env);
    let names: Vec<String> = (0..2).map(|i| format!("stall-{i}")).collect();
    for name in &names {
        create_node(&env.client, &NodeFixture::named(name)).await;
    }
    wait_allocated(&env.client, &names, TIMEOUT).await;
    let uids_before: BTreeMap<String, String> = all_nodes(&env.client)
        .await
        .iter()
        .map(|n| (n.metadata.name.clone().unwrap_or_default(), uid(n)))
        .collect();
    guarded_pod(&env, &pods, "stall-0").await;
    create_new_pool(&env).await;
    create_migration(
        &env,
        "blocked",
        json!({"destination": "new", "drainTimeoutSeconds": 3}),
    )
    .await;

    let status = wait_phase(&env, "blocked", "Stalled").await;
    assert_eq!(
        status["nodes"]["stall-0"]["reason"], "DrainTimedOut",
        "{status}"
    );
    assert_eq!(status["nodes"]["stall-0"]["podsLeft"], 1, "{status}");
    n.wait_metric(
        "netcm_pod_cidr_migration_stalled",
        "1",
        |v| v == 1.0,
        TIMEOUT,
    )
    .await;
    let nodes: Api<Node> = Api::all(env.client.clone());
    let node0 = wait_for("stall-0 back in service", TIMEOUT, || async {
        let node = nodes.get_opt("stall-0").await.ok()??;
        (!unschedulable(&node)).then_some(node)
    })
    .await;
    assert_eq!(
        uids_before.get("stall-0"),
        Some(&uid(&node0)),
        "never deleted"
    );
    // A stalled migration starts no further Node.
    let node1 = nodes.get("stall-1").await.expect("stall-1");
    assert_eq!(uids_before.get("stall-1"), Some(&uid(&node1)));
    assert!(!unschedulable(&node1));
    let guarded = pods.get("guarded").await.expect("the guarded pod");
    assert!(
        guarded.metadata.deletion_timestamp.is_none(),
        "never forced"
    );
    // While it stands, the destination alone serves: a new Node gets a CIDR from it.
    assert_served_from(&env, "stall-new", NEW_RANGE).await;

    // The rollback: the destination back to the flag pool. stall-new is the one Node to move.
    let _kubelets = Kubelets::start(&env, &["stall-new".to_string()], &[]);
    pod_cidr_migrations(&env.client)
        .patch(
            "blocked",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"destination": "default-cluster-cidr"}})),
        )
        .await
        .expect("roll back");
    let status = wait_phase(&env, "blocked", "Complete").await;
    assert_eq!(status["done"], 3, "{status}");
    let all: Vec<String> = vec!["stall-0".into(), "stall-1".into(), "stall-new".into()];
    let after = wait_allocated(&env.client, &all, TIMEOUT).await;
    assert!(inside(FLAG_RANGE, &after), "{after:?}");
    drop(n);
}

#[tokio::test]
async fn a_migration_to_no_pool_is_invalid_and_closes_none() {
    let env = TestEnv::new().await;
    let n = netcm("migration-invalid", &env);
    create_migration(&env, "nowhere", json!({"destination": "no-such-pool"})).await;
    let status = wait_phase(&env, "nowhere", "Invalid").await;
    assert!(
        status["message"]
            .as_str()
            .is_some_and(|m| m.contains("no-such-pool")),
        "{status}"
    );
    assert_served_from(&env, "served", FLAG_RANGE).await;
    drop(n);
}

#[tokio::test]
async fn deleting_a_migration_mid_drain_puts_its_node_back_in_service_and_opens_every_pool() {
    let env = TestEnv::new().await;
    let pods = pods(&env).await;
    let n = netcm("migration-deleted", &env);
    create_node(&env.client, &NodeFixture::named("del-0")).await;
    wait_allocated(&env.client, &["del-0".to_string()], TIMEOUT).await;
    guarded_pod(&env, &pods, "del-0").await;
    create_new_pool(&env).await;
    create_migration(&env, "abandoned", json!({"destination": "new"})).await;
    let nodes: Api<Node> = Api::all(env.client.clone());
    wait_for("del-0 cordoned for its drain", TIMEOUT, || async {
        let node = nodes.get_opt("del-0").await.ok()??;
        unschedulable(&node).then_some(())
    })
    .await;
    let migrations = pod_cidr_migrations(&env.client);
    let obj = migrations.get("abandoned").await.expect("the migration");
    assert!(
        obj.metadata
            .finalizers
            .unwrap_or_default()
            .contains(&"ipam.netcm.io/pod-cidr-migration".to_string()),
        "a running migration carries the finalizer"
    );
    migrations
        .delete("abandoned", &DeleteParams::default())
        .await
        .expect("delete the migration");
    wait_for("the migration gone", TIMEOUT, || async {
        migrations
            .get_opt("abandoned")
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
    let node = nodes.get("del-0").await.expect("del-0");
    assert!(!unschedulable(&node), "put back in service");
    // Every pool is open again: the flag pool, which the tie-break prefers, serves a new Node.
    assert_served_from(&env, "del-late", FLAG_RANGE).await;
    drop(n);
}
