//! A pod keeps working past its ServiceAccount token's lifetime (`hack/bench.sh token-expiry`):
//! bound tokens expire, the kubelet writes a new one into the pod before they do, and netcm must read it —
//! a client that keeps the token it started with is refused (401) once it expires. The API server refuses
//! lifetimes under 10 minutes, so this is a campaign of about 15 minutes, not a test.
//!
//! On a fresh cluster of `hack/cluster.sh` with one node: netcm installed from the chart (one replica, host
//! network, as the pod network tests), then its Deployment patched to mount its own projected token of 600 s
//! (`automountServiceAccountToken: false`; the automounted token asks for 3607 s, which the API server
//! extends to a year, so it would prove nothing) at the path the automounted one has. Once the new pod leads
//! and is Ready, the token the kubelet wrote is read from the node's kubelet directory on the host (the
//! image has no shell) and its claims printed. For OBSERVE_SECONDS (default 780, well past the token's
//! expiry at +600 s) a Node object is created every 30 s and must get `spec.podCIDRs` within 30 s; the
//! token file is read at each probe to see the kubelet's rotations. Then the control plane's audit log:
//! netcm's requests by the credential they were authenticated with (`JTI=<jti>`), and every 401.
//!
//! Exits 1, naming what failed, unless every probe Node got its CIDRs, the container never restarted, the
//! Lease kept its holder and transitions, netcm used at least two tokens, made successful requests with a
//! later token after the first one's expiry and none with the first token after it.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::exit;
use std::time::{Duration, Instant};

use jiff::Timestamp;
use netcm_e2e::audit::{self, AuditEvent, CredentialUse, POD_UID};
use netcm_e2e::jwt::{self, Claims};
use netcm_e2e::multinode::{built_image, eventually, master_status, script, Cluster};
use netcm_e2e::pod_network::cidrs_of;
use netcm_e2e::token_expiry::{
    about_tokens, at, clock, credential_row, from_exp, ready, restarts, token_patch, token_row,
    verdict, Findings, LeaseState, Probe, TokenUse, Verdict, LIFETIME, VOLUME,
};
use serde_json::{json, Value};

const TIMEOUT: Duration = Duration::from_secs(300);
const PROBE_EVERY: Duration = Duration::from_secs(30);
const PROBE_WAIT: Duration = Duration::from_secs(30);
const NAMESPACE: &str = "kube-system";
const SELECTOR: &str = "app.kubernetes.io/component=controller-manager";

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() {
    let observe = Duration::from_secs(netcm_e2e::env_or::<u64>("OBSERVE_SECONDS", 780));
    let installed = bring_up_and_install().await;
    let cluster = &installed.cluster;
    let leading = give_the_pod_a_short_token_and_wait_until_it_leads(&installed).await;
    let seen = observe_with_probe_nodes(cluster, &leading, observe).await;
    let end = read_the_end_state(cluster, &leading.pod, &seen.probes).await;
    let audited = read_the_audit_log(cluster, &installed.user, &leading);
    script("hack/cluster.sh", &["down"], &[]);

    print_the_tables(&installed.user, &leading, &seen, &audited);
    let verdict = verdict(&Findings {
        first_exp: at(leading.first.exp),
        probes: seen.probes,
        restart_count: end.restart_count,
        lease_start: leading.lease.clone(),
        lease_end: end.lease,
        tokens_in_file: seen.tokens.len(),
        jtis: audited.token_use.jtis(),
        later_token_successes_after_exp: audited.token_use.later_token_successes_after_exp,
        first_token_after_exp: audited.token_use.first_token_after_exp.clone(),
        first_id: leading.first.credential_id(),
        first_token_audited: audited
            .token_use
            .by_credential
            .contains_key(&leading.first.credential_id()),
    });
    print_the_verdict(observe, &verdict, &end.log);
    if let Some(message) = verdict.failure_message() {
        eprintln!("{message}");
        exit(1);
    }
}

/// The netcm pod of the patched template: name, UID, node, IP.
#[derive(Debug, Clone)]
struct NetcmPod {
    name: String,
    uid: String,
    node: String,
    ip: String,
}

/// A fresh one-node cluster with the chart's netcm leading.
struct Installed {
    cluster: Cluster,
    deployment: String,
    /// The user netcm's ServiceAccount authenticates as.
    user: String,
    holder: String,
}

/// The pod with the token of LIFETIME seconds, leading, and the first token the kubelet wrote into it.
struct Leading {
    pod: NetcmPod,
    lease: LeaseState,
    token_file: PathBuf,
    first: Claims,
}

/// What the observation saw: the probes, and each token the kubelet wrote with when it was first seen.
struct Observation {
    probes: Vec<Probe>,
    tokens: Vec<(Timestamp, Claims)>,
}

/// The pod and the Lease after the observation, and netcm's log.
struct EndState {
    restart_count: i64,
    lease: LeaseState,
    log: String,
}

/// What the audit log says: every credential of netcm's user, what this pod did with its tokens, and
/// the 401s (as `<received> <verb> <uri>`).
struct Audited {
    all_by_credential: BTreeMap<String, CredentialUse>,
    token_use: TokenUse,
    unauthorized: Vec<String>,
}

async fn bring_up_and_install() -> Installed {
    let (image, tar) = built_image("build");
    let cluster = Cluster::fresh(1);
    cluster.load(&tar, &image);
    cluster
        .install_netcm(&image, &["replicaCount=1".to_string()])
        .await;
    let deployments = cluster
        .get_json(&["deployments", "-n", NAMESPACE, "-l", SELECTOR])
        .await;
    let deployment = deployments["items"][0]["metadata"]["name"]
        .as_str()
        .expect("the chart's netcm Deployment")
        .to_string();
    let service_account = deployments["items"][0]["spec"]["template"]["spec"]["serviceAccountName"]
        .as_str()
        .expect("the Deployment's serviceAccountName")
        .to_string();
    let user = format!("system:serviceaccount:{NAMESPACE}:{service_account}");
    let holder = eventually("the chart's netcm leading", TIMEOUT, || async {
        let l = lease(&cluster).await;
        (!l.holder.is_empty()).then_some(l.holder)
    })
    .await;
    Installed {
        cluster,
        deployment,
        user,
        holder,
    }
}

/// Patches the Deployment to the token of LIFETIME seconds, waits until its pod leads, and reads the first
/// token the kubelet wrote, which must live LIFETIME seconds and be bound to that pod.
async fn give_the_pod_a_short_token_and_wait_until_it_leads(installed: &Installed) -> Leading {
    let cluster = &installed.cluster;
    let pod = patch_and_wait(cluster, &installed.deployment, &installed.holder).await;
    let lease = lease(cluster).await;
    let token_file = token_path(cluster, &pod);
    let first = read_token(&token_file);
    println!(
        "netcm pod {} (uid {}) on {} ({}), leading as {} (leaseTransitions {}), as {}",
        pod.name, pod.uid, pod.node, pod.ip, lease.holder, lease.transitions, installed.user
    );
    println!(
        "first token {}: iat {} exp {} (lifetime {} s), jti {}, sub {}, pod {:?}",
        token_file.display(),
        at(first.iat),
        at(first.exp),
        first.lifetime(),
        first.jti,
        first.sub,
        first.pod
    );
    assert_eq!(
        first.lifetime(),
        LIFETIME,
        "the kubelet's token does not live {LIFETIME} s: the campaign would prove nothing"
    );
    assert_eq!(
        first.pod.as_deref(),
        Some(pod.name.as_str()),
        "the token is not bound to the netcm pod"
    );
    Leading {
        pod,
        lease,
        token_file,
        first,
    }
}

/// For `observe`, a probe Node every PROBE_EVERY, the token file read before each to see the kubelet's
/// rotations.
async fn observe_with_probe_nodes(
    cluster: &Cluster,
    leading: &Leading,
    observe: Duration,
) -> Observation {
    let exp1 = at(leading.first.exp);
    let run = Timestamp::now().as_second();
    let started = Instant::now();
    let mut probes = Vec::new();
    let mut tokens: Vec<(Timestamp, Claims)> = vec![(Timestamp::now(), leading.first.clone())];
    let mut k = 0u32;
    while started.elapsed() < observe {
        let due = PROBE_EVERY * k;
        if let Some(wait) = due.checked_sub(started.elapsed()) {
            tokio::time::sleep(wait).await;
        }
        let now = read_token(&leading.token_file);
        if tokens.last().is_none_or(|(_, c)| c.jti != now.jti) {
            eprintln!(
                "  {} the kubelet wrote a new token: jti {} iat {} exp {}",
                clock(Timestamp::now()),
                now.jti,
                at(now.iat),
                at(now.exp)
            );
            tokens.push((Timestamp::now(), now));
        }
        let p = probe(cluster, &format!("token-expiry-{run}-{k:02}")).await;
        eprintln!(
            "  probe {} at {:+.0} s from the first token's exp: {}",
            p.name,
            from_exp(p.created, exp1),
            p.took
                .map_or("no pod CIDRs within 30 s".to_string(), |s| format!(
                    "pod CIDRs after {s:.1} s"
                ))
        );
        probes.push(p);
        k += 1;
    }
    Observation { probes, tokens }
}

/// The pod's restarts, the Lease and netcm's log after the observation; then the probe Nodes go.
async fn read_the_end_state(cluster: &Cluster, pod: &NetcmPod, probes: &[Probe]) -> EndState {
    let pods = netcm_pods(cluster).await;
    let same = pods
        .iter()
        .find(|p| p["metadata"]["uid"] == pod.uid.as_str());
    let restart_count = same.map_or(-1, restarts);
    let lease = lease(cluster).await;
    let (_, log, _) = cluster
        .try_kubectl(&[
            "logs",
            "-n",
            NAMESPACE,
            &pod.name,
            "-c",
            "netcm",
            "--tail=400",
        ])
        .await;
    for p in probes {
        cluster
            .try_kubectl(&["delete", "node", &p.name, "--wait=false"])
            .await;
    }
    EndState {
        restart_count,
        lease,
        log,
    }
}

/// netcm's requests by the credential they were authenticated with, and every 401.
fn read_the_audit_log(cluster: &Cluster, user: &str, leading: &Leading) -> Audited {
    let events = audit::read_every_request(&cluster.audit_log());
    let ours: Vec<&AuditEvent> = events
        .iter()
        .filter(|e| e.user.username == user && e.extra(POD_UID) == Some(leading.pod.uid.as_str()))
        .collect();
    Audited {
        all_by_credential: audit::by_credential(&events, user),
        token_use: TokenUse::of(
            &ours,
            user,
            &leading.first.credential_id(),
            at(leading.first.exp),
        ),
        unauthorized: audit::unauthorized(&events)
            .iter()
            .map(|e| {
                format!(
                    "{} {} {}",
                    e.request_received_timestamp, e.verb, e.request_uri
                )
            })
            .collect(),
    }
}

/// The tokens the kubelet wrote, netcm's audited requests by credential, and the 401s.
fn print_the_tables(user: &str, leading: &Leading, seen: &Observation, audited: &Audited) {
    let exp1 = at(leading.first.exp);
    let pod = &leading.pod.name;
    let lifetimes: BTreeMap<String, &Claims> = seen
        .tokens
        .iter()
        .map(|(_, c)| (c.credential_id(), c))
        .collect();
    println!("\n### Tokens the kubelet wrote into {pod}\n");
    println!("| jti | iat | exp | seen in the file at |");
    println!("|---|---|---|---|");
    for (seen, claims) in &seen.tokens {
        println!("{}", token_row(*seen, claims, exp1));
    }
    println!("\n### netcm's audited requests by credential (user {user}, pod {pod})\n");
    println!("| credential | token exp | first request | last request | requests | codes |");
    println!("|---|---|---|---|---|---|");
    for (id, used) in &audited.all_by_credential {
        let token_exp = lifetimes.get(id).map(|c| at(c.exp));
        let this_pod = audited.token_use.by_credential.contains_key(id);
        println!("{}", credential_row(id, used, token_exp, this_pod, exp1));
    }
    println!(
        "\nTimes in UTC; (±s) from the first token's exp {}. The audit policy records Lease and Node writes and Node reads (hack/controlplane/render.py), so these are those requests.",
        clock(exp1)
    );
    println!(
        "401 responses in the whole audit log: {} {:?}",
        audited.unauthorized.len(),
        audited.unauthorized.iter().take(5).collect::<Vec<_>>()
    );
}

/// The verdict table, netcm's log lines about tokens, and, if a check failed, the end of its log.
fn print_the_verdict(observe: Duration, verdict: &Verdict, log: &str) {
    println!("\n### Verdict (OBSERVE_SECONDS={})\n", observe.as_secs());
    println!("| check | result |");
    println!("|---|---|");
    for check in &verdict.checks {
        println!("{}", check.row());
    }
    let about: Vec<&str> = log.lines().filter(|l| about_tokens(l)).collect();
    if !about.is_empty() {
        println!("\nnetcm's log lines about tokens or 401s:");
        for l in about.iter().take(20) {
            println!("  {l}");
        }
    }
    if verdict.failure_message().is_some() {
        println!("\nnetcm's log, last 40 lines:");
        let lines: Vec<&str> = log.lines().collect();
        for l in &lines[lines.len().saturating_sub(40)..] {
            println!("  {l}");
        }
    }
}

/// The Lease's holder and transitions.
async fn lease(cluster: &Cluster) -> LeaseState {
    LeaseState::of(&cluster.get_json(&["lease", "-n", NAMESPACE, "netcm"]).await)
}

async fn netcm_pods(cluster: &Cluster) -> Vec<Value> {
    cluster
        .get_json(&["pods", "-n", NAMESPACE, "-l", SELECTOR])
        .await["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// Patches the Deployment and waits until its only pod is one with the token volume, Ready, leading
/// (its metrics say so) and named in the Lease by an identity other than `old_holder`.
async fn patch_and_wait(cluster: &Cluster, deployment: &str, old_holder: &str) -> NetcmPod {
    cluster
        .kubectl(&[
            "patch",
            "deployment",
            "-n",
            NAMESPACE,
            deployment,
            "--type=strategic",
            "-p",
            &token_patch().to_string(),
        ])
        .await;
    cluster
        .kubectl(&[
            "rollout",
            "status",
            "-n",
            NAMESPACE,
            &format!("deployment/{deployment}"),
            "--timeout=300s",
        ])
        .await;
    eventually(
        "the patched netcm pod alone, Ready and leading",
        TIMEOUT,
        || async {
            let pods = netcm_pods(cluster).await;
            let [pod] = pods.as_slice() else { return None };
            let has_volume = pod["spec"]["volumes"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|v| v["name"] == VOLUME);
            if !has_volume
                || pod["spec"]["automountServiceAccountToken"] != false
                || pod["metadata"]["deletionTimestamp"].is_string()
                || !ready(pod)
            {
                return None;
            }
            let ip = pod["status"]["podIP"].as_str()?.to_string();
            if master_status(&ip).await != Some(1.0) {
                return None;
            }
            let holder = lease(cluster).await.holder;
            (!holder.is_empty() && holder != old_holder).then(|| NetcmPod {
                name: pod["metadata"]["name"].as_str().unwrap().to_string(),
                uid: pod["metadata"]["uid"].as_str().unwrap().to_string(),
                node: pod["spec"]["nodeName"].as_str().unwrap().to_string(),
                ip,
            })
        },
    )
    .await
}

/// The token the kubelet keeps in the pod's projected volume, read on the host from the node's kubelet
/// root dir (`--root-dir <node state>/kubelet`).
fn token_path(cluster: &Cluster, pod: &NetcmPod) -> PathBuf {
    let node = cluster
        .nodes()
        .into_iter()
        .find(|n| n.name == pod.node)
        .unwrap_or_else(|| {
            panic!(
                "{} runs on {}, not a node of the cluster",
                pod.name, pod.node
            )
        });
    node.state_dir
        .join("kubelet/pods")
        .join(&pod.uid)
        .join("volumes/kubernetes.io~projected")
        .join(VOLUME)
        .join("token")
}

fn read_token(path: &Path) -> Claims {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("read the pod's token {}: {e}", path.display()));
    jwt::claims(&text).unwrap_or_else(|e| panic!("the token in {}: {e}", path.display()))
}

/// Creates a Node object (no kubelet behind it) and waits up to PROBE_WAIT for its pod CIDRs.
async fn probe(cluster: &Cluster, name: &str) -> Probe {
    let node = json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"netcm.io/token-expiry-probe": "true"}}});
    let created = Timestamp::now();
    let started = Instant::now();
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), node.to_string()).unwrap();
    let (ok, out, err) = cluster
        .try_kubectl(&["create", "-f", file.path().to_str().unwrap()])
        .await;
    if !ok {
        eprintln!("  create node {name} failed: {err}{out}");
        return Probe {
            name: name.into(),
            created,
            took: None,
        };
    }
    while started.elapsed() < PROBE_WAIT {
        let (ok, out, _) = cluster
            .try_kubectl(&["get", "node", name, "-o", "json"])
            .await;
        if ok {
            let n: Value = serde_json::from_str(&out).unwrap_or_default();
            if !cidrs_of(&n).is_empty() {
                return Probe {
                    name: name.into(),
                    created,
                    took: Some(started.elapsed().as_secs_f64()),
                };
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Probe {
        name: name.into(),
        created,
        took: None,
    }
}
