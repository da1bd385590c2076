//! What a pool's status says and keeps saying: across a leader change while it drains, and as the
//! KEP-1623 conditions `kubectl wait` and GitOps tools read.

use super::*;

#[tokio::test]
async fn a_new_leader_keeps_a_deleted_pool_whose_nodes_still_hold_its_cidrs() {
    let env = TestEnv::new().await;
    create_pool(
        &env.client,
        "handover",
        json!({
            "perNodeHostBits": 8,
            "ipv4": "10.71.0.0/16",
            "nodeSelector": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "pool", "operator": "In", "values": ["handover"]}]}]}
        }),
    )
    .await;
    let mut first = netcm(&env, "pools-handover-a", &["--cluster-cidr=10.244.0.0/16"]);
    let held = names("held", 2);
    for n in &held {
        create_node(
            &env.client,
            &NodeFixture::named(n).label("pool", "handover"),
        )
        .await;
    }
    wait_allocated(&env.client, &held, TIMEOUT).await;
    wait_for("the finalizer", TIMEOUT, || async {
        let obj = cluster_cidrs(&env.client)
            .get_opt("handover")
            .await
            .ok()??;
        (!obj.metadata.finalizers.unwrap_or_default().is_empty()).then_some(())
    })
    .await;
    first.signal("TERM");
    first.wait_exit(TIMEOUT).await;
    kubectl(&env, &["delete", "clustercidr", "handover", "--wait=false"]);

    // The next leader loads the pools before it records the Nodes' CIDRs; the deleted pool must not look
    // empty to it in between.
    let second = netcm(&env, "pools-handover-b", &["--cluster-cidr=10.244.0.0/16"]);
    second.wait_leading(TIMEOUT).await;
    create_node(&env.client, &NodeFixture::named("after-0")).await;
    wait_allocated(&env.client, &["after-0".to_string()], TIMEOUT).await;
    let status = wait_for(
        "the pool to report its Nodes as draining",
        TIMEOUT,
        || async {
            pool_status(&env.client, "handover")
                .await
                .filter(|s| s["phase"] == "Draining" && s["allocated"] == 2)
        },
    )
    .await;
    assert_eq!(status["allocated"], 2, "{status}");
    let api: Api<Node> = Api::all(env.client.clone());
    for n in &held {
        api.delete(n, &DeleteParams::default())
            .await
            .expect("delete node");
    }
    wait_for("the drained pool to disappear", TIMEOUT, || async {
        matches!(
            cluster_cidrs(&env.client).get_opt("handover").await,
            Ok(None)
        )
        .then_some(())
    })
    .await;
    second.assert_running();
}

/// The condition `type_` of a ClusterCIDR's status.
fn condition<'a>(status: &'a Value, type_: &str) -> Option<&'a Value> {
    status["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}

#[tokio::test]
async fn kubectl_wait_reads_the_ready_condition_and_a_refused_pool_is_not_ready_with_its_reason() {
    let env = TestEnv::new().await;
    let _n = netcm(&env, "pools-conditions", &["--cluster-cidr=10.244.0.0/16"]);
    let sel = |v: &str| {
        json!({"nodeSelectorTerms": [{"matchExpressions": [
            {"key": "group", "operator": "In", "values": [v]}]}]})
    };
    create_pool(
        &env.client,
        "ok",
        json!({"perNodeHostBits": 8, "ipv4": "10.62.0.0/16", "nodeSelector": sel("ok")}),
    )
    .await;
    let wait = |target: &str, condition: &str| {
        let out = kubectl(
            &env,
            &[
                "wait",
                &format!("--for=condition={condition}"),
                target,
                "--timeout=60s",
            ],
        );
        eprintln!("{}", out.trim());
    };
    wait("clustercidr/ok", "Ready");
    let ok = pool_status(&env.client, "ok").await.expect("ok's status");
    let ready = condition(&ok, "Ready").expect("Ready");
    assert_eq!(
        (&ready["status"], &ready["reason"]),
        (&json!("True"), &json!("Allocating")),
        "{ok}"
    );
    assert_eq!(ok["phase"], "Active", "{ok}");

    // Half of ok's range: refused, and kstatus reads it as failed (Stalled), not as still progressing.
    create_pool(
        &env.client,
        "half",
        json!({"perNodeHostBits": 8, "ipv4": "10.62.128.0/17", "nodeSelector": sel("half")}),
    )
    .await;
    wait("clustercidr/half", "Ready=false");
    let half = pool_status(&env.client, "half")
        .await
        .expect("half's status");
    eprintln!("half: {half}");
    for type_ in ["Ready", "Refused", "Stalled"] {
        let c = condition(&half, type_).unwrap_or_else(|| panic!("{type_}: {half}"));
        let want = if type_ == "Ready" { "False" } else { "True" };
        assert_eq!(c["status"], want, "{type_}: {half}");
        assert_eq!(c["reason"], "ClusterCIDROverlap", "{type_}: {half}");
        assert!(
            c["message"]
                .as_str()
                .is_some_and(|m| m.contains("overlaps 10.62.0.0/16 of pool ok")),
            "{type_}: {half}"
        );
    }
    assert_eq!(half["phase"], "Refused", "{half}");
    let obj = cluster_cidrs(&env.client).get("half").await.expect("half");
    assert_eq!(
        condition(&half, "Ready").expect("Ready")["observedGeneration"],
        json!(obj.metadata.generation),
        "{half}"
    );

    // Nothing changes, so nothing is written: the transition times do not flap.
    let versions = || async {
        let mut out = Vec::new();
        for name in ["ok", "half"] {
            let obj = cluster_cidrs(&env.client).get(name).await.expect("get");
            out.push(obj.metadata.resource_version);
        }
        out
    };
    let before = versions().await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(
        versions().await,
        before,
        "a status was written with nothing changed"
    );

    let table = kubectl(&env, &["get", "clustercidrs"]);
    eprintln!("{table}");
    let row = |name: &str| {
        table
            .lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .unwrap_or_else(|| panic!("no row {name}: {table}"))
    };
    assert!(
        table.lines().next().is_some_and(|h| h.contains("READY")),
        "{table}"
    );
    assert!(
        row("ok").contains(&"True") && row("half").contains(&"False"),
        "{table}"
    );
    let wide = kubectl(&env, &["get", "clustercidrs", "-o", "wide"]);
    eprintln!("{wide}");
    assert!(
        wide.contains("ClusterCIDROverlap") && wide.contains("Allocating"),
        "{wide}"
    );

    // Without ok, half overlaps nothing: it becomes Ready, and Stalled goes.
    kubectl(&env, &["delete", "clustercidr", "ok", "--wait=false"]);
    wait("clustercidr/half", "Ready");
    let half = pool_status(&env.client, "half")
        .await
        .expect("half's status");
    assert!(condition(&half, "Stalled").is_none(), "{half}");
    assert_eq!(
        condition(&half, "Refused").expect("Refused")["status"],
        "False",
        "{half}"
    );
}
