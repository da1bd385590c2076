//! Own only what is ours: routes inside the cluster CIDRs, never a default-like prefix or one over the
//! host's own networks; and no stale routes left on a standby. The flags it refuses (a protocol another
//! router uses, gateway mode without cluster CIDRs) are CLI transcripts in `cmd/netcm/tests/cmd/`.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, ObjectMeta, PostParams};
use netcm_e2e::nodes::{create_nodes, NodeFixture};
use netcm_e2e::{lease_holder, wait_for, LEASE_NAMESPACE};

use netcm_e2e::route_lab::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_default_like_foreign_or_lan_pod_cidr_gets_no_route_and_an_event_saying_why() {
    let lab = lab().await;
    // 192.0.0.0/16 is a cluster CIDR here so that the LAN rule, not the cluster CIDR rule, refuses
    // 192.0.2.0/24: the host is directly connected to it (a pod network laid over the nodes' LAN).
    let _netcm = lab.start(&["--cluster-cidr=10.0.0.0/8,192.0.0.0/16"], &[]);
    let fixtures = vec![
        NodeFixture::named("good")
            .internal_ip("192.0.2.10")
            .pod_cidrs(&["10.244.1.0/24"]),
        NodeFixture::named("half-the-internet")
            .internal_ip("192.0.2.20")
            .pod_cidrs(&["0.0.0.0/1"]),
        NodeFixture::named("on-the-lan")
            .internal_ip("192.0.2.30")
            .pod_cidrs(&["192.0.2.0/24"]),
        NodeFixture::named("outside")
            .internal_ip("192.0.2.40")
            .pod_cidrs(&["172.16.0.0/24"]),
    ];
    create_nodes(&lab.env.client, fixtures, 4).await;
    let want = BTreeMap::from([(net("10.244.1.0/24"), ip("192.0.2.10"))]);
    lab.wait_routes(&want, Duration::from_secs(30)).await;

    for (node, why) in [
        ("half-the-internet", "default-like"),
        ("on-the-lan", "directly connected"),
        ("outside", "outside every --cluster-cidr"),
    ] {
        let note = lab.failed_route_event(node, Duration::from_secs(30)).await;
        assert!(note.contains(why), "{node}: expected {why:?} in {note:?}");
    }
    // Nothing of the kind reached the kernel, in netcm's table or any other.
    tokio::time::sleep(Duration::from_secs(PERIOD_SECS + 1)).await;
    assert_eq!(lab.routes(), want);
    let all = lab.ns.ip(&["route", "show", "table", "all"]);
    for dst in ["0.0.0.0/1", "172.16.0.0/24"] {
        assert!(!all.contains(dst), "{dst} in {all}");
    }
    assert!(
        !lab.ns
            .ip(&["route", "show", "table", TABLE])
            .contains("192.0.2.0/24"),
        "no pod route over the LAN"
    );
    wait_for(
        "the refused Nodes to be NoRouteCreated and good RouteCreated",
        Duration::from_secs(30),
        || async {
            let c = lab.conditions().await;
            (c.get("good") == Some(&created())
                && ["half-the-internet", "on-the-lan", "outside"]
                    .iter()
                    .all(|n| c.get(*n) == Some(&not_created())))
            .then_some(())
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_removes_its_routes_to_nodes_that_no_longer_exist_and_keeps_the_rest() {
    let lab = lab().await;
    // Someone else leads, for an hour: netcm stays a standby for the whole test.
    let leases: Api<Lease> = Api::namespaced(lab.env.client.clone(), LEASE_NAMESPACE);
    let now = MicroTime(jiff::Timestamp::now());
    leases
        .create(
            &PostParams::default(),
            &Lease {
                metadata: ObjectMeta {
                    name: Some("netcm".into()),
                    ..Default::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some("someone-else".into()),
                    lease_duration_seconds: Some(3600),
                    acquire_time: Some(now.clone()),
                    renew_time: Some(now),
                    ..Default::default()
                }),
            },
        )
        .await
        .expect("create the other leader's Lease");
    create_nodes(
        &lab.env.client,
        vec![NodeFixture::named("still-here")
            .internal_ip("192.0.2.10")
            .pod_cidrs(&["10.244.1.0/24"])],
        1,
    )
    .await;
    // What an earlier term as leader left behind, plus routes that are not netcm's to judge.
    let add = |dst: &str, via: &str, proto: &str| {
        lab.ns.ip(&[
            "route", "add", dst, "via", via, "table", TABLE, "proto", proto,
        ]);
    };
    add("10.244.1.0/24", "192.0.2.10", PROTO); // a Node that still exists
    add("10.244.9.0/24", "192.0.2.99", PROTO); // a Node deleted since
    add("fd00:9::/64", "2001:db8::99", PROTO); // the same, IPv6
    add("172.16.0.0/24", "192.0.2.98", PROTO); // outside the cluster CIDRs: not netcm's
    add("10.244.8.0/24", "192.0.2.97", "static"); // another protocol: not netcm's
                                                  // A deleted Node's, from a pool outside --cluster-cidr: netcm's as the pool's range is.
    create_pool(&lab.env.client, "moving-to", "172.20.0.0/16").await;
    add("172.20.9.0/24", "192.0.2.96", PROTO);

    let netcm = lab.start(&["--leader-elect=true"], &[]);
    let want = BTreeMap::from([
        (net("10.244.1.0/24"), ip("192.0.2.10")),
        (net("172.16.0.0/24"), ip("192.0.2.98")),
    ]);
    lab.wait_routes(&want, Duration::from_secs(30)).await;
    assert!(lab
        .ns
        .ip(&["route", "show", "table", TABLE, "proto", "static"])
        .contains("10.244.8.0/24 via 192.0.2.97"));
    assert_eq!(
        lease_holder(&lab.env.client, "netcm").await.as_deref(),
        Some("someone-else"),
        "netcm stayed a standby"
    );
    // The routes to deleted Nodes went while another replica held the Lease: the standby's sweep.
    netcm.assert_running();
}

/// A ClusterCIDR named `name` over `ipv4`, as an operator creates a pool (with no allocator running here,
/// nobody puts a finalizer on it).
async fn create_pool(client: &kube::Client, name: &str, ipv4: &str) {
    let obj: kube::api::DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "networking.x-k8s.io/v1",
        "kind": "ClusterCIDR",
        "metadata": {"name": name},
        "spec": {"perNodeHostBits": 8, "ipv4": ipv4},
    }))
    .expect("ClusterCIDR");
    netcm_e2e::cluster_cidrs(client)
        .create(&PostParams::default(), &obj)
        .await
        .expect("create ClusterCIDR");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_cidrs_from_clustercidr_pools_outside_the_cluster_cidr_are_routed_from_the_start_and_as_pools_are_added(
) {
    let lab = lab().await;
    // A pool outside every --cluster-cidr (10.0.0.0/8, fd00::/8 here): a range the cluster moves to.
    create_pool(&lab.env.client, "moving-to", "172.20.0.0/16").await;
    let fixtures = vec![
        NodeFixture::named("in-flag-range")
            .internal_ip("192.0.2.10")
            .pod_cidrs(&["10.244.1.0/24"]),
        NodeFixture::named("in-pool")
            .internal_ip("192.0.2.11")
            .pod_cidrs(&["172.20.1.0/24"]),
        NodeFixture::named("in-later-pool")
            .internal_ip("192.0.2.12")
            .pod_cidrs(&["172.21.0.0/24"]),
    ];
    create_nodes(&lab.env.client, fixtures, 3).await;
    let _netcm = lab.start(&[], &[]);
    let mut want = BTreeMap::from([
        (net("10.244.1.0/24"), ip("192.0.2.10")),
        (net("172.20.1.0/24"), ip("192.0.2.11")),
    ]);
    lab.wait_routes(&want, Duration::from_secs(30)).await;
    let note = lab
        .failed_route_event("in-later-pool", Duration::from_secs(30))
        .await;
    assert!(
        note.contains("ClusterCIDR object's range (172.20.0.0/16)"),
        "{note}"
    );
    // The first reconcile waited for the pools: their Node was never refused, not even at start.
    assert!(
        !lab.env
            .node_events("in-pool")
            .await
            .iter()
            .any(|(_, reason, _)| reason == "FailedToCreateRoute"),
        "the pool's Node was refused a route"
    );

    // A pool added at run time: its Node is routed without a restart.
    create_pool(&lab.env.client, "later", "172.21.0.0/16").await;
    want.insert(net("172.21.0.0/24"), ip("192.0.2.12"));
    lab.wait_routes(&want, Duration::from_secs(30)).await;
    wait_for(
        "every Node RouteCreated",
        Duration::from_secs(30),
        || async {
            let c = lab.conditions().await;
            ["in-flag-range", "in-pool", "in-later-pool"]
                .iter()
                .all(|n| c.get(*n) == Some(&created()))
                .then_some(())
        },
    )
    .await;
}
