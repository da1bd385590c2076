//! The probe pods of the pod network tests and benchmark (`hack/image.sh probe`): one per node through a
//! DaemonSet, an HTTP server on 8080 that answers with its pod's name, and `kubectl exec … /probe
//! ping|get|stream` as the client.

use std::collections::BTreeMap;
use std::net::IpAddr;

use crate::multinode::Cluster;
use serde_json::Value;

/// The port every probe pod serves HTTP on.
pub const PORT: u16 = 8080;

/// A ready probe pod: its name, its node and its addresses.
#[derive(Debug, Clone)]
pub struct ProbePod {
    pub name: String,
    pub node: String,
    pub ips: Vec<IpAddr>,
}

/// The probe DaemonSet (one pod per schedulable node) and the ClusterIP Service `probe` in front of it.
pub fn daemonset(image: &str) -> String {
    format!(
        r#"apiVersion: apps/v1
kind: DaemonSet
metadata: {{name: probe, namespace: default}}
spec:
  selector: {{matchLabels: {{app: probe}}}}
  template:
    metadata: {{labels: {{app: probe}}}}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
        - name: probe
          image: {image}
          imagePullPolicy: Never
          args: [serve, "{PORT}"]
          env: [{{name: POD_NAME, valueFrom: {{fieldRef: {{fieldPath: metadata.name}}}}}}]
          readinessProbe: {{tcpSocket: {{port: {PORT}}}, periodSeconds: 1}}
---
apiVersion: v1
kind: Service
metadata: {{name: probe, namespace: default}}
spec:
  selector: {{app: probe}}
  ports: [{{port: 80, targetPort: {PORT}}}]
"#
    )
}

/// The probe pods that run and are ready, by node.
pub async fn ready_pods(cluster: &Cluster) -> BTreeMap<String, ProbePod> {
    let pods = cluster
        .get_json(&["pods", "-n", "default", "-l", "app=probe"])
        .await;
    let mut by_node = BTreeMap::new();
    for p in pods["items"].as_array().into_iter().flatten() {
        let ready = p["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "Ready" && c["status"] == "True");
        if !ready || p["metadata"]["deletionTimestamp"] != Value::Null {
            continue;
        }
        let ips = p["status"]["podIPs"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|i| i["ip"].as_str()?.parse().ok())
            .collect();
        let pod = ProbePod {
            name: p["metadata"]["name"].as_str().unwrap_or_default().into(),
            node: p["spec"]["nodeName"].as_str().unwrap_or_default().into(),
            ips,
        };
        by_node.insert(pod.node.clone(), pod);
    }
    by_node
}

/// `/probe ARGS` in the pod: (success, output).
pub async fn exec(cluster: &Cluster, pod: &str, args: &[&str]) -> (bool, String) {
    let mut a = vec!["exec", "-n", "default", pod, "--", "/probe"];
    a.extend_from_slice(args);
    let (ok, out, err) = cluster.try_kubectl(&a).await;
    (ok, format!("{out}{err}").trim().to_string())
}

/// Echo streams running in the background: every pod to the next (by node name, the last to the first),
/// one stream per address of the next pod's, each `count` echoes `interval_ms` apart.
pub struct EchoStreams {
    count: String,
    streams: Vec<tokio::task::JoinHandle<(String, String, bool, String)>>,
}

impl EchoStreams {
    pub fn start(
        cluster: &Cluster,
        pods: &BTreeMap<String, ProbePod>,
        count: &str,
        interval_ms: &str,
    ) -> EchoStreams {
        let list: Vec<&ProbePod> = pods.values().collect();
        let mut streams = Vec::new();
        for (i, from) in list.iter().enumerate() {
            let to = list[(i + 1) % list.len()];
            for ip in &to.ips {
                let (c, from, ip) = (cluster.clone(), from.name.clone(), ip.to_string());
                let (count, interval) = (count.to_string(), interval_ms.to_string());
                streams.push(tokio::spawn(async move {
                    let (ok, out) = exec(&c, &from, &["stream", &ip, &count, &interval]).await;
                    (from, ip, ok, out)
                }));
            }
        }
        EchoStreams {
            count: count.to_string(),
            streams,
        }
    }

    /// How many streams there are, and how many have ended.
    pub fn ended(&self) -> (usize, usize) {
        let ended = self.streams.iter().filter(|s| s.is_finished()).count();
        (self.streams.len(), ended)
    }

    /// Waits for every stream and checks each echo was answered; `during` names what happened meanwhile.
    /// Returns one stream's result line.
    pub async fn assert_every_echo_answered(self, during: &str) -> String {
        let mut line = String::new();
        for s in self.streams {
            let (from, ip, ok, out) = s.await.expect("stream task");
            assert!(ok, "{from} -> {ip}: {out}");
            assert_eq!(
                out,
                format!("sent {0} received {0}", self.count),
                "{from} -> {ip} lost echoes while {during}"
            );
            line = out;
        }
        line
    }
}

/// host:port for an address of either family.
pub fn hostport(ip: &IpAddr, port: u16) -> String {
    match ip {
        IpAddr::V4(v4) => format!("{v4}:{port}"),
        IpAddr::V6(v6) => format!("[{v6}]:{port}"),
    }
}

/// A fresh pod's IPv6 addresses (and its node's new cni0 gateway) go through duplicate address detection
/// for a second or two after the pod is Ready: a probe may be repeated within this many tries, 1 s apart,
/// and the matrix shows how many it took.
const TRIES: usize = 5;

async fn attempt(
    cluster: &Cluster,
    pod: &str,
    args: &[&str],
    want: Option<&str>,
) -> (bool, String, usize) {
    let mut last = String::new();
    for n in 1..=TRIES {
        let (ok, out) = exec(cluster, pod, args).await;
        if ok && want.is_none_or(|w| out == w) {
            return (true, out, n);
        }
        last = out;
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
    (false, last, TRIES)
}

fn verdict(ok: bool, tries: usize) -> String {
    match (ok, tries) {
        (true, 1) => "ok".into(),
        (true, n) => format!("ok (try {n})"),
        (false, _) => "FAIL".into(),
    }
}

/// Every probe pod to every other pod's every address, by ICMP and TCP: the failures (empty when all
/// pass) and the matrix as text, one line per (from, to, address).
pub async fn matrix(cluster: &Cluster, pods: &BTreeMap<String, ProbePod>) -> (Vec<String>, String) {
    let mut failures = Vec::new();
    let mut text = String::new();
    for from in pods.values() {
        for to in pods.values().filter(|p| p.node != from.node) {
            for ip in &to.ips {
                let (icmp, icmp_out, icmp_tries) =
                    attempt(cluster, &from.name, &["ping", &ip.to_string()], None).await;
                // The TCP answer must come from the pod addressed, not merely from something.
                let (tcp, tcp_out, tcp_tries) = attempt(
                    cluster,
                    &from.name,
                    &["get", &hostport(ip, PORT)],
                    Some(&to.name),
                )
                .await;
                text.push_str(&format!(
                    "{} ({}) -> {} ({}) {ip}: icmp {} tcp {}\n",
                    from.name,
                    from.node,
                    to.name,
                    to.node,
                    verdict(icmp, icmp_tries),
                    verdict(tcp, tcp_tries)
                ));
                if !icmp {
                    failures.push(format!("{} -> {ip} icmp: {icmp_out}", from.name));
                }
                if !tcp {
                    failures.push(format!("{} -> {ip} tcp: {tcp_out}", from.name));
                }
            }
        }
    }
    (failures, text)
}
