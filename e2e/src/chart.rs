//! The chart as the e2e tests use it: rendered by `helm template`, turned into API objects by
//! `kubectl create --dry-run=client`, and applied server-side as an operator's `kubectl apply
//! --server-side` would.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{json, Value};

use crate::{command_output, kubectl, repo_root};

/// helm, built from its Go module by hack/verify-chart.sh.
pub fn helm() -> PathBuf {
    let out = command_output(
        Command::new("bash")
            .arg(repo_root().join("hack/verify-chart.sh"))
            .arg("helm"),
        None,
    );
    PathBuf::from(out.trim())
}

/// The chart's directory.
pub fn chart_dir() -> PathBuf {
    repo_root().join("charts/netcm")
}

/// `helm template <release> charts/netcm --namespace <namespace>` followed by `args`, as the JSON objects
/// kubectl (against `kubeconfig`) makes of it.
pub fn render(kubeconfig: &Path, release: &str, namespace: &str, args: &[String]) -> Vec<Value> {
    let mut cmd = Command::new(helm());
    cmd.args(["template", release])
        .arg(chart_dir())
        .args(["--namespace", namespace])
        .args(args);
    let yaml = command_output(&mut cmd, None);
    if yaml.contains("apiVersion: monitoring.coreos.com/") {
        install_monitoring_crds(kubeconfig);
    }
    let json = command_output(
        kubectl(kubeconfig).args(["create", "--dry-run=client", "-o", "json", "-f", "-"]),
        Some(&yaml),
    );
    serde_json::Deserializer::from_str(&json)
        .into_iter::<Value>()
        .collect::<Result<Vec<_>, _>>()
        .expect("kubectl printed JSON objects")
}

/// The stand-ins for prometheus-operator's ServiceMonitor and PrometheusRule CRDs (`hack/testdata/`),
/// without which kubectl cannot make objects of those kinds: applied to the control plane of
/// `kubeconfig` and waited for. `hack/verify-chart.sh` installs them on the first control plane only, and
/// a test may run against either.
fn install_monitoring_crds(kubeconfig: &Path) {
    let testdata = repo_root().join("hack/testdata");
    for file in ["servicemonitor-crd.yaml", "prometheusrule-crd.yaml"] {
        command_output(
            kubectl(kubeconfig)
                .args([
                    "apply",
                    "--server-side",
                    "--force-conflicts",
                    "--field-manager=netcm-e2e",
                    "-f",
                ])
                .arg(testdata.join(file)),
            None,
        );
    }
    command_output(
        kubectl(kubeconfig).args([
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/servicemonitors.monitoring.coreos.com",
            "crd/prometheusrules.monitoring.coreos.com",
        ]),
        None,
    );
}

/// Server-side applies `objects` as one List, owned by `field_manager`.
pub fn apply(kubeconfig: &Path, field_manager: &str, objects: Vec<Value>) {
    let list = json!({"apiVersion": "v1", "kind": "List", "items": objects});
    command_output(
        kubectl(kubeconfig).args([
            "apply",
            "--server-side",
            "--force-conflicts",
            &format!("--field-manager={field_manager}"),
            "-f",
            "-",
        ]),
        Some(&list.to_string()),
    );
}
