//! Running `netcm check` as a user would, and staging what it diagnoses: the chart's RBAC for a
//! ServiceAccount (optionally without one verb), Nodes registered with labels as a kubelet does (so the
//! API server tracks their fields), kube-controller-manager's allocator.

use std::path::Path;
use std::process::{Command, Stdio};

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ObjectMeta, PostParams};
use netcm_e2e::netcm::netcm_binary;
use netcm_e2e::nodes::set_addresses;
use netcm_e2e::{chart, tool};
use serde_json::Value;

/// What one `netcm check` run printed and returned.
pub struct CheckRun {
    pub code: i32,
    pub text: String,
    pub json: Value,
}

impl CheckRun {
    /// The findings of one check (`api`, `rbac`, `leader`, `pool`, …).
    pub fn findings(&self, check: &str) -> Vec<&Value> {
        self.json["checks"]
            .as_array()
            .expect("checks")
            .iter()
            .filter(|c| c["check"] == check)
            .collect()
    }

    /// The one failed finding of `check` whose message contains `needle`; panics showing the report.
    pub fn failed(&self, check: &str, needle: &str) -> &Value {
        self.findings(check)
            .into_iter()
            .find(|c| c["status"] == "fail" && c["message"].as_str().unwrap_or("").contains(needle))
            .unwrap_or_else(|| {
                panic!(
                    "no failed {check} finding containing {needle:?} in:\n{}",
                    self.text
                )
            })
    }

    pub fn fix(finding: &Value) -> &str {
        finding["fix"].as_str().unwrap_or("")
    }
}

fn run(args: &[String]) -> (i32, String) {
    let out = Command::new(netcm_binary())
        .arg("check")
        .args(args)
        .env_remove("KUBECONFIG")
        .env_remove("NETCM_KUBECONFIG")
        .output()
        .expect("run netcm check");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.trim().is_empty(),
        "netcm check wrote to stderr:\n{stderr}"
    );
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// `netcm check --kubeconfig=… args…`, in text (printed, for the test log) and as JSON.
pub fn netcm_check(kubeconfig: &Path, args: &[&str]) -> CheckRun {
    let mut all = vec![format!("--kubeconfig={}", kubeconfig.display())];
    all.extend(args.iter().map(|s| s.to_string()));
    let (code, text) = run(&all);
    eprintln!("$ netcm check {}\n{text}(exit {code})", args.join(" "));
    all.push("-o=json".into());
    let (json_code, json) = run(&all);
    assert_eq!(
        code, json_code,
        "text and JSON runs disagree on the exit code"
    );
    let json: Value = serde_json::from_str(&json)
        .unwrap_or_else(|e| panic!("netcm check -o json printed no JSON ({e}):\n{json}"));
    assert_eq!(
        json["ok"] == true,
        code == 0,
        "ok and the exit code disagree:\n{text}"
    );
    CheckRun { code, text, json }
}

/// A Node as a kubelet registers it: with its hostname label (so the API server tracks its fields,
/// which it does not for an object created with none set) and an InternalIP.
pub async fn register_node(
    client: &kube::Client,
    name: &str,
    ip: &str,
    pod_cidrs: &[&str],
) -> Node {
    let api: Api<Node> = Api::all(client.clone());
    let node = Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some([("kubernetes.io/hostname".to_string(), name.to_string())].into()),
            ..Default::default()
        },
        spec: Some(k8s_openapi::api::core::v1::NodeSpec {
            pod_cidr: pod_cidrs.first().map(|s| s.to_string()),
            pod_cidrs: (!pod_cidrs.is_empty())
                .then(|| pod_cidrs.iter().map(|s| s.to_string()).collect()),
            ..Default::default()
        }),
        status: None,
    };
    api.create(&PostParams::default(), &node)
        .await
        .unwrap_or_else(|e| panic!("create node {name}: {e}"));
    set_addresses(client, name, &[("InternalIP".into(), ip.into())]).await
}

/// The chart's ServiceAccount, ClusterRole(Binding) and Role(Binding) for release `release` in
/// `namespace`, applied server-side; `without` = (resource, verb) is taken out of its rule first.
pub fn apply_chart_rbac(
    kubeconfig: &Path,
    release: &str,
    namespace: &str,
    without: Option<(&str, &str)>,
) {
    let mut args = Vec::new();
    for t in ["serviceaccount", "clusterrole", "role"] {
        args.extend(["--show-only".to_string(), format!("templates/{t}.yaml")]);
    }
    let mut objects = chart::render(kubeconfig, release, namespace, &args);
    if let Some((resource, verb)) = without {
        for o in objects
            .iter_mut()
            .filter(|o| o["kind"] == "ClusterRole" || o["kind"] == "Role")
        {
            for rule in o["rules"].as_array_mut().into_iter().flatten() {
                let has = rule["resources"]
                    .as_array()
                    .is_some_and(|r| r.iter().any(|x| x == resource));
                if has {
                    if let Some(verbs) = rule["verbs"].as_array_mut() {
                        verbs.retain(|v| v != verb);
                    }
                }
            }
            // A rule left without verbs is invalid: it goes.
            if let Some(rules) = o["rules"].as_array_mut() {
                rules.retain(|r| r["verbs"].as_array().is_some_and(|v| !v.is_empty()));
            }
        }
    }
    chart::apply(kubeconfig, "netcm-e2e-check", objects);
}

/// kube-controller-manager running only its node IPAM allocator, as a cluster that forgot to turn it
/// off would; killed on drop.
pub struct Kcm(std::process::Child);

impl Kcm {
    pub fn start(kubeconfig: &Path, cluster_cidr: &str) -> Kcm {
        let child = Command::new(tool("kube-controller-manager"))
            .args([
                &format!("--kubeconfig={}", kubeconfig.display()),
                "--controllers=nodeipam",
                "--allocate-node-cidrs=true",
                &format!("--cluster-cidr={cluster_cidr}"),
                "--node-cidr-mask-size=24",
                "--leader-elect=false",
                "--secure-port=0",
                "--use-service-account-credentials=false",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start kube-controller-manager");
        Kcm(child)
    }
}

impl Drop for Kcm {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
