//! flannel's lease annotations on a Node, as the node-annotation-syncer reads and plans them: whatever
//! the Node's pod CIDRs, addresses and current annotations (users' overwrites, old or broken lease
//! values), a plan writes only lease keys, only values that differ, only usable public IPs in
//! canonical form, nothing while it waits, and applying it reaches a fixed point: planning again for
//! the Node with the plan applied changes nothing.

use std::collections::BTreeMap;

use crate::{AddrText, CidrText};
use arbitrary::Arbitrary;
use netcm_node::{CachedNode, Family};
use netcm_node_annotation_syncer::subnet_lease::{plan, usable_ip};
use netcm_node_annotation_syncer::Flags;

#[derive(Debug, Arbitrary)]
enum Prefix {
    Default,
    Named(String),
}

#[derive(Debug, Arbitrary)]
enum Key {
    /// One of the keys netcm reads or writes (`Keys::all`, by index).
    Lease(u8),
    Other(String),
}

#[derive(Debug, Arbitrary)]
enum Value {
    Addr(AddrText),
    Text(String),
}

/// What libFuzzer's bytes decode to.
#[derive(Debug, Arbitrary)]
pub struct Input {
    prefix: Prefix,
    host_gw: bool,
    backend_type: String,
    address_types: Vec<String>,
    ip_types_first: bool,
    pod_cidrs: Vec<CidrText>,
    addresses: Vec<(bool, AddrText)>,
    current: Vec<(Key, Value)>,
}

/// The checks, on one decoded input.
pub fn run(input: Input) {
    let mut types: Vec<String> = input.address_types.clone();
    if input.ip_types_first {
        types.splice(0..0, ["InternalIP".to_string(), "ExternalIP".to_string()]);
    }
    let flags = Flags {
        annotation_prefix: match &input.prefix {
            Prefix::Default => None,
            Prefix::Named(p) => Some(p.clone()),
        },
        route_lease_annotation_prefix: None,
        backend_type: if input.host_gw {
            "host-gw".into()
        } else {
            input.backend_type.clone()
        },
        public_ip_address_types: types,
        concurrent_node_annotation_syncs: 1,
    };
    let Ok(cfg) = flags.config() else {
        return;
    };
    let keys: Vec<&str> = cfg.keys.all().collect();
    let cidrs: Vec<String> = input.pod_cidrs.iter().map(ToString::to_string).collect();
    let mut b = CachedNode::builder("n", "u", "1");
    b.pod_cidrs(&cidrs, None);
    for (internal, a) in &input.addresses {
        let address = a.to_string();
        b.address(netcm_node::Address {
            type_: if *internal {
                "InternalIP"
            } else {
                "ExternalIP"
            },
            address: &address,
        });
    }
    let mut current = BTreeMap::new();
    for (k, v) in &input.current {
        let k = match k {
            Key::Lease(i) => keys[usize::from(*i) % keys.len()].to_string(),
            Key::Other(s) => s.clone(),
        };
        let v = match v {
            Value::Addr(a) => a.to_string(),
            Value::Text(s) => s.clone(),
        };
        current.insert(k, v);
    }
    for (k, v) in &current {
        b.annotation(k, v);
    }
    let node = b.build();

    let p = plan(&cfg, &node, &current);
    if p.waiting.is_some() {
        assert!(p.changes.is_empty(), "waiting, yet writes {:?}", p.changes);
    }
    let lease = cfg.keys.lease();
    for (k, v) in &p.changes {
        assert!(lease.contains(&k.as_str()), "writes {k:?}, not a lease key");
        assert_ne!(current.get(k), Some(v), "rewrites {k:?} unchanged");
    }
    for family in [Family::V4, Family::V6] {
        if let Some(ip) = p.changes.get(cfg.keys.public_ip_of(family)) {
            assert_eq!(usable_ip(ip, family).as_ref(), Ok(ip), "published {ip:?}");
        }
    }
    for bad in &p.invalid {
        assert!(usable_ip(&bad.value, bad.family).is_err());
    }
    let mut applied = current.clone();
    applied.extend(p.changes.clone());
    let again = plan(&cfg, &node, &applied);
    if p.waiting.is_none() {
        assert_eq!(again.waiting, None);
        assert!(
            again.changes.is_empty(),
            "not a fixed point: then {:?}",
            again.changes
        );
        assert_eq!(
            applied
                .get(&cfg.keys.kube_subnet_manager)
                .map(String::as_str),
            Some("true")
        );
    } else {
        assert_eq!(again, p, "nothing was applied");
    }
}

/// The checks, on one input as libFuzzer hands it over: [`run`] on what it decodes to, decoded as
/// `fuzz_target!` decodes it ([`crate::arbitrary_input`]).
pub fn check(data: &[u8]) {
    if let Some(input) = crate::arbitrary_input(data) {
        run(input);
    }
}
