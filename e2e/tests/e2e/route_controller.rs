//! route-controller end to end: the real netcm inside a network namespace the test creates, against the
//! real API server, programming routes in that namespace's kernel tables and writing the
//! NetworkUnavailable condition.
//!
//! Every test uses table 100 and protocol 199 (netcm's default protocol), a veth pair inside the
//! namespace for the on-link subnets 192.0.2.0/24, 198.18.0.0/15 (the benchmarking range, room for
//! thousands of Node IPs) and 2001:db8::/64, and pod CIDRs from the cluster CIDRs 10.0.0.0/8 and
//! fd00::/8. Beside this file: `modes.rs` (`--route-mode`), `ownership.rs` (what is netcm's to route
//! and delete, the standby's sweep) and `repair.rs` (repair from the kernel's notifications); the lab
//! itself is `netcm_e2e::route_lab`. How fast thousands of Nodes are routed is a benchmark:
//! `hack/bench.sh routes` (`e2e/src/bin/bench-routes.rs`).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::Duration;

use ipnet::IpNet;
use kube::api::DeleteParams;
use netcm_e2e::nodes::{create_nodes, set_addresses, NodeFixture};
use netcm_e2e::{wait_for, TestEnv};

mod modes;
mod nexthops;
mod ownership;
mod repair;

use netcm_e2e::route_lab::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_nodes_get_exactly_one_route_each_and_route_created_and_foreign_routes_stay() {
    let lab = lab().await;
    let since = jiff::Timestamp::now();
    // Routes that are not netcm's to touch, and a leftover of netcm's own that no Node wants.
    lab.ns.ip(&[
        "route",
        "add",
        "10.200.0.0/24",
        "via",
        "192.0.2.200",
        "table",
        TABLE,
        "proto",
        "static",
    ]);
    lab.ns.ip(&[
        "route",
        "add",
        "10.201.0.0/24",
        "via",
        "192.0.2.201",
        "proto",
        PROTO,
    ]);
    lab.ns
        .ip(&["route", "add", "10.202.0.0/24", "via", "192.0.2.202"]);
    lab.ns.ip(&[
        "route",
        "add",
        "10.99.0.0/24",
        "via",
        "192.0.2.99",
        "table",
        TABLE,
        "proto",
        PROTO,
    ]);
    let netcm = lab.start(&[], &[]);

    let mut fixtures = Vec::new();
    let mut want = BTreeMap::new();
    for i in 0..50u32 {
        let v4 = format!("10.244.{i}.0/24");
        let internal = format!("192.0.2.{}", 10 + i);
        let mut f = NodeFixture::named(format!("node-{i:02}")).internal_ip(&internal);
        let mut cidrs = vec![v4.clone()];
        // Nodes 40–49 carry the lease annotation, which wins over their InternalIP.
        let gw = if i >= 40 {
            let public = format!("198.18.0.{}", 10 + i);
            f = f.annotation(PUBLIC_IP, &public);
            public
        } else {
            internal
        };
        want.insert(net(&v4), ip(&gw));
        // Every tenth Node is dual-stack.
        if i % 10 == 0 {
            let v6 = format!("fd00:10:244:{i:x}::/64");
            let v6_ip = format!("2001:db8::{:x}", 0x100 + i);
            f = f.internal_ip(&v6_ip);
            cidrs.push(v6.clone());
            want.insert(net(&v6), ip(&v6_ip));
        }
        let refs: Vec<&str> = cidrs.iter().map(String::as_str).collect();
        fixtures.push(f.pod_cidrs(&refs));
    }
    create_nodes(&lab.env.client, fixtures, 8).await;

    lab.wait_routes(&want, Duration::from_secs(60)).await;
    assert_eq!(
        lab.route_count(),
        55,
        "one route per pod CIDR, nothing more"
    );
    let names: BTreeSet<String> = (0..50).map(|i| format!("node-{i:02}")).collect();
    wait_for(
        "every Node to get RouteCreated",
        Duration::from_secs(60),
        || async {
            let c = lab.conditions().await;
            names
                .iter()
                .all(|n| c.get(n) == Some(&created()))
                .then_some(())
        },
    )
    .await;

    // Others' routes are untouched: same table other protocol, main table (even with netcm's protocol).
    let table = lab.ns.ip(&["route", "show", "table", TABLE]);
    assert!(table.contains("10.200.0.0/24 via 192.0.2.200"), "{table}");
    let main = lab.ns.ip(&["route", "show"]);
    assert!(main.contains("10.201.0.0/24 via 192.0.2.201"), "{main}");
    assert!(main.contains("10.202.0.0/24 via 192.0.2.202"), "{main}");
    assert!(
        !main.contains("10.244."),
        "no pod route in the main table: {main}"
    );

    // Metrics, then two more reconcile periods: still one condition write per Node, no more.
    assert_eq!(netcm.metric("netcm_routes_programmed").await, Some(55.0));
    assert_eq!(
        netcm
            .metric("netcm_route_errors_total{operation=\"create\"}")
            .await,
        Some(0.0)
    );
    assert!(
        netcm
            .metric("workqueue_adds_total{name=\"route-controller\"}")
            .await
            >= Some(50.0),
        "workqueue metrics under name=route-controller"
    );
    tokio::time::sleep(Duration::from_secs(2 * PERIOD_SECS + 1)).await;
    assert!(netcm.metric("route_controller_route_sync_total").await >= Some(2.0));
    let writes = netcm_status_writes(&lab.env, &names, since);
    assert_eq!(
        writes.len(),
        50,
        "every Node's condition written: {writes:?}"
    );
    assert!(
        writes.values().all(|n| *n == 1),
        "one write per Node: {writes:?}"
    );
    assert_eq!(lab.routes(), want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_follow_address_changes_and_deletions_and_come_back_after_a_manual_delete() {
    let lab = lab().await;
    let netcm = lab.start(&[], &[]);
    let fixtures = on_link_nodes("n", 3);
    create_nodes(&lab.env.client, fixtures, 3).await;
    let mut want = on_link_routes(3);
    lab.wait_routes(&want, Duration::from_secs(30)).await;

    // A changed InternalIP: the gateway follows.
    set_addresses(
        &lab.env.client,
        "n2",
        &[("InternalIP".into(), "192.0.2.77".into())],
    )
    .await;
    want.insert(net("10.244.2.0/24"), ip("192.0.2.77"));
    lab.wait_routes(&want, Duration::from_secs(30)).await;

    // A deleted Node: its route goes.
    lab.nodes()
        .delete("n3", &DeleteParams::default())
        .await
        .expect("delete n3");
    want.remove(&net("10.244.3.0/24"));
    lab.wait_routes(&want, Duration::from_secs(30)).await;

    // A route deleted by hand comes back (from the kernel's notification or the next reconcile).
    lab.ns.ip(&[
        "route",
        "del",
        "10.244.1.0/24",
        "table",
        TABLE,
        "proto",
        PROTO,
    ]);
    lab.wait_routes(&want, Duration::from_secs(30)).await;
    assert!(netcm.metric("route_controller_route_sync_total").await >= Some(1.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_gateway_gives_no_route_created_and_an_event_and_spares_the_others() {
    let lab = lab().await;
    let netcm = lab.start(&[], &[]);
    let mut fixtures = on_link_nodes("good-", 3);
    fixtures.push(off_link_node("bad"));
    create_nodes(&lab.env.client, fixtures, 4).await;

    let mut want = on_link_routes(3);
    lab.wait_routes(&want, Duration::from_secs(30)).await;
    wait_for(
        "bad to get NoRouteCreated and the others RouteCreated",
        Duration::from_secs(30),
        || async {
            let c = lab.conditions().await;
            (c.get("bad") == Some(&not_created())
                && (1..=3).all(|i| c.get(&format!("good-{i}")) == Some(&created())))
            .then_some(())
        },
    )
    .await;
    let note = lab.failed_route_event("bad", Duration::from_secs(30)).await;
    assert!(
        note.contains("10.244.9.0/24") && note.contains("203.0.113.5"),
        "{note}"
    );
    for i in 1..=3 {
        assert!(lab.env.node_events(&format!("good-{i}")).await.is_empty());
    }
    assert!(
        netcm
            .metric("netcm_route_errors_total{operation=\"create\"}")
            .await
            >= Some(1.0)
    );
    assert_eq!(netcm.metric("netcm_route_failing_nodes").await, Some(1.0));
    assert_eq!(lab.routes(), want, "no route for bad, the others untouched");

    // Fixed: an on-link address gives the route and flips the condition.
    set_addresses(
        &lab.env.client,
        "bad",
        &[("InternalIP".into(), "192.0.2.99".into())],
    )
    .await;
    want.insert(net("10.244.9.0/24"), ip("192.0.2.99"));
    lab.wait_routes(&want, Duration::from_secs(30)).await;
    wait_for(
        "bad to get RouteCreated",
        Duration::from_secs(30),
        || async { (lab.conditions().await.get("bad") == Some(&created())).then_some(()) },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_mode_routes_to_every_other_node_and_writes_only_its_own_condition() {
    let lab = lab().await;
    let since = jiff::Timestamp::now();
    let fixtures: Vec<NodeFixture> = (0..10)
        .map(|i| {
            NodeFixture::named(format!("ds-{i}"))
                .internal_ip(&format!("192.0.2.{}", 100 + i))
                .pod_cidrs(&[&format!("10.244.{i}.0/24")])
        })
        .collect();
    create_nodes(&lab.env.client, fixtures, 8).await;
    let _netcm = lab.start(
        &["--route-mode=node", "--leader-elect=false"],
        &[("NODE_NAME", "ds-0")],
    );
    let want: BTreeMap<IpNet, IpAddr> = (1..10)
        .map(|i| {
            (
                net(&format!("10.244.{i}.0/24")),
                ip(&format!("192.0.2.{}", 100 + i)),
            )
        })
        .collect();
    lab.wait_routes(&want, Duration::from_secs(30)).await;
    assert!(
        !lab.routes().contains_key(&net("10.244.0.0/24")),
        "no route to its own pod CIDR"
    );

    // Its own Node gets RouteCreated once a reconcile finds its own routing working; no other Node is
    // written to.
    wait_for(
        "ds-0 to get RouteCreated",
        Duration::from_secs(4 * PERIOD_SECS + 10),
        || async { (lab.conditions().await.get("ds-0") == Some(&created())).then_some(()) },
    )
    .await;
    let conditions = lab.conditions().await;
    assert_eq!(
        conditions.keys().collect::<Vec<_>>(),
        ["ds-0"],
        "{conditions:?}"
    );
    let peers: BTreeSet<String> = (1..10).map(|i| format!("ds-{i}")).collect();
    assert!(netcm_status_writes(&lab.env, &peers, since).is_empty());
    assert_eq!(lab.routes(), want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_set_node_network_unavailable_false_routes_are_made_and_no_condition_is_written() {
    let lab = lab().await;
    let since = jiff::Timestamp::now();
    let _netcm = lab.start(&["--set-node-network-unavailable=false"], &[]);
    let fixtures: Vec<NodeFixture> = (1..=3)
        .map(|i| {
            NodeFixture::named(format!("quiet-{i}"))
                .internal_ip(&format!("192.0.2.{i}"))
                .pod_cidrs(&[&format!("10.244.{i}.0/24")])
        })
        .collect();
    create_nodes(&lab.env.client, fixtures, 3).await;
    let want: BTreeMap<IpNet, IpAddr> = (1..=3)
        .map(|i| {
            (
                net(&format!("10.244.{i}.0/24")),
                ip(&format!("192.0.2.{i}")),
            )
        })
        .collect();
    lab.wait_routes(&want, Duration::from_secs(30)).await;
    tokio::time::sleep(Duration::from_secs(PERIOD_SECS + 1)).await;
    assert!(lab.conditions().await.is_empty());
    let names: BTreeSet<String> = (1..=3).map(|i| format!("quiet-{i}")).collect();
    assert!(netcm_status_writes(&lab.env, &names, since).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateways_are_read_under_annotation_prefix_and_under_its_deprecated_alias() {
    let lab = lab().await;
    let node = NodeFixture::named("prefixed")
        .internal_ip("192.0.2.1")
        .pod_cidrs(&["10.244.1.0/24"])
        .annotation("flannel.alpha.coreos.com/public-ip", "192.0.2.21")
        .annotation("example.com/net-public-ip", "192.0.2.11")
        .annotation("example.com/old-public-ip", "192.0.2.31");
    create_nodes(&lab.env.client, vec![node], 1).await;
    let via = |gw: &str| BTreeMap::from([(net("10.244.1.0/24"), ip(gw))]);
    let netcm = lab.start(&["--annotation-prefix=example.com/net"], &[]);
    lab.wait_routes(&via("192.0.2.11"), Duration::from_secs(30))
        .await;
    drop(netcm);
    // The route stays in the kernel when netcm stops; the next one re-points it.
    let _netcm = lab.start(&["--route-lease-annotation-prefix=example.com/old"], &[]);
    lab.wait_routes(&via("192.0.2.31"), Duration::from_secs(30))
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_net_admin_the_route_controller_stops_at_startup_with_a_clear_error() {
    let env = TestEnv::new().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let log_path = dir.path().join("netcm.log");
    let log = std::fs::File::create(&log_path).expect("log");
    // setpriv drops CAP_NET_ADMIN from the inheritable and bounding sets, so netcm runs without it.
    let mut child = std::process::Command::new("setpriv")
        .args(["--inh-caps=-net_admin", "--bounding-set=-net_admin", "--"])
        .arg(netcm_e2e::netcm::netcm_binary())
        .arg(format!("--kubeconfig={}", env.cp.kubeconfig.display()))
        .args([
            "--controllers=route-controller",
            "--cluster-cidr=10.0.0.0/8",
            "--leader-elect=false",
            "--port=0",
        ])
        .env_remove("RUST_LOG")
        .env_remove("NODE_NAME")
        .stdout(log.try_clone().expect("fd"))
        .stderr(log)
        .spawn()
        .expect("setpriv (util-linux) runs netcm");
    let status = wait_for("netcm to exit", Duration::from_secs(60), || {
        let s = child.try_wait().ok().flatten();
        async move { s }
    })
    .await;
    let logs = std::fs::read_to_string(&log_path).unwrap_or_default();
    assert!(!status.success(), "exit status {status}; log:\n{logs}");
    assert!(
        logs.contains("route-controller") && logs.contains("CAP_NET_ADMIN"),
        "the error names the controller and the capability:\n{logs}"
    );
    assert!(!logs.contains("panicked"), "{logs}");
}
