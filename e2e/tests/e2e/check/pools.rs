//! A full pool, and ClusterCIDR pools: the Nodes counted where they are, a refused ClusterCIDR named.

use kube::api::{DynamicObject, PostParams};
use netcm_e2e::cluster_cidrs;

use super::*;

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
