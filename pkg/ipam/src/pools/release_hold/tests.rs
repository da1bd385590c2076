//! Tests of the release hold: held CIDRs stay out of allocation, come back to their Node (by providerID
//! only when that is on), go early only from a full pool and only where that makes room, wait out a
//! reservation over them, and end on time; every ending is kept with why.

use std::time::{Duration, Instant};

use super::*;
use crate::config::{AllocatorConfig, AllocatorFlags, SizingFlags};
use crate::test_fixtures::{net, nets, pools};
use crate::NodeView;

const HOLD: Duration = Duration::from_secs(60);

fn view(name: &str) -> (String, std::collections::BTreeMap<String, String>) {
    (name.to_string(), std::collections::BTreeMap::new())
}

fn allocate(p: &mut Pools, uid: &str, name: &str) -> crate::NodeAllocation {
    allocate_on(p, uid, name, None)
}

fn allocate_on(
    p: &mut Pools,
    uid: &str,
    name: &str,
    provider_id: Option<&str>,
) -> crate::NodeAllocation {
    let (name, labels) = view(name);
    p.allocate_for(
        uid,
        &NodeView {
            name: &name,
            labels: &labels,
            provider_id,
        },
    )
    .unwrap()
}

/// Four /24s: a, b, c and d hold them in order.
fn full_pool() -> Pools {
    let mut p = pools("10.0.0.0/22", "");
    for n in ["a", "b", "c", "d"] {
        allocate(&mut p, &format!("uid-{n}"), n);
    }
    p
}

#[test]
fn a_held_cidr_goes_to_no_other_node_while_another_is_free() {
    let mut p = pools("10.0.0.0/22", "");
    allocate(&mut p, "uid-a", "a");
    let now = Instant::now();
    assert_eq!(
        p.release_node_with_hold("uid-a", "a", None, now + HOLD),
        nets(&["10.0.0.0/24"])
    );
    for (uid, name) in [("uid-b", "b"), ("uid-c", "c"), ("uid-d", "d")] {
        let got = allocate(&mut p, uid, name);
        assert_ne!(got.cidrs, nets(&["10.0.0.0/24"]), "{name} got a held CIDR");
        assert_eq!(got.release_hold, None);
    }
    assert_eq!(p.stats()[0].release_hold, 1);
}

#[test]
fn a_node_that_comes_back_under_its_name_gets_its_cidr_again() {
    let mut p = full_pool();
    let now = Instant::now();
    p.release_node_with_hold("uid-b", "b", None, now + HOLD);
    p.release_node_with_hold("uid-c", "c", None, now + HOLD);
    // Round-robin would give the re-joined c the first free CIDR, b's.
    let back = allocate(&mut p, "uid-c2", "c");
    assert_eq!(back.cidrs, nets(&["10.0.2.0/24"]));
    assert_eq!(
        back.release_hold,
        Some(ReleaseHoldUse {
            released_by: "c".into(),
            early: false
        })
    );
    assert!(back.fresh.is_empty());
    assert_eq!(p.held_by("uid-c2"), Some(&nets(&["10.0.2.0/24"])[..]));
    assert_eq!(p.stats()[0].release_hold, 1, "b's hold is still running");
}

#[test]
fn a_full_pool_hands_out_the_oldest_held_cidr_early_and_says_so() {
    let mut p = full_pool();
    let now = Instant::now();
    p.release_node_with_hold("uid-c", "c", None, now + HOLD + Duration::from_secs(1));
    p.release_node_with_hold("uid-a", "a", None, now + HOLD);
    let got = allocate(&mut p, "uid-e", "e");
    assert_eq!(got.cidrs, nets(&["10.0.0.0/24"]), "a's hold ends first");
    assert_eq!(
        got.release_hold,
        Some(ReleaseHoldUse {
            released_by: "a".into(),
            early: true
        })
    );
    assert_eq!(allocate(&mut p, "uid-f", "f").cidrs, nets(&["10.0.2.0/24"]));
    let (name, labels) = view("g");
    let full = p.allocate_for(
        "uid-g",
        &NodeView {
            name: &name,
            labels: &labels,
            provider_id: None,
        },
    );
    assert!(matches!(full, Err(crate::Error::Full { .. })), "{full:?}");
}

#[test]
fn a_hold_that_ends_frees_its_cidr_and_no_earlier() {
    let mut p = full_pool();
    let now = Instant::now();
    p.release_node_with_hold("uid-b", "b", None, now + HOLD);
    assert_eq!(p.next_release_hold_end(), Some(now + HOLD));
    assert!(p
        .end_release_holds(now + HOLD - Duration::from_millis(1))
        .is_empty());
    assert_eq!(
        p.end_release_holds(now + HOLD),
        vec![("b".to_string(), nets(&["10.0.1.0/24"]))]
    );
    assert_eq!(p.next_release_hold_end(), None);
    assert_eq!(p.stats()[0].release_hold, 0);
    let got = allocate(&mut p, "uid-e", "e");
    assert_eq!(got.cidrs, nets(&["10.0.1.0/24"]));
    assert_eq!(got.release_hold, None);
    // A Node called b now is new: nothing of the old b's is left to give it.
    assert!(p.held_by(&release_hold_owner("b")).is_none());
}

#[test]
fn a_held_cidr_that_no_longer_fits_its_node_ends_its_hold_instead_of_coming_back() {
    let mut p = pools("10.0.0.0/22", "");
    allocate(&mut p, "uid-a", "a");
    // As if a's CIDR was one the ledger recorded from the API, outside every cluster CIDR.
    p.record("uid-x", &[net("192.168.7.0/24")]);
    p.release_node_with_hold("uid-x", "x", None, Instant::now() + HOLD);
    assert_eq!(
        p.stats()[0].release_hold,
        0,
        "outside the pool's cluster CIDR"
    );
    let got = allocate(&mut p, "uid-x2", "x");
    assert_eq!(got.cidrs, nets(&["10.0.1.0/24"]));
    assert_eq!(got.release_hold, None);
    assert!(p.release_holds().next().is_none());
}

#[test]
fn a_node_deleted_twice_within_the_hold_keeps_only_its_latest_cidrs_held() {
    let mut p = pools("10.0.0.0/22", "");
    allocate(&mut p, "uid-a", "a");
    let now = Instant::now();
    p.release_node_with_hold("uid-a", "a", None, now + HOLD);
    // a comes back, is given its CIDR, then moves (say, recorded from the API) and is deleted again.
    allocate(&mut p, "uid-a2", "a");
    p.release_node_with_hold("uid-a2", "a", None, now + 2 * HOLD);
    let held: Vec<_> = p
        .release_holds()
        .map(|(n, c)| (n.to_string(), c.to_vec()))
        .collect();
    assert_eq!(held, vec![("a".to_string(), nets(&["10.0.0.0/24"]))]);
    assert_eq!(p.next_release_hold_end(), Some(now + 2 * HOLD));
}

#[test]
fn releasing_an_owner_that_holds_nothing_starts_no_hold() {
    let mut p = pools("10.0.0.0/22", "");
    assert!(p
        .release_node_with_hold("uid-none", "n", None, Instant::now() + HOLD)
        .is_empty());
    assert_eq!(p.next_release_hold_end(), None);
}

#[test]
fn a_node_recorded_from_the_api_with_a_held_cidr_ends_the_hold_instead_of_conflicting() {
    let mut p = full_pool();
    p.release_node_with_hold("uid-b", "b", None, Instant::now() + HOLD);
    // b re-created from a backup that kept spec.podCIDR: what the API says wins.
    p.record_node("uid-b2", &nets(&["10.0.1.0/24"]));
    let findings = p.findings_of("uid-b2");
    assert!(findings.is_empty(), "{findings:?}");
    assert!(p.release_holds().next().is_none());
    assert_eq!(p.held_by("uid-b2"), Some(&nets(&["10.0.1.0/24"])[..]));
}

#[test]
fn a_restored_hold_keeps_its_cidr_and_comes_back_to_its_name_but_only_if_it_is_free() {
    let mut p = pools("10.0.0.0/22", "");
    allocate(&mut p, "uid-a", "a");
    let until = Instant::now() + HOLD;
    assert!(
        !p.restore_release_hold("gone", None, &nets(&["10.0.0.0/24"]), until),
        "a Node holds it: the record outlived its hold"
    );
    assert!(
        !p.restore_release_hold("gone", None, &nets(&["10.0.0.0/25"]), until),
        "not a node CIDR of any pool today"
    );
    assert!(p.restore_release_hold("b", None, &nets(&["10.0.1.0/24"]), until));
    assert!(
        !p.restore_release_hold("b", None, &nets(&["10.0.2.0/24"]), until),
        "one hold per name"
    );
    assert_eq!(allocate(&mut p, "uid-c", "c").cidrs, nets(&["10.0.2.0/24"]));
    assert_eq!(allocate(&mut p, "uid-b", "b").cidrs, nets(&["10.0.1.0/24"]));
}

#[test]
fn a_reservation_over_a_held_cidr_keeps_the_hold() {
    let mut p = full_pool();
    p.release_node_with_hold("uid-b", "b", None, Instant::now() + HOLD);
    // As the quarantine of earlier leaders' blocks does: it may cover held CIDRs.
    p.record_and_check("claim:quarantine", &nets(&["10.0.0.0/22"]));
    assert_eq!(p.release_holds().count(), 1);
}

#[test]
fn a_node_back_under_another_name_with_the_same_provider_id_gets_the_cidr_its_machine_held() {
    let mut p = pools("10.0.0.0/22", "");
    p.set_rejoin_by_provider_id(true);
    allocate_on(&mut p, "uid-a", "ip-10-1-2-3", Some("aws:///az/i-1"));
    allocate_on(&mut p, "uid-b", "b", Some("aws:///az/i-2"));
    let until = Instant::now() + HOLD;
    let held = p.release_node_with_hold("uid-a", "ip-10-1-2-3", Some("aws:///az/i-1"), until);
    assert_eq!(
        p.release_hold_provider_id("ip-10-1-2-3"),
        Some("aws:///az/i-1")
    );
    let other = allocate_on(&mut p, "uid-c", "c", Some("aws:///az/i-3"));
    assert_ne!(other.cidrs, held, "another machine does not get it");
    let back = allocate_on(&mut p, "uid-a2", "ip-10-9-9-9", Some("aws:///az/i-1"));
    assert_eq!(back.cidrs, held);
    assert_eq!(
        back.release_hold,
        Some(ReleaseHoldUse {
            released_by: "ip-10-1-2-3".into(),
            early: false,
        })
    );
    assert_eq!(
        p.release_holds().count(),
        0,
        "the hold ended when it was given back"
    );
    assert_eq!(p.release_hold_provider_id("ip-10-1-2-3"), None);
}

#[test]
fn the_name_wins_over_the_provider_id_and_an_empty_provider_id_matches_nothing() {
    let mut p = pools("10.0.0.0/22", "");
    p.set_rejoin_by_provider_id(true);
    allocate_on(&mut p, "uid-a", "a", Some("id-1"));
    allocate_on(&mut p, "uid-b", "b", Some(""));
    allocate_on(&mut p, "uid-x", "x", None);
    let until = Instant::now() + HOLD;
    let held_a = p.release_node_with_hold("uid-a", "a", Some("id-1"), until);
    let held_b = p.release_node_with_hold("uid-b", "b", Some(""), until);
    // "b" back with a's providerID: its own name's hold comes first.
    let b = allocate_on(&mut p, "uid-b2", "b", Some("id-1"));
    assert_eq!(b.cidrs, held_b);
    let y = allocate_on(&mut p, "uid-y", "y", Some(""));
    assert_ne!(y.cidrs, held_a, "an empty providerID is no machine");
    assert_eq!(
        allocate_on(&mut p, "uid-a2", "a2", Some("id-1")).cidrs,
        held_a
    );
}

#[test]
fn a_restored_hold_keeps_its_provider_id() {
    let mut p = pools("10.0.0.0/22", "");
    p.set_rejoin_by_provider_id(true);
    let until = Instant::now() + HOLD;
    assert!(p.restore_release_hold("old", Some("id-9"), &nets(&["10.0.2.0/24"]), until));
    assert_eq!(
        allocate_on(&mut p, "uid-n", "new", Some("id-9")).cidrs,
        nets(&["10.0.2.0/24"])
    );
}

/// Why each hold ended since the last look, by Node name, oldest first.
fn ended(p: &mut Pools) -> Vec<(String, ReleaseHoldEnd)> {
    p.take_ended_release_holds()
        .into_iter()
        .map(|e| (e.node, e.why))
        .collect()
}

fn ends(list: &[(&str, ReleaseHoldEnd)]) -> Vec<(String, ReleaseHoldEnd)> {
    list.iter().map(|(n, w)| (n.to_string(), *w)).collect()
}

#[test]
fn a_copied_provider_id_takes_nothing_unless_re_joining_by_it_is_on() {
    let mut p = pools("10.0.0.0/22", "");
    allocate_on(&mut p, "uid-a", "a", Some("aws:///az/i-1"));
    let held = p.release_node_with_hold("uid-a", "a", Some("aws:///az/i-1"), Instant::now() + HOLD);
    assert_eq!(
        p.release_hold_provider_id("a"),
        None,
        "not even kept while off"
    );
    // Another machine registered with a's providerID (copied, or baked into its image).
    let stranger = allocate_on(&mut p, "uid-x", "x", Some("aws:///az/i-1"));
    assert_ne!(stranger.cidrs, held);
    assert_eq!(stranger.release_hold, None);
    assert_eq!(p.release_holds().count(), 1, "a's hold runs on");
    assert_eq!(allocate(&mut p, "uid-a2", "a").cidrs, held);
}

#[test]
fn a_full_pool_ends_only_a_hold_that_makes_room_not_one_a_reservation_covers() {
    let mut p = full_pool();
    let now = Instant::now();
    p.release_node_with_hold("uid-a", "a", None, now + HOLD);
    p.release_node_with_hold("uid-b", "b", None, now + HOLD + Duration::from_secs(1));
    // A new leader's quarantine covers a's CIDR: ending a's hold would free nothing.
    p.record_and_check("claim:quarantine", &nets(&["10.0.0.0/24"]));
    let got = allocate(&mut p, "uid-e", "e");
    assert_eq!(got.cidrs, nets(&["10.0.1.0/24"]));
    assert_eq!(
        got.release_hold,
        Some(ReleaseHoldUse {
            released_by: "b".into(),
            early: true
        })
    );
    assert_eq!(ended(&mut p), ends(&[("b", ReleaseHoldEnd::HandedOut)]));
    let left: Vec<&str> = p.release_holds().map(|(n, _)| n).collect();
    assert_eq!(left, ["a"]);
    // Nothing else can make room: the pool is full, and a's hold runs on.
    let (name, labels) = view("f");
    let full = p.allocate_for(
        "uid-f",
        &NodeView {
            name: &name,
            labels: &labels,
            provider_id: None,
        },
    );
    assert!(matches!(full, Err(crate::Error::Full { .. })), "{full:?}");
    assert_eq!(p.release_holds().count(), 1);
    assert!(ended(&mut p).is_empty());
}

#[test]
fn a_hold_of_the_other_family_is_not_ended_for_a_family_that_is_full() {
    let flags = AllocatorFlags {
        cluster_cidr: "10.0.0.0/23,fd00::/62".into(),
        node_cidr_mask_size_ipv4: Some(24),
        node_cidr_mask_size_ipv6: Some(64),
        ..AllocatorFlags::default()
    };
    let mut p = Pools::new(&AllocatorConfig::from_flags(&flags).unwrap()).unwrap();
    allocate(&mut p, "uid-a", "a");
    allocate(&mut p, "uid-b", "b");
    // x held an IPv6 CIDR only (as the API showed it), and its hold is the oldest.
    p.record_node("uid-x", &nets(&["fd00:0:0:2::/64"]));
    let now = Instant::now();
    p.release_node_with_hold("uid-x", "x", None, now + HOLD);
    p.release_node_with_hold("uid-a", "a", None, now + HOLD + Duration::from_secs(1));
    let got = allocate(&mut p, "uid-c", "c");
    assert_eq!(got.cidrs[0], net("10.0.0.0/24"), "a's hold made room");
    assert_eq!(ended(&mut p), ends(&[("a", ReleaseHoldEnd::HandedOut)]));
    assert_eq!(p.release_holds().map(|(n, _)| n).collect::<Vec<_>>(), ["x"]);
}

/// A /23 sized from capacity, /24 to /26: 10.0.0.0/24 for a 110-pod Node `big`, and four /26s of 30-pod
/// Nodes `s0`..`s3` filling 10.0.1.0/24.
fn sized_full() -> Pools {
    let flags = AllocatorFlags {
        cluster_cidr: "10.0.0.0/23".into(),
        ..AllocatorFlags::default()
    };
    let sizing = SizingFlags {
        size_from_pods: true,
        min_mask_ipv4: Some(24),
        max_mask_ipv4: Some(26),
    };
    let config = AllocatorConfig::from_flags(&flags)
        .unwrap()
        .with_sizing(&sizing)
        .unwrap();
    let mut p = Pools::new(&config).unwrap();
    assert_eq!(
        sized_alloc(&mut p, "big", 110).unwrap().cidrs,
        nets(&["10.0.0.0/24"])
    );
    for i in 0..4 {
        let got = sized_alloc(&mut p, &format!("s{i}"), 30).unwrap();
        assert_eq!(got.cidrs[0].prefix_len(), 26);
    }
    p
}

fn sized_alloc(
    p: &mut Pools,
    name: &str,
    pods: u64,
) -> Result<crate::NodeAllocation, crate::Error> {
    let (name, labels) = view(name);
    p.allocate_sized_for(
        &format!("uid-{name}"),
        &NodeView {
            name: &name,
            labels: &labels,
            provider_id: None,
        },
        Some(pods),
    )
}

#[test]
fn a_small_hold_is_not_ended_for_a_larger_block_it_cannot_free_but_is_for_its_own_size() {
    let mut p = sized_full();
    let held = p.release_node_with_hold("uid-s0", "s0", None, Instant::now() + HOLD);
    assert_eq!(held, nets(&["10.0.1.0/26"]));
    // s1..s3 still hold the rest of 10.0.1.0/24: no /24 can be freed.
    let big = sized_alloc(&mut p, "big2", 110);
    assert!(
        matches!(big, Err(crate::Error::NoBlockOfSize { prefix_len: 24, .. })),
        "{big:?}"
    );
    assert_eq!(p.release_holds().count(), 1, "s0's hold runs on");
    assert!(ended(&mut p).is_empty());
    let small = sized_alloc(&mut p, "small", 30).unwrap();
    assert_eq!(small.cidrs, held);
    assert_eq!(ended(&mut p), ends(&[("s0", ReleaseHoldEnd::HandedOut)]));
}

#[test]
fn several_holds_end_together_only_when_none_alone_makes_room_and_the_oldest_first() {
    let mut p = sized_full();
    let now = Instant::now();
    for (i, n) in ["s3", "s1", "s0", "s2"].iter().enumerate() {
        p.release_node_with_hold(
            &format!("uid-{n}"),
            n,
            None,
            now + HOLD + Duration::from_secs(i as u64),
        );
    }
    let got = sized_alloc(&mut p, "big2", 110).unwrap();
    assert_eq!(got.cidrs, nets(&["10.0.1.0/24"]), "the four /26s together");
    let mut why = ended(&mut p);
    why.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        why,
        ends(&[
            ("s0", ReleaseHoldEnd::HandedOut),
            ("s1", ReleaseHoldEnd::HandedOut),
            ("s2", ReleaseHoldEnd::HandedOut),
            ("s3", ReleaseHoldEnd::HandedOut),
        ])
    );
    // With a hold that makes room alone and is the oldest, only that one ends.
    let mut p = sized_full();
    p.release_node_with_hold("uid-big", "big", None, now + HOLD);
    for (i, n) in ["s0", "s1", "s2", "s3"].iter().enumerate() {
        p.release_node_with_hold(
            &format!("uid-{n}"),
            n,
            None,
            now + HOLD + Duration::from_secs(1 + i as u64),
        );
    }
    let got = sized_alloc(&mut p, "big2", 110).unwrap();
    assert_eq!(got.cidrs, nets(&["10.0.0.0/24"]));
    assert_eq!(ended(&mut p), ends(&[("big", ReleaseHoldEnd::HandedOut)]));
    assert_eq!(p.release_holds().count(), 4);
}

#[test]
fn a_node_back_while_a_reservation_covers_its_held_cidr_waits_for_it_and_no_stranger_gets_it() {
    let mut p = pools("10.0.0.0/22", "");
    let until = Instant::now() + HOLD;
    // As a new leader does: the hold restored from its record, then the quarantine over the old blocks.
    assert!(p.restore_release_hold("b", None, &nets(&["10.0.1.0/24"]), until));
    p.record_and_check("claim:quarantine", &nets(&["10.0.0.0/23"]));
    let (name, labels) = view("b");
    let b = NodeView {
        name: &name,
        labels: &labels,
        provider_id: None,
    };
    let waiting = p.allocate_sized_for("uid-b", &b, None);
    assert_eq!(
        waiting,
        Err(crate::Error::ReleaseHoldReserved {
            node: "b".into(),
            released_by: "b".into(),
            cidrs: nets(&["10.0.1.0/24"]),
            by: vec!["claim:quarantine".into()],
        })
    );
    assert_eq!(p.held_by("uid-b"), None);
    assert_eq!(p.release_holds().count(), 1, "the hold runs on");
    assert_eq!(allocate(&mut p, "uid-c", "c").cidrs, nets(&["10.0.2.0/24"]));
    // The quarantine ends: b gets its own CIDR back.
    p.release_node("claim:quarantine");
    let back = p.allocate_sized_for("uid-b", &b, None).unwrap();
    assert_eq!(back.cidrs, nets(&["10.0.1.0/24"]));
    assert_eq!(ended(&mut p), ends(&[("b", ReleaseHoldEnd::GivenBack)]));
}

#[test]
fn a_node_that_cannot_wait_for_its_reserved_cidr_gets_new_ones_and_its_hold_runs_on() {
    let mut p = pools("10.0.0.0/22", "");
    let until = Instant::now() + HOLD;
    assert!(p.restore_release_hold("b", None, &nets(&["10.0.1.0/24"]), until));
    p.record_and_check("claim:refused", &nets(&["10.0.1.0/24"]));
    let (name, labels) = view("b");
    let b = NodeView {
        name: &name,
        labels: &labels,
        provider_id: None,
    };
    let got = p.allocate_sized_past_hold("uid-b", &b, None).unwrap();
    assert_eq!(got.cidrs, nets(&["10.0.0.0/24"]));
    assert_eq!(got.release_hold, None);
    assert_eq!(p.release_holds().count(), 1);
    assert!(ended(&mut p).is_empty());
}

#[test]
fn every_hold_that_ends_is_kept_with_why() {
    let mut p = full_pool();
    let now = Instant::now();
    p.release_node_with_hold("uid-a", "a", None, now + HOLD);
    p.release_node_with_hold("uid-b", "b", None, now + 2 * HOLD);
    p.release_node_with_hold("uid-c", "c", None, now + 2 * HOLD);
    // b back under its name; the API shows c's CIDR on another Node; a runs its time.
    allocate(&mut p, "uid-b2", "b");
    p.record_node("uid-y", &nets(&["10.0.2.0/24"]));
    p.end_release_holds(now + HOLD);
    // b deleted again, then again with other CIDRs: the newer hold replaces the older.
    p.release_node_with_hold("uid-b2", "b", None, now + 2 * HOLD);
    p.record("uid-b3", &nets(&["10.0.0.0/24"]));
    p.release_node_with_hold("uid-b3", "b", None, now + 2 * HOLD);
    // A hold that no longer fits its Node (recorded from the API outside every pool).
    p.record("uid-z", &nets(&["192.168.0.0/24"]));
    p.release_node_with_hold("uid-z", "z", None, now + HOLD);
    allocate(&mut p, "uid-z2", "z");
    let all = p.take_ended_release_holds();
    let why: Vec<(&str, ReleaseHoldEnd)> = all.iter().map(|e| (e.node.as_str(), e.why)).collect();
    assert_eq!(
        why,
        [
            ("b", ReleaseHoldEnd::GivenBack),
            ("c", ReleaseHoldEnd::NodeHoldsCidr),
            ("a", ReleaseHoldEnd::Expired),
            ("b", ReleaseHoldEnd::Replaced),
            ("z", ReleaseHoldEnd::NoLongerValid),
        ]
    );
    assert_eq!(all[3].cidrs, nets(&["10.0.1.0/24"]));
    assert_eq!(all[3].pool, crate::DEFAULT_POOL);
    assert!(all.iter().map(|e| e.why).filter(|w| w.is_early()).count() == 3);
    assert!(p.take_ended_release_holds().is_empty(), "taken once");
}

mod properties {
    //! Random deletions into the hold, re-joins, allocations of every size and a reservation coming and
    //! going: the sets stay marked exactly where something is held, no two Nodes' CIDRs overlap, and an
    //! allocation ends holds only where that made its room.

    use proptest::prelude::*;

    use super::*;

    #[derive(Debug, Clone)]
    enum Op {
        /// Node `n` (re-joining if its name is held) asks for a CIDR with this many pods.
        Allocate(usize, u64),
        /// Node `n` is deleted into a hold of this many seconds.
        Delete(usize, u64),
        /// The reservation covers this /25 of the pool (none: it ends).
        Reserve(Option<u32>),
        /// This many seconds pass.
        Wait(u64),
    }

    const NODES: usize = 8;

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            5 => (0..NODES, prop::sample::select(vec![8u64, 16, 30, 64, 110]))
                .prop_map(|(n, pods)| Op::Allocate(n, pods)),
            3 => (0..NODES, 1u64..100).prop_map(|(n, s)| Op::Delete(n, s)),
            1 => prop::option::of(0u32..2).prop_map(Op::Reserve),
            1 => (1u64..60).prop_map(Op::Wait),
        ]
    }

    /// A /24 sized from capacity, /25 to /28, and the same /24 of fixed /26s.
    fn build(sized: bool) -> Pools {
        let flags = AllocatorFlags {
            cluster_cidr: "10.0.0.0/24".into(),
            node_cidr_mask_size: Some(26),
            ..AllocatorFlags::default()
        };
        let mut config = AllocatorConfig::from_flags(&flags).unwrap();
        if sized {
            let sizing = SizingFlags {
                size_from_pods: true,
                min_mask_ipv4: Some(25),
                max_mask_ipv4: Some(28),
            };
            config = config.with_sizing(&sizing).unwrap();
        }
        Pools::new(&config).unwrap()
    }

    fn overlap(a: &IpNet, b: &IpNet) -> bool {
        a.contains(&b.network()) || b.contains(&a.network())
    }

    fn check(p: &Pools) -> Result<(), TestCaseError> {
        let held: Vec<(&str, IpNet)> = p
            .holdings()
            .flat_map(|(n, c)| c.iter().map(move |c| (n, *c)))
            .collect();
        for set in p.sets() {
            for block in set.cluster().subnets(set.node_mask()).unwrap() {
                let expect = held.iter().any(|(_, h)| overlap(h, &block));
                prop_assert_eq!(set.is_occupied(block), expect, "block {}", block);
            }
        }
        for (i, (a, x)) in held.iter().enumerate() {
            for (b, y) in &held[i + 1..] {
                if a != b && !a.starts_with("claim:") && !b.starts_with("claim:") {
                    prop_assert!(!overlap(x, y), "{a} {x} and {b} {y} overlap");
                }
            }
        }
        Ok(())
    }

    fn run(sized: bool, ops: Vec<Op>) -> Result<(), TestCaseError> {
        let mut p = build(sized);
        let start = Instant::now();
        let mut now = start;
        let mut uids = [0u32; NODES];
        let mut reserved: Option<IpNet> = None;
        for op in ops {
            match op {
                Op::Allocate(n, pods) => {
                    let (name, labels) = view(&format!("n{n}"));
                    let owner = format!("uid-{n}-{}", uids[n]);
                    let before: Vec<(String, Vec<IpNet>)> = p
                        .release_holds()
                        .map(|(n, c)| (n.to_string(), c.to_vec()))
                        .collect();
                    let view = NodeView {
                        name: &name,
                        labels: &labels,
                        provider_id: None,
                    };
                    let got = match p.allocate_sized_for(&owner, &view, Some(pods)) {
                        Err(crate::Error::ReleaseHoldReserved { .. }) => {
                            p.allocate_sized_past_hold(&owner, &view, Some(pods))
                        }
                        other => other,
                    };
                    let handed: Vec<EndedReleaseHold> = p
                        .take_ended_release_holds()
                        .into_iter()
                        .filter(|e| e.why == ReleaseHoldEnd::HandedOut)
                        .collect();
                    match &got {
                        Ok(a) if !handed.is_empty() => {
                            prop_assert_eq!(a.release_hold.as_ref().map(|u| u.early), Some(true));
                            // What the reservation covered whole could make no room.
                            for e in &handed {
                                let covered = e
                                    .cidrs
                                    .iter()
                                    .all(|c| reserved.is_some_and(|r| r.contains(c)));
                                prop_assert!(!covered, "{e:?} ended under {reserved:?}");
                            }
                            // Each hold handed out left room the Node's CIDR lies in (one family).
                            for e in &handed {
                                prop_assert!(
                                    a.cidrs
                                        .iter()
                                        .any(|c| e.cidrs.iter().any(|h| overlap(h, c))),
                                    "{e:?} ended for {a:?}"
                                );
                            }
                        }
                        _ => prop_assert!(handed.is_empty(), "{handed:?} ended for {got:?}"),
                    }
                    if got.is_err() {
                        let after: Vec<(String, Vec<IpNet>)> = p
                            .release_holds()
                            .map(|(n, c)| (n.to_string(), c.to_vec()))
                            .collect();
                        prop_assert_eq!(
                            before.len(),
                            after.len(),
                            "a failed allocation ended holds"
                        );
                    }
                }
                Op::Delete(n, secs) => {
                    let owner = format!("uid-{n}-{}", uids[n]);
                    p.release_node_with_hold(
                        &owner,
                        &format!("n{n}"),
                        None,
                        now + Duration::from_secs(secs),
                    );
                    uids[n] += 1;
                }
                Op::Reserve(half) => {
                    p.release_node("claim:quarantine");
                    reserved =
                        half.map(|h| IpNet::new([10, 0, 0, (h * 128) as u8].into(), 25).unwrap());
                    if let Some(r) = reserved {
                        p.record_and_check("claim:quarantine", &[r]);
                    }
                }
                Op::Wait(secs) => {
                    now += Duration::from_secs(secs);
                    p.end_release_holds(now);
                }
            }
            p.take_ended_release_holds();
            check(&p)?;
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn holds_end_only_to_make_room_and_the_sets_stay_exact(
            sized in any::<bool>(),
            ops in prop::collection::vec(op(), 1..60),
        ) {
            run(sized, ops)?;
        }
    }
}

#[test]
fn a_held_cidr_from_a_pool_a_migration_closed_is_not_given_back() {
    let mut p = pools("10.0.0.0/22", "");
    p.sync_objects(&[crate::ObjectPool {
        name: "new".into(),
        uid: "uid-new".into(),
        spec: Ok(crate::PoolSpec {
            selector: crate::NodeSelector::Fallback,
            per_node_host_bits: 8,
            ipv4: Some(net("10.96.0.0/16")),
            ipv6: None,
            sizing: None,
        }),
        deleting: false,
        modified: false,
    }]);
    allocate(&mut p, "uid-a", "a");
    let now = Instant::now();
    p.release_node_with_hold("uid-a", "a", None, now + HOLD);
    p.open_only(Some("new"));
    let back = allocate(&mut p, "uid-a2", "a");
    assert_eq!(back.cidrs, nets(&["10.96.0.0/24"]));
    assert_eq!(back.release_hold, None);
}
