//! The manager core on the real control plane: leader election and hand-over, fencing of a frozen leader,
//! API server outages, metrics and health, and `--controllers` (its usage errors are CLI transcripts in
//! `cmd/netcm/tests/cmd/`).

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use netcm_e2e::netcm::running_controller;
use netcm_e2e::nodes::{create_node, create_nodes, pod_cidrs, NodeFixture};
use netcm_e2e::{
    audit, lease_holder, start_apiserver, stop_apiserver, wait_for, Netcm, TestEnv, LEASE_NAME,
    LEASE_NAMESPACE,
};

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

/// Starts replica-a, waits until it leads, then replica-b, waits until it stands by; returns both and
/// replica-a's identity (the Lease's holder).
async fn start_pair(env: &TestEnv, extra: &[&str]) -> (Netcm, Netcm, String) {
    let a = Netcm::start("replica-a", &env.cp.kubeconfig, &allocator_args(extra));
    a.wait_leading(Duration::from_secs(30)).await;
    let a_id = wait_for(
        "replica-a to hold the Lease",
        Duration::from_secs(10),
        || lease_holder(&env.client, LEASE_NAME),
    )
    .await;
    let b = Netcm::start("replica-b", &env.cp.kubeconfig, &allocator_args(extra));
    let holder = b
        .wait_standing_by(&env.client, Duration::from_secs(30))
        .await;
    assert_eq!(holder, a_id, "replica-b stands by behind replica-a");
    (a, b, a_id)
}

/// Waits until `b` leads and holds the Lease after `a_id` (the previous holder); on every poll at most
/// one of the two replicas reports that it leads. Returns the new holder.
async fn wait_takeover_with_one_leader(
    env: &TestEnv,
    a: &Netcm,
    b: &Netcm,
    a_id: &str,
    timeout: Duration,
) -> String {
    wait_for("replica-b to take the Lease", timeout, || async {
        let (a_leads, b_leads) = (a.is_leading().await, b.is_leading().await);
        assert!(!(a_leads && b_leads), "both replicas report that they lead");
        let holder = lease_holder(&env.client, LEASE_NAME).await?;
        (b_leads && holder != a_id).then_some(holder)
    })
    .await
}

/// When `identity` last wrote netcm's Lease successfully, per the API server's audit log.
fn last_lease_write(env: &TestEnv, identity: &str) -> jiff::Timestamp {
    audit::read(&env.cp.audit_log)
        .iter()
        .filter(|e| e.user_agent.contains(identity) && e.resource() == "leases")
        .filter(|e| e.succeeded() && e.verb != "get")
        .filter_map(|e| e.received())
        .max()
        .unwrap_or_else(|| panic!("{identity} wrote its Lease at least once"))
}

/// When the Lease's current holder acquired it (its own clock: the same machine's as the audit log's).
async fn acquired_at(env: &TestEnv) -> jiff::Timestamp {
    Api::<Lease>::namespaced(env.client.clone(), LEASE_NAMESPACE)
        .get(LEASE_NAME)
        .await
        .expect("get the netcm Lease")
        .spec
        .and_then(|s| s.acquire_time)
        .map(|t| t.0)
        .expect("a held Lease has an acquireTime")
}

#[tokio::test]
async fn two_replicas_elect_exactly_one_leader_and_the_standby_reports_ready() {
    let env = TestEnv::new().await;
    let (a, b, a_id) = start_pair(&env, &[]).await;
    // Over several of the standby's retry periods (2 s), the holder stays and the standby never leads.
    for _ in 0..30 {
        assert!(!b.is_leading().await, "the standby must not lead");
        assert_eq!(
            lease_holder(&env.client, LEASE_NAME).await.as_deref(),
            Some(a_id.as_str())
        );
        b.assert_running();
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        a.metric(&running_controller("subnet-allocator")).await,
        Some(1.0)
    );
    assert_ne!(
        b.metric(&running_controller("subnet-allocator")).await,
        Some(1.0)
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

/// The hand-over's speed is a benchmark (`hack/bench.sh handover`); this proves what it does: the old
/// leader releases the Lease (the standby takes it within the term the old leader held, not after it
/// expired), exits 0, and never do both lead at once.
#[tokio::test]
async fn sigterm_on_the_leader_releases_the_lease_to_the_standby_and_never_two_lead() {
    let env = TestEnv::new().await;
    for round in 0..3 {
        let (mut a, b, a_id) = start_pair(&env, &[]).await;
        a.signal("TERM");
        let b_id =
            wait_takeover_with_one_leader(&env, &a, &b, &a_id, Duration::from_secs(30)).await;
        let status = a.wait_exit(Duration::from_secs(20)).await;
        assert!(
            status.success(),
            "round {round}: the old leader must exit 0 on SIGTERM, got {status}"
        );
        // Released, not expired: the standby acquired before the old leader's last term (15 s) ran out.
        let term_end = last_lease_write(&env, &a_id) + jiff::SignedDuration::from_secs(15);
        let acquired = acquired_at(&env).await;
        assert!(
            acquired < term_end,
            "round {round}: {b_id} acquired at {acquired}, after {a_id}'s term ended ({term_end}): not a release"
        );
        b.wait_controller_running("subnet-allocator", Duration::from_secs(30))
            .await;
        drop(b);
        env.clean().await;
    }
}

/// How fast the standby takes over is a benchmark (`hack/bench.sh handover`); this proves the rule:
/// it takes over, and never before the dead leader's lease expired (last renewal + lease duration).
#[tokio::test]
async fn after_kill_9_the_standby_leads_but_only_once_the_dead_leaders_lease_expired() {
    let env = TestEnv::new().await;
    let (a, b, a_id) = start_pair(&env, &FAST_LEASE).await;
    a.signal("KILL");
    let b_id = wait_takeover_with_one_leader(&env, &a, &b, &a_id, Duration::from_secs(30)).await;
    let expired = last_lease_write(&env, &a_id) + jiff::SignedDuration::from_secs(4);
    let acquired = acquired_at(&env).await;
    assert!(
        acquired >= expired,
        "{b_id} acquired at {acquired}, before {a_id}'s lease expired at {expired}"
    );
    b.wait_controller_running("subnet-allocator", Duration::from_secs(30))
        .await;
}

#[tokio::test]
async fn a_frozen_leader_writes_nothing_after_its_lease_expired_and_exits_non_zero() {
    let env = TestEnv::new().await;
    let (mut a, b, a_id) = start_pair(&env, &FAST_LEASE).await;
    a.signal("STOP");
    // While it is frozen: Nodes arrive; the standby takes over and allocates them. The frozen leader's
    // watch will deliver them too when it wakes up, so it has work it must not do.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let fixtures: Vec<NodeFixture> = (0..100)
        .map(|i| NodeFixture::named(format!("zombie-{i:03}")))
        .collect();
    create_nodes(&env.client, fixtures, 16).await;
    b.wait_leading(Duration::from_secs(20)).await;
    tokio::time::sleep(Duration::from_secs(6)).await;
    a.signal("CONT");
    let status = a.wait_exit(Duration::from_secs(30)).await;
    assert!(
        !status.success(),
        "a leader that lost its lease must exit non-zero, got {status}"
    );
    // A late write it sent as it woke may be answered only moments before it exits, its entry not yet
    // written: read the log once it shows a request made after the exit.
    audit::wait_logged_until_now(&env.client, &env.cp.audit_log).await;

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
        // Reads are harmless: a leader waking from a freeze may watch again before it sees its lease
        // lost and exits.
        .filter(|e| e.is_write())
        .filter(|e| e.succeeded())
        .filter(|e| e.received().is_some_and(|t| t > expired))
        .collect();
    assert!(
        late_writes.is_empty(),
        "writes after the lease expired: {late_writes:#?}"
    );
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
    n.wait_leading(Duration::from_secs(30)).await;
    create_node(&env.client, &NodeFixture::named("before-outage")).await;
    wait_allocated(&env.client, "before-outage").await;
    tokio::task::spawn_blocking(stop_apiserver)
        .await
        .expect("stop");
    tokio::time::sleep(Duration::from_secs(20)).await;
    tokio::task::spawn_blocking(start_apiserver)
        .await
        .expect("start");
    let client = netcm_e2e::client_for(&env.cp.kubeconfig).await;
    create_node(&client, &NodeFixture::named("after-outage")).await;
    wait_allocated(&client, "after-outage").await;
    n.assert_running();
    assert!(
        n.is_leading().await,
        "netcm must keep its lease through a 20 s outage"
    );
}

/// Waits until the Node `name` has pod CIDRs.
async fn wait_allocated(client: &kube::Client, name: &str) {
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
    wait_for(
        &format!("{name} to be allocated"),
        Duration::from_secs(60),
        || async {
            let node = nodes.get_opt(name).await.ok().flatten()?;
            (!pod_cidrs(&node).is_empty()).then_some(())
        },
    )
    .await;
}

#[tokio::test]
async fn metrics_and_health_endpoints_serve_what_the_design_names() {
    let env = TestEnv::new().await;
    create_node(&env.client, &NodeFixture::named("metrics-node")).await;
    let n = Netcm::start("metrics", &env.cp.kubeconfig, &allocator_args(&[]));
    wait_allocated(&env.client, "metrics-node").await;
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
    assert_eq!(
        netcm_e2e::netcm::sample(&body, &running_controller("subnet-allocator")),
        Some(1.0)
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
/// `--controllers` at run time; its usage errors (exit 2) are in `cmd/netcm/tests/cmd/manager.md`.
async fn controllers_flag_follows_kcm_rules_and_starts_only_the_enabled_controllers() {
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
    n.wait_controller_running("subnet-allocator", Duration::from_secs(30))
        .await;
    // Controllers start together, so by now a disabled one would run too.
    assert_ne!(
        n.metric(&running_controller("route-controller")).await,
        Some(1.0),
        "route-controller is disabled by --controllers"
    );
}
