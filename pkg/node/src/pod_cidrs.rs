//! A Node's pod CIDRs, read and parsed one way for every controller and `netcm check`.

use ipnet::IpNet;
use k8s_openapi::api::core::v1::Node;

use crate::Family;

/// What a Node says about its pod CIDRs, unparsed: `spec.podCIDRs`, else `spec.podCIDR` (as KCM and
/// flannel read them).
pub fn raw_pod_cidrs(node: &Node) -> Vec<String> {
    let spec = node.spec.as_ref();
    pick_pod_cidrs(
        spec.and_then(|s| s.pod_cidrs.as_deref())
            .unwrap_or_default(),
        spec.and_then(|s| s.pod_cidr.as_deref()),
    )
    .map(str::to_string)
    .collect()
}

/// The entries of `spec.podCIDRs` (`list`) if it has any, else `spec.podCIDR` (`single`) if it is set
/// and not empty: the one rule for full and cached Nodes.
pub fn pick_pod_cidrs<'a, S: AsRef<str>>(
    list: &'a [S],
    single: Option<&'a str>,
) -> impl Iterator<Item = &'a str> + 'a {
    let single = single.filter(|c| list.is_empty() && !c.is_empty());
    list.iter().map(AsRef::as_ref).chain(single)
}

/// A pod CIDR entry that is not a CIDR.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{raw:?} is not a CIDR")]
pub struct UnparsableCidr {
    /// The entry as the Node holds it.
    pub raw: String,
}

/// Parses one pod CIDR entry exactly as written (not trimmed: Go's `ParseCIDR`, which KCM and flannel
/// use, refuses padding too); host bits are kept, as the Node holds them.
pub fn parse_pod_cidr(raw: &str) -> Result<IpNet, UnparsableCidr> {
    raw.parse().map_err(|_| UnparsableCidr {
        raw: raw.to_string(),
    })
}

/// A Node's pod CIDRs, parsed: the CIDRs and the entries that are not CIDRs, each in the Node's order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodCidrs {
    /// The entries that parse, as written (host bits kept).
    pub cidrs: Vec<IpNet>,
    /// The entries that do not.
    pub unparsable: Vec<UnparsableCidr>,
}

impl PodCidrs {
    /// The pod CIDRs of `node` ([`raw_pod_cidrs`], parsed).
    pub fn of(node: &Node) -> Self {
        Self::parse(&raw_pod_cidrs(node))
    }

    /// Parses the entries `raw`.
    pub fn parse(raw: &[String]) -> Self {
        let mut out = Self::default();
        for s in raw {
            match parse_pod_cidr(s) {
                Ok(net) => out.cidrs.push(net),
                Err(e) => out.unparsable.push(e),
            }
        }
        out
    }

    /// How many entries the Node holds, parsable or not.
    pub fn len(&self) -> usize {
        self.cidrs.len() + self.unparsable.len()
    }

    /// Whether the Node holds no pod CIDR at all.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The parsed CIDRs reduced to their network address (host bits cleared), in order.
    pub fn networks(&self) -> impl Iterator<Item = IpNet> + '_ {
        self.cidrs.iter().map(IpNet::trunc)
    }

    /// The families of the parsed CIDRs, each once, IPv4 first.
    pub fn families(&self) -> Vec<Family> {
        let mut out: Vec<Family> = self.cidrs.iter().map(Family::of).collect();
        out.sort();
        out.dedup();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::NodeSpec;

    fn node(pod_cidr: Option<&str>, pod_cidrs: Option<Vec<&str>>) -> Node {
        Node {
            spec: Some(NodeSpec {
                pod_cidr: pod_cidr.map(str::to_string),
                pod_cidrs: pod_cidrs.map(|v| v.into_iter().map(str::to_string).collect()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn net(s: &str) -> IpNet {
        s.parse().expect("net")
    }

    #[test]
    fn pod_cidrs_come_from_the_list_and_fall_back_to_the_single_field() {
        assert_eq!(
            raw_pod_cidrs(&node(Some("10.0.0.0/24"), None)),
            ["10.0.0.0/24"]
        );
        assert_eq!(
            raw_pod_cidrs(&node(
                Some("10.0.0.0/24"),
                Some(vec!["10.0.0.0/24", "fd00::/64"])
            )),
            ["10.0.0.0/24", "fd00::/64"]
        );
        assert!(raw_pod_cidrs(&node(Some(""), Some(vec![]))).is_empty());
        assert!(raw_pod_cidrs(&Node::default()).is_empty());
        assert!(PodCidrs::of(&Node::default()).is_empty());
    }

    #[test]
    fn unparsable_pod_cidrs_are_separated_from_good_ones_in_the_nodes_order() {
        let p = PodCidrs::of(&node(
            None,
            Some(vec!["banana", "10.0.0.7/24", " fd00::/64", "fd00::/64"]),
        ));
        assert_eq!(p.cidrs, [net("10.0.0.7/24"), net("fd00::/64")]);
        assert_eq!(
            p.unparsable,
            [
                UnparsableCidr {
                    raw: "banana".into()
                },
                UnparsableCidr {
                    raw: " fd00::/64".into()
                }
            ]
        );
        assert_eq!(p.len(), 4);
        assert_eq!(
            p.unparsable[0].to_string(),
            "\"banana\" is not a CIDR",
            "the error quotes the entry"
        );
    }

    #[test]
    fn networks_clear_host_bits_and_families_come_once_ipv4_first() {
        let p = PodCidrs::parse(&[
            "fd00::1/64".into(),
            "10.0.0.7/24".into(),
            "fd01::/64".into(),
        ]);
        assert_eq!(
            p.networks().collect::<Vec<_>>(),
            [net("fd00::/64"), net("10.0.0.0/24"), net("fd01::/64")]
        );
        assert_eq!(p.families(), [Family::V4, Family::V6]);
    }
}
