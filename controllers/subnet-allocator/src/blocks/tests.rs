//! Tests of claim blocks: the grid, the quarantine and which blocks a leader may use.

use super::*;

fn net(s: &str) -> IpNet {
    s.parse().expect("test CIDR")
}

fn waiting(list: &[(&str, &str)]) -> HashMap<Box<str>, Box<str>> {
    list.iter()
        .map(|(n, u)| ((*n).into(), (*u).into()))
        .collect()
}

#[test]
fn a_block_is_a_256th_of_its_cluster_cidr_between_64_and_1024_node_cidrs() {
    // A /8 of /24s: 65,536 CIDRs in blocks of 256 (/16s).
    let slash8 = Some(net("10.0.0.0/8"));
    assert_eq!(block_of(net("10.1.77.0/24"), slash8), net("10.1.0.0/16"));
    assert_eq!(
        block_of(net("10.255.255.0/24"), slash8),
        net("10.255.0.0/16")
    );
    // A /12 of /24s (4,096 CIDRs): the floor of 64 (/18s).
    let slash12 = Some(net("10.0.0.0/12"));
    assert_eq!(block_of(net("10.1.77.0/24"), slash12), net("10.1.64.0/18"));
    // A /8 of /28s (1,048,576 CIDRs): the ceiling of 1,024 (/18s of /28s).
    assert_eq!(block_of(net("10.1.77.16/28"), slash8), net("10.1.64.0/18"));
    // A cluster CIDR smaller than a block is one block.
    assert_eq!(
        block_of(net("10.201.0.32/27"), Some(net("10.201.0.0/24"))),
        net("10.201.0.0/24")
    );
    // A /48 of /64s (65,536): blocks of 256 (/56s).
    assert_eq!(
        block_of(net("fd00:0:0:7f::/64"), Some(net("fd00::/48"))),
        net("fd00:0:0::/56")
    );
    // Outside any known cluster CIDR: 64.
    assert_eq!(block_of(net("10.1.77.0/24"), None), net("10.1.64.0/18"));
    assert_eq!(
        block_of(net("10.1.77.0/24"), Some(net("192.168.0.0/16"))),
        net("10.1.64.0/18")
    );
}

#[test]
fn the_block_claimed_ahead_is_the_next_one_once_half_of_the_current_is_handed_out() {
    let slash8 = net("10.0.0.0/8");
    // Blocks of 256 /24s (/16s): 10.1.0.0/24 … 10.1.127.0/24 are the first half.
    assert_eq!(claim_ahead_block(net("10.1.0.0/24"), slash8), None);
    assert_eq!(claim_ahead_block(net("10.1.127.0/24"), slash8), None);
    assert_eq!(
        claim_ahead_block(net("10.1.128.0/24"), slash8),
        Some(net("10.2.0.0/16"))
    );
    assert_eq!(
        claim_ahead_block(net("10.1.255.0/24"), slash8),
        Some(net("10.2.0.0/16"))
    );
    // The pool's last block has no next one, in either family.
    assert_eq!(claim_ahead_block(net("10.255.200.0/24"), slash8), None);
    assert_eq!(
        claim_ahead_block(net("fd00:0:0:ff80::/64"), net("fd00::/48")),
        None
    );
    assert_eq!(
        claim_ahead_block(net("fd00:0:0:180::/64"), net("fd00::/48")),
        Some(net("fd00:0:0:200::/56"))
    );
    // A cluster CIDR that is one block: nothing beyond it.
    assert_eq!(
        claim_ahead_block(net("10.201.0.224/27"), net("10.201.0.0/24")),
        None
    );
    // The top of the address space does not wrap around.
    assert_eq!(
        claim_ahead_block(net("255.255.255.0/24"), net("255.0.0.0/8")),
        None
    );
}

fn sizing(largest: u8, smallest: u8) -> Option<NodeSizing> {
    Some(NodeSizing::new(netcm_ipam::Family::V4, largest, smallest, largest).expect("test sizing"))
}

#[test]
fn every_size_of_a_sized_cluster_cidr_falls_on_one_grid_of_blocks() {
    // A /16 of /28s (4,096): blocks of 64 /28s, /22s, whatever the node CIDR's own size.
    let slash16 = Some(net("10.0.0.0/16"));
    for c in ["10.0.4.0/24", "10.0.5.32/27", "10.0.7.240/28"] {
        assert_eq!(
            block_of_sized(net(c), slash16, sizing(24, 28)),
            net("10.0.4.0/22"),
            "{c}"
        );
    }
    // Cut by their own prefixes, a /24's and a /28's blocks would differ (and nest).
    assert_ne!(
        block_of(net("10.0.4.0/24"), slash16),
        block_of(net("10.0.7.240/28"), slash16)
    );
}

#[test]
fn a_sized_block_is_never_smaller_than_the_largest_size() {
    // A /8 of /28s: 1,024 /28s make an /18, but a /16 may be handed out, so blocks are /16s.
    let slash8 = Some(net("10.0.0.0/8"));
    assert_eq!(
        block_of_sized(net("10.3.0.0/16"), slash8, sizing(16, 28)),
        net("10.3.0.0/16")
    );
    assert_eq!(
        block_of_sized(net("10.3.200.16/28"), slash8, sizing(16, 28)),
        net("10.3.0.0/16")
    );
    // A CIDR wider than every size (an earlier configuration's) is its own block.
    assert_eq!(
        block_of_sized(net("10.4.0.0/15"), slash8, sizing(16, 28)),
        net("10.4.0.0/15")
    );
}

#[test]
fn without_sizing_or_a_cluster_cidr_sized_blocks_are_the_fixed_ones() {
    let slash12 = Some(net("10.0.0.0/12"));
    for c in ["10.1.77.0/24", "10.1.77.16/28"] {
        assert_eq!(
            block_of_sized(net(c), slash12, None),
            block_of(net(c), slash12)
        );
        assert_eq!(
            block_of_sized(net(c), None, sizing(24, 28)),
            block_of(net(c), None)
        );
    }
}

#[test]
fn the_block_claimed_ahead_of_a_sized_cidr_is_the_next_on_its_grid() {
    let slash16 = net("10.0.0.0/16");
    assert_eq!(
        claim_ahead_block_sized(net("10.0.5.0/24"), slash16, sizing(24, 28)),
        None
    );
    assert_eq!(
        claim_ahead_block_sized(net("10.0.6.0/24"), slash16, sizing(24, 28)),
        Some(net("10.0.8.0/22"))
    );
    assert_eq!(
        claim_ahead_block_sized(net("10.0.7.240/28"), slash16, sizing(24, 28)),
        Some(net("10.0.8.0/22"))
    );
}

#[test]
fn block_sizes_stay_between_the_floor_and_the_ceiling() {
    for pool_bits in 0..=64 {
        let bits = block_bits(pool_bits);
        assert!(
            (MIN_BLOCK_BITS..=MAX_BLOCK_BITS).contains(&bits),
            "{pool_bits}: {bits}"
        );
    }
    assert_eq!(block_bits(16), 8);
    assert_eq!(block_bits(14), MIN_BLOCK_BITS);
    assert_eq!(block_bits(20), MAX_BLOCK_BITS);
}

#[test]
fn the_fence_pointer_is_the_annotation_escaped_as_json_pointer() {
    let escaped = FENCED_AT_ANNOTATION.replace('~', "~0").replace('/', "~1");
    assert_eq!(
        FENCED_AT_POINTER,
        format!("/metadata/annotations/{escaped}")
    );
}

fn open(range: &str, term: &str) -> ListedBlock {
    ListedBlock {
        range: net(range),
        term: Some(term.into()),
        idle: false,
        idle_since: None,
    }
}

fn idle(range: &str) -> ListedBlock {
    ListedBlock {
        range: net(range),
        term: Some("t0".into()),
        idle: true,
        idle_since: Some("2026-11-26T00:00:00Z".into()),
    }
}

#[test]
fn without_waiting_nodes_every_listed_claim_is_adoptable_at_once() {
    let b = Blocks::start(vec![open("10.0.0.0/18", "t1")], waiting(&[]));
    assert!(b.is_adoptable(&net("10.0.0.0/18")));
    assert!(!b.is_usable(&net("10.0.0.0/18")), "not before its adoption");
    assert_eq!(b.waiting_nodes(), 0);
    assert!(b.quarantined_ranges().is_empty());
}

#[test]
fn earlier_claims_stay_quarantined_until_every_waiting_node_is_settled() {
    let mut b = Blocks::start(
        vec![open("10.0.0.0/18", "t1")],
        waiting(&[("a", "a1"), ("b", "b1"), ("c", "c1")]),
    );
    assert!(!b.is_usable(&net("10.0.0.0/18")));
    assert!(!b.is_adoptable(&net("10.0.0.0/18")));
    assert_eq!(b.quarantined_ranges(), [net("10.0.0.0/18")]);
    assert_eq!(b.settle("a", Some("a1"), false), None, "still waiting");
    assert_eq!(b.settle("other", Some("o1"), true), None);
    assert_eq!(b.waiting_nodes(), 3);
    assert_eq!(b.settle("a", Some("a1"), true), None, "a has CIDRs");
    assert_eq!(b.settle("b", None, false), None, "b is gone");
    assert_eq!(b.waiting_nodes(), 1);
    assert_eq!(
        b.settle("c", Some("c2"), false),
        Some(vec![net("10.0.0.0/18")]),
        "c was re-created: the last one settled ends the quarantine"
    );
    assert!(b.is_adoptable(&net("10.0.0.0/18")));
    assert!(b.quarantined_ranges().is_empty());
}

#[test]
fn idle_claims_are_never_quarantined_even_with_nodes_waiting() {
    let b = Blocks::start(
        vec![idle("10.0.0.0/18"), open("10.0.64.0/18", "t1")],
        waiting(&[("a", "a1")]),
    );
    assert!(b.is_adoptable(&net("10.0.0.0/18")));
    assert_eq!(b.quarantined_ranges(), [net("10.0.64.0/18")]);
    assert_eq!(
        b.to_mark_idle("t2"),
        [(net("10.0.0.0/18"), "t0".into())],
        "the idle claim it did not use is marked again (the next leader trusts only this term's marks); \
         the quarantined one stays open"
    );
}

#[test]
fn touching_every_waiting_node_ends_the_quarantine_without_giving_them_cidrs() {
    let mut b = Blocks::start(
        vec![open("10.0.0.0/18", "t1")],
        waiting(&[("a", "a1"), ("b", "b1")]),
    );
    let mut w = b.waiting();
    w.sort();
    assert_eq!(w, [("a".into(), "a1".into()), ("b".into(), "b1".into())]);
    assert_eq!(b.voided("a"), None);
    assert_eq!(b.voided("b"), Some(vec![net("10.0.0.0/18")]));
    assert!(b.is_adoptable(&net("10.0.0.0/18")));
    assert!(b.waiting().is_empty());
    assert_eq!(b.voided("b"), None, "no quarantine any more");
}

#[test]
fn a_block_found_claimed_joins_the_quarantine_or_is_adopted_after_it() {
    let mut b = Blocks::start(vec![open("10.0.0.0/18", "t1")], waiting(&[("a", "a1")]));
    b.taken_into_use(net("10.0.128.0/18"));
    assert!(b.is_usable(&net("10.0.128.0/18")));
    assert_eq!(
        b.found_existing(net("10.0.64.0/18")).map(<[_]>::to_vec),
        Some(vec![net("10.0.0.0/18"), net("10.0.64.0/18")])
    );
    assert!(!b.is_usable(&net("10.0.64.0/18")));
    assert!(b.settle("a", Some("a1"), true).is_some());
    assert!(b.is_adoptable(&net("10.0.64.0/18")));
    assert!(b.is_usable(&net("10.0.128.0/18")), "created stays usable");
    assert_eq!(b.found_existing(net("10.0.192.0/18")), None, "to adopt");
    b.taken_into_use(net("10.0.64.0/18"));
    assert!(b.is_usable(&net("10.0.64.0/18")));
    assert!(!b.is_adoptable(&net("10.0.64.0/18")));
}

#[test]
fn a_stepping_down_leader_marks_idle_only_blocks_whose_every_write_was_answered() {
    let mut b = Blocks::start(vec![open("10.0.0.0/18", "t1")], waiting(&[]));
    for block in ["10.0.64.0/18", "10.0.128.0/18", "10.0.192.0/18"] {
        b.taken_into_use(net(block));
    }
    b.write_started(&[net("10.0.64.0/18")]);
    b.write_ended(&[net("10.0.64.0/18")], true);
    b.write_started(&[net("10.0.128.0/18")]);
    b.write_ended(&[net("10.0.128.0/18")], false);
    b.write_started(&[net("10.0.192.0/18")]);
    let mut idle = b.to_mark_idle("t2");
    idle.sort();
    assert_eq!(
        idle,
        [
            (net("10.0.0.0/18"), "t1".into()),
            (net("10.0.64.0/18"), "t2".into()),
        ],
        "the earlier term's unused block under its own term, this term's answered block under this one; \
         not the block with an unanswered write, nor the one with a write on its way"
    );
    b.write_ended(&[net("10.0.128.0/18")], true);
    assert!(
        !b.to_mark_idle("t2")
            .contains(&(net("10.0.128.0/18"), "t2".into())),
        "an answer to a later write does not make an earlier unanswered one safe"
    );
}
