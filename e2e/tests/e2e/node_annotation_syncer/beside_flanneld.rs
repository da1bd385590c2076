//! The syncer beside real flannel agents: flanneld v0.28 (hack/controlplane.sh builds it) runs in
//! kube-subnet-manager mode in one network namespace per simulated node, on one LAN, against the test API
//! server. It publishes its own Node's lease; netcm publishes the others' and must never write an agent's
//! Node. The oracles are the routes flanneld programs, the leases as flannel reads them, and netcm's
//! PATCHes in the API server's audit log.
//!
//! Agent `fl-a`'s Node reports an InternalIP on another network (198.51.100.0/24) than the LAN its
//! flanneld uses (`--iface=eth0`, 192.0.2.0/24), as on a host with two NICs: netcm would publish the
//! InternalIP, flanneld publishes its LAN address. Agent `fl-b` agrees with netcm on everything.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DeleteParams};
use netcm_e2e::flannel::node_to_lease;
use netcm_e2e::flanneld::{Flanneld, Host, Lan, Via};
use netcm_e2e::nodes::{create_node, NodeFixture};
use netcm_e2e::{wait_for, Netcm, TestEnv};

use super::support::*;

const NETWORK: &str = "10.244.0.0/16";

/// The four Nodes: two with agents, two peers only netcm publishes.
async fn create_fleet(env: &TestEnv) {
    for (name, cidr, internal_ip) in [
        ("fl-a", "10.244.1.0/24", "198.51.100.1"),
        ("fl-b", "10.244.2.0/24", "192.0.2.2"),
        ("fl-c", "10.244.3.0/24", "192.0.2.3"),
        ("fl-d", "10.244.4.0/24", "192.0.2.4"),
    ] {
        let f = NodeFixture::named(name)
            .pod_cidrs(&[cidr])
            .internal_ip(internal_ip)
            .annotation(&k("custom"), name);
        create_node(&env.client, &f).await;
    }
}

fn net(s: &str) -> IpNet {
    s.parse().expect("CIDR")
}

/// host-gw routes: pod CIDR → gateway on `eth0`.
fn host_gw(routes: &[(&str, &str)]) -> BTreeMap<IpNet, Via> {
    routes
        .iter()
        .map(|(dst, gw)| {
            let gateway: IpAddr = gw.parse().expect("IP");
            (
                net(dst),
                Via {
                    gateway,
                    dev: "eth0".into(),
                },
            )
        })
        .collect()
}

/// Waits until the routes flanneld programmed inside the cluster network are exactly `want`.
async fn wait_routes(host: &Host, agent: &mut Flanneld, want: &BTreeMap<IpNet, Via>) {
    let mut last = BTreeMap::new();
    let found = tokio::time::timeout(TIMEOUT, async {
        loop {
            agent.assert_running();
            last = host.routes_within(net(NETWORK));
            if &last == want {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
    assert!(
        found.is_ok(),
        "{}'s routes after {TIMEOUT:?}: {last:?}, expected {want:?}",
        agent.label
    );
}

/// The host-gw routes a flanneld on `own` must have: one per other Node with a lease, its pod CIDR via the
/// public IP the lease carries, as flannel reads the Node from the API.
async fn routes_from_leases(env: &TestEnv, own: &str) -> BTreeMap<IpNet, Via> {
    let nodes: Api<Node> = Api::all(env.client.clone());
    let list = nodes.list(&Default::default()).await.expect("list nodes");
    list.items
        .iter()
        .filter(|n| n.metadata.name.as_deref() != Some(own))
        .map(|n| {
            let lease = node_to_lease(n, PREFIX, true, false)
                .unwrap_or_else(|e| panic!("{:?}: {e}", n.metadata.name));
            let subnet = lease.subnet.expect("IPv4 subnet");
            let ip = lease.public_ip.expect("IPv4 public IP");
            (
                subnet,
                Via {
                    gateway: IpAddr::V4(ip),
                    dev: "eth0".into(),
                },
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_gw_agents_route_to_every_peer_by_its_lease_and_netcm_never_writes_an_agents_node() {
    let env = TestEnv::new().await;
    create_fleet(&env).await;
    let kubeconfig = &env.cp.kubeconfig;
    let lan = Lan::new();
    let (a, b) = (
        lan.host("192.0.2.1/24", kubeconfig),
        lan.host("192.0.2.2/24", kubeconfig),
    );
    let mut fa = Flanneld::start("flanneld-a", &a, kubeconfig, "fl-a", NETWORK, "host-gw");
    let mut fb = Flanneld::start("flanneld-b", &b, kubeconfig, "fl-b", NETWORK, "host-gw");
    // Each agent publishes its own lease first, with the address it routes from.
    let exp_a = Expected::host_gw("fl-a")
        .v4("192.0.2.1", "10.244.1.0/24")
        .custom("fl-a");
    let exp_b = Expected::host_gw("fl-b")
        .v4("192.0.2.2", "10.244.2.0/24")
        .custom("fl-b");
    wait_lease(&env, &exp_a, PREFIX).await;
    wait_lease(&env, &exp_b, PREFIX).await;

    let netcm_started = std::time::Instant::now();
    let netcm = Netcm::start("syncer-beside-flanneld", kubeconfig, &[SYNCER]);
    let id = leader_identity(&env, None).await;
    for (name, ip, cidr) in [
        ("fl-c", "192.0.2.3", "10.244.3.0/24"),
        ("fl-d", "192.0.2.4", "10.244.4.0/24"),
    ] {
        wait_lease(
            &env,
            &Expected::host_gw(name).v4(ip, cidr).custom(name),
            PREFIX,
        )
        .await;
    }
    // Every agent routes to every peer through the lease as published: netcm's for fl-c and fl-d, the
    // other agent's own for fl-a and fl-b.
    let want_a = host_gw(&[
        ("10.244.2.0/24", "192.0.2.2"),
        ("10.244.3.0/24", "192.0.2.3"),
        ("10.244.4.0/24", "192.0.2.4"),
    ]);
    let want_b = host_gw(&[
        ("10.244.1.0/24", "192.0.2.1"),
        ("10.244.3.0/24", "192.0.2.3"),
        ("10.244.4.0/24", "192.0.2.4"),
    ]);
    wait_routes(&a, &mut fa, &want_a).await;
    wait_routes(&b, &mut fb, &want_b).await;
    let routed = netcm_started.elapsed();
    assert_eq!(routes_from_leases(&env, "fl-a").await, want_a);
    assert_eq!(routes_from_leases(&env, "fl-b").await, want_b);
    wait_idle(&netcm, 4.0).await;
    assert_eq!(
        metric(&netcm, AGENT_MANAGED).await,
        1.0,
        "fl-a's lease differs from netcm's and is left to its agent; fl-b's agrees"
    );

    // Idle: in 20 s netcm writes no Node at all, and never wrote an agent's.
    let patches = node_patches_by(&env, &id);
    let writes = metric(&netcm, WRITES).await;
    assert_eq!(writes, 2.0, "one PATCH for each peer without an agent");
    tokio::time::sleep(Duration::from_secs(20)).await;
    assert_eq!(
        node_patches_by(&env, &id),
        patches,
        "node PATCHes by netcm while idle"
    );
    assert_eq!(metric(&netcm, WRITES).await, writes);
    for agent in ["fl-a", "fl-b"] {
        assert_eq!(
            node_patches_to(&env, &id, agent),
            0,
            "netcm PATCHed {agent}, whose lease its flanneld publishes"
        );
    }
    check_lease(&get(&env, "fl-a").await, &exp_a, PREFIX).expect("fl-a keeps its agent's lease");
    check_lease(&get(&env, "fl-b").await, &exp_b, PREFIX).expect("fl-b keeps its agent's lease");

    // A deleted Node's route goes from every agent.
    let nodes: Api<Node> = Api::all(env.client.clone());
    let deleted = std::time::Instant::now();
    nodes
        .delete("fl-d", &DeleteParams::default())
        .await
        .expect("delete fl-d");
    let gone = |mut m: BTreeMap<IpNet, Via>| {
        m.remove(&net("10.244.4.0/24"));
        m
    };
    wait_routes(&a, &mut fa, &gone(want_a)).await;
    wait_routes(&b, &mut fb, &gone(want_b)).await;
    assert_eq!(node_patches_to(&env, &id, "fl-a"), 0);
    eprintln!(
        "figures: host-gw routes to every peer {routed:.2?} after netcm started; a deleted Node's routes gone from both agents in {:.2?}",
        deleted.elapsed()
    );
}

/// The vxlan backend-data an agent published on its Node (netcm never writes it for vxlan).
async fn vtep(env: &TestEnv, name: &str) -> String {
    wait_for(
        &format!("{name}'s agent to publish its VTEP"),
        TIMEOUT,
        || async {
            let ann = annotations(&get(env, name).await);
            ann.get(&k("backend-data"))
                .filter(|d| d.contains("VtepMAC"))
                .cloned()
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vxlan_agents_take_over_leases_netcm_published_and_netcm_never_reverts_them() {
    let env = TestEnv::new().await;
    create_fleet(&env).await;
    let kubeconfig = &env.cp.kubeconfig;
    // netcm first: it publishes every lease (vxlan, no backend-data: only an agent knows its VTEP).
    let netcm = Netcm::start(
        "syncer-vxlan-beside-flanneld",
        kubeconfig,
        &[SYNCER, "--backend-type=vxlan"],
    );
    let id = leader_identity(&env, None).await;
    for (name, ip) in [
        ("fl-a", "198.51.100.1"),
        ("fl-b", "192.0.2.2"),
        ("fl-c", "192.0.2.3"),
        ("fl-d", "192.0.2.4"),
    ] {
        wait_annotation(&env, name, &k("public-ip"), ip).await;
    }
    let done = wait_idle(&netcm, 4.0).await;
    let before: Vec<usize> = ["fl-a", "fl-b"]
        .iter()
        .map(|n| node_patches_to(&env, &id, n))
        .collect();
    assert_eq!(before, [1, 1], "netcm published fl-a and fl-b once each");

    // The agents start and write their VTEPs (backend-data) and, on fl-a, the LAN address as public-ip.
    let lan = Lan::new();
    let (a, b) = (
        lan.host("192.0.2.1/24", kubeconfig),
        lan.host("192.0.2.2/24", kubeconfig),
    );
    let agents_started = std::time::Instant::now();
    let mut fa = Flanneld::start("flanneld-a", &a, kubeconfig, "fl-a", NETWORK, "vxlan");
    let mut fb = Flanneld::start("flanneld-b", &b, kubeconfig, "fl-b", NETWORK, "vxlan");
    let (data_a, data_b) = (vtep(&env, "fl-a").await, vtep(&env, "fl-b").await);
    let leases_written = agents_started.elapsed();
    // netcm sees both writes (the syncer re-syncs both Nodes) and reverts neither.
    wait_for("netcm to sync the agents' writes", TIMEOUT, || async {
        let d = netcm.metric(DONE).await?;
        let adds = netcm.metric(ADDS).await?;
        (d >= done + 2.0 && d == adds).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    wait_idle(&netcm, done + 2.0).await;
    let after: Vec<usize> = ["fl-a", "fl-b"]
        .iter()
        .map(|n| node_patches_to(&env, &id, n))
        .collect();
    assert_eq!(
        after, before,
        "netcm PATCHed an agent's Node after its flanneld wrote its lease"
    );
    let mut exp_a = Expected::host_gw("fl-a")
        .v4("192.0.2.1", "10.244.1.0/24")
        .custom("fl-a");
    exp_a.backend_type = "vxlan".into();
    exp_a.backend_data = data_a.clone();
    check_lease(&get(&env, "fl-a").await, &exp_a, PREFIX).expect("fl-a keeps its agent's lease");
    assert_eq!(metric(&netcm, AGENT_MANAGED).await, 1.0);

    // Each agent reaches the other through its vxlan device, at the address the other published: the
    // route via the peer's flannel.1 address, and the peer's VTEP MAC at its LAN address.
    let vxlan = |dst: &str, gw: &str| {
        let gateway: IpAddr = gw.parse().expect("IP");
        BTreeMap::from([(
            net(dst),
            Via {
                gateway,
                dev: "flannel.1".into(),
            },
        )])
    };
    let checked = agents_started.elapsed();
    wait_routes(&a, &mut fa, &vxlan("10.244.2.0/24", "10.244.2.0")).await;
    wait_routes(&b, &mut fb, &vxlan("10.244.1.0/24", "10.244.1.0")).await;
    eprintln!(
        "figures: vxlan agents' leases written {leases_written:.2?} after start; no revert checked by {checked:.2?}; routes by {:.2?}",
        agents_started.elapsed()
    );
    for (host, peer_data, peer_ip) in [(&b, &data_a, "192.0.2.1"), (&a, &data_b, "192.0.2.2")] {
        let mac = peer_data
            .split("\"VtepMAC\":\"")
            .nth(1)
            .and_then(|rest| rest.split('"').next())
            .unwrap_or_else(|| panic!("no VtepMAC in {peer_data}"));
        let fdb = host.fdb("flannel.1");
        assert!(
            fdb.lines()
                .any(|l| l.starts_with(mac) && l.contains(&format!("dst {peer_ip} "))),
            "{}: no forwarding entry {mac} dst {peer_ip} in:\n{fdb}",
            host.ns.name
        );
    }
    assert_eq!(
        ["fl-a", "fl-b"]
            .iter()
            .map(|n| node_patches_to(&env, &id, n))
            .collect::<Vec<_>>(),
        before
    );
}
