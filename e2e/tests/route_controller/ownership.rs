//! Own only what is ours: routes inside the cluster CIDRs, never a default-like prefix or one over the
//! host's own networks, never a protocol another router uses.

use std::collections::BTreeMap;
use std::time::Duration;

use netcm_e2e::nodes::{create_nodes, NodeFixture};
use netcm_e2e::wait_for;

use super::lab::*;

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
async fn a_protocol_other_routers_use_or_gateway_mode_without_cluster_cidrs_exits_2_before_anything(
) {
    let lab = lab().await;
    // Inside the lab namespace, so that a netcm which did start could never touch the host's tables.
    for (args, needle) in [
        (vec!["--route-protocol=16"], "--route-protocol 16 is dhcp"),
        (vec!["--route-protocol=186"], "--route-protocol 186 is bgp"),
        (
            vec!["--route-protocol=80"],
            "--route-protocol 80 is felix, used by Calico",
        ),
        (
            vec!["--route-mode=gateway", "--cluster-cidr="],
            "--route-mode=gateway needs --cluster-cidr",
        ),
        (vec!["--cluster-cidr=0.0.0.0/0"], "--cluster-cidr 0.0.0.0/0"),
        (
            vec!["--route-mode=node"],
            "--route-mode=node needs --leader-elect=false",
        ),
    ] {
        let mut netcm = lab.start(&args, &[]);
        let status = netcm.wait_exit(Duration::from_secs(20)).await;
        let logs = netcm.logs();
        assert_eq!(status.code(), Some(2), "{args:?}: {logs}");
        assert!(
            logs.contains(needle),
            "{args:?}: expected {needle:?} in {logs}"
        );
        assert_eq!(
            logs.trim().lines().count(),
            1,
            "{args:?}: one clear line: {logs}"
        );
    }
}
