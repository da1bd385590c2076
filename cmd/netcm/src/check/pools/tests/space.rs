//! The `space` lines: per pool and family, the largest block it can still hand out and its free blocks.

use super::*;

fn space_lines(f: &[Finding]) -> Vec<&str> {
    f.iter()
        .filter(|f| f.check == "space")
        .map(|f| f.message.as_str())
        .collect()
}

#[test]
fn every_pool_says_the_largest_block_it_can_hand_out_and_its_free_blocks() {
    let mut s = snapshot(
        "10.244.0.0/16",
        vec![
            node("a", "192.0.2.1", &["10.244.0.0/24"]),
            node("rack", "192.0.2.2", &["10.128.0.0/24"]),
        ],
    );
    s.object_pools = ObjectPoolsState::Listed(vec![cluster_cidr_object("rack-a", "10.128.0.0/20")]);
    let f = run(&s);
    assert_eq!(
        space_lines(&f),
        [
            "pool default-cluster-cidr (IPv4): can hand out a /24 at most; free: 255 × /24",
            "pool rack-a (IPv4): can hand out a /24 at most; free: 15 × /24",
        ],
        "{f:#?}"
    );
    assert!(f
        .iter()
        .filter(|f| f.check == "space")
        .all(|f| f.status == Status::Ok));
}

#[test]
fn a_full_pool_can_hand_out_no_block() {
    let s = snapshot(
        "10.244.0.0/23",
        vec![
            node("a", "192.0.2.1", &["10.244.0.0/24"]),
            node("b", "192.0.2.2", &["10.244.1.0/24"]),
        ],
    );
    let f = run(&s);
    assert_eq!(
        space_lines(&f),
        ["pool default-cluster-cidr (IPv4): can hand out no block (full, or draining); free: 0 × /24"]
    );
}
