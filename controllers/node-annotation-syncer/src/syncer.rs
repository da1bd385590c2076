//! The sync handler: one Node key at a time, level-triggered from the cache; at most one merge PATCH of
//! the lease annotations that differ, behind the leader fence.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use netcm_manager::{EventRecorder, EventType, Fenced, LeaderGuard, SharedInformer, SyncOutcome};
use netcm_workqueue::Queue;

use crate::flags::Config;
use crate::lease::{self, Instead, InvalidOverwrite, Waiting};
use crate::metrics::SyncerMetrics;

/// The controller's name: its workqueue, metrics label and log field.
pub const NAME: &str = "node-annotation-syncer";

/// The Event reason for an unusable overwrite annotation.
pub const REASON_INVALID_OVERWRITE: &str = "InvalidPublicIPOverwrite";

/// A sync that must be retried with backoff.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    /// This process may not write now.
    #[error(transparent)]
    Fenced(#[from] Fenced),
    /// The PATCH failed.
    #[error("patching lease annotations: {0}")]
    Patch(#[from] kube::Error),
}

/// A write the cache may not have seen yet.
struct Written {
    /// The resourceVersion of the cached Node the write was computed from.
    base_rv: String,
    /// What was written.
    values: BTreeMap<String, String>,
}

/// Per-Node memory; everything here is dropped when the Node is gone.
#[derive(Default)]
struct State {
    /// netcm's last write per Node, until the cache moves past the version it was based on.
    written: HashMap<String, Written>,
    /// Invalid overwrite values already reported, per Node: key → value.
    reported: HashMap<String, BTreeMap<String, String>>,
    /// Why a Node has nothing published, for the gauge.
    waiting: HashMap<String, &'static str>,
}

/// The syncer's shared state.
pub struct Syncer {
    pub(crate) nodes: SharedInformer<Node>,
    pub(crate) api: Api<Node>,
    pub(crate) config: Config,
    pub(crate) recorder: EventRecorder,
    pub(crate) guard: LeaderGuard,
    pub(crate) metrics: SyncerMetrics,
    pub(crate) queue: Queue<String>,
    state: Mutex<State>,
}

impl Syncer {
    /// Builds the syncer (spawns nothing).
    pub(crate) fn new(
        nodes: SharedInformer<Node>,
        api: Api<Node>,
        config: Config,
        recorder: EventRecorder,
        guard: LeaderGuard,
        metrics: SyncerMetrics,
        queue: Queue<String>,
    ) -> Arc<Self> {
        Arc::new(Self {
            nodes,
            api,
            config,
            recorder,
            guard,
            metrics,
            queue,
            state: Mutex::new(State::default()),
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Forgets a Node that is gone.
    fn forget(&self, name: &str) {
        let mut st = self.state();
        st.written.remove(name);
        st.reported.remove(name);
        let from = st.waiting.remove(name);
        drop(st);
        self.metrics.waiting_moved(from, None);
    }

    fn set_waiting(&self, name: &str, waiting: Option<&Waiting>) {
        let to = waiting.map(Waiting::label);
        let mut st = self.state();
        let from = match to {
            Some(r) => st.waiting.insert(name.to_string(), r),
            None => st.waiting.remove(name),
        };
        drop(st);
        self.metrics.waiting_moved(from, to);
    }

    /// The Node's annotations as the API server has them: the cache's, plus netcm's own last write while
    /// the cache still shows the version that write was based on. Without this, a second event queued
    /// before the write's watch event arrives would PATCH the same values again.
    fn current_annotations(&self, name: &str, node: &Node) -> BTreeMap<String, String> {
        let mut current = node.metadata.annotations.clone().unwrap_or_default();
        let rv = node.metadata.resource_version.as_deref();
        let mut st = self.state();
        if let Some(w) = st.written.get(name) {
            if rv == Some(w.base_rv.as_str()) {
                current.extend(w.values.clone());
            } else {
                st.written.remove(name);
            }
        }
        current
    }

    /// Reports each invalid overwrite value once per Node: a Warning Event, a log line and the counter.
    async fn report_invalid(&self, node: &Node, name: &str, invalid: &[InvalidOverwrite]) {
        let fresh: Vec<&InvalidOverwrite> = {
            let mut st = self.state();
            if invalid.is_empty() {
                st.reported.remove(name);
                Vec::new()
            } else {
                let seen = st.reported.entry(name.to_string()).or_default();
                seen.retain(|k, _| invalid.iter().any(|i| &i.key == k));
                invalid
                    .iter()
                    .filter(|i| {
                        seen.insert(i.key.clone(), i.value.clone()).as_ref() != Some(&i.value)
                    })
                    .collect()
            }
        };
        for i in fresh {
            self.metrics.invalid_overwrite(i.family);
            let instead = match &i.instead {
                Instead::Kept(v) => format!("the last good value {v} stays"),
                Instead::FromAddresses(v) => format!("{v} from the node's addresses is used"),
                Instead::Nothing => "nothing is published until the node has an address".into(),
            };
            tracing::warn!(controller = NAME, node = name, annotation = %i.key, value = %i.value, reason = i.why, "ignoring invalid public IP overwrite");
            let note = format!(
                "annotation {} = {:?} is not a usable {} address ({}); {instead}",
                i.key,
                i.value,
                i.family.label(),
                i.why
            );
            self.recorder
                .publish(
                    node,
                    EventType::Warning,
                    REASON_INVALID_OVERWRITE,
                    "PublishLease",
                    note,
                )
                .await;
        }
    }

    /// The sync handler: publish the lease of one Node if anything differs. Decides from the cache alone.
    pub async fn sync_node(&self, name: &str) -> Result<SyncOutcome, SyncError> {
        let Some(node) = self.nodes.get(name) else {
            self.forget(name);
            return Ok(SyncOutcome::Done);
        };
        if node.metadata.deletion_timestamp.is_some() {
            // Going away: a lease for it would only make peers route to it a little longer.
            return Ok(SyncOutcome::Done);
        }
        let current = self.current_annotations(name, &node);
        let plan = lease::plan(&self.config, &node, &current);
        self.report_invalid(&node, name, &plan.invalid).await;
        self.set_waiting(name, plan.waiting.as_ref());
        if let Some(w) = &plan.waiting {
            // Nothing to retry on a timer: the change that fixes it (pod CIDR, address) is a Node update.
            tracing::debug!(controller = NAME, node = name, reason = %w, "not publishing a lease yet");
            return Ok(SyncOutcome::Done);
        }
        if plan.changes.is_empty() {
            return Ok(SyncOutcome::Done);
        }
        self.guard.ensure_leader()?;
        let patch = serde_json::json!({ "metadata": { "annotations": &plan.changes } });
        self.metrics.writes.inc();
        match self
            .api
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {
                let changed: Vec<String> = plan
                    .changes
                    .iter()
                    .map(|(k, v)| {
                        let short = k.strip_prefix(&self.config.keys.prefix).unwrap_or(k);
                        format!("{short}={v}")
                    })
                    .collect();
                tracing::info!(controller = NAME, node = name, changed = %changed.join(","), "published lease annotations");
                if let Some(rv) = node.metadata.resource_version.clone() {
                    self.state().written.insert(
                        name.to_string(),
                        Written {
                            base_rv: rv,
                            values: plan.changes,
                        },
                    );
                }
                Ok(SyncOutcome::Done)
            }
            Err(kube::Error::Api(s)) if s.code == 404 => {
                self.forget(name);
                Ok(SyncOutcome::Done)
            }
            Err(e) => Err(SyncError::Patch(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::Family;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    const P: &str = "flannel.alpha.coreos.com/";

    /// A syncer whose client points at a closed port: nothing here reaches an API server.
    fn syncer() -> Arc<Syncer> {
        let registry = prometheus::Registry::new();
        let config = kube::Config::new("http://127.0.0.1:9".parse().expect("uri"));
        let client = kube::Client::try_from(config).expect("client");
        let flags = crate::Flags {
            annotation_prefix: "flannel.alpha.coreos.com".into(),
            backend_type: "host-gw".into(),
            public_ip_address_types: vec!["InternalIP".into(), "ExternalIP".into()],
            concurrent_node_annotation_syncs: 1,
        };
        Syncer::new(
            SharedInformer::new(Arc::new(|_: &mut Node| {})),
            Api::all(client.clone()),
            flags.config().expect("config"),
            EventRecorder::new(client, "netcm", "test"),
            LeaderGuard::disabled(&registry).expect("guard"),
            SyncerMetrics::register(&registry).expect("metrics"),
            netcm_workqueue::Queue::new(
                NAME,
                netcm_workqueue::RateLimiter::default_controller(),
                None,
            ),
        )
    }

    fn node(rv: &str, annotations: &[(&str, &str)]) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some("n1".into()),
                resource_version: Some(rv.into()),
                annotations: Some(
                    annotations
                        .iter()
                        .map(|(k, v)| (format!("{P}{k}"), v.to_string()))
                        .collect(),
                ),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn netcms_own_write_counts_until_the_cache_moves_past_the_version_it_was_based_on() {
        let s = syncer();
        s.state().written.insert(
            "n1".into(),
            Written {
                base_rv: "5".into(),
                values: [(format!("{P}public-ip"), "192.0.2.10".to_string())].into(),
            },
        );
        let stale = s.current_annotations("n1", &node("5", &[]));
        assert_eq!(
            stale.get(&format!("{P}public-ip")).map(String::as_str),
            Some("192.0.2.10")
        );
        let moved_on = s.current_annotations("n1", &node("6", &[("public-ip", "192.0.2.11")]));
        assert_eq!(
            moved_on.get(&format!("{P}public-ip")).map(String::as_str),
            Some("192.0.2.11")
        );
        assert!(
            s.state().written.is_empty(),
            "the memory is dropped once the cache moved on"
        );
    }

    #[tokio::test]
    async fn an_invalid_overwrite_is_counted_once_per_value_and_again_when_it_changes() {
        let s = syncer();
        let bad = |value: &str| InvalidOverwrite {
            family: Family::V4,
            key: format!("{P}public-ip-overwrite"),
            value: value.into(),
            why: "not an IP address",
            instead: Instead::Nothing,
        };
        let n = node("1", &[]);
        let count = || s.metrics.invalid.with_label_values(&["ipv4"]).get();
        s.report_invalid(&n, "n1", &[bad("x")]).await;
        s.report_invalid(&n, "n1", &[bad("x")]).await;
        assert_eq!(count(), 1);
        s.report_invalid(&n, "n1", &[bad("y")]).await;
        assert_eq!(count(), 2);
        // Fixed, then broken again with the first value: that is news again.
        s.report_invalid(&n, "n1", &[]).await;
        s.report_invalid(&n, "n1", &[bad("x")]).await;
        assert_eq!(count(), 3);
    }

    #[tokio::test]
    async fn the_waiting_gauge_follows_each_node_and_forgets_deleted_ones() {
        let s = syncer();
        let gauge = |r: &str| s.metrics.waiting.with_label_values(&[r]).get();
        s.set_waiting("n1", Some(&Waiting::NoPodCidr));
        s.set_waiting("n2", Some(&Waiting::NoPodCidr));
        assert_eq!(gauge("no_pod_cidr"), 2);
        s.set_waiting("n1", Some(&Waiting::NoAddress(vec![Family::V6])));
        assert_eq!((gauge("no_pod_cidr"), gauge("no_address")), (1, 1));
        s.set_waiting("n1", None);
        s.forget("n2");
        assert_eq!((gauge("no_pod_cidr"), gauge("no_address")), (0, 0));
    }
}
