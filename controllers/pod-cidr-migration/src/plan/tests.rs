use super::*;

const OLD: &str = "default";
const NEW: &str = "wide";

fn at(secs: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + secs).expect("a timestamp")
}

fn spec() -> Spec {
    Spec {
        destination: NEW.into(),
        destination_families: 1,
        max_unavailable: 2,
        drain_timeout: SignedDuration::from_secs(300),
        register_timeout: SignedDuration::from_secs(600),
    }
}

/// A Node holding one CIDR from `pool`, nothing left to evict.
fn node(name: &str, pool: &str) -> NodeFacts {
    NodeFacts {
        name: name.into(),
        uid: format!("{name}-1"),
        pools: vec![Some(pool.into())],
        unschedulable: false,
        pods_to_evict: 0,
    }
}

/// `node` registered again (a new UID) with `pools`.
fn back(n: &NodeFacts, pools: &[&str]) -> NodeFacts {
    NodeFacts {
        uid: format!("{}-2", n.name),
        pools: pools.iter().map(|p| Some(p.to_string())).collect(),
        unschedulable: false,
        ..n.clone()
    }
}

/// The plan once `node`, started alone at 0 s, is seen gone at 10 s.
fn started_and_gone(spec: &Spec, node: &NodeFacts) -> Plan {
    let p = plan(
        spec,
        std::slice::from_ref(node),
        &Progress::default(),
        at(0),
    );
    plan(spec, &[], &p.progress, at(10))
}

fn started(plan: &Plan) -> Vec<&str> {
    plan.actions
        .iter()
        .filter_map(|a| match a {
            Action::Cordon { node, .. } => Some(node.as_str()),
            _ => None,
        })
        .collect()
}

fn step<'a>(plan: &'a Plan, name: &str) -> Option<&'a NodeStep> {
    plan.progress.nodes.get(name)
}

#[test]
fn a_migration_starts_at_most_max_unavailable_nodes_in_name_order_cordoning_then_evicting() {
    let nodes = vec![node("c", OLD), node("a", OLD), node("b", OLD)];
    let p = plan(&spec(), &nodes, &Progress::default(), at(0));
    assert_eq!(started(&p), vec!["a", "b"]);
    assert_eq!(
        p.actions[..2],
        [
            Action::Cordon {
                node: "a".into(),
                uid: "a-1".into()
            },
            Action::Evict {
                node: "a".into(),
                uid: "a-1".into()
            }
        ]
    );
    assert_eq!(p.phase, Phase::Progressing);
    assert_eq!(
        (p.counts.draining, p.counts.waiting),
        (2, 1),
        "{:?}",
        p.counts
    );
}

#[test]
fn a_drain_with_pods_left_evicts_again_and_one_with_none_left_deletes_the_node_testing_its_uid() {
    let mut a = node("a", OLD);
    a.pods_to_evict = 3;
    let first = plan(
        &spec(),
        std::slice::from_ref(&a),
        &Progress::default(),
        at(0),
    );
    // Its cordon lost (or undone by hand): cordoned again before the evictions.
    let uncordoned = plan(&spec(), std::slice::from_ref(&a), &first.progress, at(5));
    assert_eq!(uncordoned.actions, first.actions);
    a.unschedulable = true;
    let again = plan(&spec(), std::slice::from_ref(&a), &first.progress, at(10));
    assert_eq!(
        again.actions,
        vec![Action::Evict {
            node: "a".into(),
            uid: "a-1".into()
        }]
    );
    a.pods_to_evict = 0;
    let drained = plan(&spec(), std::slice::from_ref(&a), &again.progress, at(20));
    assert_eq!(
        drained.actions,
        vec![Action::Delete {
            node: "a".into(),
            uid: "a-1".into()
        }]
    );
    // Sent, not yet seen: still draining, so a lost delete is sent again.
    assert!(matches!(
        step(&drained, "a"),
        Some(NodeStep::Draining { .. })
    ));
    let lost = plan(&spec(), std::slice::from_ref(&a), &drained.progress, at(25));
    assert_eq!(lost.actions, drained.actions);
}

#[test]
fn a_deleted_node_waits_to_register_and_once_back_with_destination_cidrs_is_done_and_the_next_starts(
) {
    let spec = Spec {
        max_unavailable: 1,
        ..spec()
    };
    let (a, b) = (node("a", OLD), node("b", OLD));
    let p = plan(&spec, &[a.clone(), b.clone()], &Progress::default(), at(0));
    assert_eq!(started(&p), vec!["a"]);
    let gone = plan(&spec, std::slice::from_ref(&b), &p.progress, at(30));
    assert!(matches!(
        step(&gone, "a"),
        Some(NodeStep::Registering { since, .. }) if *since == at(30)
    ));
    assert!(
        started(&gone).is_empty(),
        "a re-registering Node is out of service"
    );
    assert_eq!(gone.counts.registering, 1);
    // Back without CIDRs: the allocator's turn; still waiting.
    let unallocated = NodeFacts {
        pools: vec![],
        ..back(&a, &[])
    };
    let waiting = plan(&spec, &[unallocated, b.clone()], &gone.progress, at(40));
    assert!(matches!(
        step(&waiting, "a"),
        Some(NodeStep::Registering { .. })
    ));
    let done = plan(
        &spec,
        &[back(&a, &[NEW]), b.clone()],
        &waiting.progress,
        at(50),
    );
    assert_eq!(step(&done, "a"), None);
    assert_eq!(started(&done), vec!["b"]);
    assert_eq!(done.counts.done, 1);
}

#[test]
fn a_drain_past_its_timeout_fails_the_node_puts_it_back_in_service_and_stalls_the_migration() {
    let mut a = node("a", OLD);
    a.pods_to_evict = 1;
    let nodes = vec![a, node("b", OLD), node("c", OLD)];
    let spec = Spec {
        max_unavailable: 1,
        ..spec()
    };
    let p = plan(&spec, &nodes, &Progress::default(), at(0));
    let late = plan(&spec, &nodes, &p.progress, at(301));
    assert_eq!(
        late.actions,
        vec![Action::Uncordon {
            node: "a".into(),
            uid: "a-1".into()
        }]
    );
    assert!(matches!(
        step(&late, "a"),
        Some(NodeStep::Failed {
            reason: Failure::DrainTimedOut { pods_left: 1 },
            ..
        })
    ));
    assert_eq!(late.phase, Phase::Stalled(vec!["a".into()]));
    let later = plan(&spec, &nodes, &late.progress, at(400));
    assert!(later.actions.is_empty(), "no further Node starts");
    assert_eq!(later.counts.failed, 1);
}

#[test]
fn a_node_the_operator_had_cordoned_is_never_uncordoned_and_is_cordoned_again_once_back() {
    let mut a = node("a", OLD);
    a.unschedulable = true;
    a.pods_to_evict = 1;
    let p = plan(
        &spec(),
        std::slice::from_ref(&a),
        &Progress::default(),
        at(0),
    );
    let late = plan(&spec(), std::slice::from_ref(&a), &p.progress, at(301));
    assert!(late.actions.is_empty(), "{:?}", late.actions);

    let mut b = node("b", OLD);
    b.unschedulable = true;
    let gone = started_and_gone(&spec(), &b);
    let returned = plan(&spec(), &[back(&b, &[NEW])], &gone.progress, at(20));
    assert_eq!(
        returned.actions,
        vec![Action::Cordon {
            node: "b".into(),
            uid: "b-2".into()
        }]
    );
}

#[test]
fn a_node_that_does_not_come_back_in_time_fails_and_stalls_the_migration() {
    let a = node("a", OLD);
    let gone = started_and_gone(&spec(), &a);
    let still = plan(&spec(), &[], &gone.progress, at(610));
    assert!(matches!(
        step(&still, "a"),
        Some(NodeStep::Registering { .. })
    ));
    let late = plan(&spec(), &[], &still.progress, at(611));
    assert!(matches!(
        step(&late, "a"),
        Some(NodeStep::Failed {
            reason: Failure::NeverRegistered,
            ..
        })
    ));
    assert_eq!(late.phase, Phase::Stalled(vec!["a".into()]));
}

#[test]
fn a_deletion_held_by_a_finalizer_is_waited_for_and_fails_only_at_the_register_timeout() {
    let a = node("a", OLD);
    // The Node is gone from the list, then shown again with its old UID (a watch replaying, a
    // finalizer holding the deletion).
    let gone = started_and_gone(&spec(), &a);
    let held = plan(&spec(), std::slice::from_ref(&a), &gone.progress, at(20));
    assert!(
        held.actions.is_empty(),
        "no second drain: {:?}",
        held.actions
    );
    assert!(matches!(
        step(&held, "a"),
        Some(NodeStep::Registering { .. })
    ));
    let late = plan(&spec(), std::slice::from_ref(&a), &held.progress, at(611));
    assert!(matches!(
        step(&late, "a"),
        Some(NodeStep::Failed {
            reason: Failure::NeverRegistered,
            ..
        })
    ));
}

#[test]
fn a_node_back_with_cidrs_outside_the_destination_stalls_the_migration() {
    let a = node("a", OLD);
    let gone = started_and_gone(&spec(), &a);
    let wrong = plan(&spec(), &[back(&a, &[OLD])], &gone.progress, at(20));
    assert!(matches!(
        step(&wrong, "a"),
        Some(NodeStep::Failed {
            reason: Failure::OutsideDestination { .. },
            ..
        })
    ));
    assert_eq!(wrong.phase, Phase::Stalled(vec!["a".into()]));
}

#[test]
fn a_node_back_registered_but_never_given_cidrs_fails_as_not_allocated() {
    let a = node("a", OLD);
    let gone = started_and_gone(&spec(), &a);
    let bare = back(&a, &[]);
    let late = plan(
        &spec(),
        std::slice::from_ref(&bare),
        &gone.progress,
        at(611),
    );
    assert!(matches!(
        step(&late, "a"),
        Some(NodeStep::Failed {
            reason: Failure::NotAllocated,
            ..
        })
    ));
}

#[test]
fn adding_ipv6_moves_every_node_holding_only_its_ipv4_cidr() {
    let spec = Spec {
        destination: "dual".into(),
        destination_families: 2,
        max_unavailable: 5,
        ..spec()
    };
    let single = node("a", "dual");
    let dual = NodeFacts {
        pools: vec![Some("dual".into()), Some("dual".into())],
        ..node("b", "dual")
    };
    let p = plan(&spec, &[single, dual], &Progress::default(), at(0));
    assert_eq!(started(&p), vec!["a"]);
    assert_eq!((p.counts.done, p.counts.draining), (1, 1));
}

#[test]
fn a_rollback_puts_draining_nodes_back_lets_deleted_ones_finish_and_moves_the_moved_ones_back() {
    let spec_forward = Spec {
        max_unavailable: 2,
        ..spec()
    };
    let (a, b, c) = (node("a", OLD), node("b", OLD), node("c", NEW));
    let mut b_draining = b.clone();
    b_draining.pods_to_evict = 2;
    // a is deleted and re-registering, b still draining, c already moved.
    let p = plan(
        &spec_forward,
        &[a.clone(), b_draining.clone(), c.clone()],
        &Progress::default(),
        at(0),
    );
    let forward = plan(
        &spec_forward,
        &[b_draining.clone(), c.clone()],
        &p.progress,
        at(10),
    );
    assert!(matches!(
        step(&forward, "a"),
        Some(NodeStep::Registering { .. })
    ));

    let spec_back = Spec {
        destination: OLD.into(),
        ..spec_forward
    };
    let rolled = plan(
        &spec_back,
        &[b_draining.clone(), c.clone()],
        &forward.progress,
        at(20),
    );
    assert!(
        rolled.actions.contains(&Action::Uncordon {
            node: "b".into(),
            uid: "b-1".into()
        }),
        "{:?}",
        rolled.actions
    );
    assert_eq!(step(&rolled, "b"), None, "b is where the rollback wants it");
    assert!(matches!(
        step(&rolled, "a"),
        Some(NodeStep::Registering { .. })
    ));
    assert_eq!(
        started(&rolled),
        vec!["c"],
        "c moves back, within max_unavailable beside a"
    );
    // a comes back, served by the origin again: done under the rollback.
    let a_back = back(&a, &[OLD]);
    let settled = plan(
        &spec_back,
        &[a_back, b.clone(), c.clone()],
        &rolled.progress,
        at(30),
    );
    assert_eq!(step(&settled, "a"), None);
}

#[test]
fn a_node_that_left_before_a_rollback_and_came_back_in_the_old_destination_is_moved_again_not_failed(
) {
    let a = node("a", OLD);
    let gone = started_and_gone(&spec(), &a);
    let spec_back = Spec {
        destination: OLD.into(),
        ..spec()
    };
    let returned = plan(&spec_back, &[back(&a, &[NEW])], &gone.progress, at(20));
    assert_eq!(returned.phase, Phase::Progressing);
    assert!(
        matches!(step(&returned, "a"), Some(NodeStep::Draining { toward, .. }) if toward == OLD),
        "{:?}",
        returned.progress
    );
}

#[test]
fn a_failure_before_a_rollback_does_not_stall_the_rollback() {
    let mut a = node("a", OLD);
    a.pods_to_evict = 1;
    let nodes = vec![a, node("b", NEW)];
    let forward = spec();
    let p = plan(&forward, &nodes, &Progress::default(), at(0));
    let failed = plan(&forward, &nodes, &p.progress, at(301));
    assert!(matches!(failed.phase, Phase::Stalled(_)));
    let spec_back = Spec {
        destination: OLD.into(),
        ..forward
    };
    let rolled = plan(&spec_back, &nodes, &failed.progress, at(310));
    assert_eq!(rolled.phase, Phase::Progressing);
    assert_eq!(started(&rolled), vec!["b"]);
}

#[test]
fn nodes_without_cidrs_are_not_moved_and_every_node_in_the_destination_completes_the_migration() {
    let bare = NodeFacts {
        pools: vec![],
        ..node("a", OLD)
    };
    let p = plan(
        &spec(),
        &[bare, node("b", NEW), node("c", NEW)],
        &Progress::default(),
        at(0),
    );
    assert!(p.actions.is_empty());
    assert_eq!(p.phase, Phase::Complete);
    assert_eq!((p.counts.unallocated, p.counts.done), (1, 2));
}

#[test]
fn a_cidr_from_no_known_pool_is_not_done_and_is_moved() {
    let stray = NodeFacts {
        pools: vec![None],
        ..node("a", OLD)
    };
    let p = plan(&spec(), &[stray], &Progress::default(), at(0));
    assert_eq!(started(&p), vec!["a"]);
}

#[test]
fn a_new_leader_planning_from_the_written_progress_sends_what_the_old_one_would_have() {
    let mut nodes = vec![node("a", OLD), node("b", OLD), node("c", OLD)];
    nodes[0].pods_to_evict = 2;
    let p = plan(&spec(), &nodes, &Progress::default(), at(0));
    // The same inputs give the same plan, whoever plans: nothing is kept between passes.
    let again = plan(&spec(), &nodes, &Progress::default(), at(0));
    assert_eq!(p, again);
    for n in &mut nodes[..2] {
        n.unschedulable = true;
    }
    let next = plan(&spec(), &nodes, &p.progress, at(5));
    assert!(started(&next).is_empty(), "max_unavailable still holds");
    assert_eq!(
        next.actions,
        vec![
            Action::Evict {
                node: "a".into(),
                uid: "a-1".into()
            },
            Action::Delete {
                node: "b".into(),
                uid: "b-1".into()
            }
        ]
    );
}

#[test]
fn max_unavailable_of_zero_still_moves_one_node_at_a_time() {
    let spec = Spec {
        max_unavailable: 0,
        ..spec()
    };
    let p = plan(
        &spec,
        &[node("a", OLD), node("b", OLD)],
        &Progress::default(),
        at(0),
    );
    assert_eq!(started(&p), vec!["a"]);
}
