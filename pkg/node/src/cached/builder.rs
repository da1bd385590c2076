//! [`CachedNodeBuilder`]: copies each string into the Node's one buffer as it is given (a word every
//! Node repeats is interned instead), and lays the tables out once at [`CachedNodeBuilder::build`].

use super::interned::{self, INTERNED};
use super::layout::{flags, Parts as Layout, Tables};
use super::{span_str, Address, CachedNode, CidrEntry, Condition, Pair, Span, Taint};
use crate::pod_cidrs::{parse_pod_cidr, pick_pod_cidrs};

/// Builds a [`CachedNode`]; lists keep the order they are given in, except annotations and labels
/// (sorted by key; of a key given twice the last value counts, as in a JSON object).
#[derive(Debug)]
pub struct CachedNodeBuilder {
    text: String,
    node: Parts,
}

/// The node's fields while they are collected.
#[derive(Debug, Default)]
struct Parts {
    name: Span,
    uid: Span,
    resource_version: Span,
    provider_id: Option<Span>,
    deleting: bool,
    has_annotations: bool,
    unschedulable: bool,
    capacity_pods: u32,
    pod_cidrs: Vec<CidrEntry>,
    addresses: Vec<Address<Span>>,
    annotations: Vec<Pair>,
    annotation_owners: Vec<Pair>,
    labels: Vec<Pair>,
    conditions: Vec<Condition<Span>>,
    taints: Vec<Taint<Span>>,
}

impl CachedNodeBuilder {
    pub(super) fn new(name: &str, uid: &str, resource_version: &str) -> Self {
        let mut b = Self {
            text: String::with_capacity(name.len() + uid.len() + resource_version.len()),
            node: Parts::default(),
        };
        b.node.name = b.push(name);
        b.node.uid = b.push(uid);
        b.node.resource_version = b.push(resource_version);
        b
    }

    /// Reserves room for `more` bytes of strings still to come (saves the buffer's regrowth).
    pub fn reserve(&mut self, more: usize) -> &mut Self {
        self.text.reserve(more);
        self
    }

    /// Appends `s` to the buffer. An API server never serves a Node near 4 GiB (etcd's limit is
    /// 1.5 MiB); past that a string would read as empty rather than wrap.
    fn push(&mut self, s: &str) -> Span {
        let (Ok(start), Ok(len)) = (u32::try_from(self.text.len()), u32::try_from(s.len())) else {
            return Span::default();
        };
        if start.checked_add(len).is_none_or(|end| end >= INTERNED) {
            return Span::default();
        }
        self.text.push_str(s);
        Span { start, len }
    }

    /// A key (interned) and its value (the Node's own).
    fn pair(&mut self, key: &str, value: &str) -> Pair {
        Pair {
            key: self.push_shared(key),
            value: self.push(value),
        }
    }

    /// Marks `metadata.deletionTimestamp` as set (or not).
    pub fn deleting(&mut self, deleting: bool) -> &mut Self {
        self.node.deleting = deleting;
        self
    }

    /// Marks `metadata.annotations` as having entries (declared or not).
    pub fn has_annotations(&mut self, has: bool) -> &mut Self {
        self.node.has_annotations = has;
        self
    }

    /// `status.capacity.pods`, as its Quantity text: kept when a plain count (`"110"`), else dropped
    /// (and 0 reads as absent: no Node runs without pods, and either way it gets the default size).
    pub fn capacity_pods(&mut self, quantity: &str) -> &mut Self {
        self.node.capacity_pods = quantity.trim().parse().unwrap_or(0);
        self
    }

    /// `spec.unschedulable`.
    pub fn unschedulable(&mut self, unschedulable: bool) -> &mut Self {
        self.node.unschedulable = unschedulable;
        self
    }

    /// `spec.providerID`.
    pub fn provider_id(&mut self, id: &str) -> &mut Self {
        self.node.provider_id = Some(self.push(id));
        self
    }

    /// The pod CIDRs from `spec.podCIDRs` (`list`) and `spec.podCIDR` (`single`): the list if it has
    /// entries, else the single field if set and not empty; each entry parsed here, once.
    pub fn pod_cidrs<S: AsRef<str>>(&mut self, list: &[S], single: Option<&str>) -> &mut Self {
        self.node.pod_cidrs.clear();
        for raw in pick_pod_cidrs(list, single) {
            let entry = CidrEntry {
                raw: self.push(raw),
                net: parse_pod_cidr(raw).ok(),
            };
            self.node.pod_cidrs.push(entry);
        }
        self
    }

    /// Adds one of `status.addresses`; its type is interned.
    pub fn address(&mut self, address: Address<&str>) -> &mut Self {
        let a = Address {
            type_: self.push_shared(address.type_),
            address: self.push(address.address),
        };
        self.node.addresses.push(a);
        self
    }

    /// Appends `s` to the buffer unless it is interned (or can be now).
    fn push_shared(&mut self, s: &str) -> Span {
        interned::intern(s).unwrap_or_else(|| self.push(s))
    }

    /// Adds an annotation; its key is interned.
    pub fn annotation(&mut self, key: &str, value: &str) -> &mut Self {
        let p = self.pair(key, value);
        self.node.annotations.push(p);
        self
    }

    /// Adds that field manager `manager` owns the annotation `key`. Both are interned; past the table's
    /// room they are stored once per Node: the key as its annotation's when that was added before, a
    /// manager as its first mention.
    pub fn annotation_owner(&mut self, key: &str, manager: &str) -> &mut Self {
        let text = &self.text;
        let same = |span: &Span, s: &str| span_str(text, *span) == s;
        let key_span = self
            .node
            .annotations
            .iter()
            .map(|p| p.key)
            .find(|k| same(k, key));
        let manager_span = self
            .node
            .annotation_owners
            .iter()
            .map(|p| p.value)
            .find(|m| same(m, manager));
        let key = key_span.unwrap_or_else(|| self.push_shared(key));
        let value = manager_span.unwrap_or_else(|| self.push_shared(manager));
        self.node.annotation_owners.push(Pair { key, value });
        self
    }

    /// Adds a label; its key is interned.
    pub fn label(&mut self, key: &str, value: &str) -> &mut Self {
        let p = self.pair(key, value);
        self.node.labels.push(p);
        self
    }

    /// Adds one of `status.conditions`; its type, status and reason are interned, not its message.
    pub fn condition(&mut self, condition: Condition<&str>) -> &mut Self {
        let c = Condition {
            type_: self.push_shared(condition.type_),
            status: self.push_shared(condition.status),
            reason: condition.reason.map(|r| self.push_shared(r)),
            message: condition.message.map(|m| self.push(m)),
        };
        self.node.conditions.push(c);
        self
    }

    /// Adds one of `spec.taints`; its key and effect are interned.
    pub fn taint(&mut self, taint: Taint<&str>) -> &mut Self {
        let t = Taint {
            key: self.push_shared(taint.key),
            value: taint.value.map(|v| self.push(v)),
            effect: self.push_shared(taint.effect),
        };
        self.node.taints.push(t);
        self
    }

    /// The cached Node.
    pub fn build(self) -> CachedNode {
        let Self { text, node } = self;
        let text = text.into_boxed_str();
        let has_annotations = node.has_annotations || !node.annotations.is_empty();
        let annotations = sorted(&text, node.annotations);
        let mut annotation_owners = node.annotation_owners;
        annotation_owners.sort_by(|a, b| {
            let pair = |p: &Pair| (span_str(&text, p.key), span_str(&text, p.value));
            pair(a).cmp(&pair(b))
        });
        annotation_owners.dedup_by(|a, b| {
            span_str(&text, a.key) == span_str(&text, b.key)
                && span_str(&text, a.value) == span_str(&text, b.value)
        });
        let labels = sorted(&text, node.labels);
        let mut pairs = Vec::with_capacity(
            node.addresses.len() + annotations.len() + annotation_owners.len() + labels.len(),
        );
        let end = |pairs: &Vec<Pair>| u32::try_from(pairs.len()).unwrap_or(u32::MAX);
        pairs.extend(node.addresses.iter().map(|a| Pair {
            key: a.type_,
            value: a.address,
        }));
        let addresses_end = end(&pairs);
        pairs.extend(annotations);
        let annotations_end = end(&pairs);
        pairs.extend(annotation_owners);
        let ends = [addresses_end, annotations_end, end(&pairs)];
        pairs.extend(labels);
        let set = |on: bool, flag: u32| if on { flag } else { 0 };
        let tables = Tables::encode(&Layout {
            flags: set(node.deleting, flags::DELETING)
                | set(has_annotations, flags::HAS_ANNOTATIONS)
                | set(node.unschedulable, flags::UNSCHEDULABLE),
            // The buffer starts with these three, pushed first by `new`.
            lens: [node.name.len, node.uid.len, node.resource_version.len],
            provider_id: node.provider_id,
            capacity_pods: node.capacity_pods,
            pod_cidrs: &node.pod_cidrs,
            pairs: &pairs,
            ends,
            conditions: &node.conditions,
            taints: &node.taints,
        });
        CachedNode { text, tables }
    }
}

/// The pairs sorted by key, the last of a repeated key kept (as a JSON object decodes).
fn sorted(text: &str, mut pairs: Vec<Pair>) -> Vec<Pair> {
    let key = |p: &Pair| span_str(text, p.key);
    // Reversed first, so the stable sort puts a repeated key's last value first and dedup keeps it.
    pairs.reverse();
    pairs.sort_by(|a, b| key(a).cmp(key(b)));
    pairs.dedup_by(|later, first| key(later) == key(first));
    pairs
}
