//! The multi-node cluster of `hack/cluster.sh` (one network namespace per node, real kubelet, containerd
//! and kube-proxy in each) and what a user runs against it: `kubectl`, `helm`, images imported into every
//! node, and commands inside a node's namespace. The tests start it fresh (`down`, then `up`), since they
//! boot a pod network from zero; there is no skip: a cluster that cannot start fails the test with the
//! script's output.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::process::Command;

use crate::repo_root;

/// One node of the cluster, from `hack/cluster.sh env` (`NODE_<x>=name,ipv4,ipv6,state dir`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterNode {
    pub name: String,
    pub ipv4: String,
    pub ipv6: String,
    pub state_dir: PathBuf,
}

/// The running cluster: the admin kubeconfig, the tools, the facts of `hack/cluster.sh env`.
#[derive(Debug, Clone)]
pub struct Cluster {
    pub kubeconfig: PathBuf,
    pub kubectl: PathBuf,
    pub helm: PathBuf,
    pub facts: HashMap<String, String>,
}

/// `bash hack/SCRIPT ARGS` from the checkout with `env`, without cargo's variables (a `cargo build` under
/// them would not reuse a build made from a shell); its stdout, or a panic with its output.
pub fn script(path: &str, args: &[&str], env: &[(&str, &str)]) -> String {
    let mut cmd = std::process::Command::new("bash");
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy().into_owned();
        if key.starts_with("CARGO") || key.starts_with("RUSTC") || key == "LD_LIBRARY_PATH" {
            cmd.env_remove(key);
        }
    }
    let out = cmd
        .arg(repo_root().join(path))
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("running {path} {args:?}: {e}"));
    assert!(
        out.status.success(),
        "{path} {args:?} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `KEY=value` lines as a map (quotes around a value dropped).
pub fn assignments(text: &str) -> HashMap<String, String> {
    text.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.trim().trim_matches('"').to_string()))
        .collect()
}

/// Makes this process the only one using the machine's cluster until it exits: each test boots its own
/// cluster (`down`, then `up`), so two test processes at once (two checkouts, two test files run by hand)
/// would tear down each other's nodes mid-test. A `flock` that the kernel drops when the process ends,
/// so a crashed test never leaves it held.
pub fn hold_the_cluster() {
    static HELD: std::sync::OnceLock<std::fs::File> = std::sync::OnceLock::new();
    HELD.get_or_init(|| {
        let path = "/run/netcm-cluster-tests.lock";
        let file = std::fs::File::create(path).unwrap_or_else(|e| panic!("create {path}: {e}"));
        file.lock().unwrap_or_else(|e| panic!("flock {path}: {e}"));
        file
    });
}

impl Cluster {
    /// A new cluster of `nodes` nodes, none of them with a pod CIDR or a CNI config yet.
    pub fn fresh(nodes: usize) -> Cluster {
        hold_the_cluster();
        script("hack/cluster.sh", &["down"], &[]);
        Cluster::up(nodes, &[])
    }

    /// `hack/cluster.sh up` with `nodes` nodes and `env` (e.g. `CNI=flannel`); the caller has taken the
    /// cluster ([`hold_the_cluster`]) and brought any earlier one down.
    pub fn up(nodes: usize, env: &[(&str, &str)]) -> Cluster {
        let n = nodes.to_string();
        let mut env = env.to_vec();
        env.push(("NODES", &n));
        let out = script("hack/cluster.sh", &["up"], &env);
        let kubeconfig = assignments(&out)
            .remove("KUBECONFIG")
            .unwrap_or_else(|| panic!("hack/cluster.sh up printed no KUBECONFIG=…: {out:?}"));
        Cluster {
            kubeconfig: PathBuf::from(kubeconfig),
            kubectl: PathBuf::from(script("hack/controlplane.sh", &["bin", "kubectl"], &[]).trim()),
            helm: PathBuf::from(script("hack/verify-chart.sh", &["helm"], &[]).trim()),
            facts: assignments(&script("hack/cluster.sh", &["env"], &[])),
        }
    }

    /// `helm install netcm` as a user whose pod network comes from netcm would: the image loaded into the
    /// nodes, host network, the cluster's CIDRs (/24 and /64 per Node) and Service range, plus `extra`
    /// `--set` values; waits for the release.
    pub async fn install_netcm(&self, image: &str, extra: &[String]) {
        let (repository, tag) = image.rsplit_once(':').expect("IMAGE is repository:tag");
        let mut sets = vec![
            format!("image.repository={repository}"),
            format!("image.tag={tag}"),
            "image.pullPolicy=Never".to_string(),
            "hostNetwork=true".to_string(),
            format!(
                "allocator.clusterCIDR={}",
                self.fact("CLUSTER_CIDR").replace(',', "\\,")
            ),
            "allocator.nodeCIDRMaskSizeIPv4=24".to_string(),
            "allocator.nodeCIDRMaskSizeIPv6=64".to_string(),
            format!(
                "allocator.serviceClusterIPRange={}",
                self.fact("SERVICE_CIDR")
            ),
        ];
        sets.extend(extra.iter().cloned());
        let mut args = vec![
            "install",
            "netcm",
            "charts/netcm",
            "-n",
            "kube-system",
            "--wait",
            "--timeout",
            "180s",
        ];
        for set in &sets {
            args.extend(["--set", set.as_str()]);
        }
        self.helm(&args).await;
    }

    pub fn fact(&self, key: &str) -> &str {
        self.facts
            .get(key)
            .unwrap_or_else(|| panic!("hack/cluster.sh env has no {key}: {:?}", self.facts))
    }

    /// The nodes whose namespaces exist now.
    pub fn nodes(&self) -> Vec<ClusterNode> {
        let facts = assignments(&script("hack/cluster.sh", &["env"], &[]));
        let mut nodes: Vec<ClusterNode> = facts
            .iter()
            .filter(|(k, _)| k.starts_with("NODE_"))
            .filter_map(|(_, v)| {
                let f: Vec<&str> = v.split(',').collect();
                (f.len() == 4).then(|| ClusterNode {
                    name: f[0].into(),
                    ipv4: f[1].into(),
                    ipv6: f[2].into(),
                    state_dir: f[3].into(),
                })
            })
            .collect();
        nodes.sort_by_key(|n| n.name[5..].parse::<u32>().unwrap_or(0));
        nodes
    }

    /// Imports an OCI archive into every node's containerd (and every node added later).
    pub fn load(&self, tar: &str, image: &str) {
        script("hack/cluster.sh", &["load", tar, image], &[]);
    }

    /// One more node; its name.
    pub fn add_node(&self) -> String {
        let out = script("hack/cluster.sh", &["add-node"], &[]);
        assignments(&out)
            .remove("NODE")
            .unwrap_or_else(|| panic!("hack/cluster.sh add-node printed no NODE=…: {out:?}"))
    }

    /// Stops the node, deletes its namespace and its Node object.
    pub fn remove_node(&self, name: &str) {
        script("hack/cluster.sh", &["remove-node", name], &[]);
    }

    /// `kubectl ARGS`: (success, stdout, stderr).
    pub async fn try_kubectl(&self, args: &[&str]) -> (bool, String, String) {
        let out = Command::new(&self.kubectl)
            .arg(format!("--kubeconfig={}", self.kubeconfig.display()))
            .args(args)
            .stdin(Stdio::null())
            .output()
            .await
            .expect("run kubectl");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// `kubectl ARGS`: stdout, or a panic with stderr.
    pub async fn kubectl(&self, args: &[&str]) -> String {
        let (ok, out, err) = self.try_kubectl(args).await;
        assert!(ok, "kubectl {args:?} failed: {err}{out}");
        out
    }

    /// `kubectl apply -f -` of a manifest.
    pub async fn apply(&self, manifest: &str) {
        self.kubectl_stdin(&["apply", "-f", "-"], manifest).await;
    }

    /// `kubectl ARGS` with `stdin`: stdout, or a panic with stderr.
    pub async fn kubectl_stdin(&self, args: &[&str], stdin: &str) -> String {
        let mut child = Command::new(&self.kubectl)
            .arg(format!("--kubeconfig={}", self.kubeconfig.display()))
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run kubectl");
        use tokio::io::AsyncWriteExt;
        let mut pipe = child.stdin.take().expect("stdin");
        pipe.write_all(stdin.as_bytes()).await.expect("write");
        drop(pipe);
        crate::checked_stdout(
            &format!("kubectl {args:?}"),
            child.wait_with_output().await.expect("wait"),
        )
    }

    /// The control plane's audit log (every request, as the API server saw it).
    pub fn audit_log(&self) -> PathBuf {
        PathBuf::from(self.fact("STATE_DIR")).join("controlplane/audit.log")
    }

    /// `kubectl get ARGS -o json` as JSON.
    pub async fn get_json(&self, args: &[&str]) -> Value {
        let mut a = vec!["get"];
        a.extend_from_slice(args);
        a.extend_from_slice(&["-o", "json"]);
        serde_json::from_str(&self.kubectl(&a).await).expect("kubectl -o json")
    }

    /// `helm ARGS` in the checkout (so `charts/netcm` resolves); stdout, or a panic with the cluster's state.
    pub async fn helm(&self, args: &[&str]) -> String {
        let out = Command::new(&self.helm)
            .current_dir(repo_root())
            .arg(format!("--kubeconfig={}", self.kubeconfig.display()))
            .args(args)
            .stdin(Stdio::null())
            .output()
            .await
            .expect("run helm");
        if !out.status.success() {
            panic!(
                "helm {args:?} failed ({}):\n{}{}\n{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr),
                self.diagnostics().await
            );
        }
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// What a user looks at when something hangs: nodes and pods.
    pub async fn diagnostics(&self) -> String {
        let mut text = String::new();
        for args in [
            &["get", "nodes", "-o", "wide"][..],
            &["get", "pods", "-A", "-o", "wide"][..],
        ] {
            let (_, out, err) = self.try_kubectl(args).await;
            text.push_str(&format!("$ kubectl {}\n{out}{err}\n", args.join(" ")));
        }
        text
    }
}

/// `CMD ARGS` inside the node's network namespace (`nsenter --net`): (success, stdout).
pub async fn in_node(node: &str, args: &[&str]) -> (bool, String) {
    let out = Command::new("nsenter")
        .arg(format!("--net=/run/netns/{node}"))
        .arg("--")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .await
        .expect("run nsenter");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// A JSON listing (`ip -j`, `bridge -j`) of a command inside the node's network namespace; empty when
/// the command fails, e.g. for a device that does not exist yet.
pub async fn in_node_json(node: &str, args: &[&str]) -> Vec<serde_json::Value> {
    let (ok, out) = in_node(node, args).await;
    if !ok {
        return Vec::new();
    }
    serde_json::from_str(&out).unwrap_or_default()
}

/// An HTTP(S) GET with curl, from the host or (`netns`) inside a node's network namespace, where its
/// kube-proxy serves ClusterIPs: (status, body); status 0 when nothing answered.
pub async fn curl(url: &str, bearer: Option<&str>, netns: Option<&str>) -> (u16, String) {
    let mut cmd = match netns {
        Some(node) => {
            let mut c = Command::new("nsenter");
            c.arg(format!("--net=/run/netns/{node}"))
                .args(["--", "curl"]);
            c
        }
        None => Command::new("curl"),
    };
    cmd.args(["-sk", "--max-time", "5", "-w", "\n%{http_code}"]);
    if let Some(t) = bearer {
        cmd.arg("-H").arg(format!("Authorization: Bearer {t}"));
    }
    let out = cmd
        .arg(url)
        .stdin(Stdio::null())
        .output()
        .await
        .expect("run curl (hack/install-prereqs.sh installs it)");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", text.as_str()));
    (code.trim().parse().unwrap_or(0), body.to_string())
}

/// Polls `check` until it gives a value, or panics with `what` after `timeout`.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(Instant::now() < deadline, "{what}: not within {timeout:?}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// An image built by `hack/image.sh TARGET` (or given as `NETCM_E2E_IMAGE`/`NETCM_E2E_IMAGE_TAR` for
/// netcm's, as `hack/test.sh` builds it in a step of its own): (image, tar).
pub fn built_image(target: &str) -> (String, String) {
    if target == "build" {
        if let (Ok(image), Ok(tar)) = (
            std::env::var("NETCM_E2E_IMAGE"),
            std::env::var("NETCM_E2E_IMAGE_TAR"),
        ) {
            if !image.is_empty() && !tar.is_empty() {
                return (image, tar);
            }
        }
    }
    let built = assignments(&script("hack/image.sh", &[target], &[]));
    (
        built
            .get("IMAGE")
            .expect("hack/image.sh printed IMAGE=")
            .clone(),
        built
            .get("TAR")
            .expect("hack/image.sh printed TAR=")
            .clone(),
    )
}

/// `leader_election_master_status{name="netcm"}` of the netcm process at `ip`, from its plain metrics
/// port (10271), scraped from the host.
pub async fn master_status(ip: &str) -> Option<f64> {
    let (code, body) = curl(&format!("http://{ip}:10271/metrics"), None, None).await;
    if code != 200 {
        return None;
    }
    let prefix = format!("{} ", crate::netcm::MASTER_STATUS);
    body.lines()
        .find_map(|l| l.strip_prefix(&prefix).and_then(|v| v.trim().parse().ok()))
}
