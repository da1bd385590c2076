//! The informer's cache: every object by name, each behind an `Arc` that readers share. The set is keyed
//! by the object's own name (no second copy of it as the key), and replaced whole when a relist ends.

use std::borrow::Borrow;
use std::collections::HashSet;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use parking_lot::RwLock;

/// What the informer needs of a cached object: its name (the cache key), its UID (which tells a
/// re-created object from an update) and its resourceVersion (which tells a relist's unchanged objects).
pub trait Cached: Send + Sync + 'static {
    /// `metadata.name`.
    fn name(&self) -> &str;
    /// `metadata.uid`.
    fn uid(&self) -> &str;
    /// `metadata.resourceVersion`.
    fn resource_version(&self) -> &str;
}

/// An object in the set, hashed and compared by name, so the set is looked up by a `&str`.
pub(crate) struct ByName<K>(pub(crate) Arc<K>);

impl<K: Cached> Borrow<str> for ByName<K> {
    fn borrow(&self) -> &str {
        self.0.name()
    }
}

// Hash and equality must agree with `str`'s for `Borrow<str>` lookups: they are the name's.
impl<K: Cached> Hash for ByName<K> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.name().hash(state);
    }
}

impl<K: Cached> PartialEq for ByName<K> {
    fn eq(&self, other: &Self) -> bool {
        self.0.name() == other.0.name()
    }
}

impl<K: Cached> Eq for ByName<K> {}

/// Every object by name.
pub(crate) type Objects<K> = HashSet<ByName<K>>;

/// The cache: read by every controller, written only by the informer's task (public for
/// `benches/decode.rs`, which measures what it holds per object).
pub struct Store<K> {
    objects: RwLock<Objects<K>>,
}

impl<K: Cached> Default for Store<K> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K: Cached> Store<K> {
    /// An empty store.
    pub fn new() -> Self {
        Self {
            objects: RwLock::new(HashSet::new()),
        }
    }

    /// Whether it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.objects.read().is_empty()
    }

    /// The object `name`.
    pub fn get(&self, name: &str) -> Option<Arc<K>> {
        self.objects.read().get(name).map(|o| o.0.clone())
    }

    /// Every object.
    pub fn list(&self) -> Vec<Arc<K>> {
        self.objects.read().iter().map(|o| o.0.clone()).collect()
    }

    /// How many objects.
    pub fn len(&self) -> usize {
        self.objects.read().len()
    }

    /// Stores `obj` under its name; the version it replaced, if any.
    pub fn put(&self, obj: Arc<K>) -> Option<Arc<K>> {
        let mut objects = self.objects.write();
        netcm_table::make_room_for_one(&mut *objects);
        objects.replace(ByName(obj)).map(|o| o.0)
    }

    /// Drops the object `name`; the last version stored, if any.
    pub fn remove(&self, name: &str) -> Option<Arc<K>> {
        self.objects.write().take(name).map(|o| o.0)
    }

    /// How many objects it holds before its set must grow (for tests of its size under churn).
    #[cfg(test)]
    pub(crate) fn capacity(&self) -> usize {
        self.objects.read().capacity()
    }

    /// Replaces every object with `objects` (a relist's result); what the cache held before.
    pub(crate) fn replace(&self, objects: Objects<K>) -> Objects<K> {
        std::mem::replace(&mut *self.objects.write(), objects)
    }
}

/// A relist's objects as a set; of a name listed twice, the later one counts.
pub(crate) fn collect<K: Cached>(objects: Vec<Arc<K>>) -> Objects<K> {
    let mut set = HashSet::with_capacity(objects.len());
    for o in objects {
        set.replace(ByName(o));
    }
    set
}
