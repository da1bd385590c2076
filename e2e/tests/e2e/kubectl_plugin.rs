//! `kubectl netcm`: the netcm binary installed as `kubectl-netcm` on `PATH`, found and run by the real
//! kubectl, as a user who installed the plugin (by krew or by hand) would run it.

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};
use netcm_e2e::netcm::netcm_binary;
use netcm_e2e::nodes::{create_node, pod_cidrs, NodeFixture};
use netcm_e2e::{tool, wait_for, Netcm, TestEnv};
use serde_json::Value;

const TIMEOUT: Duration = Duration::from_secs(30);

/// A directory holding only `kubectl-netcm`, a link to the netcm binary under test.
fn plugin_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    std::os::unix::fs::symlink(netcm_binary(), dir.path().join("kubectl-netcm"))
        .expect("link kubectl-netcm");
    dir
}

/// The real kubectl with the plugin's directory first on `PATH`, the cluster given by `KUBECONFIG` (kubectl
/// hands its environment, not its own flags, to a plugin).
fn kubectl(plugins: &Path, kubeconfig: &Path, args: &[&str]) -> Output {
    let path = std::env::var("PATH").unwrap_or_default();
    Command::new(tool("kubectl"))
        .args(args)
        .env("PATH", format!("{}:{path}", plugins.display()))
        .env("KUBECONFIG", kubeconfig)
        .env_remove("NETCM_KUBECONFIG")
        .output()
        .expect("run kubectl")
}

fn json(what: &str, out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{what}: not JSON ({e}):\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// Each finding's check and status, the part of a report that does not depend on timing.
fn verdicts(report: &Value) -> Vec<(String, String)> {
    let mut v: Vec<_> = report["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .map(|c| (c["check"].to_string(), c["status"].to_string()))
        .collect();
    v.sort();
    v
}

#[tokio::test]
async fn kubectl_finds_the_plugin_and_kubectl_netcm_check_reports_what_netcm_check_reports() {
    let env = TestEnv::new().await;
    let netcm = Netcm::start(
        "plugin",
        &env.cp.kubeconfig,
        &[
            "--controllers=subnet-allocator",
            "--cluster-cidr=10.244.0.0/16",
        ],
    );
    for name in ["plugin-0", "plugin-1"] {
        create_node(&env.client, &NodeFixture::named(name)).await;
    }
    let api: Api<Node> = Api::all(env.client.clone());
    wait_for("both Nodes allocated", TIMEOUT, || async {
        let nodes = api.list(&ListParams::default()).await.ok()?.items;
        (nodes.iter().filter(|n| !pod_cidrs(n).is_empty()).count() == 2).then_some(())
    })
    .await;
    netcm.assert_running();
    let plugins = plugin_dir();

    let list = kubectl(plugins.path(), &env.cp.kubeconfig, &["plugin", "list"]);
    let listed = String::from_utf8_lossy(&list.stdout);
    assert!(
        listed.contains(&plugins.path().join("kubectl-netcm").display().to_string()),
        "kubectl plugin list does not show kubectl-netcm:\n{listed}\n{}",
        String::from_utf8_lossy(&list.stderr)
    );

    let by_plugin = kubectl(
        plugins.path(),
        &env.cp.kubeconfig,
        &["netcm", "check", "-o", "json"],
    );
    let direct = Command::new(netcm_binary())
        .args(["check", "-o", "json"])
        .env("KUBECONFIG", &env.cp.kubeconfig)
        .env_remove("NETCM_KUBECONFIG")
        .output()
        .expect("run netcm check");
    assert_eq!(
        by_plugin.status.code(),
        direct.status.code(),
        "kubectl netcm check and netcm check disagree on the exit code"
    );
    let report = json("kubectl netcm check", &by_plugin);
    assert_eq!(verdicts(&report), verdicts(&json("netcm check", &direct)));
    let pool = report["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .find(|c| c["check"] == "pool")
        .expect("a pool finding");
    assert!(
        pool["message"].as_str().unwrap_or("").contains("2/256"),
        "the plugin did not read this cluster's pool: {pool}"
    );

    let node = kubectl(
        plugins.path(),
        &env.cp.kubeconfig,
        &["netcm", "check", "node", "plugin-1"],
    );
    let text = String::from_utf8_lossy(&node.stdout);
    assert!(
        text.contains("plugin-1") && text.contains("10.244."),
        "kubectl netcm check node plugin-1 does not describe the Node and its CIDR:\n{text}"
    );
}

#[tokio::test]
async fn kubectl_netcm_offers_check_only_and_refuses_anything_else_as_a_usage_error() {
    let env = TestEnv::new().await;
    let plugins = plugin_dir();
    let help = kubectl(plugins.path(), &env.cp.kubeconfig, &["netcm"]);
    assert_eq!(help.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&help.stdout).contains("kubectl netcm check node NAME"));

    let version = kubectl(plugins.path(), &env.cp.kubeconfig, &["netcm", "version"]);
    assert_eq!(
        String::from_utf8_lossy(&version.stdout).trim(),
        format!("kubectl-netcm {}", env!("CARGO_PKG_VERSION"))
    );

    let manager = kubectl(
        plugins.path(),
        &env.cp.kubeconfig,
        &["netcm", "--controllers=*", "--leader-elect=false"],
    );
    assert_eq!(manager.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&manager.stderr).contains("kubectl netcm check"),
        "{}",
        String::from_utf8_lossy(&manager.stderr)
    );

    let bad_flag = kubectl(
        plugins.path(),
        &env.cp.kubeconfig,
        &["netcm", "check", "--no-such-flag"],
    );
    assert_eq!(bad_flag.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad_flag.stderr).contains("Usage: kubectl netcm check"));
}
