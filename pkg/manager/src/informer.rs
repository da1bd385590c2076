//! The shared informer: ONE list+watch per kind for the whole process (kube-runtime's `watcher` feeding
//! a `reflector` store), fanned out to every subscribed controller as add / update / delete events.
//!
//! Why not kube-runtime's shared streams: they are unstable and never deliver deletes to subscribers. Here a
//! delete carries the last known object, and after every relist (the watcher's `Init … InitDone`) the new
//! list is diffed against the cache, so an object deleted during a watch gap is reported as deleted and an
//! object changed during the gap as updated. Events are delivered only after the store holds the new state,
//! so a handler that enqueues a key and a worker that re-reads the cache always agree.

use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kube::api::Api;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher::{self, watcher, Event};
use kube::runtime::WatchStreamExt;
use kube::Resource;
use parking_lot::Mutex;
use serde::de::DeserializeOwned;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

pub mod initial_list;

/// One change to an object, as handlers see it.
#[derive(Debug, Clone)]
pub enum InformerEvent<K> {
    /// The object appeared (first list, or created).
    Added(Arc<K>),
    /// The object changed; the old and the new version.
    Updated(Arc<K>, Arc<K>),
    /// The object is gone; its last known version.
    Deleted(Arc<K>),
}

impl<K: Resource> InformerEvent<K> {
    /// The object's name.
    pub fn name(&self) -> String {
        let obj = match self {
            Self::Added(o) | Self::Updated(_, o) | Self::Deleted(o) => o,
        };
        obj.meta().name.clone().unwrap_or_default()
    }
}

/// An event handler; it must only enqueue keys (it runs on the informer task).
pub type Handler<K> = Arc<dyn Fn(&InformerEvent<K>) + Send + Sync>;

/// A function that trims an object before it is cached (drop what no controller reads).
pub type Transform<K> = Arc<dyn Fn(&mut K) + Send + Sync>;

/// Subscribing after the informer started is a programming error the manager reports.
#[derive(Debug, thiserror::Error)]
#[error("subscribers must register before the informer starts")]
pub struct AlreadyStarted;

struct Shared<K: 'static + Resource<DynamicType = ()> + Clone> {
    handlers: Mutex<Vec<Handler<K>>>,
    started: std::sync::atomic::AtomicBool,
    synced_tx: watch::Sender<bool>,
    store: Store<K>,
    writer: Mutex<Option<reflector::store::Writer<K>>>,
}

/// A cloneable handle to the process-wide informer of kind `K`.
pub struct SharedInformer<K: 'static + Resource<DynamicType = ()> + Clone> {
    shared: Arc<Shared<K>>,
}

impl<K: 'static + Resource<DynamicType = ()> + Clone> Clone for SharedInformer<K> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
        }
    }
}

impl<K> Default for SharedInformer<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    fn default() -> Self {
        Self::new()
    }
}

impl<K> SharedInformer<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    /// Creates an informer; subscribe, then [`SharedInformer::run`] it.
    pub fn new() -> Self {
        let (store, writer) = reflector::store();
        let (synced_tx, _) = watch::channel(false);
        Self {
            shared: Arc::new(Shared {
                handlers: Mutex::new(Vec::new()),
                started: std::sync::atomic::AtomicBool::new(false),
                synced_tx,
                store,
                writer: Mutex::new(Some(writer)),
            }),
        }
    }

    /// Registers a handler; only allowed before [`SharedInformer::run`] starts.
    pub fn subscribe(&self, handler: Handler<K>) -> Result<(), AlreadyStarted> {
        if self
            .shared
            .started
            .load(std::sync::atomic::Ordering::SeqCst)
        {
            return Err(AlreadyStarted);
        }
        self.shared.handlers.lock().push(handler);
        Ok(())
    }

    /// Reads one object from the cache.
    pub fn get(&self, name: &str) -> Option<Arc<K>> {
        self.shared.store.get(&ObjectRef::new(name))
    }

    /// Every cached object.
    pub fn list(&self) -> Vec<Arc<K>> {
        self.shared.store.state()
    }

    /// Whether the first full list has been cached.
    pub fn has_synced(&self) -> bool {
        *self.shared.synced_tx.borrow()
    }

    /// Waits until the first full list has been cached.
    pub async fn wait_synced(&self) {
        let mut rx = self.shared.synced_tx.subscribe();
        let _ = rx.wait_for(|s| *s).await;
    }

    fn dispatch(&self, handlers: &[Handler<K>], ev: InformerEvent<K>) {
        for h in handlers {
            h(&ev);
        }
    }

    /// Lists and watches `api` until `cancel` fires, caching what `transform` leaves of each object and
    /// notifying subscribers. Runs once.
    pub async fn run(self, api: Api<K>, transform: Transform<K>, cancel: CancellationToken) {
        if self
            .shared
            .started
            .swap(true, std::sync::atomic::Ordering::SeqCst)
        {
            tracing::error!("informer started twice; ignoring the second start");
            return;
        }
        let Some(mut writer) = self.shared.writer.lock().take() else {
            return;
        };
        let handlers: Vec<Handler<K>> = self.shared.handlers.lock().clone();
        let kind = K::kind(&()).to_string();
        let strategy = initial_list::decide(initial_list::probe(&api).await);
        match &strategy {
            initial_list::InitialList::Streaming => {
                tracing::info!(kind = %kind, initial_list = strategy.name(), "listing with a streaming list (sendInitialEvents)")
            }
            initial_list::InitialList::Paged(why) => tracing::info!(
                kind = %kind,
                initial_list = strategy.name(),
                page_size = initial_list::PAGE_SIZE,
                reason = %why,
                "listing in pages"
            ),
        }
        let stream = watcher(api, strategy.watcher_config())
            .backoff(watch_backoff())
            .modify(move |obj: &mut K| transform(obj));
        let mut stream = std::pin::pin!(stream);
        let mut before_relist: HashMap<String, Arc<K>> = HashMap::new();
        loop {
            let next = tokio::select! {
                _ = cancel.cancelled() => break,
                next = stream.next() => next,
            };
            let Some(item) = next else { break };
            let event = match item {
                Ok(ev) => ev,
                Err(e) => {
                    tracing::warn!(kind = %kind, error = %e, "watch failed; relisting with backoff");
                    continue;
                }
            };
            match &event {
                Event::Init => {
                    before_relist = self
                        .list()
                        .into_iter()
                        .map(|o| (o.meta().name.clone().unwrap_or_default(), o))
                        .collect();
                    writer.apply_watcher_event(&event);
                }
                Event::InitApply(_) => writer.apply_watcher_event(&event),
                Event::InitDone => {
                    writer.apply_watcher_event(&event);
                    let before = std::mem::take(&mut before_relist);
                    let events = relist_events(before, self.list());
                    let added = events
                        .iter()
                        .filter(|e| matches!(e, InformerEvent::Added(_)))
                        .count();
                    let gone = events
                        .iter()
                        .filter(|e| matches!(e, InformerEvent::Deleted(_)))
                        .count();
                    for ev in events {
                        self.dispatch(&handlers, ev);
                    }
                    tracing::info!(kind = %kind, objects = self.shared.store.len(), added, deleted_during_gap = gone, "list complete");
                    self.shared.synced_tx.send_replace(true);
                }
                Event::Apply(obj) => {
                    let name = obj.meta().name.clone().unwrap_or_default();
                    let prev = self.get(&name);
                    writer.apply_watcher_event(&event);
                    let Some(new) = self.get(&name) else { continue };
                    for ev in apply_events(prev, new) {
                        self.dispatch(&handlers, ev);
                    }
                }
                Event::Delete(obj) => {
                    let name = obj.meta().name.clone().unwrap_or_default();
                    let last = self.get(&name).unwrap_or_else(|| Arc::new(obj.clone()));
                    writer.apply_watcher_event(&event);
                    self.dispatch(&handlers, InformerEvent::Deleted(last));
                }
            }
        }
    }
}

/// Whether two versions are the same object: same name and same UID. A Node deleted and recreated under
/// its name is a different object, and whatever was recorded for the old one must not pass to the new one.
fn same_object<K: Resource>(a: &K, b: &K) -> bool {
    a.meta().uid == b.meta().uid
}

/// The events a live watch's add-or-update stands for: an update of the same object, or — when the UID
/// changed because the delete fell between two events we saw — the old object's delete and the new one's add.
fn apply_events<K: Resource>(prev: Option<Arc<K>>, new: Arc<K>) -> Vec<InformerEvent<K>> {
    match prev {
        None => vec![InformerEvent::Added(new)],
        Some(prev) if same_object(prev.as_ref(), new.as_ref()) => {
            vec![InformerEvent::Updated(prev, new)]
        }
        Some(prev) => vec![InformerEvent::Deleted(prev), InformerEvent::Added(new)],
    }
}

/// The events a relist stands for, given the cache before it and the new list: objects missing from the
/// list were deleted during the gap, new names were added, a name whose UID changed was deleted and
/// re-created, and every other object is re-delivered as an update (client-go's resync; handlers are
/// level-triggered, so this costs a cache read). Deletes come first, so a handler never sees the new
/// object of a name before the old one's delete.
fn relist_events<K: Resource>(
    mut before: HashMap<String, Arc<K>>,
    after: Vec<Arc<K>>,
) -> Vec<InformerEvent<K>> {
    let mut deletes = Vec::new();
    let mut rest = Vec::with_capacity(after.len());
    for obj in after {
        let name = obj.meta().name.clone().unwrap_or_default();
        match before.remove(&name) {
            None => rest.push(InformerEvent::Added(obj)),
            Some(prev) if same_object(prev.as_ref(), obj.as_ref()) => {
                rest.push(InformerEvent::Updated(prev, obj))
            }
            Some(prev) => {
                deletes.push(InformerEvent::Deleted(prev));
                rest.push(InformerEvent::Added(obj));
            }
        }
    }
    deletes.extend(before.into_values().map(InformerEvent::Deleted));
    deletes.extend(rest);
    deletes
}

/// The informer's retry policy after a failed list or watch: 250 ms doubling to 4 s, each delay with up
/// to as much again of jitter (so replicas that lost the API server together do not return in
/// lockstep), back to 250 ms after any success. kube-runtime's default (800 ms to 30 s, reset only after
/// 120 s without an error) left the cache blind for up to a minute after an API server restart, because
/// the relist that a restart's "resource version too old" demands came after a backoff grown during the
/// outage.
pub fn watch_backoff() -> watcher::ExponentialBackoff {
    backon::ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(250))
        .with_max_delay(Duration::from_secs(4))
        .with_factor(2.0)
        .with_jitter()
        .without_max_times()
        .into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Node;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn node(name: &str, uid: &str) -> Arc<Node> {
        Arc::new(Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                uid: Some(uid.into()),
                ..Default::default()
            },
            ..Default::default()
        })
    }

    fn describe(events: &[InformerEvent<Node>]) -> Vec<String> {
        let uid = |n: &Arc<Node>| n.metadata.uid.clone().unwrap_or_default();
        events
            .iter()
            .map(|e| match e {
                InformerEvent::Added(n) => format!("add {}", uid(n)),
                InformerEvent::Updated(o, n) => format!("update {}->{}", uid(o), uid(n)),
                InformerEvent::Deleted(n) => format!("delete {}", uid(n)),
            })
            .collect()
    }

    #[test]
    fn a_relist_reports_a_node_recreated_under_its_name_as_a_delete_then_an_add() {
        let before: HashMap<String, Arc<Node>> = [
            ("a".to_string(), node("a", "a1")),
            ("b".to_string(), node("b", "b1")),
            ("gone".to_string(), node("gone", "g1")),
        ]
        .into();
        let after = vec![node("a", "a2"), node("b", "b1"), node("new", "n1")];
        let mut got = describe(&relist_events(before, after));
        let (deletes, rest) = got.split_at_mut(2);
        deletes.sort();
        rest.sort();
        assert_eq!(deletes, ["delete a1", "delete g1"]);
        assert_eq!(rest, ["add a2", "add n1", "update b1->b1"]);
    }

    #[test]
    fn a_watch_event_with_a_new_uid_under_a_known_name_is_a_delete_then_an_add() {
        assert_eq!(
            describe(&apply_events(Some(node("a", "a1")), node("a", "a2"))),
            ["delete a1", "add a2"]
        );
        assert_eq!(
            describe(&apply_events(Some(node("a", "a1")), node("a", "a1"))),
            ["update a1->a1"]
        );
        assert_eq!(describe(&apply_events(None, node("a", "a1"))), ["add a1"]);
    }

    #[test]
    fn the_watch_backoff_doubles_to_four_seconds_never_gives_up_and_starts_over_after_a_success() {
        use kube::runtime::utils::Backoff;
        let mut b = watch_backoff();
        let delays: Vec<Duration> = (0..20).filter_map(|_| b.next()).collect();
        assert_eq!(delays.len(), 20, "it never gives up");
        assert!(delays[0] >= Duration::from_millis(250) && delays[0] < Duration::from_millis(500));
        assert!(delays[1] >= Duration::from_millis(500));
        assert!(
            delays.iter().all(|d| *d < Duration::from_secs(8)),
            "{delays:?}"
        );
        assert!(delays[19] >= Duration::from_secs(4));
        b.reset();
        assert!(b.next().is_some_and(|d| d < Duration::from_millis(500)));
    }
}
