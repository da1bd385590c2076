//! A Node parked behind the allocator's workqueue backoff, and the proof that an event, not its retry,
//! served it: the tests of waking waiting Nodes (a release, a release hold) share these steps.

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DeleteParams};

use crate::{wait_for, Netcm};

/// The allocator queue's retry counter.
const RETRIES: &str = r#"workqueue_retries_total{name="subnet-allocator"}"#;
/// After its 12th failure the workqueue's backoff (5 ms doubling per failure) parks a Node for
/// 5 ms × 2^11 ≈ 10 s.
const FAILURES_TO_PARK: f64 = 12.0;
/// Served within this long of the event, the Node was woken by it, not by its retry. The bound is the
/// backoff's, not a speed.
const WOKEN_WITHIN: Duration = Duration::from_secs(8);

/// The allocator queue's retries so far; call before creating the Node that is to wait.
pub async fn retries_so_far(n: &Netcm) -> f64 {
    n.metric(RETRIES).await.unwrap_or(0.0)
}

/// Waits until the one waiting Node has failed often enough to sit at a ~10 s backoff (`before`: the
/// retries before it was created).
pub async fn wait_parked(n: &Netcm, before: f64) {
    n.wait_metric(
        RETRIES,
        "12 failures of the waiting node",
        |v| v >= before + FAILURES_TO_PARK,
        Duration::from_secs(30),
    )
    .await;
}

/// Deletes Node `deleted`, then waits (well inside the waiting Node's backoff) until Node `waiting`
/// satisfies `served`: `what` names that in a failure.
pub async fn delete_and_see_it_woken(
    client: &kube::Client,
    deleted: &str,
    waiting: &str,
    what: &str,
    served: impl Fn(&Node) -> bool,
) {
    let api: Api<Node> = Api::all(client.clone());
    api.delete(deleted, &DeleteParams::default())
        .await
        .expect("delete node");
    wait_for(what, WOKEN_WITHIN, || async {
        let node = api.get_opt(waiting).await.ok().flatten()?;
        served(&node).then_some(())
    })
    .await;
}
