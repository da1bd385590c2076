//! subnet-allocator against an adversary, on the real control plane: Nodes re-created under their names,
//! blocks an earlier leader claimed (PodCIDRClaims), and address updates racing the allocator's own write.
//! What the allocator makes of answers alone — writes and touches refused for good, claims found taken,
//! the quarantine's ranges — is tested in-process (controllers/subnet-allocator/src/tests/).

use std::collections::HashMap;
use std::time::Duration;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use netcm_e2e::nodes::{
    all_nodes, assert_no_overlaps, create_node, create_nodes, pod_cidrs, set_addresses,
    wait_all_allocated, NodeFixture,
};
use netcm_e2e::{
    audit, claimed_cidrs, pod_cidr_claims, restart_apiserver, wait_for, Netcm, TestEnv,
};
use netcm_subnet_allocator::pod_cidr_patch::{fence_touch, pod_cidr_patch, FencePrecondition};

mod idle_claims;
mod late_write;

const TIMEOUT: Duration = Duration::from_secs(60);

fn cidrs_of(nodes: &[Node]) -> HashMap<String, Vec<IpNet>> {
    nodes
        .iter()
        .map(|n| {
            let cidrs = pod_cidrs(n)
                .iter()
                .map(|c| c.parse().expect("valid CIDR"))
                .collect();
            (n.metadata.name.clone().unwrap_or_default(), cidrs)
        })
        .collect()
}

/// Creates Nodes `<prefix>1` … `<prefix>n` with nothing set.
async fn create_plain_nodes(client: &kube::Client, prefix: &str, n: usize) {
    let fixtures = (1..=n)
        .map(|i| NodeFixture::named(format!("{prefix}{i}")))
        .collect();
    create_nodes(client, fixtures, n).await;
}

/// netcm with only the subnet-allocator, plus `args`.
fn start_allocator(env: &TestEnv, label: &str, args: &[&str]) -> Netcm {
    let mut all = vec!["--controllers=subnet-allocator"];
    all.extend_from_slice(args);
    Netcm::start(label, &env.cp.kubeconfig, &all)
}

/// Creates a block's PodCIDRClaim as another allocator (an earlier leader) would have.
async fn claim_block(client: &kube::Client, cidr: &str) {
    let net: IpNet = cidr.parse().expect("cidr");
    let name = format!(
        "{}-{}",
        net.network().to_string().replace('.', "-"),
        net.prefix_len()
    );
    let obj: DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "ipam.netcm.io/v1alpha1",
        "kind": "PodCIDRClaim",
        "metadata": { "name": name },
        "spec": { "cidr": cidr }
    }))
    .expect("claim object");
    pod_cidr_claims(client)
        .create(&PostParams::default(), &obj)
        .await
        .unwrap_or_else(|e| panic!("create claim {cidr}: {e}"));
}

/// The allocator (/28s of `cluster_cidr`, plus `args`), started after an earlier leader claimed `block`.
async fn start_after_an_earlier_leaders_block(
    env: &TestEnv,
    label: &str,
    block: &str,
    cluster_cidr: &str,
    args: &[&str],
) -> Netcm {
    claim_block(&env.client, block).await;
    let cluster = format!("--cluster-cidr={cluster_cidr}");
    let mut all = vec![cluster.as_str(), "--node-cidr-mask-size=28"];
    all.extend_from_slice(args);
    start_allocator(env, label, &all)
}

/// "settled" holds the first /28 of `block`, which an earlier leader claimed; "inflight" has no CIDRs yet,
/// so that leader's PATCH for it — with any free CIDR of the block — may still land. Starts netcm on
/// `cluster_cidr`, waits until both Nodes have CIDRs and checks that "inflight" got one outside `block`;
/// returns netcm and that CIDR.
async fn serve_a_node_an_earlier_leader_may_be_writing_to(
    env: &TestEnv,
    label: &str,
    block: &str,
    cluster_cidr: &str,
) -> (Netcm, IpNet) {
    let earlier_block: IpNet = block.parse().expect("cidr");
    let settled = format!("{}/28", earlier_block.network());
    create_node(
        &env.client,
        &NodeFixture::named("settled").pod_cidrs(&[&settled]),
    )
    .await;
    create_node(&env.client, &NodeFixture::named("inflight")).await;
    let netcm = start_after_an_earlier_leaders_block(env, label, block, cluster_cidr, &[]).await;
    let nodes = wait_all_allocated(&env.client, 2, TIMEOUT).await;
    let inflight = cidrs_of(&nodes)["inflight"][0];
    assert!(
        !earlier_block.contains(&inflight),
        "inflight got {inflight}, a free CIDR of the block an earlier leader may be writing from"
    );
    (netcm, inflight)
}

/// Waits until netcm's quarantine of earlier leaders' blocks waits for no Node.
async fn wait_quarantine_ended(netcm: &Netcm) {
    netcm
        .wait_metric(
            "netcm_pod_cidr_quarantine_nodes",
            "0",
            |v| v == 0.0,
            TIMEOUT,
        )
        .await;
}

#[tokio::test]
async fn nodes_recreated_under_their_names_while_netcm_is_frozen_get_fresh_cidrs_never_the_old_nodes(
) {
    let env = TestEnv::new().await;
    // The old Nodes hold CIDRs someone else wrote, outside today's cluster CIDR: recorded, never valid.
    let old: Vec<NodeFixture> = (0..40)
        .map(|i| {
            NodeFixture::named(format!("reborn-{i:02}")).pod_cidrs(&[&format!("10.99.{i}.0/24")])
        })
        .collect();
    create_nodes(&env.client, old, 8).await;
    // One worker, so the re-created Nodes' events are all in the cache before their keys are synced. A
    // lease that outlasts the freeze (an API server restart, 80 writes): this test is about what netcm
    // finds when it wakes, not about losing its lease, which a slow restart would make it do.
    let netcm = Netcm::start(
        "reborn",
        &env.cp.kubeconfig,
        &[
            "--controllers=subnet-allocator",
            "--cluster-cidr=10.200.0.0/16",
            "--concurrent-node-cidr-syncs=1",
            "--leader-elect-lease-duration=120s",
            "--leader-elect-renew-deadline=90s",
        ],
    );
    wait_for(
        "netcm to record the 40 out-of-range CIDRs",
        TIMEOUT,
        || async { (netcm.metric("netcm_node_cidr_conflicts").await == Some(40.0)).then_some(()) },
    )
    .await;
    // Frozen, netcm has its watch broken by the API server's restart before the deletes happen, so it
    // never sees them: it relists and finds every name again, now with another UID (kubelet
    // re-registering during an outage).
    netcm.signal("STOP");
    restart_apiserver();
    let api: Api<Node> = Api::all(env.client.clone());
    let dp = DeleteParams {
        grace_period_seconds: Some(0),
        ..Default::default()
    };
    for i in 0..40 {
        api.delete(&format!("reborn-{i:02}"), &dp)
            .await
            .expect("delete");
    }
    wait_for("the old nodes to be gone", TIMEOUT, || async {
        all_nodes(&env.client).await.is_empty().then_some(())
    })
    .await;
    let new: Vec<NodeFixture> = (0..40)
        .map(|i| NodeFixture::named(format!("reborn-{i:02}")))
        .collect();
    create_nodes(&env.client, new, 8).await;
    netcm.signal("CONT");
    let nodes = wait_all_allocated(&env.client, 40, TIMEOUT).await;
    let cluster: IpNet = "10.200.0.0/16".parse().expect("cidr");
    let inherited: Vec<String> = cidrs_of(&nodes)
        .into_iter()
        .filter(|(_, c)| {
            !c.iter()
                .all(|c| cluster.contains(c) && c.prefix_len() == 24)
        })
        .map(|(n, c)| format!("{n}: {c:?}"))
        .collect();
    assert!(
        inherited.is_empty(),
        "{} re-created nodes inherited the old nodes' CIDRs: {inherited:?}",
        inherited.len()
    );
    assert_no_overlaps(&nodes);
    netcm.assert_running();
}

#[tokio::test]
async fn an_earlier_leaders_block_keeps_its_free_cidrs_until_every_node_it_may_be_writing_to_is_settled(
) {
    let env = TestEnv::new().await;
    // An earlier leader claimed the block 10.201.0.0/22 (64 /28s).
    let (netcm, inflight) = serve_a_node_an_earlier_leader_may_be_writing_to(
        &env,
        "blocks",
        "10.201.0.0/22",
        "10.201.0.0/20",
    )
    .await;
    // The earlier leader's late PATCH now fails: pod CIDRs never change once set.
    let api: Api<Node> = Api::all(env.client.clone());
    let late =
        serde_json::json!({"spec": {"podCIDR": "10.201.0.16/28", "podCIDRs": ["10.201.0.16/28"]}});
    assert!(
        api.patch(
            "inflight",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Strategic(&late)
        )
        .await
        .is_err(),
        "a late PATCH with other CIDRs must be refused once the node has its own"
    );
    // Every node it may have been writing to is settled: the quarantine ends.
    wait_quarantine_ended(&netcm).await;

    // Five more Nodes: one claim per block, not per CIDR.
    create_plain_nodes(&env.client, "n", 5).await;
    let nodes = wait_all_allocated(&env.client, 7, TIMEOUT).await;
    assert_no_overlaps(&nodes);
    let inflight_block = format!(
        "{}",
        IpNet::new(inflight.network(), 22).expect("block").trunc()
    );
    assert_eq!(
        claimed_cidrs(&env.client).await,
        vec!["10.201.0.0/22".to_string(), inflight_block],
        "the earlier leader's block and the one netcm claimed, and no more"
    );
    netcm.assert_running();
}

#[tokio::test]
async fn a_late_pod_cidr_patch_of_an_earlier_leader_is_refused_once_a_new_leader_touched_the_node()
{
    let env = TestEnv::new().await;
    create_node(&env.client, &NodeFixture::named("annotated")).await;
    let api: Api<Node> = Api::all(env.client.clone());
    let node = api.get("annotated").await.expect("node");
    let uid = node.metadata.uid.clone().expect("uid");
    let had_annotations = node
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| !a.is_empty());
    // netcm's own PATCH, as the earlier leader built it from a cache that saw the fence annotation
    // unset, and netcm's own touch, as a new leader sends it before serving from that leader's blocks:
    // a change to either shape is tested here against the real API server's JSON Patch.
    let late: json_patch::Patch = serde_json::from_value(pod_cidr_patch(
        &uid,
        FencePrecondition {
            has_annotations: had_annotations,
            fenced_at: None,
        },
        &["10.204.0.0/24".to_string()],
    ))
    .expect("patch");
    let touch = fence_touch(&uid, "2026-11-23T00:00:00Z");
    api.patch(
        "annotated",
        &PatchParams::default(),
        &Patch::Strategic(&touch),
    )
    .await
    .expect("touch");
    let refused = api
        .patch(
            "annotated",
            &PatchParams::default(),
            &Patch::Json::<()>(late),
        )
        .await;
    assert!(
        matches!(&refused, Err(kube::Error::Api(s)) if s.code == 422),
        "the late PATCH must be refused with 422, got {refused:?}"
    );
    let now = api.get("annotated").await.expect("node");
    assert!(
        pod_cidrs(&now).is_empty(),
        "no CIDR landed: {:?}",
        pod_cidrs(&now)
    );
}

#[tokio::test]
async fn a_node_whose_addresses_change_before_the_cache_shows_its_cidr_is_written_exactly_once() {
    let env = TestEnv::new().await;
    let netcm = Netcm::start(
        "one-write",
        &env.cp.kubeconfig,
        &[
            "--controllers=subnet-allocator",
            "--cluster-cidr=10.203.0.0/16",
        ],
    );
    netcm.wait_http(TIMEOUT).await;
    let since = jiff::Timestamp::now();
    // Kubelet-like churn: each Node's addresses change several times right after it registers.
    futures::future::join_all((0..150).map(|i| {
        let client = env.client.clone();
        async move {
            let name = format!("churn-{i:03}");
            create_node(&client, &NodeFixture::named(&name)).await;
            for j in 0..4 {
                let addr = vec![("InternalIP".to_string(), format!("192.0.2.{}", j + 1))];
                set_addresses(&client, &name, &addr).await;
            }
        }
    }))
    .await;
    let nodes = wait_all_allocated(&env.client, 150, TIMEOUT).await;
    assert_no_overlaps(&nodes);
    // The audit log is written when a request completes: give the last ones a moment.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut writes: HashMap<String, usize> = HashMap::new();
    for ev in audit::read(&env.cp.audit_log) {
        let recent = ev.received().is_some_and(|t| t >= since);
        if recent
            && ev.verb == "patch"
            && ev.resource() == "nodes"
            && ev.user_agent.starts_with("netcm")
            // A new leader's proof that its warm cache is fresh writes one Node twice; not the allocator.
            && !ev.is_catch_up()
        {
            let node = ev.object_ref.map(|o| o.name).unwrap_or_default();
            *writes.entry(node).or_default() += 1;
        }
    }
    let repeated: Vec<_> = writes.iter().filter(|(_, n)| **n != 1).collect();
    eprintln!(
        "netcm PATCHed {} nodes; {} of them more than once",
        writes.len(),
        repeated.len()
    );
    assert_eq!(writes.len(), 150, "every node was written");
    assert!(
        repeated.is_empty(),
        "nodes written more than once: {repeated:?}"
    );
    netcm.assert_running();
}
