//! Per-controller sync metrics, counted by the shared worker loop ([`crate::Controller`]):
//! `netcm_sync_total{controller,result,reason}` and `netcm_sync_duration_seconds{controller}`.
//!
//! Why a process-wide handle: every controller's workers run through one function that has no registry
//! of its own, and the families must exist once per process. `run` registers them; a worker loop in a
//! process that never registered them (a unit test) counts nothing.

use std::sync::OnceLock;

use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry};

/// `result` of a sync that finished its work.
pub const RESULT_SUCCESS: &str = "success";
/// `result` of a sync that asked to be retried later without counting a failure.
pub const RESULT_REQUEUE: &str = "requeue";
/// `result` of a sync that failed (requeued with backoff).
pub const RESULT_ERROR: &str = "error";

#[derive(Clone)]
struct Families {
    total: IntCounterVec,
    duration: HistogramVec,
}

static FAMILIES: OnceLock<Families> = OnceLock::new();

/// Registers the families in `registry` (the same ones again for a second registry in one process).
pub fn register(registry: &Registry) -> Result<(), prometheus::Error> {
    let families = match FAMILIES.get() {
        Some(f) => f.clone(),
        None => {
            let total = IntCounterVec::new(
                Opts::new(
                    "netcm_sync_total",
                    "Syncs finished by each controller's workers, by result (success, requeue, error) and reason (for errors: fenced, the API's status reason in snake_case, transport, a reason of the controller's own, or error).",
                ),
                &["controller", "result", "reason"],
            )?;
            let duration = HistogramVec::new(
                HistogramOpts::new(
                    "netcm_sync_duration_seconds",
                    "How long one sync of one key took, by controller.",
                )
                .buckets(vec![
                    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                ]),
                &["controller"],
            )?;
            let f = Families { total, duration };
            FAMILIES.get_or_init(|| f).clone()
        }
    };
    registry.register(Box::new(families.total))?;
    registry.register(Box::new(families.duration))?;
    Ok(())
}

/// Makes a controller's success and error series exist from its start, so rates and alerts see 0.
pub(crate) fn init_controller(controller: &str) {
    if let Some(f) = FAMILIES.get() {
        f.total
            .with_label_values(&[controller, RESULT_SUCCESS, "none"]);
        f.duration.with_label_values(&[controller]);
    }
}

/// Counts one finished sync.
pub(crate) fn observe(controller: &str, result: &str, reason: &str, seconds: f64) {
    if let Some(f) = FAMILIES.get() {
        f.total
            .with_label_values(&[controller, result, reason])
            .inc();
        f.duration.with_label_values(&[controller]).observe(seconds);
    }
}

/// `reason` of a sync whose write the leader fence refused.
pub const REASON_FENCED: &str = "fenced";
/// `reason` of a failure with no more specific label.
pub const REASON_ERROR: &str = "error";
/// `reason` of a sync that panicked; the worker recovered it and requeued the key.
pub const REASON_PANIC: &str = "panic";

/// The `reason` label of a failed API request: `fenced` for a write the leader fence refused in the
/// client layer, the API's status reason (`conflict`, `forbidden`, `not_found`, …) for a refused
/// request, `transport` for a request that got no answer, else `error`. For [`crate::SyncError::reason`].
pub fn api_reason(err: &kube::Error) -> &'static str {
    // The client layer's fence refusal travels as a service error; its text survives any wrapping.
    if err.to_string().contains(FENCE_TEXT) {
        return REASON_FENCED;
    }
    let mut cur: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(err);
    while let Some(e) = cur {
        if e.downcast_ref::<crate::leader::Fenced>().is_some() {
            return REASON_FENCED;
        }
        cur = e.source();
    }
    match err {
        kube::Error::Api(s) => status_reason(&s.reason, s.code),
        kube::Error::HyperError(_) | kube::Error::Service(_) => "transport",
        _ => REASON_ERROR,
    }
}

impl crate::SyncError for crate::leader::Fenced {
    fn reason(&self) -> &'static str {
        REASON_FENCED
    }
}

/// What [`crate::leader::Fenced`] says, wherever it is wrapped.
const FENCE_TEXT: &str = "refused by the leader fence";

/// Kubernetes' StatusReason values (a closed set) in snake_case; anything else by HTTP class.
fn status_reason(reason: &str, code: u16) -> &'static str {
    match reason {
        "Conflict" => "conflict",
        "Forbidden" => "forbidden",
        "NotFound" => "not_found",
        "AlreadyExists" => "already_exists",
        "Invalid" => "invalid",
        "BadRequest" => "bad_request",
        "Unauthorized" => "unauthorized",
        "TooManyRequests" => "too_many_requests",
        "Timeout" | "ServerTimeout" => "timeout",
        "ServiceUnavailable" => "service_unavailable",
        "InternalError" => "internal_error",
        "Gone" | "Expired" => "gone",
        _ if code >= 500 => "server_error",
        _ => "api_error",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SyncError;

    fn api(reason: &str, code: u16) -> kube::Error {
        kube::Error::Api(Box::new(
            kube::core::Status::failure("refused", reason).with_code(code),
        ))
    }

    #[test]
    fn a_refused_request_is_labelled_by_the_apis_status_reason_in_snake_case() {
        assert_eq!(api_reason(&api("Conflict", 409)), "conflict");
        assert_eq!(api_reason(&api("Forbidden", 403)), "forbidden");
        assert_eq!(api_reason(&api("SomethingNew", 503)), "server_error");
        assert_eq!(api_reason(&api("SomethingNew", 418)), "api_error");
    }

    #[test]
    fn a_write_the_fence_refused_is_fenced_also_when_the_client_layer_wrapped_it() {
        let in_layer = kube::Error::Service(Box::new(crate::leader::Fenced("not the leader")));
        assert_eq!(api_reason(&in_layer), "fenced");
        assert_eq!(crate::leader::Fenced("not the leader").reason(), "fenced");
    }
}
