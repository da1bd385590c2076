//! `promtool check metrics` on a live scrape of a netcm running every API-side controller.

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use netcm_e2e::nodes::{create_node, NodeFixture};
use netcm_e2e::{Netcm, TestEnv};

/// Findings promtool reports that come from keeping upstream's names: kube-controller-manager's nodeipam
/// metrics label their cluster CIDR `clusterCIDR`, and dashboards depend on it.
fn is_upstream_compat_finding(line: &str) -> bool {
    line.starts_with("node_ipam_controller_")
        && line.contains("label names should be written in 'snake_case' not 'camelCase'")
}

#[tokio::test]
async fn a_live_metrics_scrape_passes_promtool_check_metrics() {
    let env = TestEnv::new().await;
    create_node(
        &env.client,
        &NodeFixture::named("lint-node").internal_ip("192.0.2.40"),
    )
    .await;
    let n = Netcm::start(
        "lint",
        &env.cp.kubeconfig,
        &[
            "--controllers=*,-route-controller",
            "--cluster-cidr=10.244.0.0/16",
        ],
    );
    n.wait_metric(
        "node_ipam_controller_cidrset_cidrs_allocations_total{clusterCIDR=\"10.244.0.0/16\"}",
        "at least 1",
        |v| v >= 1.0,
        Duration::from_secs(30),
    )
    .await;
    let (_, body) = n.http_get("/metrics").await.expect("/metrics");
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run promtool (hack/install-prereqs.sh installs Debian's prometheus package)");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(body.as_bytes())
        .expect("write scrape");
    let out = child.wait_with_output().expect("promtool");
    let findings = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // Exit 0: clean; 3: lint findings only (1 would be a malformed exposition).
    assert!(
        matches!(out.status.code(), Some(0) | Some(3)),
        "promtool failed ({}):\n{findings}",
        out.status
    );
    let unexpected: Vec<&str> = findings
        .lines()
        .filter(|l| !l.trim().is_empty() && !is_upstream_compat_finding(l))
        .collect();
    assert!(
        unexpected.is_empty(),
        "promtool findings:\n{}",
        unexpected.join("\n")
    );
    assert!(body.contains("node_ipam_controller_cidrset_cidrs_allocations_total"));
}
