//! ClusterCIDR pools (`clustercidrs.networking.x-k8s.io/v1`) on the real control plane: a pool per node
//! group with its own mask, a pool added while Nodes wait, a pool drained by its finalizer, an
//! overlapping pool refused, node-ipam-controller's own example manifests (`examples.rs`), and what a
//! pool's status says (`status.rs`).

use std::process::Command;
use std::time::{Duration, Instant};

use ipnet::IpNet;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DeleteParams, DynamicObject, PostParams};
use netcm_e2e::nodes::{assert_no_overlaps, create_node, wait_allocated, NodeFixture};
use netcm_e2e::{cluster_cidrs, tool, wait_for, Netcm, TestEnv};
use serde_json::{json, Value};

mod examples;
mod status;

const TIMEOUT: Duration = Duration::from_secs(60);

/// Creates a ClusterCIDR with `spec`.
async fn create_pool(client: &kube::Client, name: &str, spec: Value) {
    let obj: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "networking.x-k8s.io/v1",
        "kind": "ClusterCIDR",
        "metadata": {"name": name},
        "spec": spec,
    }))
    .expect("ClusterCIDR");
    cluster_cidrs(client)
        .create(&PostParams::default(), &obj)
        .await
        .expect("create ClusterCIDR");
}

/// `kubectl <args>` against the test cluster; panics with its stderr if it fails.
fn kubectl(env: &TestEnv, args: &[&str]) -> String {
    let out = Command::new(tool("kubectl"))
        .arg(format!("--kubeconfig={}", env.cp.kubeconfig.display()))
        .args(args)
        .output()
        .expect("run kubectl");
    assert!(
        out.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

async fn pool_status(client: &kube::Client, name: &str) -> Option<Value> {
    let obj = cluster_cidrs(client).get_opt(name).await.ok()??;
    obj.data.get("status").cloned()
}

fn names(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i}")).collect()
}

fn netcm(env: &TestEnv, label: &str, extra: &[&str]) -> Netcm {
    let mut args = vec!["--controllers=subnet-allocator"];
    args.extend_from_slice(extra);
    Netcm::start(label, &env.cp.kubeconfig, &args)
}

#[tokio::test]
async fn a_dual_stack_gpu_pool_gives_gpu_nodes_its_mask_and_the_flag_pool_serves_the_rest() {
    let env = TestEnv::new().await;
    create_pool(
        &env.client,
        "gpu",
        json!({
            "perNodeHostBits": 6,
            "ipv4": "10.100.0.0/16",
            "ipv6": "fd00:100::/112",
            "nodeSelector": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "node-role", "operator": "In", "values": ["gpu"]}]}]}
        }),
    )
    .await;
    let n = netcm(&env, "pools-gpu", &["--cluster-cidr=10.244.0.0/16"]);
    let gpu = names("gpu", 3);
    let cpu = names("cpu", 3);
    for n in &gpu {
        create_node(
            &env.client,
            &NodeFixture::named(n).label("node-role", "gpu"),
        )
        .await;
    }
    for n in &cpu {
        create_node(
            &env.client,
            &NodeFixture::named(n).label("node-role", "cpu"),
        )
        .await;
    }
    let all: Vec<String> = gpu.iter().chain(&cpu).cloned().collect();
    let got = wait_allocated(&env.client, &all, TIMEOUT).await;
    let v4: IpNet = "10.100.0.0/16".parse().expect("cidr");
    let v6: IpNet = "fd00:100::/112".parse().expect("cidr");
    let flag: IpNet = "10.244.0.0/16".parse().expect("cidr");
    for n in &gpu {
        let c = &got[n];
        assert_eq!(c.len(), 2, "{n}: {c:?}");
        assert!(v4.contains(&c[0]) && c[0].prefix_len() == 26, "{n}: {c:?}");
        assert!(v6.contains(&c[1]) && c[1].prefix_len() == 122, "{n}: {c:?}");
    }
    for n in &cpu {
        let c = &got[n];
        assert_eq!(c.len(), 1, "{n}: {c:?}");
        assert!(
            flag.contains(&c[0]) && c[0].prefix_len() == 24,
            "{n}: {c:?}"
        );
    }
    let nodes: Vec<Node> = netcm_e2e::nodes::all_nodes(&env.client).await;
    assert_no_overlaps(&nodes);
    // What each pool can still hand out, per family: 1,024 node CIDRs of the gpu pool in each family and
    // 256 of the flag pool, three of each taken.
    for (pool, family, prefix, free) in [
        ("gpu", "IPv4", 26, 1021),
        ("gpu", "IPv6", 122, 1021),
        ("default-cluster-cidr", "IPv4", 24, 253),
    ] {
        let labels = format!("family=\"{family}\",pool=\"{pool}\"");
        n.wait_metric(
            &format!("netcm_pool_free_blocks{{{labels},prefix_length=\"{prefix}\"}}"),
            &free.to_string(),
            |v| v == f64::from(free),
            TIMEOUT,
        )
        .await;
        let largest = format!("netcm_pool_largest_free_block_prefix_length{{{labels}}}");
        assert_eq!(
            n.metric(&largest).await,
            Some(f64::from(prefix)),
            "{largest}"
        );
        let held = format!("netcm_pool_release_hold_cidrs{{{labels}}}");
        assert_eq!(n.metric(&held).await, Some(0.0), "{held}");
    }
    // The pool carries the finalizer and a status kubectl prints.
    let status = wait_for("the gpu pool's status", TIMEOUT, || async {
        pool_status(&env.client, "gpu")
            .await
            .filter(|s| s["allocated"] == 3)
    })
    .await;
    assert_eq!(status["phase"], "Active");
    assert_eq!(status["capacity"], 1024);
    assert_eq!(status["selector"], "node-role=gpu");
    let obj = cluster_cidrs(&env.client).get("gpu").await.expect("gpu");
    assert_eq!(
        obj.metadata.finalizers.unwrap_or_default(),
        ["networking.x-k8s.io/cluster-cidr-finalizer"]
    );
    let table = kubectl(&env, &["get", "clustercidrs"]);
    eprintln!("{table}");
    assert!(
        table.contains("ALLOCATED") && table.contains("node-role=gpu"),
        "{table}"
    );
}

#[tokio::test]
async fn nodes_waiting_on_a_full_pool_are_allocated_as_soon_as_a_new_cluster_cidr_is_applied() {
    let env = TestEnv::new().await;
    let n = netcm(
        &env,
        "pools-grow",
        &["--cluster-cidr=10.250.0.0/28", "--node-cidr-mask-size=28"],
    );
    let all = names("wait", 4);
    for n in &all {
        create_node(&env.client, &NodeFixture::named(n)).await;
    }
    // One Node fits; the others wait with CIDRNotAvailable.
    wait_for(
        "three nodes to wait with CIDRNotAvailable",
        TIMEOUT,
        || async {
            let mut waiting = 0;
            for n in &all {
                if env
                    .node_events(n)
                    .await
                    .iter()
                    .any(|(_, reason, _)| reason == "CIDRNotAvailable")
                {
                    waiting += 1;
                }
            }
            (waiting == 3).then_some(())
        },
    )
    .await;
    // The full flag pool can hand out no block.
    let flag = "family=\"IPv4\",pool=\"default-cluster-cidr\"";
    assert_eq!(
        n.metric(&format!(
            "netcm_pool_largest_free_block_prefix_length{{{flag}}}"
        ))
        .await,
        Some(0.0)
    );
    assert_eq!(
        n.metric(&format!(
            "netcm_pool_free_blocks{{{flag},prefix_length=\"28\"}}"
        ))
        .await,
        Some(0.0)
    );
    let dir = tempfile_dir();
    let file = dir.join("more.yaml");
    std::fs::write(
        &file,
        "apiVersion: networking.x-k8s.io/v1\nkind: ClusterCIDR\nmetadata:\n  name: more\nspec:\n  perNodeHostBits: 4\n  ipv4: 10.251.0.0/24\n",
    )
    .expect("write manifest");
    let start = Instant::now();
    kubectl(&env, &["apply", "-f", &file.display().to_string()]);
    let got = wait_allocated(&env.client, &all, Duration::from_secs(30)).await;
    // For people (no wall-clock assertion): the target is within a second.
    eprintln!(
        "[bench] waiting nodes allocated {:?} after kubectl apply",
        start.elapsed()
    );
    let more: IpNet = "10.251.0.0/24".parse().expect("cidr");
    let from_more = got.values().filter(|c| more.contains(&c[0])).count();
    assert_eq!(from_more, 3, "{got:?}");
    n.wait_metric(
        "netcm_pool_free_blocks{family=\"IPv4\",pool=\"more\",prefix_length=\"28\"}",
        "13 of its 16 /28s",
        |v| v == 13.0,
        TIMEOUT,
    )
    .await;
}

/// A fresh directory for manifests.
fn tempfile_dir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("netcm-e2e-pools-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

#[tokio::test]
async fn a_deleted_pool_in_use_stays_gives_out_nothing_new_and_goes_once_its_nodes_are_gone() {
    let env = TestEnv::new().await;
    create_pool(
        &env.client,
        "retire",
        json!({
            "perNodeHostBits": 8,
            "ipv4": "10.70.0.0/16",
            "nodeSelector": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "pool", "operator": "In", "values": ["retire"]}]}]}
        }),
    )
    .await;
    let _n = netcm(&env, "pools-drain", &["--cluster-cidr=10.244.0.0/16"]);
    let old = names("old", 2);
    for n in &old {
        create_node(&env.client, &NodeFixture::named(n).label("pool", "retire")).await;
    }
    let got = wait_allocated(&env.client, &old, TIMEOUT).await;
    let retire: IpNet = "10.70.0.0/16".parse().expect("cidr");
    assert!(got.values().all(|c| retire.contains(&c[0])), "{got:?}");
    wait_for("the finalizer", TIMEOUT, || async {
        let obj = cluster_cidrs(&env.client).get_opt("retire").await.ok()??;
        (!obj.metadata.finalizers.unwrap_or_default().is_empty()).then_some(())
    })
    .await;
    kubectl(&env, &["delete", "clustercidr", "retire", "--wait=false"]);
    let status = wait_for("the pool to drain", TIMEOUT, || async {
        pool_status(&env.client, "retire")
            .await
            .filter(|s| s["phase"] == "Draining")
    })
    .await;
    assert_eq!(status["allocated"], 2);
    // A new Node it selects gets its CIDR elsewhere.
    create_node(
        &env.client,
        &NodeFixture::named("new-0").label("pool", "retire"),
    )
    .await;
    let got = wait_allocated(&env.client, &["new-0".to_string()], TIMEOUT).await;
    assert!(!retire.contains(&got["new-0"][0]), "{got:?}");
    assert!(
        cluster_cidrs(&env.client)
            .get_opt("retire")
            .await
            .expect("get")
            .is_some(),
        "the finalizer holds the pool while Nodes use it"
    );
    let api: Api<Node> = Api::all(env.client.clone());
    for n in &old {
        api.delete(n, &DeleteParams::default())
            .await
            .expect("delete node");
    }
    wait_for("the drained pool to disappear", TIMEOUT, || async {
        matches!(cluster_cidrs(&env.client).get_opt("retire").await, Ok(None)).then_some(())
    })
    .await;
}

#[tokio::test]
async fn an_overlapping_pool_is_refused_with_a_warning_event_and_allocation_goes_on() {
    let env = TestEnv::new().await;
    let _n = netcm(
        &env,
        "pools-overlap",
        &[
            "--cluster-cidr=10.244.0.0/16",
            "--service-cluster-ip-range=10.96.0.0/16",
        ],
    );
    let sel = |v: &str| {
        json!({"nodeSelectorTerms": [{"matchExpressions": [
            {"key": "group", "operator": "In", "values": [v]}]}]})
    };
    create_pool(
        &env.client,
        "a",
        json!({"perNodeHostBits": 8, "ipv4": "10.60.0.0/16", "nodeSelector": sel("a")}),
    )
    .await;
    create_node(&env.client, &NodeFixture::named("a-0").label("group", "a")).await;
    wait_allocated(&env.client, &["a-0".to_string()], TIMEOUT).await;
    create_pool(
        &env.client,
        "b",
        json!({"perNodeHostBits": 8, "ipv4": "10.60.128.0/17", "nodeSelector": sel("b")}),
    )
    .await;
    create_pool(
        &env.client,
        "svc",
        json!({"perNodeHostBits": 8, "ipv4": "10.96.0.0/20", "nodeSelector": sel("b")}),
    )
    .await;
    for refused in ["b", "svc"] {
        wait_for(
            &format!("a ClusterCIDROverlap Warning about {refused}"),
            TIMEOUT,
            || async {
                env.node_events(refused)
                    .await
                    .into_iter()
                    .find(|(t, reason, _)| t == "Warning" && reason == "ClusterCIDROverlap")
            },
        )
        .await;
        let status = wait_for("the refused status", TIMEOUT, || async {
            pool_status(&env.client, refused)
                .await
                .filter(|s| s["phase"] == "Refused")
        })
        .await;
        eprintln!("{refused}: {}", status["message"]);
    }
    for (n, group) in [("a-1", "a"), ("b-0", "b")] {
        create_node(&env.client, &NodeFixture::named(n).label("group", group)).await;
    }
    let got = wait_allocated(
        &env.client,
        &["a-1".to_string(), "b-0".to_string()],
        TIMEOUT,
    )
    .await;
    let a: IpNet = "10.60.0.0/16".parse().expect("cidr");
    let flag: IpNet = "10.244.0.0/16".parse().expect("cidr");
    assert!(a.contains(&got["a-1"][0]), "{got:?}");
    assert!(
        flag.contains(&got["b-0"][0]),
        "the refused pools give nothing: {got:?}"
    );
}
