//! Which address becomes a Node's public IP and how it follows changes: InternalIP, the overwrite
//! annotations (a garbage one keeps the last good value), and Nodes that still lack a pod CIDR or an
//! address (nothing written, nothing spinning, published as soon as the piece arrives).

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use netcm_e2e::nodes::{create_node, set_addresses, NodeFixture};
use netcm_e2e::{wait_for, Netcm, TestEnv};

use super::support::*;

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
