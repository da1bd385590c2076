//! Kubernetes Events (events.k8s.io/v1) on Nodes (and other cluster-scoped objects), reported by controller `netcm`.
//!
//! The same event (node, reason, note) is recorded at most once per [`DEDUP_WINDOW`], so a Node that fails
//! on every retry does not flood the API; the log line and the metric still count every occurrence.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, ObjectReference};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, PostParams};
use kube::Resource;

/// How long an identical event is suppressed after it was recorded.
pub const DEDUP_WINDOW: Duration = Duration::from_secs(300);
/// The namespace events about cluster-scoped objects go to (client-go's choice).
const EVENT_NAMESPACE: &str = "default";

/// Normal or Warning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    /// Something expected happened.
    Normal,
    /// Something needs an operator's attention.
    Warning,
}

impl EventType {
    fn as_str(self) -> &'static str {
        match self {
            Self::Normal => "Normal",
            Self::Warning => "Warning",
        }
    }
}

/// (node, reason, note): what makes two events the same for deduplication.
type EventKey = (String, String, String);

/// Records Events; cheap to clone.
#[derive(Clone)]
pub struct EventRecorder {
    api: Api<Event>,
    controller: String,
    instance: String,
    recent: Arc<Mutex<HashMap<EventKey, Instant>>>,
}

impl EventRecorder {
    /// A recorder reporting as `controller` from `instance` (this process's identity).
    pub fn new(client: kube::Client, controller: &str, instance: &str) -> Self {
        Self {
            api: Api::namespaced(client, EVENT_NAMESPACE),
            controller: controller.to_string(),
            instance: instance.to_string(),
            recent: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    fn is_duplicate(&self, key: EventKey) -> bool {
        let mut recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        if recent.len() > 10_000 {
            recent.retain(|_, at| now.duration_since(*at) < DEDUP_WINDOW);
        }
        match recent.get(&key) {
            Some(at) if now.duration_since(*at) < DEDUP_WINDOW => true,
            _ => {
                recent.insert(key, now);
                false
            }
        }
    }

    /// Records an event about `node`. Failures are logged, never returned: an event must not fail a sync.
    pub async fn publish(
        &self,
        node: &Node,
        kind: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) {
        let regarding = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: node.meta().name.clone(),
            uid: node.meta().uid.clone(),
            ..Default::default()
        };
        self.publish_about(regarding, kind, reason, action, note)
            .await;
    }

    /// Records an event about any cluster-scoped object (deduplicated as [`EventRecorder::publish`]).
    pub async fn publish_about(
        &self,
        regarding: ObjectReference,
        kind: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) {
        let name = regarding.name.clone().unwrap_or_default();
        if self.is_duplicate((name.clone(), reason.to_string(), note.clone())) {
            return;
        }
        let now = jiff::Timestamp::now();
        let event = Event {
            metadata: ObjectMeta {
                // client-go's name, `<object>.<unix nanos in hex>`: a generateName ending in "." is
                // rejected by the API server (not a valid DNS subdomain prefix).
                name: Some(format!("{name}.{:x}", now.as_nanosecond())),
                namespace: Some(EVENT_NAMESPACE.to_string()),
                ..Default::default()
            },
            event_time: Some(MicroTime(now)),
            type_: Some(kind.as_str().to_string()),
            reason: Some(reason.to_string()),
            action: Some(action.to_string()),
            note: Some(note.chars().take(1024).collect()),
            reporting_controller: Some(self.controller.clone()),
            reporting_instance: Some(self.instance.chars().take(128).collect()),
            regarding: Some(regarding),
            ..Default::default()
        };
        if let Err(e) = self.api.create(&PostParams::default(), &event).await {
            tracing::warn!(node = %name, reason, error = %e, "failed to record event");
        }
    }
}
