//! The route DaemonSet's account, on the real API server. Root on any Node reads the token of the
//! DaemonSet's pod there, so the chart gives the DaemonSet an account of its own:
//! - the API server's authorizer lets it read Nodes and ClusterCIDRs, record Events in `default` and patch nodes/status,
//!   and nothing the controller writes (Nodes, PodCIDRClaims, ClusterCIDRs, the Lease); `kubectl auth
//!   can-i --list` shows no other write; the controller's account keeps its own;
//! - with a token bound to a pod on a Node (the API server puts the Node's name in its extra
//!   `authentication.kubernetes.io/node-name`, as the kubelet's projected tokens have), the chart's
//!   ValidatingAdmissionPolicy lets it change only its own Node's NetworkUnavailable condition: not
//!   another Node's, not its own Node's annotations, addresses or other conditions, and nothing with a
//!   token bound to no Node;
//! - netcm in node mode, as the chart's DaemonSet runs it, with that token and nothing else, routes to
//!   its peers, records an Event on the peer it cannot reach and writes its own Node's condition, without
//!   a single 403.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;

use k8s_openapi::api::authentication::v1::{
    BoundObjectReference, SelfSubjectReview, TokenRequest, TokenRequestSpec,
};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::{Patch, PatchParams};
use netcm_e2e::netns::NetnsNetcm;
use netcm_e2e::route_lab::{Host, SUBNETS};

use super::*;

/// The Node the DaemonSet's pod runs on, a peer on its LAN and a peer it cannot reach (off-link).
const OWN_NODE: &str = "ds-own";
const PEER: &str = "ds-peer";
const UNREACHABLE_PEER: &str = "ds-unreachable";
/// The DaemonSet's pod the token is bound to.
const DS_POD: &str = "netcm-node-e2e";
const NODE_NAME_EXTRA: &str = "authentication.kubernetes.io/node-name";
const CONDITION: &str = "NetworkUnavailable";

/// The chart with the DaemonSet on, everything else at its defaults.
fn daemonset_chart() -> Rendering {
    Rendering::with_set(&["daemonSet.enabled=true"])
}

/// How the API server names the ServiceAccount the pods of `kind` run as.
fn user_of(chart: &Rendering, kind: &str) -> String {
    format!(
        "system:serviceaccount:{NAMESPACE}:{}",
        chart.service_account_of(kind)
    )
}

/// The chart's RBAC and, when it renders one, its ValidatingAdmissionPolicy and binding, applied.
fn apply_daemonset_chart(env: &TestEnv, chart: &Rendering) {
    let mut objects = chart.rbac_without(None);
    for kind in [
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ] {
        objects.extend(chart.all(kind).into_iter().cloned());
    }
    apply(&env.cp.kubeconfig, objects);
}

/// What the DaemonSet's account needs (`netcm --route-mode=node --leader-elect=false
/// --controllers=route-controller`): the Node informer, the ClusterCIDR pools' ranges, its Node's
/// condition, Events on Nodes.
const DAEMONSET_NEEDS: [Probe; 7] = [
    Probe("list", "", "nodes", None, None),
    Probe("watch", "", "nodes", None, None),
    Probe("list", "networking.x-k8s.io", "clustercidrs", None, None),
    Probe("watch", "networking.x-k8s.io", "clustercidrs", None, None),
    Probe("patch", "", "nodes/status", None, None),
    Probe("create", "events.k8s.io", "events", Some("default"), None),
    Probe("patch", "events.k8s.io", "events", Some("default"), None),
];

/// What the controller's account may do and the DaemonSet's must not: every one a way for root on a
/// Node to corrupt allocation or leadership, and the controller's reads it has no use for.
const DAEMONSET_MUST_NOT: [Probe; 17] = [
    Probe("patch", "", "nodes", None, None),
    Probe("update", "", "nodes", None, None),
    Probe("delete", "", "nodes", None, None),
    Probe("update", "", "nodes/status", None, None),
    Probe("create", "ipam.netcm.io", "podcidrclaims", None, None),
    Probe("patch", "ipam.netcm.io", "podcidrclaims", None, None),
    Probe("list", "ipam.netcm.io", "podcidrclaims", None, None),
    Probe("patch", "networking.x-k8s.io", "clustercidrs", None, None),
    Probe(
        "patch",
        "networking.x-k8s.io",
        "clustercidrs/status",
        None,
        None,
    ),
    Probe("create", COORDINATION, "leases", Some(NAMESPACE), None),
    Probe(
        "update",
        COORDINATION,
        "leases",
        Some(NAMESPACE),
        Some("netcm"),
    ),
    Probe(
        "get",
        COORDINATION,
        "leases",
        Some(NAMESPACE),
        Some("netcm"),
    ),
    Probe("get", "", "pods", Some(NAMESPACE), None),
    Probe("create", "events.k8s.io", "events", Some(NAMESPACE), None),
    Probe("create", "", "events", Some("default"), None),
    Probe(
        "create",
        "authentication.k8s.io",
        "tokenreviews",
        None,
        None,
    ),
    Probe(
        "create",
        "authorization.k8s.io",
        "subjectaccessreviews",
        None,
        None,
    ),
];

/// The controller's account keeps what it writes (the positive control: the denials above are the
/// DaemonSet's account's, not an authorizer that refuses everything).
const CONTROLLER_KEEPS: [Probe; 4] = [
    Probe("patch", "", "nodes", None, None),
    Probe("create", "ipam.netcm.io", "podcidrclaims", None, None),
    Probe(
        "patch",
        "networking.x-k8s.io",
        "clustercidrs/status",
        None,
        None,
    ),
    Probe(
        "update",
        COORDINATION,
        "leases",
        Some(NAMESPACE),
        Some("netcm"),
    ),
];

/// Writes every authenticated user may make, which change nothing (system:basic-user).
const EVERYONES_WRITES: [&str; 3] = [
    "selfsubjectaccessreviews.authorization.k8s.io",
    "selfsubjectrulesreviews.authorization.k8s.io",
    "selfsubjectreviews.authentication.k8s.io",
];

/// `kubectl auth can-i --list --as=USER -n NAMESPACE`: its text, and (resource, verb) of every line
/// that names a resource.
fn can_i_list(env: &TestEnv, user: &str, namespace: &str) -> (String, BTreeSet<(String, String)>) {
    let text = netcm_e2e::command_output(
        netcm_e2e::kubectl(&env.cp.kubeconfig).args([
            "auth",
            "can-i",
            "--list",
            &format!("--as={user}"),
            "-n",
            namespace,
        ]),
        None,
    );
    let mut rules = BTreeSet::new();
    for line in text.lines().skip(1) {
        // `RESOURCE   [URLS]   [NAMES]   [VERBS]`; a non-resource line starts with its URLs.
        let Some((resource, rest)) = line.split_once('[') else {
            continue;
        };
        let resource = resource.trim();
        let verbs = rest
            .rsplit_once('[')
            .map_or(rest, |(_, v)| v)
            .trim_end_matches(']');
        if resource.is_empty() {
            continue;
        }
        for verb in verbs.split_whitespace() {
            rules.insert((resource.to_string(), verb.to_string()));
        }
    }
    (text, rules)
}

fn is_write(verb: &str) -> bool {
    matches!(
        verb,
        "create"
            | "update"
            | "patch"
            | "delete"
            | "deletecollection"
            | "*"
            | "bind"
            | "escalate"
            | "impersonate"
            | "approve"
            | "sign"
    )
}

#[tokio::test]
async fn the_route_daemonsets_account_reads_nodes_records_events_and_patches_node_status_and_writes_nothing_the_controller_writes(
) {
    let env = TestEnv::new().await;
    env.ensure_namespace(NAMESPACE).await;
    let chart = daemonset_chart();
    let ds = user_of(&chart, "DaemonSet");
    let controller = user_of(&chart, "Deployment");
    apply_daemonset_chart(&env, &chart);
    // RBAC is cached by the authorizer: wait for the DaemonSet's rules before asking what it may not do.
    for p in DAEMONSET_NEEDS {
        wait_for(&format!("{ds} to be allowed {p:?}"), TIMEOUT, || async {
            allowed(&env, &ds, p).await.then_some(())
        })
        .await;
    }
    let mut wrong = Vec::new();
    if ds == controller {
        wrong.push(format!(
            "the DaemonSet runs as the controller's account {ds}: root on any Node holds every right of the controller"
        ));
    }
    for p in DAEMONSET_MUST_NOT {
        if allowed(&env, &ds, p).await {
            wrong.push(format!("the DaemonSet's account {ds} may {p:?}"));
        }
    }
    for p in CONTROLLER_KEEPS {
        if !allowed(&env, &controller, p).await {
            wrong.push(format!(
                "the controller's account {controller} may not {p:?}"
            ));
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");

    // Every write the authorizer lists for the account, in its Events' namespace and in its own: its
    // own three, and those every authenticated user has.
    let own = |ns: &str| -> BTreeSet<(String, String)> {
        let mut own: BTreeSet<(String, String)> = [("nodes/status", "patch")]
            .iter()
            .map(|(r, v)| (r.to_string(), v.to_string()))
            .collect();
        if ns == "default" {
            own.insert(("events.events.k8s.io".into(), "create".into()));
            own.insert(("events.events.k8s.io".into(), "patch".into()));
        }
        own
    };
    for ns in ["default", NAMESPACE] {
        let (text, rules) = can_i_list(&env, &ds, ns);
        eprintln!("[chart-rbac] kubectl auth can-i --list --as={ds} -n {ns}:\n{text}");
        let writes: BTreeSet<(String, String)> = rules
            .iter()
            .filter(|(r, v)| is_write(v) && !EVERYONES_WRITES.contains(&r.as_str()))
            .cloned()
            .collect();
        assert_eq!(
            writes,
            own(ns),
            "the writes kubectl auth can-i --list shows for {ds} in {ns}:\n{text}"
        );
        for (r, v) in [("nodes", "list"), ("nodes", "watch")] {
            assert!(
                rules.contains(&(r.to_string(), v.to_string())),
                "{ds} may not {v} {r}:\n{text}"
            );
        }
    }
}

/// A kubeconfig for the API server with `token`, in a directory that lives as long as the handle.
fn token_kubeconfig(env: &TestEnv, token: &str) -> (PathBuf, tempfile::TempDir) {
    let admin = std::fs::read_to_string(&env.cp.kubeconfig).expect("read admin kubeconfig");
    let field = |key: &str| {
        admin
            .lines()
            .find_map(|l| l.trim().strip_prefix(key))
            .unwrap_or_else(|| panic!("{key} in the admin kubeconfig"))
            .to_string()
    };
    let (server, ca) = (field("server: "), field("certificate-authority: "));
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("daemonset.kubeconfig");
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {server}\n    certificate-authority: {ca}\nusers:\n- name: u\n  user:\n    token: {token}\ncontexts:\n- name: x\n  context: {{cluster: c, user: u}}\ncurrent-context: x\n"
        ),
    )
    .expect("write kubeconfig");
    (path, dir)
}

/// A token of `sa`, bound to `pod` when given (as the kubelet asks for its pods' projected tokens).
async fn token(env: &TestEnv, sa: &str, pod: Option<&Pod>) -> String {
    let sas: Api<ServiceAccount> = Api::namespaced(env.client.clone(), NAMESPACE);
    let bound_object_ref = pod.map(|p| BoundObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        name: p.metadata.name.clone(),
        uid: p.metadata.uid.clone(),
    });
    let tr = TokenRequest {
        spec: TokenRequestSpec {
            audiences: vec![],
            expiration_seconds: Some(3600),
            bound_object_ref,
        },
        ..Default::default()
    };
    sas.create_token_request(sa, &PostParams::default(), &tr)
        .await
        .unwrap_or_else(|e| panic!("TokenRequest for {NAMESPACE}/{sa}: {e}"))
        .status
        .expect("token status")
        .token
}

/// A strategic-merge patch of a Node's status with only the NetworkUnavailable condition, as netcm's.
fn condition_patch(status: &str, reason: &str) -> Value {
    serde_json::json!({"status": {"conditions": [{
        "type": CONDITION,
        "status": status,
        "reason": reason,
        "message": "written by the e2e test",
        "lastTransitionTime": "2000-01-01T00:00:00Z",
        "lastHeartbeatTime": "2000-01-01T00:00:00Z",
    }]}})
}

/// The Node's NetworkUnavailable condition: (status, reason).
async fn condition(nodes: &Api<Node>, name: &str) -> Option<(String, String)> {
    let node = nodes.get(name).await.expect("get node");
    let c = node
        .status?
        .conditions?
        .into_iter()
        .find(|c| c.type_ == CONDITION)?;
    Some((c.status, c.reason.unwrap_or_default()))
}

/// The API server's refusal of a status patch, or `None` when it took it.
async fn status_patch(
    nodes: &Api<Node>,
    name: &str,
    body: &Value,
    dry_run: bool,
) -> Option<String> {
    let pp = PatchParams {
        dry_run,
        ..Default::default()
    };
    match nodes.patch_status(name, &pp, &Patch::Strategic(body)).await {
        Ok(_) => None,
        Err(kube::Error::Api(s)) => Some(format!("{} {}", s.code, s.message)),
        Err(e) => panic!("patch {name}/status: {e}"),
    }
}

/// Asserts the policy refused the write (not RBAC: the account may patch nodes/status), naming `what`.
fn refused_by_policy(refusal: Option<String>, policy: &str, what: &str) {
    let refusal = refusal.unwrap_or_else(|| panic!("the API server took {what}"));
    assert!(
        refusal.starts_with("403")
            && refusal.contains(&format!("ValidatingAdmissionPolicy '{policy}'")),
        "{what}: refused, but not by the chart's policy {policy}: {refusal}"
    );
}

/// Fresh Nodes for the policy test: its own (on the netns host's LAN), an on-link peer and an off-link one.
async fn stage_nodes(env: &TestEnv) {
    for f in [
        NodeFixture::named(OWN_NODE)
            .internal_ip("192.0.2.1")
            .pod_cidrs(&["10.244.1.0/24"])
            .annotation("flannel.alpha.coreos.com/public-ip", "192.0.2.1"),
        NodeFixture::named(PEER)
            .internal_ip("192.0.2.20")
            .pod_cidrs(&["10.244.2.0/24"]),
        NodeFixture::named(UNREACHABLE_PEER)
            .internal_ip("203.0.113.5")
            .pod_cidrs(&["10.244.9.0/24"]),
    ] {
        create_node(&env.client, &f).await;
    }
}

/// The DaemonSet's pod on `OWN_NODE`, as its account: what its token is bound to.
async fn daemonset_pod(env: &TestEnv, sa: &str) -> Pod {
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), NAMESPACE);
    let _ = pods
        .delete(
            DS_POD,
            &DeleteParams {
                grace_period_seconds: Some(0),
                ..Default::default()
            },
        )
        .await;
    wait_for("the old DaemonSet pod to be gone", TIMEOUT, || async {
        matches!(pods.get_opt(DS_POD).await, Ok(None)).then_some(())
    })
    .await;
    let pod = Pod {
        metadata: ObjectMeta {
            name: Some(DS_POD.into()),
            ..Default::default()
        },
        spec: Some(PodSpec {
            node_name: Some(OWN_NODE.into()),
            service_account_name: Some(sa.into()),
            containers: vec![Container {
                name: "netcm".into(),
                image: Some("netcm.invalid/never-pulled".into()),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    };
    pods.create(&PostParams::default(), &pod)
        .await
        .expect("create the DaemonSet's pod")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_route_daemonsets_token_changes_only_its_own_nodes_network_unavailable_and_node_mode_needs_nothing_more(
) {
    let env = TestEnv::new().await;
    env.ensure_namespace(NAMESPACE).await;
    let chart = daemonset_chart();
    let sa = chart.service_account_of("DaemonSet");
    let policy = chart
        .all("ValidatingAdmissionPolicy")
        .first()
        .and_then(|p| p["metadata"]["name"].as_str())
        .expect("the chart renders a ValidatingAdmissionPolicy for the DaemonSet's account")
        .to_string();
    apply_daemonset_chart(&env, &chart);
    stage_nodes(&env).await;
    let pod = daemonset_pod(&env, &sa).await;

    // The token the kubelet would project into the DaemonSet's pod: bound to the pod, so the API server
    // names the pod's Node in it.
    let bound = token(&env, &sa, Some(&pod)).await;
    let (bound_kubeconfig, _bound_dir) = token_kubeconfig(&env, &bound);
    let as_daemonset = netcm_e2e::client_for(&bound_kubeconfig).await;
    let me = Api::<SelfSubjectReview>::all(as_daemonset.clone())
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await
        .expect("SelfSubjectReview with the bound token");
    let extra = me
        .status
        .and_then(|s| s.user_info)
        .and_then(|u| u.extra)
        .unwrap_or_default();
    assert_eq!(
        extra.get(NODE_NAME_EXTRA),
        Some(&vec![OWN_NODE.to_string()]),
        "the API server did not bind the pod's Node into the token (extra: {extra:?})"
    );

    let nodes: Api<Node> = Api::all(as_daemonset.clone());
    let admin_nodes: Api<Node> = Api::all(env.client.clone());
    // The policy is live once it refuses a write it must refuse (dry run: nothing is changed meanwhile).
    let to_peer = condition_patch("True", "NoRouteCreated");
    wait_for(
        "the chart's policy to refuse a write to a peer's status",
        TIMEOUT,
        || async {
            status_patch(&nodes, PEER, &to_peer, true)
                .await
                .filter(|r| r.contains("ValidatingAdmissionPolicy"))
        },
    )
    .await;

    // Its own Node's condition: taken.
    let own = condition_patch("True", "NoRouteCreated");
    assert_eq!(
        status_patch(&nodes, OWN_NODE, &own, false).await,
        None,
        "the DaemonSet's own Node's NetworkUnavailable was refused"
    );
    assert_eq!(
        condition(&admin_nodes, OWN_NODE).await,
        Some(("True".into(), "NoRouteCreated".into()))
    );
    // A peer's condition: refused, and the peer is untouched.
    refused_by_policy(
        status_patch(&nodes, PEER, &to_peer, false).await,
        &policy,
        "a peer's NetworkUnavailable",
    );
    assert_eq!(condition(&admin_nodes, PEER).await, None);
    // Through nodes/status, its own Node's annotations (the flannel lease peers route to), addresses
    // and other conditions: refused.
    let cases = [
        (
            serde_json::json!({"metadata": {"annotations": {"flannel.alpha.coreos.com/public-ip": "192.0.2.99"}}}),
            "its own Node's lease annotation",
        ),
        (
            serde_json::json!({"metadata": {"labels": {"node-role.kubernetes.io/control-plane": ""}}}),
            "a label on its own Node",
        ),
        (
            serde_json::json!({"status": {"addresses": [{"type": "InternalIP", "address": "192.0.2.99"}]}}),
            "its own Node's addresses",
        ),
        (
            serde_json::json!({"status": {"conditions": [{"type": "Ready", "status": "False", "reason": "Forged"}]}}),
            "its own Node's Ready condition",
        ),
        (
            serde_json::json!({"status": {"capacity": {"pods": "1"}}}),
            "its own Node's capacity",
        ),
    ];
    for (body, what) in &cases {
        refused_by_policy(
            status_patch(&nodes, OWN_NODE, body, false).await,
            &policy,
            what,
        );
    }
    let own_node = admin_nodes.get(OWN_NODE).await.expect("get own node");
    assert_eq!(
        own_node
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("flannel.alpha.coreos.com/public-ip"))
            .map(String::as_str),
        Some("192.0.2.1"),
        "its own Node's lease annotation changed"
    );
    // The Node itself (spec, annotations): RBAC refuses it before any policy.
    match nodes
        .patch(
            PEER,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"podCIDRs": ["10.244.1.0/24"]}})),
        )
        .await
    {
        Err(kube::Error::Api(s)) => assert!(
            s.code == 403 && s.message.contains("cannot patch resource \"nodes\""),
            "{}",
            s.message
        ),
        other => panic!("the DaemonSet's account patched a peer's pod CIDRs: {other:?}"),
    }
    // A token of the account bound to no pod (a legacy or hand-made one) names no Node: refused, even
    // for the Node the DaemonSet runs on.
    let unbound = token(&env, &sa, None).await;
    let (unbound_kubeconfig, _unbound_dir) = token_kubeconfig(&env, &unbound);
    let unbound_nodes: Api<Node> = Api::all(netcm_e2e::client_for(&unbound_kubeconfig).await);
    refused_by_policy(
        status_patch(&unbound_nodes, OWN_NODE, &own, false).await,
        &policy,
        "a write with a token bound to no Node",
    );
    // The policy holds only the DaemonSet's account: an administrator still writes a peer's condition.
    assert_eq!(
        status_patch(&admin_nodes, PEER, &condition_patch("False", "Admin"), true).await,
        None,
        "the policy refused another user"
    );

    // netcm as the DaemonSet runs it (its rendered args, NODE_NAME), with the bound token and nothing
    // else, on a host of its own: it routes to its peer, records a Warning Event on the peer it cannot
    // reach, and turns its own Node's condition to RouteCreated — without a 403.
    let host = Host::new(&env, &SUBNETS);
    let args = adapt(
        &chart.args("DaemonSet"),
        &[
            ("--route-table", "100"),
            ("--route-reconciliation-period", "2s"),
        ],
        &[],
    );
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let netcm = NetnsNetcm::start(
        "chart-daemonset",
        &host.ns,
        &bound_kubeconfig,
        &args,
        &[
            ("NODE_NAME", OWN_NODE),
            ("POD_NAME", DS_POD),
            ("POD_NAMESPACE", NAMESPACE),
        ],
    );
    let peer_cidr: ipnet::IpNet = "10.244.2.0/24".parse().expect("CIDR");
    wait_for("a route to the peer's pod CIDR", TIMEOUT, || async {
        (host.routes().get(&peer_cidr).map(ToString::to_string) == Some("192.0.2.20".into()))
            .then_some(())
    })
    .await;
    wait_for(
        "a FailedToCreateRoute Event on the unreachable peer",
        TIMEOUT,
        || async {
            env.node_events(UNREACHABLE_PEER)
                .await
                .iter()
                .any(|(t, reason, _)| t == "Warning" && reason == "FailedToCreateRoute")
                .then_some(())
        },
    )
    .await;
    wait_for("its own Node's RouteCreated", TIMEOUT, || async {
        (condition(&admin_nodes, OWN_NODE).await == Some(("False".into(), "RouteCreated".into())))
            .then_some(())
    })
    .await;
    let (_, metrics) = netcm.http_get("/metrics").await.expect("/metrics");
    let forbidden: f64 = metrics
        .lines()
        .filter(|l| l.starts_with("rest_client_requests_total{") && l.contains("code=\"403\""))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum();
    assert_eq!(
        forbidden,
        0.0,
        "403s for netcm in node mode:\n{}",
        netcm.logs()
    );
    assert_eq!(
        condition(&admin_nodes, UNREACHABLE_PEER).await,
        None,
        "node mode wrote a peer's condition"
    );
    drop(netcm);
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), NAMESPACE);
    let _ = pods
        .delete(
            DS_POD,
            &DeleteParams {
                grace_period_seconds: Some(0),
                ..Default::default()
            },
        )
        .await;
}

/// `netcm check -o json` with `args`: the findings of its `rbac` check about the route DaemonSet.
fn daemonset_findings(kubeconfig: &Path, args: &[&str]) -> Vec<Value> {
    let out = Command::new(netcm_e2e::netcm::netcm_binary())
        .arg("check")
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .arg(format!("--leader-elect-resource-namespace={NAMESPACE}"))
        .arg("-o=json")
        .args(args)
        .env_remove("KUBECONFIG")
        .env_remove("NETCM_KUBECONFIG")
        .env_remove("POD_NAMESPACE")
        .output()
        .expect("run netcm check");
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "netcm check printed no JSON ({e}):\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    eprintln!("$ netcm check {}\n{report:#}", args.join(" "));
    report["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .filter(|c| {
            c["check"] == "rbac"
                && c["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("route DaemonSet"))
        })
        .cloned()
        .collect()
}

#[tokio::test]
async fn netcm_check_passes_the_charts_daemonset_account_and_fails_one_holding_the_controllers_writes(
) {
    let env = TestEnv::new().await;
    env.ensure_namespace(NAMESPACE).await;
    let chart = daemonset_chart();
    let ds = user_of(&chart, "DaemonSet");
    let controller_sa = chart.service_account_of("Deployment");
    let controller = user_of(&chart, "Deployment");
    apply_daemonset_chart(&env, &chart);
    for p in DAEMONSET_NEEDS {
        wait_for(&format!("{ds} to be allowed {p:?}"), TIMEOUT, || async {
            allowed(&env, &ds, p).await.then_some(())
        })
        .await;
    }
    // As the chart's test pod runs it: the controller's account, which may create SubjectAccessReviews
    // (for secure metrics, on by default).
    let (as_controller, _dir) = serviceaccount_kubeconfig(&env, NAMESPACE, &controller_sa).await;
    let daemonset_as = format!("--daemonset-as={ds}");
    let findings = daemonset_findings(&as_controller, &[&daemonset_as]);
    assert!(
        matches!(findings.as_slice(), [f] if f["status"] == "ok"),
        "the chart's DaemonSet account: {findings:#?}"
    );
    // A DaemonSet running as the controller's account, as the chart used to run it: a failure per write
    // of the controller's, the first one naming what root on a Node could do with the token.
    let findings = daemonset_findings(
        &env.cp.kubeconfig,
        &[&format!("--daemonset-as={controller}")],
    );
    let failed: Vec<&str> = findings
        .iter()
        .filter(|f| f["status"] == "fail")
        .filter_map(|f| f["message"].as_str())
        .collect();
    assert!(
        failed
            .iter()
            .any(|m| m.contains("may patch nodes: its token is readable by root on every Node")),
        "{findings:#?}"
    );
    assert!(
        failed.iter().any(|m| m.contains(&format!(
            "may update leases.coordination.k8s.io/netcm -n {NAMESPACE}"
        ))),
        "{findings:#?}"
    );
}
