//! How the informer gets its initial list: a streaming list (one watch with `sendInitialEvents=true`, objects
//! decoded one at a time, no full list held in memory) where the API server serves it, else paged lists.
//!
//! An API server without streaming lists (before 1.27, or with the `WatchList` feature gate off) refuses
//! `sendInitialEvents`, and retrying that refusal would never end; so the informer asks once, with a watch
//! that selects no object, and picks the strategy from the answer.
//!
//! Every list — the first and every relist — is a *consistent* read (`resourceVersion` unset, client-go's
//! reflector's choice when it must not go back in time): as new as etcd at the moment it is served, never
//! an older copy from the API server's watch cache. "Any version" (`resourceVersion=0`, what kube-runtime's
//! watcher sends with streaming lists) lets a lagging API server answer with a past that an earlier leader
//! had already changed: its Nodes without the pod CIDRs it gave them, or without Nodes it saw created; a
//! relist of that past reports every Node missing from it as deleted. A paged list without
//! `resourceVersion` is consistent; a streaming list is consistent with `resourceVersion` empty (and
//! `resourceVersionMatch=NotOlderThan`, which `sendInitialEvents` requires): the API server waits until its
//! cache has caught up with etcd, and answers 504 "Too large resource version" when that takes more than a
//! few seconds — then the list that attempt is paged, as client-go's reflector falls back to a LIST when a
//! streaming list fails ([`super::list_watch`]).

use futures::StreamExt;
use kube::api::{Api, ListParams, WatchEvent, WatchParams};
use kube::Resource;
use serde::de::DeserializeOwned;
use std::fmt::Debug;
use std::time::Duration;

/// The annotation on the bookmark that ends a streaming list's initial events.
const INITIAL_EVENTS_END: &str = "k8s.io/initial-events-end";

/// Objects per page when lists are paged.
pub const PAGE_SIZE: u32 = 100;

/// How long the probe may take before paged lists are chosen.
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// The `resourceVersion` of a consistent streaming list: empty, i.e. unset — "as of now", never "any".
pub const CONSISTENT: &str = "";

/// The HTTP code of a streaming list the API server could not serve consistently in time (its watch
/// cache lags etcd): it understood the request, so it serves streaming lists.
const CACHE_LAGS: u16 = 504;

/// The strategy the informer uses for its initial list and every relist.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InitialList {
    /// One watch with `sendInitialEvents=true`, ended by a bookmark.
    Streaming,
    /// Paged LIST requests, then a watch; the reason streaming was not used.
    Paged(String),
}

impl InitialList {
    /// The name logged at startup.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Streaming => "streaming",
            Self::Paged(_) => "paged",
        }
    }
}

/// The watch that streams a consistent list (at [`CONSISTENT`]) and goes on watching after it.
pub fn streaming_list() -> WatchParams {
    WatchParams::streaming_lists()
}

/// One page of a consistent paged list: no `resourceVersion`; later pages follow `continue_token`, which
/// keeps the first page's snapshot.
pub fn list_page(continue_token: Option<String>) -> ListParams {
    ListParams {
        limit: Some(PAGE_SIZE),
        continue_token,
        ..ListParams::default()
    }
}

/// What the probe saw, reduced to what decides the strategy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeAnswer {
    /// A bookmark carrying `k8s.io/initial-events-end: "true"` arrived.
    InitialEventsEnded,
    /// The server accepted the streaming list but its cache could not catch up with etcd in time (504).
    CacheLags,
    /// The request or the stream failed with this message (e.g. the server refused `sendInitialEvents`).
    Refused(String),
    /// The stream ended, or the probe timed out, without the bookmark.
    NoBookmark,
}

/// The strategy a probe answer stands for.
pub fn decide(answer: ProbeAnswer) -> InitialList {
    match answer {
        ProbeAnswer::InitialEventsEnded | ProbeAnswer::CacheLags => InitialList::Streaming,
        ProbeAnswer::Refused(why) => {
            InitialList::Paged(format!("the API server refused a streaming list: {why}"))
        }
        ProbeAnswer::NoBookmark => InitialList::Paged(
            "the API server sent no initial-events-end bookmark for a streaming list".into(),
        ),
    }
}

/// Asks the API server for a streaming list that selects no object, and reports what it answered.
pub async fn probe<K>(api: &Api<K>) -> ProbeAnswer
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    // No object has this name (names cannot contain '/'), so the answer is just the end bookmark. Asked
    // as the lists will be: consistently.
    let params = streaming_list()
        .fields("metadata.name=netcm/streaming-list-probe")
        .timeout(PROBE_TIMEOUT.as_secs() as u32);
    let ask = async {
        let stream = match api.watch(&params, CONSISTENT).await {
            Ok(s) => s,
            Err(kube::Error::Api(s)) if s.code == CACHE_LAGS => return ProbeAnswer::CacheLags,
            Err(e) => return ProbeAnswer::Refused(e.to_string()),
        };
        let mut stream = std::pin::pin!(stream);
        while let Some(item) = stream.next().await {
            match item {
                Ok(WatchEvent::Bookmark(b)) => {
                    let ended = b
                        .metadata
                        .annotations
                        .get(INITIAL_EVENTS_END)
                        .is_some_and(|v| v == "true");
                    if ended {
                        return ProbeAnswer::InitialEventsEnded;
                    }
                }
                Ok(WatchEvent::Error(e)) if e.code == CACHE_LAGS => return ProbeAnswer::CacheLags,
                Ok(WatchEvent::Error(e)) => return ProbeAnswer::Refused(e.to_string()),
                Ok(_) => {}
                Err(e) => return ProbeAnswer::Refused(e.to_string()),
            }
        }
        ProbeAnswer::NoBookmark
    };
    tokio::time::timeout(PROBE_TIMEOUT + Duration::from_secs(1), ask)
        .await
        .unwrap_or(ProbeAnswer::NoBookmark)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_end_bookmark_or_a_lagging_cache_means_streaming_lists_and_anything_else_means_pages_with_the_reason(
    ) {
        assert_eq!(
            decide(ProbeAnswer::InitialEventsEnded),
            InitialList::Streaming
        );
        assert_eq!(decide(ProbeAnswer::CacheLags), InitialList::Streaming);
        let refused = decide(ProbeAnswer::Refused(
            "sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled"
                .into(),
        ));
        assert_eq!(refused.name(), "paged");
        assert!(matches!(&refused, InitialList::Paged(why) if why.contains("WatchList")));
        assert_eq!(decide(ProbeAnswer::NoBookmark).name(), "paged");
    }

    /// The query string the API server receives for a request.
    fn query(request: Result<http::Request<Vec<u8>>, kube::core::request::Error>) -> String {
        let request = request.expect("request builds");
        request.uri().query().unwrap_or_default().to_string()
    }

    #[test]
    fn a_streaming_list_asks_for_a_consistent_read_never_for_any_version() {
        let nodes = kube::core::Request::new("/api/v1/nodes");
        let q = query(nodes.watch(&streaming_list(), CONSISTENT));
        let pairs: Vec<&str> = q.split('&').collect();
        assert!(pairs.contains(&"sendInitialEvents=true"), "{q}");
        assert!(pairs.contains(&"resourceVersionMatch=NotOlderThan"), "{q}");
        assert!(
            pairs.contains(&"resourceVersion="),
            "resourceVersion unset: {q}"
        );
        assert!(pairs.contains(&"allowWatchBookmarks=true"), "{q}");
    }

    #[test]
    fn every_page_of_a_paged_list_is_a_consistent_read() {
        let nodes = kube::core::Request::new("/api/v1/nodes");
        let first = query(nodes.list(&list_page(None)));
        assert!(!first.contains("resourceVersion"), "{first}");
        assert!(first.contains("limit=100"), "{first}");
        let next = query(nodes.list(&list_page(Some("token".into()))));
        assert!(!next.contains("resourceVersion"), "{next}");
        assert!(next.contains("continue=token"), "{next}");
    }
}
