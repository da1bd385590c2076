//! Per-Node size from capacity on the real control plane: Nodes registering with 16, 30, 64
//! and 110 pods get a /27, /26, /25 and /24 from one sized pool, none overlapping, while a fixed-size
//! pool beside it hands out its one size whatever the capacity — both for a sized flag pool
//! (`--node-cidr-size-from-pods`) beside a fixed ClusterCIDR, and for a ClusterCIDR sized by the
//! annotation `ipam.netcm.io/node-cidr-size-from-pods` beside the fixed flag pool.

use std::collections::BTreeMap;
use std::time::Duration;

use ipnet::IpNet;
use kube::api::{DynamicObject, PostParams};
use netcm_e2e::nodes::{self, all_nodes, assert_no_overlaps, create_node, NodeFixture};
use netcm_e2e::{cluster_cidrs, Netcm, TestEnv};
use serde_json::{json, Value};

const TIMEOUT: Duration = Duration::from_secs(60);

/// The acceptance's capacities and the sizes they get.
const SIZED: [(u32, u8); 4] = [(16, 27), (30, 26), (64, 25), (110, 24)];

async fn create_pool(client: &kube::Client, name: &str, annotations: Value, spec: Value) {
    let obj: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "networking.x-k8s.io/v1",
        "kind": "ClusterCIDR",
        "metadata": {"name": name, "annotations": annotations},
        "spec": spec,
    }))
    .expect("ClusterCIDR");
    cluster_cidrs(client)
        .create(&PostParams::default(), &obj)
        .await
        .expect("create ClusterCIDR");
}

/// Selects the Nodes labelled `pool=<name>`.
fn selecting(name: &str) -> Value {
    json!({"nodeSelectorTerms": [{"matchExpressions": [
        {"key": "pool", "operator": "In", "values": [name]}]}]})
}

/// Waits until every named Node has pod CIDRs; returns name → its first (IPv4) CIDR.
async fn wait_allocated(client: &kube::Client, names: &[String]) -> BTreeMap<String, IpNet> {
    nodes::wait_allocated(client, names, TIMEOUT)
        .await
        .into_iter()
        .map(|(n, cidrs)| (n, cidrs[0]))
        .collect()
}

/// Creates the sized Nodes (`<prefix>-<pods>`, and `<prefix>-none` without capacity) and the fixed ones
/// (`<fixed>-16`, `<fixed>-110`, labelled `pool=<fixed_label>` when given); returns all their names.
async fn create_fixtures(
    client: &kube::Client,
    prefix: &str,
    sized_label: Option<&str>,
    fixed: &str,
    fixed_label: Option<&str>,
) -> Vec<String> {
    let labelled = |f: NodeFixture, label: Option<&str>| match label {
        Some(l) => f.label("pool", l),
        None => f,
    };
    let mut names = Vec::new();
    for (pods, _) in SIZED {
        let name = format!("{prefix}-{pods}");
        create_node(
            client,
            &labelled(NodeFixture::named(&name).pods(pods), sized_label),
        )
        .await;
        names.push(name);
    }
    let none = format!("{prefix}-none");
    create_node(client, &labelled(NodeFixture::named(&none), sized_label)).await;
    names.push(none);
    for pods in [16, 110] {
        let name = format!("{fixed}-{pods}");
        create_node(
            client,
            &labelled(NodeFixture::named(&name).pods(pods), fixed_label),
        )
        .await;
        names.push(name);
    }
    names
}

/// The sized Nodes got their sizes inside `sized`, the one without capacity `default`, the fixed ones
/// `fixed_mask` inside `fixed`; nothing overlaps.
async fn assert_sizes(
    client: &kube::Client,
    got: &BTreeMap<String, IpNet>,
    (prefix, sized, default): (&str, &str, u8),
    (fixed_prefix, fixed, fixed_mask): (&str, &str, u8),
) {
    let sized: IpNet = sized.parse().expect("cidr");
    let fixed: IpNet = fixed.parse().expect("cidr");
    for (pods, mask) in SIZED {
        let c = got[&format!("{prefix}-{pods}")];
        assert!(
            sized.contains(&c) && c.prefix_len() == mask,
            "{pods} pods: {c}"
        );
    }
    let none = got[&format!("{prefix}-none")];
    assert!(
        sized.contains(&none) && none.prefix_len() == default,
        "no capacity: {none}"
    );
    for pods in [16, 110] {
        let c = got[&format!("{fixed_prefix}-{pods}")];
        assert!(
            fixed.contains(&c) && c.prefix_len() == fixed_mask,
            "fixed, {pods} pods: {c}"
        );
    }
    assert_no_overlaps(&all_nodes(client).await);
}

#[tokio::test]
async fn a_sized_flag_pool_gives_each_node_its_size_beside_a_fixed_clustercidr() {
    let env = TestEnv::new().await;
    create_pool(
        &env.client,
        "fixed",
        json!({}),
        json!({"perNodeHostBits": 6, "ipv4": "10.253.0.0/24", "nodeSelector": selecting("fixed")}),
    )
    .await;
    let _n = Netcm::start(
        "sizing-flags",
        &env.cp.kubeconfig,
        &[
            "--controllers=subnet-allocator",
            "--cluster-cidr=10.252.0.0/22",
            "--node-cidr-size-from-pods",
            "--node-cidr-mask-size-ipv4-max=27",
        ],
    );
    let names = create_fixtures(&env.client, "sized", None, "fixed", Some("fixed")).await;
    let got = wait_allocated(&env.client, &names).await;
    assert_sizes(
        &env.client,
        &got,
        ("sized", "10.252.0.0/22", 24),
        ("fixed", "10.253.0.0/24", 26),
    )
    .await;
}

#[tokio::test]
async fn a_clustercidr_sized_by_its_annotation_gives_each_node_its_size_beside_the_fixed_flag_pool()
{
    let env = TestEnv::new().await;
    create_pool(
        &env.client,
        "sized",
        json!({"ipam.netcm.io/node-cidr-size-from-pods": "5-8"}),
        json!({"perNodeHostBits": 8, "ipv4": "10.254.0.0/22", "nodeSelector": selecting("sized")}),
    )
    .await;
    let _n = Netcm::start(
        "sizing-annotation",
        &env.cp.kubeconfig,
        &[
            "--controllers=subnet-allocator",
            "--cluster-cidr=10.251.0.0/16",
            "--node-cidr-mask-size=24",
        ],
    );
    let names = create_fixtures(&env.client, "annotated", Some("sized"), "plain", None).await;
    let got = wait_allocated(&env.client, &names).await;
    assert_sizes(
        &env.client,
        &got,
        ("annotated", "10.254.0.0/22", 24),
        ("plain", "10.251.0.0/16", 24),
    )
    .await;
}
