//! The watch's store of ClusterCIDRs. Each object is read once, when the watch delivers it, into what
//! the pool reconcile needs — not the whole object with its `managedFields` and annotations, which the
//! once-a-second pass used to deep-clone — and versions let a pass skip what did not change: the pools
//! are synced only when an object's pool changed, and an object is looked at again only when it was
//! put since the last pass (or its pool's status or Event may be due). Pure.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::DynamicObject;
use netcm_ipam::ObjectPool;
use serde_json::Value;

use super::{convert, FINALIZER};

/// What the pool reconcile needs of one ClusterCIDR.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Stored {
    /// `metadata.name`.
    pub(crate) name: String,
    /// `metadata.uid`.
    pub(crate) uid: Option<String>,
    /// `metadata.resourceVersion`: the finalizer patch is conditional on it.
    pub(crate) resource_version: Option<String>,
    /// `metadata.generation`, for the status's `observedGeneration`.
    pub(crate) generation: Option<i64>,
    /// `metadata.creationTimestamp`: pools are ranked oldest first.
    created: Option<Time>,
    /// `metadata.deletionTimestamp` is set.
    pub(crate) deleting: bool,
    /// `metadata.finalizers`.
    pub(crate) finalizers: Vec<String>,
    /// `status`, as last read.
    pub(crate) status: Option<Value>,
    /// The pool it describes ([`convert::object_pool`]).
    pub(crate) pool: ObjectPool,
    /// The store's [`Store::version`] when it was put.
    pub(crate) version: u64,
}

impl Stored {
    /// Reads what the reconcile needs of `obj`.
    pub(crate) fn read(obj: &DynamicObject) -> Stored {
        let meta = &obj.metadata;
        Stored {
            name: meta.name.clone().unwrap_or_default(),
            uid: meta.uid.clone(),
            resource_version: meta.resource_version.clone(),
            generation: meta.generation,
            created: meta.creation_timestamp.clone(),
            deleting: meta.deletion_timestamp.is_some(),
            finalizers: meta.finalizers.clone().unwrap_or_default(),
            status: obj.data.get("status").cloned(),
            pool: convert::object_pool(obj),
            version: 0,
        }
    }

    /// Whether it carries netcm's (node-ipam-controller's) finalizer.
    pub(crate) fn has_finalizer(&self) -> bool {
        self.finalizers.iter().any(|f| f == FINALIZER)
    }
}

/// The ClusterCIDRs by name, with versions.
#[derive(Debug, Default)]
pub(crate) struct Store {
    objects: BTreeMap<String, Arc<Stored>>,
    /// Bumped by every change.
    version: u64,
    /// Bumped when the pools the objects describe change: one added or removed, or its pool changed.
    pools_version: u64,
    /// The pools oldest first, as of `pools_version` (none until asked for).
    pools: Option<(u64, Arc<[ObjectPool]>)>,
    /// How many times the pools were put in order: the bound the tests hold a pass to.
    pub(crate) orderings: u64,
}

/// What a pass reads of the store.
#[derive(Debug, Clone)]
pub(crate) struct Snapshot {
    /// [`Store`]'s version: entries put after it are newer.
    pub(crate) version: u64,
    /// The version of the pools below.
    pub(crate) pools_version: u64,
    /// Every object's pool, oldest first.
    pub(crate) pools: Arc<[ObjectPool]>,
}

impl Store {
    /// Puts `obj`, read; an object at the resourceVersion already stored is left as it is.
    pub(crate) fn put(&mut self, obj: &DynamicObject) {
        let name = obj.metadata.name.as_deref().unwrap_or_default();
        if let Some(have) = self.objects.get(name) {
            if have.resource_version.is_some()
                && have.resource_version == obj.metadata.resource_version
            {
                return;
            }
        }
        self.insert(Stored::read(obj));
    }

    /// Puts `obj` as a write returned it, only if the store still holds that object (same name and
    /// uid): the watch may have delivered its deletion while the write was in flight — removing the
    /// last finalizer deletes the object — and the response must not bring it back, a pool no pass
    /// would ever drop (and whose ranges would keep another pool refused).
    pub(crate) fn put_written(&mut self, obj: &DynamicObject) {
        let name = obj.metadata.name.as_deref().unwrap_or_default();
        if self
            .objects
            .get(name)
            .is_some_and(|have| have.uid == obj.metadata.uid)
        {
            self.put(obj);
        }
    }

    fn insert(&mut self, mut stored: Stored) {
        self.version += 1;
        stored.version = self.version;
        let pool_changed = self
            .objects
            .get(&stored.name)
            .is_none_or(|have| have.pool != stored.pool || have.created != stored.created);
        if pool_changed {
            self.pools_version += 1;
        }
        self.objects.insert(stored.name.clone(), Arc::new(stored));
    }

    /// Removes the object `name`.
    pub(crate) fn remove(&mut self, name: &str) {
        if self.objects.remove(name).is_some() {
            self.version += 1;
            self.pools_version += 1;
        }
    }

    /// Makes the store hold exactly `listed` (a relist), keeping the entries that did not change.
    pub(crate) fn replace(&mut self, listed: Vec<DynamicObject>) {
        let names: std::collections::HashSet<String> = listed
            .iter()
            .map(|o| o.metadata.name.clone().unwrap_or_default())
            .collect();
        let gone: Vec<String> = self
            .objects
            .keys()
            .filter(|n| !names.contains(n.as_str()))
            .cloned()
            .collect();
        for name in gone {
            self.remove(&name);
        }
        for obj in &listed {
            self.put(obj);
        }
    }

    /// The versions and the pools oldest first, put in order again only if they changed.
    pub(crate) fn snapshot(&mut self) -> Snapshot {
        let pools = match &self.pools {
            Some((v, pools)) if *v == self.pools_version => pools.clone(),
            _ => {
                self.orderings += 1;
                let mut ordered: Vec<&Stored> = self.objects.values().map(AsRef::as_ref).collect();
                ordered.sort_by(|a, b| {
                    let created = |s: &Stored| s.created.as_ref().map(|t| t.0);
                    (created(a), &a.name).cmp(&(created(b), &b.name))
                });
                let pools: Arc<[ObjectPool]> = ordered.iter().map(|s| s.pool.clone()).collect();
                self.pools = Some((self.pools_version, pools.clone()));
                pools
            }
        };
        Snapshot {
            version: self.version,
            pools_version: self.pools_version,
            pools,
        }
    }

    /// The object `name`.
    pub(crate) fn get(&self, name: &str) -> Option<Arc<Stored>> {
        self.objects.get(name).cloned()
    }

    /// Whether the object `name` is stored.
    pub(crate) fn contains(&self, name: &str) -> bool {
        self.objects.contains_key(name)
    }

    /// Every object put after `version`, or every object if `all`.
    pub(crate) fn newer_than(&self, version: u64, all: bool) -> Vec<Arc<Stored>> {
        self.objects
            .values()
            .filter(|s| all || s.version > version)
            .cloned()
            .collect()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use kube::api::ApiResource;
    use serde_json::json;

    fn object(name: &str, rv: &str, ipv4: &str, status: Value) -> DynamicObject {
        let mut o = DynamicObject::new(name, &ApiResource::erase::<super::super::ClusterCidr>(&()))
            .data(json!({"spec": {"perNodeHostBits": 8, "ipv4": ipv4}, "status": status}));
        o.metadata.resource_version = Some(rv.into());
        o.metadata.uid = Some(format!("uid-{name}"));
        o
    }

    #[test]
    fn a_status_or_finalizer_change_is_seen_but_leaves_the_pools_as_they_were() {
        let mut s = Store::default();
        s.put(&object("a", "1", "10.1.0.0/16", json!({})));
        let first = s.snapshot();
        let mut o = object("a", "2", "10.1.0.0/16", json!({"phase": "Active"}));
        o.metadata.finalizers = Some(vec![FINALIZER.into()]);
        s.put(&o);
        let second = s.snapshot();
        assert_eq!(second.pools_version, first.pools_version);
        assert!(second.version > first.version);
        let stored = s.get("a").unwrap();
        assert!(stored.has_finalizer());
        assert_eq!(stored.status, Some(json!({"phase": "Active"})));
        assert_eq!(
            s.newer_than(first.version, false)
                .iter()
                .map(|e| e.name.as_str())
                .collect::<Vec<_>>(),
            ["a"]
        );
    }

    #[test]
    fn a_write_that_returns_after_the_watch_removed_its_object_does_not_bring_it_back() {
        let mut s = Store::default();
        s.put(&object("a", "1", "10.1.0.0/16", json!({})));
        s.remove("a");
        let before = s.snapshot();
        s.put_written(&object("a", "2", "10.1.0.0/16", json!({})));
        assert!(!s.contains("a"));
        assert_eq!(s.snapshot().pools_version, before.pools_version);
    }

    #[test]
    fn a_write_to_an_object_the_store_holds_is_put_but_not_over_a_new_object_of_that_name() {
        let mut s = Store::default();
        s.put(&object("a", "1", "10.1.0.0/16", json!({})));
        s.put_written(&object("a", "2", "10.1.0.0/16", json!({"phase": "Active"})));
        assert_eq!(s.get("a").unwrap().status, Some(json!({"phase": "Active"})));
        let mut old = object("a", "3", "10.1.0.0/16", json!({"phase": "Refused"}));
        old.metadata.uid = Some("uid-of-a-deleted-a".into());
        s.put_written(&old);
        assert_eq!(s.get("a").unwrap().status, Some(json!({"phase": "Active"})));
    }

    #[test]
    fn passes_over_an_unchanged_store_put_the_pools_in_order_once() {
        let mut s = Store::default();
        let listed: Vec<DynamicObject> = (0..100)
            .map(|i| {
                object(
                    &format!("o{i:03}"),
                    "1",
                    &format!("10.{i}.0.0/16"),
                    json!({}),
                )
            })
            .collect();
        s.replace(listed.clone());
        let first = s.snapshot();
        assert_eq!(first.pools.len(), 100);
        for _ in 0..10 {
            let again = s.snapshot();
            assert!(Arc::ptr_eq(&again.pools, &first.pools));
            assert_eq!(again.version, first.version);
        }
        // A relist of the same objects at the same resourceVersions changes nothing either.
        s.replace(listed);
        let relisted = s.snapshot();
        assert_eq!(relisted.version, first.version);
        assert!(s.newer_than(first.version, false).is_empty());
        assert_eq!(s.orderings, 1);
    }

    #[test]
    fn a_changed_removed_or_new_object_changes_the_pools_oldest_first() {
        let mut s = Store::default();
        let mut old = object("zz-old", "1", "10.1.0.0/16", json!({}));
        old.metadata.creation_timestamp = Some(Time("2020-01-01T00:00:00Z".parse().unwrap()));
        let mut new = object("aa-new", "1", "10.2.0.0/16", json!({}));
        new.metadata.creation_timestamp = Some(Time("2024-01-01T00:00:00Z".parse().unwrap()));
        s.put(&new);
        s.put(&old);
        let first = s.snapshot();
        let names: Vec<&str> = first.pools.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["zz-old", "aa-new"]);
        let mut deleted = new.clone();
        deleted.metadata.resource_version = Some("2".into());
        deleted.metadata.deletion_timestamp = new.metadata.creation_timestamp.clone();
        s.put(&deleted);
        let second = s.snapshot();
        assert!(second.pools_version > first.pools_version);
        assert!(second.pools[1].deleting);
        s.replace(vec![old]);
        let third = s.snapshot();
        assert_eq!(third.pools.len(), 1);
        assert!(third.pools_version > second.pools_version);
    }
}
