//! The informer's list+watch: a consistent list (streaming or paged, [`super::initial_list`]), then a watch
//! from the list's resourceVersion, resumed where it broke off, and a relist — consistent again — after the
//! watch fell out of the API server's window (410). A relist older than a version already seen is refused
//! ([`super::version`]) and tried again, so the cache never goes back in time.
//!
//! It yields kube-runtime's watcher events (`Init`, `InitApply`, `InitDone`, `Apply`, `Delete`), so the
//! informer reads it as it read kube-runtime's `watcher`, and errors that `.backoff()` spaces out.
//!
//! Why not kube-runtime's `watcher`: it sends a streaming list at `resourceVersion=0` — "any version", a
//! lagging API server's stale cache — with no option to change it, and its `InitDone` does not say which
//! version a list is of, so an older relist cannot be told from a fresh one. The state machine is
//! kube-runtime's (`watcher.rs`, `step_trampolined`), with those two changes and client-go's fallback from
//! a failed streaming list to a paged one.

use std::collections::VecDeque;
use std::fmt::Debug;
use std::time::Duration;

use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use kube::api::{Api, WatchEvent, WatchParams};
use kube::core::Status;
use kube::runtime::watcher::Event;
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;

use super::initial_list::{list_page, streaming_list, InitialList, CONSISTENT};
use super::version::{Newest, OlderThanSeen};

/// The bookmark annotation that ends a streaming list's initial events.
const INITIAL_EVENTS_END: &str = "k8s.io/initial-events-end";

/// How long a watch request lasts (the API server's `timeoutSeconds`): kube-runtime's 290 s.
const WATCH_TIMEOUT_SECS: u32 = 290;

/// A watch silent for this long past its timeout is taken for dead and resumed (kube-runtime's margin).
const IDLE_MARGIN: Duration = Duration::from_secs(5);

/// The API server's answer when a watch's resourceVersion fell out of its window: relist.
const GONE: u16 = 410;

/// Why a list or watch step failed; the next step retries (after the informer's backoff).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A page of a paged list failed.
    #[error("listing failed: {0}")]
    List(#[source] kube::Error),
    /// A list returned no resourceVersion to watch from.
    #[error("the list carried no resourceVersion")]
    NoResourceVersion,
    /// A streaming list or a watch could not be started.
    #[error("starting the watch failed: {0}")]
    WatchStart(#[source] kube::Error),
    /// The watch stream failed (transport, or an object that does not decode).
    #[error("the watch failed: {0}")]
    Watch(#[source] kube::Error),
    /// The API server sent an error event.
    #[error("the API server ended the watch: {} ({})", .0.message, .0.code)]
    Status(Box<Status>),
    /// A streaming list ended before its initial-events-end bookmark.
    #[error("the streaming list ended before all objects were sent")]
    StreamEnded,
    /// A relist older than the cache: refused, listed again.
    #[error("refusing the list: {0}")]
    Stale(#[from] OlderThanSeen),
}

type Watch<W> = BoxStream<'static, kube::Result<WatchEvent<W>>>;

enum State<W> {
    /// About to list; `paged` also when the strategy streams but this attempt must not (it failed).
    Empty { paged: bool },
    /// Working through a paged list: objects of the current page, the next page's token, the version.
    Paging {
        continue_token: Option<String>,
        objects: VecDeque<W>,
        version: Option<String>,
    },
    /// A streaming list's initial events are arriving.
    Streaming { stream: Watch<W> },
    /// Listed (or a watch ended): watch from `version`.
    Listed { version: String },
    /// Watching from `version` (the newest seen on this stream).
    Watching { version: String, stream: Watch<W> },
}

/// Lists `api` consistently, then watches it; forever.
pub fn list_watch<W>(
    api: Api<W>,
    strategy: InitialList,
) -> impl Stream<Item = Result<Event<W>, Error>> + Send
where
    W: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    let paged = matches!(strategy, InitialList::Paged(_));
    let start = (api, paged, State::Empty { paged }, Newest::default());
    futures::stream::unfold(start, |(api, paged, state, mut newest)| async move {
        let (item, next) = step(&api, paged, state, &mut newest).await;
        Some((item, (api, paged, next, newest)))
    })
}

/// The next event or error, and the state after it. `paged`: the strategy pages every list.
async fn step<W>(
    api: &Api<W>,
    paged: bool,
    mut state: State<W>,
    newest: &mut Newest,
) -> (Result<Event<W>, Error>, State<W>)
where
    W: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    loop {
        state = match state {
            State::Empty { paged: true } => {
                let paging = State::Paging {
                    continue_token: None,
                    objects: VecDeque::new(),
                    version: None,
                };
                return (Ok(Event::Init), paging);
            }
            State::Empty { paged: false } => match api.watch(&streaming_list(), CONSISTENT).await {
                Ok(stream) => {
                    return (
                        Ok(Event::Init),
                        State::Streaming {
                            stream: stream.boxed(),
                        },
                    );
                }
                Err(e) => return (Err(Error::WatchStart(e)), State::Empty { paged: true }),
            },
            State::Paging {
                continue_token,
                mut objects,
                version,
            } => {
                if let Some(obj) = objects.pop_front() {
                    let paging = State::Paging {
                        continue_token,
                        objects,
                        version,
                    };
                    return (Ok(Event::InitApply(obj)), paging);
                }
                if let (None, Some(version)) = (&continue_token, &version) {
                    let listed = State::Listed {
                        version: version.clone(),
                    };
                    return finish_list(newest, version, listed, paged);
                }
                match api.list(&list_page(continue_token)).await {
                    Ok(page) => {
                        let version = page.metadata.resource_version.filter(|v| !v.is_empty());
                        let continue_token = page.metadata.continue_.filter(|c| !c.is_empty());
                        if version.is_none() && continue_token.is_none() {
                            return (Err(Error::NoResourceVersion), State::Empty { paged });
                        }
                        State::Paging {
                            continue_token,
                            objects: page.items.into(),
                            version,
                        }
                    }
                    Err(e) => return (Err(Error::List(e)), State::Empty { paged }),
                }
            }
            State::Streaming { mut stream } => match next_or_idle(&mut stream).await {
                Some(Ok(WatchEvent::Added(obj) | WatchEvent::Modified(obj))) => {
                    return (Ok(Event::InitApply(obj)), State::Streaming { stream });
                }
                // The API promises none during the initial events.
                Some(Ok(WatchEvent::Deleted(_))) => State::Streaming { stream },
                Some(Ok(WatchEvent::Bookmark(b))) => {
                    if b.metadata.annotations.contains_key(INITIAL_EVENTS_END) {
                        let version = b.metadata.resource_version;
                        let watching = State::Watching {
                            version: version.clone(),
                            stream,
                        };
                        return finish_list(newest, &version, watching, paged);
                    }
                    State::Streaming { stream }
                }
                // A streaming list that fails is not retried as one: the next attempt pages (client-go).
                Some(Ok(WatchEvent::Error(status))) => {
                    return (Err(Error::Status(status)), State::Empty { paged: true });
                }
                Some(Err(e)) => return (Err(Error::Watch(e)), State::Streaming { stream }),
                None => return (Err(Error::StreamEnded), State::Empty { paged: true }),
            },
            State::Listed { version } => match api.watch(&watch(), &version).await {
                Ok(stream) => State::Watching {
                    version,
                    stream: stream.boxed(),
                },
                Err(kube::Error::Api(s)) if s.code == GONE => {
                    return (
                        Err(Error::WatchStart(kube::Error::Api(s))),
                        State::Empty { paged },
                    );
                }
                Err(e) => return (Err(Error::WatchStart(e)), State::Listed { version }),
            },
            State::Watching {
                version,
                mut stream,
            } => match next_or_idle(&mut stream).await {
                Some(Ok(WatchEvent::Added(obj) | WatchEvent::Modified(obj))) => {
                    let version = seen(newest, &obj, version);
                    return (Ok(Event::Apply(obj)), State::Watching { version, stream });
                }
                Some(Ok(WatchEvent::Deleted(obj))) => {
                    let version = seen(newest, &obj, version);
                    return (Ok(Event::Delete(obj)), State::Watching { version, stream });
                }
                Some(Ok(WatchEvent::Bookmark(b))) => {
                    newest.saw(&b.metadata.resource_version);
                    State::Watching {
                        version: b.metadata.resource_version,
                        stream,
                    }
                }
                Some(Ok(WatchEvent::Error(status))) if status.code == GONE => {
                    return (Err(Error::Status(status)), State::Empty { paged });
                }
                Some(Ok(WatchEvent::Error(status))) => {
                    return (
                        Err(Error::Status(status)),
                        State::Watching { version, stream },
                    );
                }
                Some(Err(e)) => return (Err(Error::Watch(e)), State::Watching { version, stream }),
                None => State::Listed { version },
            },
        };
    }
}

/// The end of a list of `version`: `InitDone` and then `next` — or, when the list is older than what was
/// already seen, an error and a new list (the informer keeps its cache and drops what was listed).
fn finish_list<W>(
    newest: &mut Newest,
    version: &str,
    next: State<W>,
    paged: bool,
) -> (Result<Event<W>, Error>, State<W>) {
    match newest.admits(version) {
        Ok(()) => {
            newest.saw(version);
            (Ok(Event::InitDone), next)
        }
        Err(stale) => (Err(Error::Stale(stale)), State::Empty { paged }),
    }
}

/// Records an event's object version as seen; the version to resume from.
fn seen<W: Resource>(newest: &mut Newest, obj: &W, current: String) -> String {
    match obj.resource_version().filter(|v| !v.is_empty()) {
        Some(v) => {
            newest.saw(&v);
            v
        }
        None => current,
    }
}

/// The watch after a list: bookmarks on, kube-runtime's timeout.
fn watch() -> WatchParams {
    WatchParams::default().timeout(WATCH_TIMEOUT_SECS)
}

/// The stream's next item; `None` when it ended or stayed silent past its timeout (a dead connection).
async fn next_or_idle<W>(stream: &mut Watch<W>) -> Option<kube::Result<WatchEvent<W>>> {
    let idle = Duration::from_secs(u64::from(WATCH_TIMEOUT_SECS)) + IDLE_MARGIN;
    tokio::time::timeout(idle, stream.next())
        .await
        .ok()
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;

    #[test]
    fn a_list_older_than_what_was_seen_ends_in_an_error_and_a_new_list_not_in_init_done() {
        let mut newest = Newest::default();
        newest.saw("200");
        let (item, next) = finish_list::<ConfigMap>(
            &mut newest,
            "150",
            State::Listed {
                version: "150".into(),
            },
            false,
        );
        assert!(matches!(
            item,
            Err(Error::Stale(OlderThanSeen {
                listed: 150,
                seen: 200
            }))
        ));
        assert!(matches!(next, State::Empty { paged: false }));
        let (item, next) = finish_list::<ConfigMap>(
            &mut newest,
            "250",
            State::Listed {
                version: "250".into(),
            },
            false,
        );
        assert!(matches!(item, Ok(Event::InitDone)));
        assert!(matches!(next, State::Listed { version } if version == "250"));
        assert_eq!(
            newest.admits("249"),
            Err(OlderThanSeen {
                listed: 249,
                seen: 250
            })
        );
    }

    #[test]
    fn watch_events_and_objects_without_a_version_move_the_resume_point_only_forward() {
        let mut newest = Newest::default();
        let mut cm = ConfigMap::default();
        cm.metadata.resource_version = Some("7".into());
        assert_eq!(seen(&mut newest, &cm, "5".into()), "7");
        cm.metadata.resource_version = None;
        assert_eq!(seen(&mut newest, &cm, "7".into()), "7");
        assert!(newest.admits("6").is_err());
    }
}
