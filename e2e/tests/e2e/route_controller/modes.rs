//! `--route-mode`: who reports which Node's condition. Gateway mode reports every Node whether or not
//! leader election is on; node mode reports only its own Node, and a bad peer is reported on the peer.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use netcm_e2e::nodes::{create_nodes, NodeFixture};
use netcm_e2e::wait_for;

use netcm_e2e::route_lab::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_mode_without_leader_election_writes_every_nodes_condition() {
    let lab = lab().await;
    let since = jiff::Timestamp::now();
    // One central replica, as kube-controller-manager runs in small clusters: no Lease, no NODE_NAME.
    let _netcm = lab.start(&["--route-mode=gateway", "--leader-elect=false"], &[]);
    let mut fixtures = on_link_nodes("gw-", 3);
    // Off-link from this host: its route fails, so it must be reported NoRouteCreated.
    fixtures.push(off_link_node("gw-bad"));
    create_nodes(&lab.env.client, fixtures, 4).await;
    let want = on_link_routes(3);
    lab.wait_routes(&want, Duration::from_secs(30)).await;
    wait_for(
        "every Node's NetworkUnavailable condition",
        Duration::from_secs(30),
        || async {
            let c = lab.conditions().await;
            ((1..=3).all(|i| c.get(&format!("gw-{i}")) == Some(&created()))
                && c.get("gw-bad") == Some(&not_created()))
            .then_some(())
        },
    )
    .await;
    let names: BTreeSet<String> = ["gw-1", "gw-2", "gw-3", "gw-bad"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let writes = netcm_status_writes(&lab.env, &names, since);
    assert_eq!(writes.len(), 4, "every Node written once: {writes:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_mode_reports_only_the_off_link_peer_and_every_node_keeps_route_created() {
    let lab = lab().await;
    // Three hosts, as three Nodes of a DaemonSet: a and b share the LAN 192.0.2.0/24; c sits on
    // 203.0.113.0/24, which c reaches but a and b do not (its address is off-link for them).
    let b = Host::new(&lab.env, &["192.0.2.2/24"]);
    let c = Host::new(&lab.env, &["192.0.2.3/24", "203.0.113.1/24"]);
    let fixtures = vec![
        NodeFixture::named("a")
            .internal_ip("192.0.2.10")
            .pod_cidrs(&["10.244.1.0/24"]),
        NodeFixture::named("b")
            .internal_ip("192.0.2.20")
            .pod_cidrs(&["10.244.2.0/24"]),
        NodeFixture::named("c")
            .internal_ip("203.0.113.5")
            .pod_cidrs(&["10.244.3.0/24"]),
    ];
    create_nodes(&lab.env.client, fixtures, 3).await;
    let mode = ["--route-mode=node", "--leader-elect=false"];
    let on_a = lab.start(&mode, &[("NODE_NAME", "a")]);
    let on_b = lab.start_on(&b, &mode, &[("NODE_NAME", "b")]);
    let on_c = lab.start_on(&c, &mode, &[("NODE_NAME", "c")]);

    let route_to = |dst: &str, gw: &str| (net(dst), ip(gw));
    lab.wait_routes(
        &BTreeMap::from([route_to("10.244.2.0/24", "192.0.2.20")]),
        Duration::from_secs(30),
    )
    .await;
    b.wait_routes(
        &BTreeMap::from([route_to("10.244.1.0/24", "192.0.2.10")]),
        Duration::from_secs(30),
    )
    .await;
    c.wait_routes(
        &BTreeMap::from([
            route_to("10.244.1.0/24", "192.0.2.10"),
            route_to("10.244.2.0/24", "192.0.2.20"),
        ]),
        Duration::from_secs(30),
    )
    .await;

    // Each host reports only its own Node, and each host's own routing works: all three RouteCreated.
    wait_for(
        "a, b and c to get RouteCreated",
        Duration::from_secs(30),
        || async {
            let conds = lab.conditions().await;
            ["a", "b", "c"]
                .iter()
                .all(|n| conds.get(*n) == Some(&created()))
                .then_some(())
        },
    )
    .await;
    // The peer that a and b cannot reach is the one reported: an Event on c, the gauge on a and b.
    let note = lab.failed_route_event("c", Duration::from_secs(30)).await;
    assert!(
        note.contains("10.244.3.0/24") && note.contains("203.0.113.5"),
        "{note}"
    );
    for (netcm, failing) in [(&on_a, 1.0), (&on_b, 1.0), (&on_c, 0.0)] {
        let seen = wait_for(
            "netcm_route_failing_nodes",
            Duration::from_secs(10),
            || async {
                let v = netcm.metric("netcm_route_failing_nodes").await?;
                (v == failing).then_some(v)
            },
        )
        .await;
        assert_eq!(seen, failing);
    }
    // Several reconcile periods later nothing has flipped: a bad peer never marks its neighbours.
    tokio::time::sleep(Duration::from_secs(2 * PERIOD_SECS + 1)).await;
    let conds = lab.conditions().await;
    for n in ["a", "b", "c"] {
        assert_eq!(conds.get(n), Some(&created()), "{n}: {conds:?}");
    }
    for n in ["a", "b"] {
        assert!(
            lab.env.node_events(n).await.is_empty(),
            "no Event on {n}, whose routes all work"
        );
    }
}
