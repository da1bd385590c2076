//! [`CachedNode`]: what the shared informer holds of one Node — its identity and the fields the enabled
//! controllers declared, nothing else — in a few hundred bytes at most.
//!
//! Every string of the Node (name, uid, keys, values, addresses, …) sits in one buffer, and everything
//! else — flags, the pod CIDRs parsed, and each string's span of the buffer — in one table of words whose
//! header says which sections it holds (`layout.rs`): a Node is two boxes whatever it declares, and no
//! slot of an unused field is carried. Readers see `&str`s and small borrowed views through the
//! accessors; the layout is private. An address, condition or taint is `netcm-protobuf`'s one definition
//! ([`Address`], [`Condition`], [`Taint`]), read as `&str`s.
//!
//! Built by [`CachedNodeBuilder`] (the informer's decode, tests), or from a full `Node` read from the API
//! (`From<&Node>`), through the same rules: pod CIDRs are `spec.podCIDRs`, else `spec.podCIDR`, each
//! parsed once here; annotations and labels are sorted by key. The words every Node repeats (annotation
//! and label keys, field managers, address types, condition and taint words) are held once per process
//! (`interned.rs`).

use std::fmt;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::{Node, ObjectReference};

use crate::pod_cidrs::PodCidrs;

mod builder;
mod interned;
mod layout;
pub use builder::CachedNodeBuilder;
use layout::{flags, Tables};
pub use netcm_protobuf::entries::{Address, Condition, Taint};

/// The text of `span`: in `text`, the Node's buffer, or in the table of interned strings.
fn span_str(text: &str, span: Span) -> &str {
    if let Some(s) = interned::get(span) {
        return s;
    }
    let start = span.start as usize;
    text.get(start..start + span.len as usize)
        .unwrap_or_default()
}

/// A string of the Node: `len` bytes of its buffer from `start`, or (with [`interned::INTERNED`] set in
/// `start`) a word many Nodes share, from the process-wide table.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Span {
    start: u32,
    len: u32,
}

/// A (key, value) pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Pair {
    key: Span,
    value: Span,
}

/// One pod CIDR entry: as written, and parsed (`None`: not a CIDR).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct CidrEntry {
    raw: Span,
    net: Option<IpNet>,
}

/// A Node as the informer caches it: identity, deletion state, and the declared fields. Two boxes: the
/// Node's strings, and one table of words for everything else (`layout.rs`).
#[derive(Clone)]
pub struct CachedNode {
    /// The strings, starting with the name, the uid and the resourceVersion.
    text: Box<str>,
    tables: Tables,
}

/// The lists of pairs, by their order in the table of pairs.
#[derive(Clone, Copy)]
enum PairList {
    Addresses = 0,
    Annotations = 1,
    AnnotationOwners = 2,
    Labels = 3,
}

/// One pod CIDR entry of the Node: as written, and parsed once (`None`: it is not a CIDR).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PodCidr<'a> {
    /// The entry as the Node holds it.
    pub raw: &'a str,
    /// The entry parsed, host bits kept; `None` if it is not a CIDR.
    pub net: Option<IpNet>,
}

impl CachedNode {
    /// A builder for the Node `name` with `uid` at `resource_version`.
    pub fn builder(name: &str, uid: &str, resource_version: &str) -> CachedNodeBuilder {
        CachedNodeBuilder::new(name, uid, resource_version)
    }

    fn str(&self, span: Span) -> &str {
        span_str(&self.text, span)
    }

    fn pair(&self, p: &Pair) -> (&str, &str) {
        (self.str(p.key), self.str(p.value))
    }

    /// The `i`th of the strings the buffer starts with: name, uid, resourceVersion.
    fn leading(&self, i: usize) -> &str {
        let lens = self.tables.lens();
        let start: usize = lens.iter().take(i).sum();
        let len = lens.get(i).copied().unwrap_or(0);
        self.text.get(start..start + len).unwrap_or_default()
    }

    /// `metadata.name`.
    pub fn name(&self) -> &str {
        self.leading(0)
    }

    /// `metadata.uid`.
    pub fn uid(&self) -> &str {
        self.leading(1)
    }

    /// `metadata.resourceVersion`.
    pub fn resource_version(&self) -> &str {
        self.leading(2)
    }

    /// The pairs of one list.
    fn pair_list(&self, list: PairList) -> impl ExactSizeIterator<Item = Pair> + '_ {
        let (first, range) = self.tables.pair_range(list as usize);
        range.map(move |k| self.tables.pair(first, k))
    }

    /// Whether `metadata.deletionTimestamp` is set.
    pub fn is_deleting(&self) -> bool {
        self.tables.has(flags::DELETING)
    }

    /// Whether `metadata.annotations` has any entry, declared or not.
    pub fn has_annotations(&self) -> bool {
        self.tables.has(flags::HAS_ANNOTATIONS)
    }

    /// `spec.unschedulable` (if declared).
    pub fn unschedulable(&self) -> bool {
        self.tables.has(flags::UNSCHEDULABLE)
    }

    /// `status.capacity.pods` (if declared): how many pods the kubelet runs, as it registered. `None`
    /// when absent or not a plain count (a Quantity like `1k`, which no kubelet writes for pods).
    pub fn capacity_pods(&self) -> Option<u32> {
        Some(self.tables.capacity_pods()).filter(|n| *n != 0)
    }

    /// `spec.providerID` (if declared).
    pub fn provider_id(&self) -> Option<&str> {
        self.tables.provider_id().map(|s| self.str(s))
    }

    /// The pod CIDR entries (`spec.podCIDRs`, else `spec.podCIDR`), each as written and parsed.
    pub fn pod_cidr_entries(&self) -> impl ExactSizeIterator<Item = PodCidr<'_>> + '_ {
        self.tables.pod_cidrs().map(|e| PodCidr {
            raw: self.str(e.raw),
            net: e.net,
        })
    }

    /// The pod CIDR entries as written, in the Node's order.
    pub fn raw_pod_cidrs(&self) -> impl ExactSizeIterator<Item = &str> + '_ {
        self.tables.pod_cidrs().map(|e| self.str(e.raw))
    }

    /// The pod CIDRs, parsed (when the Node was cached, not now), with the entries that are not CIDRs.
    pub fn pod_cidrs(&self) -> PodCidrs {
        let mut out = PodCidrs::default();
        for e in self.pod_cidr_entries() {
            match e.net {
                Some(net) => out.cidrs.push(net),
                None => out
                    .unparsable
                    .push(crate::UnparsableCidr { raw: e.raw.into() }),
            }
        }
        out
    }

    /// `status.addresses`, in the Node's order.
    pub fn addresses(&self) -> impl ExactSizeIterator<Item = Address<&str>> + '_ {
        self.pair_list(PairList::Addresses).map(|p| Address {
            type_: self.str(p.key),
            address: self.str(p.value),
        })
    }

    /// The value of the annotation `key`, if it was declared and the Node has it.
    pub fn annotation(&self, key: &str) -> Option<&str> {
        self.lookup(PairList::Annotations, key)
    }

    /// The kept annotations, sorted by key.
    pub fn annotations(&self) -> impl ExactSizeIterator<Item = (&str, &str)> + '_ {
        self.pair_list(PairList::Annotations).map(|p| self.pair(&p))
    }

    /// Who owns which kept annotation key, by `metadata.managedFields`: (key, field manager) sorted, one
    /// pair per manager of a key (a key's managers are usually one; server-side apply can share it).
    /// Only declared pairs are kept: a declaration may leave out its own manager, whose ownership it knows.
    pub fn annotation_owners(&self) -> impl ExactSizeIterator<Item = (&str, &str)> + '_ {
        self.pair_list(PairList::AnnotationOwners)
            .map(|p| self.pair(&p))
    }

    /// The value of the label `key`, if it was declared and the Node has it.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.lookup(PairList::Labels, key)
    }

    /// The kept labels, sorted by key.
    pub fn labels(&self) -> impl ExactSizeIterator<Item = (&str, &str)> + '_ {
        self.pair_list(PairList::Labels).map(|p| self.pair(&p))
    }

    /// Binary search of a list sorted by key.
    fn lookup(&self, list: PairList, key: &str) -> Option<&str> {
        let (first, range) = self.tables.pair_range(list as usize);
        let (mut low, mut high) = (range.start, range.end);
        while low < high {
            let mid = low + (high - low) / 2;
            let p = self.tables.pair(first, mid);
            match self.str(p.key).cmp(key) {
                std::cmp::Ordering::Less => low = mid + 1,
                std::cmp::Ordering::Greater => high = mid,
                std::cmp::Ordering::Equal => return Some(self.str(p.value)),
            }
        }
        None
    }

    /// The condition of type `type_`, if it was declared and the Node reports it.
    pub fn condition(&self, type_: &str) -> Option<Condition<&str>> {
        self.conditions().find(|c| c.type_ == type_)
    }

    /// The kept conditions, in the Node's order.
    pub fn conditions(&self) -> impl ExactSizeIterator<Item = Condition<&str>> + '_ {
        self.tables.conditions().map(|c| c.map(|s| self.str(*s)))
    }

    /// `spec.taints` (if declared), in the Node's order.
    pub fn taints(&self) -> impl ExactSizeIterator<Item = Taint<&str>> + '_ {
        self.tables.taints().map(|t| t.map(|s| self.str(*s)))
    }

    /// The reference Events about this Node name: kind, version, name and uid, without a
    /// resourceVersion (an event about a Node is about every version of it).
    pub fn object_ref(&self) -> ObjectReference {
        ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(self.name().into()),
            uid: Some(self.uid().into()).filter(|u: &String| !u.is_empty()),
            ..ObjectReference::default()
        }
    }
}

/// Everything a `CachedNode` can hold, from a full Node (as read from the API, or built by a test).
impl From<&Node> for CachedNode {
    fn from(node: &Node) -> Self {
        let m = &node.metadata;
        let mut b = CachedNode::builder(
            m.name.as_deref().unwrap_or_default(),
            m.uid.as_deref().unwrap_or_default(),
            m.resource_version.as_deref().unwrap_or_default(),
        );
        b.deleting(m.deletion_timestamp.is_some());
        // `Some` even when empty: a trimmed Node keeps the map to say it had annotations.
        b.has_annotations(m.annotations.is_some());
        for (k, v) in m.annotations.iter().flatten() {
            b.annotation(k, v);
        }
        for entry in m.managed_fields.iter().flatten() {
            let manager = entry.manager.as_deref().unwrap_or_default();
            let fields = entry.fields_v1.as_ref().map(|f| &f.0);
            for key in fields.into_iter().flat_map(owned_annotation_keys) {
                b.annotation_owner(key, manager);
            }
        }
        for (k, v) in m.labels.iter().flatten() {
            b.label(k, v);
        }
        if let Some(spec) = &node.spec {
            b.pod_cidrs(
                spec.pod_cidrs.as_deref().unwrap_or_default(),
                spec.pod_cidr.as_deref(),
            );
            for t in spec.taints.iter().flatten() {
                b.taint(Taint {
                    key: &t.key,
                    value: t.value.as_deref(),
                    effect: &t.effect,
                });
            }
            b.unschedulable(spec.unschedulable.unwrap_or(false));
            if let Some(id) = &spec.provider_id {
                b.provider_id(id);
            }
        }
        if let Some(status) = &node.status {
            let pods = status.capacity.as_ref().and_then(|c| c.get("pods"));
            if let Some(pods) = pods {
                b.capacity_pods(&pods.0);
            }
            for a in status.addresses.iter().flatten() {
                b.address(Address {
                    type_: &a.type_,
                    address: &a.address,
                });
            }
            for c in status.conditions.iter().flatten() {
                b.condition(Condition {
                    type_: &c.type_,
                    status: &c.status,
                    reason: c.reason.as_deref(),
                    message: c.message.as_deref(),
                });
            }
        }
        b.build()
    }
}

/// The annotation keys a managed-fields entry owns: its `fieldsV1` under `f:metadata` → `f:annotations`,
/// each `f:<key>` member (the map's own `.` member is not a key).
pub fn owned_annotation_keys(
    fields_v1: &k8s_openapi::serde_json::Value,
) -> impl Iterator<Item = &str> {
    fields_v1
        .get("f:metadata")
        .and_then(|m| m.get("f:annotations"))
        .and_then(|a| a.as_object())
        .into_iter()
        .flat_map(|a| a.keys())
        .filter_map(|k| k.strip_prefix("f:"))
}

/// A pool's node selector reads the cached labels directly.
impl netcm_ipam::Labels for CachedNode {
    fn label(&self, key: &str) -> Option<&str> {
        CachedNode::label(self, key)
    }
}

/// Two cached Nodes are equal when every accessor says the same (their buffers may be laid out differently).
impl PartialEq for CachedNode {
    fn eq(&self, other: &Self) -> bool {
        self.name() == other.name()
            && self.uid() == other.uid()
            && self.resource_version() == other.resource_version()
            && self.is_deleting() == other.is_deleting()
            && self.has_annotations() == other.has_annotations()
            && self.unschedulable() == other.unschedulable()
            && self.provider_id() == other.provider_id()
            && self.capacity_pods() == other.capacity_pods()
            && self.pod_cidr_entries().eq(other.pod_cidr_entries())
            && self.addresses().eq(other.addresses())
            && self.annotations().eq(other.annotations())
            && self.annotation_owners().eq(other.annotation_owners())
            && self.labels().eq(other.labels())
            && self.conditions().eq(other.conditions())
            && self.taints().eq(other.taints())
    }
}

impl Eq for CachedNode {}

impl fmt::Debug for CachedNode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CachedNode")
            .field("name", &self.name())
            .field("uid", &self.uid())
            .field("resource_version", &self.resource_version())
            .field("deleting", &self.is_deleting())
            .field("has_annotations", &self.has_annotations())
            .field("unschedulable", &self.unschedulable())
            .field("provider_id", &self.provider_id())
            .field("capacity_pods", &self.capacity_pods())
            .field("pod_cidrs", &self.pod_cidr_entries().collect::<Vec<_>>())
            .field("addresses", &self.addresses().collect::<Vec<_>>())
            .field("annotations", &self.annotations().collect::<Vec<_>>())
            .field(
                "annotation_owners",
                &self.annotation_owners().collect::<Vec<_>>(),
            )
            .field("labels", &self.labels().collect::<Vec<_>>())
            .field("conditions", &self.conditions().collect::<Vec<_>>())
            .field("taints", &self.taints().collect::<Vec<_>>())
            .finish()
    }
}

#[cfg(test)]
mod tests;
