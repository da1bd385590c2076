//! The manager core on the real control plane: leader election and hand-over, fencing of a frozen leader,
//! API server outages, metrics and health, and `--controllers`.

use std::time::{Duration, Instant};

use netcm_e2e::nodes::{create_node, create_nodes, pod_cidrs, NodeFixture};
use netcm_e2e::{audit, lease_holder, start_apiserver, stop_apiserver, wait_for, Netcm, TestEnv};

/// Fast leader-election settings so failover tests take seconds (client-go's rules still hold).
const FAST_LEASE: [&str; 3] = [
    "--leader-elect-lease-duration=4s",
    "--leader-elect-renew-deadline=3s",
    "--leader-elect-retry-period=1s",
];

fn allocator_args<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    let mut v = vec![
        "--controllers=subnet-allocator",
        "--cluster-cidr=10.244.0.0/16",
    ];
    v.extend_from_slice(extra);
    v
}

async fn start_pair(env: &TestEnv, extra: &[&str]) -> (Netcm, Netcm, String) {
    let a = Netcm::start("replica-a", &env.cp.kubeconfig, &allocator_args(extra));
    let a_id = a.identity().await;
    wait_for("replica-a to lead", Duration::from_secs(30), || async {
        (lease_holder(&env.client, "netcm").await.as_deref() == Some(a_id.as_str())).then_some(())
    })
    .await;
    let b = Netcm::start("replica-b", &env.cp.kubeconfig, &allocator_args(extra));
    b.wait_log(
        "standing by: the lease is held by another replica",
        Duration::from_secs(30),
    )
    .await;
    let b_id = b.identity().await;
    (a, b, b_id)
}

#[tokio::test]
async fn two_replicas_elect_exactly_one_leader_and_the_standby_reports_ready() {
    let env = TestEnv::new().await;
    let (a, b, _) = start_pair(&env, &[]).await;
    a.wait_log("this replica now leads", Duration::from_secs(10))
        .await;
    assert!(
        !b.logs().contains("this replica now leads"),
        "the standby must not lead"
    );
    let (code, body) = b
        .http_get("/readyz?verbose")
        .await
        .expect("standby serves /readyz");
    assert_eq!(code, 200, "standby must be ready: {body}");
    assert_eq!(
        b.metric("leader_election_master_status{name=\"netcm\"}")
            .await,
        Some(0.0)
    );
    assert_eq!(
        a.metric("leader_election_master_status{name=\"netcm\"}")
            .await,
        Some(1.0)
    );
}

#[tokio::test]
async fn sigterm_on_the_leader_hands_the_lease_to_the_standby_in_under_three_seconds() {
    let env = TestEnv::new().await;
    let mut handovers = Vec::new();
    for round in 0..5 {
        let (mut a, b, b_id) = start_pair(&env, &[]).await;
        let t0 = Instant::now();
        a.signal("TERM");
        wait_for(
            "the standby to take the lease",
            Duration::from_secs(20),
            || async {
                (lease_holder(&env.client, "netcm").await.as_deref() == Some(b_id.as_str()))
                    .then_some(())
            },
        )
        .await;
        handovers.push(t0.elapsed());
        let status = a.wait_exit(Duration::from_secs(20)).await;
        assert!(
            status.success(),
            "round {round}: the old leader must exit 0 on SIGTERM, got {status}"
        );
        b.wait_log("this replica now leads", Duration::from_secs(5))
            .await;
        drop(b);
        env.clean().await;
    }
    handovers.sort();
    let median = handovers[2];
    eprintln!("SIGTERM hand-over times: {handovers:?}; median {median:?}");
    assert!(
        median < Duration::from_secs(3),
        "median hand-over {median:?} must be under 3 s"
    );
}

#[tokio::test]
async fn after_kill_9_the_standby_leads_within_lease_duration_plus_retry_period() {
    let env = TestEnv::new().await;
    let (a, b, b_id) = start_pair(&env, &FAST_LEASE).await;
    let t0 = Instant::now();
    a.signal("KILL");
    wait_for(
        "the standby to take the lease",
        Duration::from_secs(30),
        || async {
            (lease_holder(&env.client, "netcm").await.as_deref() == Some(b_id.as_str()))
                .then_some(())
        },
    )
    .await;
    let took = t0.elapsed();
    eprintln!("kill -9 takeover: {took:?}");
    // lease 4 s + retry 1 s with client-go's jitter (up to 2.2 s) + one request.
    assert!(
        took < Duration::from_millis(4000 + 2200 + 1000),
        "takeover took {took:?}"
    );
    drop(b);
}

#[tokio::test]
async fn a_frozen_leader_writes_nothing_after_its_lease_expired_and_exits_non_zero() {
    let env = TestEnv::new().await;
    let (mut a, b, _) = start_pair(&env, &FAST_LEASE).await;
    let a_id = a.identity().await;
    a.signal("STOP");
    // While it is frozen: Nodes arrive; the standby takes over and allocates them. The frozen leader's
    // watch will deliver them too when it wakes up, so it has work it must not do.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let fixtures: Vec<NodeFixture> = (0..100)
        .map(|i| NodeFixture::named(format!("zombie-{i:03}")))
        .collect();
    create_nodes(&env.client, fixtures, 16).await;
    b.wait_log("this replica now leads", Duration::from_secs(20))
        .await;
    tokio::time::sleep(Duration::from_secs(6)).await;
    a.signal("CONT");
    let status = a.wait_exit(Duration::from_secs(30)).await;
    assert!(
        !status.success(),
        "a leader that lost its lease must exit non-zero, got {status}"
    );
    assert!(
        a.logs().contains("leaderelection lost"),
        "the old leader must log the loss"
    );

    // Its lease expired (for others) lease-duration after its last successful renewal.
    let events = audit::read(&env.cp.audit_log);
    let mine = |e: &&audit::AuditEvent| e.user_agent.contains(&a_id);
    let last_renewal = events
        .iter()
        .filter(mine)
        .filter(|e| e.resource() == "leases" && e.succeeded() && e.verb != "get")
        .filter_map(|e| e.received())
        .max()
        .expect("the old leader renewed its lease at least once");
    let expired = last_renewal + jiff::SignedDuration::from_secs(4);
    let late_writes: Vec<_> = events
        .iter()
        .filter(mine)
        .filter(|e| matches!(e.resource().as_str(), "nodes" | "nodes/status" | "events"))
        .filter(|e| e.succeeded())
        .filter(|e| e.received().is_some_and(|t| t > expired))
        .collect();
    assert!(
        late_writes.is_empty(),
        "writes after the lease expired: {late_writes:#?}"
    );
    let fenced = a
        .logs()
        .matches("write refused by the leader fence")
        .count();
    eprintln!("frozen leader: {fenced} writes refused by the fence after waking");
    // Every Node is allocated by the new leader, without overlaps.
    wait_for(
        "all nodes to get a CIDR",
        Duration::from_secs(60),
        || async {
            let nodes: kube::Api<k8s_openapi::api::core::v1::Node> =
                kube::Api::all(env.client.clone());
            let list = nodes.list(&Default::default()).await.ok()?;
            list.items
                .iter()
                .all(|n| !pod_cidrs(n).is_empty())
                .then_some(())
        },
    )
    .await;
}

#[tokio::test]
async fn an_apiserver_outage_of_20s_is_ridden_out_and_the_informer_catches_up() {
    let env = TestEnv::new().await;
    // A lease long enough to survive the outage: netcm keeps leading rather than restarting.
    let n = Netcm::start(
        "outage",
        &env.cp.kubeconfig,
        &allocator_args(&[
            "--leader-elect-lease-duration=60s",
            "--leader-elect-renew-deadline=40s",
            "--leader-elect-retry-period=2s",
        ]),
    );
    n.wait_log("this replica now leads", Duration::from_secs(30))
        .await;
    create_node(&env.client, &NodeFixture::named("before-outage")).await;
    n.wait_log("node=\"before-outage\"", Duration::from_secs(10))
        .await;
    tokio::task::spawn_blocking(stop_apiserver)
        .await
        .expect("stop");
    tokio::time::sleep(Duration::from_secs(20)).await;
    tokio::task::spawn_blocking(start_apiserver)
        .await
        .expect("start");
    let client = netcm_e2e::client_for(&env.cp.kubeconfig).await;
    create_node(&client, &NodeFixture::named("after-outage")).await;
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(client.clone());
    wait_for(
        "the node created right after the outage to be allocated",
        Duration::from_secs(60),
        || async {
            let node = nodes.get_opt("after-outage").await.ok().flatten()?;
            (!pod_cidrs(&node).is_empty()).then_some(())
        },
    )
    .await;
    assert!(
        !n.logs().contains("leaderelection lost"),
        "netcm must keep its lease through a 20 s outage"
    );
}

#[tokio::test]
async fn metrics_and_health_endpoints_serve_what_the_design_names() {
    let env = TestEnv::new().await;
    create_node(&env.client, &NodeFixture::named("metrics-node")).await;
    let n = Netcm::start("metrics", &env.cp.kubeconfig, &allocator_args(&[]));
    n.wait_log("assigned pod CIDRs", Duration::from_secs(30))
        .await;
    let (code, body) = n.http_get("/metrics").await.expect("/metrics");
    assert_eq!(code, 200);
    for family in [
        "workqueue_depth",
        "workqueue_adds_total",
        "workqueue_queue_duration_seconds",
        "workqueue_work_duration_seconds",
        "workqueue_unfinished_work_seconds",
        "workqueue_longest_running_processor_seconds",
        "workqueue_retries_total",
        "leader_election_master_status",
        "rest_client_requests_total",
        "rest_client_request_duration_seconds",
        "running_managed_controllers",
        "netcm_build_info",
        "netcm_fenced_writes_total",
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
    ] {
        assert!(
            body.contains(&format!("# TYPE {family} ")),
            "/metrics lacks {family}"
        );
    }
    assert!(
        body.contains("running_managed_controllers{manager=\"netcm\",name=\"subnet-allocator\"} 1")
    );
    assert!(body.contains("workqueue_adds_total{name=\"subnet-allocator\"}"));
    for path in [
        "/healthz",
        "/healthz/leaderElection",
        "/healthz/ping",
        "/livez",
        "/readyz",
    ] {
        let (code, body) = n.http_get(path).await.expect(path);
        assert_eq!(code, 200, "{path}: {body}");
    }
    let (code, _) = n
        .http_get("/healthz/no-such-check")
        .await
        .expect("unknown check");
    assert_eq!(code, 404);
}

#[tokio::test]
async fn controllers_flag_follows_kcm_rules_and_an_unknown_name_exits_2() {
    let env = TestEnv::new().await;
    let n = Netcm::start(
        "controllers",
        &env.cp.kubeconfig,
        &[
            "--controllers=-route-controller,*",
            "--cluster-cidr=10.244.0.0/16",
            "--leader-elect=false",
        ],
    );
    n.wait_log(
        "started controller controller=\"subnet-allocator\"",
        Duration::from_secs(30),
    )
    .await;
    n.wait_log(
        "skipping controller: disabled by --controllers controller=\"route-controller\"",
        Duration::from_secs(5),
    )
    .await;
    drop(n);

    let out = std::process::Command::new(netcm_e2e::netcm::netcm_binary())
        .args(["--controllers=*,bogus", "--cluster-cidr=10.244.0.0/16"])
        .output()
        .expect("run netcm");
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("\"bogus\" is not in the list of known controllers"),
        "{stderr}"
    );

    let out = std::process::Command::new(netcm_e2e::netcm::netcm_binary())
        .args([
            "--leader-elect-lease-duration=5s",
            "--leader-elect-renew-deadline=10s",
        ])
        .output()
        .expect("run netcm");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--leader-elect-lease-duration"));
}
