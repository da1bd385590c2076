//! An earlier leader's write that lands while netcm touches the Nodes of its quarantine: the CIDR it wrote
//! must be netcm's record of that Node before the quarantine's ranges are handed out. (A Node whose touch
//! the API refuses is the allocator's logic alone, tested in-process.)

use std::collections::BTreeSet;
use std::time::Duration;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams, Patch, PatchParams};
use netcm_e2e::nodes::{all_nodes, create_nodes, pod_cidrs, NodeFixture};
use netcm_e2e::webhook::{SlowWebhook, SLOW_WRITES_LABEL};
use netcm_e2e::{wait_for, TestEnv};
use netcm_subnet_allocator::pod_cidr_patch::{pod_cidr_patch, FencePrecondition};

use super::{start_after_an_earlier_leaders_block, wait_quarantine_ended, TIMEOUT};

/// The cluster CIDR: four /28s, one block, which an earlier leader claimed.
const CLUSTER: &str = "10.206.0.0/26";
/// The one CIDR of the cluster no Node holds at the takeover: the earlier leader's write carries it.
const LAST_FREE: &str = "10.206.0.48/28";
/// The Node the earlier leader's write is for.
const TARGET: &str = "late-target";
/// Nodes waiting for CIDRs besides it; their touches are held by the webhook, so the touch pass lasts.
const WAITING: usize = 10;
/// How long the webhook holds each touch, the target's too: netcm touches up to 32 Nodes at once, so an
/// unheld touch of the target would nearly always land before the earlier leader's write could.
const HOLD: Duration = Duration::from_millis(300);
/// The earlier leader's field manager: the webhook lets its write through at once.
const EARLIER_LEADER: &str = "earlier-leader";
const ROUNDS: usize = 6;

/// An earlier leader's allocation PATCH of `cidr` for the Node `name`, exactly as netcm builds it from a
/// cache that saw the Node annotated but never touched: its uid and an unset fence annotation are tested.
async fn earlier_leaders_write(
    api: &Api<Node>,
    name: &str,
    uid: &str,
    cidr: &str,
) -> Result<Node, kube::Error> {
    // netcm's own builder, so a change to the PATCH's shape is what this test tries against the server.
    let patch: json_patch::Patch = serde_json::from_value(pod_cidr_patch(
        uid,
        FencePrecondition {
            has_annotations: true,
            fenced_at: None,
        },
        &[cidr.to_string()],
    ))
    .expect("patch");
    let as_earlier_leader = PatchParams {
        field_manager: Some(EARLIER_LEADER.into()),
        ..Default::default()
    };
    api.patch(name, &as_earlier_leader, &Patch::Json::<()>(patch))
        .await
}

/// Nodes `held-0` … `held-2` holding the first three /28s of the /26 `cluster`: one /28 is left free.
fn three_held(cluster: &str) -> impl Iterator<Item = NodeFixture> {
    let cluster: IpNet = cluster.parse().expect("cidr");
    cluster
        .subnets(28)
        .expect("/28s of the cluster CIDR")
        .take(3)
        .enumerate()
        .map(|(i, net)| NodeFixture::named(format!("held-{i}")).pod_cidrs(&[&net.to_string()]))
}

/// The UID of Node `name`.
async fn uid_of(api: &Api<Node>, name: &str) -> String {
    api.get(name)
        .await
        .unwrap_or_else(|e| panic!("get node {name}: {e}"))
        .metadata
        .uid
        .unwrap_or_else(|| panic!("node {name} has no uid"))
}

/// The Nodes holding exactly `cidr`.
fn holders(nodes: &[Node], cidr: &str) -> Vec<String> {
    let cidr: IpNet = cidr.parse().expect("cidr");
    nodes
        .iter()
        .filter(|n| {
            pod_cidrs(n)
                .iter()
                .any(|c| c.parse::<IpNet>().is_ok_and(|c| c == cidr))
        })
        .map(|n| n.metadata.name.clone().unwrap_or_default())
        .collect()
}

/// Nodes netcm has told (a `CIDRNotAvailable` Warning) that no CIDR is free.
async fn told_none_is_free(client: &kube::Client) -> BTreeSet<String> {
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    events
        .list(&ListParams::default())
        .await
        .expect("list events")
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("CIDRNotAvailable"))
        .filter_map(|e| e.regarding.and_then(|r| r.name))
        .collect()
}

/// Waits until the touches' webhook holds UPDATEs: a dry-run PATCH of a waiting Node reaches it.
async fn wait_webhook_active(env: &TestEnv, webhook: &SlowWebhook) {
    let api: Api<Node> = Api::all(env.client.clone());
    let dry_run = PatchParams {
        dry_run: true,
        ..Default::default()
    };
    let probe = serde_json::json!({"metadata": {"annotations": {"netcm-e2e/probe": "1"}}});
    wait_for("the slow webhook to hold node updates", TIMEOUT, || async {
        let _ = api
            .patch("waiting-01", &dry_run, &Patch::Merge(&probe))
            .await;
        (!webhook.seen().is_empty()).then_some(())
    })
    .await;
}

/// What one round saw.
struct Round {
    /// The earlier leader's write landed (before netcm touched its Node).
    landed: bool,
    /// Every Node holding `LAST_FREE` at the end.
    holders: Vec<String>,
}

/// One takeover: three Nodes hold three of the four CIDRs, `TARGET` and `WAITING` more wait; netcm starts
/// after the earlier leader claimed the whole cluster CIDR, finds no free CIDR outside that block and
/// touches every waiting Node. The earlier leader's write for `TARGET` lands while the touches are on
/// their way. Ends when the last free CIDR is held and every other waiting Node has been told none is free.
async fn takeover_with_a_write_landing_during_the_touches(env: &TestEnv, round: usize) -> Round {
    env.clean().await;
    let held = three_held(CLUSTER);
    let target = NodeFixture::named(TARGET)
        .annotation("example.com/agent", "present")
        .label(SLOW_WRITES_LABEL, "true");
    let waiting = (1..=WAITING)
        .map(|i| NodeFixture::named(format!("waiting-{i:02}")).label(SLOW_WRITES_LABEL, "true"));
    create_nodes(
        &env.client,
        held.chain([target]).chain(waiting).collect(),
        8,
    )
    .await;
    let api: Api<Node> = Api::all(env.client.clone());
    let uid = uid_of(&api, TARGET).await;
    let webhook = SlowWebhook::start_sparing(
        &env.client,
        "netcm-e2e-slow-touches",
        HOLD,
        Some(EARLIER_LEADER),
    )
    .await;
    wait_webhook_active(env, &webhook).await;
    let probes = webhook.seen().len();
    let netcm = start_after_an_earlier_leaders_block(
        env,
        &format!("late-write-{round}"),
        CLUSTER,
        CLUSTER,
        &["--concurrent-node-cidr-syncs=1"],
    )
    .await;
    // netcm's first touch of a waiting Node: the touch pass has begun, and each touch takes HOLD.
    wait_for("netcm to touch a waiting node", TIMEOUT, || async {
        (webhook.seen().len() > probes).then_some(())
    })
    .await;
    // Refused (422) only when netcm touched the target first.
    let landed = earlier_leaders_write(&api, TARGET, &uid, LAST_FREE)
        .await
        .is_ok();
    wait_quarantine_ended(&netcm).await;
    let nodes = wait_for(
        "the last free CIDR to be held and every other waiting node to be told none is free",
        TIMEOUT,
        || async {
            let nodes = all_nodes(&env.client).await;
            let held = nodes.iter().any(|n| pod_cidrs(n) == [LAST_FREE]);
            let told = told_none_is_free(&env.client).await;
            let all_answered = nodes.iter().all(|n| {
                let name = n.metadata.name.as_deref().unwrap_or_default();
                !pod_cidrs(n).is_empty() || told.contains(name)
            });
            (held && all_answered).then_some(nodes)
        },
    )
    .await;
    webhook.remove(&env.client).await;
    let holders = holders(&nodes, LAST_FREE);
    netcm.assert_running();
    Round { landed, holders }
}

#[tokio::test]
async fn a_cidr_an_earlier_leader_wrote_during_the_touch_pass_is_never_handed_to_a_second_node() {
    let env = TestEnv::new().await;
    let mut landed = 0;
    let mut duplicated = Vec::new();
    for round in 0..ROUNDS {
        let r = takeover_with_a_write_landing_during_the_touches(&env, round).await;
        landed += usize::from(r.landed);
        eprintln!(
            "round {round}: the earlier leader's write {}; {LAST_FREE} held by {:?}",
            if r.landed { "landed" } else { "was refused" },
            r.holders
        );
        if r.holders.len() != 1 {
            duplicated.push((round, r.holders));
        }
    }
    assert!(
        landed > 0,
        "in no round did the earlier leader's write land before netcm touched its node: nothing was tested"
    );
    assert!(
        duplicated.is_empty(),
        "{LAST_FREE} was not held by exactly one node in {} of {ROUNDS} rounds ({landed} with the earlier leader's write landing): {duplicated:?}",
        duplicated.len()
    );
}
