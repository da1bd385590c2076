//! Reading kube-apiserver's audit log (JSON lines, metadata level for writes to nodes, leases, events),
//! and grouping a user's requests by the credential they were authenticated with.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde::Deserialize;

/// One audit record, the fields the tests read.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AuditEvent {
    #[serde(default, rename = "auditID")]
    pub audit_id: String,
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
    /// Who made the request; empty for one that failed authentication.
    #[serde(default)]
    pub user: UserInfo,
}

/// The authenticated user, as the API server recorded it.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct UserInfo {
    #[serde(default)]
    pub username: String,
    #[serde(default)]
    pub groups: Vec<String>,
    /// E.g. `authentication.kubernetes.io/credential-id` (`JTI=<uuid>` for a ServiceAccount token),
    /// `authentication.kubernetes.io/pod-name`, `…/pod-uid` for a token bound to a pod.
    #[serde(default)]
    pub extra: BTreeMap<String, Vec<String>>,
}

/// The `user.extra` key naming the credential a request was authenticated with.
pub const CREDENTIAL_ID: &str = "authentication.kubernetes.io/credential-id";
/// The `user.extra` key naming the pod a bound ServiceAccount token belongs to.
pub const POD_NAME: &str = "authentication.kubernetes.io/pod-name";
/// The `user.extra` key with that pod's UID.
pub const POD_UID: &str = "authentication.kubernetes.io/pod-uid";

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

    /// Whether this is one of the two PATCHes with which a new leader proves its warm Node cache fresh
    /// (field manager `netcm-catch-up`): the manager's, not any controller's.
    pub fn is_catch_up(&self) -> bool {
        self.request_uri.contains("fieldManager=netcm-catch-up")
    }

    /// Whether the request changes what it names (a read — get, list, watch — does not).
    pub fn is_write(&self) -> bool {
        matches!(
            self.verb.as_str(),
            "create" | "update" | "patch" | "delete" | "deletecollection"
        )
    }

    /// The resource, with `/subresource` if any.
    pub fn resource(&self) -> String {
        match &self.object_ref {
            Some(o) if !o.subresource.is_empty() => format!("{}/{}", o.resource, o.subresource),
            Some(o) => o.resource.clone(),
            None => String::new(),
        }
    }

    /// The HTTP code, if the response started.
    pub fn code(&self) -> Option<u16> {
        self.response_status.as_ref().map(|s| s.code)
    }

    /// The first value of `user.extra[key]`.
    pub fn extra(&self, key: &str) -> Option<&str> {
        self.user.extra.get(key)?.first().map(String::as_str)
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

/// Returns once the audit log at `log` shows a request made now: a GET, through `client`, of a Node
/// no test creates, named uniquely (the policy audits Node reads; answered 404). The API server writes
/// an entry when it has answered, so a request answered before this call — a process's last writes
/// before it exited — is in the log by then; read at once, the log may not have it yet.
pub async fn wait_logged_until_now(client: &kube::Client, log: &Path) {
    static MARKERS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let name = format!(
        "audit-marker-{}-{}-{}",
        std::process::id(),
        MARKERS.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        jiff::Timestamp::now().as_nanosecond()
    );
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(client.clone());
    nodes
        .get_opt(&name)
        .await
        .unwrap_or_else(|e| panic!("GET the marker Node {name}: {e}"));
    crate::wait_for(
        &format!("the marker request (GET node {name}) in {}", log.display()),
        std::time::Duration::from_secs(30),
        || async {
            read(log)
                .iter()
                .any(|e| e.verb == "get" && e.object_ref.as_ref().is_some_and(|o| o.name == name))
                .then_some(())
        },
    )
    .await;
}

/// Every request in the audit log once, at its last recorded stage: a request that failed authentication
/// is recorded only at `ResponseStarted`, as is a watch still open (its `ResponseComplete` comes when it
/// ends), so reading `ResponseComplete` alone misses both.
pub fn read_every_request(path: &Path) -> Vec<AuditEvent> {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("read audit log {}: {e}", path.display()));
    last_stage_of_each(
        text.lines()
            .filter_map(|l| serde_json::from_str::<AuditEvent>(l).ok()),
    )
}

/// One event per audit ID, the last one given (stages are logged in order); in the order of first sight.
pub fn last_stage_of_each(events: impl IntoIterator<Item = AuditEvent>) -> Vec<AuditEvent> {
    let mut index: BTreeMap<String, usize> = BTreeMap::new();
    let mut out: Vec<AuditEvent> = Vec::new();
    for e in events {
        match index.get(&e.audit_id) {
            Some(&i) if !e.audit_id.is_empty() => out[i] = e,
            _ => {
                index.insert(e.audit_id.clone(), out.len());
                out.push(e);
            }
        }
    }
    out
}

/// What one credential was used for: the requests authenticated with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CredentialUse {
    /// The first and the last request's receipt time.
    pub first: jiff::Timestamp,
    pub last: jiff::Timestamp,
    pub count: usize,
    /// Requests by response code (0: no response recorded).
    pub codes: BTreeMap<u16, usize>,
    /// The pods the credential was bound to, as the API server recorded them.
    pub pods: BTreeSet<String>,
}

/// `username`'s requests grouped by `user.extra[CREDENTIAL_ID]` (`""` when the request recorded none).
pub fn by_credential<'a>(
    events: impl IntoIterator<Item = &'a AuditEvent>,
    username: &str,
) -> BTreeMap<String, CredentialUse> {
    let mut out: BTreeMap<String, CredentialUse> = BTreeMap::new();
    for e in events {
        if e.user.username != username {
            continue;
        }
        let Some(at) = e.received() else { continue };
        let id = e.extra(CREDENTIAL_ID).unwrap_or_default().to_string();
        let entry = out.entry(id).or_insert_with(|| CredentialUse {
            first: at,
            last: at,
            count: 0,
            codes: BTreeMap::new(),
            pods: BTreeSet::new(),
        });
        entry.first = entry.first.min(at);
        entry.last = entry.last.max(at);
        entry.count += 1;
        *entry.codes.entry(e.code().unwrap_or(0)).or_default() += 1;
        if let Some(pod) = e.extra(POD_NAME) {
            entry.pods.insert(pod.to_string());
        }
    }
    out
}

/// The requests answered 401: failed authentication, recorded without a user.
pub fn unauthorized<'a>(events: impl IntoIterator<Item = &'a AuditEvent>) -> Vec<&'a AuditEvent> {
    events
        .into_iter()
        .filter(|e| e.code() == Some(401))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(line: &str) -> AuditEvent {
        serde_json::from_str(line).unwrap()
    }

    fn request(id: &str, stage: &str, at: &str, jti: &str, code: u16) -> AuditEvent {
        event(&format!(
            r#"{{"auditID":"{id}","stage":"{stage}","verb":"update","requestReceivedTimestamp":"{at}",
            "user":{{"username":"system:serviceaccount:kube-system:netcm","groups":["system:serviceaccounts"],
            "extra":{{"authentication.kubernetes.io/credential-id":["JTI={jti}"],
            "authentication.kubernetes.io/pod-name":["netcm-abc"]}}}},
            "objectRef":{{"resource":"leases","namespace":"kube-system","name":"netcm"}},
            "responseStatus":{{"code":{code}}}}}"#
        ))
    }

    #[test]
    fn requests_are_grouped_by_credential_with_first_last_count_and_codes() {
        let failed = event(
            r#"{"auditID":"x","stage":"ResponseStarted","verb":"update","requestReceivedTimestamp":"2026-11-26T10:00:09Z",
            "user":{},"objectRef":{"resource":"leases"},"responseStatus":{"code":401}}"#,
        );
        let other = event(
            r#"{"auditID":"o","stage":"ResponseComplete","verb":"patch","requestReceivedTimestamp":"2026-11-26T10:00:01Z",
            "user":{"username":"system:admin"},"responseStatus":{"code":200}}"#,
        );
        let events = last_stage_of_each([
            request("a", "ResponseComplete", "2026-11-26T10:00:02Z", "one", 200),
            request("w", "ResponseStarted", "2026-11-26T10:00:00Z", "one", 200),
            request("b", "ResponseComplete", "2026-11-26T10:00:05Z", "one", 409),
            request("w", "ResponseComplete", "2026-11-26T10:00:00Z", "one", 200),
            request("c", "ResponseComplete", "2026-11-26T10:00:08Z", "two", 200),
            failed,
            other,
        ]);
        assert_eq!(events.len(), 6, "the watch's two stages are one request");
        let by = by_credential(&events, "system:serviceaccount:kube-system:netcm");
        assert_eq!(by.keys().collect::<Vec<_>>(), ["JTI=one", "JTI=two"]);
        let one = &by["JTI=one"];
        assert_eq!(one.first, "2026-11-26T10:00:00Z".parse().unwrap());
        assert_eq!(one.last, "2026-11-26T10:00:05Z".parse().unwrap());
        assert_eq!(one.count, 3);
        assert_eq!(one.codes, BTreeMap::from([(200, 2), (409, 1)]));
        assert_eq!(one.pods, BTreeSet::from(["netcm-abc".to_string()]));
        assert_eq!(by["JTI=two"].count, 1);
        let denied = unauthorized(&events);
        assert_eq!(denied.len(), 1);
        assert_eq!(denied[0].user.username, "");
    }
}
