//! Node fixtures: create Nodes with addresses, pod CIDRs and annotations; read them back.

use std::collections::BTreeMap;
use std::time::Duration;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::{Node, NodeAddress, NodeSpec, NodeStatus};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};

use crate::wait_for;

/// What a test Node carries.
#[derive(Debug, Clone, Default)]
pub struct NodeFixture {
    pub name: String,
    /// (type, address), e.g. ("InternalIP", "192.0.2.10").
    pub addresses: Vec<(String, String)>,
    pub pod_cidrs: Vec<String>,
    pub annotations: BTreeMap<String, String>,
    pub labels: BTreeMap<String, String>,
    /// `status.capacity.pods`, sent with the create as a kubelet registers (so no allocator ever sees
    /// the Node without it).
    pub capacity_pods: Option<u32>,
    /// `spec.providerID`: the machine the Node runs on, as a cloud provider names it.
    pub provider_id: Option<String>,
}

impl NodeFixture {
    pub fn named(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            ..Default::default()
        }
    }

    pub fn internal_ip(mut self, ip: &str) -> Self {
        self.addresses.push(("InternalIP".into(), ip.into()));
        self
    }

    pub fn address(mut self, kind: &str, ip: &str) -> Self {
        self.addresses.push((kind.into(), ip.into()));
        self
    }

    pub fn pod_cidrs(mut self, cidrs: &[&str]) -> Self {
        self.pod_cidrs = cidrs.iter().map(|s| s.to_string()).collect();
        self
    }

    pub fn annotation(mut self, k: &str, v: &str) -> Self {
        self.annotations.insert(k.into(), v.into());
        self
    }

    pub fn label(mut self, k: &str, v: &str) -> Self {
        self.labels.insert(k.into(), v.into());
        self
    }

    pub fn pods(mut self, pods: u32) -> Self {
        self.capacity_pods = Some(pods);
        self
    }

    pub fn provider_id(mut self, id: &str) -> Self {
        self.provider_id = Some(id.into());
        self
    }
}

/// Creates the Node (and its status addresses with a status PATCH, as a kubelet would).
pub async fn create_node(client: &kube::Client, f: &NodeFixture) -> Node {
    let api: Api<Node> = Api::all(client.clone());
    let node = Node {
        metadata: ObjectMeta {
            name: Some(f.name.clone()),
            annotations: (!f.annotations.is_empty()).then(|| f.annotations.clone()),
            labels: (!f.labels.is_empty()).then(|| f.labels.clone()),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            pod_cidr: f.pod_cidrs.first().cloned(),
            pod_cidrs: (!f.pod_cidrs.is_empty()).then(|| f.pod_cidrs.clone()),
            provider_id: f.provider_id.clone(),
            ..Default::default()
        }),
        status: f.capacity_pods.map(|pods| NodeStatus {
            capacity: Some([("pods".to_string(), Quantity(pods.to_string()))].into()),
            ..Default::default()
        }),
    };
    let created = api
        .create(&PostParams::default(), &node)
        .await
        .unwrap_or_else(|e| panic!("create node {}: {e}", f.name));
    if f.addresses.is_empty() {
        return created;
    }
    set_addresses(client, &f.name, &f.addresses).await
}

/// Replaces a Node's `status.addresses`.
pub async fn set_addresses(
    client: &kube::Client,
    name: &str,
    addresses: &[(String, String)],
) -> Node {
    let api: Api<Node> = Api::all(client.clone());
    let addrs: Vec<NodeAddress> = addresses
        .iter()
        .map(|(t, a)| NodeAddress {
            type_: t.clone(),
            address: a.clone(),
        })
        .collect();
    let patch = serde_json::json!({ "status": { "addresses": addrs } });
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap_or_else(|e| panic!("patch status of node {name}: {e}"))
}

/// The Node's pod CIDRs (`spec.podCIDRs`), empty if none.
pub fn pod_cidrs(node: &Node) -> Vec<String> {
    node.spec
        .as_ref()
        .and_then(|s| s.pod_cidrs.clone())
        .unwrap_or_default()
}

/// Creates many Nodes with `concurrency` parallel creators.
pub async fn create_nodes(client: &kube::Client, fixtures: Vec<NodeFixture>, concurrency: usize) {
    use futures::StreamExt;
    futures::stream::iter(fixtures)
        .map(|f| {
            let client = client.clone();
            async move {
                create_node(&client, &f).await;
            }
        })
        .buffer_unordered(concurrency)
        .collect::<Vec<_>>()
        .await;
}

/// Every Node in the cluster.
pub async fn all_nodes(client: &kube::Client) -> Vec<Node> {
    let api: Api<Node> = Api::all(client.clone());
    api.list(&kube::api::ListParams::default())
        .await
        .expect("list nodes")
        .items
}

/// Waits until the cluster has exactly `expected` Nodes, each with pod CIDRs; returns them.
pub async fn wait_all_allocated(
    client: &kube::Client,
    expected: usize,
    timeout: Duration,
) -> Vec<Node> {
    crate::wait_for(
        &format!("all {expected} nodes to have pod CIDRs"),
        timeout,
        || async {
            let nodes = all_nodes(client).await;
            (nodes.len() == expected && nodes.iter().all(|n| !pod_cidrs(n).is_empty()))
                .then_some(nodes)
        },
    )
    .await
}

/// Panics if any two CIDRs held by different Nodes overlap, naming both, or if a pod CIDR is no CIDR
/// (dropping it would clear a Node the check cannot judge).
pub fn assert_no_overlaps(nodes: &[Node]) {
    let cidrs = nodes.iter().flat_map(|n| {
        let name = n.metadata.name.clone().unwrap_or_default();
        pod_cidrs(n).into_iter().map(move |c| {
            let net = c
                .parse::<ipnet::IpNet>()
                .unwrap_or_else(|e| panic!("{name} holds pod CIDR {c:?}, which is no CIDR: {e}"));
            (net, name.clone())
        })
    });
    if let Some(((an, a), (bn, b))) = crate::overlaps::overlapping_pairs(cidrs).first() {
        panic!("{an} holds {a} and {bn} holds {b}: they overlap");
    }
}

/// Creates `count` plain Nodes named `<prefix>-<i>`, 16 at a time; returns their names.
pub async fn create_named(client: &kube::Client, prefix: &str, count: usize) -> Vec<String> {
    let names: Vec<String> = (0..count).map(|i| format!("{prefix}-{i}")).collect();
    create_nodes(client, names.iter().map(NodeFixture::named).collect(), 16).await;
    names
}

/// How many of the Nodes `names` hold pod CIDRs now (0 if the list fails).
pub async fn count_allocated(client: &kube::Client, names: &[String]) -> usize {
    let api: Api<Node> = Api::all(client.clone());
    let Ok(list) = api.list(&kube::api::ListParams::default()).await else {
        return 0;
    };
    list.items
        .iter()
        .filter(|n| n.metadata.name.as_ref().is_some_and(|m| names.contains(m)))
        .filter(|n| !pod_cidrs(n).is_empty())
        .count()
}

/// Waits until every named Node has pod CIDRs; returns name → CIDRs.
pub async fn wait_allocated(
    client: &kube::Client,
    names: &[String],
    timeout: Duration,
) -> BTreeMap<String, Vec<IpNet>> {
    let api: Api<Node> = Api::all(client.clone());
    wait_for(
        &format!("{} nodes to have pod CIDRs", names.len()),
        timeout,
        || async {
            let mut out = BTreeMap::new();
            for n in names {
                let node = api.get_opt(n).await.ok()??;
                let cidrs = pod_cidrs(&node);
                if cidrs.is_empty() {
                    return None;
                }
                let parsed = cidrs
                    .iter()
                    .map(|c| c.parse().ok())
                    .collect::<Option<_>>()?;
                out.insert(n.clone(), parsed);
            }
            Some(out)
        },
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holding(name: &str, cidrs: &[&str]) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            spec: Some(NodeSpec {
                pod_cidrs: Some(cidrs.iter().map(|c| c.to_string()).collect()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn nodes_holding_disjoint_cidrs_pass_the_overlap_check() {
        assert_no_overlaps(&[
            holding("a", &["10.0.0.0/24"]),
            holding("b", &["10.0.1.0/24", "fd00::/64"]),
        ]);
    }

    #[test]
    #[should_panic(expected = "a holds 10.0.0.0/16 and b holds 10.0.1.0/24: they overlap")]
    fn nodes_holding_overlapping_cidrs_fail_the_overlap_check() {
        assert_no_overlaps(&[
            holding("a", &["10.0.0.0/16"]),
            holding("b", &["10.0.1.0/24"]),
        ]);
    }

    /// Dropping what does not parse would let a Node the check cannot judge pass as clear.
    #[test]
    #[should_panic(expected = "b holds pod CIDR \"10.0.1.0/33\", which is no CIDR")]
    fn a_pod_cidr_that_is_no_cidr_fails_the_overlap_check() {
        assert_no_overlaps(&[
            holding("a", &["10.0.0.0/24"]),
            holding("b", &["10.0.1.0/33"]),
        ]);
    }
}
