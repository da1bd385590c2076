//! The Helm chart's RBAC, proven on the real API server: the objects `helm template` renders with the
//! default values are applied (server-side) in namespace `netcm-system`, netcm runs with a token of the
//! chart's ServiceAccount and nothing else, and
//! - with the whole RBAC it allocates pod CIDRs, publishes lease annotations, holds its Lease, records Events and looks up its own
//!   Node through its Pod, without a single 403 from the API server (`rest_client_requests_total`);
//! - without any one rule of the ClusterRole or the Role, the feature that rule is for fails, with a
//!   clear error in the log (so no rule is there for nothing);
//! - every argument the chart passes (default and all-on values, Deployment and DaemonSet) is a flag
//!   netcm accepts with a value it accepts.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Container, Node, Pod, PodSpec};
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};
use netcm_e2e::nodes::{create_node, NodeFixture};
use netcm_e2e::{control_plane, serviceaccount_kubeconfig, wait_for, Netcm, TestEnv};
use serde_json::Value;

/// The namespace the chart is installed in.
const NAMESPACE: &str = "netcm-system";
const RELEASE: &str = "netcm";
const CLUSTER_CIDR: &str = "10.244.0.0/16";
/// The Pod netcm reads its Node from (POD_NAME), as the Deployment's pods do.
const POD: &str = "netcm-chart-e2e";
const POD_NODE: &str = "chart-node-0";
/// A ClusterCIDR each run finds, so the ClusterCIDR rules are exercised.
const POOL: &str = "chart-pool";
const NODES: [&str; 3] = [POD_NODE, "chart-node-1", "chart-node-2"];
const TIMEOUT: Duration = Duration::from_secs(30);
const FIELD_MANAGER: &str = "netcm-e2e-chart";
/// The RBAC kinds the chart renders, applied in this order.
const RBAC_KINDS: [&str; 5] = [
    "ServiceAccount",
    "ClusterRole",
    "ClusterRoleBinding",
    "Role",
    "RoleBinding",
];

mod chart;

use chart::*;

/// A request the chart's ServiceAccount makes: (verb, API group, resource, namespace, name).
#[derive(Debug, Clone, Copy)]
struct Probe(
    &'static str,
    &'static str,
    &'static str,
    Option<&'static str>,
    Option<&'static str>,
);

/// Asks the API server's authorizer whether `user` (a ServiceAccount) may make the request.
async fn allowed(env: &TestEnv, user: &str, p: Probe) -> bool {
    let Probe(verb, group, resource, namespace, name) = p;
    let (resource, subresource) = match resource.split_once('/') {
        Some((r, sub)) => (r, Some(sub.to_string())),
        None => (resource, None),
    };
    let sar = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(user.to_string()),
            groups: Some(vec![
                "system:serviceaccounts".into(),
                format!("system:serviceaccounts:{NAMESPACE}"),
                "system:authenticated".into(),
            ]),
            resource_attributes: Some(ResourceAttributes {
                verb: Some(verb.into()),
                group: Some(group.into()),
                resource: Some(resource.into()),
                subresource,
                namespace: namespace.map(Into::into),
                name: name.map(Into::into),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<SubjectAccessReview>::all(env.client.clone())
        .create(&PostParams::default(), &sar)
        .await
        .expect("create SubjectAccessReview")
        .status
        .is_some_and(|s| s.allowed)
}

/// One rule of the chart's RBAC, the feature it exists for, and how that feature fails without it.
struct Case {
    role: &'static str,
    resource: &'static str,
    verbs: &'static [&'static str],
    feature: &'static str,
    /// A request the rule allows: denied without it.
    probe: Probe,
    /// Without the rule, one line of netcm's log has this message ...
    message: &'static str,
    /// ... and this in its error.
    error: &'static str,
}

mod cases;
mod daemonset;

use cases::*;

/// A clean stage for one netcm run: no Lease (a killed leader's would make the next run stand by), the
/// Pod netcm reads its Node from, fresh Nodes.
async fn stage(env: &TestEnv) {
    let leases: Api<Lease> = Api::namespaced(env.client.clone(), NAMESPACE);
    let _ = leases.delete("netcm", &DeleteParams::default()).await;
    wait_for("the chart's Lease to be gone", TIMEOUT, || async {
        matches!(leases.get_opt("netcm").await, Ok(None)).then_some(())
    })
    .await;
    let nodes: Api<Node> = Api::all(env.client.clone());
    for n in NODES {
        let _ = nodes
            .delete(
                n,
                &DeleteParams {
                    grace_period_seconds: Some(0),
                    ..Default::default()
                },
            )
            .await;
    }
    wait_for("the test Nodes to be gone", TIMEOUT, || async {
        let list = nodes.list(&Default::default()).await.ok()?;
        list.items.is_empty().then_some(())
    })
    .await;
    for n in NODES {
        create_node(
            &env.client,
            &NodeFixture::named(n).internal_ip("192.0.2.10"),
        )
        .await;
    }
    // A ClusterCIDR without status, so a run writes its finalizer (first run) and its status (every run);
    // it selects no Node, so the Nodes still get CIDRs from the chart's --cluster-cidr.
    let pools = netcm_e2e::cluster_cidrs(&env.client);
    if pools
        .get_opt(POOL)
        .await
        .expect("get ClusterCIDR")
        .is_none()
    {
        let pool: kube::api::DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "networking.x-k8s.io/v1",
            "kind": "ClusterCIDR",
            "metadata": {"name": POOL},
            "spec": {"perNodeHostBits": 8, "ipv4": "10.245.0.0/16", "nodeSelector": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "netcm.io/chart-pool", "operator": "Exists"}]}]}}
        }))
        .expect("ClusterCIDR");
        pools
            .create(&PostParams::default(), &pool)
            .await
            .expect("create ClusterCIDR");
    }
    let _ = pools
        .patch_status(
            POOL,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"status": null})),
        )
        .await;
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), NAMESPACE);
    if pods.get_opt(POD).await.expect("get pod").is_none() {
        let pod = Pod {
            metadata: ObjectMeta {
                name: Some(POD.into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                node_name: Some(POD_NODE.into()),
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
            .expect("create pod");
    }
}

async fn remove_pod(env: &TestEnv) {
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), NAMESPACE);
    let dp = DeleteParams {
        grace_period_seconds: Some(0),
        ..Default::default()
    };
    let _ = pods.delete(POD, &dp).await;
}

/// Starts netcm as the chart's Deployment would run it (its args and POD_NAME/POD_NAMESPACE), as the
/// chart's ServiceAccount, running only the allocator, with an Event per allocation.
fn start_netcm(label: &str, kubeconfig: &Path, chart: &Rendering, controllers: &str) -> Netcm {
    let args = adapt(
        &chart.args("Deployment"),
        &[
            ("--controllers", controllers),
            ("--cluster-cidr", CLUSTER_CIDR),
            ("--record-cidr-assigned-events", "true"),
            ("--leader-elect-resource-namespace", NAMESPACE),
        ],
        &[],
    );
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Netcm::start_with_env(
        label,
        kubeconfig,
        &args,
        &[("POD_NAME", POD), ("POD_NAMESPACE", NAMESPACE)],
    )
}

/// Waits until netcm got past its flags and client config (it serves HTTP only then); a usage error
/// fails the test at once, naming it.
async fn wait_started(netcm: &mut Netcm) {
    let start = std::time::Instant::now();
    while netcm.http_get("/healthz").await.is_none() {
        if let Some(status) = netcm.try_exit() {
            panic!(
                "{} exited ({status}) before it started:\n{}",
                netcm.label,
                netcm.logs()
            );
        }
        assert!(
            start.elapsed() < TIMEOUT,
            "{} did not start within {TIMEOUT:?}",
            netcm.label
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Requests the API server refused with 403, by every client of netcm's (`rest_client_requests_total`).
async fn forbidden_requests(netcm: &Netcm) -> f64 {
    let (_, body) = netcm.http_get("/metrics").await.expect("/metrics");
    body.lines()
        .filter(|l| l.starts_with("rest_client_requests_total{") && l.contains("code=\"403\""))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

#[tokio::test]
async fn the_charts_rbac_lets_netcm_allocate_lead_record_events_and_find_its_node() {
    let env = TestEnv::new().await;
    env.ensure_namespace(NAMESPACE).await;
    let chart = Rendering::new(&[]);
    let sa = chart.service_account();
    let user = format!("system:serviceaccount:{NAMESPACE}:{sa}");
    apply(&env.cp.kubeconfig, chart.rbac_without(None));
    for c in &CASES {
        wait_for(&format!("RBAC to allow {:?}", c.probe), TIMEOUT, || async {
            allowed(&env, &user, c.probe).await.then_some(())
        })
        .await;
    }
    stage(&env).await;
    let (kubeconfig, _dir) = serviceaccount_kubeconfig(&env, NAMESPACE, &sa).await;

    let mut netcm = start_netcm(
        "chart-rbac",
        &kubeconfig,
        &chart,
        "subnet-allocator,node-annotation-syncer",
    );
    wait_started(&mut netcm).await;
    let nodes: Api<Node> = Api::all(env.client.clone());
    for n in NODES {
        wait_for(&format!("{n} to get a pod CIDR"), TIMEOUT, || async {
            let node = nodes.get(n).await.ok()?;
            node.spec?.pod_cidr.filter(|c| c.starts_with("10.244."))
        })
        .await;
        wait_for(&format!("a CIDRAssigned Event on {n}"), TIMEOUT, || async {
            env.node_events(n)
                .await
                .iter()
                .any(|(_, reason, _)| reason == "CIDRAssigned")
                .then_some(())
        })
        .await;
    }
    // node-annotation-syncer publishes the lease once a Node has an address.
    netcm_e2e::nodes::set_addresses(
        &env.client,
        NODES[1],
        &[("InternalIP".into(), "192.0.2.51".into())],
    )
    .await;
    wait_for("the public-ip lease annotation", TIMEOUT, || async {
        let node = nodes.get(NODES[1]).await.ok()?;
        let ann = node.metadata.annotations?;
        (ann.get("flannel.alpha.coreos.com/public-ip")? == "192.0.2.51").then_some(())
    })
    .await;
    let leases: Api<Lease> = Api::namespaced(env.client.clone(), NAMESPACE);
    let holder = wait_for(
        "the Lease in the chart's namespace to be held",
        TIMEOUT,
        || async {
            leases
                .get_opt("netcm")
                .await
                .ok()??
                .spec?
                .holder_identity
                .filter(|h| !h.is_empty())
        },
    )
    .await;
    for controller in ["subnet-allocator", "node-annotation-syncer"] {
        netcm.wait_controller_running(controller, TIMEOUT).await;
    }
    assert!(netcm.is_leading().await, "this netcm leads");
    assert_eq!(
        holder,
        netcm.identity().await,
        "the Lease holder is this netcm"
    );
    // The chart's release hold: a deleted Node's CIDR is recorded on its block's claim (a PATCH).
    nodes
        .delete(NODES[2], &DeleteParams::default())
        .await
        .expect("delete node");
    let claims = netcm_e2e::pod_cidr_claims(&env.client);
    wait_for(
        "the release hold recorded on a PodCIDRClaim",
        TIMEOUT,
        || async {
            let list = claims.list(&Default::default()).await.ok()?;
            list.items
                .iter()
                .flat_map(|c| c.metadata.annotations.iter().flatten())
                .any(|(k, _)| k.starts_with("release-hold.ipam.netcm.io/"))
                .then_some(())
        },
    )
    .await;
    // The Pod lookup (its Node), the Lease, Events, claims and Node writes: none refused.
    assert_eq!(
        forbidden_requests(&netcm).await,
        0.0,
        "403s with the chart's RBAC"
    );
    drop(netcm);
    remove_pod(&env).await;
}

#[tokio::test]
async fn the_charts_rbac_with_the_migration_controller_lets_it_move_every_node_without_a_403() {
    let env = TestEnv::new().await;
    env.ensure_namespace(NAMESPACE).await;
    let chart = Rendering::with_set(&["podCIDRMigration.enabled=true"]);
    apply(&env.cp.kubeconfig, chart.rbac_without(None));
    let (kubeconfig, _dir) =
        serviceaccount_kubeconfig(&env, NAMESPACE, &chart.service_account()).await;
    stage(&env).await;
    let mut netcm = start_netcm(
        "chart-migration",
        &kubeconfig,
        &chart,
        "subnet-allocator,pod-cidr-migration",
    );
    wait_started(&mut netcm).await;
    let names: Vec<String> = NODES.iter().map(|n| n.to_string()).collect();
    netcm_e2e::nodes::wait_allocated(&env.client, &names, TIMEOUT).await;
    let pool: kube::api::DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "networking.x-k8s.io/v1",
        "kind": "ClusterCIDR",
        "metadata": {"name": "chart-destination"},
        "spec": {"perNodeHostBits": 8, "ipv4": "10.246.0.0/16"}
    }))
    .expect("ClusterCIDR");
    netcm_e2e::cluster_cidrs(&env.client)
        .create(&PostParams::default(), &pool)
        .await
        .expect("create ClusterCIDR");
    let migration: kube::api::DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "ipam.netcm.io/v1alpha1",
        "kind": "PodCIDRMigration",
        "metadata": {"name": "chart-migration"},
        "spec": {"destination": "chart-destination", "maxUnavailable": 3}
    }))
    .expect("PodCIDRMigration");
    let migrations = netcm_e2e::pod_cidr_migrations(&env.client);
    migrations
        .create(&PostParams::default(), &migration)
        .await
        .expect("create PodCIDRMigration");
    // The kubelets' part: a deleted Node registers again.
    let nodes: Api<Node> = Api::all(env.client.clone());
    wait_for(
        "the migration to complete",
        Duration::from_secs(120),
        || async {
            for n in NODES {
                if nodes.get_opt(n).await.ok()?.is_none() {
                    create_node(
                        &env.client,
                        &NodeFixture::named(n).internal_ip("192.0.2.10"),
                    )
                    .await;
                }
            }
            let obj = migrations.get_opt("chart-migration").await.ok()??;
            (obj.data["status"]["phase"] == "Complete").then_some(())
        },
    )
    .await;
    let moved = netcm_e2e::nodes::wait_allocated(&env.client, &names, TIMEOUT).await;
    let destination: ipnet::IpNet = "10.246.0.0/16".parse().expect("range");
    assert!(
        moved
            .values()
            .all(|c| c.iter().all(|c| destination.contains(c))),
        "{moved:?}"
    );
    assert_eq!(
        forbidden_requests(&netcm).await,
        0.0,
        "403s with the chart's RBAC for the migration controller:\n{}",
        netcm.logs()
    );
    drop(netcm);
    // Leave the default RBAC in place, as the chart installs it.
    apply(&env.cp.kubeconfig, Rendering::new(&[]).rbac_without(None));
    remove_pod(&env).await;
}

#[tokio::test]
async fn every_rule_of_the_charts_rbac_is_needed_by_a_feature_that_fails_clearly_without_it() {
    let env = TestEnv::new().await;
    env.ensure_namespace(NAMESPACE).await;
    let chart = Rendering::new(&[]);
    let sa = chart.service_account();
    let user = format!("system:serviceaccount:{NAMESPACE}:{sa}");

    // Every rendered rule has a case, and every case its rule: the table below and the chart agree.
    let mut rules = Vec::new();
    for role in ["ClusterRole", "Role"] {
        // netcm's own role (the metrics-reader ClusterRole is for scrapers, not for netcm).
        let own = chart
            .all(role)
            .into_iter()
            .find(|o| o["metadata"]["name"] == RELEASE)
            .unwrap_or_else(|| panic!("no {role} named {RELEASE}"));
        let rendered = own["rules"].as_array().expect("rules").clone();
        for (i, rule) in rendered.iter().enumerate() {
            let case = case_for(role, rule)
                .unwrap_or_else(|| panic!("no minimality case for {role} rule {rule}"));
            rules.push((role, i, case));
        }
    }
    for c in &CASES {
        assert!(
            rules.iter().any(|(_, _, r)| std::ptr::eq(*r, c)),
            "the chart has no {} rule for {} {:?}",
            c.role,
            c.resource,
            c.verbs
        );
    }

    let (kubeconfig, _dir) = {
        apply(&env.cp.kubeconfig, chart.rbac_without(None));
        serviceaccount_kubeconfig(&env, NAMESPACE, &sa).await
    };
    let token = netcm_e2e::kubeconfig_token(&kubeconfig);
    for (role, i, case) in rules {
        apply(&env.cp.kubeconfig, chart.rbac_without(Some((role, i))));
        wait_for(
            &format!(
                "RBAC to deny {:?} without the rule for {}",
                case.probe, case.feature
            ),
            TIMEOUT,
            || async { (!allowed(&env, &user, case.probe).await).then_some(()) },
        )
        .await;
        stage(&env).await;
        let label = format!(
            "without-{}-{}",
            case.resource.replace('/', "-"),
            case.verbs.join("-")
        );
        let mut netcm = start_netcm(&label, &kubeconfig, &chart, "subnet-allocator");
        wait_started(&mut netcm).await;
        wait_for(
            &format!(
                "{label}: {} to fail with a log line {:?} with {:?}",
                case.feature, case.message, case.error
            ),
            TIMEOUT,
            || async {
                // The secure-metrics rules are only exercised by a scrape.
                if case.resource.ends_with("reviews") {
                    netcm.https_get("/metrics", Some(&token));
                }
                netcm
                    .logs()
                    .lines()
                    .any(|l| l.contains(case.message) && l.contains(case.error))
                    .then_some(())
            },
        )
        .await;
        drop(netcm);
    }
    // Leave the whole RBAC in place, as the chart installs it.
    apply(&env.cp.kubeconfig, chart.rbac_without(None));
    remove_pod(&env).await;
}

#[tokio::test]
async fn every_argument_the_chart_passes_is_a_flag_netcm_accepts() {
    let default = Rendering::new(&[]);
    let all_on = Rendering::new(&["ci/all-on-values.yaml"]);
    let binary = netcm_e2e::netcm::netcm_binary();
    let runs = [
        ("default Deployment", default.args("Deployment")),
        ("all-on Deployment", all_on.args("Deployment")),
        ("all-on DaemonSet", all_on.args("DaemonSet")),
    ];
    for (what, args) in runs {
        // Flags are parsed and validated before netcm reads its client config: with a kubeconfig that
        // does not exist, good flags end in exit 1 (no config), bad ones in exit 2 (usage).
        let args = adapt(
            &args,
            &[],
            &["--kubeconfig=/nonexistent/netcm-e2e/kubeconfig"],
        );
        let out = Command::new(binary)
            .args(&args)
            .args(["--bind-address=127.0.0.1", "--port=0"])
            .env_remove("KUBECONFIG")
            .stdin(Stdio::null())
            .output()
            .expect("run netcm");
        assert_ne!(
            out.status.code(),
            Some(2),
            "netcm rejects the {what} args {args:?}:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            out.status.code(),
            Some(1),
            "netcm with the {what} args and no kubeconfig should fail on the kubeconfig:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
