//! Tests of the release hold: held CIDRs stay out of allocation, come back to their Node, go early only
//! from a full pool, and end on time.

use std::time::{Duration, Instant};

use super::*;
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
    p.hold("claim:quarantine", &nets(&["10.0.0.0/22"]));
    assert_eq!(p.release_holds().count(), 1);
}

#[test]
fn a_node_back_under_another_name_with_the_same_provider_id_gets_the_cidr_its_machine_held() {
    let mut p = pools("10.0.0.0/22", "");
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
    let until = Instant::now() + HOLD;
    assert!(p.restore_release_hold("old", Some("id-9"), &nets(&["10.0.2.0/24"]), until));
    assert_eq!(
        allocate_on(&mut p, "uid-n", "new", Some("id-9")).cidrs,
        nets(&["10.0.2.0/24"])
    );
}
