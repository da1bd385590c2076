//! The PATCH that gives a Node its pod CIDRs, the touch that voids one still on its way, and how the
//! PATCH's errors are told apart: pure, so it is tested without an API server. `assign.rs` sends the
//! PATCH, `startup.rs` and `predecessor.rs` the touch; the e2e tests send both as netcm builds them, so
//! what the real API server decides about them is tested on today's shapes.

use netcm_manager::CachedNode;

use crate::blocks::{FENCED_AT_ANNOTATION, FENCED_AT_POINTER};

/// How a PATCH error is handled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PatchFailure {
    /// The Node is gone (404): release; its watch event brings the sync that decides again.
    Gone,
    /// The write conflicted (409): the live Node decides ([`after_failed_write`]).
    Conflict,
    /// The API refuses this write for good (400, 403, 422, admission): the live Node decides.
    Rejected,
    /// Anything else (5xx, 429, timeouts, transport, fence): keep the allocation and retry with backoff.
    Transient,
}

/// Classifies a failed PATCH by its status code.
pub(crate) fn classify_patch_error(e: &kube::Error) -> PatchFailure {
    match e {
        kube::Error::Api(s) if s.code == 404 => PatchFailure::Gone,
        kube::Error::Api(s) if s.code == 409 => PatchFailure::Conflict,
        kube::Error::Api(s) if matches!(s.code, 400 | 403 | 422) => PatchFailure::Rejected,
        _ => PatchFailure::Transient,
    }
}

/// The PATCH's precondition on the Node's fence annotation, as this leader's cache saw it (not a leader fence,
/// which is `LeaderGuard`'s): whether it has annotations at all, and the value of
/// [`FENCED_AT_ANNOTATION`] (`None`: unset).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FencePrecondition<'a> {
    /// `metadata.annotations` has entries.
    pub has_annotations: bool,
    /// The fence annotation's value.
    pub fenced_at: Option<&'a str>,
}

impl<'a> FencePrecondition<'a> {
    /// The fence of a cached Node.
    pub fn of(node: &'a CachedNode) -> FencePrecondition<'a> {
        FencePrecondition {
            has_annotations: node.has_annotations(),
            fenced_at: node.annotation(FENCED_AT_ANNOTATION),
        }
    }
}

/// The PATCH, a JSON Patch whose tests make the API server refuse it (422) if the Node was re-created
/// meanwhile (`metadata.uid`), so an allocation can only land on the Node it was chosen for; or if a later
/// leader touched the Node's fence annotation since this one's cache saw it, so a PATCH a frozen API server
/// holds past a takeover can be voided ([`crate::blocks`]). Other writers of the Node (kubelet's status,
/// taints, labels) never make it fail. JSON Patch can only test a member of a map that exists: a Node
/// without annotations is tested for having none.
pub fn pod_cidr_patch(
    uid: &str,
    fence: FencePrecondition<'_>,
    cidrs: &[String],
) -> serde_json::Value {
    let fence_test = if fence.has_annotations {
        serde_json::json!({
            "op": "test",
            "path": FENCED_AT_POINTER,
            "value": fence.fenced_at,
        })
    } else {
        serde_json::json!({ "op": "test", "path": "/metadata/annotations", "value": null })
    };
    serde_json::json!([
        { "op": "test", "path": "/metadata/uid", "value": uid },
        fence_test,
        { "op": "add", "path": "/spec/podCIDR", "value": cidrs.first() },
        { "op": "add", "path": "/spec/podCIDRs", "value": cidrs },
    ])
}

/// The touch: a strategic merge patch that sets the fence annotation to `stamp` and names the Node's UID
/// (a Node re-created meanwhile is not touched), so every [`pod_cidr_patch`] built from a cache that saw
/// the Node before it fails its fence test.
pub fn fence_touch(uid: &str, stamp: &str) -> serde_json::Value {
    serde_json::json!({
        "metadata": { "uid": uid, "annotations": { FENCED_AT_ANNOTATION: stamp } }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api_error(code: u16) -> kube::Error {
        kube::Error::Api(
            kube::core::Status::failure("m", "r")
                .with_code(code)
                .boxed(),
        )
    }

    #[test]
    fn refusals_for_good_are_told_apart_from_gone_nodes_and_transient_errors() {
        let cases = [
            (422, PatchFailure::Rejected),
            (403, PatchFailure::Rejected),
            (400, PatchFailure::Rejected),
            (404, PatchFailure::Gone),
            (409, PatchFailure::Conflict),
            (503, PatchFailure::Transient),
            (429, PatchFailure::Transient),
        ];
        for (code, want) in cases {
            assert_eq!(classify_patch_error(&api_error(code)), want, "HTTP {code}");
        }
    }

    #[test]
    fn the_patch_tests_the_node_uid_and_its_fence_and_sets_both_pod_cidr_fields() {
        let cidrs = ["10.0.0.0/24".to_string(), "fd00::/64".to_string()];
        let fence = FencePrecondition {
            has_annotations: true,
            fenced_at: None,
        };
        let p = pod_cidr_patch("u1", fence, &cidrs);
        assert_eq!(
            p[0],
            serde_json::json!({"op": "test", "path": "/metadata/uid", "value": "u1"})
        );
        assert_eq!(
            p[1],
            serde_json::json!({"op": "test", "path": "/metadata/annotations/ipam.netcm.io~1fenced-at", "value": null})
        );
        assert_eq!(p[2]["value"], "10.0.0.0/24");
        assert_eq!(p[3]["value"][1], "fd00::/64");
        let fenced = FencePrecondition {
            has_annotations: true,
            fenced_at: Some("t1"),
        };
        assert_eq!(pod_cidr_patch("u1", fenced, &cidrs)[1]["value"], "t1");
        let bare = FencePrecondition {
            has_annotations: false,
            fenced_at: None,
        };
        assert_eq!(
            pod_cidr_patch("u1", bare, &cidrs)[1],
            serde_json::json!({"op": "test", "path": "/metadata/annotations", "value": null})
        );
        let parsed: Result<json_patch::Patch, _> =
            serde_json::from_value(pod_cidr_patch("u1", fence, &cidrs));
        assert!(parsed.is_ok(), "{parsed:?}");
    }
}
