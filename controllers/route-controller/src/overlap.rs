//! Which Node may have a route to its pod CIDR when other Nodes' pod CIDRs overlap it. Pure, no I/O.
//!
//! A kubelet registers its Node with any `spec.podCIDR` it likes (NodeRestriction does not guard the
//! field). A route to a pod CIDR inside another Node's (a /25 or a /32 inside its /24) wins by
//! longest-prefix match and takes that part of the other Node's pod traffic; one around it or equal to
//! it takes the rest of the range, or the route itself. So a route exists only where ownership is
//! unambiguous: a pod CIDR that overlaps another Node's in any way (contains it, lies inside it, equals
//! it) is routed only if its Node is the **earlier** of the two, and every later one gets no route.
//!
//! "Earlier" is the order of `metadata.creationTimestamp`, then `metadata.uid` ([`Seniority`]): both are
//! set by the API server when the Node is created, never by the client, and never change afterwards, so
//! no kubelet can backdate its Node, and every host and every restart reads the same order. The uid
//! (random) breaks ties of the timestamp's one-second resolution; the name, which a kubelet's credential
//! may let it choose, decides nothing. What this cannot tell:
//!
//! - A Node deleted and created again is a new Node, created now. If a Node registered with an
//!   overlapping pod CIDR while the first was gone, that Node is the earlier one and keeps the route.
//!   The subnet-allocator reports the overlap (`CIDRConflict` on both Nodes) and hands out no CIDR
//!   overlapping one already held, so a re-created Node only meets this when it gets its old CIDR back
//!   from a release hold or has one written by another tool.
//! - Who wrote a pod CIDR is not evidence: `metadata.managedFields` names the field manager a client
//!   claims to be (`?fieldManager=` is the client's choice), and a client may write managedFields
//!   itself, so "written by netcm" is forgeable by the kubelet it would be used against.
//!
//! Contenders are found by overlap, not equality, in one ordered map of destinations
//! ([`Contenders`]): the destinations that contain a pod CIDR are looked up by their prefix lengths (at
//! most one lookup for each length some destination of the family has, usually one or two), and the
//! ones inside it are one range of the map. A query costs O(L·log n + k) for n destinations, L prefix
//! lengths in use and k overlaps found; a cluster without overlaps pays O(L·log n) per sync.

use std::collections::BTreeMap;
use std::fmt;

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use k8s_openapi::jiff::Timestamp;

/// When the API server created a Node, and which Node it is: the order of [`crate::overlap`]'s rule.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Seniority {
    /// `metadata.creationTimestamp`.
    pub created: Timestamp,
    /// `metadata.uid`: breaks ties of `created`, and tells a re-created Node from the one before.
    pub uid: String,
}

/// How one Node's pod CIDR stands against the other Nodes' pod CIDRs that overlap it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Standing<'a> {
    /// No other Node's pod CIDR overlaps it, or its Node was created before every one that does.
    Holds,
    /// A Node created earlier has an overlapping pod CIDR: this one gets no route.
    Yields(Earlier<'a>),
    /// Whether it is the earlier one is not known: the creation time of its Node or of `with` is not
    /// known yet.
    Undecided {
        /// A Node whose creation time is missing (perhaps this one).
        with: &'a str,
    },
}

/// The earliest Node whose pod CIDR overlaps, when it was created before the Node asking.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Earlier<'a> {
    /// Its name.
    pub node: &'a str,
    /// Its pod CIDR that overlaps.
    pub cidr: IpNet,
    /// When the API server created it.
    pub created: Timestamp,
}

impl fmt::Display for Earlier<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} of node {}, which the API server created earlier ({})",
            self.cidr, self.node, self.created
        )
    }
}

/// How `node` (created as `own`, if known) stands with its pod CIDR against `overlapping`: every other
/// Node's overlapping pod CIDR with that Node's creation, if known. Entries of `node` itself are
/// ignored. Decided as soon as one earlier Node is known; undecided while any other could still be.
pub fn standing<'a>(
    node: &'a str,
    own: Option<&Seniority>,
    overlapping: impl IntoIterator<Item = (IpNet, &'a str, Option<&'a Seniority>)>,
) -> Standing<'a> {
    let mut earliest: Option<(&Seniority, &str, IpNet)> = None;
    let mut unknown: Option<&str> = None;
    for (cidr, other, seniority) in overlapping {
        if other == node {
            continue;
        }
        let Some(own) = own else {
            return Standing::Undecided { with: node };
        };
        match seniority {
            None => unknown = unknown.or(Some(other)),
            // The name only orders two entries of one uid, which the API server never makes.
            Some(s) if (s, other) < (own, node) => {
                if earliest.is_none_or(|(e, n, _)| (s, other) < (e, n)) {
                    earliest = Some((s, other, cidr));
                }
            }
            Some(_) => {}
        }
    }
    match (earliest, unknown) {
        (Some((s, node, cidr)), _) => Standing::Yields(Earlier {
            node,
            cidr,
            created: s.created,
        }),
        (None, Some(with)) => Standing::Undecided { with },
        (None, None) => Standing::Holds,
    }
}

/// How many destinations of each prefix length the map holds, for one family: the lengths a
/// containing destination can have.
#[derive(Debug, Clone)]
struct Lengths([u32; 129]);

impl Default for Lengths {
    fn default() -> Self {
        Self([0; 129])
    }
}

impl Lengths {
    fn add(&mut self, len: u8, by: i32) {
        if let Some(n) = self.0.get_mut(usize::from(len)) {
            *n = n.saturating_add_signed(by);
        }
    }

    /// The lengths in use shorter than `len`.
    fn shorter_than(&self, len: u8) -> impl Iterator<Item = u8> + '_ {
        (0..len).filter(|l| self.0.get(usize::from(*l)).is_some_and(|n| *n > 0))
    }
}

/// Every pod CIDR some Node claims, with the Nodes claiming it, ordered by network address then prefix
/// length, so the pod CIDRs inside a network are one range.
#[derive(Debug, Default)]
pub struct Contenders {
    by_destination: BTreeMap<IpNet, Vec<String>>,
    v4: Lengths,
    v6: Lengths,
}

impl Contenders {
    fn lengths(&mut self, d: &IpNet) -> &mut Lengths {
        match d {
            IpNet::V4(_) => &mut self.v4,
            IpNet::V6(_) => &mut self.v6,
        }
    }

    /// Takes `node` out of the contest for each of `destinations`.
    pub fn withdraw(&mut self, node: &str, destinations: &[IpNet]) {
        for d in destinations {
            let d = d.trunc();
            let Some(list) = self.by_destination.get_mut(&d) else {
                continue;
            };
            list.retain(|n| n != node);
            if list.is_empty() {
                self.by_destination.remove(&d);
                self.lengths(&d).add(d.prefix_len(), -1);
            }
        }
    }

    /// Enters `node` for each of `destinations`; call [`Contenders::withdraw`] with what it claimed
    /// before.
    pub fn enter(&mut self, node: &str, destinations: &[IpNet]) {
        for d in destinations {
            let d = d.trunc();
            if !self.by_destination.contains_key(&d) {
                self.lengths(&d).add(d.prefix_len(), 1);
            }
            let list = self.by_destination.entry(d).or_default();
            if !list.iter().any(|n| n == node) {
                list.push(node.to_string());
            }
        }
    }

    /// Whether `node` claims `destination`.
    pub fn claims(&self, node: &str, destination: &IpNet) -> bool {
        self.by_destination
            .get(&destination.trunc())
            .is_some_and(|l| l.iter().any(|n| n == node))
    }

    /// Every claimed destination that overlaps `destination` (contains it, lies inside it or equals
    /// it), with each Node claiming it; `destination` itself first if claimed.
    pub fn overlapping(&self, destination: &IpNet) -> Vec<(IpNet, &str)> {
        let d = destination.trunc();
        let mut out = Vec::new();
        if let Some(nodes) = self.by_destination.get(&d) {
            out.extend(nodes.iter().map(|n| (d, n.as_str())));
        }
        let lengths = match d {
            IpNet::V4(_) => &self.v4,
            IpNet::V6(_) => &self.v6,
        };
        for len in lengths.shorter_than(d.prefix_len()) {
            let Ok(around) = IpNet::new(d.network(), len) else {
                continue;
            };
            if let Some((net, nodes)) = self.by_destination.get_key_value(&around.trunc()) {
                out.extend(nodes.iter().map(|n| (*net, n.as_str())));
            }
        }
        if let Some((first, last)) = inside(&d) {
            for (net, nodes) in self.by_destination.range(first..=last) {
                if *net != d {
                    out.extend(nodes.iter().map(|n| (*net, n.as_str())));
                }
            }
        }
        out
    }

    /// How many destinations are claimed.
    pub fn len(&self) -> usize {
        self.by_destination.len()
    }

    /// Whether no destination is claimed.
    pub fn is_empty(&self) -> bool {
        self.by_destination.is_empty()
    }
}

/// The first and last key a destination inside `d` (or equal to it) can have in the map: a network
/// address within `d` and a prefix at least as long as `d`'s. A key between them whose prefix is
/// shorter would have `d`'s own address, and sorts before the first.
fn inside(d: &IpNet) -> Option<(IpNet, IpNet)> {
    match d {
        IpNet::V4(n) => Some((
            IpNet::V4(Ipv4Net::new(n.network(), n.prefix_len()).ok()?),
            IpNet::V4(Ipv4Net::new(n.broadcast(), 32).ok()?),
        )),
        IpNet::V6(n) => Some((
            IpNet::V6(Ipv6Net::new(n.network(), n.prefix_len()).ok()?),
            IpNet::V6(Ipv6Net::new(n.broadcast(), 128).ok()?),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> IpNet {
        s.parse().expect("net")
    }

    fn born(secs: i64, uid: &str) -> Seniority {
        Seniority {
            created: Timestamp::from_second(secs).expect("time"),
            uid: uid.into(),
        }
    }

    fn claimed(entries: &[(&str, &str)]) -> Contenders {
        let mut c = Contenders::default();
        for (node, d) in entries {
            c.enter(node, &[net(d)]);
        }
        c
    }

    fn names(found: &[(IpNet, &str)]) -> Vec<String> {
        let mut v: Vec<String> = found.iter().map(|(d, n)| format!("{n} {d}")).collect();
        v.sort();
        v
    }

    #[test]
    fn overlap_finds_what_contains_what_lies_inside_and_what_is_equal_and_nothing_else() {
        let c = claimed(&[
            ("around", "10.244.0.0/16"),
            ("wide", "10.0.0.0/8"),
            ("equal", "10.244.1.0/24"),
            ("inside", "10.244.1.128/25"),
            ("host", "10.244.1.7/32"),
            ("neighbour", "10.244.2.0/24"),
            ("below", "10.244.0.255/32"),
            ("v6", "fd00::/8"),
        ]);
        assert_eq!(
            names(&c.overlapping(&net("10.244.1.0/24"))),
            [
                "around 10.244.0.0/16",
                "equal 10.244.1.0/24",
                "host 10.244.1.7/32",
                "inside 10.244.1.128/25",
                "wide 10.0.0.0/8",
            ]
        );
        // Host bits of the question are ignored, as they are of every pod CIDR.
        assert_eq!(
            c.overlapping(&net("10.244.1.7/24")),
            c.overlapping(&net("10.244.1.0/24"))
        );
        assert_eq!(names(&c.overlapping(&net("fd00:1::/64"))), ["v6 fd00::/8"]);
        assert!(c.overlapping(&net("192.168.0.0/16")).is_empty());
        assert!(c.overlapping(&net("::ffff:10.244.1.0/120")).is_empty());
    }

    #[test]
    fn overlap_at_the_ends_of_the_address_space_and_with_a_slash_zero() {
        let c = claimed(&[
            ("zero", "0.0.0.0/0"),
            ("top", "255.255.255.255/32"),
            ("v6top", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff/128"),
        ]);
        assert_eq!(
            names(&c.overlapping(&net("255.255.255.0/24"))),
            ["top 255.255.255.255/32", "zero 0.0.0.0/0"]
        );
        assert_eq!(
            names(&c.overlapping(&net("0.0.0.0/0"))),
            ["top 255.255.255.255/32", "zero 0.0.0.0/0"]
        );
        assert_eq!(
            names(&c.overlapping(&net("::/0"))),
            ["v6top ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff/128"]
        );
    }

    #[test]
    fn withdrawing_leaves_no_empty_entry_and_no_length_to_look_up() {
        let mut c = claimed(&[("a", "10.244.0.0/16"), ("b", "10.244.0.0/16")]);
        c.enter("a", &[net("10.244.0.0/16")]);
        assert_eq!(c.overlapping(&net("10.244.1.0/24")).len(), 2);
        assert!(c.claims("b", &net("10.244.0.0/16")));
        c.withdraw("a", &[net("10.244.0.0/16")]);
        c.withdraw("b", &[net("10.244.0.0/16")]);
        assert!(c.is_empty());
        assert_eq!(c.v4.shorter_than(32).count(), 0);
    }

    #[test]
    fn the_earlier_node_holds_and_the_later_yields_whatever_their_names_and_order() {
        let (early, late) = (born(1, "uid-z"), born(2, "uid-a"));
        let d = net("10.244.0.0/24");
        assert_eq!(
            standing("zzz-victim", Some(&early), [(d, "aaa", Some(&late))]),
            Standing::Holds
        );
        let Standing::Yields(e) = standing("aaa", Some(&late), [(d, "zzz-victim", Some(&early))])
        else {
            panic!("the later node holds");
        };
        assert_eq!(
            (e.node, e.cidr, e.created),
            ("zzz-victim", d, early.created)
        );
        // One second apart or none: the uid orders equal timestamps, the same way on every host.
        let (u1, u2) = (born(5, "uid-1"), born(5, "uid-2"));
        assert_eq!(
            standing("b", Some(&u1), [(d, "a", Some(&u2))]),
            Standing::Holds
        );
        assert!(matches!(
            standing("a", Some(&u2), [(d, "b", Some(&u1))]),
            Standing::Yields(_)
        ));
    }

    #[test]
    fn an_unknown_creation_time_leaves_it_undecided_unless_an_earlier_node_is_known() {
        let (early, mid, late) = (born(1, "u1"), born(2, "u2"), born(3, "u3"));
        let d = net("10.244.0.0/24");
        assert_eq!(
            standing("a", None, [(d, "b", Some(&early))]),
            Standing::Undecided { with: "a" }
        );
        assert_eq!(
            standing("b", Some(&mid), [(d, "x", None)]),
            Standing::Undecided { with: "x" }
        );
        assert!(matches!(
            standing("c", Some(&late), [(d, "x", None), (d, "a", Some(&early))]),
            Standing::Yields(Earlier { node: "a", .. })
        ));
        // Its own entries do not count, and nothing else means it holds.
        assert_eq!(standing("a", None, [(d, "a", None)]), Standing::Holds);
        assert_eq!(standing("a", None, []), Standing::Holds);
    }

    #[test]
    fn fifty_thousand_destinations_answer_overlap_queries_with_only_their_overlaps() {
        let mut c = Contenders::default();
        for i in 0..50_000u32 {
            let d = net(&format!("10.{}.{}.0/24", i / 256, i % 256));
            c.enter(&format!("node-{i}"), &[d]);
            let v6 = net(&format!("fd00:{:x}:{:x}::/64", i / 256, i % 256));
            c.enter(&format!("node-{i}"), &[v6]);
        }
        c.enter("wide", &[net("10.3.0.0/16")]);
        assert_eq!(c.len(), 100_001);
        for i in (0..50_000u32).step_by(7) {
            let d = net(&format!("10.{}.{}.0/24", i / 256, i % 256));
            let found = c.overlapping(&d);
            let want = if i / 256 == 3 { 2 } else { 1 };
            assert_eq!(found.len(), want, "{d}: {found:?}");
            let v6 = net(&format!("fd00:{:x}:{:x}::/64", i / 256, i % 256));
            assert_eq!(c.overlapping(&v6).len(), 1, "{v6}");
        }
        assert_eq!(c.overlapping(&net("10.3.0.0/16")).len(), 257);
    }
}
