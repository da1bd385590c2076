//! The shared informer: ONE list+watch per kind for the whole process ([`list_watch`], feeding the
//! informer's own store, [`store`]), fanned out to every subscribed controller as add / update /
//! delete events.
//!
//! Why not kube-runtime's shared streams: they are unstable and never deliver deletes to subscribers. Here a
//! delete carries the last known object, and after every relist (the watcher's `Init … InitDone`) the new
//! list is diffed against the cache, so an object deleted during a watch gap is reported as deleted and an
//! object changed during the gap as updated. Events are delivered only after the store holds the new state,
//! so a handler that enqueues a key and a worker that re-reads the cache always agree.
//!
//! Why not kube-runtime's reflector store: it holds `kube::Resource`s (a whole `ObjectMeta` each) and
//! keys them by an `ObjectRef` that copies name, uid and resourceVersion again. The cached type here only
//! has to say its name and UID ([`Cached`]); for Nodes it is the compact [`crate::CachedNode`].
//!
//! Lists are consistent reads and the cache never goes back to an older list ([`list_watch`]): a lagging
//! API server cannot make it forget a Node, or a Node's pod CIDRs, that it has already seen.
//!
//! The list+watch decodes a wire type that names only what can be cached (for Nodes,
//! [`crate::node_fields::WireNode`]), and each object is converted to the cached type before the store
//! sees it: a full object is never built.

use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use kube::api::Api;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::Resource;
use parking_lot::Mutex;
use serde::de::DeserializeOwned;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

pub mod initial_list;
pub mod list_watch;
pub mod store;
pub mod version;

pub use store::Cached;
use store::{Objects, Store};

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

impl<K: Cached> InformerEvent<K> {
    /// The object's name.
    pub fn name(&self) -> &str {
        let obj = match self {
            Self::Added(o) | Self::Updated(_, o) | Self::Deleted(o) => o,
        };
        obj.name()
    }
}

/// An event handler; it must only enqueue keys (it runs on the informer task).
pub type Handler<K> = Arc<dyn Fn(&InformerEvent<K>) + Send + Sync>;

/// What the cache holds for one decoded object of the wire type `W` (e.g. [`crate::node_fields::WireNode`]
/// → a [`crate::CachedNode`]): the informer lists and watches `W`, so only what `W` names is ever decoded.
pub type Convert<W, K> = Arc<dyn Fn(W) -> K + Send + Sync>;

/// Subscribing after the informer started is a programming error the manager reports.
#[derive(Debug, thiserror::Error)]
#[error("subscribers must register before the informer starts")]
pub struct AlreadyStarted;

struct Shared<K> {
    handlers: Mutex<Vec<Handler<K>>>,
    started: std::sync::atomic::AtomicBool,
    /// Whether a run is under way (it may run again after it ended).
    running: std::sync::atomic::AtomicBool,
    /// Whether handlers hear events ([`SharedInformer::held`], [`SharedInformer::open`]). Held across each
    /// event's store update and dispatch, so opening never loses nor doubles an event.
    dispatching: Mutex<bool>,
    synced_tx: watch::Sender<bool>,
    /// How many lists have completed (the first and every relist).
    lists_tx: watch::Sender<u64>,
    /// The newest resourceVersion the store holds, as an etcd revision ([`SharedInformer::wait_for_revision`]).
    newest_tx: watch::Sender<u64>,
    store: Store<K>,
    /// Shared by every [`NameKeys`] of this informer.
    name_keys: NameKeys,
}

/// Makes an object's name into a shared string for a queue key. Every handler of one event runs in turn,
/// so the handlers that queue the object's name (each controller's queue) get one allocation between
/// them instead of one each: at a 50,000-Node backlog both chart controllers' queues hold every name.
#[derive(Clone, Default)]
pub struct NameKeys {
    /// The last name handed out.
    last: Arc<Mutex<Option<Arc<str>>>>,
}

impl NameKeys {
    /// `name` as a shared string: the one handed out last when it is the same name.
    pub fn key(&self, name: &str) -> Arc<str> {
        let mut last = self.last.lock();
        match last.as_ref() {
            Some(key) if &**key == name => key.clone(),
            _ => last.insert(Arc::from(name)).clone(),
        }
    }
}

/// A cloneable handle to the process-wide informer caching `K`s.
pub struct SharedInformer<K> {
    shared: Arc<Shared<K>>,
}

impl<K> Clone for SharedInformer<K> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
        }
    }
}

impl<K: Cached> Default for SharedInformer<K> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K: Cached> SharedInformer<K> {
    /// Creates an informer whose handlers hear every event; subscribe, then [`SharedInformer::run`] it.
    pub fn new() -> Self {
        Self::with_dispatch(true)
    }

    /// Creates an informer that caches without telling its handlers until [`SharedInformer::open`]: a
    /// standby's warm cache, whose controllers' queues stay empty until it leads.
    pub fn closed() -> Self {
        Self::with_dispatch(false)
    }

    fn with_dispatch(open: bool) -> Self {
        Self {
            shared: Arc::new(Shared {
                handlers: Mutex::new(Vec::new()),
                started: std::sync::atomic::AtomicBool::new(false),
                running: std::sync::atomic::AtomicBool::new(false),
                dispatching: Mutex::new(open),
                synced_tx: watch::channel(false).0,
                lists_tx: watch::channel(0).0,
                newest_tx: watch::channel(0).0,
                store: Store::new(),
                name_keys: NameKeys::default(),
            }),
        }
    }

    /// Starts telling the handlers: first every cached object as added (what a first list would have
    /// told them), then every event from here on. Idempotent.
    pub fn open(&self) {
        let mut dispatching = self.shared.dispatching.lock();
        if *dispatching {
            return;
        }
        let handlers = self.shared.handlers.lock().clone();
        for obj in self.list() {
            self.dispatch(&handlers, InformerEvent::Added(obj));
        }
        *dispatching = true;
    }

    /// How many lists have completed so far; with [`SharedInformer::wait_listed_after`], to wait for a
    /// list that started after some moment.
    pub fn lists_completed(&self) -> u64 {
        *self.shared.lists_tx.borrow()
    }

    /// Waits until more than `completed` lists have completed.
    pub async fn wait_listed_after(&self, completed: u64) {
        let mut rx = self.shared.lists_tx.subscribe();
        let _ = rx.wait_for(|n| *n > completed).await;
    }

    /// Waits until the store holds resourceVersion `revision` or newer: a watch delivers in the order of
    /// etcd's revisions, so the cache then shows every change made before that revision.
    pub async fn wait_for_revision(&self, revision: u64) {
        let mut rx = self.shared.newest_tx.subscribe();
        let _ = rx.wait_for(|n| *n >= revision).await;
    }

    fn saw(&self, resource_version: &str) {
        if let Some(r) = version::revision(resource_version) {
            self.shared.newest_tx.send_if_modified(|n| {
                let newer = r > *n;
                *n = (*n).max(r);
                newer
            });
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

    /// The informer's [`NameKeys`], for a handler that queues names (it holds no reference to the
    /// informer, so a handler keeping it makes no cycle).
    pub fn name_keys(&self) -> NameKeys {
        self.shared.name_keys.clone()
    }

    /// Reads one object from the cache.
    pub fn get(&self, name: &str) -> Option<Arc<K>> {
        self.shared.store.get(name)
    }

    /// Every cached object.
    pub fn list(&self) -> Vec<Arc<K>> {
        self.shared.store.list()
    }

    /// How many objects the cache holds.
    pub fn len(&self) -> usize {
        self.shared.store.len()
    }

    /// Whether the cache holds no object.
    pub fn is_empty(&self) -> bool {
        self.shared.store.is_empty()
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

    /// Lists and watches `api` until `cancel` fires, caching what `convert` makes of each decoded object
    /// and notifying subscribers. Runs once at a time; run again after it ended, it lists again into the
    /// same cache (a relist).
    pub async fn run<W>(self, api: Api<W>, convert: Convert<W, K>, cancel: CancellationToken)
    where
        W: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    {
        let _running = match Running::take(&self.shared) {
            Some(r) => r,
            None => {
                tracing::error!("informer started twice; ignoring the second start");
                return;
            }
        };
        let handlers: Vec<Handler<K>> = self.shared.handlers.lock().clone();
        let kind = W::kind(&()).to_string();
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
        let stream = list_watch::list_watch(api, strategy)
            .backoff(watch_backoff())
            .map_ok(move |event| convert_event(event, convert.as_ref()));
        let mut stream = std::pin::pin!(stream);
        // A relist's objects, collected until it is complete; until then readers see the cache as it was.
        let mut relisted: Vec<Arc<K>> = Vec::new();
        loop {
            let next = tokio::select! {
                _ = cancel.cancelled() => break,
                next = stream.next() => next,
            };
            let Some(item) = next else { break };
            let event = match item {
                Ok(ev) => ev,
                Err(e) => {
                    tracing::warn!(kind = %kind, error = %e, "list or watch failed; retrying with backoff");
                    continue;
                }
            };
            self.handle(&handlers, &kind, &mut relisted, event);
        }
    }

    /// A relisted object, or the cached one when it is the same version: the new copy is dropped at
    /// once, so a relist does not hold two copies of every unchanged object until it completes.
    fn unless_unchanged(&self, obj: K) -> Arc<K> {
        match self.shared.store.get(obj.name()) {
            Some(cached)
                if cached.uid() == obj.uid()
                    && cached.resource_version() == obj.resource_version()
                    && !obj.resource_version().is_empty() =>
            {
                cached
            }
            _ => Arc::new(obj),
        }
    }

    /// Applies one watcher event to the store, then tells the handlers what it stands for.
    fn handle(
        &self,
        handlers: &[Handler<K>],
        kind: &str,
        relisted: &mut Vec<Arc<K>>,
        event: Event<K>,
    ) {
        let dispatching = self.shared.dispatching.lock();
        let handlers = if *dispatching { handlers } else { &[] };
        match event {
            Event::Init => relisted.clear(),
            Event::InitApply(obj) => relisted.push(self.unless_unchanged(obj)),
            Event::InitDone => {
                for obj in relisted.iter() {
                    self.saw(obj.resource_version());
                }
                let listed = store::collect(std::mem::take(relisted));
                let before = self.shared.store.replace(listed);
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
                    self.dispatch(handlers, ev);
                }
                tracing::info!(kind = %kind, objects = self.shared.store.len(), added, deleted_during_gap = gone, "list complete");
                self.shared.synced_tx.send_replace(true);
                self.shared.lists_tx.send_modify(|n| *n += 1);
            }
            Event::Apply(obj) => {
                self.saw(obj.resource_version());
                let new = Arc::new(obj);
                let prev = self.shared.store.put(new.clone());
                for ev in apply_events(prev, new) {
                    self.dispatch(handlers, ev);
                }
            }
            Event::Delete(obj) => {
                self.saw(obj.resource_version());
                let last = self
                    .shared
                    .store
                    .remove(obj.name())
                    .unwrap_or_else(|| Arc::new(obj));
                self.dispatch(handlers, InformerEvent::Deleted(last));
            }
        }
    }
}

/// An informer fed by the test, for the unit tests of what reads the cache and hears its events.
#[cfg(any(test, feature = "test-support"))]
impl<K: Cached> SharedInformer<K> {
    /// An informer whose cache holds `objects` as a completed first list, with no list or watch behind
    /// it. It is held, as a standby's warm cache ([`SharedInformer::held`]): handlers subscribed
    /// afterwards hear nothing of these objects until [`SharedInformer::open`], so a test that drives the
    /// syncs itself finds in a queue only the keys the code under test put there.
    pub fn listed(objects: impl IntoIterator<Item = K>) -> Self {
        let informer = Self::closed();
        let listed: Vec<Arc<K>> = objects.into_iter().map(Arc::new).collect();
        for obj in &listed {
            informer.saw(obj.resource_version());
        }
        informer.shared.store.replace(store::collect(listed));
        informer.shared.synced_tx.send_replace(true);
        informer.shared.lists_tx.send_modify(|n| *n += 1);
        informer
    }

    /// What a watch event adding or changing `obj` does: the cache first, then the handlers (once open).
    pub fn apply(&self, obj: K) {
        let handlers = self.shared.handlers.lock().clone();
        self.handle(&handlers, "test", &mut Vec::new(), Event::Apply(obj));
    }

    /// What a watch event deleting `name` does: the cache first, then the handlers (once open) hear
    /// the last version it held. Nothing if it holds none.
    pub fn remove(&self, name: &str) {
        let dispatching = self.shared.dispatching.lock();
        let Some(last) = self.shared.store.remove(name) else {
            return;
        };
        if *dispatching {
            let handlers = self.shared.handlers.lock().clone();
            self.dispatch(&handlers, InformerEvent::Deleted(last));
        }
    }
}

/// The mark that one run of the informer is under way: taken at its start, given back when it ends.
/// Subscriptions stay closed after a run ends: a handler added then would have missed what the cache holds.
struct Running<'a> {
    running: &'a std::sync::atomic::AtomicBool,
}

impl<'a> Running<'a> {
    /// `None` when a run is already under way.
    fn take<K>(shared: &'a Shared<K>) -> Option<Self> {
        use std::sync::atomic::Ordering::SeqCst;
        if shared.running.swap(true, SeqCst) {
            return None;
        }
        shared.started.store(true, SeqCst);
        Some(Self {
            running: &shared.running,
        })
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.running
            .store(false, std::sync::atomic::Ordering::SeqCst);
    }
}

/// The watcher's event with its object converted to what the cache holds.
fn convert_event<W, K>(event: Event<W>, convert: &(dyn Fn(W) -> K + Send + Sync)) -> Event<K> {
    match event {
        Event::Init => Event::Init,
        Event::InitApply(o) => Event::InitApply(convert(o)),
        Event::InitDone => Event::InitDone,
        Event::Apply(o) => Event::Apply(convert(o)),
        Event::Delete(o) => Event::Delete(convert(o)),
    }
}

/// Whether two versions are the same object: same name and same UID. A Node deleted and recreated under
/// its name is a different object, and whatever was recorded for the old one must not pass to the new one.
fn same_object<K: Cached>(a: &K, b: &K) -> bool {
    a.uid() == b.uid()
}

/// The events a live watch's add-or-update stands for: an update of the same object, or — when the UID
/// changed because the delete fell between two events we saw — the old object's delete and the new one's add.
fn apply_events<K: Cached>(prev: Option<Arc<K>>, new: Arc<K>) -> Vec<InformerEvent<K>> {
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
fn relist_events<K: Cached>(mut before: Objects<K>, after: Vec<Arc<K>>) -> Vec<InformerEvent<K>> {
    let mut deletes = Vec::new();
    let mut rest = Vec::with_capacity(after.len());
    for obj in after {
        match before.take(obj.name()).map(|o| o.0) {
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
    deletes.extend(before.into_iter().map(|o| InformerEvent::Deleted(o.0)));
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
mod tests;
