//! A leader behind a slow and lossy network path to the API server: `netcm_e2e::api_path`
//! builds the path, since this kernel has no `tc netem`.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use netcm_e2e::api_path::{apiserver_port, probe_netem, ApiPath, Mechanism};
use netcm_e2e::netns::{NetNs, NetnsNetcm};
use netcm_e2e::nodes::{count_allocated, create_named};
use netcm_e2e::{lease_holder, wait_for, TestEnv, LEASE_NAME, LEASE_NAMESPACE};

use super::allocator_args;

/// The delay each way on the lossy path: 300 ms round trip.
const ONE_WAY_DELAY: Duration = Duration::from_millis(150);

/// The share of packets the lossy path drops, in each direction.
const LOSS_PERCENT: u64 = 5;

/// (holder, leaseTransitions) of netcm's Lease.
async fn lease_state(env: &TestEnv) -> (Option<String>, i32) {
    let lease = Api::<Lease>::namespaced(env.client.clone(), LEASE_NAMESPACE)
        .get(LEASE_NAME)
        .await
        .expect("get netcm's Lease");
    let spec = lease.spec.unwrap_or_default();
    (spec.holder_identity, spec.lease_transitions.unwrap_or(0))
}

/// The sum of every sample of the family `name` (any labels) in a Prometheus text exposition.
fn family_sum(exposition: &str, name: &str) -> f64 {
    exposition
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.rsplit_once(' '))
        .filter(|(series, _)| series.split('{').next() == Some(name))
        .filter_map(|(_, v)| v.parse::<f64>().ok())
        .sum()
}

/// The leader's network path to the API server has 150 ms of delay each way and drops 5 % of
/// its packets, for the whole test — from before the process starts, so its first list, its Lease and
/// every write cross it. `tc netem` is used where the kernel has it; elsewhere the delay is the relay's
/// and the loss an iptables `statistic` DROP rule on the namespace's loopback (`netcm_e2e::api_path`), so
/// TCP really retransmits. With client-go's default lease (15 s, renew deadline 10 s, retry 2 s) the
/// leader must keep its Lease throughout — the holder never changes and leaseTransitions stays put — and
/// give every one of 100 Nodes pod CIDRs, no two overlapping. The path is read back, so the test cannot
/// pass on a path that is not degraded: a round trip through it takes at least 300 ms, netcm's own
/// requests took 300 ms on average or more, and the loss dropped packets. The figures are printed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_behind_a_300ms_lossy_path_allocates_every_node_once_and_keeps_its_lease() {
    const NODES: usize = 100;
    let env = TestEnv::new().await;
    let ns = NetNs::create();
    let mechanism = probe_netem(&ns);
    if let Mechanism::RelayAndIptables(why) = &mechanism {
        eprintln!("[lossy] tc netem unusable here ({why}): delay in the relay, loss by iptables");
    }
    let port = apiserver_port(&env.cp.kubeconfig).unwrap_or_else(|e| panic!("{e}"));
    let path = ApiPath::open(&ns, port, mechanism)
        .unwrap_or_else(|e| panic!("opening the path into {}: {e}", ns.name));
    path.degrade(ONE_WAY_DELAY, LOSS_PERCENT)
        .unwrap_or_else(|e| panic!("degrading the path into {}: {e}", ns.name));
    let round_trip = path
        .round_trip()
        .await
        .unwrap_or_else(|e| panic!("a round trip through the path: {e}"));
    assert!(
        round_trip >= 2 * ONE_WAY_DELAY,
        "the path is not degraded: a round trip through it took {round_trip:?}"
    );

    // Timed from the spawn: starting builds the binary first (`netcm_binary`).
    let n = NetnsNetcm::start("lossy", &ns, &env.cp.kubeconfig, &allocator_args(&[]), &[]);
    let started = Instant::now();
    let id = n.identity().await;
    wait_for(
        "the process behind the lossy path to hold the Lease",
        Duration::from_secs(180),
        || async {
            n.assert_running();
            (lease_holder(&env.client, LEASE_NAME).await.as_deref() == Some(id.as_str()))
                .then_some(())
        },
    )
    .await;
    let leading_after = started.elapsed();
    let (_, transitions) = lease_state(&env).await;

    let names = create_named(&env.client, "lossy", NODES).await;
    let created = Instant::now();
    wait_for(
        &format!("all {NODES} Nodes to hold pod CIDRs through the lossy path"),
        Duration::from_secs(600),
        || async {
            n.assert_running();
            let holder = lease_holder(&env.client, LEASE_NAME).await;
            assert_eq!(
                holder.as_deref(),
                Some(id.as_str()),
                "after {:?} of the backlog the Lease is held by {holder:?}",
                created.elapsed()
            );
            (count_allocated(&env.client, &names).await == names.len()).then_some(())
        },
    )
    .await;
    let allocated_in = created.elapsed();

    let nodes = netcm_e2e::nodes::all_nodes(&env.client).await;
    assert_eq!(nodes.len(), NODES);
    assert!(
        nodes
            .iter()
            .all(|node| !netcm_e2e::nodes::pod_cidrs(node).is_empty()),
        "every Node holds pod CIDRs"
    );
    netcm_e2e::nodes::assert_no_overlaps(&nodes);
    assert_eq!(
        lease_state(&env).await,
        (Some(id.clone()), transitions),
        "the Lease (holder, leaseTransitions) must not change: the leader never lost it"
    );
    n.assert_running();

    // netcm's own view of the path: its requests (the Lease's included) and the writes its fence refused.
    let metrics = wait_for(
        "netcm's /metrics inside the namespace",
        Duration::from_secs(60),
        || async {
            n.assert_running();
            n.http_get("/metrics")
                .await
                .filter(|(code, _)| *code == 200)
                .map(|(_, body)| body)
        },
    )
    .await;
    let requests = family_sum(&metrics, "rest_client_request_duration_seconds_count");
    let seconds = family_sum(&metrics, "rest_client_request_duration_seconds_sum");
    let mean = seconds / requests;
    let fenced = netcm_e2e::netcm::sample(&metrics, "netcm_fenced_writes_total");
    let dropped = path
        .dropped_packets()
        .unwrap_or_else(|e| panic!("reading the path's dropped packets: {e}"));
    eprintln!(
        "[lossy] {}ms each way, {LOSS_PERCENT}% loss: a probe round trip {round_trip:?}; leading after \
         {leading_after:?}; all {NODES} Nodes allocated in {allocated_in:?}; netcm's {requests} requests \
         took {mean:.3}s on average; netcm_fenced_writes_total {fenced:?}; {dropped} packets dropped",
        ONE_WAY_DELAY.as_millis()
    );
    assert!(
        requests > 0.0 && mean >= 2.0 * ONE_WAY_DELAY.as_secs_f64(),
        "netcm's requests did not cross the degraded path: {requests} requests, {mean:.3}s on average"
    );
    assert!(dropped > 0, "the path's loss dropped no packet");
    drop(n);
    drop(path);
    drop(ns);
    env.clean().await;
}
