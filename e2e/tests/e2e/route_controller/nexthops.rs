//! Nexthop objects: every route of netcm's names one nexthop per gateway (the kernel inserts those in
//! constant time; a gateway per route is quadratic), a nexthop someone deletes under its routes is made
//! again, one someone re-points is not trusted, a nexthop no route names any more goes within a few
//! reconcile periods, a restarted netcm adopts the nexthops it left instead of making new ones, and a
//! gateway the kernel takes on a route but refuses on a nexthop (its link has no carrier) keeps a plain
//! route. netcm's gauges count the routes naming a nexthop and the nexthops, so the plain route shows.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

use kube::api::{DeleteParams, Patch, PatchParams};
use netcm_e2e::netns::NetnsNetcm;
use netcm_e2e::nodes::{create_nodes, NodeFixture};
use netcm_e2e::wait_for;

use netcm_e2e::route_lab::*;

/// netcm's nexthops in the lab's namespace: gateway → id; panics on two via one gateway.
fn netcm_nexthops(lab: &Lab) -> BTreeMap<IpAddr, u32> {
    let mut out = BTreeMap::new();
    for nh in lab.ns.nexthops() {
        if nh.protocol.as_deref() != Some(PROTO) {
            continue;
        }
        let gateway: IpAddr = nh
            .gateway
            .as_deref()
            .unwrap_or_else(|| panic!("netcm's nexthop {} without a gateway", nh.id))
            .parse()
            .expect("gateway");
        assert!(
            out.insert(gateway, nh.id).is_none(),
            "two nexthops of netcm's via {gateway}"
        );
    }
    out
}

/// The nexthop each of netcm's routes names: destination → id; panics on a route that names none.
fn named_nexthops(lab: &Lab) -> BTreeMap<String, u32> {
    lab.ns
        .routes(TABLE, Some(PROTO))
        .into_iter()
        .map(|r| {
            let id = r
                .nhid
                .unwrap_or_else(|| panic!("route to {} names no nexthop: {r:?}", r.dst));
            (r.dst, id)
        })
        .collect()
}

async fn wait_nexthops(lab: &Lab, gateways: &[&str]) -> BTreeMap<IpAddr, u32> {
    let want: Vec<IpAddr> = gateways.iter().map(|g| ip(g)).collect();
    wait_for(
        "netcm's nexthops to be one per wanted gateway",
        Duration::from_secs(30),
        || async {
            let now = netcm_nexthops(lab);
            (now.keys().copied().collect::<Vec<_>>() == want).then_some(now)
        },
    )
    .await
}

/// Waits until netcm's gauges read `routes` routes, `via_nexthop` of them naming a nexthop, and
/// `nexthops` nexthop objects (set at each listing, every reconcile period).
async fn wait_nexthop_gauges(netcm: &NetnsNetcm, routes: f64, via_nexthop: f64, nexthops: f64) {
    let want = [routes, via_nexthop, nexthops];
    wait_for(
        &format!("netcm's routes / via nexthop / nexthops gauges to read {want:?}"),
        Duration::from_secs(30),
        || async {
            let mut now = [0.0; 3];
            for (value, series) in now.iter_mut().zip([
                "netcm_routes_programmed",
                "netcm_routes_via_nexthop",
                "netcm_route_nexthops",
            ]) {
                *value = netcm.metric(series).await?;
            }
            (now == want).then_some(())
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_name_one_nexthop_per_gateway_which_comes_back_when_deleted_goes_when_unused_and_survives_a_restart(
) {
    let lab = lab().await;
    let args = ["--leader-elect=false"];
    let netcm = lab.start(&args, &[]);
    let fixtures = vec![
        NodeFixture::named("nh1")
            .internal_ip("192.0.2.10")
            .pod_cidrs(&["10.244.1.0/24"]),
        NodeFixture::named("nh2")
            .internal_ip("192.0.2.20")
            .internal_ip("2001:db8::20")
            .pod_cidrs(&["10.244.2.0/24", "fd00:10:244:2::/64"]),
        NodeFixture::named("nh3")
            .internal_ip("192.0.2.30")
            .pod_cidrs(&["10.244.3.0/24"]),
    ];
    create_nodes(&lab.env.client, fixtures, 3).await;
    let want = BTreeMap::from([
        (net("10.244.1.0/24"), ip("192.0.2.10")),
        (net("10.244.2.0/24"), ip("192.0.2.20")),
        (net("fd00:10:244:2::/64"), ip("2001:db8::20")),
        (net("10.244.3.0/24"), ip("192.0.2.30")),
    ]);
    lab.wait_routes(&want, Duration::from_secs(30)).await;

    // One nexthop per gateway, and each route names its gateway's.
    let nexthops = wait_nexthops(
        &lab,
        &["192.0.2.10", "192.0.2.20", "192.0.2.30", "2001:db8::20"],
    )
    .await;
    let named = named_nexthops(&lab);
    assert_eq!(named["10.244.1.0/24"], nexthops[&ip("192.0.2.10")]);
    assert_eq!(named["fd00:10:244:2::/64"], nexthops[&ip("2001:db8::20")]);
    wait_nexthop_gauges(&netcm, 4.0, 4.0, 4.0).await;

    // Someone deletes a nexthop: the kernel drops its route, netcm makes both again.
    let old = nexthops[&ip("192.0.2.10")].to_string();
    lab.ns.ip(&["nexthop", "del", "id", &old]);
    lab.wait_routes(&want, Duration::from_secs(30)).await;
    let nexthops = wait_nexthops(
        &lab,
        &["192.0.2.10", "192.0.2.20", "192.0.2.30", "2001:db8::20"],
    )
    .await;
    assert_ne!(nexthops[&ip("192.0.2.10")].to_string(), old);
    assert_eq!(
        named_nexthops(&lab)["10.244.1.0/24"],
        nexthops[&ip("192.0.2.10")]
    );

    // A Node goes and another moves to a new gateway: the nexthops no route names go too.
    lab.nodes()
        .delete("nh3", &DeleteParams::default())
        .await
        .expect("delete nh3");
    let moved = serde_json::json!({"metadata": {"annotations": {PUBLIC_IP: "192.0.2.11"}}});
    lab.nodes()
        .patch("nh1", &PatchParams::default(), &Patch::Merge(&moved))
        .await
        .expect("move nh1");
    let want = BTreeMap::from([
        (net("10.244.1.0/24"), ip("192.0.2.11")),
        (net("10.244.2.0/24"), ip("192.0.2.20")),
        (net("fd00:10:244:2::/64"), ip("2001:db8::20")),
    ]);
    lab.wait_routes(&want, Duration::from_secs(30)).await;
    let nexthops = wait_nexthops(&lab, &["192.0.2.11", "192.0.2.20", "2001:db8::20"]).await;

    // A restarted netcm adopts them: the same ids, no new nexthop.
    wait_nexthop_gauges(&netcm, 3.0, 3.0, 3.0).await;
    drop(netcm);
    let netcm = lab.start(&args, &[]);
    lab.wait_routes(&want, Duration::from_secs(30)).await;
    wait_nexthop_gauges(&netcm, 3.0, 3.0, 3.0).await;
    tokio::time::sleep(Duration::from_secs(3 * PERIOD_SECS + 1)).await;
    assert_eq!(netcm_nexthops(&lab), nexthops);
    assert_eq!(lab.routes(), want);
    let named = named_nexthops(&lab);
    assert_eq!(named["10.244.1.0/24"], nexthops[&ip("192.0.2.11")]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nexthop_someone_re_points_is_not_trusted_and_its_route_is_back_on_its_gateway_before_the_60s_reconcile(
) {
    let lab = lab().await;
    let _netcm = lab.start(
        &["--leader-elect=false", "--route-reconciliation-period=60s"],
        &[],
    );
    let node = NodeFixture::named("hijacked")
        .internal_ip("192.0.2.20")
        .pod_cidrs(&["10.244.2.0/24"]);
    create_nodes(&lab.env.client, vec![node], 1).await;
    let want = BTreeMap::from([(net("10.244.2.0/24"), ip("192.0.2.20"))]);
    lab.wait_routes(&want, Duration::from_secs(30)).await;
    let nexthops = wait_nexthops(&lab, &["192.0.2.20"]).await;
    let id = nexthops[&ip("192.0.2.20")].to_string();
    // The kernel reports the route via the new gateway; a replace that trusted its cached id would put
    // the route back on the same re-pointed nexthop until the next full reconcile, 60 s away.
    lab.ns.ip(&[
        "nexthop",
        "replace",
        "id",
        &id,
        "via",
        "192.0.2.250",
        "dev",
        "v0",
        "proto",
        PROTO,
    ]);
    lab.wait_routes(&want, Duration::from_secs(20)).await;
    assert_ne!(named_nexthops(&lab)["10.244.2.0/24"].to_string(), id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_on_a_link_without_carrier_gets_a_plain_route_as_before_nexthops_and_the_others_name_theirs(
) {
    let lab = lab().await;
    // A second link whose peer is down: the kernel takes a route via it (flagged linkdown) but refuses a
    // nexthop on it ("Carrier for nexthop device is down").
    lab.ns
        .ip(&["link", "add", "w0", "type", "veth", "peer", "name", "w1"]);
    lab.ns.ip(&["addr", "add", "198.51.100.1/24", "dev", "w0"]);
    lab.ns.ip(&["link", "set", "w0", "up"]);
    let netcm = lab.start(&["--leader-elect=false"], &[]);
    let fixtures = vec![
        NodeFixture::named("no-carrier")
            .internal_ip("198.51.100.5")
            .pod_cidrs(&["10.244.5.0/24"]),
        NodeFixture::named("carrier")
            .internal_ip("192.0.2.6")
            .pod_cidrs(&["10.244.6.0/24"]),
    ];
    create_nodes(&lab.env.client, fixtures, 2).await;
    let want = BTreeMap::from([
        (net("10.244.5.0/24"), ip("198.51.100.5")),
        (net("10.244.6.0/24"), ip("192.0.2.6")),
    ]);
    lab.wait_routes(&want, Duration::from_secs(30)).await;
    let nhids: BTreeMap<String, Option<u32>> = lab
        .ns
        .routes(TABLE, Some(PROTO))
        .into_iter()
        .map(|r| (r.dst, r.nhid))
        .collect();
    assert_eq!(nhids["10.244.5.0/24"], None, "{nhids:?}");
    assert!(nhids["10.244.6.0/24"].is_some(), "{nhids:?}");
    assert_eq!(
        netcm_nexthops(&lab).keys().copied().collect::<Vec<_>>(),
        vec![ip("192.0.2.6")]
    );
    // Two routes, one naming a nexthop: the plain route shows on /metrics.
    wait_nexthop_gauges(&netcm, 2.0, 1.0, 1.0).await;
}
