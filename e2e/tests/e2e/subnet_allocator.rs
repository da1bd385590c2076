//! subnet-allocator on the real control plane: distinct CIDRs at scale, the next block claimed ahead,
//! bad data from others, crashes and a frozen leader mid-allocation. Dual-stack and a full pool's wake-up
//! are the allocator's logic alone, tested in-process (controllers/subnet-allocator/src/tests/).

use std::time::Duration;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::Node;
use netcm_e2e::nodes::{
    all_nodes, assert_no_overlaps, create_node, create_nodes, pod_cidrs, wait_all_allocated,
    NodeFixture,
};
use netcm_e2e::{audit, claimed_cidrs, lease_holder, wait_for, Netcm, TestEnv};

fn name(n: &Node) -> String {
    n.metadata.name.clone().unwrap_or_default()
}

fn fixtures(prefix: &str, n: usize) -> Vec<NodeFixture> {
    (0..n)
        .map(|i| NodeFixture::named(format!("{prefix}-{i:04}")))
        .collect()
}

#[tokio::test]
async fn three_hundred_nodes_created_at_once_get_distinct_cidrs_inside_the_cluster_cidr_and_never_the_service_range(
) {
    let env = TestEnv::new().await;
    let _n = Netcm::start(
        "allocator",
        &env.cp.kubeconfig,
        &[
            "--controllers=subnet-allocator",
            "--cluster-cidr=10.244.0.0/22",
            "--node-cidr-mask-size=31",
            "--service-cluster-ip-range=10.244.1.0/24",
        ],
    );
    create_nodes(&env.client, fixtures("bulk", 300), 16).await;
    let nodes = wait_all_allocated(&env.client, 300, Duration::from_secs(120)).await;
    assert_no_overlaps(&nodes);
    let cluster: IpNet = "10.244.0.0/22".parse().expect("cidr");
    let service: IpNet = "10.244.1.0/24".parse().expect("cidr");
    for n in &nodes {
        let cidrs = pod_cidrs(n);
        assert_eq!(cidrs.len(), 1, "{}: {cidrs:?}", name(n));
        let c: IpNet = cidrs[0].parse().expect("cidr");
        assert!(cluster.contains(&c), "{}: {c} outside {cluster}", name(n));
        assert!(
            !service.contains(&c.network()),
            "{}: {c} inside the service range",
            name(n)
        );
        assert_eq!(
            n.spec.as_ref().and_then(|s| s.pod_cidr.clone()),
            Some(cidrs[0].clone())
        );
    }
}

#[tokio::test]
async fn the_next_block_is_claimed_once_half_of_the_current_one_is_handed_out_before_any_node_needs_it(
) {
    let env = TestEnv::new().await;
    // A /20 of /28s: 256 CIDRs in blocks of 64 (/22s), handed out in address order.
    let _n = Netcm::start(
        "ahead",
        &env.cp.kubeconfig,
        &[
            "--controllers=subnet-allocator",
            "--cluster-cidr=10.203.0.0/20",
            "--node-cidr-mask-size=28",
        ],
    );
    // 32 Nodes take the first half of the first block: only that block is claimed.
    create_nodes(&env.client, fixtures("ahead", 32), 8).await;
    wait_all_allocated(&env.client, 32, Duration::from_secs(60)).await;
    assert_eq!(claimed_cidrs(&env.client).await, ["10.203.0.0/22"]);
    // The 33rd takes the first CIDR of the second half: the next block is claimed, though no Node has a
    // CIDR of it, so the Node that fills this block does not wait on a claim.
    create_node(&env.client, &NodeFixture::named("ahead-0032")).await;
    let nodes = wait_all_allocated(&env.client, 33, Duration::from_secs(60)).await;
    let next: IpNet = "10.203.4.0/22".parse().expect("cidr");
    wait_for(
        "the next block's claim",
        Duration::from_secs(30),
        || async {
            let claims = claimed_cidrs(&env.client).await;
            (claims == ["10.203.0.0/22", "10.203.4.0/22"]).then_some(())
        },
    )
    .await;
    for n in &nodes {
        for c in pod_cidrs(n) {
            let c: IpNet = c.parse().expect("cidr");
            assert!(
                !next.contains(&c),
                "{} holds {c} of the next block",
                name(n)
            );
        }
    }
}

#[tokio::test]
async fn bad_pod_cidrs_written_by_others_get_warnings_and_are_never_handed_out_while_others_are_served(
) {
    let env = TestEnv::new().await;
    // Written before netcm starts (KCM would crash-loop on these) ...
    create_node(
        &env.client,
        &NodeFixture::named("outside").pod_cidrs(&["192.168.77.0/24"]),
    )
    .await;
    create_node(
        &env.client,
        &NodeFixture::named("twin-a").pod_cidrs(&["10.244.0.0/24"]),
    )
    .await;
    create_node(
        &env.client,
        &NodeFixture::named("twin-b").pod_cidrs(&["10.244.0.0/24"]),
    )
    .await;
    let n = Netcm::start(
        "bad-data",
        &env.cp.kubeconfig,
        &[
            "--controllers=subnet-allocator",
            "--cluster-cidr=10.244.0.0/22",
        ],
    );
    // ... and while it runs.
    create_node(
        &env.client,
        &NodeFixture::named("late-twin").pod_cidrs(&["10.244.1.0/24"]),
    )
    .await;
    create_node(
        &env.client,
        &NodeFixture::named("late-owner").pod_cidrs(&["10.244.1.0/25"]),
    )
    .await;
    create_nodes(&env.client, fixtures("good", 2), 2).await;
    let nodes = wait_all_allocated(&env.client, 7, Duration::from_secs(30)).await;
    for n in nodes.iter().filter(|n| name(n).starts_with("good-")) {
        let c = &pod_cidrs(n)[0];
        assert!(
            c == "10.244.2.0/24" || c == "10.244.3.0/24",
            "{} got {c}, which overlaps a held range",
            name(n)
        );
    }
    for (node, reason) in [
        ("outside", "CIDROutOfRange"),
        ("twin-a", "CIDRConflict"),
        ("twin-b", "CIDRConflict"),
        ("late-owner", "CIDRConflict"),
    ] {
        wait_for(
            &format!("a {reason} Warning on {node}"),
            Duration::from_secs(15),
            || async {
                let events = env.node_events(node).await;
                events
                    .iter()
                    .any(|(t, r, _)| t == "Warning" && r == reason)
                    .then_some(())
            },
        )
        .await;
    }
    // The pool is full now (2 free /24s were taken): a third good node waits instead of getting a held range.
    create_node(&env.client, &NodeFixture::named("good-extra")).await;
    wait_for(
        "CIDRNotAvailable for good-extra",
        Duration::from_secs(15),
        || async {
            let events = env.node_events("good-extra").await;
            events
                .iter()
                .any(|(_, r, _)| r == "CIDRNotAvailable")
                .then_some(())
        },
    )
    .await;
    let conflicts = n
        .metric("netcm_node_cidr_conflicts")
        .await
        .expect("conflict gauge");
    assert!(conflicts >= 4.0, "netcm_node_cidr_conflicts = {conflicts}");
}

#[tokio::test]
async fn kill_9_in_the_middle_of_allocating_1000_nodes_then_restart_ends_with_every_node_allocated_without_overlap(
) {
    let env = TestEnv::new().await;
    create_nodes(&env.client, fixtures("crash", 1000), 16).await;
    let args = [
        "--controllers=subnet-allocator",
        "--cluster-cidr=10.128.0.0/12",
        "--kube-api-qps=100",
        "--kube-api-burst=10",
    ];
    let first = Netcm::start("first", &env.cp.kubeconfig, &args);
    wait_for("some allocations", Duration::from_secs(60), || async {
        let v = first
            .metric("node_ipam_controller_cidrset_cidrs_allocations_total{clusterCIDR=\"10.128.0.0/12\"}")
            .await?;
        (v >= 200.0).then_some(())
    })
    .await;
    first.signal("KILL");
    let done_before = all_nodes(&env.client)
        .await
        .iter()
        .filter(|n| !pod_cidrs(n).is_empty())
        .count();
    eprintln!("killed after {done_before} of 1000 nodes were allocated");
    assert!(done_before < 1000, "the kill must land mid-allocation");
    drop(first);
    netcm_e2e::forget_the_leader(&env.client).await;
    let _second = Netcm::start("second", &env.cp.kubeconfig, &args[..2]);
    let nodes = wait_all_allocated(&env.client, 1000, Duration::from_secs(120)).await;
    assert_no_overlaps(&nodes);
}

#[tokio::test]
async fn a_frozen_leader_and_a_killed_one_mid_allocation_never_cause_an_overlap_or_a_late_write() {
    let env = TestEnv::new().await;
    let args = [
        "--controllers=subnet-allocator",
        "--cluster-cidr=10.128.0.0/12",
        "--kube-api-qps=60",
        "--kube-api-burst=10",
        "--leader-elect-lease-duration=4s",
        "--leader-elect-renew-deadline=3s",
        "--leader-elect-retry-period=1s",
    ];
    create_nodes(&env.client, fixtures("zombie", 1000), 16).await;
    let mut a = Netcm::start("zombie-a", &env.cp.kubeconfig, &args);
    a.wait_leading(Duration::from_secs(30)).await;
    let a_id = wait_for(
        "zombie-a to hold the Lease",
        Duration::from_secs(10),
        || lease_holder(&env.client, "netcm"),
    )
    .await;
    let b = Netcm::start("zombie-b", &env.cp.kubeconfig, &args);
    let c = Netcm::start("zombie-c", &env.cp.kubeconfig, &args);
    let alloc_metric =
        "node_ipam_controller_cidrset_cidrs_allocations_total{clusterCIDR=\"10.128.0.0/12\"}";
    wait_for(
        "zombie-a to allocate some",
        Duration::from_secs(60),
        || async { (a.metric(alloc_metric).await? >= 150.0).then_some(()) },
    )
    .await;
    a.signal("STOP");
    // B or C takes over; kill -9 whichever leads, mid-allocation.
    let b_leads = wait_for(
        "a standby to take over",
        Duration::from_secs(30),
        || async {
            if b.is_leading().await {
                return Some(true);
            }
            c.is_leading().await.then_some(false)
        },
    )
    .await;
    let (killed, survivor) = if b_leads { (&b, &c) } else { (&c, &b) };
    wait_for(
        "the second leader to allocate some",
        Duration::from_secs(60),
        || async { (killed.metric(alloc_metric).await? >= 100.0).then_some(()) },
    )
    .await;
    killed.signal("KILL");
    survivor.wait_leading(Duration::from_secs(30)).await;
    let nodes = wait_all_allocated(&env.client, 1000, Duration::from_secs(180)).await;
    assert_no_overlaps(&nodes);
    a.signal("CONT");
    let status = a.wait_exit(Duration::from_secs(30)).await;
    assert!(
        !status.success(),
        "the zombie must exit non-zero, got {status}"
    );
    // A late write it sent as it woke may be answered only moments before it exits, its entry not yet
    // written: read the log once it shows a request made after the exit.
    audit::wait_logged_until_now(&env.client, &env.cp.audit_log).await;

    let events = audit::read(&env.cp.audit_log);
    let mine = |e: &&audit::AuditEvent| e.user_agent.contains(&a_id);
    let last_renewal = events
        .iter()
        .filter(mine)
        .filter(|e| e.resource() == "leases" && e.succeeded())
        .filter_map(|e| e.received())
        .max()
        .expect("zombie-a renewed at least once");
    let expired = last_renewal + jiff::SignedDuration::from_secs(4);
    let late: Vec<_> = events
        .iter()
        .filter(mine)
        .filter(|e| {
            matches!(e.resource().as_str(), "nodes" | "nodes/status" | "events")
                && e.is_write()
                && e.succeeded()
        })
        .filter(|e| e.received().is_some_and(|t| t > expired))
        .collect();
    assert!(
        late.is_empty(),
        "zombie writes after its lease expired: {late:#?}"
    );
    // Still no overlap after the zombie woke up.
    assert_no_overlaps(&all_nodes(&env.client).await);
}
