//! The real node of `hack/node.sh` (kubelet, containerd, kube-proxy, a control plane of its own) and what
//! a user runs against it: netcm's image built by `hack/image.sh` and imported into the node, `helm` and
//! `kubectl` as commands, curl for scrapes. Started once per test run (or reused from
//! `NETCM_E2E_NODE_KUBECONFIG`, as `hack/test.sh` does); never skipped: a node that cannot start fails the
//! test with the script's output.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;

use tokio::process::Command;

use crate::repo_root;

/// The running node: its kubeconfig (admin), facts from `hack/node.sh env`, the audit log.
#[derive(Debug, Clone)]
pub struct RealNode {
    pub kubeconfig: PathBuf,
    pub audit_log: PathBuf,
    /// `hack/node.sh env`: NODE_NAME, NODE_ADDRESS, POD_RANGE, SERVICE_CIDR, FREE_CLUSTER_CIDR, STATE_DIR…
    pub facts: HashMap<String, String>,
    /// kubectl, built with the control plane.
    pub kubectl: PathBuf,
    /// helm, built by hack/verify-chart.sh.
    pub helm: PathBuf,
}

impl RealNode {
    /// A fact from `hack/node.sh env`.
    pub fn fact(&self, key: &str) -> &str {
        self.facts
            .get(key)
            .unwrap_or_else(|| panic!("hack/node.sh env has no {key}: {:?}", self.facts))
    }

    /// `kubectl --kubeconfig <node> ARGS`: its stdout; panics with stderr on failure.
    pub async fn kubectl(&self, args: &[&str]) -> String {
        let mut cmd = Command::new(&self.kubectl);
        cmd.arg(format!("--kubeconfig={}", self.kubeconfig.display()))
            .args(args);
        run(cmd, None).await
    }

    /// `kubectl … ARGS` with `stdin`.
    pub async fn kubectl_stdin(&self, args: &[&str], stdin: &str) -> String {
        let mut cmd = Command::new(&self.kubectl);
        cmd.arg(format!("--kubeconfig={}", self.kubeconfig.display()))
            .args(args);
        run(cmd, Some(stdin)).await
    }

    /// `helm --kubeconfig <node> ARGS` in the checkout (so `charts/netcm` resolves): its stdout; on failure
    /// a panic with helm's output and the cluster's state (pods, events, the kubelet's last lines).
    pub async fn helm(&self, args: &[String]) -> String {
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

    /// A Node as it first joins (no pod CIDR, no annotations): `hack/node.sh reregister`.
    pub async fn reregister(&self) {
        let mut cmd = Command::new("bash");
        cmd.arg(repo_root().join("hack/node.sh")).arg("reregister");
        run(cmd, None).await;
    }

    /// What a user looks at when an install hangs: nodes, pods, recent events, the kubelet's log tail.
    pub async fn diagnostics(&self) -> String {
        let mut text = String::new();
        for args in [
            vec!["get", "nodes", "-o", "wide"],
            vec!["get", "pods", "-A", "-o", "wide"],
            vec!["get", "events", "-A", "--sort-by=.lastTimestamp"],
        ] {
            let out = Command::new(&self.kubectl)
                .arg(format!("--kubeconfig={}", self.kubeconfig.display()))
                .args(&args)
                .output()
                .await;
            if let Ok(o) = out {
                let body = String::from_utf8_lossy(&o.stdout);
                let lines: Vec<&str> = body.lines().collect();
                let tail = &lines[lines.len().saturating_sub(25)..];
                text.push_str(&format!(
                    "$ kubectl {}\n{}\n",
                    args.join(" "),
                    tail.join("\n")
                ));
            }
        }
        let kubelet = Path::new(self.fact("STATE_DIR")).join("kubelet.log");
        let log = std::fs::read_to_string(&kubelet).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        text.push_str(&format!(
            "$ tail {}\n{}\n",
            kubelet.display(),
            lines[lines.len().saturating_sub(15)..].join("\n")
        ));
        text
    }
}

/// Runs a command to completion: stdout, or a panic naming the command with its output.
pub async fn run(mut cmd: Command, stdin: Option<&str>) -> String {
    let what = format!("{:?}", cmd.as_std());
    cmd.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("running {what}: {e}"));
    if let Some(input) = stdin {
        use tokio::io::AsyncWriteExt;
        let mut pipe = child.stdin.take().expect("stdin");
        pipe.write_all(input.as_bytes()).await.expect("write stdin");
        drop(pipe);
    }
    crate::checked_stdout(&what, child.wait_with_output().await.expect("wait"))
}

fn script(path: &str, args: &[&str]) -> String {
    let mut cmd = std::process::Command::new("bash");
    // Without the variables cargo sets for a test process: a `cargo build --release` under them would
    // not reuse the release build made from a shell (build scripts rerun), and the next one from a shell
    // would not reuse this one.
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy().into_owned();
        if key.starts_with("CARGO") || key.starts_with("RUSTC") || key == "LD_LIBRARY_PATH" {
            cmd.env_remove(key);
        }
    }
    let out = cmd
        .arg(repo_root().join(path))
        .args(args)
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

fn assignments(text: &str) -> HashMap<String, String> {
    text.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}

/// The node for this test run: `NETCM_E2E_NODE_KUBECONFIG`, or `hack/node.sh up` (idempotent).
pub fn real_node() -> &'static RealNode {
    static NODE: OnceLock<RealNode> = OnceLock::new();
    NODE.get_or_init(|| {
        let kubeconfig = match std::env::var("NETCM_E2E_NODE_KUBECONFIG") {
            Ok(k) if !k.is_empty() => PathBuf::from(k),
            _ => {
                let out = script("hack/node.sh", &["up"]);
                let kc = assignments(&out)
                    .remove("KUBECONFIG")
                    .unwrap_or_else(|| panic!("hack/node.sh up printed no KUBECONFIG=…: {out:?}"));
                PathBuf::from(kc)
            }
        };
        let facts = assignments(&script("hack/node.sh", &["env"]));
        let audit_log = Path::new(&facts["STATE_DIR"]).join("controlplane/audit.log");
        let kubectl = PathBuf::from(script("hack/controlplane.sh", &["bin", "kubectl"]).trim());
        let helm = PathBuf::from(script("hack/verify-chart.sh", &["helm"]).trim());
        RealNode {
            kubeconfig,
            audit_log,
            facts,
            kubectl,
            helm,
        }
    })
}

/// netcm's image (`hack/image.sh build`, the release binary), imported into the node's containerd:
/// (repository, tag). `hack/test.sh` builds and checks it in a step of its own and passes it as
/// `NETCM_E2E_IMAGE` and `NETCM_E2E_IMAGE_TAR`.
pub fn netcm_image() -> &'static (String, String) {
    static IMAGE: OnceLock<(String, String)> = OnceLock::new();
    IMAGE.get_or_init(|| {
        real_node();
        let built = match (
            std::env::var("NETCM_E2E_IMAGE"),
            std::env::var("NETCM_E2E_IMAGE_TAR"),
        ) {
            (Ok(image), Ok(tar)) if !image.is_empty() && !tar.is_empty() => {
                HashMap::from([("IMAGE".to_string(), image), ("TAR".to_string(), tar)])
            }
            _ => {
                let built = assignments(&script("hack/image.sh", &["build"]));
                // The image as built agrees with the Dockerfile (entrypoint, user, ports, binary path).
                script("hack/image.sh", &["check"]);
                built
            }
        };
        let image = built
            .get("IMAGE")
            .expect("hack/image.sh build printed IMAGE=");
        let tar = built.get("TAR").expect("hack/image.sh build printed TAR=");
        script("hack/node.sh", &["load", tar, image]);
        let (repository, tag) = image.rsplit_once(':').expect("IMAGE is repository:tag");
        (repository.to_string(), tag.to_string())
    })
}

/// An HTTP(S) GET with curl from the host (which is on the pod network): (status, body).
pub async fn curl(url: &str, bearer: Option<&str>) -> (u16, String) {
    let mut cmd = Command::new("curl");
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
