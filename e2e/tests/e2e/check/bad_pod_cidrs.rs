//! Bad pod CIDRs on Nodes: overlapping ones named with the Node to re-create, one covering the whole
//! cluster CIDR named on the full pool without blaming the Nodes inside it.

use super::*;

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
