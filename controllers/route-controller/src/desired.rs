//! What a Node asks for: one route per pod CIDR, via the Node's public IP of the same family.
//!
//! The public IP comes from the lease annotations node-annotation-syncer writes (`<prefix>/public-ip`,
//! `<prefix>/public-ipv6`), falling back to the Node's own addresses (InternalIP, then ExternalIP), so the
//! controller also works where nothing writes the annotations. Pure functions, no I/O.

use std::net::IpAddr;

use ipnet::IpNet;
use netcm_node::CachedNode;
use netcm_node::{Family, Keys};

use crate::backend::Route;

/// A pod CIDR that gets no route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unroutable {
    /// The pod CIDR.
    pub destination: IpNet,
    /// The Node's gateway for it, if it has one.
    pub gateway: Option<IpAddr>,
    /// Why.
    pub reason: String,
}

/// Everything one Node asks for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeRoutes {
    /// One route per pod CIDR that has a gateway.
    pub routes: Vec<Route>,
    /// Pod CIDRs without a usable gateway of their family.
    pub unroutable: Vec<Unroutable>,
    /// Pod CIDRs without a gateway yet: the Node has not reported its addresses.
    pub waiting: Vec<IpNet>,
    /// Pod CIDRs netcm must not route at all (see [`crate::ownership`]).
    pub refused: Vec<Unroutable>,
}

impl NodeRoutes {
    /// Whether the Node has pod CIDRs at all (a Node without any is not the route controller's concern,
    /// as in the cloud route controller).
    pub fn wants_routes(&self) -> bool {
        !self.routes.is_empty()
            || !self.unroutable.is_empty()
            || !self.waiting.is_empty()
            || !self.refused.is_empty()
    }

    /// Every pod CIDR this Node may have a route for, whether or not one can be built now. Refused pod
    /// CIDRs are not among them, so a route netcm once made to one is deleted.
    pub fn destinations(&self) -> impl Iterator<Item = IpNet> + '_ {
        self.destinations_via().map(|(d, _)| d)
    }

    /// [`NodeRoutes::destinations`], each with the gateway the Node asks for if it has one.
    pub fn destinations_via(&self) -> impl Iterator<Item = (IpNet, Option<IpAddr>)> + '_ {
        self.routes
            .iter()
            .map(|r| (r.destination, Some(r.gateway)))
            .chain(self.unroutable.iter().map(|u| (u.destination, u.gateway)))
            .chain(self.waiting.iter().map(|d| (*d, None)))
    }

    /// Moves every pod CIDR for which `why` gives a reason into [`NodeRoutes::refused`].
    pub fn refuse(&mut self, why: impl Fn(&IpNet) -> Option<String>) {
        let mut refused = Vec::new();
        self.routes.retain(|r| match why(&r.destination) {
            Some(reason) => {
                refused.push(Unroutable {
                    destination: r.destination,
                    gateway: Some(r.gateway),
                    reason,
                });
                false
            }
            None => true,
        });
        self.unroutable.retain(|u| match why(&u.destination) {
            Some(reason) => {
                refused.push(Unroutable {
                    reason,
                    ..u.clone()
                });
                false
            }
            None => true,
        });
        self.waiting.retain(|d| match why(d) {
            Some(reason) => {
                refused.push(Unroutable {
                    destination: *d,
                    gateway: None,
                    reason,
                });
                false
            }
            None => true,
        });
        self.refused.extend(refused);
    }
}

/// The Node's pod CIDRs ([`PodCidrs`]) reduced to their network address, each once; unparsable entries
/// are skipped (subnet-allocator reports them).
pub fn pod_cidrs(node: &CachedNode) -> Vec<IpNet> {
    let parsed = node.pod_cidrs();
    for bad in &parsed.unparsable {
        tracing::debug!(cidr = %bad.raw, "skipping an unparsable pod CIDR");
    }
    let mut out: Vec<IpNet> = Vec::new();
    // The kernel refuses a destination with host bits set.
    for net in parsed.networks() {
        if !out.contains(&net) {
            out.push(net);
        }
    }
    out
}

/// The Node's gateway of a family: the lease annotation if it holds a usable address of that family,
/// else the first usable InternalIP, else the first usable ExternalIP of that family. "Usable" is the
/// rule node-annotation-syncer publishes by ([`netcm_node::public_ip`]), so a gateway is always a
/// value the syncer could have written.
pub fn gateway(node: &CachedNode, family: Family, keys: &Keys) -> Option<IpAddr> {
    let annotated = node
        .annotation(keys.public_ip_of(family))
        .and_then(|v| netcm_node::public_ip(v, family).ok());
    annotated.or_else(|| netcm_node::first_address(node, &["InternalIP", "ExternalIP"], family))
}

/// Whether the kubelet has reported the Node's addresses yet.
fn has_reported_addresses(node: &CachedNode) -> bool {
    node.addresses().len() > 0
}

/// The routes a Node asks for: `podCIDR via gateway` per pod CIDR. A pod CIDR without a gateway is a
/// failure once the Node has reported its addresses (it has none of that family); before that it is
/// only waiting (a kubelet reports its addresses right after registering), which is not a failure.
pub fn node_routes(node: &CachedNode, keys: &Keys) -> NodeRoutes {
    let mut out = NodeRoutes::default();
    let reported = has_reported_addresses(node);
    for destination in pod_cidrs(node) {
        let family = Family::of(&destination);
        match gateway(node, family, keys) {
            Some(gateway) => out.routes.push(Route {
                destination,
                gateway,
            }),
            None if !reported => out.waiting.push(destination),
            None => out.unroutable.push(Unroutable {
                destination,
                gateway: None,
                reason: format!(
                    "the node has no {family} address (annotation {} or an InternalIP/ExternalIP)",
                    keys.public_ip_of(family)
                ),
            }),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use netcm_node::test_support::{flannel_keys as keys, node};

    fn route(dst: &str, gw: &str) -> Route {
        Route {
            destination: dst.parse().expect("dst"),
            gateway: gw.parse().expect("gw"),
        }
    }

    #[test]
    fn a_node_gets_one_route_per_pod_cidr_via_its_internal_ip() {
        let n = node(
            "a",
            &["10.244.1.0/24"],
            &[("InternalIP", "192.0.2.10")],
            &[],
        );
        assert_eq!(
            node_routes(&n, &keys()).routes,
            [route("10.244.1.0/24", "192.0.2.10")]
        );
    }

    #[test]
    fn the_lease_annotation_wins_over_the_node_addresses() {
        let n = node(
            "a",
            &["10.244.1.0/24"],
            &[("InternalIP", "192.0.2.10")],
            &[("flannel.alpha.coreos.com/public-ip", "198.51.100.7")],
        );
        assert_eq!(
            node_routes(&n, &keys()).routes,
            [route("10.244.1.0/24", "198.51.100.7")]
        );
    }

    #[test]
    fn a_garbage_or_wrong_family_annotation_falls_back_to_the_addresses() {
        for bad in ["banana", "2001:db8::1", "0.0.0.0", "127.0.0.1"] {
            let n = node(
                "a",
                &["10.244.1.0/24"],
                &[("InternalIP", "192.0.2.10")],
                &[("flannel.alpha.coreos.com/public-ip", bad)],
            );
            assert_eq!(
                node_routes(&n, &keys()).routes,
                [route("10.244.1.0/24", "192.0.2.10")],
                "{bad}"
            );
        }
    }

    #[test]
    fn internal_ip_comes_before_external_ip_whatever_their_order() {
        let n = node(
            "a",
            &["10.244.1.0/24"],
            &[("ExternalIP", "203.0.113.1"), ("InternalIP", "192.0.2.10")],
            &[],
        );
        assert_eq!(
            node_routes(&n, &keys()).routes,
            [route("10.244.1.0/24", "192.0.2.10")]
        );
        let external_only = node(
            "b",
            &["10.244.2.0/24"],
            &[("ExternalIP", "203.0.113.1")],
            &[],
        );
        assert_eq!(
            node_routes(&external_only, &keys()).routes,
            [route("10.244.2.0/24", "203.0.113.1")]
        );
    }

    #[test]
    fn dual_stack_nodes_get_a_route_per_family_via_the_address_of_that_family() {
        let n = node(
            "a",
            &["10.244.1.0/24", "fd00:10:244:1::/64"],
            &[("InternalIP", "192.0.2.10"), ("InternalIP", "2001:db8::10")],
            &[("flannel.alpha.coreos.com/public-ipv6", "2001:db8::99")],
        );
        assert_eq!(
            node_routes(&n, &keys()).routes,
            [
                route("10.244.1.0/24", "192.0.2.10"),
                route("fd00:10:244:1::/64", "2001:db8::99")
            ]
        );
    }

    #[test]
    fn a_pod_cidr_without_an_address_of_its_family_is_unroutable() {
        let n = node(
            "a",
            &["10.244.1.0/24", "fd00::/64"],
            &[("InternalIP", "192.0.2.10")],
            &[],
        );
        let r = node_routes(&n, &keys());
        assert_eq!(r.routes.len(), 1);
        assert_eq!(r.unroutable.len(), 1);
        assert!(
            r.unroutable[0].reason.contains("IPv6"),
            "{:?}",
            r.unroutable
        );
        assert!(r.wants_routes());
    }

    #[test]
    fn a_pod_cidr_of_a_node_that_has_not_reported_addresses_yet_is_waiting_not_failed() {
        let n = node("a", &["10.244.1.0/24"], &[], &[]);
        let r = node_routes(&n, &keys());
        assert_eq!(r.waiting.len(), 1);
        assert!(r.unroutable.is_empty());
        // An annotated gateway is used even before the addresses are reported.
        let annotated = node(
            "b",
            &["10.244.1.0/24", "fd00::/64"],
            &[],
            &[("flannel.alpha.coreos.com/public-ip", "192.0.2.3")],
        );
        let r = node_routes(&annotated, &keys());
        assert_eq!(r.routes, [route("10.244.1.0/24", "192.0.2.3")]);
        assert_eq!(r.waiting, ["fd00::/64".parse::<IpNet>().expect("net")]);
    }

    #[test]
    fn a_node_without_pod_cidrs_wants_nothing_and_host_bits_are_cleared() {
        let n = node("a", &[], &[("InternalIP", "192.0.2.10")], &[]);
        assert!(!node_routes(&n, &keys()).wants_routes());
        assert!(node_routes(&node("w", &["10.244.1.0/24"], &[], &[]), &keys()).wants_routes());
        let sloppy = node(
            "b",
            &["10.244.1.7/24", "garbage"],
            &[("InternalIP", "192.0.2.10")],
            &[],
        );
        assert_eq!(
            pod_cidrs(&sloppy),
            ["10.244.1.0/24".parse::<IpNet>().expect("net")]
        );
    }

    #[test]
    fn a_custom_prefix_changes_the_keys_read() {
        let keys = Keys::new("--annotation-prefix", "example.com/net-").expect("custom prefix");
        assert_eq!(keys.public_ip, "example.com/net-public-ip");
        let n = node(
            "a",
            &["10.244.1.0/24"],
            &[],
            &[("example.com/net-public-ip", "192.0.2.3")],
        );
        assert_eq!(
            node_routes(&n, &keys).routes,
            [route("10.244.1.0/24", "192.0.2.3")]
        );
    }

    #[test]
    fn a_link_local_or_padded_address_is_never_a_gateway_as_the_syncer_never_publishes_one() {
        let n = node(
            "a",
            &["fd00:1::/64", "10.244.1.0/24"],
            &[("InternalIP", "fe80::1"), ("InternalIP", " 192.0.2.10")],
            &[("flannel.alpha.coreos.com/public-ipv6", "fe80::2")],
        );
        let r = node_routes(&n, &keys());
        assert!(r.routes.is_empty(), "{:?}", r.routes);
    }

    #[test]
    fn refused_pod_cidrs_leave_the_destinations_but_still_count_as_wanting_routes() {
        let mut r = node_routes(
            &node(
                "a",
                &["0.0.0.0/1", "10.244.1.0/24", "fd00::/64"],
                &[("InternalIP", "192.0.2.10")],
                &[],
            ),
            &keys(),
        );
        r.refuse(|d| (d.prefix_len() <= 1).then(|| "default-like".to_string()));
        assert_eq!(r.routes, [route("10.244.1.0/24", "192.0.2.10")]);
        assert_eq!(
            r.refused,
            [Unroutable {
                destination: "0.0.0.0/1".parse().expect("net"),
                gateway: Some("192.0.2.10".parse().expect("ip")),
                reason: "default-like".into()
            }]
        );
        assert_eq!(r.destinations().count(), 2, "10.244.1.0/24 and fd00::/64");
        r.refuse(|_| Some("everything".into()));
        assert_eq!(r.destinations().count(), 0);
        assert_eq!(r.refused.len(), 3);
        assert!(r.wants_routes());
    }
}
