//! Reading kube-apiserver's audit log (JSON lines, metadata level for writes to nodes, leases, events).

use std::path::Path;

use serde::Deserialize;

/// One audit record, the fields the tests read.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AuditEvent {
    pub stage: String,
    pub verb: String,
    #[serde(default)]
    pub user_agent: String,
    pub object_ref: Option<ObjectRef>,
    pub response_status: Option<ResponseStatus>,
    #[serde(default)]
    pub stage_timestamp: String,
    #[serde(default)]
    pub request_received_timestamp: String,
    /// The path and query as sent, e.g. `/api/v1/nodes/n?timeout=9500ms`.
    #[serde(default, rename = "requestURI")]
    pub request_uri: String,
}

/// What was written.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectRef {
    #[serde(default)]
    pub resource: String,
    #[serde(default)]
    pub subresource: String,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub namespace: String,
}

/// The HTTP code.
#[derive(Debug, Clone, Deserialize)]
pub struct ResponseStatus {
    #[serde(default)]
    pub code: u16,
}

impl AuditEvent {
    /// Whether the request succeeded (2xx).
    pub fn succeeded(&self) -> bool {
        self.response_status
            .as_ref()
            .is_some_and(|s| (200..300).contains(&s.code))
    }

    /// The resource, with `/subresource` if any.
    pub fn resource(&self) -> String {
        match &self.object_ref {
            Some(o) if !o.subresource.is_empty() => format!("{}/{}", o.resource, o.subresource),
            Some(o) => o.resource.clone(),
            None => String::new(),
        }
    }

    /// When the request was received.
    pub fn received(&self) -> Option<jiff::Timestamp> {
        self.request_received_timestamp.parse().ok()
    }
}

/// Every completed request in the audit log.
pub fn read(path: &Path) -> Vec<AuditEvent> {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("read audit log {}: {e}", path.display()));
    text.lines()
        .filter_map(|l| serde_json::from_str::<AuditEvent>(l).ok())
        .filter(|e| e.stage == "ResponseComplete")
        .collect()
}
