//! Repair from the kernel's route notifications: a route someone deleted or changed comes back without
//! waiting for the periodic reconcile (here 60 s), which is only the safety net. The oracle is the
//! reconcile counter, not a clock: the repairs happen while it stays put. The repair times are printed.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use ipnet::IpNet;
use netcm_e2e::nodes::{create_nodes, NodeFixture};

use netcm_e2e::route_lab::*;

/// How long the test waits for a repair: well inside the 60 s reconcile period.
const REPAIR_WAIT: Duration = Duration::from_secs(20);

/// Polls the table every few milliseconds until it is `want` again; the time it took, or `None` after
/// [`REPAIR_WAIT`].
fn time_until_repaired(
    lab: &Lab,
    want: &BTreeMap<IpNet, IpAddr>,
    since: Instant,
) -> Option<Duration> {
    while since.elapsed() <= REPAIR_WAIT {
        if lab.routes() == *want {
            return Some(since.elapsed());
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    (lab.routes() == *want).then(|| since.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_deleted_or_changed_by_hand_is_repaired_from_the_kernels_notifications_before_the_60s_reconcile(
) {
    let lab = lab().await;
    let netcm = lab.start(&["--route-reconciliation-period=60s"], &[]);
    let fixtures = vec![
        NodeFixture::named("r1")
            .internal_ip("192.0.2.10")
            .pod_cidrs(&["10.244.1.0/24"]),
        NodeFixture::named("r2")
            .internal_ip("192.0.2.20")
            .internal_ip("2001:db8::20")
            .pod_cidrs(&["10.244.2.0/24", "fd00:10:244:2::/64"]),
    ];
    create_nodes(&lab.env.client, fixtures, 2).await;
    let want = BTreeMap::from([
        (net("10.244.1.0/24"), ip("192.0.2.10")),
        (net("10.244.2.0/24"), ip("192.0.2.20")),
        (net("fd00:10:244:2::/64"), ip("2001:db8::20")),
    ]);
    lab.wait_routes(&want, Duration::from_secs(30)).await;
    // A missing series on both sides would compare equal: read it as a number or fail.
    let syncs_before = netcm
        .metric("route_controller_route_sync_total")
        .await
        .expect("route_controller_route_sync_total is exported");

    let mut measured = Vec::new();
    for (what, args) in [
        (
            "IPv4 route deleted",
            vec![
                "route",
                "del",
                "10.244.1.0/24",
                "table",
                TABLE,
                "proto",
                PROTO,
            ],
        ),
        (
            "IPv4 gateway changed",
            vec![
                "route",
                "replace",
                "10.244.2.0/24",
                "via",
                "192.0.2.250",
                "table",
                TABLE,
                "proto",
                PROTO,
            ],
        ),
        (
            "IPv6 route deleted",
            vec![
                "-6",
                "route",
                "del",
                "fd00:10:244:2::/64",
                "table",
                TABLE,
                "proto",
                PROTO,
            ],
        ),
    ] {
        let lab = &lab;
        let want = want.clone();
        let took = tokio::task::block_in_place(|| {
            // From before the change, so the time includes everything after it.
            let since = Instant::now();
            lab.ns.ip(&args);
            time_until_repaired(lab, &want, since)
        });
        eprintln!("{what} by hand: repaired after {took:?} (period 60s)");
        measured.push((what, took));
    }
    eprintln!("repair times: {measured:?}");
    for (what, took) in &measured {
        assert!(
            took.is_some(),
            "{what}: not repaired within {REPAIR_WAIT:?}: {measured:?}"
        );
    }
    // The repairs came from the notifications, not from a full reconcile.
    assert_eq!(
        netcm
            .metric("route_controller_route_sync_total")
            .await
            .expect("route_controller_route_sync_total is exported"),
        syncs_before
    );
}
