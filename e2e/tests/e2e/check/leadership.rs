//! Who allocates: no leader (missing, expired or released), and kube-controller-manager allocating
//! beside netcm.

use super::*;

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
