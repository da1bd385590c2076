//! Never a duplicate, against an adversary: leader election under a saturated client, a Lease
//! deleted by hand, writes the API server holds, shutdown with a write in flight, and an API server that
//! stops answering (lease durations the Lease cannot carry are refused on the command line:
//! `cmd/netcm/tests/cmd/manager.md`). Everything runs against the real control
//! plane; the adversary is a slow admission webhook, SIGSTOP, or a `kubectl delete`-style call.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DeleteParams};
use netcm_e2e::nodes::{create_node, create_nodes, pod_cidrs, NodeFixture};
use netcm_e2e::webhook::{SlowWebhook, SLOW_WRITES_LABEL};
use netcm_e2e::{audit, lease_holder, wait_for, FrozenApiserver, Netcm, TestEnv, LEASE_NAMESPACE};

/// client-go's (and KCM's) defaults, spelled out: these tests are about the real margins.
const DEFAULT_LEASE: Duration = Duration::from_secs(15);
const DEFAULT_RENEW_DEADLINE: Duration = Duration::from_secs(10);

/// Fast leader-election settings where the test only needs the rules, not the real margins.
const FAST_LEASE: [&str; 3] = [
    "--leader-elect-lease-duration=4s",
    "--leader-elect-renew-deadline=3s",
    "--leader-elect-retry-period=1s",
];

async fn lease(env: &TestEnv) -> Lease {
    Api::<Lease>::namespaced(env.client.clone(), LEASE_NAMESPACE)
        .get("netcm")
        .await
        .expect("get the netcm Lease")
}

fn transitions(l: &Lease) -> i32 {
    l.spec
        .as_ref()
        .and_then(|s| s.lease_transitions)
        .unwrap_or(0)
}

/// Starts `label` and waits until it leads; returns it and its identity (the Lease's holder).
async fn leader(env: &TestEnv, label: &str, args: &[&str]) -> (Netcm, String) {
    let n = Netcm::start(label, &env.cp.kubeconfig, args);
    n.wait_leading(Duration::from_secs(30)).await;
    let id = wait_for(
        "the Lease to name the leader",
        Duration::from_secs(10),
        || lease_holder(&env.client, "netcm"),
    )
    .await;
    (n, id)
}

/// A backlog of `nodes` Nodes for the allocator and then the syncer at `--kube-api-qps=qps` must not cost
/// the leader its lease: watched for `window`, the holder never changes and leaseTransitions stays put.
async fn a_backlog_keeps_one_leader(qps: u32, nodes: usize, window: Duration) {
    let env = TestEnv::new().await;
    let fixtures: Vec<NodeFixture> = (0..nodes)
        .map(|i| {
            NodeFixture::named(format!("backlog-{i:03}")).internal_ip(&format!(
                "198.18.{}.{}",
                i / 250,
                i % 250 + 1
            ))
        })
        .collect();
    create_nodes(&env.client, fixtures, 16).await;
    let qps_flag = format!("--kube-api-qps={qps}");
    // A small burst, so the bucket — not the burst — paces the backlog from the start.
    let burst_flag = format!("--kube-api-burst={}", qps * 2);
    let (mut n, id) = leader(
        &env,
        "backlog",
        &[
            "--controllers=subnet-allocator,node-annotation-syncer",
            "--cluster-cidr=10.64.0.0/10",
            &qps_flag,
            &burst_flag,
        ],
    )
    .await;
    let before = transitions(&lease(&env).await);
    let nodes_api: Api<Node> = Api::all(env.client.clone());
    let started = Instant::now();
    while started.elapsed() < window {
        if let Some(status) = n.try_exit() {
            panic!(
                "at --kube-api-qps={qps} the leader exited ({status}) {:?} into the backlog",
                started.elapsed()
            );
        }
        let holder = lease_holder(&env.client, "netcm").await;
        assert_eq!(
            holder.as_deref(),
            Some(id.as_str()),
            "after {:?} at --kube-api-qps={qps} the Lease is held by {holder:?}",
            started.elapsed()
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    // Each Node takes a write of each controller (pod CIDRs, then lease annotations), each controller
    // from a bucket of its own (as KCM's): more Nodes than one bucket allows in the window, so the backlog
    // lasts all of it on any machine.
    let listed = nodes_api
        .list(&Default::default())
        .await
        .expect("list nodes");
    let allocated = listed
        .items
        .iter()
        .filter(|n| !pod_cidrs(n).is_empty())
        .count();
    let annotated = listed
        .items
        .iter()
        .filter(|n| {
            n.metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key("flannel.alpha.coreos.com/public-ip"))
        })
        .count();
    eprintln!(
        "--kube-api-qps={qps}: after {window:?}, {allocated}/{nodes} Nodes allocated, {annotated}/{nodes} annotated"
    );
    assert!(
        annotated < nodes,
        "the backlog must last the whole window, or the test proves nothing"
    );
    assert_eq!(
        transitions(&lease(&env).await),
        before,
        "leaseTransitions changed"
    );
    assert!(
        n.is_leading().await,
        "the leader must not lose its lease to its own backlog"
    );
}

#[tokio::test]
async fn at_kube_api_qps_10_a_backlog_of_500_nodes_never_costs_the_leader_its_lease() {
    a_backlog_keeps_one_leader(10, 500, Duration::from_secs(40)).await;
}

#[tokio::test]
async fn at_kube_api_qps_5_a_backlog_of_300_nodes_never_costs_the_leader_its_lease() {
    a_backlog_keeps_one_leader(5, 300, Duration::from_secs(40)).await;
}

#[tokio::test]
async fn a_lease_deleted_by_hand_is_recreated_by_its_holder_and_never_taken_by_the_standby() {
    let env = TestEnv::new().await;
    let args = [
        "--controllers=subnet-allocator",
        "--cluster-cidr=10.244.0.0/16",
        FAST_LEASE[0],
        FAST_LEASE[1],
        FAST_LEASE[2],
    ];
    let (a, a_id) = leader(&env, "holder", &args).await;
    let b = Netcm::start("standby", &env.cp.kubeconfig, &args);
    b.wait_standing_by(&env.client, Duration::from_secs(30))
        .await;
    Api::<Lease>::namespaced(env.client.clone(), LEASE_NAMESPACE)
        .delete("netcm", &DeleteParams::default())
        .await
        .expect("delete the Lease");
    // The standby saw the holder less than a lease duration ago: it must wait out that term, and the
    // holder recreates the Lease at its next renewal. Watch for two lease durations.
    let started = Instant::now();
    let mut recreated = false;
    while started.elapsed() < Duration::from_secs(8) {
        let holder = lease_holder(&env.client, "netcm").await;
        assert!(
            holder.is_none() || holder.as_deref() == Some(a_id.as_str()),
            "{:?} after the delete the Lease is held by {holder:?}, not the old holder",
            started.elapsed()
        );
        recreated |= holder.is_some();
        a.assert_running();
        assert!(!b.is_leading().await, "the standby must not lead");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(recreated, "the holder must recreate the Lease");
    assert!(a.is_leading().await, "the holder keeps leading");
}

/// A Node whose UPDATEs the slow webhook holds.
async fn slow_node(env: &TestEnv, name: &str) {
    create_node(
        &env.client,
        &NodeFixture::named(name).label(SLOW_WRITES_LABEL, "true"),
    )
    .await;
}

#[tokio::test]
async fn a_write_the_api_server_holds_ends_before_the_lease_could_be_taken_over() {
    let env = TestEnv::new().await;
    let webhook = SlowWebhook::start(&env.client, "netcm-e2e-slow", Duration::from_secs(60)).await;
    slow_node(&env, "held").await;
    let (n, id) = leader(
        &env,
        "writer",
        &[
            "--controllers=subnet-allocator",
            "--cluster-cidr=10.244.0.0/16",
        ],
    )
    .await;
    let held_at = webhook.wait_request("held", Duration::from_secs(30)).await;
    // The write ends at its deadline, which ends a safety margin before the lease could pass to another
    // replica (at the earliest, last renewal + lease duration): the client's timer or the API server's
    // `timeout=` (a 504, which kube's retry may re-send, fenced again with a fresh deadline), whichever
    // comes first. The API server's audit record of the first attempt proves it either way.
    let patches: Vec<audit::AuditEvent> = wait_for(
        "the held write to end in the API server's audit log",
        DEFAULT_LEASE * 2,
        || async {
            let patches: Vec<audit::AuditEvent> = audit::read(&env.cp.audit_log)
                .into_iter()
                .filter(|e| {
                    e.user_agent.contains(&id) && e.resource() == "nodes" && e.verb == "patch"
                })
                .filter(|e| e.object_ref.as_ref().is_some_and(|o| o.name == "held"))
                .collect();
            (!patches.is_empty()).then_some(patches)
        },
    )
    .await;
    eprintln!(
        "the held write ended {:?} after the webhook received it",
        held_at.elapsed()
    );
    n.assert_running();
    let first = patches.first().expect("the held PATCH is in the audit log");
    assert!(
        first.request_uri.contains("timeout="),
        "the write must carry the API server's timeout: {}",
        first.request_uri
    );
    let ended: jiff::Timestamp = first.stage_timestamp.parse().expect("stage timestamp");
    let took = ended.duration_since(first.received().expect("received"));
    assert!(
        took < jiff::SignedDuration::try_from(DEFAULT_LEASE).expect("duration"),
        "the API server held the write for {took:?}"
    );
    webhook.remove(&env.client).await;
}

#[tokio::test]
async fn a_leader_stopping_with_a_write_in_flight_leaves_its_lease_to_expire_instead_of_releasing_it(
) {
    let env = TestEnv::new().await;
    let webhook = SlowWebhook::start(&env.client, "netcm-e2e-slow", Duration::from_secs(60)).await;
    slow_node(&env, "in-flight").await;
    let (mut n, id) = leader(
        &env,
        "stopping",
        &[
            "--controllers=subnet-allocator",
            "--cluster-cidr=10.244.0.0/16",
        ],
    )
    .await;
    webhook
        .wait_request("in-flight", Duration::from_secs(30))
        .await;
    n.signal("TERM");
    let status = n.wait_exit(Duration::from_secs(30)).await;
    assert!(status.success(), "SIGTERM must still exit 0, got {status}");
    assert_eq!(
        lease_holder(&env.client, "netcm").await.as_deref(),
        Some(id.as_str()),
        "with a write possibly still landing, the lease must be left to expire, not released"
    );
    webhook.remove(&env.client).await;
}

#[tokio::test]
async fn a_leader_whose_api_server_stops_answering_steps_down_within_the_renew_deadline() {
    let env = TestEnv::new().await;
    let (mut n, id) = leader(
        &env,
        "stranded",
        &[
            "--controllers=subnet-allocator",
            "--cluster-cidr=10.244.0.0/16",
        ],
    )
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let frozen_at = jiff::Timestamp::now();
    let frozen = FrozenApiserver::freeze();
    // An upper bound on when it stepped down: the first poll that finds it no longer leading (its
    // metric at 0, or the process gone). The audit log's clock is this machine's too.
    wait_for(
        "the leader to step down",
        DEFAULT_LEASE + Duration::from_secs(10),
        || async {
            let leading = n.metric(netcm_e2e::netcm::MASTER_STATUS).await == Some(1.0);
            (!leading).then_some(())
        },
    )
    .await;
    let lost_at = jiff::Timestamp::now();
    drop(frozen);
    let last_renewal = audit::read(&env.cp.audit_log)
        .iter()
        .filter(|e| e.user_agent.contains(&id) && e.resource() == "leases")
        .filter(|e| e.succeeded() && e.verb != "get")
        .filter_map(|e| e.received())
        .filter(|t| *t < frozen_at)
        .max()
        .expect("a renewal before the freeze");
    let after = lost_at.duration_since(last_renewal);
    eprintln!("lease declared lost {after:?} after the last successful renewal");
    assert!(
        after
            <= jiff::SignedDuration::try_from(DEFAULT_RENEW_DEADLINE + Duration::from_secs(1))
                .expect("duration"),
        "the leader must step down by its renew deadline, not {after:?} after its last renewal"
    );
    let status = n.wait_exit(Duration::from_secs(30)).await;
    assert!(!status.success(), "a lost lease exits non-zero");
}
