//! The ranges of the ClusterCIDR objects (`clustercidrs.networking.x-k8s.io/v1`), which the allocator
//! gives pod CIDRs from beside `--cluster-cidr` (with `--cluster-cidr-objects`): the route controller
//! routes pod CIDRs inside them as it routes those inside the flag's ranges ([`crate::ownership`]). A pool
//! may lie outside every `--cluster-cidr` — a range the cluster is moving to — and its Nodes' pods must
//! be reachable all the same.
//!
//! One watch keeps the ranges of every object, a deleted one's too until it is gone: the allocator keeps
//! a pool's finalizer while a Node holds one of its CIDRs, so a draining pool stays routed. A change
//! replaces the ranges [`Ownership`](crate::ownership::Ownership) counts and asks for a full reconcile,
//! which routes the Nodes refused before. The first list gates the controller's first reconcile (for at
//! most [`FIRST_LIST_WAIT`]), so a pool's Nodes are not refused, and reported, for a moment at start. A
//! missing CRD or a missing right to read it leaves the flag's ranges alone in force, said once in the
//! log; routing goes on.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use ipnet::IpNet;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::runtime::watcher::{self, watcher, Event};
use kube::runtime::WatchStreamExt;
use netcm_manager::informer::watch_backoff;
use tokio::sync::watch;

use crate::worker::RouteReconciler;
use crate::NAME;

/// How long the first reconcile waits for the first list of ClusterCIDRs; past it, it routes from the
/// flag's ranges and the list's arrival reconciles again.
pub const FIRST_LIST_WAIT: Duration = Duration::from_secs(10);

/// The ClusterCIDR resource (node-ipam-controller's API, which the allocator reads as pools).
pub fn api_resource() -> ApiResource {
    ApiResource {
        group: "networking.x-k8s.io".into(),
        version: "v1".into(),
        api_version: "networking.x-k8s.io/v1".into(),
        kind: "ClusterCIDR".into(),
        plural: "clustercidrs".into(),
    }
}

/// The ranges an object's spec names (`ipv4`, `ipv6`), truncated to their networks; a field that does
/// not parse names no range (the allocator refuses such a pool, with an Event, and allocates nothing
/// from it).
pub fn ranges(obj: &DynamicObject) -> Vec<IpNet> {
    ["ipv4", "ipv6"]
        .iter()
        .filter_map(|field| obj.data["spec"][field].as_str())
        .filter_map(|s| s.trim().parse::<IpNet>().ok())
        .map(|n| n.trunc())
        .collect()
}

/// Every object's ranges, by object name.
#[derive(Debug, Default)]
struct Known(BTreeMap<String, Vec<IpNet>>);

impl Known {
    fn all(&self) -> Vec<IpNet> {
        self.0.values().flatten().copied().collect()
    }

    fn apply(&mut self, obj: &DynamicObject) {
        self.0
            .insert(obj.metadata.name.clone().unwrap_or_default(), ranges(obj));
    }

    fn delete(&mut self, obj: &DynamicObject) {
        self.0
            .remove(obj.metadata.name.as_deref().unwrap_or_default());
    }
}

/// Why the watch cannot read ClusterCIDRs for good: the CRD is not installed (404), or this process may
/// not list them (403: a DaemonSet from a chart without the right).
fn cannot_read(e: &watcher::Error) -> Option<u16> {
    match e {
        watcher::Error::InitialListFailed(kube::Error::Api(s))
        | watcher::Error::WatchStartFailed(kube::Error::Api(s))
        | watcher::Error::WatchFailed(kube::Error::Api(s))
            if matches!(s.code, 403 | 404) =>
        {
            Some(s.code)
        }
        _ => None,
    }
}

/// Keeps the routed ranges in line with the ClusterCIDR objects; `listed` turns true once the first
/// list is in (or the objects cannot be read). It writes nothing but the process's own state, so it runs
/// as a service of the controller (started before its first reconcile, dropped once its workers drained).
pub(crate) async fn watch_pools(
    api: Api<DynamicObject>,
    routes: Arc<RouteReconciler>,
    listed: watch::Sender<bool>,
) {
    let stream = watcher(api, watcher::Config::default()).backoff(watch_backoff());
    let mut stream = std::pin::pin!(stream);
    let (mut known, mut relist) = (Known::default(), None::<Known>);
    let mut refused_logged = false;
    loop {
        let Some(item) = stream.next().await else {
            return;
        };
        match item {
            Err(e) => {
                match cannot_read(&e) {
                    Some(code) if !refused_logged => {
                        let why = if code == 404 {
                            "the ClusterCIDR CRD (clustercidrs.networking.x-k8s.io) is not installed"
                        } else {
                            "this process may not list and watch clustercidrs.networking.x-k8s.io (RBAC)"
                        };
                        tracing::warn!(controller = NAME, error = %e, "{why}; routing pod CIDRs inside --cluster-cidr only until it can read them");
                        refused_logged = true;
                    }
                    Some(_) => {}
                    None => {
                        tracing::warn!(controller = NAME, error = %e, "watching ClusterCIDRs failed; retrying with backoff");
                        continue;
                    }
                }
                // Nothing to wait for: the flag's ranges are all there is.
                listed.send_replace(true);
                continue;
            }
            Ok(Event::Init) => relist = Some(Known::default()),
            Ok(Event::InitApply(obj)) => {
                if let Some(r) = relist.as_mut() {
                    r.apply(&obj);
                }
            }
            Ok(Event::InitDone) => {
                known = relist.take().unwrap_or_default();
                refused_logged = false;
            }
            Ok(Event::Apply(obj)) => known.apply(&obj),
            Ok(Event::Delete(obj)) => known.delete(&obj),
        }
        if relist.is_some() {
            continue;
        }
        let ranges = known.all();
        let shown: Vec<String> = ranges.iter().map(ToString::to_string).collect();
        if routes.syncer.set_pool_ranges(ranges) {
            tracing::info!(controller = NAME, ranges = %shown.join(","), "the ClusterCIDR objects' ranges changed; reconciling the whole table");
            // Also when the first reconcile ran before this list came (FIRST_LIST_WAIT): it refused the
            // pools' Nodes. Before it, the permit only costs one more reconcile at start.
            routes.resync.notify_one();
        }
        listed.send_replace(true);
    }
}

/// Waits for the first list of ClusterCIDRs, at most [`FIRST_LIST_WAIT`].
pub(crate) async fn first_list(mut listed: watch::Receiver<bool>) {
    let waited = tokio::time::timeout(FIRST_LIST_WAIT, listed.wait_for(|l| *l)).await;
    if waited.is_err() {
        tracing::warn!(
            controller = NAME,
            "no list of ClusterCIDRs within {FIRST_LIST_WAIT:?}; routing from --cluster-cidr until it comes"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(name: &str, spec: serde_json::Value) -> DynamicObject {
        let mut obj = DynamicObject::new(name, &api_resource());
        obj.data = serde_json::json!({ "spec": spec });
        obj
    }

    #[test]
    fn an_objects_ranges_are_its_ipv4_and_ipv6_networks_and_a_bad_one_names_none() {
        let both = object(
            "both",
            serde_json::json!({"perNodeHostBits": 8, "ipv4": "10.80.1.2/14", "ipv6": "fd01::/48"}),
        );
        assert_eq!(
            ranges(&both),
            vec![
                "10.80.0.0/14".parse::<IpNet>().expect("net"),
                "fd01::/48".parse().expect("net")
            ]
        );
        let bad = object(
            "bad",
            serde_json::json!({"ipv4": "10.80.0.0/33", "ipv6": 7}),
        );
        assert!(ranges(&bad).is_empty());
        assert!(ranges(&object("empty", serde_json::json!(null))).is_empty());
    }

    #[test]
    fn the_known_ranges_follow_objects_applied_and_deleted() {
        let mut known = Known::default();
        let a = object("a", serde_json::json!({"ipv4": "10.80.0.0/16"}));
        known.apply(&a);
        known.apply(&object("b", serde_json::json!({"ipv4": "10.81.0.0/16"})));
        // A changed spec replaces the object's ranges.
        known.apply(&object("b", serde_json::json!({"ipv4": "10.82.0.0/16"})));
        assert_eq!(
            known.all(),
            vec![
                "10.80.0.0/16".parse::<IpNet>().expect("net"),
                "10.82.0.0/16".parse().expect("net")
            ]
        );
        known.delete(&a);
        assert_eq!(
            known.all(),
            vec!["10.82.0.0/16".parse::<IpNet>().expect("net")]
        );
    }

    #[test]
    fn a_missing_crd_or_right_is_told_apart_from_a_failure_worth_retrying() {
        let api = |code| {
            watcher::Error::InitialListFailed(kube::Error::Api(
                kube::core::Status::failure("m", "r")
                    .with_code(code)
                    .boxed(),
            ))
        };
        assert_eq!(cannot_read(&api(404)), Some(404));
        assert_eq!(cannot_read(&api(403)), Some(403));
        assert_eq!(cannot_read(&api(500)), None);
    }
}
