//! Which pod CIDRs overlap: the one sweep the tests, the campaign's checker and `assert_no_overlaps` use.

use ipnet::IpNet;

/// Every pair of CIDRs held by different holders that overlap, as ((holder, CIDR), (holder, CIDR)).
/// Sorted by start, each range is compared only with the earlier ones that still reach it, so disjoint
/// ranges cost O(n log n).
pub fn overlapping_pairs<K: Clone + PartialEq>(
    cidrs: impl IntoIterator<Item = (IpNet, K)>,
) -> Vec<((K, IpNet), (K, IpNet))> {
    let range = |net: &IpNet| -> (bool, u128, u128) {
        match net {
            IpNet::V4(n) => (
                false,
                u32::from(n.network()).into(),
                u32::from(n.broadcast()).into(),
            ),
            IpNet::V6(n) => (true, n.network().into(), n.broadcast().into()),
        }
    };
    let mut all: Vec<((bool, u128, u128), IpNet, K)> = cidrs
        .into_iter()
        .map(|(net, holder)| (range(&net), net, holder))
        .collect();
    all.sort_by_key(|(r, _, _)| (r.0, r.1));
    let mut pairs = Vec::new();
    let mut open: Vec<usize> = Vec::new();
    for k in 0..all.len() {
        let (v6, start, _) = all[k].0;
        open.retain(|&j| all[j].0 .0 == v6 && all[j].0 .2 >= start);
        for &j in &open {
            if all[j].2 != all[k].2 {
                pairs.push(((all[j].2.clone(), all[j].1), (all[k].2.clone(), all[k].1)));
            }
        }
        open.push(k);
    }
    pairs
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> IpNet {
        s.parse().expect("test CIDR")
    }

    #[test]
    fn nested_and_non_adjacent_overlaps_are_found_and_one_holders_own_ranges_are_not() {
        let pairs = overlapping_pairs([
            (net("10.0.0.0/16"), "big"),
            (net("10.0.1.0/24"), "a"),
            (net("10.0.2.0/24"), "b"),
            (net("10.1.0.0/24"), "c"),
            (net("10.1.0.0/25"), "c"),
            (net("fd00::/64"), "d"),
            (net("10.0.0.0/8"), "wide"),
        ]);
        let mut named: Vec<(&str, &str)> = pairs.iter().map(|((a, _), (b, _))| (*a, *b)).collect();
        named.sort();
        assert_eq!(
            named,
            vec![
                ("big", "a"),
                ("big", "b"),
                ("big", "wide"),
                ("wide", "a"),
                ("wide", "b"),
                ("wide", "c"),
                ("wide", "c"),
            ]
        );
    }
}
