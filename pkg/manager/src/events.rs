//! Kubernetes Events (events.k8s.io/v1) about the objects controllers act on, reported by controller
//! `netcm`: kube-runtime's [`Recorder`] (client-go's scheme: events about cluster-scoped objects go to
//! namespace `default`, named `<object>.<hex nanos>`; a repeat of an event — same object, type, reason
//! and action — within six minutes PATCHes the first one's `series` instead of creating another). It
//! sends through the client it is given, in the manager the shared one, so every Event passes the token
//! bucket and the leader fence.
//!
//! In front of it, the same event (object, reason, note) is recorded at most once per [`DEDUP_WINDOW`],
//! so a Node that fails on every retry does not flood the API; the log line and the metric still count
//! every occurrence. An event that failed to record is not a repeat: the next occurrence tries again.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, Recorder, Reporter};
use kube::Resource;

pub use kube::runtime::events::EventType;

use crate::ttl_cache::TtlCache;

/// How long an identical event is suppressed after it was recorded.
pub const DEDUP_WINDOW: Duration = Duration::from_secs(300);
/// Distinct events remembered for [`DEDUP_WINDOW`] at most; beyond it the oldest are forgotten.
const DEDUP_CAPACITY: usize = 10_000;
/// The API server's limits on an Event's note and reporting instance.
const MAX_NOTE: usize = 1024;
const MAX_INSTANCE: usize = 128;

/// (kind, namespace, name, reason, note): what makes two events the same for deduplication.
type EventKey = (String, Option<String>, String, String, String);

/// Records Events; cheap to clone.
#[derive(Clone)]
pub struct EventRecorder {
    recorder: Recorder,
    recent: Arc<TtlCache<EventKey, ()>>,
}

impl EventRecorder {
    /// A recorder reporting as `controller` from `instance` (this process's identity), sending with `client`.
    pub fn new(client: kube::Client, controller: &str, instance: &str) -> Self {
        let reporter = Reporter {
            controller: controller.to_string(),
            instance: Some(instance.chars().take(MAX_INSTANCE).collect()),
        };
        Self {
            recorder: Recorder::new(client, reporter),
            recent: Arc::new(TtlCache::new(DEDUP_WINDOW).bounded(DEDUP_CAPACITY)),
        }
    }

    /// Records an event about the object `regarding` (a Node's [`crate::CachedNode::object_ref`], or
    /// [`reference`] of any other object). Failures are logged, never returned: an event must not fail a
    /// sync.
    pub async fn publish(
        &self,
        regarding: &ObjectReference,
        kind: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) {
        let object_kind = regarding.kind.clone().unwrap_or_default();
        let name = regarding.name.clone().unwrap_or_default();
        let key = (
            object_kind.clone(),
            regarding.namespace.clone(),
            name.clone(),
            reason.to_string(),
            note.clone(),
        );
        if !self.recent.insert_if_absent(key.clone(), ()) {
            return;
        }
        let event = Event {
            type_: kind,
            reason: reason.to_string(),
            note: Some(note.chars().take(MAX_NOTE).collect()),
            action: action.to_string(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&event, regarding).await {
            // Not recorded, so not a repeat: the next occurrence tries again instead of being
            // suppressed for the whole window.
            self.recent.remove(&key);
            tracing::warn!(kind = %object_kind, object = %name, reason, error = %e, "failed to record event");
        }
    }
}

/// The reference Events about `object` carry: its kind, version, namespace, name and uid. Built by hand
/// rather than with `object_ref`: the recorder keys its series by the whole reference, and a
/// resourceVersion in it would make every repeat a new event.
pub fn reference<K: Resource<DynamicType = ()>>(object: &K) -> ObjectReference {
    let meta = object.meta();
    ObjectReference {
        api_version: Some(K::api_version(&()).into_owned()),
        kind: Some(K::kind(&()).into_owned()),
        name: meta.name.clone(),
        namespace: meta.namespace.clone(),
        uid: meta.uid.clone(),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A recorder whose client points at a closed port: every publish fails.
    fn unreachable_recorder() -> EventRecorder {
        let config = kube::Config::new("http://127.0.0.1:9".parse().expect("uri"));
        let client = kube::Client::try_from(config).expect("client");
        EventRecorder::new(client, "netcm", "test")
    }

    fn node(name: &str) -> ObjectReference {
        ObjectReference {
            kind: Some("Node".into()),
            api_version: Some("v1".into()),
            name: Some(name.into()),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn an_event_that_failed_to_record_is_not_suppressed_as_a_repeat() {
        let r = unreachable_recorder();
        let n1 = node("n1");
        let publish = || {
            r.publish(
                &n1,
                EventType::Warning,
                "CIDRNotAvailable",
                "Allocate",
                "no CIDR left".into(),
            )
        };
        publish().await;
        assert!(
            r.recent.is_empty(),
            "an event the API never got is not remembered as recorded"
        );
        publish().await;
        assert!(r.recent.is_empty());
    }
}
