//! A warm standby's Node cache, proven fresh before its controllers start.
//!
//! A standby lists and watches Nodes while it waits for the Lease (`--warm-standby`), so that when it leads
//! it need not relist every Node first. But its cache is only as fresh as its watch: behind a lagging API
//! server it can miss a Node the previous leader created and gave CIDRs to just before it went
//! (`lagging_api_server.rs`), and a cache that misses a held CIDR gives it out again. A cold leader's
//! first list is a consistent read made after it took the Lease, so it holds every write the previous
//! leader could have made before that; the warm cache must be shown to be at least as new.
//!
//! The proof: a watch delivers a kind's changes in the order of etcd's revisions, so once the cache holds
//! a change this leader made *after* taking the Lease, it holds every Node change made before it. The
//! leader makes one: it adds [`ANNOTATION`] to one Node (any Node; it takes one from its cache) and
//! removes it again, so the Node ends as it was, and waits until the cache holds the removal's
//! resourceVersion. That costs two writes. Kubernetes offers no cheaper proof: a watch's bookmarks come
//! about once a minute, and a client cannot ask for a progress notification.
//!
//! When the proof cannot be made (no Node cached to write on, no permission to patch Nodes, the watch too
//! slow, an API error), the caller relists, as a cold leader would.

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use netcm_node::CachedNode;
use serde_json::json;

use super::{Informer, Manager};
use crate::duration::format_duration;
use crate::informer::version::revision;
use crate::informer::SharedInformer;

impl Manager {
    /// Proves the warm cache holds every Node change made before this term, or relists.
    pub(super) async fn catch_up(
        &self,
        nodes: &SharedInformer<CachedNode>,
        informer: &mut Informer,
    ) {
        let started = std::time::Instant::now();
        let result = match prove_fresh(&self.client, nodes, &self.lease.identity).await {
            Ok(Fresh::Written { node, revision }) => {
                tracing::info!(
                    node = %node,
                    resource_version = revision,
                    elapsed = %format_duration(started.elapsed()),
                    "the warm Node cache holds a write made after the Lease was won, so every earlier one too: no relist"
                );
                "proven"
            }
            Ok(Fresh::Empty) => {
                tracing::info!(
                    "the warm Node cache holds no Node to prove it fresh with; relisting"
                );
                informer.relist().await;
                "relisted"
            }
            Err(e) => {
                tracing::warn!(error = %e, "the warm Node cache could not be proven fresh; relisting every Node, as a cold leader does");
                informer.relist().await;
                "relisted"
            }
        };
        self.metrics.catch_ups.with_label_values(&[result]).inc();
    }
}

/// The annotation the proof writes on one Node and removes at once; its value is the new leader's
/// identity, so a value left behind by a leader that died between the two writes says whose it was.
pub const ANNOTATION: &str = "netcm.io/catching-up";

/// The proof's field manager, so an audit log tells its writes from the controllers'.
pub const FIELD_MANAGER: &str = "netcm-catch-up";

/// How long the watch may take to deliver the proof's write before the leader relists instead.
const DEADLINE: Duration = Duration::from_secs(30);

/// Cached Nodes tried in turn when the first is gone.
const CANDIDATES: usize = 3;

/// How the cache was shown to be fresh.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Fresh {
    /// The cache holds this leader's write on `node`, at `revision`.
    Written {
        /// The Node written.
        node: String,
        /// The resourceVersion of the second write.
        revision: u64,
    },
    /// The cache holds no Node to write: nothing to prove with (the caller relists, which costs
    /// little when there are truly no Nodes).
    Empty,
}

/// Why the proof could not be made.
#[derive(Debug, thiserror::Error)]
pub(super) enum CatchUpError {
    /// A write on the Node failed (deleted meanwhile, forbidden, the API server).
    #[error("writing the {ANNOTATION} annotation on Node {node}: {source}")]
    Write {
        /// The Node.
        node: String,
        /// Why.
        #[source]
        source: kube::Error,
    },
    /// The write's answer had no resourceVersion that is an etcd revision.
    #[error(
        "Node {node} was written at resourceVersion {version:?}, which is not an etcd revision"
    )]
    NoRevision {
        /// The Node.
        node: String,
        /// The answer's resourceVersion.
        version: Option<String>,
    },
    /// Every Node tried was gone (a cache this stale is relisted anyway).
    #[error("no Node to write: every cached Node tried was gone")]
    NoCandidate,
    /// The watch did not deliver the write in time.
    #[error("the Node watch had not delivered resourceVersion {revision} after {DEADLINE:?}")]
    Late {
        /// The write's resourceVersion.
        revision: u64,
    },
}

impl CatchUpError {
    /// Whether the Node written was not found.
    fn is_not_found(&self) -> bool {
        matches!(self, Self::Write { source: kube::Error::Api(status), .. } if status.code == 404)
    }
}

/// Writes on one Node after the Lease was taken and waits until `nodes` holds that write. `client` is the
/// leader's fenced client: the writes are this term's. The Node is one the cache holds (a Node deleted
/// since is skipped).
pub(super) async fn prove_fresh(
    client: &kube::Client,
    nodes: &SharedInformer<CachedNode>,
    identity: &str,
) -> Result<Fresh, CatchUpError> {
    let api: Api<Node> = Api::all(client.clone());
    // A few cached Nodes, in case one is gone: any Node's write is a proof.
    let candidates: Vec<String> = nodes
        .list()
        .iter()
        .take(CANDIDATES)
        .map(|n| n.name().to_string())
        .collect();
    if candidates.is_empty() {
        return Ok(Fresh::Empty);
    }
    let mut last = None;
    for node in candidates {
        match write_and_remove(&api, &node, identity).await {
            Ok(at) => {
                tokio::time::timeout(DEADLINE, nodes.wait_for_revision(at))
                    .await
                    .map_err(|_| CatchUpError::Late { revision: at })?;
                return Ok(Fresh::Written { node, revision: at });
            }
            // Gone since the cache saw it: try the next.
            Err(e) if e.is_not_found() => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or(CatchUpError::NoCandidate))
}

/// Adds [`ANNOTATION`] to `node` and removes it; the etcd revision of the removal.
async fn write_and_remove(
    api: &Api<Node>,
    node: &str,
    identity: &str,
) -> Result<u64, CatchUpError> {
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PatchParams::default()
    };
    let mut version = None;
    for value in [json!(identity), serde_json::Value::Null] {
        let body = json!({ "metadata": { "annotations": { ANNOTATION: value } } });
        let written = api
            .patch_metadata(node, &params, &Patch::Merge(&body))
            .await
            .map_err(|source| CatchUpError::Write {
                node: node.to_string(),
                source,
            })?;
        version = written.metadata.resource_version;
    }
    version
        .as_deref()
        .and_then(revision)
        .ok_or_else(|| CatchUpError::NoRevision {
            node: node.to_string(),
            version,
        })
}
