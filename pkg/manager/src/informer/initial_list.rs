//! How the informer gets its initial list: a streaming list (one watch with `sendInitialEvents=true`, objects
//! decoded one at a time, no full list held in memory) where the API server serves it, else paged lists.
//!
//! An API server without streaming lists (before 1.27, or with the `WatchList` feature gate off) refuses
//! `sendInitialEvents`, and kube-runtime's watcher would retry that refusal forever; so the informer asks
//! once, with a watch that selects no object, and picks the strategy from the answer.

use futures::StreamExt;
use kube::api::{Api, WatchEvent, WatchParams};
use kube::runtime::watcher;
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

    /// The watcher configuration for this strategy.
    pub fn watcher_config(&self) -> watcher::Config {
        match self {
            Self::Streaming => watcher::Config::default().streaming_lists(),
            Self::Paged(_) => watcher::Config::default().page_size(PAGE_SIZE),
        }
    }
}

/// What the probe saw, reduced to what decides the strategy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeAnswer {
    /// A bookmark carrying `k8s.io/initial-events-end: "true"` arrived.
    InitialEventsEnded,
    /// The request or the stream failed with this message (e.g. the server refused `sendInitialEvents`).
    Refused(String),
    /// The stream ended, or the probe timed out, without the bookmark.
    NoBookmark,
}

/// The strategy a probe answer stands for.
pub fn decide(answer: ProbeAnswer) -> InitialList {
    match answer {
        ProbeAnswer::InitialEventsEnded => InitialList::Streaming,
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
    // No object has this name (names cannot contain '/'), so the answer is just the end bookmark.
    let params = WatchParams::streaming_lists()
        .fields("metadata.name=netcm/streaming-list-probe")
        .timeout(PROBE_TIMEOUT.as_secs() as u32);
    let ask = async {
        let stream = match api.watch(&params, "0").await {
            Ok(s) => s,
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
    use kube::runtime::watcher::InitialListStrategy;

    #[test]
    fn the_end_bookmark_means_streaming_lists_and_anything_else_means_pages_with_the_reason() {
        assert_eq!(
            decide(ProbeAnswer::InitialEventsEnded),
            InitialList::Streaming
        );
        let refused = decide(ProbeAnswer::Refused(
            "sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled"
                .into(),
        ));
        assert_eq!(refused.name(), "paged");
        assert!(matches!(&refused, InitialList::Paged(why) if why.contains("WatchList")));
        assert_eq!(decide(ProbeAnswer::NoBookmark).name(), "paged");
    }

    #[test]
    fn each_strategy_configures_the_watcher_it_names() {
        let streaming = InitialList::Streaming.watcher_config();
        assert_eq!(
            streaming.initial_list_strategy,
            InitialListStrategy::StreamingList
        );
        let paged = InitialList::Paged(String::new()).watcher_config();
        assert_eq!(paged.initial_list_strategy, InitialListStrategy::ListWatch);
        assert_eq!(paged.page_size, Some(PAGE_SIZE));
    }
}
