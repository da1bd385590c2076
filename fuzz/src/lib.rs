//! The fuzz targets' checks, one module of [`targets`] per target (each `fuzz_targets/<name>.rs` only
//! hands libFuzzer's input to its module), so that a stable `cargo test` replays the committed corpus
//! through the same code (`tests/corpus_replay.rs`). Beside them, what several targets check: that JSON
//! handed to the informer decodes as the informer decodes it, and caches what a full Node would have,
//! plus input shapes that make the fuzzer write addresses and CIDRs more often than random text would.

use std::net::IpAddr;

use arbitrary::{Arbitrary, Unstructured};
use k8s_openapi::api::core::v1::Node;
use netcm_manager::node_fields::{NodeFields, WireNode};
use netcm_node::{first_address, public_ip, CachedNode, Family, Unusable};
use serde_json::Value;

pub mod targets;

/// `data` decoded as libfuzzer-sys 0.4's `fuzz_target!` decodes a typed input, `None` where it skips
/// the input: fewer bytes than the type's least size, or bytes `arbitrary_take_rest` refuses. The
/// replay must skip the same inputs, or it would check values the fuzzer never ran.
pub fn arbitrary_input<'a, T: Arbitrary<'a>>(data: &'a [u8]) -> Option<T> {
    if data.len() < T::size_hint(0).0 {
        return None;
    }
    T::arbitrary_take_rest(Unstructured::new(data)).ok()
}

/// A declaration that keeps everything `node` has (every condition type it reports, every annotation
/// and label).
pub fn everything(node: &Node) -> NodeFields {
    let mut f = NodeFields::none()
        .pod_cidrs()
        .taints()
        .addresses()
        .capacity_pods()
        .annotations("")
        .labels("");
    f.unschedulable = true;
    f.provider_id = true;
    let conditions = node
        .status
        .iter()
        .flat_map(|s| s.conditions.iter().flatten());
    conditions.fold(f, |f, c| f.condition(&c.type_))
}

/// `json` is a Node as the informer reads it: it must decode as a [`WireNode`] (the informer's wire
/// type) and as a full `Node`, and both must cache the same [`CachedNode`]. Returns that Node.
pub fn check_informer_node(json: &[u8]) -> CachedNode {
    let wire: WireNode = serde_json::from_slice(json).unwrap_or_else(|e| {
        panic!(
            "the informer cannot decode {}: {e}",
            String::from_utf8_lossy(json)
        )
    });
    let mut full: Node = serde_json::from_slice(json)
        .unwrap_or_else(|e| panic!("not a Node: {}: {e}", String::from_utf8_lossy(json)));
    same_cache(wire, &mut full)
}

/// The Node the informer caches from `wire` equals the one a trimmed full Node gives; returns it.
pub fn same_cache(wire: WireNode, full: &mut Node) -> CachedNode {
    let fields = everything(full);
    let cached = fields.keep(wire);
    fields.trim(full);
    assert_eq!(
        cached,
        CachedNode::from(&*full),
        "wire and full decodings differ"
    );
    check_cached_node(&cached);
    cached
}

/// What holds of any cached Node: pod CIDRs parsed as [`netcm_node::parse_pod_cidr`] parses them, with
/// masks in range; annotations and labels sorted, each key once and found by lookup; public IPs by
/// [`check_public_ip`].
pub fn check_cached_node(node: &CachedNode) {
    for e in node.pod_cidr_entries() {
        assert_eq!(e.net, netcm_node::parse_pod_cidr(e.raw).ok(), "{:?}", e.raw);
        if let Some(net) = e.net {
            assert!(net.prefix_len() <= Family::of(&net).bits());
            assert!(net.trunc().contains(&net.addr()));
        }
    }
    let parsed = node.pod_cidrs();
    assert_eq!(parsed.len(), node.pod_cidr_entries().len());
    let keys: Vec<&str> = node.annotations().map(|(k, _)| k).collect();
    assert!(
        keys.windows(2).all(|w| w[0] < w[1]),
        "annotations sorted once each: {keys:?}"
    );
    for (k, v) in node.annotations() {
        assert_eq!(node.annotation(k), Some(v));
    }
    let keys: Vec<&str> = node.labels().map(|(k, _)| k).collect();
    assert!(
        keys.windows(2).all(|w| w[0] < w[1]),
        "labels sorted once each: {keys:?}"
    );
    for (k, v) in node.labels() {
        assert_eq!(node.label(k), Some(v));
    }
    let types: Vec<&str> = node.addresses().map(|a| a.type_).collect();
    for a in node.addresses() {
        check_public_ip(a.address);
    }
    for family in [Family::V4, Family::V6] {
        let want = types.iter().find_map(|t| {
            node.addresses()
                .filter(|a| a.type_ == *t)
                .find_map(|a| public_ip(a.address, family).ok())
        });
        assert_eq!(first_address(node, &types, family), want);
    }
}

/// [`public_ip`]: an address it accepts is of the family asked, none of the kinds it refuses, and
/// accepted again, unchanged, in its canonical text; text that is not an address is always refused as
/// such.
pub fn check_public_ip(raw: &str) {
    for family in [Family::V4, Family::V6] {
        match public_ip(raw, family) {
            Ok(ip) => {
                assert_eq!(Family::of(&ipnet::IpNet::from(ip)), family);
                assert!(!ip.is_unspecified() && !ip.is_loopback() && !ip.is_multicast());
                assert_eq!(public_ip(&ip.to_string(), family), Ok(ip), "{raw:?}");
            }
            Err(Unusable::NotAnAddress) => assert!(raw.parse::<IpAddr>().is_err(), "{raw:?}"),
            Err(_) => assert!(raw.parse::<IpAddr>().is_ok(), "{raw:?}"),
        }
    }
}

/// Whether kube's `Status` can hold these values at all: a status it names (or none) and a code that fits
/// its `u16`, as every status an API server sends does.
pub fn kube_reads_status(v: &Value) -> bool {
    matches!(
        v.get("status").map(Value::as_str),
        None | Some(Some("Success" | "Failure"))
    ) && v
        .get("code")
        .is_none_or(|c| c.as_u64().is_some_and(|c| c <= u64::from(u16::MAX)))
}

/// A transcoded Status is the API server's JSON of it: `status`, `message`, `reason` and `code` are
/// `omitempty` there, so an empty one is left out; kube decodes it whenever its type can hold the values.
pub fn check_status(v: &Value) {
    assert_eq!(
        (v["apiVersion"].as_str(), v["kind"].as_str()),
        (Some("v1"), Some("Status"))
    );
    for key in ["status", "message", "reason"] {
        if let Some(s) = v.get(key) {
            assert!(
                s.as_str().is_some_and(|s| !s.is_empty()),
                "{key} is omitempty in the API server's JSON, yet written empty: {v}"
            );
        }
    }
    if let Some(code) = v.get("code") {
        assert_ne!(
            code.as_i64(),
            Some(0),
            "code is omitempty in the API server's JSON: {v}"
        );
    }
    if kube_reads_status(v) {
        serde_json::from_value::<kube::core::Status>(v.clone())
            .unwrap_or_else(|e| panic!("kube cannot decode the Status {v}: {e}"));
    }
}

/// Text for an address: often a real one (either family, sometimes padded or with a zone), else any.
#[derive(Debug, Clone, Arbitrary)]
pub enum AddrText {
    /// A real address.
    Ip(IpAddr),
    /// An IPv4-mapped IPv6 address.
    Mapped(std::net::Ipv4Addr),
    /// A real address with something around it.
    Padded(IpAddr, String),
    /// Anything.
    Raw(String),
}

impl std::fmt::Display for AddrText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AddrText::Ip(ip) => write!(f, "{ip}"),
            AddrText::Mapped(v4) => write!(f, "::ffff:{v4}"),
            AddrText::Padded(ip, s) => write!(f, "{ip}{s}"),
            AddrText::Raw(s) => f.write_str(s),
        }
    }
}

/// Text for a CIDR: often `address/length` (lengths past the family's size too), else any.
#[derive(Debug, Clone, Arbitrary)]
pub enum CidrText {
    /// An address and a prefix length.
    Net(IpAddr, u8),
    /// An address and any suffix.
    Suffix(IpAddr, String),
    /// Anything.
    Raw(String),
}

impl std::fmt::Display for CidrText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CidrText::Net(ip, len) => write!(f, "{ip}/{len}"),
            CidrText::Suffix(ip, s) => write!(f, "{ip}/{s}"),
            CidrText::Raw(s) => f.write_str(s),
        }
    }
}
