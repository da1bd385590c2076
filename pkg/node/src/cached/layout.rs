//! How a [`CachedNode`](super::CachedNode) lays out everything but its strings: one table of `u32` words,
//! written once by [`Tables::encode`] and read by [`Tables`]'s accessors.
//!
//! A Node used to carry a struct of its declared fields, a box for them and a box per table (five
//! allocations, 216 bytes before a list's entries for a Node with a flannel lease). Now it is its
//! strings and this one table: a header word of [`flags`], the lengths of the name, uid and
//! resourceVersion (the buffer starts with them), then only the sections a flag says are present, in
//! this order:
//!
//! | flag | words |
//! |---|---|
//! | [`flags::PROVIDER_ID`] | its span (start, len) |
//! | [`flags::CAPACITY_PODS`] | the count |
//! | [`flags::POD_CIDRS`] | the number of entries, the section's length in words, then per entry its raw span, a word of family and prefix (0: not a CIDR), and the address (1 word for IPv4, 4 for IPv6) |
//! | [`flags::PAIRS`] | the number of pairs, the ends of the addresses, annotations and annotation owners, then 4 words per pair |
//! | [`flags::CONDITIONS`] | the number, then 8 words each (type, status, reason, message) |
//! | [`flags::TAINTS`] | the number, then 6 words each (key, value, effect) |
//!
//! An absent optional string is the span ([`NONE`], 0). Every read is bounds-checked and reads a
//! missing word as 0: a table is only ever written here, but no reader can panic on one.

use std::net::{Ipv4Addr, Ipv6Addr};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

use super::{CidrEntry, Condition, Pair, Span, Taint};

/// The header word's bits.
pub(super) mod flags {
    /// `metadata.deletionTimestamp` is set.
    pub const DELETING: u32 = 1;
    /// `metadata.annotations` has an entry, declared or not.
    pub const HAS_ANNOTATIONS: u32 = 1 << 1;
    /// `spec.unschedulable`.
    pub const UNSCHEDULABLE: u32 = 1 << 2;
    /// A `spec.providerID` section follows.
    pub const PROVIDER_ID: u32 = 1 << 3;
    /// A `status.capacity.pods` section follows.
    pub const CAPACITY_PODS: u32 = 1 << 4;
    /// A pod CIDR section follows.
    pub const POD_CIDRS: u32 = 1 << 5;
    /// A section of pairs follows: addresses, annotations, annotation owners, labels.
    pub const PAIRS: u32 = 1 << 6;
    /// A conditions section follows.
    pub const CONDITIONS: u32 = 1 << 7;
    /// A taints section follows.
    pub const TAINTS: u32 = 1 << 8;
}

/// The start of an absent optional string's span: no buffer offset or interned index reaches it.
const NONE: u32 = u32::MAX;
/// The header: flags, then the name's, uid's and resourceVersion's lengths.
const HEADER: usize = 4;
const PAIR_WORDS: usize = 4;
const CONDITION_WORDS: usize = 8;
const TAINT_WORDS: usize = 6;
/// A pod CIDR entry's family word for IPv4 and IPv6 (the prefix length is above it).
const V4: u32 = 4;
const V6: u32 = 6;

/// What [`Tables::encode`] writes: the builder's parts, laid out.
pub(super) struct Parts<'a> {
    pub flags: u32,
    pub lens: [u32; 3],
    pub provider_id: Option<Span>,
    pub capacity_pods: u32,
    pub pod_cidrs: &'a [CidrEntry],
    pub pairs: &'a [Pair],
    pub ends: [u32; 3],
    pub conditions: &'a [Condition<Span>],
    pub taints: &'a [Taint<Span>],
}

/// Where each present section starts (the index of its first word), found from the header.
#[derive(Default)]
struct Sections {
    provider_id: Option<usize>,
    capacity_pods: Option<usize>,
    pod_cidrs: Option<usize>,
    pairs: Option<usize>,
    conditions: Option<usize>,
    taints: Option<usize>,
}

/// A Node's table of words.
#[derive(Clone, PartialEq, Eq)]
pub(super) struct Tables(Box<[u32]>);

/// The number of a list's entries in a count word.
fn count(word: u32) -> usize {
    usize::try_from(word).unwrap_or(0)
}

impl Tables {
    /// Lays `parts` out.
    pub(super) fn encode(parts: &Parts<'_>) -> Tables {
        let mut flags = parts.flags;
        let mut w: Vec<u32> = Vec::with_capacity(words_needed(parts));
        w.push(0);
        w.extend(parts.lens);
        if let Some(id) = parts.provider_id {
            flags |= flags::PROVIDER_ID;
            w.extend([id.start, id.len]);
        }
        if parts.capacity_pods != 0 {
            flags |= flags::CAPACITY_PODS;
            w.push(parts.capacity_pods);
        }
        if !parts.pod_cidrs.is_empty() {
            flags |= flags::POD_CIDRS;
            let at = w.len();
            w.extend([len_word(parts.pod_cidrs.len()), 0]);
            for e in parts.pod_cidrs {
                w.extend([e.raw.start, e.raw.len]);
                encode_net(&mut w, e.net);
            }
            let words = len_word(w.len() - at);
            if let Some(slot) = w.get_mut(at + 1) {
                *slot = words;
            }
        }
        if !parts.pairs.is_empty() {
            flags |= flags::PAIRS;
            w.push(len_word(parts.pairs.len()));
            w.extend(parts.ends);
            for p in parts.pairs {
                w.extend([p.key.start, p.key.len, p.value.start, p.value.len]);
            }
        }
        if !parts.conditions.is_empty() {
            flags |= flags::CONDITIONS;
            w.push(len_word(parts.conditions.len()));
            for c in parts.conditions {
                for s in [Some(c.type_), Some(c.status), c.reason, c.message] {
                    push_span(&mut w, s);
                }
            }
        }
        if !parts.taints.is_empty() {
            flags |= flags::TAINTS;
            w.push(len_word(parts.taints.len()));
            for t in parts.taints {
                for s in [Some(t.key), t.value, Some(t.effect)] {
                    push_span(&mut w, s);
                }
            }
        }
        if let Some(first) = w.first_mut() {
            *first = flags;
        }
        Tables(w.into_boxed_slice())
    }

    /// The word at `i` (0 past the end).
    fn word(&self, i: usize) -> u32 {
        self.0.get(i).copied().unwrap_or(0)
    }

    /// The span at words `i` and `i + 1`.
    fn span(&self, i: usize) -> Span {
        Span {
            start: self.word(i),
            len: self.word(i + 1),
        }
    }

    /// The optional span at words `i` and `i + 1`.
    fn optional_span(&self, i: usize) -> Option<Span> {
        Some(self.span(i)).filter(|s| s.start != NONE)
    }

    /// The header's flags.
    pub(super) fn flags(&self) -> u32 {
        self.word(0)
    }

    /// Whether `flag` is set.
    pub(super) fn has(&self, flag: u32) -> bool {
        self.flags() & flag != 0
    }

    /// The lengths of the name, uid and resourceVersion, which start the buffer in that order.
    pub(super) fn lens(&self) -> [usize; 3] {
        [1, 2, 3].map(|i| count(self.word(i)))
    }

    fn sections(&self) -> Sections {
        let mut s = Sections::default();
        let mut at = HEADER;
        let mut section = |flag: u32, size: &dyn Fn(usize) -> usize| {
            if !self.has(flag) {
                return None;
            }
            let start = at;
            at = at.saturating_add(size(start));
            Some(start)
        };
        s.provider_id = section(flags::PROVIDER_ID, &|_| 2);
        s.capacity_pods = section(flags::CAPACITY_PODS, &|_| 1);
        s.pod_cidrs = section(flags::POD_CIDRS, &|i| count(self.word(i + 1)));
        s.pairs = section(flags::PAIRS, &|i| {
            4 + count(self.word(i)).saturating_mul(PAIR_WORDS)
        });
        s.conditions = section(flags::CONDITIONS, &|i| {
            1 + count(self.word(i)).saturating_mul(CONDITION_WORDS)
        });
        s.taints = section(flags::TAINTS, &|i| {
            1 + count(self.word(i)).saturating_mul(TAINT_WORDS)
        });
        s
    }

    /// `spec.providerID`'s span, if present.
    pub(super) fn provider_id(&self) -> Option<Span> {
        self.sections().provider_id.map(|i| self.span(i))
    }

    /// `status.capacity.pods`, 0 when absent.
    pub(super) fn capacity_pods(&self) -> u32 {
        self.sections().capacity_pods.map_or(0, |i| self.word(i))
    }

    /// The pod CIDR entries, in order.
    pub(super) fn pod_cidrs(&self) -> impl ExactSizeIterator<Item = CidrEntry> + '_ {
        let (n, first) = match self.sections().pod_cidrs {
            Some(i) => (count(self.word(i)), i + 2),
            None => (0, 0),
        };
        let mut at = first;
        (0..n).map(move |_| {
            let raw = self.span(at);
            let (net, words) = self.decode_net(at + 2);
            at = at + 2 + words;
            CidrEntry { raw, net }
        })
    }

    /// The network encoded from word `i`, and how many words it took.
    fn decode_net(&self, i: usize) -> (Option<IpNet>, usize) {
        let kind = self.word(i);
        let prefix = u8::try_from(kind >> 8).unwrap_or(u8::MAX);
        match kind & 0xff {
            V4 => {
                let addr = Ipv4Addr::from(self.word(i + 1));
                (Ipv4Net::new(addr, prefix).ok().map(IpNet::V4), 2)
            }
            V6 => {
                let bits =
                    (1..=4).fold(0_u128, |acc, k| (acc << 32) | u128::from(self.word(i + k)));
                let net = Ipv6Net::new(Ipv6Addr::from(bits), prefix).ok();
                (net.map(IpNet::V6), 5)
            }
            _ => (None, 1),
        }
    }

    /// The number of pairs and the ends of the first three lists among them.
    fn pair_bounds(&self) -> Option<(usize, usize, [u32; 3])> {
        let i = self.sections().pairs?;
        let n = count(self.word(i));
        Some((i + 4, n, [1, 2, 3].map(|k| self.word(i + k))))
    }

    /// The pairs' indexes of one list: `list` 0 addresses, 1 annotations, 2 owners, 3 labels.
    pub(super) fn pair_range(&self, list: usize) -> (usize, std::ops::Range<usize>) {
        let Some((first, n, ends)) = self.pair_bounds() else {
            return (0, 0..0);
        };
        let end = |k: usize| ends.get(k).map_or(n, |e| count(*e).min(n));
        let start = if list == 0 { 0 } else { end(list - 1) };
        let stop = if list >= 3 { n } else { end(list) };
        (first, start.min(stop)..stop)
    }

    /// The pair at index `k` of the pairs starting at word `first`.
    pub(super) fn pair(&self, first: usize, k: usize) -> Pair {
        let i = first + k * PAIR_WORDS;
        Pair {
            key: self.span(i),
            value: self.span(i + 2),
        }
    }

    /// The conditions, in order.
    pub(super) fn conditions(&self) -> impl ExactSizeIterator<Item = Condition<Span>> + '_ {
        let (first, n) = self.list(self.sections().conditions);
        (0..n).map(move |k| {
            let i = first + k * CONDITION_WORDS;
            Condition {
                type_: self.span(i),
                status: self.span(i + 2),
                reason: self.optional_span(i + 4),
                message: self.optional_span(i + 6),
            }
        })
    }

    /// The taints, in order.
    pub(super) fn taints(&self) -> impl ExactSizeIterator<Item = Taint<Span>> + '_ {
        let (first, n) = self.list(self.sections().taints);
        (0..n).map(move |k| {
            let i = first + k * TAINT_WORDS;
            Taint {
                key: self.span(i),
                value: self.optional_span(i + 2),
                effect: self.span(i + 4),
            }
        })
    }

    /// A counted section's first entry and number of entries.
    fn list(&self, section: Option<usize>) -> (usize, usize) {
        section.map_or((0, 0), |i| (i + 1, count(self.word(i))))
    }

    /// The table's size in words.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.0.len()
    }
}

/// A length as a word (a Node's lists are far below `u32::MAX`).
fn len_word(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

fn push_span(w: &mut Vec<u32>, span: Option<Span>) {
    match span {
        Some(s) => w.extend([s.start, s.len]),
        None => w.extend([NONE, 0]),
    }
}

fn encode_net(w: &mut Vec<u32>, net: Option<IpNet>) {
    match net {
        Some(IpNet::V4(n)) => {
            w.extend([V4 | (u32::from(n.prefix_len()) << 8), u32::from(n.addr())])
        }
        Some(IpNet::V6(n)) => {
            let bits = u128::from(n.addr());
            w.push(V6 | (u32::from(n.prefix_len()) << 8));
            // The address in four words, most significant first; each shift leaves 32 bits.
            w.extend([96, 64, 32, 0].map(|shift| (bits >> shift) as u32));
        }
        None => w.push(0),
    }
}

/// The exact size of `parts`' table, so it is allocated once.
fn words_needed(parts: &Parts<'_>) -> usize {
    let cidr_words: usize = parts
        .pod_cidrs
        .iter()
        .map(|e| match e.net {
            Some(IpNet::V4(_)) => 4,
            Some(IpNet::V6(_)) => 7,
            None => 3,
        })
        .sum();
    let section = |present: bool, words: usize| if present { words } else { 0 };
    HEADER
        + section(parts.provider_id.is_some(), 2)
        + section(parts.capacity_pods != 0, 1)
        + section(!parts.pod_cidrs.is_empty(), 2 + cidr_words)
        + section(!parts.pairs.is_empty(), 4 + parts.pairs.len() * PAIR_WORDS)
        + section(
            !parts.conditions.is_empty(),
            1 + parts.conditions.len() * CONDITION_WORDS,
        )
        + section(
            !parts.taints.is_empty(),
            1 + parts.taints.len() * TAINT_WORDS,
        )
}

#[cfg(test)]
mod tests {
    use super::super::CachedNode;
    use super::*;

    #[test]
    fn every_section_reads_back_as_written_with_the_ones_before_it_present_or_not() {
        for (provider, capacity) in [(false, false), (true, true), (false, true)] {
            let mut b = CachedNode::builder("node-a", "0b5c-uid", "4242");
            if provider {
                b.provider_id("aws:///eu-west-1a/i-0abc");
            }
            if capacity {
                b.capacity_pods("58");
            }
            b.pod_cidrs(&["fd00:10:244:1::7/64", "nonsense", "10.244.1.9/24"], None);
            for i in (0..40).rev() {
                b.annotation(&format!("example.com/a{i:02}"), &format!("v{i}"));
                b.label(&format!("l{i:02}"), &i.to_string());
            }
            b.condition(Condition {
                type_: "Ready",
                status: "True",
                reason: None,
                message: Some("up"),
            })
            .condition(Condition {
                type_: "NetworkUnavailable",
                status: "False",
                reason: Some("RouteCreated"),
                message: None,
            })
            .taint(Taint {
                key: "a",
                value: None,
                effect: "NoSchedule",
            })
            .taint(Taint {
                key: "b",
                value: Some(""),
                effect: "NoExecute",
            });
            let n = b.build();
            assert_eq!(
                (n.name(), n.uid(), n.resource_version()),
                ("node-a", "0b5c-uid", "4242")
            );
            assert_eq!(n.provider_id().is_some(), provider);
            assert_eq!(n.capacity_pods(), capacity.then_some(58));
            let entries: Vec<_> = n.pod_cidr_entries().map(|e| (e.raw, e.net)).collect();
            assert_eq!(
                entries,
                [
                    ("fd00:10:244:1::7/64", "fd00:10:244:1::7/64".parse().ok()),
                    ("nonsense", None),
                    ("10.244.1.9/24", "10.244.1.9/24".parse().ok()),
                ],
                "host bits kept, an entry that is no CIDR kept as written"
            );
            for i in 0..40 {
                let value = format!("v{i}");
                let key = format!("example.com/a{i:02}");
                assert_eq!(n.annotation(&key), Some(value.as_str()));
                assert_eq!(n.label(&format!("l{i:02}")), Some(i.to_string().as_str()));
            }
            assert_eq!((n.annotation("example.com/a40"), n.label("")), (None, None));
            assert_eq!(n.conditions().len(), 2);
            let ready = n.condition("Ready").expect("Ready");
            assert_eq!((ready.reason, ready.message), (None, Some("up")));
            let taints: Vec<_> = n.taints().map(|t| (t.key, t.value, t.effect)).collect();
            assert_eq!(
                taints,
                [("a", None, "NoSchedule"), ("b", Some(""), "NoExecute")],
                "an absent value is not an empty one"
            );
        }
    }

    #[test]
    fn a_node_with_nothing_declared_is_a_header_of_four_words() {
        let n = CachedNode::builder("n", "u", "1").build();
        assert_eq!(n.tables.len(), HEADER);
        assert_eq!(n.pod_cidr_entries().len() + n.addresses().len(), 0);
        assert_eq!((n.provider_id(), n.capacity_pods()), (None, None));
        assert_eq!(n.conditions().len() + n.taints().len(), 0);
    }

    #[test]
    fn a_table_cut_short_is_read_without_panicking_and_keeps_what_its_header_says() {
        let mut b = CachedNode::builder("n", "u", "1");
        b.pod_cidrs(&["10.0.0.0/24"], None).label("a", "b");
        let full = b.build();
        for len in 0..full.tables.len() {
            let cut = Tables(full.tables.0.iter().copied().take(len).collect());
            let n = CachedNode {
                text: full.text.clone(),
                tables: cut,
            };
            let _ = (n.pod_cidrs(), n.labels().count(), n.label("a"));
            // The lengths of the leading strings are words 1 to 3: the name reads once word 1 is there.
            assert_eq!(n.name(), if len >= 2 { "n" } else { "" }, "cut at {len}");
            // A word cut off reads as 0: a span of nothing, never a string out of another's bytes.
            let label = n.label("a");
            assert!(
                matches!(label, None | Some("b" | "")),
                "cut at {len}: {label:?}"
            );
        }
    }
}
