//! A pod keeps working past its ServiceAccount token's lifetime (`hack/bench.sh token-expiry`, issue 25):
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
use std::path::PathBuf;
use std::time::{Duration, Instant};

use jiff::Timestamp;
use netcm_e2e::audit::{self, AuditEvent, POD_UID};
use netcm_e2e::jwt::{self, Claims};
use netcm_e2e::multinode::{built_image, eventually, master_status, script, Cluster};
use netcm_e2e::pod_network::cidrs_of;
use serde_json::{json, Value};

const TIMEOUT: Duration = Duration::from_secs(300);
const PROBE_EVERY: Duration = Duration::from_secs(30);
const PROBE_WAIT: Duration = Duration::from_secs(30);
/// The shortest lifetime the API server issues.
const LIFETIME: i64 = 600;
const VOLUME: &str = "token-600s";
const MOUNT: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
const NAMESPACE: &str = "kube-system";
const SELECTOR: &str = "app.kubernetes.io/component=controller-manager";

/// The Deployment's pod template with its own token of LIFETIME seconds, mounted where the automounted
/// one would be (ca.crt and namespace beside it, as the automount's projected volume has them).
fn token_patch() -> Value {
    json!({"spec": {"template": {"spec": {
        "automountServiceAccountToken": false,
        "volumes": [{"name": VOLUME, "projected": {"defaultMode": 420, "sources": [
            {"serviceAccountToken": {"expirationSeconds": LIFETIME, "path": "token"}},
            {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
            {"downwardAPI": {"items": [{"path": "namespace",
                "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}
        ]}}],
        "containers": [{"name": "netcm", "volumeMounts": [
            {"name": VOLUME, "mountPath": MOUNT, "readOnly": true}
        ]}]
    }}}})
}

/// The netcm pod of the patched template: name, UID, node, IP.
#[derive(Debug, Clone)]
struct NetcmPod {
    name: String,
    uid: String,
    node: String,
    ip: String,
}

/// The Lease: holder and transitions.
async fn lease(cluster: &Cluster) -> (String, i64) {
    let l = cluster.get_json(&["lease", "-n", NAMESPACE, "netcm"]).await;
    (
        l["spec"]["holderIdentity"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        l["spec"]["leaseTransitions"].as_i64().unwrap_or(0),
    )
}

fn ready(pod: &Value) -> bool {
    pod["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Ready" && c["status"] == "True")
}

fn restarts(pod: &Value) -> i64 {
    pod["status"]["containerStatuses"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["name"] == "netcm")
        .and_then(|c| c["restartCount"].as_i64())
        .unwrap_or(-1)
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
            let (holder, _) = lease(cluster).await;
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

fn read_token(path: &PathBuf) -> Claims {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("read the pod's token {}: {e}", path.display()));
    jwt::claims(&text).unwrap_or_else(|e| panic!("the token in {}: {e}", path.display()))
}

fn at(unix: i64) -> Timestamp {
    Timestamp::from_second(unix).unwrap()
}

/// Seconds from the first token's expiry (negative before it).
fn rel(t: Timestamp, exp: Timestamp) -> f64 {
    (t.as_millisecond() - exp.as_millisecond()) as f64 / 1000.0
}

struct Probe {
    name: String,
    created: Timestamp,
    /// Seconds from the create to the CIDRs, or None when none came within PROBE_WAIT.
    took: Option<f64>,
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

fn env_number(key: &str, default: u64) -> u64 {
    std::env::var(key)
        .ok()
        .map(|v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{key}={v}: not a number"))
        })
        .unwrap_or(default)
}

fn fmt_time(t: Timestamp) -> String {
    t.strftime("%H:%M:%S").to_string()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() {
    let observe = Duration::from_secs(env_number("OBSERVE_SECONDS", 780));
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
    let (installed_holder, _) = eventually("the chart's netcm leading", TIMEOUT, || async {
        let l = lease(&cluster).await;
        (!l.0.is_empty()).then_some(l)
    })
    .await;

    // The token of LIFETIME seconds, and the pod that reads it.
    let pod = patch_and_wait(&cluster, &deployment, &installed_holder).await;
    let lease_start = lease(&cluster).await;
    let token_file = token_path(&cluster, &pod);
    let first = read_token(&token_file);
    let exp1 = at(first.exp);
    println!(
        "netcm pod {} (uid {}) on {} ({}), leading as {} (leaseTransitions {}), as {user}",
        pod.name, pod.uid, pod.node, pod.ip, lease_start.0, lease_start.1
    );
    println!(
        "first token {}: iat {} exp {} (lifetime {} s), jti {}, sub {}, pod {:?}",
        token_file.display(),
        at(first.iat),
        exp1,
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

    // Probe Nodes every PROBE_EVERY; the token file read at each.
    let run = Timestamp::now().as_second();
    let started = Instant::now();
    let mut probes = Vec::new();
    let mut tokens: Vec<(Timestamp, Claims)> = vec![(Timestamp::now(), first.clone())];
    let mut k = 0u32;
    while started.elapsed() < observe {
        let due = PROBE_EVERY * k;
        if let Some(wait) = due.checked_sub(started.elapsed()) {
            tokio::time::sleep(wait).await;
        }
        let now = read_token(&token_file);
        if tokens.last().is_none_or(|(_, c)| c.jti != now.jti) {
            eprintln!(
                "  {} the kubelet wrote a new token: jti {} iat {} exp {}",
                fmt_time(Timestamp::now()),
                now.jti,
                at(now.iat),
                at(now.exp)
            );
            tokens.push((Timestamp::now(), now));
        }
        let p = probe(&cluster, &format!("token-expiry-{run}-{k:02}")).await;
        eprintln!(
            "  probe {} at {:+.0} s from the first token's exp: {}",
            p.name,
            rel(p.created, exp1),
            p.took
                .map_or("no pod CIDRs within 30 s".to_string(), |s| format!(
                    "pod CIDRs after {s:.1} s"
                ))
        );
        probes.push(p);
        k += 1;
    }

    // The end state.
    let pods = netcm_pods(&cluster).await;
    let same = pods
        .iter()
        .find(|p| p["metadata"]["uid"] == pod.uid.as_str());
    let restart_count = same.map_or(-1, restarts);
    let lease_end = lease(&cluster).await;
    let logs = cluster
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
    let log_lines: Vec<&str> = logs
        .1
        .lines()
        .filter(|l| {
            // The probe Nodes' names hold "token"; the lines about them are the allocator's.
            let l = l.to_ascii_lowercase().replace("token-expiry-", "");
            ["401", "unauthorized", "unauthenticated", "expired", "token"]
                .iter()
                .any(|w| l.contains(w))
        })
        .collect();
    for p in &probes {
        cluster
            .try_kubectl(&["delete", "node", &p.name, "--wait=false"])
            .await;
    }

    // The audit log: netcm's requests by credential, and every 401.
    let events = audit::read_every_request(&cluster.audit_log());
    let ours: Vec<&AuditEvent> = events
        .iter()
        .filter(|e| e.user.username == user && e.extra(POD_UID) == Some(pod.uid.as_str()))
        .collect();
    let by = audit::by_credential(ours.iter().copied(), &user);
    let all_by = audit::by_credential(&events, &user);
    let unauthorized = audit::unauthorized(&events);
    let first_id = first.credential_id();
    let first_after_exp: Vec<&&AuditEvent> = ours
        .iter()
        .filter(|e| e.extra(audit::CREDENTIAL_ID) == Some(first_id.as_str()))
        .filter(|e| e.received().is_some_and(|t| t > exp1))
        .collect();
    let later_ok_after_exp = ours
        .iter()
        .filter(|e| {
            e.extra(audit::CREDENTIAL_ID)
                .is_some_and(|id| id.starts_with("JTI=") && id != first_id)
        })
        .filter(|e| e.received().is_some_and(|t| t > exp1) && e.succeeded())
        .count();
    let jtis = by.keys().filter(|k| k.starts_with("JTI=")).count();
    script("hack/cluster.sh", &["down"], &[]);

    // Report.
    let lifetimes: BTreeMap<String, &Claims> =
        tokens.iter().map(|(_, c)| (c.credential_id(), c)).collect();
    println!("\n### Tokens the kubelet wrote into {}\n", pod.name);
    println!("| jti | iat | exp | seen in the file at |");
    println!("|---|---|---|---|");
    for (seen, c) in &tokens {
        println!(
            "| {} | {} | {} | {} ({:+.0} s from the first exp) |",
            c.jti,
            fmt_time(at(c.iat)),
            fmt_time(at(c.exp)),
            fmt_time(*seen),
            rel(*seen, exp1)
        );
    }
    println!(
        "\n### netcm's audited requests by credential (user {user}, pod {})\n",
        pod.name
    );
    println!("| credential | token exp | first request | last request | requests | codes |");
    println!("|---|---|---|---|---|---|");
    for (id, u) in &all_by {
        let exp = lifetimes
            .get(id)
            .map_or("(not this pod's)".to_string(), |c| fmt_time(at(c.exp)));
        let mine = if by.contains_key(id) {
            ""
        } else {
            " (earlier pod)"
        };
        println!(
            "| {}{mine} | {exp} | {} ({:+.0} s) | {} ({:+.0} s) | {} | {} |",
            if id.is_empty() { "(none)" } else { id },
            fmt_time(u.first),
            rel(u.first, exp1),
            fmt_time(u.last),
            rel(u.last, exp1),
            u.count,
            u.codes
                .iter()
                .map(|(c, n)| format!("{c}×{n}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    println!(
        "\nTimes in UTC; (±s) from the first token's exp {}. The audit policy records Lease and Node writes and Node reads (hack/controlplane/render.py), so these are those requests.",
        fmt_time(exp1)
    );
    println!(
        "401 responses in the whole audit log: {} {:?}",
        unauthorized.len(),
        unauthorized
            .iter()
            .take(5)
            .map(|e| format!(
                "{} {} {}",
                e.request_received_timestamp, e.verb, e.request_uri
            ))
            .collect::<Vec<_>>()
    );
    let got = probes.iter().filter(|p| p.took.is_some()).count();
    let slowest = probes.iter().filter_map(|p| p.took).fold(0.0f64, f64::max);
    let after_exp = probes
        .iter()
        .filter(|p| p.created > exp1 && p.took.is_some())
        .count();
    println!("\n### Verdict (OBSERVE_SECONDS={})\n", observe.as_secs());
    println!("| check | result |");
    println!("|---|---|");
    let mut failed = Vec::new();
    let mut check = |name: &str, ok: bool, what: String| {
        println!("| {name} | {} {what} |", if ok { "ok:" } else { "FAILED:" });
        if !ok {
            failed.push(format!("{name}: {what}"));
        }
    };
    check(
        "probe Nodes got pod CIDRs within 30 s",
        got == probes.len() && !probes.is_empty(),
        format!(
            "{got} of {} ({after_exp} created after the first token's exp), slowest {slowest:.1} s",
            probes.len()
        ),
    );
    check(
        "netcm container restarts",
        restart_count == 0,
        format!("restartCount {restart_count}"),
    );
    check(
        "Lease holder and transitions unchanged",
        lease_start == lease_end,
        format!(
            "start {} / {}, end {} / {}",
            lease_start.0, lease_start.1, lease_end.0, lease_end.1
        ),
    );
    check(
        "distinct tokens (JTIs) netcm authenticated with",
        jtis >= 2,
        format!("{jtis} ({} in the file)", tokens.len()),
    );
    check(
        "successful requests with a later token after the first token's exp",
        later_ok_after_exp > 0,
        format!("{later_ok_after_exp}"),
    );
    check(
        "requests with the first token after its exp",
        first_after_exp.is_empty(),
        format!(
            "{} {:?}",
            first_after_exp.len(),
            first_after_exp
                .iter()
                .take(3)
                .map(|e| format!("{} {:?}", e.request_received_timestamp, e.code()))
                .collect::<Vec<_>>()
        ),
    );
    check(
        "the first token's requests are in the audit log",
        by.contains_key(&first_id),
        first_id.clone(),
    );
    if !log_lines.is_empty() {
        println!("\nnetcm's log lines about tokens or 401s:");
        for l in log_lines.iter().take(20) {
            println!("  {l}");
        }
    }
    if !failed.is_empty() {
        println!("\nnetcm's log, last 40 lines:");
        for l in logs
            .1
            .lines()
            .rev()
            .take(40)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
        {
            println!("  {l}");
        }
        eprintln!("token-expiry FAILED:\n  {}", failed.join("\n  "));
        std::process::exit(1);
    }
}
