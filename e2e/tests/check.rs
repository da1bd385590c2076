//! `netcm check` against a real control plane, tried as a new user would: each failure class is created
//! for real (a full pool, overlapping pod CIDRs, a Node's pod CIDR covering the cluster CIDR, no leader,
//! kube-controller-manager allocating beside netcm, the chart's RBAC missing a verb, the API server
//! down, a refused ClusterCIDR) and must be named with the right fix; a healthy cluster run by netcm as
//! the chart's ServiceAccount passes every check.

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DynamicObject, ListParams, PostParams};
use netcm_e2e::nodes::pod_cidrs;
use netcm_e2e::{
    cluster_cidrs, serviceaccount_kubeconfig, wait_for, Netcm, TestEnv, LEASE_NAMESPACE,
};

#[path = "check/support.rs"]
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

#[tokio::test]
async fn a_full_pool_names_the_waiting_node_and_says_to_append_a_cluster_cidr() {
    let env = TestEnv::new().await;
    let _netcm = Netcm::start(
        "full",
        &env.cp.kubeconfig,
        &[
            "--controllers=subnet-allocator",
            "--cluster-cidr=10.244.0.0/23",
        ],
    );
    for (i, name) in ["full-0", "full-1", "full-2"].iter().enumerate() {
        register_node(&env.client, name, &format!("192.0.2.{}", 20 + i), &[]).await;
    }
    wait_all_allocated(&env.client, 2).await;
    wait_warning(&env, &["full-0", "full-1", "full-2"], "CIDRNotAvailable").await;
    let waiting = Api::<Node>::all(env.client.clone())
        .list(&ListParams::default())
        .await
        .expect("nodes")
        .items
        .into_iter()
        .find(|n| pod_cidrs(n).is_empty())
        .and_then(|n| n.metadata.name)
        .expect("one Node waits");

    let run = netcm_check(&env.cp.kubeconfig, &[]);
    assert_eq!(run.code, 1);
    let pool = run.failed("pool", "10.244.0.0/23");
    assert!(
        pool["message"].as_str().unwrap_or("").contains("2/2"),
        "{}",
        run.text
    );
    assert!(
        CheckRun::fix(pool).contains("append a second, unused cluster CIDR"),
        "{}",
        run.text
    );
    let w = run.failed("waiting", &waiting);
    assert!(
        w["message"]
            .as_str()
            .unwrap_or("")
            .contains("10.244.0.0/23 is full (2/2)"),
        "{}",
        run.text
    );

    let node = netcm_check(&env.cp.kubeconfig, &["node", &waiting]);
    assert_eq!(node.code, 1);
    let verdict = node.json["verdict"].as_str().unwrap_or("");
    assert!(
        verdict.starts_with(
            "no pod CIDR: IPv4 cluster CIDR 10.244.0.0/23 is full (2/2); append a second"
        ),
        "{verdict}"
    );
    assert!(
        node.text.contains("CIDRNotAvailable"),
        "the Event netcm recorded is shown:\n{}",
        node.text
    );
}

#[tokio::test]
async fn a_clustercidr_pools_nodes_are_counted_there_and_a_refused_clustercidr_is_named() {
    let env = TestEnv::new().await;
    for (name, spec) in [
        // A pool of its own for a rack of Nodes, labelled so. None here is: plain-0 gets a CIDR of the
        // flag pool, and rack-0's CIDR from this range must still count here.
        (
            "check-rack",
            serde_json::json!({"perNodeHostBits": 8, "ipv4": "10.128.0.0/16",
                "nodeSelector": {"nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "netcm-e2e/rack", "operator": "In", "values": ["a"]}]}]}}),
        ),
        // Half of the flag pool's range: refused, as it overlaps without being the same range.
        (
            "check-clash",
            serde_json::json!({"perNodeHostBits": 8, "ipv4": "10.244.0.0/17"}),
        ),
    ] {
        let obj: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "networking.x-k8s.io/v1",
            "kind": "ClusterCIDR",
            "metadata": {"name": name},
            "spec": spec,
        }))
        .expect("ClusterCIDR");
        cluster_cidrs(&env.client)
            .create(&PostParams::default(), &obj)
            .await
            .expect("create ClusterCIDR");
    }
    let _netcm = Netcm::start(
        "pools",
        &env.cp.kubeconfig,
        &[
            "--controllers=subnet-allocator",
            "--cluster-cidr=10.244.0.0/16",
        ],
    );
    // A Node that already holds a CIDR of the rack pool, and one the allocator serves.
    register_node(&env.client, "rack-0", "192.0.2.40", &["10.128.0.0/24"]).await;
    register_node(&env.client, "plain-0", "192.0.2.41", &[]).await;
    wait_all_allocated(&env.client, 2).await;

    let run = netcm_check(&env.cp.kubeconfig, &[]);
    let cidrs = run.findings("cidrs");
    assert!(
        cidrs.iter().all(|f| f["status"] == "ok"),
        "a CIDR from a ClusterCIDR pool is not out of range:\n{}",
        run.text
    );
    let rack = run
        .findings("pool")
        .into_iter()
        .find(|f| {
            f["message"]
                .as_str()
                .unwrap_or("")
                .starts_with("ClusterCIDR check-rack")
        })
        .unwrap_or_else(|| panic!("no line for the rack pool:\n{}", run.text));
    assert_eq!(rack["status"], "ok", "{}", run.text);
    assert!(
        rack["message"].as_str().unwrap_or("").contains("1/256"),
        "{}",
        run.text
    );
    let flag = run.findings("pool")[0]["message"].as_str().unwrap_or("");
    assert!(
        flag.contains("10.244.0.0/16") && flag.contains("1/256"),
        "{}",
        run.text
    );
    let clash = run.failed("pool", "ClusterCIDR check-clash is refused");
    assert!(
        CheckRun::fix(clash).contains("kubectl describe clustercidr check-clash"),
        "{}",
        run.text
    );
    assert_eq!(run.code, 1, "a refused ClusterCIDR fails the check");
}

#[tokio::test]
async fn overlapping_pod_cidrs_are_named_with_both_nodes_and_the_one_to_recreate() {
    let env = TestEnv::new().await;
    register_node(&env.client, "overlap-old", "192.0.2.30", &["10.244.7.0/24"]).await;
    tokio::time::sleep(Duration::from_millis(1100)).await; // creation timestamps have second precision
    register_node(&env.client, "overlap-new", "192.0.2.31", &["10.244.7.0/25"]).await;
    let _netcm = Netcm::start(
        "overlap",
        &env.cp.kubeconfig,
        &[
            "--controllers=subnet-allocator",
            "--cluster-cidr=10.244.0.0/16",
        ],
    );
    wait_warning(&env, &["overlap-new", "overlap-old"], "CIDRConflict").await;

    let run = netcm_check(&env.cp.kubeconfig, &[]);
    assert_eq!(run.code, 1);
    let overlap = run.failed("cidrs", "overlaps");
    let nodes: Vec<&str> = overlap["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .filter_map(|v| v.as_str())
        .collect();
    assert_eq!(nodes, ["overlap-new", "overlap-old"], "{}", run.text);
    assert!(
        CheckRun::fix(overlap).contains("kubectl delete node overlap-new"),
        "{}",
        run.text
    );
    // Whoever wrote them is not netcm: the allocators check names that writer too.
    run.failed("allocators", "overlap-new");

    let node = netcm_check(&env.cp.kubeconfig, &["node", "overlap-old"]);
    let verdict = node.json["verdict"].as_str().unwrap_or("");
    assert!(
        verdict.starts_with("bad pod CIDR:") && verdict.contains("overlap-new"),
        "{verdict}"
    );
}

#[tokio::test]
async fn a_node_whose_pod_cidr_covers_the_cluster_cidr_is_named_on_the_full_pool_and_the_nodes_inside_it_are_not_blamed(
) {
    let env = TestEnv::new().await;
    let _netcm = Netcm::start(
        "oversized",
        &env.cp.kubeconfig,
        &[
            "--controllers=subnet-allocator",
            "--cluster-cidr=10.244.0.0/16",
        ],
    );
    for (i, name) in ["inside-0", "inside-1"].iter().enumerate() {
        register_node(&env.client, name, &format!("192.0.2.{}", 50 + i), &[]).await;
    }
    let inside = wait_all_allocated(&env.client, 2).await;
    // A kubelet registered with --pod-cidr=10.0.0.0/8: the whole cluster CIDR, and both Nodes' CIDRs.
    register_node(&env.client, "hostile", "192.0.2.59", &["10.0.0.0/8"]).await;
    wait_warning(&env, &["hostile"], "CIDROversized").await;
    register_node(&env.client, "waits", "192.0.2.58", &[]).await;
    wait_warning(&env, &["waits"], "CIDRNotAvailable").await;

    let run = netcm_check(&env.cp.kubeconfig, &[]);
    assert_eq!(run.code, 1);
    let pool = run.failed("pool", "10.244.0.0/16");
    assert!(
        pool["message"].as_str().unwrap_or("").ends_with(
            "256/256 node CIDRs in use (100 %): full — Node hostile holds 10.0.0.0/8, which keeps all 256 of its node CIDRs reserved"
        ),
        "{}",
        run.text
    );
    assert_eq!(
        pool["nodes"],
        serde_json::json!(["hostile"]),
        "{}",
        run.text
    );
    assert!(
        CheckRun::fix(pool).starts_with("remove --pod-cidr from Node hostile's kubelet"),
        "{}",
        run.text
    );
    let oversized = run.failed(
        "cidrs",
        "Node hostile's pod CIDR 10.0.0.0/8 is wider than the /24 node CIDRs",
    );
    let message = oversized["message"].as_str().unwrap_or("");
    assert!(
        message.contains("it overlaps the pod CIDRs of Nodes "),
        "{}",
        run.text
    );
    for n in &inside {
        let name = n.metadata.name.as_deref().unwrap_or("");
        let cidr = pod_cidrs(n).join(",");
        assert!(
            message.contains(&format!("{name} ({cidr})")),
            "{name} ({cidr}) not named:\n{}",
            run.text
        );
    }
    assert!(
        CheckRun::fix(oversized).contains("then kubectl delete node hostile;"),
        "{}",
        run.text
    );
    let cidrs = run.findings("cidrs");
    assert_eq!(
        cidrs.len(),
        1,
        "one line for the oversized CIDR, none for the Nodes inside it:\n{}",
        run.text
    );
    assert!(
        !run.text.contains("kubectl delete node inside-"),
        "a Node inside the oversized CIDR is told to re-create itself:\n{}",
        run.text
    );
    let waiting = run.failed("waiting", "Node waits has no pod CIDR");
    assert!(
        waiting["message"]
            .as_str()
            .unwrap_or("")
            .contains("Node hostile holds 10.0.0.0/8"),
        "{}",
        run.text
    );

    let node = netcm_check(&env.cp.kubeconfig, &["node", "hostile"]);
    assert_eq!(node.code, 1);
    let verdict = node.json["verdict"].as_str().unwrap_or("");
    assert!(
        verdict.starts_with("bad pod CIDR: Node hostile's pod CIDR 10.0.0.0/8 is wider"),
        "{verdict}"
    );
    let node = netcm_check(&env.cp.kubeconfig, &["node", "inside-0"]);
    assert!(
        node.text
            .contains("lies inside Node hostile's pod CIDR 10.0.0.0/8"),
        "{}",
        node.text
    );
}

#[tokio::test]
async fn no_leader_is_named_with_why_missing_expired_or_released() {
    let env = TestEnv::new().await;
    let run = netcm_check(&env.cp.kubeconfig, &[]);
    assert_eq!(run.code, 1);
    let missing = run.failed("leader", "does not exist");
    assert!(
        CheckRun::fix(missing).contains("helm install netcm"),
        "{}",
        run.text
    );

    let fast = [
        "--controllers=subnet-allocator",
        "--cluster-cidr=10.244.0.0/16",
        "--leader-elect-lease-duration=3s",
        "--leader-elect-renew-deadline=2s",
        "--leader-elect-retry-period=500ms",
    ];
    let mut killed = Netcm::start("killed", &env.cp.kubeconfig, &fast);
    killed.wait_leading(TIMEOUT).await;
    let identity = wait_for("the killed replica to hold the Lease", TIMEOUT, || {
        netcm_e2e::lease_holder(&env.client, netcm_e2e::LEASE_NAME)
    })
    .await;
    killed.signal("KILL");
    killed.wait_exit(TIMEOUT).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let run = netcm_check(&env.cp.kubeconfig, &[]);
    let expired = run.failed("leader", &format!("{identity} last renewed"));
    assert!(
        expired["message"]
            .as_str()
            .unwrap_or("")
            .contains("no standby took over"),
        "{}",
        run.text
    );

    let mut stopped = Netcm::start("stopped", &env.cp.kubeconfig, &fast);
    stopped.wait_leading(TIMEOUT).await;
    stopped.signal("TERM");
    stopped.wait_exit(TIMEOUT).await;
    let run = netcm_check(&env.cp.kubeconfig, &[]);
    let released = run.failed("leader", "released");
    assert!(
        CheckRun::fix(released).contains("--replicas"),
        "{}",
        run.text
    );
}

#[tokio::test]
async fn kube_controller_manager_allocating_beside_netcm_is_named_with_how_to_turn_it_off() {
    let env = TestEnv::new().await;
    let kcm = Kcm::start(&env.cp.kubeconfig, "10.244.0.0/16");
    register_node(&env.client, "kcm-node", "192.0.2.40", &[]).await;
    let api: Api<Node> = Api::all(env.client.clone());
    wait_for(
        "kube-controller-manager to allocate kcm-node",
        Duration::from_secs(60),
        || async {
            let n = api.get("kcm-node").await.ok()?;
            (!pod_cidrs(&n).is_empty()).then_some(())
        },
    )
    .await;
    drop(kcm);
    let netcm = Netcm::start(
        "beside-kcm",
        &env.cp.kubeconfig,
        &[
            "--controllers=subnet-allocator",
            "--cluster-cidr=10.244.0.0/16",
        ],
    );
    register_node(&env.client, "netcm-node", "192.0.2.41", &[]).await;
    wait_all_allocated(&env.client, 2).await;
    netcm.assert_running();

    let run = netcm_check(&env.cp.kubeconfig, &[]);
    assert_eq!(run.code, 1);
    let other = run.failed("allocators", "\"kube-controller-manager\"");
    let nodes: Vec<&str> = other["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .filter_map(|v| v.as_str())
        .collect();
    assert_eq!(nodes, ["kcm-node"], "{}", run.text);
    assert!(
        CheckRun::fix(other).contains("--allocate-node-cidrs=false"),
        "{}",
        run.text
    );
}

#[tokio::test]
async fn rbac_missing_a_verb_is_named_with_the_feature_and_how_to_restore_it() {
    let env = TestEnv::new().await;
    apply_chart_rbac(
        &env.cp.kubeconfig,
        RELEASE,
        LEASE_NAMESPACE,
        Some(("nodes", "patch")),
    );
    let run = netcm_check(&env.cp.kubeconfig, &[&format!("--as={SERVICE_ACCOUNT}")]);
    apply_chart_rbac(&env.cp.kubeconfig, RELEASE, LEASE_NAMESPACE, None);
    assert_eq!(run.code, 1);
    let denied = run.failed("rbac", "may not patch nodes");
    assert!(
        denied["message"]
            .as_str()
            .unwrap_or("")
            .contains("writing pod CIDRs"),
        "{}",
        run.text
    );
    let fix = CheckRun::fix(denied);
    assert!(
        fix.contains("helm upgrade netcm") && fix.contains("kubectl auth can-i patch nodes"),
        "{fix}"
    );
    let rbac = run.findings("rbac");
    assert_eq!(
        rbac.len(),
        1,
        "only the missing verb is reported:\n{}",
        run.text
    );
}

/// Starts the API server again when the test ends, even when it fails.
struct ApiServerBack;

impl Drop for ApiServerBack {
    fn drop(&mut self) {
        netcm_e2e::start_apiserver();
    }
}

#[tokio::test]
async fn an_unreachable_api_server_is_named_with_its_address_and_how_to_reach_one() {
    let env = TestEnv::new().await;
    let server = std::fs::read_to_string(&env.cp.kubeconfig)
        .expect("kubeconfig")
        .lines()
        .find_map(|l| l.trim().strip_prefix("server: ").map(str::to_string))
        .expect("server");
    netcm_e2e::stop_apiserver();
    let _back = ApiServerBack;
    let run = netcm_check(&env.cp.kubeconfig, &[]);
    assert_eq!(run.code, 1);
    let checks = run.json["checks"].as_array().expect("checks");
    assert_eq!(checks.len(), 1, "nothing else is checked:\n{}", run.text);
    let api = run.failed("api", "unreachable");
    assert!(
        api["message"]
            .as_str()
            .unwrap_or("")
            .contains(server.trim_end_matches('/')),
        "{}",
        run.text
    );
    assert!(
        CheckRun::fix(api).contains("start kube-apiserver"),
        "{}",
        run.text
    );
}
