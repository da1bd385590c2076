//! node-ipam-controller's tie-breaks (`multi_cidr_priority_queue.go`): pools that tie on matching
//! requirements, node CIDR count and mask are ranked by their selector's text, then their range's text.
//! The cases are upstream's `TestPriorityQueue`/`TestLess`, re-expressed as pools a Node selects.

use super::*;

/// A selector of one term: each key must exist.
fn keys(keys: &[&str]) -> NodeSelector {
    NodeSelector::Terms(vec![SelectorTerm {
        match_expressions: keys
            .iter()
            .map(|k| Requirement {
                key: k.to_string(),
                operator: "Exists".parse().unwrap(),
                values: vec![],
            })
            .collect(),
        match_fields: vec![],
    }])
}

/// The names of the pools a Node with every label in `labels` may use, most preferred first.
fn order(p: &Pools, with: &[&str]) -> Vec<String> {
    let l = labels(&with.iter().map(|k| (*k, "")).collect::<Vec<_>>());
    p.candidates(&NodeView {
        name: "n",
        labels: &l,
        provider_id: None,
    })
    .into_iter()
    .map(|i| p.reports()[i].name.clone())
    .collect()
}

#[test]
fn pools_tied_on_matches_size_and_mask_go_by_selector_text_then_range_text_not_by_name() {
    let mut p = pools("10.244.0.0/16", "");
    p.sync_objects(&[
        obj("cidr1", keys(&["foo"]), 8, "192.168.0.0/16", ""),
        obj("cidr2", keys(&["foo", "name2"]), 8, "10.1.0.0/24", ""),
        obj("cidr3", keys(&["foo", "name3"]), 8, "172.16.0.0/16", ""),
        obj("cidr4", keys(&["name4", "abc"]), 6, "10.1.1.0/26", ""),
        obj("cidr5", keys(&["foo", "name5"]), 6, "10.1.2.0/26", ""),
        obj("cidr6", keys(&["abc", "name4"]), 6, "10.1.3.0/26", ""),
    ]);
    let all = ["abc", "foo", "name2", "name3", "name4", "name5"];
    // Two matches before one; one node CIDR before 256; /26s before a /24; among the /26s "abc,name4"
    // before "foo,name5" (requirements are ordered by key), and of the two "abc,name4" the lower range.
    assert_eq!(
        order(&p, &all),
        [
            "cidr4",
            "cidr6",
            "cidr5",
            "cidr2",
            "cidr3",
            "cidr1",
            DEFAULT_POOL
        ]
    );
}

#[test]
fn the_selector_text_decides_before_the_range_and_ranges_compare_as_text() {
    let mut p = pools("10.244.0.0/16", "");
    p.sync_objects(&[
        obj("a-xyz-low", keys(&["xyz", "name"]), 6, "10.0.3.0/26", ""),
        obj("b-abc-high", keys(&["abc", "name"]), 6, "10.1.1.0/26", ""),
    ]);
    assert_eq!(
        order(&p, &["abc", "xyz", "name"]),
        ["b-abc-high", "a-xyz-low", DEFAULT_POOL]
    );
    // Upstream compares the ranges' text: "10.10.0.0/26" sorts before "10.9.0.0/26".
    let mut p = pools("10.244.0.0/16", "");
    p.sync_objects(&[
        obj("a-nine", keys(&["gpu"]), 6, "10.9.0.0/26", ""),
        obj("b-ten", keys(&["gpu"]), 6, "10.10.0.0/26", ""),
    ]);
    assert_eq!(order(&p, &["gpu"]), ["b-ten", "a-nine", DEFAULT_POOL]);
}
