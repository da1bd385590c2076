//! The entries of a Node's lists that netcm reads — `status.addresses`, `status.conditions`,
//! `spec.taints` — each defined once for every form a Node takes in netcm, by how its text is held:
//! `&str` borrowed from protobuf ([`NodeView`](crate::node::NodeView)) or from a cached Node's
//! accessors, `String` decoded from JSON (the informer's `WireNode`), a span of one buffer (the cached
//! Node's own storage). [`Address::map`] and its siblings turn one form into another, so a sub-field is
//! named here and in the protobuf reader and JSON writer beside [`NodeView`](crate::node::NodeView), and
//! nowhere else.
//!
//! Each derives `Deserialize` with the API's JSON names: `Taint<String>` is how the informer decodes a
//! taint. A field that is `Option` here is `omitempty` in the API (absent, `null` and `""` are
//! equivalent to the API server, which never sends `""`); the others are required.

use serde::Deserialize;

/// One of `status.addresses`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
pub struct Address<S> {
    /// `type` (`InternalIP`, `ExternalIP`, `Hostname`, …).
    #[serde(rename = "type")]
    pub type_: S,
    /// `address`, as written.
    pub address: S,
}

impl<S> Address<S> {
    /// The same entry with each string turned into another form by `f`, in the order of the fields.
    pub fn map<'s, T>(&'s self, mut f: impl FnMut(&'s S) -> T) -> Address<T> {
        Address {
            type_: f(&self.type_),
            address: f(&self.address),
        }
    }
}

/// One of `status.conditions` (the times are not kept: no reader decides by them).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
pub struct Condition<S> {
    /// `type`.
    #[serde(rename = "type")]
    pub type_: S,
    /// `status`: `True`, `False` or `Unknown`.
    pub status: S,
    /// `reason`.
    pub reason: Option<S>,
    /// `message`.
    pub message: Option<S>,
}

impl<S> Condition<S> {
    /// The same entry with each string turned into another form by `f`, in the order of the fields.
    pub fn map<'s, T>(&'s self, mut f: impl FnMut(&'s S) -> T) -> Condition<T> {
        Condition {
            type_: f(&self.type_),
            status: f(&self.status),
            reason: self.reason.as_ref().map(&mut f),
            message: self.message.as_ref().map(&mut f),
        }
    }
}

/// One of `spec.taints` (`timeAdded` is not kept).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
pub struct Taint<S> {
    /// `key`.
    pub key: S,
    /// `value`.
    pub value: Option<S>,
    /// `effect`.
    pub effect: S,
}

impl<S> Taint<S> {
    /// The same entry with each string turned into another form by `f`, in the order of the fields.
    pub fn map<'s, T>(&'s self, mut f: impl FnMut(&'s S) -> T) -> Taint<T> {
        Taint {
            key: f(&self.key),
            value: self.value.as_ref().map(&mut f),
            effect: f(&self.effect),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn map_visits_the_fields_in_order_and_keeps_absent_ones_absent() {
        let t = Taint {
            key: "k",
            value: None,
            effect: "NoSchedule",
        };
        let mut seen = Vec::new();
        let lens = t.map(|s| {
            seen.push(*s);
            s.len()
        });
        assert_eq!(
            lens,
            Taint {
                key: 1,
                value: None,
                effect: 10
            }
        );
        assert_eq!(seen, ["k", "NoSchedule"]);
    }

    #[test]
    fn the_json_decoding_requires_what_the_api_requires() {
        let c: Condition<String> =
            serde_json::from_str(r#"{"type":"Ready","status":"True","lastHeartbeatTime":"x"}"#)
                .expect("a condition");
        assert_eq!((c.reason, c.message), (None, None));
        let t: Taint<String> =
            serde_json::from_str(r#"{"key":"k","value":null,"effect":"NoSchedule"}"#)
                .expect("a taint");
        assert_eq!(t.value, None);
        assert!(serde_json::from_str::<Taint<String>>(r#"{"key":"k"}"#).is_err());
        assert!(serde_json::from_str::<Address<String>>(r#"{"type":"Hostname"}"#).is_err());
    }
}
