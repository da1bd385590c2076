//! The e2e harness: a real kube-apiserver + etcd (started once by `hack/controlplane.sh up`, or reused
//! from `NETCM_E2E_KUBECONFIG`), a clean cluster per test, Node fixtures, waits with clear failure
//! messages, the real `netcm` binary as a child process (its log shown when a test fails), the audit log,
//! and ServiceAccount tokens for RBAC tests.
//!
//! Tests that touch the cluster hold an exclusive file lock for their whole run, so no two tests (in any
//! test binary) race on cluster-scoped Nodes. There is no skip: without a control plane a test fails.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

pub mod apiservers;
pub mod audit;
pub mod cgroup;
pub mod chart;
pub mod flannel;
pub mod flanneld;
pub mod netcm;
pub mod netns;
pub mod nodes;
pub mod realnode;
pub mod route_lab;
pub mod takeover;
pub mod webhook;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Node};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};

pub use netcm::Netcm;

/// The checkout's root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("e2e/ has a parent")
        .to_path_buf()
}

/// The running control plane: kubeconfig and audit log paths.
#[derive(Debug, Clone)]
pub struct ControlPlane {
    pub kubeconfig: PathBuf,
    pub audit_log: PathBuf,
}

fn controlplane_sh(args: &[&str]) -> String {
    command_output(
        Command::new("bash")
            .arg(repo_root().join("hack/controlplane.sh"))
            .args(args),
        None,
    )
}

/// The control plane for this test run: started once (idempotently), never skipped.
pub fn control_plane() -> &'static ControlPlane {
    static CP: OnceLock<ControlPlane> = OnceLock::new();
    CP.get_or_init(|| {
        let kubeconfig = match std::env::var("NETCM_E2E_KUBECONFIG") {
            Ok(k) if !k.is_empty() => PathBuf::from(k),
            _ => {
                let out = controlplane_sh(&["up"]);
                let last = out.lines().last().unwrap_or_default();
                PathBuf::from(last.strip_prefix("KUBECONFIG=").unwrap_or_else(|| {
                    panic!("hack/controlplane.sh up did not print KUBECONFIG=…; got {out:?}")
                }))
            }
        };
        let audit_log = PathBuf::from(controlplane_sh(&["audit"]).trim());
        install_crds(&kubeconfig);
        ControlPlane {
            kubeconfig,
            audit_log,
        }
    })
}

/// The chart's CRDs (`charts/netcm/crds/`), applied as `helm install` would before netcm starts.
pub fn install_crds(kubeconfig: &Path) {
    let kubectl = tool("kubectl");
    let crds = repo_root().join("charts/netcm/crds");
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
            .arg(&crds)
            .output()
            .unwrap_or_else(|e| panic!("running kubectl {args:?}: {e}"));
        assert!(
            out.status.success(),
            "kubectl {args:?} {} failed:\n{}",
            crds.display(),
            String::from_utf8_lossy(&out.stderr)
        );
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

/// Stops and starts kube-apiserver, keeping etcd's data.
pub fn restart_apiserver() {
    controlplane_sh(&["restart-apiserver"]);
}

/// Gives kube-apiserver a new serving key and certificate from the same CA and restarts it, so every
/// client connects again and meets the new certificate; returns the new certificate's serial.
pub fn rotate_apiserver_serving_cert() -> String {
    controlplane_sh(&["rotate-serving-cert"])
}

/// Stops kube-apiserver (start it again with [`start_apiserver`]).
pub fn stop_apiserver() {
    controlplane_sh(&["stop-apiserver"]);
}

/// Starts a stopped kube-apiserver with the same flags and port.
pub fn start_apiserver() {
    controlplane_sh(&["start-apiserver"]);
}

/// The process id of this checkout's kube-apiserver.
pub fn apiserver_pid() -> u32 {
    let env = controlplane_sh(&["env"]);
    let state = env
        .lines()
        .find_map(|l| l.strip_prefix("STATE_DIR="))
        .expect("STATE_DIR in hack/controlplane.sh env");
    std::fs::read_to_string(Path::new(state).join("kube-apiserver.pid"))
        .expect("kube-apiserver.pid")
        .trim()
        .parse()
        .expect("kube-apiserver.pid holds a pid")
}

/// Freezes kube-apiserver with SIGSTOP (connections are accepted by the kernel, nothing is answered)
/// until dropped, which sends SIGCONT — also when the test fails.
pub struct FrozenApiserver {
    pid: String,
}

impl FrozenApiserver {
    /// Sends SIGSTOP to this checkout's kube-apiserver.
    pub fn freeze() -> FrozenApiserver {
        let pid = apiserver_pid().to_string();
        kill(&pid, "STOP");
        FrozenApiserver { pid }
    }
}

impl Drop for FrozenApiserver {
    fn drop(&mut self) {
        kill(&self.pid, "CONT");
    }
}

fn kill(pid: &str, sig: &str) {
    let status = Command::new("kill")
        .args(["-s", sig, pid])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -s {sig} {pid} failed");
}

/// Runs `cmd` to completion with `stdin` as its input: its stdout, or a panic naming the command with
/// its output.
pub fn command_output(cmd: &mut Command, stdin: Option<&str>) -> String {
    let what = format!("{cmd:?}");
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("running {what}: {e}"));
    let mut pipe = child.stdin.take().expect("stdin");
    pipe.write_all(stdin.unwrap_or_default().as_bytes())
        .expect("write stdin");
    drop(pipe);
    checked_stdout(&what, child.wait_with_output().expect("wait"))
}

/// A finished command's stdout, or a panic naming the command (`what`) with its status and output.
pub fn checked_stdout(what: &str, out: std::process::Output) -> String {
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// kubectl against `kubeconfig`.
pub fn kubectl(kubeconfig: &Path) -> Command {
    let mut cmd = Command::new(tool("kubectl"));
    cmd.env("KUBECONFIG", kubeconfig);
    cmd
}

/// A path of a built tool (kubectl, kube-controller-manager, …).
pub fn tool(name: &str) -> PathBuf {
    PathBuf::from(controlplane_sh(&["bin", name]).trim())
}

/// Builds a client for a kubeconfig file.
pub async fn client_for(kubeconfig: &Path) -> kube::Client {
    let kc = Kubeconfig::read_from(kubeconfig).expect("read kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .expect("kubeconfig config");
    kube::Client::try_from(config).expect("client")
}

/// One test's hold on the cluster: exclusive, with a clean state.
pub struct TestEnv {
    pub cp: ControlPlane,
    pub client: kube::Client,
    _lock: std::fs::File,
}

/// The namespace netcm's Lease lives in during tests.
pub const LEASE_NAMESPACE: &str = "kube-system";

/// The name of netcm's Lease (`--leader-elect-resource-name`'s default).
pub const LEASE_NAME: &str = "netcm";

impl TestEnv {
    /// Takes the cluster lock and removes every Node, Lease in kube-system, Event in default and PodCIDRClaim.
    pub async fn new() -> TestEnv {
        let started = Instant::now();
        let cp = control_plane().clone();
        let lock_path = cp.kubeconfig.with_file_name("e2e.lock");
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .expect("open e2e lock");
        let lock = tokio::task::spawn_blocking(move || {
            lock.lock().expect("take e2e lock");
            lock
        })
        .await
        .expect("lock task");
        let client = client_for(&cp.kubeconfig).await;
        let env = TestEnv {
            cp,
            client,
            _lock: lock,
        };
        let locked = started.elapsed();
        env.wait_api(Duration::from_secs(60)).await;
        env.clean().await;
        eprintln!(
            "[e2e] cluster locked after {locked:?}, clean after {:?}",
            started.elapsed()
        );
        env
    }

    async fn wait_api(&self, timeout: Duration) {
        let start = Instant::now();
        loop {
            match self.client.apiserver_version().await {
                Ok(_) => return,
                Err(e) if start.elapsed() > timeout => {
                    panic!("API server not reachable after {timeout:?}: {e}")
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    }

    /// Deletes every Node, Lease (kube-system), Event (default), PodCIDRClaim, ClusterCIDR and harness webhook, and
    /// waits until the Nodes and Leases are gone.
    pub async fn clean(&self) {
        // First the webhooks a failed test may have left, so they cannot hold the deletes below.
        let webhooks: Api<ValidatingWebhookConfiguration> = Api::all(self.client.clone());
        webhooks
            .delete_collection(
                &DeleteParams::default(),
                &ListParams::default().labels(&format!("{}=true", webhook::HARNESS_LABEL)),
            )
            .await
            .expect("delete harness webhooks");
        let nodes: Api<Node> = Api::all(self.client.clone());
        let dp = DeleteParams {
            grace_period_seconds: Some(0),
            ..Default::default()
        };
        nodes
            .delete_collection(&dp, &ListParams::default())
            .await
            .expect("delete nodes");
        // Nodes a test left held by a finalizer (a deleting Node is a fixture too) go with it.
        for node in nodes
            .list(&ListParams::default())
            .await
            .expect("list Nodes")
        {
            if node
                .metadata
                .finalizers
                .as_ref()
                .is_some_and(|f| !f.is_empty())
            {
                let name = node.metadata.name.clone().unwrap_or_default();
                let strip = serde_json::json!({"metadata": {"finalizers": null}});
                let _ = nodes
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&strip))
                    .await;
            }
        }
        let leases: Api<Lease> = Api::namespaced(self.client.clone(), LEASE_NAMESPACE);
        // Not kube-apiserver's own identity Leases: a (re)started API server re-creates them within
        // seconds, so waiting for them to be gone raced the API server and flaked.
        let not_apiserver = ListParams::default().labels("!apiserver.kubernetes.io/identity");
        leases
            .delete_collection(&dp, &not_apiserver)
            .await
            .expect("delete leases");
        let events: Api<Event> = Api::namespaced(self.client.clone(), "default");
        events
            .delete_collection(&dp, &ListParams::default())
            .await
            .expect("delete events");
        pod_cidr_claims(&self.client)
            .delete_collection(&dp, &ListParams::default())
            .await
            .expect("delete PodCIDRClaims");
        // ClusterCIDRs a test left: their finalizer would hold them with no netcm to release it.
        let pools = cluster_cidrs(&self.client);
        for pool in pools
            .list(&ListParams::default())
            .await
            .expect("list ClusterCIDRs")
        {
            let name = pool.metadata.name.clone().unwrap_or_default();
            let strip = serde_json::json!({"metadata": {"finalizers": null}});
            let _ = pools
                .patch(
                    &name,
                    &kube::api::PatchParams::default(),
                    &kube::api::Patch::Merge(&strip),
                )
                .await;
            let _ = pools.delete(&name, &dp).await;
        }
        wait_for(
            "nodes and leases to be deleted",
            Duration::from_secs(60),
            || async {
                let n = nodes.list(&ListParams::default()).await.ok()?.items.len();
                let l = leases.list(&not_apiserver).await.ok()?.items.len();
                (n == 0 && l == 0).then_some(())
            },
        )
        .await;
    }

    /// Creates a namespace if it does not exist.
    pub async fn ensure_namespace(&self, name: &str) {
        let api: Api<Namespace> = Api::all(self.client.clone());
        let ns = Namespace {
            metadata: kube::api::ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            ..Default::default()
        };
        match api.create(&PostParams::default(), &ns).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => panic!("create namespace {name}: {e}"),
        }
    }

    /// Creates a ServiceAccount (if missing), a ClusterRole `role` with `rules`, and binds them.
    pub async fn bind_cluster_role(
        &self,
        role: &str,
        rules: Vec<k8s_openapi::api::rbac::v1::PolicyRule>,
        namespace: &str,
        service_account: &str,
    ) {
        use k8s_openapi::api::core::v1::ServiceAccount;
        use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, RoleRef, Subject};
        self.ensure_namespace(namespace).await;
        let meta = |name: &str| kube::api::ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        };
        let created = |r: Result<(), kube::Error>, what: &str| match r {
            Ok(()) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => panic!("create {what}: {e}"),
        };
        let sas: Api<ServiceAccount> = Api::namespaced(self.client.clone(), namespace);
        let sa = ServiceAccount {
            metadata: meta(service_account),
            ..Default::default()
        };
        created(
            sas.create(&PostParams::default(), &sa).await.map(drop),
            "service account",
        );
        let roles: Api<ClusterRole> = Api::all(self.client.clone());
        let cr = ClusterRole {
            metadata: meta(role),
            rules: Some(rules),
            ..Default::default()
        };
        created(
            roles.create(&PostParams::default(), &cr).await.map(drop),
            "cluster role",
        );
        let bindings: Api<ClusterRoleBinding> = Api::all(self.client.clone());
        let binding = ClusterRoleBinding {
            metadata: meta(&format!("{role}-{service_account}")),
            role_ref: RoleRef {
                api_group: "rbac.authorization.k8s.io".into(),
                kind: "ClusterRole".into(),
                name: role.into(),
            },
            subjects: Some(vec![Subject {
                kind: "ServiceAccount".into(),
                name: service_account.into(),
                namespace: Some(namespace.into()),
                ..Default::default()
            }]),
        };
        created(
            bindings
                .create(&PostParams::default(), &binding)
                .await
                .map(drop),
            "binding",
        );
    }

    /// Events recorded about a Node, as (type, reason, note).
    pub async fn node_events(&self, node: &str) -> Vec<(String, String, String)> {
        let events: Api<Event> = Api::namespaced(self.client.clone(), "default");
        events
            .list(&ListParams::default())
            .await
            .expect("list events")
            .items
            .into_iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(node))
            .map(|e| {
                (
                    e.type_.unwrap_or_default(),
                    e.reason.unwrap_or_default(),
                    e.note.unwrap_or_default(),
                )
            })
            .collect()
    }
}

/// Polls `check` every 100 ms until it returns `Some`, or panics naming `what` after `timeout`.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = check().await {
            return v;
        }
        if start.elapsed() > timeout {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Mints a token for a ServiceAccount (TokenRequest) and writes a kubeconfig that uses it; the temp dir
/// holding the file lives as long as the returned guard.
pub async fn serviceaccount_kubeconfig(
    env: &TestEnv,
    namespace: &str,
    name: &str,
) -> (PathBuf, tempfile::TempDir) {
    use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
    use k8s_openapi::api::core::v1::ServiceAccount;
    let sas: Api<ServiceAccount> = Api::namespaced(env.client.clone(), namespace);
    let tr = TokenRequest {
        spec: TokenRequestSpec {
            audiences: vec![],
            expiration_seconds: Some(3600),
            ..Default::default()
        },
        ..Default::default()
    };
    let token = sas
        .create_token_request(name, &PostParams::default(), &tr)
        .await
        .unwrap_or_else(|e| panic!("TokenRequest for {namespace}/{name}: {e}"))
        .status
        .expect("token status")
        .token;
    let admin = std::fs::read_to_string(&env.cp.kubeconfig).expect("read admin kubeconfig");
    let server = admin
        .lines()
        .find_map(|l| l.trim().strip_prefix("server: "))
        .expect("server in kubeconfig")
        .to_string();
    let ca = admin
        .lines()
        .find_map(|l| l.trim().strip_prefix("certificate-authority: "))
        .expect("CA in kubeconfig")
        .to_string();
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join(format!("{name}.kubeconfig"));
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {server}\n    certificate-authority: {ca}\nusers:\n- name: u\n  user:\n    token: {token}\ncontexts:\n- name: x\n  context: {{cluster: c, user: u}}\ncurrent-context: x\n"
        ),
    )
    .expect("write kubeconfig");
    (path, dir)
}

/// The bearer token in a kubeconfig written by [`serviceaccount_kubeconfig`].
pub fn kubeconfig_token(kubeconfig: &Path) -> String {
    std::fs::read_to_string(kubeconfig)
        .expect("read kubeconfig")
        .lines()
        .find_map(|l| l.trim().strip_prefix("token: ").map(str::to_string))
        .expect("a token in the kubeconfig")
}

/// The current holder of netcm's Lease (`kube-system/<name>`), if any.
pub async fn lease_holder(client: &kube::Client, name: &str) -> Option<String> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), LEASE_NAMESPACE);
    leases
        .get_opt(name)
        .await
        .ok()
        .flatten()
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
        .filter(|h| !h.is_empty())
}
