//! The allocator as `init` builds it, against a scripted API server
//! (`netcm_manager::test_support::harness`): each test runs the controller's prepare step and calls its
//! syncs itself, under tokio's paused clock, and every request the allocator sends is one the test
//! wrote down, in order, with its answer. What needs a real API server — etcd's answers to concurrent
//! writers, real watches, processes killed or frozen, a hand-over through a real Lease — stays in `e2e/`.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, NodeSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use netcm_manager::leader::Takeover;
use netcm_manager::test_support::harness::{ScriptedApi, Step};
use netcm_manager::{CachedNode, Controller, InitContext, Prepared, Reconciler, SyncOutcome};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use crate::allocator::{Allocator, SyncError};
use crate::blocks::FENCED_AT_ANNOTATION;
use crate::claims::{claim_name, GROUP, KIND, TERM_ANNOTATION, VERSION};
use crate::Flags;

mod claims;
mod exhaustion;
mod predecessor;
mod quarantine;
mod release_hold;
mod write;

/// Where PodCIDRClaims are listed and created.
const CLAIMS: &str = "/apis/ipam.netcm.io/v1alpha1/podcidrclaims";

/// How a JSON Patch says what it is.
const JSON_PATCH: &str = "application/json-patch+json";

/// How a strategic merge patch (a touch) says what it is.
const STRATEGIC: &str = "application/strategic-merge-patch+json";

/// The identity of the leader before the one under test, in the claims it left.
const EARLIER: &str = "netcm-earlier";

/// The path of Node `name`.
fn node_path(name: &str) -> String {
    format!("/api/v1/nodes/{name}")
}

/// The path of the PodCIDRClaim of `block`.
fn claim_path(block: &str) -> String {
    format!("{CLAIMS}/{}", claim_name(&block.parse().expect("a CIDR")))
}

/// A Node as the API serves it: UID `uid-<name>`, these pod CIDRs (the first also in `spec.podCIDR`)
/// and annotations — no map at all without any, as the API server leaves an empty one out.
fn node(name: &str, cidrs: &[&str], annotations: &[(&str, &str)]) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            uid: Some(format!("uid-{name}")),
            annotations: (!annotations.is_empty()).then(|| {
                annotations
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect::<BTreeMap<_, _>>()
            }),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            pod_cidr: cidrs.first().map(|c| c.to_string()),
            pod_cidrs: (!cidrs.is_empty()).then(|| cidrs.iter().map(|c| c.to_string()).collect()),
            ..Default::default()
        }),
        status: None,
    }
}

/// `node` with another UID: the Node deleted and created again under its name.
fn recreated(mut node: Node) -> Node {
    node.metadata.uid = node.metadata.uid.map(|uid| format!("{uid}-again"));
    node
}

/// `node` as the cache holds it.
fn cached(node: &Node) -> CachedNode {
    CachedNode::from(node)
}

/// A Node with nothing set, as the cache holds it.
fn plain(name: &str) -> CachedNode {
    cached(&node(name, &[], &[]))
}

/// `node` as the API answers with it.
fn body(node: &Node) -> Value {
    serde_json::to_value(node).expect("a Node is JSON")
}

/// A NodeList of `nodes`, one page.
fn node_list(nodes: &[Node]) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "NodeList",
        "metadata": { "resourceVersion": "100" },
        "items": nodes.iter().map(body).collect::<Vec<_>>(),
    })
}

/// A PodCIDRClaim of `block` as the API serves it, naming `term` (an earlier version's names none).
fn claim(block: &str, term: Option<&str>) -> Value {
    let annotations: BTreeMap<&str, &str> =
        term.map(|t| (TERM_ANNOTATION, t)).into_iter().collect();
    json!({
        "apiVersion": format!("{GROUP}/{VERSION}"),
        "kind": KIND,
        "metadata": { "name": claim_name(&block.parse().expect("a CIDR")), "annotations": annotations },
        "spec": { "cidr": block },
    })
}

/// The list of PodCIDRClaims `claims`.
fn claim_list(claims: Vec<Value>) -> Value {
    json!({
        "apiVersion": format!("{GROUP}/{VERSION}"),
        "kind": format!("{KIND}List"),
        "metadata": { "resourceVersion": "100" },
        "items": claims,
    })
}

/// The create of the claim of `block` this leader (`term`) sends.
fn claim_create(block: &str, term: &str) -> Step {
    Step::post(CLAIMS).json(json!({
        "apiVersion": format!("{GROUP}/{VERSION}"),
        "kind": KIND,
        "metadata": {
            "name": claim_name(&block.parse().expect("a CIDR")),
            "labels": { "app.kubernetes.io/managed-by": "netcm" },
            "annotations": { TERM_ANNOTATION: term },
        },
        "spec": { "cidr": block },
    }))
}

/// The PATCH giving `node` `cidrs`, testing its UID and its fence annotation as `node` shows them (a
/// Node without annotations is tested for having none).
fn cidr_patch(node: &Node, cidrs: &[&str]) -> Step {
    let name = node.metadata.name.clone().unwrap_or_default();
    let fence_test = match &node.metadata.annotations {
        None => json!({ "op": "test", "path": "/metadata/annotations", "value": null }),
        Some(a) => json!({
            "op": "test",
            "path": "/metadata/annotations/ipam.netcm.io~1fenced-at",
            "value": a.get(FENCED_AT_ANNOTATION),
        }),
    };
    Step::patch(&node_path(&name))
        .content_type(JSON_PATCH)
        .json(json!([
            { "op": "test", "path": "/metadata/uid", "value": node.metadata.uid },
            fence_test,
            { "op": "add", "path": "/spec/podCIDR", "value": cidrs[0] },
            { "op": "add", "path": "/spec/podCIDRs", "value": cidrs },
        ]))
}

/// A touch of the Node `name`: a strategic merge patch setting the fence annotation, testing its UID.
fn touch(name: &str) -> Step {
    let uid = format!("uid-{name}");
    Step::patch(&node_path(name))
        .content_type(STRATEGIC)
        .check(move |body| {
            assert_eq!(
                body["metadata"]["uid"],
                json!(uid),
                "the touch tests the UID"
            );
            let stamp = body["metadata"]["annotations"][FENCED_AT_ANNOTATION].as_str();
            assert!(
                stamp.is_some_and(|s| s.parse::<jiff::Timestamp>().is_ok()),
                "the touch sets the fence annotation to a timestamp: {body}"
            );
        })
}

/// The fence annotation a touch of the Node at `path` set, from the requests `api` saw.
fn fence_set(api: &ScriptedApi, path: &str) -> String {
    api.requests()
        .iter()
        .filter(|r| r.path == path && r.content_type.as_deref() == Some(STRATEGIC))
        .find_map(|r| {
            r.body.as_ref()?["metadata"]["annotations"][FENCED_AT_ANNOTATION]
                .as_str()
                .map(str::to_string)
        })
        .expect("a touch of the node")
}

/// The allocator `init` built, with the API it talks to and the context it was built from.
struct Allocating {
    api: ScriptedApi,
    ctx: InitContext,
    controller: Controller,
    allocator: Arc<Allocator>,
}

impl Allocating {
    /// The allocator of `args` (and `--cluster-cidr-objects=false`: no ClusterCIDR watch to script),
    /// leading as the harness's identity after a first start, its cache holding `nodes`.
    fn start(args: &[&str], nodes: Vec<CachedNode>) -> Self {
        Self::taking_over(args, nodes, None)
    }

    /// [`Allocating::start`], having taken the Lease over from `takeover`.
    fn taking_over(args: &[&str], nodes: Vec<CachedNode>, takeover: Option<Takeover>) -> Self {
        let api = ScriptedApi::new();
        let ctx = api
            .context()
            .nodes(nodes)
            .leading(netcm_manager::test_support::harness::IDENTITY, takeover)
            .build()
            .expect("context");
        let mut all = vec!["--cluster-cidr-objects=false"];
        all.extend_from_slice(args);
        let flags: Flags = netcm_manager::test_support::parse_flags(&all).expect("flags");
        let (allocator, controller) = crate::build(&flags, &ctx)
            .expect("init")
            .expect("allocating");
        Self {
            api,
            ctx,
            controller,
            allocator,
        }
    }

    /// Runs the prepare step, which must let the workers start.
    async fn prepare(&mut self) {
        let prepared = self.controller.prepare_now(CancellationToken::new()).await;
        assert_eq!(prepared, Prepared::Ready);
    }

    /// [`Allocating::prepare`] after the claims list answers `claims`.
    async fn prepare_with_claims(&mut self, claims: Vec<Value>) {
        self.api
            .expect(Step::get(CLAIMS).reply(200, claim_list(claims)));
        self.prepare().await;
    }

    /// One sync of `name`, as a worker runs it.
    async fn sync(&self, name: &str) -> Result<SyncOutcome, SyncError> {
        Reconciler::sync(&*self.allocator, name).await
    }

    /// A sync of `name` that must end done.
    async fn synced(&self, name: &str) {
        let outcome = self.sync(name).await;
        assert!(
            matches!(outcome, Ok(SyncOutcome::Done)),
            "{name}: {outcome:?}"
        );
    }

    /// The watch bringing `node`, as it is now, into the cache.
    fn watch_shows(&self, node: &Node) {
        self.ctx.nodes.apply(cached(node));
    }

    /// Who holds `cidr` in the ledger (a Node's UID, or a reservation such as the quarantine's).
    fn holder_of(&self, cidr: &str) -> Option<String> {
        let cidr = cidr.parse().expect("a CIDR");
        self.allocator
            .state
            .lock()
            .pools
            .holder_of(cidr)
            .map(str::to_string)
    }

    /// What the ledger holds for the Node `name` (UID `uid-<name>`).
    fn held_by(&self, name: &str) -> Vec<String> {
        let uid = format!("uid-{name}");
        let state = self.allocator.state.lock();
        state
            .pools
            .held_by(&uid)
            .unwrap_or_default()
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    /// The value of the metric `name` with these labels, or `None`.
    fn metric(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let family = self
            .ctx
            .registry
            .gather()
            .into_iter()
            .find(|f| f.name() == name)?;
        family.get_metric().iter().find_map(|m| {
            let all = labels.iter().all(|(k, v)| {
                m.get_label()
                    .iter()
                    .any(|l| l.name() == *k && l.value() == *v)
            });
            all.then(|| match family.get_field_type() {
                prometheus::proto::MetricType::COUNTER => m.get_counter().get_value(),
                _ => m.get_gauge().get_value(),
            })
        })
    }

    /// The reasons of the Events on the Node `name`, in the order they were sent.
    fn events_on(&self, name: &str) -> Vec<(String, String)> {
        self.api
            .events()
            .into_iter()
            .filter(|e| e.regarding == name)
            .map(|e| (e.reason, e.note))
            .collect()
    }
}
