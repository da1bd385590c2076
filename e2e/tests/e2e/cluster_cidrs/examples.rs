//! node-ipam-controller's example manifests (`e2e/testdata/node-ipam-controller/`, unchanged copies),
//! applied as its README says (`kubectl create -f`, then `kubectl delete -f` once the Nodes are gone),
//! each with Nodes carrying the labels the example asks for.

use super::*;

const EXAMPLES: &str = "e2e/testdata/node-ipam-controller";

/// One example: its file, and per Node (labels) the pool range and mask its CIDRs must have.
struct Example {
    file: &'static str,
    nodes: &'static [(&'static str, &'static [(&'static str, u8)])],
    /// Whether the Nodes hold CIDRs from the example's pools (so deleting it must wait for them).
    holds: bool,
}

const CASES: [Example; 5] = [
    Example {
        file: "clustercidr-ipv4.yaml",
        nodes: &[("", &[("10.244.0.0/16", 24)])],
        holds: true,
    },
    Example {
        file: "clustercidr-ipv6.yaml",
        nodes: &[("", &[("2001:db8::/110", 120)])],
        holds: true,
    },
    Example {
        file: "clustercidr-dual.yaml",
        nodes: &[("", &[("10.244.0.0/16", 24), ("2001:db8::/110", 120)])],
        holds: true,
    },
    // The node-group examples select by keys like `platform.node_group/worker-medium`, which no Node can
    // carry: the API server refuses a label key whose prefix has an underscore. The pools apply and are
    // active, but select no Node; a Node gets its CIDR from the flag pool.
    Example {
        file: "clustercidr-different-node-groups.yaml",
        nodes: &[("", &[("10.128.0.0/12", 24)])],
        holds: false,
    },
    Example {
        file: "clustercidr-different-ip-pools-for-same-node-group.yaml",
        nodes: &[("", &[("10.128.0.0/12", 24)])],
        holds: false,
    },
];

/// Waits until every ClusterCIDR is active; panics with their statuses if not.
async fn wait_active(env: &TestEnv, file: &str) {
    let start = Instant::now();
    loop {
        let objects = cluster_cidrs(&env.client)
            .list(&Default::default())
            .await
            .expect("list ClusterCIDRs");
        let statuses: Vec<(String, Value)> = objects
            .items
            .iter()
            .map(|o| {
                (
                    o.metadata.name.clone().unwrap_or_default(),
                    o.data["status"].clone(),
                )
            })
            .collect();
        if statuses.iter().all(|(_, s)| s["phase"] == "Active") {
            return;
        }
        assert!(
            start.elapsed() < TIMEOUT,
            "{file}: pools not active: {statuses:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn node_ipam_controllers_examples_apply_unchanged_and_behave_as_its_readme_says() {
    let env = TestEnv::new().await;
    // A flag pool with more room than any example's, so the examples' unselective pools rank first
    // (KEP-2593: the pool with fewer node CIDRs first).
    let _n = netcm(
        &env,
        "pools-examples",
        &["--cluster-cidr=10.128.0.0/12", "--node-cidr-mask-size=24"],
    );
    let api: Api<Node> = Api::all(env.client.clone());
    for (i, ex) in CASES.iter().enumerate() {
        let path = netcm_e2e::repo_root().join(EXAMPLES).join(ex.file);
        let path = path.display().to_string();
        kubectl(&env, &["create", "-f", &path]);
        // Nodes created before netcm has seen the pools would rightly get CIDRs from the flag pool.
        wait_active(&env, ex.file).await;
        let mut names = Vec::new();
        for (j, (label, _)) in ex.nodes.iter().enumerate() {
            let name = format!("ex{i}-{j}");
            let mut f = NodeFixture::named(&name);
            if !label.is_empty() {
                f = f.label(label, "");
            }
            create_node(&env.client, &f).await;
            names.push(name);
        }
        let got = wait_allocated(&env.client, &names, TIMEOUT).await;
        for (j, (_, want)) in ex.nodes.iter().enumerate() {
            let c = &got[&names[j]];
            assert_eq!(c.len(), want.len(), "{}: {c:?}", ex.file);
            for (cidr, (range, mask)) in c.iter().zip(want.iter()) {
                let range: IpNet = range.parse().expect("cidr");
                assert!(
                    range.contains(cidr) && cidr.prefix_len() == *mask,
                    "{}: node {} got {cidr}, wanted a /{mask} of {range}",
                    ex.file,
                    names[j]
                );
            }
        }
        assert_no_overlaps(&netcm_e2e::nodes::all_nodes(&env.client).await);
        // "ClusterCIDRs are immutable."
        let first = kubectl(&env, &["get", "-f", &path, "-o", "name"]);
        let first = first.lines().next().expect("an object").to_string();
        let out = Command::new(tool("kubectl"))
            .arg(format!("--kubeconfig={}", env.cp.kubeconfig.display()))
            .args([
                "patch",
                &first,
                "--type=merge",
                "-p",
                r#"{"spec":{"perNodeHostBits":5}}"#,
            ])
            .output()
            .expect("run kubectl");
        assert!(
            !out.status.success(),
            "{}: an update of perNodeHostBits was accepted",
            ex.file
        );
        // "To delete a ClusterCIDR, the corresponding nodes need to be deleted first."
        kubectl(&env, &["delete", "-f", &path, "--wait=false"]);
        if ex.holds {
            wait_for(&format!("{} to drain", ex.file), TIMEOUT, || async {
                let left = cluster_cidrs(&env.client)
                    .list(&Default::default())
                    .await
                    .ok()?;
                left.items
                    .iter()
                    .all(|o| o.data["status"]["phase"] == "Draining")
                    .then_some(())
            })
            .await;
        }
        for n in &names {
            api.delete(n, &DeleteParams::default())
                .await
                .expect("delete node");
        }
        wait_for(&format!("{} to be gone", ex.file), TIMEOUT, || async {
            let left = cluster_cidrs(&env.client)
                .list(&Default::default())
                .await
                .ok()?;
            left.items.is_empty().then_some(())
        })
        .await;
    }
}
