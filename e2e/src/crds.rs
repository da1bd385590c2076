//! netcm's custom resources in the test cluster: the chart's CRDs installed, and the PodCIDRClaims and
//! ClusterCIDRs APIs.

use std::path::Path;
use std::process::Command;

use kube::api::Api;

use crate::{repo_root, tool};

/// The chart's CRDs (`charts/netcm/crds/`), applied as `helm install` would before netcm starts.
pub fn install_crds(kubeconfig: &Path) {
    apply_crds(kubeconfig, &repo_root().join("charts/netcm/crds"));
}

/// The CRDs in `dir`, applied server-side (the upgrade step docs/helm.md documents); returns once they are
/// served.
pub fn apply_crds(kubeconfig: &Path, dir: &Path) {
    let kubectl = tool("kubectl");
    for args in [
        // Forced: the test cluster is the tests' own, and a control plane kept from a run of an older
        // checkout has its CRDs owned by another field manager (the dashboard check's).
        vec![
            "apply",
            "--server-side",
            "--force-conflicts",
            "--field-manager=netcm-e2e",
            "-f",
        ],
        vec!["wait", "--for=condition=Established", "--timeout=60s", "-f"],
    ] {
        let out = Command::new(&kubectl)
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .args(&args)
            .arg(dir)
            .output()
            .unwrap_or_else(|e| panic!("running kubectl {args:?}: {e}"));
        assert!(
            out.status.success(),
            "kubectl {args:?} {} failed:\n{}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Puts the chart's CRDs back however a test that changes or deletes them ends: the tests after it need
/// them.
pub struct ReinstallCrds(pub std::path::PathBuf);

impl Drop for ReinstallCrds {
    fn drop(&mut self) {
        install_crds(&self.0);
    }
}

/// The PodCIDRClaims API (cluster-scoped).
pub fn pod_cidr_claims(client: &kube::Client) -> Api<kube::api::DynamicObject> {
    let gvk = kube::api::GroupVersionKind::gvk("ipam.netcm.io", "v1alpha1", "PodCIDRClaim");
    let resource = kube::api::ApiResource::from_gvk_with_plural(&gvk, "podcidrclaims");
    Api::all_with(client.clone(), &resource)
}

/// The CIDR of every PodCIDRClaim, sorted.
pub async fn claimed_cidrs(client: &kube::Client) -> Vec<String> {
    let list = pod_cidr_claims(client)
        .list(&kube::api::ListParams::default())
        .await
        .expect("list claims");
    let mut out: Vec<String> = list
        .items
        .iter()
        .map(|o| {
            o.data["spec"]["cidr"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .collect();
    out.sort();
    out
}

/// The ClusterCIDRs API (`networking.x-k8s.io/v1`, cluster-scoped).
pub fn cluster_cidrs(client: &kube::Client) -> Api<kube::api::DynamicObject> {
    let gvk = kube::api::GroupVersionKind::gvk("networking.x-k8s.io", "v1", "ClusterCIDR");
    let resource = kube::api::ApiResource::from_gvk_with_plural(&gvk, "clustercidrs");
    Api::all_with(client.clone(), &resource)
}

/// The PodCIDRMigrations API (`ipam.netcm.io/v1alpha1`, cluster-scoped).
pub fn pod_cidr_migrations(client: &kube::Client) -> Api<kube::api::DynamicObject> {
    let gvk = kube::api::GroupVersionKind::gvk("ipam.netcm.io", "v1alpha1", "PodCIDRMigration");
    let resource = kube::api::ApiResource::from_gvk_with_plural(&gvk, "podcidrmigrations");
    Api::all_with(client.clone(), &resource)
}
