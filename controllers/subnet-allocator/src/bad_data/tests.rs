//! Tests of the bad-data plan: what is published, about whom, and what it costs.

use super::*;
use ipnet::IpNet;
use netcm_ipam::{AllocatorConfig, AllocatorFlags};
use std::time::Duration;

fn pools(cluster_cidr: &str) -> Pools {
    let flags = AllocatorFlags {
        cluster_cidr: cluster_cidr.into(),
        node_cidr_mask_size_ipv4: Some(24),
        ..AllocatorFlags::default()
    };
    Pools::new(&AllocatorConfig::from_flags(&flags).unwrap()).unwrap()
}

fn net(s: &str) -> IpNet {
    s.parse().unwrap()
}

/// Records `cidrs` for the Node `name` (UID `uid-<name>`) as a sync does, and plans.
fn sync(
    p: &mut Pools,
    t: &mut Tracking,
    state: &mut BadData,
    name: &str,
    cidrs: &[IpNet],
    now: Instant,
) -> Plan {
    let uid = format!("uid-{name}");
    p.record(&uid, cidrs);
    t.track(name, p.owner(&uid).unwrap());
    plan(p, t, state, Subject { name, uid: &uid }, &[], now)
}

#[test]
fn a_node_whose_pod_cidr_covers_the_cluster_cidr_costs_one_name_scan_and_one_event_per_window() {
    const NODES: usize = 2_000;
    let (mut p, mut t, mut state) = (pools("10.0.0.0/8"), Tracking::default(), BadData::default());
    let t0 = Instant::now();
    for i in 0..NODES {
        let cidr = net(&format!("10.{}.{}.0/24", i >> 8, i & 0xff));
        sync(&mut p, &mut t, &mut state, &format!("n{i}"), &[cidr], t0);
    }
    assert_eq!(state.flagged(), 0);
    let hostile = sync(
        &mut p,
        &mut t,
        &mut state,
        "hostile",
        &[net("10.0.0.0/8")],
        t0,
    );
    assert!(
        t.scanned() <= NODES as u64 + 1,
        "naming the Nodes it overlaps visited {} tracked Nodes",
        t.scanned()
    );
    let about: Vec<&str> = hostile.events.iter().map(|e| e.node.as_str()).collect();
    assert_eq!(about, ["hostile"], "one Event, on the Node to blame");
    assert!(hostile.bad);

    // Its kubelet makes it sync again and again inside the window: nothing more is published or
    // scanned.
    let scanned = t.scanned();
    for s in 1..=100 {
        let again = sync(
            &mut p,
            &mut t,
            &mut state,
            "hostile",
            &[net("10.0.0.0/8")],
            t0 + Duration::from_secs(s),
        );
        assert!(again.events.is_empty() && again.bad);
    }
    assert_eq!(t.scanned(), scanned);

    // The Nodes inside it are not to blame: no Event, not counted as bad data.
    for i in 0..NODES {
        let cidr = net(&format!("10.{}.{}.0/24", i >> 8, i & 0xff));
        let inside = sync(&mut p, &mut t, &mut state, &format!("n{i}"), &[cidr], t0);
        assert!(inside.events.is_empty() && !inside.bad, "n{i}");
    }
    assert_eq!(t.scanned(), scanned);
    assert_eq!(state.flagged(), 1);
}

fn reasons(plan: &Plan) -> Vec<&'static str> {
    plan.events.iter().map(|e| e.reason).collect()
}

#[test]
fn each_of_two_nodes_holding_one_cidr_tells_its_own_side_and_the_first_is_synced_again() {
    let (mut p, mut t, mut state) = (
        pools("10.0.0.0/16"),
        Tracking::default(),
        BadData::default(),
    );
    let t0 = Instant::now();
    let first = sync(
        &mut p,
        &mut t,
        &mut state,
        "twin-a",
        &[net("10.0.1.0/24")],
        t0,
    );
    assert!(!first.bad && first.events.is_empty());
    let second = sync(
        &mut p,
        &mut t,
        &mut state,
        "twin-b",
        &[net("10.0.1.0/24")],
        t0,
    );
    assert_eq!(reasons(&second), ["CIDRConflict"]);
    assert_eq!(second.events[0].node, "twin-b");
    assert_eq!(
        second.requeue,
        ["twin-a"],
        "twin-a did not change: sync it again"
    );
    let again = sync(
        &mut p,
        &mut t,
        &mut state,
        "twin-a",
        &[net("10.0.1.0/24")],
        t0,
    );
    assert_eq!(reasons(&again), ["CIDRConflict"]);
    assert!(again.requeue.is_empty(), "twin-b knows already");
    assert_eq!(state.flagged(), 2);
    assert_eq!(state.oversized(), 0);
}

#[test]
fn a_node_with_several_kinds_of_bad_data_gets_one_event_of_each_kind_per_window() {
    let flags = AllocatorFlags {
        cluster_cidr: "10.0.0.0/16".into(),
        service_cluster_ip_range: "10.0.255.0/24".into(),
        node_cidr_mask_size_ipv4: Some(24),
        ..AllocatorFlags::default()
    };
    let mut p = Pools::new(&AllocatorConfig::from_flags(&flags).unwrap()).unwrap();
    let (mut t, mut state) = (Tracking::default(), BadData::default());
    let cidrs = [net("10.9.0.0/24"), net("10.0.255.0/24")];
    p.record("uid-x", &cidrs);
    t.track("x", "uid-x");
    let unparsable = [
        UnparsableCidr {
            raw: "banana".into(),
        },
        UnparsableCidr {
            raw: "10.0.0.0/99".into(),
        },
    ];
    let x = Subject {
        name: "x",
        uid: "uid-x",
    };
    let t0 = Instant::now();
    let first = plan(&p, &t, &mut state, x, &unparsable, t0);
    assert_eq!(
        reasons(&first),
        ["CIDRInvalid", "CIDROutOfRange", "CIDRServiceRangeOverlap"]
    );
    for s in [1, 60, 299] {
        let within = plan(
            &p,
            &t,
            &mut state,
            x,
            &unparsable,
            t0 + Duration::from_secs(s),
        );
        assert!(within.bad && within.events.is_empty());
    }
    let next_window = plan(&p, &t, &mut state, x, &unparsable, t0 + WINDOW);
    assert_eq!(reasons(&next_window).len(), 3);
    assert_eq!(state.flagged(), 1);
}

#[test]
fn a_node_told_about_is_told_again_at_once_if_its_data_turns_bad_after_being_clean() {
    let (mut p, mut t, mut state) = (
        pools("10.0.0.0/16"),
        Tracking::default(),
        BadData::default(),
    );
    let t0 = Instant::now();
    sync(&mut p, &mut t, &mut state, "a", &[net("10.0.1.0/24")], t0);
    let told = sync(&mut p, &mut t, &mut state, "b", &[net("10.0.1.0/24")], t0);
    assert_eq!(reasons(&told), ["CIDRConflict"]);
    p.release_node("uid-a");
    let clean = sync(&mut p, &mut t, &mut state, "b", &[net("10.0.1.0/24")], t0);
    assert!(!clean.bad);
    assert_eq!(state.flagged(), 0);
    sync(&mut p, &mut t, &mut state, "c", &[net("10.0.1.0/25")], t0);
    let again = sync(&mut p, &mut t, &mut state, "b", &[net("10.0.1.0/24")], t0);
    assert_eq!(reasons(&again), ["CIDRConflict"]);
}

#[test]
fn the_quarantine_of_earlier_leaders_blocks_is_no_bad_data_of_a_node() {
    let (mut p, mut t, mut state) = (
        pools("10.0.0.0/16"),
        Tracking::default(),
        BadData::default(),
    );
    p.record("claim:quarantine", &[net("10.0.0.0/22")]);
    let inside = sync(
        &mut p,
        &mut t,
        &mut state,
        "n",
        &[net("10.0.1.0/24")],
        Instant::now(),
    );
    assert!(!inside.bad && inside.events.is_empty());
}
