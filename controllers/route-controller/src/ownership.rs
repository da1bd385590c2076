//! What is netcm's to route and to delete, as the cloud route controller's `isResponsibleForRoute`
//! decides it, and which pod CIDRs must never get a route at all.
//!
//! netcm is responsible for a route when its destination lies entirely inside a cluster CIDR: one of
//! `--cluster-cidr`'s, or a range of a ClusterCIDR object (a pool the allocator gives CIDRs from, which
//! may lie outside the flag's ranges — a range a cluster is moving to). Upstream asks only that the
//! first or the last address lies inside; the whole destination is the stricter form of the same rule,
//! so a route that merely straddles a cluster CIDR stays someone else's. A pod CIDR
//! gets no route when it is default-like, lies outside the cluster CIDRs, or covers or overlaps a network
//! this host is directly connected to: each of those routes would capture traffic that is not pod
//! traffic. An IPv4-mapped IPv6 pod CIDR (inside `::ffff:0:0/96`) gets none either: Go's `net.ParseCIDR`,
//! which the kubelet, CNI plugins and flannel use, reads `::ffff:10.244.0.0/120` as the IPv4 network
//! `10.244.0.0/24`, so such a pod CIDR is another Node's IPv4 range in disguise, and no real IPv6 pod
//! network. Pure apart from the set of connected networks, which the caller refreshes.

use parking_lot::RwLock;
use std::fmt;

use ipnet::IpNet;

/// A destination this short covers half the address space or more: the default route or one of the two
/// halves VPNs use to override it.
const DEFAULT_LIKE_MAX_PREFIX: u8 = 1;

/// Whether `net` is `/0` or `/1`.
pub fn is_default_like(net: &IpNet) -> bool {
    net.prefix_len() <= DEFAULT_LIKE_MAX_PREFIX
}

/// Where IPv6 keeps the IPv4 addresses: `::ffff:0:0/96`.
const IPV4_MAPPED: ipnet::Ipv6Net =
    ipnet::Ipv6Net::new_assert(std::net::Ipv6Addr::new(0, 0, 0, 0, 0, 0xffff, 0, 0), 96);

/// Whether `net` lies inside the IPv4-mapped IPv6 addresses.
pub fn is_ipv4_mapped(net: &IpNet) -> bool {
    matches!(net, IpNet::V6(v6) if IPV4_MAPPED.contains(v6))
}

/// Whether two networks share an address (of the same family).
fn overlap(a: &IpNet, b: &IpNet) -> bool {
    a.contains(b) || b.contains(a)
}

/// Why a pod CIDR gets no route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// `/0` or `/1`.
    DefaultLike(IpNet),
    /// Inside `::ffff:0:0/96`: an IPv4 network written as IPv6.
    Ipv4Mapped(IpNet),
    /// Not inside any `--cluster-cidr` nor any ClusterCIDR object's range.
    OutsideClusterCidrs {
        /// The pod CIDR.
        pod_cidr: IpNet,
        /// The cluster CIDRs, as configured.
        cluster_cidrs: Vec<IpNet>,
        /// The ranges of the ClusterCIDR objects, as last read.
        pool_ranges: Vec<IpNet>,
    },
    /// Covers or overlaps a network of one of this host's addresses.
    Connected {
        /// The pod CIDR.
        pod_cidr: IpNet,
        /// The host's network.
        network: IpNet,
    },
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::DefaultLike(net) => write!(
                f,
                "pod CIDR {net} is default-like (/{}): a route to it would take over the host's default route",
                net.prefix_len()
            ),
            Self::Ipv4Mapped(net) => write!(
                f,
                "pod CIDR {net} is IPv4-mapped: Go programs read it as an IPv4 network, so it is no IPv6 pod network"
            ),
            Self::OutsideClusterCidrs {
                pod_cidr,
                cluster_cidrs,
                pool_ranges,
            } => {
                let list = |nets: &[IpNet]| -> String {
                    let names: Vec<String> = nets.iter().map(ToString::to_string).collect();
                    if names.is_empty() {
                        "none".to_string()
                    } else {
                        names.join(", ")
                    }
                };
                write!(
                    f,
                    "pod CIDR {pod_cidr} is outside every --cluster-cidr ({}) and every ClusterCIDR object's range ({}): netcm routes only pod CIDRs inside them",
                    list(cluster_cidrs),
                    list(pool_ranges)
                )
            }
            Self::Connected { pod_cidr, network } => write!(
                f,
                "pod CIDR {pod_cidr} overlaps {network}, a network this host is directly connected to: a route to it would capture the host's own traffic"
            ),
        }
    }
}

impl Refusal {
    /// Whether the refusal depends on this host (its connected networks), so that other hosts may
    /// route the pod CIDR. Such a pod CIDR still counts as its Node's when pod CIDRs overlap: every
    /// host must tell the same Node it is the later one.
    pub fn is_this_hosts(&self) -> bool {
        matches!(self, Self::Connected { .. })
    }
}

/// Replaces `current` with `networks` as a sorted set; true when that changed it.
fn replace_set(current: &RwLock<Vec<IpNet>>, mut networks: Vec<IpNet>) -> bool {
    networks.sort();
    networks.dedup();
    let mut current = current.write();
    if *current == networks {
        return false;
    }
    *current = networks;
    true
}

/// The cluster CIDRs (the flag's, fixed; the ClusterCIDR objects', refreshed from their watch) and this
/// host's connected networks (refreshed by the caller).
#[derive(Debug, Default)]
pub struct Ownership {
    cluster_cidrs: Vec<IpNet>,
    pool_ranges: RwLock<Vec<IpNet>>,
    connected: RwLock<Vec<IpNet>>,
}

impl Ownership {
    /// The rules for these cluster CIDRs; with none, every destination that is not default-like counts
    /// as netcm's (node mode without `--cluster-cidr`).
    pub fn new(cluster_cidrs: Vec<IpNet>) -> Self {
        Self {
            cluster_cidrs,
            pool_ranges: RwLock::new(Vec::new()),
            connected: RwLock::new(Vec::new()),
        }
    }

    /// The cluster CIDRs.
    pub fn cluster_cidrs(&self) -> &[IpNet] {
        &self.cluster_cidrs
    }

    /// Replaces the ClusterCIDR objects' ranges; true when they changed. A default-like range is left
    /// out: it would make every route of netcm's protocol in the table netcm's, whatever a pool says.
    pub fn set_pool_ranges(&self, mut ranges: Vec<IpNet>) -> bool {
        ranges.retain(|r| !is_default_like(r));
        replace_set(&self.pool_ranges, ranges)
    }

    /// Replaces the host's connected networks; true when they changed.
    pub fn set_connected(&self, networks: Vec<IpNet>) -> bool {
        replace_set(&self.connected, networks)
    }

    /// Whether a route to `destination` is netcm's to create or delete.
    pub fn is_responsible(&self, destination: &IpNet) -> bool {
        !is_default_like(destination)
            && (self.cluster_cidrs.is_empty()
                || self.cluster_cidrs.iter().any(|c| c.contains(destination))
                || self
                    .pool_ranges
                    .read()
                    .iter()
                    .any(|c| c.contains(destination)))
    }

    /// Why `pod_cidr` must get no route, if it must not.
    pub fn refusal(&self, pod_cidr: &IpNet) -> Option<Refusal> {
        if is_default_like(pod_cidr) {
            return Some(Refusal::DefaultLike(*pod_cidr));
        }
        if is_ipv4_mapped(pod_cidr) {
            return Some(Refusal::Ipv4Mapped(*pod_cidr));
        }
        if !self.is_responsible(pod_cidr) {
            return Some(Refusal::OutsideClusterCidrs {
                pod_cidr: *pod_cidr,
                cluster_cidrs: self.cluster_cidrs.clone(),
                pool_ranges: self.pool_ranges.read().clone(),
            });
        }
        let connected = self.connected.read();
        connected
            .iter()
            .find(|n| overlap(n, pod_cidr))
            .map(|network| Refusal::Connected {
                pod_cidr: *pod_cidr,
                network: *network,
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> IpNet {
        s.parse().expect("net")
    }

    fn rules() -> Ownership {
        let o = Ownership::new(vec![net("10.0.0.0/8"), net("fd00::/8")]);
        o.set_connected(vec![
            net("192.0.2.0/24"),
            net("10.99.0.0/16"),
            net("fd00:9::/64"),
        ]);
        o
    }

    #[test]
    fn only_destinations_wholly_inside_a_cluster_cidr_are_netcms() {
        let o = rules();
        assert!(o.is_responsible(&net("10.244.1.0/24")));
        assert!(o.is_responsible(&net("fd00:10:244::/64")));
        assert!(!o.is_responsible(&net("0.0.0.0/0")));
        assert!(!o.is_responsible(&net("172.16.0.0/24")));
        // Straddling a cluster CIDR is not lying inside it.
        assert!(!o.is_responsible(&net("10.0.0.0/7")));
    }

    #[test]
    fn without_cluster_cidrs_everything_but_default_like_prefixes_is_netcms() {
        let o = Ownership::new(Vec::new());
        assert!(o.is_responsible(&net("172.16.0.0/24")));
        for d in ["0.0.0.0/0", "0.0.0.0/1", "128.0.0.0/1", "::/0", "8000::/1"] {
            assert!(!o.is_responsible(&net(d)), "{d}");
        }
    }

    #[test]
    fn default_like_outside_and_lan_pod_cidrs_are_refused_with_a_reason_naming_the_rule() {
        let o = rules();
        let why = |c: &str| o.refusal(&net(c)).map(|r| r.to_string());
        assert!(why("0.0.0.0/1").is_some_and(|r| r.contains("default-like (/1)")));
        assert!(why("172.16.0.0/24").is_some_and(|r| r.contains(
            "outside every --cluster-cidr (10.0.0.0/8, fd00::/8) and every ClusterCIDR object's range (none)"
        )));
        // Inside the cluster CIDR, over a connected network, whether it covers it or lies within it.
        for c in ["10.99.1.0/24", "10.98.0.0/15", "fd00:9::/64"] {
            assert!(
                why(c).is_some_and(|r| r.contains("directly connected")),
                "{c}: {:?}",
                why(c)
            );
        }
        assert_eq!(why("10.244.1.0/24"), None);
    }

    #[test]
    fn an_ipv4_mapped_pod_cidr_is_refused_even_without_cluster_cidrs_and_only_lan_refusals_are_the_hosts(
    ) {
        let o = Ownership::new(Vec::new());
        for c in [
            "::ffff:10.244.0.0/120",
            "::ffff:0:0/96",
            "::ffff:10.244.0.7/128",
        ] {
            let r = o.refusal(&net(c));
            assert!(matches!(r, Some(Refusal::Ipv4Mapped(_))), "{c}: {r:?}");
            assert!(r.is_some_and(|r| !r.is_this_hosts()));
        }
        // Around the mapped range, or beside it, is an IPv6 network like any other.
        for c in ["::/64", "::fffe:0:0/96", "64:ff9b::/96"] {
            assert_eq!(o.refusal(&net(c)), None, "{c}");
        }
        let o = rules();
        assert!(o
            .refusal(&net("10.99.1.0/24"))
            .is_some_and(|r| r.is_this_hosts()));
        assert!(o
            .refusal(&net("172.16.0.0/24"))
            .is_some_and(|r| !r.is_this_hosts()));
    }

    #[test]
    fn a_pod_cidr_inside_a_clustercidr_objects_range_is_netcms_until_the_object_is_gone() {
        let o = rules();
        let pod_cidr = net("172.16.3.0/25");
        assert!(o.refusal(&pod_cidr).is_some());
        assert!(o.set_pool_ranges(vec![net("172.16.0.0/16"), net("fd01::/48")]));
        assert!(!o.set_pool_ranges(vec![net("fd01::/48"), net("172.16.0.0/16")]));
        assert!(o.is_responsible(&pod_cidr));
        assert_eq!(o.refusal(&pod_cidr), None);
        assert_eq!(o.refusal(&net("fd01:0:0:7::/64")), None);
        // Straddling a pool's range is not lying inside it; connected networks still win.
        assert!(!o.is_responsible(&net("172.16.0.0/15")));
        o.set_pool_ranges(vec![net("192.0.0.0/16")]);
        assert!(o
            .refusal(&net("192.0.2.0/25"))
            .is_some_and(|r| r.is_this_hosts()));
        assert!(o.set_pool_ranges(Vec::new()));
        assert!(o
            .refusal(&pod_cidr)
            .is_some_and(|r| r.to_string().contains("ClusterCIDR object's range (none)")));
    }

    #[test]
    fn a_default_like_clustercidr_range_makes_nothing_netcms() {
        let o = rules();
        assert!(!o.set_pool_ranges(vec![net("0.0.0.0/0"), net("::/1")]));
        assert!(!o.is_responsible(&net("172.16.0.0/24")));
    }

    #[test]
    fn connected_networks_are_replaced_and_a_change_is_reported() {
        let o = rules();
        assert!(!o.set_connected(vec![
            net("fd00:9::/64"),
            net("10.99.0.0/16"),
            net("192.0.2.0/24")
        ]));
        assert!(o.set_connected(Vec::new()));
        assert_eq!(o.refusal(&net("10.99.1.0/24")), None);
    }
}
