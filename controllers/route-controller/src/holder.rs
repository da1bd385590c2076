//! Which Node keeps a destination that several Nodes have as their pod CIDR. Pure, no I/O.
//!
//! A pod CIDR belongs to one Node. A second Node that carries a copy — a second allocator, a hand edit,
//! or a Node registered to capture another Node's pod traffic — must never get the route: it would send
//! the first Node's pods' traffic to the copy and leave the first Node without a route. The Node that
//! holds a destination is, in this order:
//!
//! 1. the Node this process already routes it to (or tries to), while that Node still asks for it: the
//!    Node that had it before the copy appeared;
//! 2. else a Node whose gateway the table's route of netcm's points at: the route netcm made before a
//!    restart or a failover, so the Node that had it keeps it however the first syncs are ordered;
//! 3. else the Node whose name sorts first, so every replica and every restart decides alike.
//!
//! The cached Node carries no creation time, so "first" cannot be read from the Nodes themselves: a copy
//! made before netcm routed either Node wins rule 3 if its name sorts first.

use std::collections::HashMap;
use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;

use crate::desired::NodeRoutes;

/// One Node that asks for a destination, with the gateway it asks for (none while it has no usable
/// address of the destination's family).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Contender {
    /// The Node's name.
    pub node: String,
    /// The gateway the Node asks for.
    pub gateway: Option<IpAddr>,
}

/// Which rule gave a destination to its holder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ground {
    /// netcm routes it to the holder already (rule 1).
    Routed,
    /// The table's route of netcm's points at the holder's gateway (rule 2).
    InTable,
    /// No Node has the route; the holder's name sorts first (rule 3).
    FirstByName,
}

impl fmt::Display for Ground {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Routed => "netcm routes it to that node already",
            Self::InTable => "netcm's route to it already points at that node's gateway",
            Self::FirstByName => {
                "neither node has a route to it yet and that node's name sorts first"
            }
        })
    }
}

/// The Node that keeps a destination, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Holder<'a> {
    /// The Node's name.
    pub node: &'a str,
    /// The rule that decided.
    pub ground: Ground,
}

/// The holder among `contenders` (see the module doc for the rules); `routed_for` is the Node this
/// process routes the destination to, `in_table` the gateway of the table's route of netcm's. `None`
/// only without contenders. The order of `contenders` never matters.
pub fn holder<'a>(
    contenders: &'a [Contender],
    routed_for: Option<&str>,
    in_table: Option<IpAddr>,
) -> Option<Holder<'a>> {
    if let Some(c) = routed_for.and_then(|r| contenders.iter().find(|c| c.node == r)) {
        return Some(Holder {
            node: &c.node,
            ground: Ground::Routed,
        });
    }
    let first_by_name = |matching: &dyn Fn(&Contender) -> bool| {
        contenders
            .iter()
            .filter(|c| matching(c))
            .map(|c| c.node.as_str())
            .min()
    };
    if let Some(gw) = in_table {
        if let Some(node) = first_by_name(&|c| c.gateway == Some(gw)) {
            return Some(Holder {
                node,
                ground: Ground::InTable,
            });
        }
    }
    first_by_name(&|_| true).map(|node| Holder {
        node,
        ground: Ground::FirstByName,
    })
}

/// Every destination some Node asks for, with the Nodes asking.
#[derive(Debug, Default)]
pub struct Contenders {
    by_destination: HashMap<IpNet, Vec<Contender>>,
}

impl Contenders {
    /// Takes `node` out of the contest for each of `destinations`.
    pub fn withdraw(&mut self, node: &str, destinations: &[IpNet]) {
        for d in destinations {
            if let Some(list) = self.by_destination.get_mut(d) {
                list.retain(|c| c.node != node);
                if list.is_empty() {
                    self.by_destination.remove(d);
                }
            }
        }
    }

    /// Enters `node` for every destination it asks for ([`NodeRoutes::destinations`]); call
    /// [`Contenders::withdraw`] with what it asked for before.
    pub fn enter(&mut self, node: &str, wanted: &NodeRoutes) {
        for (destination, gateway) in wanted.destinations_via() {
            let list = self.by_destination.entry(destination).or_default();
            list.retain(|c| c.node != node);
            list.push(Contender {
                node: node.to_string(),
                gateway,
            });
        }
    }

    /// Whether `node` asks for `destination`.
    pub fn contends(&self, node: &str, destination: &IpNet) -> bool {
        self.of(destination).iter().any(|c| c.node == node)
    }

    /// The Nodes that ask for `destination`.
    pub fn of(&self, destination: &IpNet) -> &[Contender] {
        self.by_destination
            .get(destination)
            .map(Vec::as_slice)
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("ip")
    }

    fn contender(node: &str, gw: Option<&str>) -> Contender {
        Contender {
            node: node.into(),
            gateway: gw.map(ip),
        }
    }

    /// The holder's name for `contenders` in their order and reversed; panics when the two differ.
    fn in_both_orders(
        contenders: &[Contender],
        routed_for: Option<&str>,
        in_table: Option<&str>,
    ) -> (String, Ground) {
        let mut reversed = contenders.to_vec();
        reversed.reverse();
        let decide = |list: &[Contender]| {
            holder(list, routed_for, in_table.map(ip)).map(|h| (h.node.to_string(), h.ground))
        };
        let (a, b) = (decide(contenders), decide(&reversed));
        assert_eq!(a, b, "the order of the contenders changed the holder");
        a.expect("a holder")
    }

    #[test]
    fn the_node_the_table_routes_to_keeps_a_copied_destination_whichever_comes_first() {
        let nodes = [
            contender("copy", Some("192.0.2.2")),
            contender("victim", Some("192.0.2.1")),
        ];
        assert_eq!(
            in_both_orders(&nodes, None, Some("192.0.2.1")),
            ("victim".into(), Ground::InTable)
        );
    }

    #[test]
    fn the_node_netcm_routes_to_keeps_it_even_once_its_gateway_changes() {
        let nodes = [
            contender("copy", Some("192.0.2.2")),
            contender("victim", Some("192.0.2.9")),
        ];
        assert_eq!(
            in_both_orders(&nodes, Some("victim"), Some("192.0.2.1")),
            ("victim".into(), Ground::Routed)
        );
        // A Node no longer among the contenders holds nothing.
        assert_eq!(
            in_both_orders(&nodes, Some("gone"), Some("192.0.2.2")),
            ("copy".into(), Ground::InTable)
        );
    }

    #[test]
    fn without_a_route_the_name_that_sorts_first_decides_also_for_a_node_without_a_gateway() {
        let nodes = [
            contender("b", Some("192.0.2.1")),
            contender("a", None),
            contender("c", Some("192.0.2.3")),
        ];
        assert_eq!(
            in_both_orders(&nodes, None, None),
            ("a".into(), Ground::FirstByName)
        );
        // A table route to no contender's gateway is no route of theirs.
        assert_eq!(
            in_both_orders(&nodes, None, Some("192.0.2.99")),
            ("a".into(), Ground::FirstByName)
        );
        // Two Nodes with the table's gateway: the name decides between them only.
        let same_gw = [
            contender("z", Some("192.0.2.1")),
            contender("y", Some("192.0.2.1")),
            contender("a", Some("192.0.2.2")),
        ];
        assert_eq!(
            in_both_orders(&same_gw, None, Some("192.0.2.1")),
            ("y".into(), Ground::InTable)
        );
        assert_eq!(holder(&[], Some("a"), None), None);
    }

    #[test]
    fn contenders_enter_once_and_withdraw_leaving_no_empty_entries() {
        let d: IpNet = "10.244.1.0/24".parse().expect("net");
        let wants = |gw: &str| NodeRoutes {
            routes: vec![crate::backend::Route {
                destination: d,
                gateway: ip(gw),
            }],
            ..NodeRoutes::default()
        };
        let mut c = Contenders::default();
        c.enter("a", &wants("192.0.2.1"));
        c.enter("a", &wants("192.0.2.9"));
        c.enter(
            "b",
            &NodeRoutes {
                waiting: vec![d],
                ..NodeRoutes::default()
            },
        );
        assert_eq!(
            c.of(&d),
            [contender("a", Some("192.0.2.9")), contender("b", None)]
        );
        assert!(c.contends("b", &d));
        c.withdraw("a", &[d]);
        c.withdraw("b", &[d]);
        assert!(c.of(&d).is_empty());
        assert!(c.by_destination.is_empty());
    }
}
