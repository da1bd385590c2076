//! Who owns a Node's lease, against the API alone: keys another field manager wrote make netcm leave the
//! whole lease to that writer until they are removed (`beside_flanneld.rs` has the real agents).

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use netcm_e2e::nodes::{create_node, set_addresses, NodeFixture};
use netcm_e2e::{wait_for, Netcm, TestEnv};

use super::support::*;

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
    // One change at a time: two updates of one Node queued together are one sync (the queue dedups).
    let done = wait_idle(&netcm, done + 1.0).await;
    let renewed = r#"{"VNI":1,"VtepMAC":"12:c6:65:8e:3a:03"}"#;
    annotate(&env, "vx-agent", &k("backend-data"), Some(renewed)).await;
    exp.backend_data = renewed.into();
    wait_idle(&netcm, done + 1.0).await;
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

/// Who owns a lease comes from the informer's cache, so the syncer reads no Node: 10 Nodes get netcm's
/// lease in one PATCH each, 10 whose lease keys a flanneld wrote (through the status subresource, as
/// flanneld does) with other values are left alone — and the audit log shows not one GET of a Node by
/// netcm, while it does show the test's own GETs (so the policy records them and the count can fail).
#[tokio::test]
async fn the_syncer_reads_no_node_and_still_leaves_an_agents_lease_alone() {
    let env = TestEnv::new().await;
    let api: Api<Node> = Api::all(env.client.clone());
    let fixtures: Vec<NodeFixture> = (0..20)
        .map(|i| {
            NodeFixture::named(format!("no-read-{i:02}"))
                .pod_cidrs(&[&format!("10.244.{}.0/24", 100 + i)])
                .internal_ip(&format!("192.0.2.{}", 100 + i))
                .annotation(&k("custom"), "kept")
        })
        .collect();
    netcm_e2e::nodes::create_nodes(&env.client, fixtures, 8).await;
    let agents: Vec<String> = (10..20).map(|i| format!("no-read-{i:02}")).collect();
    for (i, name) in agents.iter().enumerate() {
        let lease = serde_json::json!({ "metadata": { "annotations": {
            k("kube-subnet-manager"): "true",
            k("backend-type"): "host-gw",
            k("backend-data"): "null",
            k("public-ip"): format!("198.51.100.{}", i + 1),
        } } });
        let flanneld = PatchParams {
            field_manager: Some("flanneld".into()),
            ..Default::default()
        };
        api.patch_status(name, &flanneld, &Patch::Merge(&lease))
            .await
            .unwrap_or_else(|e| panic!("flanneld's lease on {name}: {e}"));
    }

    let netcm = Netcm::start("syncer-no-read", &env.cp.kubeconfig, &[SYNCER]);
    let id = leader_identity(&env, None).await;
    for i in 0..10 {
        let exp = Expected::host_gw(&format!("no-read-{i:02}"))
            .v4(
                &format!("192.0.2.{}", 100 + i),
                &format!("10.244.{}.0/24", 100 + i),
            )
            .custom("kept");
        wait_lease(&env, &exp, PREFIX).await;
    }
    wait_idle(&netcm, 20.0).await;
    assert_eq!(metric(&netcm, AGENT_MANAGED).await, 10.0);
    assert_eq!(
        metric(&netcm, WRITES).await,
        10.0,
        "one PATCH per netcm lease"
    );
    for (i, name) in agents.iter().enumerate() {
        let ann = annotations(&get(&env, name).await);
        assert_eq!(
            ann.get(&k("public-ip")),
            Some(&format!("198.51.100.{}", i + 1)),
            "{name}: flanneld's public IP stays"
        );
        assert_eq!(node_patches_to(&env, &id, name), 0, "{name} was PATCHed");
    }
    let own_gets = wait_for("the test's own GETs in the audit log", TIMEOUT, || async {
        let n = node_reads(&env, |e| !e.user_agent.contains(&id));
        (n > 0).then_some(n)
    })
    .await;
    assert_eq!(
        node_reads(&env, |e| e.user_agent.contains(&id)),
        0,
        "GETs of a Node by netcm (the test's own: {own_gets})"
    );
}

/// GETs of this test's Nodes in the audit log by the requests `by` selects.
fn node_reads(env: &TestEnv, by: impl Fn(&netcm_e2e::audit::AuditEvent) -> bool) -> usize {
    netcm_e2e::audit::read(&env.cp.audit_log)
        .iter()
        .filter(|e| e.verb == "get" && e.resource() == "nodes")
        .filter(|e| {
            e.object_ref
                .as_ref()
                .is_some_and(|o| o.name.starts_with("no-read-"))
        })
        .filter(|e| by(e))
        .count()
}
