//! A `k8s.io/api/core/v1.Node` read from protobuf: only the fields netcm's informer decodes, each a
//! slice of the input, then written as the API server's JSON of those fields.
//!
//! Field numbers are those of `k8s.io/api/core/v1/generated.proto` and
//! `k8s.io/apimachinery/pkg/apis/meta/v1/generated.proto`; they never change once released.

use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;

use serde::de::{IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, Deserializer};

use crate::entries::{Address, Condition, Taint};
use crate::json::{self, Object};
use crate::wire;
use crate::ProtobufError;

/// A field manager and the annotation keys it owns (its `fieldsV1` under `f:metadata` → `f:annotations`).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct AnnotationOwner<'a> {
    /// `manager`.
    pub manager: &'a str,
    /// The owned keys, without their `f:`.
    pub keys: Vec<Cow<'a, str>>,
}

/// The fields of a Node the informer decodes, borrowed from the protobuf they were read from.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct NodeView<'a> {
    /// `metadata.name`.
    pub name: &'a str,
    /// `metadata.uid`.
    pub uid: &'a str,
    /// `metadata.resourceVersion`.
    pub resource_version: &'a str,
    /// `metadata.deletionTimestamp`, in seconds since the epoch.
    pub deletion_seconds: Option<i64>,
    /// `metadata.labels`, in the order sent.
    pub labels: Vec<(&'a str, &'a str)>,
    /// `metadata.annotations`, in the order sent.
    pub annotations: Vec<(&'a str, &'a str)>,
    /// Of `metadata.managedFields`, the entries that own annotations: their manager and those keys.
    pub annotation_owners: Vec<AnnotationOwner<'a>>,
    /// `spec.podCIDR`.
    pub pod_cidr: &'a str,
    /// `spec.podCIDRs`.
    pub pod_cidrs: Vec<&'a str>,
    /// `spec.providerID`.
    pub provider_id: &'a str,
    /// `spec.unschedulable`.
    pub unschedulable: bool,
    /// `spec.taints`.
    pub taints: Vec<Taint<&'a str>>,
    /// `status.capacity["pods"]`, the Quantity's text (the other resources are skipped).
    pub capacity_pods: Option<&'a str>,
    /// `status.addresses`.
    pub addresses: Vec<Address<&'a str>>,
    /// `status.conditions`.
    pub conditions: Vec<Condition<&'a str>>,
}

/// Reads a Node's protobuf (the object itself, without the `k8s\0` envelope).
pub fn read_node(raw: &[u8]) -> Result<NodeView<'_>, ProtobufError> {
    let mut node = NodeView::default();
    for field in wire::fields(raw) {
        match field? {
            (1, v) => read_meta(&mut node, v.bytes("Node", 1)?)?,
            (2, v) => read_spec(&mut node, v.bytes("Node", 2)?)?,
            (3, v) => read_status(&mut node, v.bytes("Node", 3)?)?,
            _ => {}
        }
    }
    Ok(node)
}

fn read_meta<'a>(node: &mut NodeView<'a>, raw: &'a [u8]) -> Result<(), ProtobufError> {
    const M: &str = "ObjectMeta";
    for field in wire::fields(raw) {
        match field? {
            (1, v) => node.name = v.str(M, 1)?,
            (5, v) => node.uid = v.str(M, 5)?,
            (6, v) => node.resource_version = v.str(M, 6)?,
            (9, v) => node.deletion_seconds = Some(read_time_seconds(v.bytes(M, 9)?)?),
            (11, v) => node.labels.push(read_map_entry(v.bytes(M, 11)?)?),
            (12, v) => node.annotations.push(read_map_entry(v.bytes(M, 12)?)?),
            (17, v) => {
                let owner = read_managed_fields_entry(v.bytes(M, 17)?)?;
                if !owner.keys.is_empty() {
                    node.annotation_owners.push(owner);
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// A `ManagedFieldsEntry`: manager = 1, fieldsV1 = 7 (a `FieldsV1`, whose Raw = 1 is the field set's JSON).
fn read_managed_fields_entry(raw: &[u8]) -> Result<AnnotationOwner<'_>, ProtobufError> {
    const M: &str = "ManagedFieldsEntry";
    let mut owner = AnnotationOwner::default();
    for field in wire::fields(raw) {
        match field? {
            (1, v) => owner.manager = v.str(M, 1)?,
            (7, v) => {
                for field in wire::fields(v.bytes(M, 7)?) {
                    if let (1, v) = field? {
                        owner.keys = annotation_keys(v.bytes("FieldsV1", 1)?)?;
                    }
                }
            }
            _ => {}
        }
    }
    Ok(owner)
}

/// The annotation keys a field set's JSON owns. A set that never names `f:annotations` (a kubelet's
/// status, an allocator's pod CIDR) is not parsed at all.
fn annotation_keys(fields: &[u8]) -> Result<Vec<Cow<'_, str>>, ProtobufError> {
    const NEEDLE: &[u8] = b"\"f:annotations\"";
    if !fields.windows(NEEDLE.len()).any(|w| w == NEEDLE) {
        return Ok(Vec::new());
    }
    let set: FieldSet<'_> =
        serde_json::from_slice(fields).map_err(|e| ProtobufError::FieldSet(e.to_string()))?;
    Ok(set
        .metadata
        .and_then(|m| m.annotations)
        .map(|a| a.0)
        .unwrap_or_default())
}

/// A field set (`fieldsV1`), read for the keys of `f:metadata` → `f:annotations` only.
#[derive(Deserialize)]
struct FieldSet<'a> {
    #[serde(rename = "f:metadata", borrow)]
    metadata: Option<FieldSetMeta<'a>>,
}

#[derive(Deserialize)]
struct FieldSetMeta<'a> {
    #[serde(rename = "f:annotations", borrow)]
    annotations: Option<FieldKeys<'a>>,
}

/// The `f:<key>` members of a field set's map, without `f:` (the map's own `.` member is not a key).
struct FieldKeys<'a>(Vec<Cow<'a, str>>);

impl<'de: 'a, 'a> Deserialize<'de> for FieldKeys<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct KeysVisitor<'a>(PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for KeysVisitor<'a> {
            type Value = FieldKeys<'a>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a field set")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<FieldKeys<'a>, A::Error> {
                let mut keys = Vec::new();
                while let Some(Member(member)) = map.next_key()? {
                    map.next_value::<IgnoredAny>()?;
                    let key = match member {
                        Cow::Borrowed(m) => m.strip_prefix("f:").map(Cow::Borrowed),
                        Cow::Owned(m) => m.strip_prefix("f:").map(|k| Cow::Owned(k.to_string())),
                    };
                    keys.extend(key);
                }
                Ok(FieldKeys(keys))
            }
        }
        d.deserialize_map(KeysVisitor(PhantomData))
    }
}

/// A member name, borrowed from the input unless it had to be unescaped (serde's own `Cow` never borrows).
struct Member<'a>(Cow<'a, str>);

impl<'de: 'a, 'a> Deserialize<'de> for Member<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct MemberVisitor<'a>(PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for MemberVisitor<'a> {
            type Value = Member<'a>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a member name")
            }
            fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Member<'a>, E> {
                Ok(Member(Cow::Borrowed(s)))
            }
            fn visit_str<E>(self, s: &str) -> Result<Member<'a>, E> {
                Ok(Member(Cow::Owned(s.to_string())))
            }
        }
        d.deserialize_str(MemberVisitor(PhantomData))
    }
}

/// A `metav1.Time`: seconds = 1, nanos = 2 (JSON carries whole seconds only).
fn read_time_seconds(raw: &[u8]) -> Result<i64, ProtobufError> {
    let mut seconds = 0;
    for field in wire::fields(raw) {
        if let (1, v) = field? {
            // int64 is sent as its two's complement in a varint.
            seconds = v.varint("Time", 1)? as i64;
        }
    }
    Ok(seconds)
}

/// One entry of a `map<string, string>`: key = 1, value = 2.
fn read_map_entry(raw: &[u8]) -> Result<(&str, &str), ProtobufError> {
    let (mut key, mut value) = ("", "");
    for field in wire::fields(raw) {
        match field? {
            (1, v) => key = v.str("map entry", 1)?,
            (2, v) => value = v.str("map entry", 2)?,
            _ => {}
        }
    }
    Ok((key, value))
}

fn read_spec<'a>(node: &mut NodeView<'a>, raw: &'a [u8]) -> Result<(), ProtobufError> {
    const M: &str = "NodeSpec";
    for field in wire::fields(raw) {
        match field? {
            (1, v) => node.pod_cidr = v.str(M, 1)?,
            (3, v) => node.provider_id = v.str(M, 3)?,
            (4, v) => node.unschedulable = v.varint(M, 4)? != 0,
            (5, v) => node.taints.push(read_taint(v.bytes(M, 5)?)?),
            (7, v) => node.pod_cidrs.push(v.str(M, 7)?),
            _ => {}
        }
    }
    Ok(())
}

fn read_taint(raw: &[u8]) -> Result<Taint<&str>, ProtobufError> {
    let mut taint = Taint::default();
    for field in wire::fields(raw) {
        match field? {
            (1, v) => taint.key = v.str("Taint", 1)?,
            (2, v) => taint.value = Some(v.str("Taint", 2)?),
            (3, v) => taint.effect = v.str("Taint", 3)?,
            _ => {}
        }
    }
    Ok(taint)
}

fn read_status<'a>(node: &mut NodeView<'a>, raw: &'a [u8]) -> Result<(), ProtobufError> {
    const M: &str = "NodeStatus";
    for field in wire::fields(raw) {
        match field? {
            (1, v) => {
                if let ("pods", quantity) = read_quantity_entry(v.bytes(M, 1)?)? {
                    node.capacity_pods = Some(quantity);
                }
            }
            (4, v) => node.conditions.push(read_condition(v.bytes(M, 4)?)?),
            (5, v) => node.addresses.push(read_address(v.bytes(M, 5)?)?),
            _ => {}
        }
    }
    Ok(())
}

/// One entry of a `map<string, Quantity>` (a ResourceList): key = 1, value = 2, a `Quantity` whose
/// string = 1 is its text.
fn read_quantity_entry(raw: &[u8]) -> Result<(&str, &str), ProtobufError> {
    let (mut key, mut quantity) = ("", "");
    for field in wire::fields(raw) {
        match field? {
            (1, v) => key = v.str("ResourceList entry", 1)?,
            (2, v) => {
                for field in wire::fields(v.bytes("ResourceList entry", 2)?) {
                    if let (1, v) = field? {
                        quantity = v.str("Quantity", 1)?;
                    }
                }
            }
            _ => {}
        }
    }
    Ok((key, quantity))
}

fn read_condition(raw: &[u8]) -> Result<Condition<&str>, ProtobufError> {
    const M: &str = "NodeCondition";
    let mut c = Condition::default();
    for field in wire::fields(raw) {
        match field? {
            (1, v) => c.type_ = v.str(M, 1)?,
            (2, v) => c.status = v.str(M, 2)?,
            (5, v) => c.reason = Some(v.str(M, 5)?),
            (6, v) => c.message = Some(v.str(M, 6)?),
            _ => {}
        }
    }
    Ok(c)
}

fn read_address(raw: &[u8]) -> Result<Address<&str>, ProtobufError> {
    let mut a = Address::default();
    for field in wire::fields(raw) {
        match field? {
            (1, v) => a.type_ = v.str("NodeAddress", 1)?,
            (2, v) => a.address = v.str("NodeAddress", 2)?,
            _ => {}
        }
    }
    Ok(a)
}

impl NodeView<'_> {
    /// Appends the Node as the API server would write these fields in JSON: `omitempty` strings, lists
    /// and `false` left out, required ones (a taint's key and effect, an address, a condition's type
    /// and status) always written.
    pub fn write_json(&self, out: &mut Vec<u8>) -> Result<(), ProtobufError> {
        // Everything that can fail comes before the first byte is written.
        let deletion = match self.deletion_seconds {
            Some(seconds) => Some(
                jiff::Timestamp::from_second(seconds)
                    .map_err(|_| ProtobufError::Timestamp(seconds))?
                    .to_string(),
            ),
            None => None,
        };
        let mut node = Object::open(out);
        node.str("apiVersion", "v1");
        node.str("kind", "Node");
        let mut meta = Object::open(node.key("metadata"));
        meta.str_nonempty("name", self.name);
        meta.str_nonempty("uid", self.uid);
        meta.str_nonempty("resourceVersion", self.resource_version);
        if let Some(at) = &deletion {
            meta.str("deletionTimestamp", at);
        }
        if !self.labels.is_empty() {
            meta.map("labels", &self.labels);
        }
        if !self.annotations.is_empty() {
            meta.map("annotations", &self.annotations);
        }
        if !self.annotation_owners.is_empty() {
            // Only what the wire type reads of each entry: its manager and its annotation keys.
            meta.array("managedFields", &self.annotation_owners, |out, owner| {
                let mut entry = Object::open(out);
                entry.str("manager", owner.manager);
                let mut set = Object::open(entry.key("fieldsV1"));
                let mut metadata = Object::open(set.key("f:metadata"));
                let mut annotations = Object::open(metadata.key("f:annotations"));
                for key in &owner.keys {
                    annotations
                        .key(&format!("f:{key}"))
                        .extend_from_slice(b"{}");
                }
                annotations.close();
                metadata.close();
                set.close();
                entry.close();
            });
        }
        meta.close();
        let mut spec = Object::open(node.key("spec"));
        spec.str_nonempty("podCIDR", self.pod_cidr);
        if !self.pod_cidrs.is_empty() {
            spec.array("podCIDRs", &self.pod_cidrs, |out, s| json::string(out, s));
        }
        spec.str_nonempty("providerID", self.provider_id);
        if self.unschedulable {
            spec.key("unschedulable").extend_from_slice(b"true");
        }
        if !self.taints.is_empty() {
            spec.array("taints", &self.taints, |out, t| {
                let mut o = Object::open(out);
                o.str("key", t.key);
                o.str_nonempty("value", t.value.unwrap_or_default());
                o.str("effect", t.effect);
                o.close();
            });
        }
        spec.close();
        let mut status = Object::open(node.key("status"));
        if let Some(pods) = self.capacity_pods {
            let mut capacity = Object::open(status.key("capacity"));
            capacity.str("pods", pods);
            capacity.close();
        }
        if !self.addresses.is_empty() {
            status.array("addresses", &self.addresses, |out, a| {
                let mut o = Object::open(out);
                o.str("type", a.type_);
                o.str("address", a.address);
                o.close();
            });
        }
        if !self.conditions.is_empty() {
            status.array("conditions", &self.conditions, |out, c| {
                let mut o = Object::open(out);
                o.str("type", c.type_);
                o.str("status", c.status);
                o.str_nonempty("reason", c.reason.unwrap_or_default());
                o.str_nonempty("message", c.message.unwrap_or_default());
                o.close();
            });
        }
        status.close();
        node.close();
        Ok(())
    }
}

#[cfg(test)]
mod tests;
