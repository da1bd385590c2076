//! node-annotation-syncer against the real control plane: every lease is read back with a test-side
//! parser that follows flannel's `nodeToLease` (netcm_e2e::flannel), never with the controller's code.
//! Every test ends by checking that a user's annotation under the same prefix (`<p>/custom`) is untouched.
//!
//! Here: leases at scale and the chain from the allocator. Beside this file: `addresses.rs` (which
//! address becomes the public IP, overwrites, Nodes still missing a piece), `ownership.rs` (a lease
//! another writer publishes), `backlog.rs` (a backlog's CIDRs come before its leases), `beside_flanneld.rs` (the same with real flanneld agents), `flags.rs`
//! (`--annotation-prefix`), `support.rs` (expectations, waits, the audit log).

mod support;

mod addresses;
mod backlog;
mod beside_flanneld;
mod flags;
mod ownership;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};
use netcm_e2e::nodes::{create_nodes, NodeFixture};
use netcm_e2e::{wait_for, Netcm, TestEnv};
use support::*;
/// The 200-Node mix: node i's kind is i % 6.
fn mixed(i: usize) -> (NodeFixture, Expected) {
    let name = format!("mix-{i:03}");
    let v4_cidr = format!("10.244.{i}.0/24");
    let v6_cidr = format!("fd00:10:244:{i:x}::/64");
    let int4 = format!("198.18.1.{}", i + 1);
    let ext4 = format!("198.19.1.{}", i + 1);
    let int6 = format!("2001:db8:1::{:x}", i + 1);
    let ext6 = format!("2001:db8:2::{:x}", i + 1);
    let over4 = format!("203.0.113.{}", i % 250 + 1);
    let over6 = format!("2001:DB8:FFFF::{:X}", i + 1);
    let custom = format!("user-{i}");
    let f = NodeFixture::named(&name).annotation(&k("custom"), &custom);
    let e = Expected::host_gw(&name).custom(&custom);
    match i % 6 {
        // IPv4-only; ExternalIP listed first, InternalIP wins by flag order.
        0 => (
            f.pod_cidrs(&[&v4_cidr])
                .address("ExternalIP", &ext4)
                .internal_ip(&int4),
            e.v4(&int4, &v4_cidr),
        ),
        // Dual-stack from InternalIPs.
        1 => (
            f.pod_cidrs(&[&v4_cidr, &v6_cidr])
                .internal_ip(&int4)
                .address("ExternalIP", &ext6)
                .internal_ip(&int6),
            e.v4(&int4, &v4_cidr).v6(&int6, &v6_cidr),
        ),
        // IPv4-only whose InternalIP is IPv6: the IPv4 comes from ExternalIP.
        2 => (
            f.pod_cidrs(&[&v4_cidr])
                .address("Hostname", &name)
                .internal_ip(&int6)
                .address("ExternalIP", &ext4),
            e.v4(&ext4, &v4_cidr),
        ),
        // IPv4-only with an overwrite.
        3 => (
            f.pod_cidrs(&[&v4_cidr])
                .internal_ip(&int4)
                .annotation(&k("public-ip-overwrite"), &over4),
            e.v4(&over4, &v4_cidr),
        ),
        // Dual-stack with both overwrites (the IPv6 one in upper case).
        4 => (
            f.pod_cidrs(&[&v4_cidr, &v6_cidr])
                .internal_ip(&int4)
                .internal_ip(&int6)
                .annotation(&k("public-ip-overwrite"), &over4)
                .annotation(&k("public-ipv6-overwrite"), &over6),
            e.v4(&over4, &v4_cidr).v6(&over6, &v6_cidr),
        ),
        // IPv6-only.
        _ => (
            f.pod_cidrs(&[&v6_cidr])
                .internal_ip(&int4)
                .internal_ip(&int6),
            e.v6(&int6, &v6_cidr),
        ),
    }
}

#[tokio::test]
async fn two_hundred_nodes_carry_the_lease_flannel_reads_and_a_resync_writes_nothing() {
    let env = TestEnv::new().await;
    let (fixtures, expected): (Vec<_>, Vec<_>) = (0..200).map(mixed).unzip();
    let t = Instant::now();
    create_nodes(&env.client, fixtures, 16).await;
    let create_time = t.elapsed();

    let started = Instant::now();
    let mut first = Netcm::start("syncer-1", &env.cp.kubeconfig, &[SYNCER]);
    let api: Api<Node> = Api::all(env.client.clone());
    wait_for("all 200 leases to read as expected", TIMEOUT, || async {
        let list = api.list(&ListParams::default()).await.ok()?;
        let by_name: HashMap<String, Node> = list
            .items
            .into_iter()
            .map(|n| (n.metadata.name.clone().unwrap_or_default(), n))
            .collect();
        expected
            .iter()
            .all(|e| {
                by_name
                    .get(&e.name)
                    .is_some_and(|n| check_lease(n, e, PREFIX).is_ok())
            })
            .then_some(())
    })
    .await;
    let annotate_time = started.elapsed();
    for e in &expected {
        let node = get(&env, &e.name).await;
        check_lease(&node, e, PREFIX).unwrap_or_else(|err| panic!("{}: {err}", e.name));
    }
    wait_idle(&first, 200.0).await;
    let writes = metric(&first, WRITES).await;
    assert_eq!(writes, 200.0, "exactly one PATCH per node");
    let first_id = leader_identity(&env, None).await;
    let audited = wait_for("the 200 PATCHes in the audit log", TIMEOUT, || async {
        let n = node_patches_by(&env, &first_id);
        (n >= 200).then_some(n)
    })
    .await;
    assert_eq!(audited, 200, "node PATCHes by {first_id} in the audit log");

    // Steady state: a new process re-syncs all 200 Nodes and writes nothing.
    first.signal("TERM");
    assert!(first.wait_exit(Duration::from_secs(30)).await.success());
    let restarted = Instant::now();
    let second = Netcm::start("syncer-2", &env.cp.kubeconfig, &[SYNCER]);
    let second_id = leader_identity(&env, Some(&first_id)).await;
    let resynced = wait_idle(&second, 200.0).await;
    let resync_time = restarted.elapsed();
    assert_eq!(
        metric(&second, WRITES).await,
        0.0,
        "a re-sync of settled nodes writes nothing"
    );
    assert_eq!(metric(&second, RETRIES).await, 0.0);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        node_patches_by(&env, &second_id),
        0,
        "node PATCHes by {second_id}"
    );
    for e in &expected {
        let node = get(&env, &e.name).await;
        check_lease(&node, e, PREFIX).unwrap_or_else(|err| panic!("{}: {err}", e.name));
    }
    eprintln!(
        "figures: 200 nodes created in {create_time:.2?}; all leases published {annotate_time:.2?} after netcm started; \
         writes {writes} (audit: {audited}); restart re-synced {resynced} keys in {resync_time:.2?} with 0 writes"
    );
}

#[tokio::test]
async fn the_allocator_and_the_syncer_chain_pod_cidrs_into_leases() {
    let env = TestEnv::new().await;
    let _netcm = Netcm::start(
        "allocator-and-syncer",
        &env.cp.kubeconfig,
        &[
            "--controllers=subnet-allocator,node-annotation-syncer",
            "--cluster-cidr=10.244.0.0/16,fd00:10:244::/56",
        ],
    );
    let fixtures: Vec<NodeFixture> = (0..20)
        .map(|i| {
            NodeFixture::named(format!("chain-{i:02}"))
                .internal_ip(&format!("198.18.2.{}", i + 1))
                .internal_ip(&format!("2001:db8:3::{:x}", i + 1))
                .annotation(&k("custom"), "chained")
        })
        .collect();
    let t = Instant::now();
    create_nodes(&env.client, fixtures, 16).await;
    for i in 0..20 {
        let name = format!("chain-{i:02}");
        let node = wait_for(&format!("{name} to get two pod CIDRs"), TIMEOUT, || async {
            let n = get(&env, &name).await;
            (netcm_e2e::nodes::pod_cidrs(&n).len() == 2).then_some(n)
        })
        .await;
        let cidrs = netcm_e2e::nodes::pod_cidrs(&node);
        let exp = Expected::host_gw(&name)
            .v4(&format!("198.18.2.{}", i + 1), &cidrs[0])
            .v6(&format!("2001:db8:3::{:x}", i + 1), &cidrs[1])
            .custom("chained");
        wait_lease(&env, &exp, PREFIX).await;
    }
    eprintln!(
        "figures: 20 dual-stack nodes created, allocated and published in {:.2?}",
        t.elapsed()
    );
}
