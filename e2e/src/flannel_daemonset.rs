//! flannel as a user installs it beside netcm on the multi-node cluster of `hack/cluster.sh`:
//! `e2e/testdata/flannel/kube-flannel.yaml` (flanneld v0.28 in kube-subnet-manager mode as a DaemonSet,
//! flannel's CNI plugin installed by its init container, RBAC) rendered with the image of
//! `hack/image.sh flanneld`, the cluster CIDRs netcm allocates from and a backend, then applied with
//! kubectl. netcm hands out the Nodes' pod CIDRs; flanneld on each node reads its Node's, publishes its
//! lease, programs routes (host-gw) or its VXLAN device (vxlan) and writes the subnet.env its CNI plugin
//! reads. There is no fallback: a missing image or a failed apply panics with the tool's output.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use ipnet::IpNet;

use crate::commands::checked_stdout;
use crate::repo_root;

/// The manifest, with its placeholders (the file's header says what each is).
pub const MANIFEST: &str = include_str!("../testdata/flannel/kube-flannel.yaml");

/// flanneld's backend: how packets reach another node's pods.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// A kernel route per peer's pod CIDR via the peer's node address (nodes on one L2 segment).
    HostGw,
    /// VXLAN devices `flannel.1` / `flannel-v6.1`, with a route, neighbour and FDB entry per peer.
    Vxlan,
}

impl Backend {
    pub fn name(self) -> &'static str {
        match self {
            Backend::HostGw => "host-gw",
            Backend::Vxlan => "vxlan",
        }
    }
}

/// What differs between installs: the rest of the manifest is what a user applies.
#[derive(Debug, Clone)]
pub struct Flannel {
    /// `localhost/flanneld:…`, imported into every node's containerd.
    pub image: String,
    /// The host directory holding one directory per node, named after the Node (`hack/cluster.sh env`'s
    /// `STATE_DIR/nodes`).
    pub nodes_dir: PathBuf,
    /// netcm's `--cluster-cidr`: at most one per family (flannel's `Network` and `IPv6Network`).
    pub cluster_cidrs: Vec<IpNet>,
    pub backend: Backend,
}

/// `hack/image.sh flanneld`: (image, OCI archive).
pub fn build_image() -> (String, String) {
    let mut cmd = Command::new("bash");
    // A cargo build inside the script (none today) must not inherit the test's cargo variables.
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy().into_owned();
        if key.starts_with("CARGO") || key.starts_with("RUSTC") {
            cmd.env_remove(key);
        }
    }
    let out = checked_stdout(
        "hack/image.sh flanneld",
        cmd.arg(repo_root().join("hack/image.sh"))
            .arg("flanneld")
            .stdin(Stdio::null())
            .output()
            .expect("run hack/image.sh flanneld"),
    );
    let value = |key: &str| {
        out.lines()
            .find_map(|l| l.strip_prefix(key))
            .unwrap_or_else(|| panic!("hack/image.sh flanneld printed no {key}: {out}"))
            .to_string()
    };
    (value("IMAGE="), value("TAR="))
}

impl Flannel {
    /// flannel's net-conf.json: the cluster CIDRs (flanneld in kube-subnet-manager mode takes each Node's
    /// pod CIDRs from its spec, and they must lie inside these) and the backend.
    pub fn net_conf(&self) -> String {
        let v4 = self.cluster_cidrs.iter().find(|c| c.addr().is_ipv4());
        let v6 = self.cluster_cidrs.iter().find(|c| c.addr().is_ipv6());
        let mut conf = serde_json::Map::new();
        conf.insert("EnableIPv4".into(), v4.is_some().into());
        if let Some(v4) = v4 {
            conf.insert("Network".into(), v4.to_string().into());
        }
        conf.insert("EnableIPv6".into(), v6.is_some().into());
        if let Some(v6) = v6 {
            conf.insert("IPv6Network".into(), v6.to_string().into());
        }
        conf.insert(
            "Backend".into(),
            serde_json::json!({"Type": self.backend.name()}),
        );
        serde_json::to_string_pretty(&serde_json::Value::Object(conf)).expect("JSON")
    }

    /// The manifest to apply.
    pub fn manifest(&self) -> String {
        let nodes_dir = self.nodes_dir.to_str().expect("a UTF-8 path");
        assert!(
            self.nodes_dir.is_absolute() && !nodes_dir.contains(char::is_whitespace),
            "the nodes' directory must be an absolute path without spaces: {nodes_dir:?}"
        );
        // The ConfigMap's `net-conf.json: |` block: every line indented under the key.
        let net_conf: String = self
            .net_conf()
            .lines()
            .map(|l| format!("    {l}\n"))
            .collect();
        MANIFEST
            .replace("__NET_CONF__\n", &net_conf)
            .replace("__IMAGE__", &self.image)
            .replace("__NODES_DIR__", nodes_dir)
    }

    /// `kubectl apply` of the manifest.
    pub fn apply(&self, kubectl: &Path, kubeconfig: &Path) {
        let mut child = Command::new(kubectl)
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .args(["apply", "-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run kubectl apply");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(self.manifest().as_bytes())
            .expect("write the manifest");
        checked_stdout(
            "kubectl apply -f kube-flannel.yaml",
            child.wait_with_output().expect("kubectl apply"),
        );
    }
}

/// `kubectl rollout status` of the DaemonSet: every scheduled flanneld pod ready.
pub fn wait_rolled_out(kubectl: &Path, kubeconfig: &Path, timeout: Duration) {
    checked_stdout(
        "kubectl rollout status daemonset/kube-flannel-ds",
        Command::new(kubectl)
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .args([
                "-n",
                "kube-flannel",
                "rollout",
                "status",
                "daemonset/kube-flannel-ds",
                &format!("--timeout={}s", timeout.as_secs()),
            ])
            .stdin(Stdio::null())
            .output()
            .expect("run kubectl rollout status"),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flannel(backend: Backend, cidrs: &str) -> Flannel {
        Flannel {
            image: "localhost/flanneld:v0.28.10-abc".into(),
            nodes_dir: "/state/nodes".into(),
            cluster_cidrs: cidrs.split(',').map(|c| c.parse().unwrap()).collect(),
            backend,
        }
    }

    #[test]
    fn dual_stack_net_conf_names_both_networks_and_the_backend() {
        let conf: serde_json::Value = serde_json::from_str(
            &flannel(Backend::Vxlan, "198.19.128.0/17,fd00:198:19:1000::/56").net_conf(),
        )
        .unwrap();
        assert_eq!(
            conf,
            serde_json::json!({"EnableIPv4": true, "Network": "198.19.128.0/17", "EnableIPv6": true,
                "IPv6Network": "fd00:198:19:1000::/56", "Backend": {"Type": "vxlan"}})
        );
    }

    #[test]
    fn single_stack_ipv6_turns_ipv4_off() {
        let conf: serde_json::Value =
            serde_json::from_str(&flannel(Backend::HostGw, "fd00::/56").net_conf()).unwrap();
        assert_eq!(conf["EnableIPv4"], false);
        assert_eq!(conf.get("Network"), None);
        assert_eq!(conf["Backend"]["Type"], "host-gw");
    }

    #[test]
    fn the_manifest_has_every_placeholder_filled_and_the_net_conf_inside_its_config_map() {
        let text = flannel(Backend::HostGw, "198.19.128.0/17").manifest();
        // The header's comments name the placeholders; nothing else may still hold one.
        let body: String = text.lines().filter(|l| !l.starts_with('#')).collect();
        for placeholder in ["__IMAGE__", "__NODES_DIR__", "__NET_CONF__"] {
            assert!(
                !body.contains(placeholder),
                "{placeholder} left in:\n{text}"
            );
        }
        // The per-node placeholder is the init container's to fill, on each node.
        assert!(text.contains("\"subnetFile\": \"__NODE_DIR__/flannel/subnet.env\""));
        assert!(text.contains("\n      \"Network\": \"198.19.128.0/17\""));
        assert!(text.contains("      - /state/nodes/$(NODE_NAME)\n"));
        assert!(text.contains("hostPath: {path: /state/nodes, type: Directory}"));
        assert_eq!(
            text.matches("image: localhost/flanneld:v0.28.10-abc")
                .count(),
            2
        );
    }
}
