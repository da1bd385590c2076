//! node-annotation-syncer against the real control plane: every lease is read back with a test-side
//! parser that follows flannel's `nodeToLease` (netcm_e2e::flannel), never with the controller's code.
//! Every test ends by checking that a user's annotation under the same prefix (`<p>/custom`) is untouched.

#[path = "node_annotation_syncer/support.rs"]
mod support;

#[path = "node_annotation_syncer/beside_flanneld.rs"]
mod beside_flanneld;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams, Patch, PatchParams};
use netcm_e2e::nodes::{create_node, create_nodes, set_addresses, NodeFixture};
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
async fn address_and_overwrite_changes_move_the_public_ip_and_a_garbage_overwrite_keeps_the_last_good_one(
) {
    let env = TestEnv::new().await;
    let v4 = NodeFixture::named("addr-v4")
        .pod_cidrs(&["10.244.1.0/24"])
        .internal_ip("192.0.2.10")
        .annotation(&k("custom"), "keep-me");
    let ds = NodeFixture::named("addr-ds")
        .pod_cidrs(&["10.244.2.0/24", "fd00:10:244:2::/64"])
        .internal_ip("192.0.2.20")
        .internal_ip("2001:db8::20")
        .annotation(&k("custom"), "keep-me-too");
    create_node(&env.client, &v4).await;
    create_node(&env.client, &ds).await;
    let netcm = Netcm::start("syncer", &env.cp.kubeconfig, &[SYNCER]);
    wait_annotation(&env, "addr-v4", &k("public-ip"), "192.0.2.10").await;
    wait_annotation(&env, "addr-ds", &k("public-ipv6"), "2001:db8::20").await;

    // The InternalIP changes: the lease follows.
    let addr = |a: &str| ("InternalIP".to_string(), a.to_string());
    set_addresses(&env.client, "addr-v4", &[addr("192.0.2.11")]).await;
    let follow = wait_annotation(&env, "addr-v4", &k("public-ip"), "192.0.2.11").await;

    // An overwrite wins over the address.
    annotate(
        &env,
        "addr-v4",
        &k("public-ip-overwrite"),
        Some("203.0.113.7"),
    )
    .await;
    wait_annotation(&env, "addr-v4", &k("public-ip"), "203.0.113.7").await;

    // Garbage: a Warning Event, the counter, and the last good value stays — also when the address moves.
    annotate(
        &env,
        "addr-v4",
        &k("public-ip-overwrite"),
        Some("not-an-ip"),
    )
    .await;
    let note = wait_for(
        "the InvalidPublicIPOverwrite event on addr-v4",
        TIMEOUT,
        || async {
            env.node_events("addr-v4")
                .await
                .into_iter()
                .find(|(t, r, _)| t == "Warning" && r == "InvalidPublicIPOverwrite")
                .map(|(_, _, note)| note)
        },
    )
    .await;
    assert!(
        note.contains("not-an-ip") && note.contains("203.0.113.7"),
        "{note}"
    );
    assert_eq!(metric(&netcm, INVALID_V4).await, 1.0);
    let done = wait_idle(&netcm, 0.0).await;
    set_addresses(&env.client, "addr-v4", &[addr("192.0.2.12")]).await;
    wait_idle(&netcm, done + 1.0).await;
    let node = get(&env, "addr-v4").await;
    assert_eq!(
        annotations(&node).get(&k("public-ip")).map(String::as_str),
        Some("203.0.113.7")
    );
    assert_eq!(
        metric(&netcm, INVALID_V4).await,
        1.0,
        "the same bad value is counted once"
    );

    // The overwrite is removed: back to the address.
    annotate(&env, "addr-v4", &k("public-ip-overwrite"), None).await;
    wait_annotation(&env, "addr-v4", &k("public-ip"), "192.0.2.12").await;

    // IPv6: a valid overwrite, then an IPv4 address where IPv6 belongs.
    annotate(
        &env,
        "addr-ds",
        &k("public-ipv6-overwrite"),
        Some("2001:db8:ffff::7"),
    )
    .await;
    wait_annotation(&env, "addr-ds", &k("public-ipv6"), "2001:db8:ffff::7").await;
    annotate(
        &env,
        "addr-ds",
        &k("public-ipv6-overwrite"),
        Some("192.0.2.99"),
    )
    .await;
    wait_for(
        "the IPv6 InvalidPublicIPOverwrite event",
        TIMEOUT,
        || async {
            env.node_events("addr-ds")
                .await
                .into_iter()
                .any(|(t, r, n)| {
                    t == "Warning" && r == "InvalidPublicIPOverwrite" && n.contains("192.0.2.99")
                })
                .then_some(())
        },
    )
    .await;
    assert_eq!(metric(&netcm, INVALID_V6).await, 1.0);
    set_addresses(
        &env.client,
        "addr-ds",
        &[addr("192.0.2.21"), addr("2001:db8::21")],
    )
    .await;
    wait_annotation(&env, "addr-ds", &k("public-ip"), "192.0.2.21").await;

    let exp_v4 = Expected::host_gw("addr-v4")
        .v4("192.0.2.12", "10.244.1.0/24")
        .custom("keep-me");
    let exp_ds = Expected::host_gw("addr-ds")
        .v4("192.0.2.21", "10.244.2.0/24")
        .v6("2001:db8:ffff::7", "fd00:10:244:2::/64")
        .custom("keep-me-too");
    for exp in [&exp_v4, &exp_ds] {
        let node = get(&env, &exp.name).await;
        check_lease(&node, exp, PREFIX).unwrap_or_else(|e| panic!("{}: {e}", exp.name));
    }
    eprintln!("figures: address change → public-ip annotation in {follow:.2?}");
}

/// The ownership rule against the API alone (the tests with a real flanneld are in `beside_flanneld`):
/// lease keys written by another field manager (here the test's own client, as an agent) make netcm leave
/// the whole lease alone, whatever changes, until those keys are removed.
#[tokio::test]
async fn a_lease_another_writer_publishes_is_left_alone_until_its_keys_are_removed() {
    let env = TestEnv::new().await;
    let agent = r#"{"VNI":1,"VtepMAC":"12:c6:65:8e:3a:01"}"#;
    let agent_v6 = r#"{"VNI":1,"VtepMAC":"12:c6:65:8e:3a:02"}"#;
    let agents_lease = [
        ("kube-subnet-manager", "true"),
        ("backend-type", "vxlan"),
        ("backend-data", agent),
        ("backend-v6-data", agent_v6),
        ("public-ip", "192.0.2.39"),
        ("public-ipv6", "2001:db8::39"),
    ];
    let mut f = NodeFixture::named("vx-agent")
        .pod_cidrs(&["10.244.3.0/24", "fd00:10:244:3::/64"])
        .internal_ip("192.0.2.30")
        .internal_ip("2001:db8::30")
        .annotation(&k("custom"), "vx");
    for (key, v) in agents_lease {
        f = f.annotation(&k(key), v);
    }
    create_node(&env.client, &f).await;
    create_node(
        &env.client,
        &NodeFixture::named("vx-fresh")
            .pod_cidrs(&["10.244.4.0/24"])
            .internal_ip("192.0.2.31")
            .annotation(&k("custom"), "vx2"),
    )
    .await;
    let netcm = Netcm::start(
        "syncer-vxlan",
        &env.cp.kubeconfig,
        &[SYNCER, "--backend-type=vxlan"],
    );
    let id = leader_identity(&env, None).await;
    let mut exp = Expected::host_gw("vx-agent")
        .v4("192.0.2.39", "10.244.3.0/24")
        .v6("2001:db8::39", "fd00:10:244:3::/64")
        .custom("vx");
    exp.backend_type = "vxlan".into();
    exp.backend_data = agent.into();
    exp.backend_v6_data = agent_v6.into();

    // A Node without an agent gets netcm's vxlan lease, with no invented backend-data.
    wait_annotation(&env, "vx-fresh", &k("public-ip"), "192.0.2.31").await;
    let fresh = annotations(&get(&env, "vx-fresh").await);
    assert_eq!(
        fresh.get(&k("backend-type")).map(String::as_str),
        Some("vxlan")
    );
    assert_eq!(
        fresh.get(&k("kube-subnet-manager")).map(String::as_str),
        Some("true")
    );
    assert!(
        !fresh.contains_key(&k("backend-data")),
        "netcm must not invent vxlan backend data"
    );

    // The agent's Node is left alone although its public IPs differ from the InternalIPs; also when the
    // addresses move and the agent rewrites its data.
    let done = wait_idle(&netcm, 2.0).await;
    check_lease(&get(&env, "vx-agent").await, &exp, PREFIX)
        .expect("vx-agent keeps the lease its writer published");
    assert_eq!(metric(&netcm, AGENT_MANAGED).await, 1.0);
    set_addresses(
        &env.client,
        "vx-agent",
        &[
            ("InternalIP".into(), "192.0.2.32".into()),
            ("InternalIP".into(), "2001:db8::30".into()),
        ],
    )
    .await;
    let renewed = r#"{"VNI":1,"VtepMAC":"12:c6:65:8e:3a:03"}"#;
    annotate(&env, "vx-agent", &k("backend-data"), Some(renewed)).await;
    exp.backend_data = renewed.into();
    wait_idle(&netcm, done + 2.0).await;
    check_lease(&get(&env, "vx-agent").await, &exp, PREFIX)
        .expect("vx-agent keeps the lease its writer published");
    assert_eq!(
        node_patches_to(&env, &id, "vx-agent"),
        0,
        "netcm PATCHed a Node whose lease another writer publishes"
    );

    // The agent's lease keys removed (as `kubectl annotate node vx-agent <key>-` does): netcm's again.
    let removal: serde_json::Map<String, serde_json::Value> = agents_lease
        .iter()
        .map(|(key, _)| (k(key), serde_json::Value::Null))
        .collect();
    let api: Api<Node> = Api::all(env.client.clone());
    let patch = serde_json::json!({ "metadata": { "annotations": removal } });
    api.patch("vx-agent", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("remove the agent's lease keys");
    wait_annotation(&env, "vx-agent", &k("public-ip"), "192.0.2.32").await;
    wait_annotation(&env, "vx-agent", &k("public-ipv6"), "2001:db8::30").await;
    let ann = annotations(&get(&env, "vx-agent").await);
    assert_eq!(
        ann.get(&k("backend-type")).map(String::as_str),
        Some("vxlan")
    );
    assert!(!ann.contains_key(&k("backend-data")));
    assert_eq!(ann.get(&k("custom")).map(String::as_str), Some("vx"));
    wait_idle(&netcm, 0.0).await;
    assert_eq!(metric(&netcm, AGENT_MANAGED).await, 0.0);
    assert_eq!(
        annotations(&get(&env, "vx-fresh").await)
            .get(&k("custom"))
            .map(String::as_str),
        Some("vx2")
    );
}

#[tokio::test]
async fn a_node_without_pod_cidr_or_address_gets_nothing_until_it_changes_and_nothing_spins() {
    let env = TestEnv::new().await;
    let custom = |f: NodeFixture| f.annotation(&k("custom"), "waiting");
    create_node(
        &env.client,
        &custom(NodeFixture::named("bare").internal_ip("192.0.2.40")),
    )
    .await;
    create_node(
        &env.client,
        &custom(NodeFixture::named("noaddr").pod_cidrs(&["10.244.5.0/24"])),
    )
    .await;
    create_node(
        &env.client,
        &custom(
            NodeFixture::named("halfaddr")
                .pod_cidrs(&["10.244.6.0/24", "fd00:10:244:6::/64"])
                .internal_ip("192.0.2.42"),
        ),
    )
    .await;
    create_node(
        &env.client,
        &NodeFixture::named("ref")
            .pod_cidrs(&["10.244.7.0/24"])
            .internal_ip("192.0.2.43"),
    )
    .await;
    let netcm = Netcm::start("syncer-waiting", &env.cp.kubeconfig, &[SYNCER]);
    wait_lease(
        &env,
        &Expected::host_gw("ref").v4("192.0.2.43", "10.244.7.0/24"),
        PREFIX,
    )
    .await;
    // Four Nodes listed, plus the update netcm's own write of ref's lease comes back as: waiting for
    // only four raced that update, which then looked like a re-queue.
    wait_idle(&netcm, 5.0).await;
    for name in ["bare", "noaddr", "halfaddr"] {
        let ann = annotations(&get(&env, name).await);
        let ours: Vec<&String> = ann
            .keys()
            .filter(|k| k.starts_with(PREFIX) && !k.ends_with("/custom"))
            .collect();
        assert!(ours.is_empty(), "{name} must get nothing yet, got {ours:?}");
    }
    let waiting = |r: &str| format!(r#"netcm_annotation_nodes_waiting{{reason="{r}"}}"#);
    assert_eq!(metric(&netcm, &waiting("no_pod_cidr")).await, 1.0);
    assert_eq!(metric(&netcm, &waiting("no_address")).await, 2.0);

    // Level-triggered, no busy loop: nothing is re-queued while nothing changes.
    let adds = metric(&netcm, ADDS).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        metric(&netcm, ADDS).await,
        adds,
        "waiting nodes must not be re-queued"
    );
    assert_eq!(metric(&netcm, RETRIES).await, 0.0);

    // Each gets its lease as soon as the missing piece arrives.
    let api: Api<Node> = Api::all(env.client.clone());
    let spec = serde_json::json!({ "spec": { "podCIDR": "10.244.4.0/24", "podCIDRs": ["10.244.4.0/24"] } });
    api.patch("bare", &PatchParams::default(), &Patch::Merge(&spec))
        .await
        .expect("set bare's pod CIDR");
    let ip = |a: &str| ("InternalIP".to_string(), a.to_string());
    set_addresses(&env.client, "noaddr", &[ip("192.0.2.41")]).await;
    set_addresses(
        &env.client,
        "halfaddr",
        &[ip("192.0.2.42"), ip("2001:db8::42")],
    )
    .await;
    for exp in [
        Expected::host_gw("bare").v4("192.0.2.40", "10.244.4.0/24"),
        Expected::host_gw("noaddr").v4("192.0.2.41", "10.244.5.0/24"),
        Expected::host_gw("halfaddr")
            .v4("192.0.2.42", "10.244.6.0/24")
            .v6("2001:db8::42", "fd00:10:244:6::/64"),
    ] {
        let exp = exp.custom("waiting");
        wait_lease(&env, &exp, PREFIX).await;
    }
    wait_idle(&netcm, 0.0).await;
    assert_eq!(metric(&netcm, &waiting("no_pod_cidr")).await, 0.0);
    assert_eq!(metric(&netcm, &waiting("no_address")).await, 0.0);
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

#[tokio::test]
async fn a_custom_prefix_publishes_under_it_and_leaves_other_prefixes_alone() {
    let env = TestEnv::new().await;
    let ours = "netcm.example.com/lease";
    let old = [
        (k("public-ip"), "192.0.2.1"),
        (k("kube-subnet-manager"), "true"),
    ];
    let mut f = NodeFixture::named("pfx")
        .pod_cidrs(&["10.244.8.0/24"])
        .internal_ip("192.0.2.50")
        .annotation(
            "netcm.example.com/lease-public-ip-overwrite",
            "203.0.113.50",
        )
        .annotation("netcm.example.com/lease-custom", "mine");
    for (key, v) in &old {
        f = f.annotation(key, v);
    }
    create_node(&env.client, &f).await;
    let _netcm = Netcm::start(
        "syncer-prefix",
        &env.cp.kubeconfig,
        &[SYNCER, &format!("--annotation-prefix={ours}")],
    );
    let exp = Expected::host_gw("pfx")
        .v4("203.0.113.50", "10.244.8.0/24")
        .custom("mine");
    let node = wait_lease(&env, &exp, ours).await;
    let ann = annotations(&node);
    for (key, v) in &old {
        assert_eq!(
            ann.get(key).map(String::as_str),
            Some(*v),
            "{key} under another prefix was touched"
        );
    }
}

#[tokio::test]
async fn annotation_prefix_and_its_deprecated_alias_with_different_values_exit_2() {
    let env = TestEnv::new().await;
    let mut n = Netcm::start(
        "prefix-conflict",
        &env.cp.kubeconfig,
        &[
            SYNCER,
            "--annotation-prefix=example.com",
            "--route-lease-annotation-prefix=example.org",
        ],
    );
    let status = n.wait_exit(Duration::from_secs(30)).await;
    assert_eq!(status.code(), Some(2), "{}", n.logs());
}

#[tokio::test]
async fn bad_syncer_flags_exit_2_naming_the_flag_before_touching_the_api() {
    let env = TestEnv::new().await;
    for (arg, needle) in [
        (
            "--annotation-prefix=a.example.com/x/y",
            "--annotation-prefix",
        ),
        ("--annotation-prefix=Example.com", "fqdn/[0-9a-z-_]*"),
        (
            "--public-ip-address-types=InternalIP,InternalDNS",
            "--public-ip-address-types: InternalDNS",
        ),
        ("--public-ip-address-types=Hostname", "not an IP address"),
        ("--backend-type=Host GW", "--backend-type"),
    ] {
        let mut n = Netcm::start("bad-flags", &env.cp.kubeconfig, &[SYNCER, arg]);
        let status = n.wait_exit(Duration::from_secs(30)).await;
        assert_eq!(status.code(), Some(2), "{arg}: {}", n.logs());
        assert!(
            n.logs().contains(needle),
            "{arg}: expected {needle:?} in {}",
            n.logs()
        );
    }
}
