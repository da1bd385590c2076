//! The planner: one pass over the Nodes and the progress so far gives the actions to take now and the
//! next progress. It is called again on every change (and on a timer, for the timeouts); each call
//! reads only its arguments, so a leader that took over with the progress the last one wrote plans the
//! same.
//!
//! An action may fail or be lost with the leader that sent it: each one is such that sending it twice
//! is harmless (a cordon, an eviction, a delete that tests the Node's UID), and a step advances only on
//! what the API shows afterwards — a drain ends when no pod is left to evict, a delete when the Node is
//! gone — never on an action having been sent.

use std::collections::BTreeMap;

use jiff::{SignedDuration, Timestamp};

/// What the operator asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spec {
    /// The pool every Node moves to. A rollback is the same migration with its origin pool here.
    pub destination: String,
    /// How many pod CIDRs, one per family, a Node served by the destination holds.
    pub destination_families: usize,
    /// How many Nodes may be out of service (draining or re-registering) at once; at least 1.
    pub max_unavailable: usize,
    /// How long a drain may take before the Node fails and is put back in service.
    pub drain_timeout: SignedDuration,
    /// How long a deleted Node may take to register again and be given CIDRs from the destination.
    pub register_timeout: SignedDuration,
}

/// What the API shows of one Node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeFacts {
    /// `metadata.name`.
    pub name: String,
    /// `metadata.uid`: a Node that registered again under its name has a new one.
    pub uid: String,
    /// For each pod CIDR it holds, the pool that CIDR lies in (`None`: no pool netcm knows).
    pub pools: Vec<Option<String>>,
    /// `spec.unschedulable`.
    pub unschedulable: bool,
    /// Pods a drain still has to evict (DaemonSet and mirror pods, and pods already terminating, are
    /// not counted: a drain leaves them).
    pub pods_to_evict: usize,
}

/// How far one Node has come; the Nodes absent from [`Progress`] are waiting or done.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeStep {
    /// Cordoned, its pods being evicted; deleted once none is left.
    Draining {
        /// The Node being drained: one that registered again under the name is another Node.
        uid: String,
        /// When the drain started.
        since: Timestamp,
        /// The destination it started toward: after a rollback, a drain toward the old one stops.
        toward: String,
        /// Whether the Node was cordoned before: netcm never uncordons a cordon it did not make.
        was_unschedulable: bool,
    },
    /// Deleted (or seen gone), waiting for the Node to register again and be given CIDRs.
    Registering {
        /// The deleted Node's UID: the same UID still shown is a deletion not yet finished.
        old_uid: String,
        /// When the Node was first seen gone.
        since: Timestamp,
        /// The destination it left toward.
        toward: String,
        /// Whether the Node was cordoned before it moved: it is cordoned again once back.
        was_unschedulable: bool,
    },
    /// Failed; while a failure toward the current destination stands, no further Node starts.
    Failed {
        /// The destination it was moving toward.
        toward: String,
        /// When it failed.
        at: Timestamp,
        /// Why.
        reason: Failure,
    },
}

/// Why a Node failed to move.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// Pods were still left to evict (a PodDisruptionBudget allowing none, a pod that does not
    /// terminate) when the drain timed out; the Node was put back in service.
    DrainTimedOut {
        /// Pods left.
        pods_left: usize,
    },
    /// The Node did not register again in time.
    NeverRegistered,
    /// It registered again but was given no CIDRs in time.
    NotAllocated,
    /// It registered again with CIDRs from elsewhere than the destination: something gave out CIDRs
    /// from a pool the migration had closed.
    OutsideDestination {
        /// The pools its CIDRs came from.
        pools: Vec<Option<String>>,
    },
}

/// Every Node that is moving or failed, by name: the state a new leader resumes from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Progress {
    /// The steps, by Node name.
    pub nodes: BTreeMap<String, NodeStep>,
}

/// One thing to do against the API, safe to do twice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Set `spec.unschedulable`, testing the UID.
    Cordon {
        /// The Node.
        node: String,
        /// Its UID.
        uid: String,
    },
    /// Evict the Node's pods that are left, each through the Eviction API (a PodDisruptionBudget's
    /// 429 is tried again at the next pass; never a forced delete).
    Evict {
        /// The Node.
        node: String,
        /// Its UID.
        uid: String,
    },
    /// Delete the Node, with a precondition on its UID.
    Delete {
        /// The Node.
        node: String,
        /// Its UID.
        uid: String,
    },
    /// Clear `spec.unschedulable`, testing the UID.
    Uncordon {
        /// The Node.
        node: String,
        /// Its UID.
        uid: String,
    },
}

/// Where the migration stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Phase {
    /// Nodes are moving or waiting to.
    Progressing,
    /// A Node failed toward the current destination; no further Node starts. The names, in order.
    Stalled(Vec<String>),
    /// Every Node holding CIDRs holds them from the destination, and none is moving: the origins may
    /// be released.
    Complete,
}

/// How many Nodes are in each state, for status and metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Holding CIDRs from elsewhere than the destination, not yet started.
    pub waiting: usize,
    /// Being drained.
    pub draining: usize,
    /// Deleted, not yet back with CIDRs from the destination.
    pub registering: usize,
    /// Holding only CIDRs from the destination, one per family it gives.
    pub done: usize,
    /// Failed toward the current destination.
    pub failed: usize,
    /// Holding no CIDRs yet (the allocator serves them from the destination).
    pub unallocated: usize,
}

/// What one pass decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// To do now, in order.
    pub actions: Vec<Action>,
    /// To write down before the next pass.
    pub progress: Progress,
    /// Where the migration stands after this pass.
    pub phase: Phase,
    /// The Nodes in each state after this pass.
    pub counts: Counts,
}

/// Whether `node` is where `spec` wants it: every CIDR from the destination, one per family it gives.
pub fn is_done(spec: &Spec, node: &NodeFacts) -> bool {
    node.pools.len() == spec.destination_families
        && node
            .pools
            .iter()
            .all(|p| p.as_deref() == Some(spec.destination.as_str()))
}

/// One pass: the actions to take now, the next progress, the phase and the counts.
pub fn plan(spec: &Spec, nodes: &[NodeFacts], progress: &Progress, now: Timestamp) -> Plan {
    let by_name: BTreeMap<&str, &NodeFacts> = nodes.iter().map(|n| (n.name.as_str(), n)).collect();
    let mut actions = Vec::new();
    let mut next = Progress::default();
    for (name, step) in &progress.nodes {
        let node = by_name.get(name.as_str()).copied();
        if let Some(step) = advance(spec, name, step, node, now, &mut actions) {
            next.nodes.insert(name.clone(), step);
        }
    }
    let failed_toward_destination = |p: &Progress| -> Vec<String> {
        p.nodes
            .iter()
            .filter(|(_, s)| matches!(s, NodeStep::Failed { toward, .. } if *toward == spec.destination))
            .map(|(n, _)| n.clone())
            .collect()
    };
    if failed_toward_destination(&next).is_empty() {
        start_more(spec, nodes, &mut next, now, &mut actions);
    }
    let counts = count(spec, nodes, &next);
    let failed = failed_toward_destination(&next);
    let phase = if !failed.is_empty() {
        Phase::Stalled(failed)
    } else if counts.waiting + counts.draining + counts.registering == 0 {
        Phase::Complete
    } else {
        Phase::Progressing
    };
    Plan {
        actions,
        progress: next,
        phase,
        counts,
    }
}

/// The next step of the Node `name` (gone from the progress: `None`), and the actions it needs now.
fn advance(
    spec: &Spec,
    name: &str,
    step: &NodeStep,
    node: Option<&NodeFacts>,
    now: Timestamp,
    actions: &mut Vec<Action>,
) -> Option<NodeStep> {
    let elapsed = |since: &Timestamp| now.duration_since(*since);
    match step {
        NodeStep::Draining {
            uid,
            since,
            toward,
            was_unschedulable,
        } => {
            // Gone, or registered again already: deleted (by this migration or by someone else).
            let Some(node) = node.filter(|n| n.uid == *uid) else {
                return Some(NodeStep::Registering {
                    old_uid: uid.clone(),
                    since: now,
                    toward: toward.clone(),
                    was_unschedulable: *was_unschedulable,
                });
            };
            let back_in_service = |actions: &mut Vec<Action>| {
                if !was_unschedulable {
                    actions.push(Action::Uncordon {
                        node: name.to_string(),
                        uid: uid.clone(),
                    });
                }
            };
            if *toward != spec.destination {
                // Rolled back before it left: it holds what the destination now is, or waits again.
                back_in_service(actions);
                return None;
            }
            if node.pods_to_evict == 0 {
                actions.push(Action::Delete {
                    node: name.to_string(),
                    uid: uid.clone(),
                });
                return Some(step.clone());
            }
            if elapsed(since) > spec.drain_timeout {
                back_in_service(actions);
                return Some(NodeStep::Failed {
                    toward: toward.clone(),
                    at: now,
                    reason: Failure::DrainTimedOut {
                        pods_left: node.pods_to_evict,
                    },
                });
            }
            // The cordon sent when the drain started may have been lost with its leader (the progress
            // is written first), or undone by hand: sent again, else pods keep landing on a Node
            // being emptied.
            if !node.unschedulable {
                actions.push(Action::Cordon {
                    node: name.to_string(),
                    uid: uid.clone(),
                });
            }
            actions.push(Action::Evict {
                node: name.to_string(),
                uid: uid.clone(),
            });
            Some(step.clone())
        }
        NodeStep::Registering {
            old_uid,
            since,
            toward,
            was_unschedulable,
        } => {
            let timed_out = elapsed(since) > spec.register_timeout;
            let failed = |reason| {
                Some(NodeStep::Failed {
                    toward: toward.clone(),
                    at: now,
                    reason,
                })
            };
            let wait_unless_timed_out = |reason| {
                if timed_out {
                    failed(reason)
                } else {
                    Some(step.clone())
                }
            };
            match node {
                // Not yet back, or its deletion not yet finished (a finalizer).
                None => wait_unless_timed_out(Failure::NeverRegistered),
                Some(n) if n.uid == *old_uid => wait_unless_timed_out(Failure::NeverRegistered),
                Some(n) if is_done(spec, n) => {
                    if *was_unschedulable && !n.unschedulable {
                        actions.push(Action::Cordon {
                            node: name.to_string(),
                            uid: n.uid.clone(),
                        });
                    }
                    None
                }
                Some(n) if n.pools.is_empty() => wait_unless_timed_out(Failure::NotAllocated),
                // Back with CIDRs from elsewhere. Toward the current destination that is a pool giving
                // out what it should not; toward a destination since rolled back, it is one more Node
                // to move.
                Some(n) if *toward == spec.destination => failed(Failure::OutsideDestination {
                    pools: n.pools.clone(),
                }),
                Some(_) => None,
            }
        }
        NodeStep::Failed { .. } => Some(step.clone()),
    }
}

/// Starts Nodes, in name order, until `max_unavailable` are out of service.
fn start_more(
    spec: &Spec,
    nodes: &[NodeFacts],
    next: &mut Progress,
    now: Timestamp,
    actions: &mut Vec<Action>,
) {
    let moving =
        |s: &NodeStep| matches!(s, NodeStep::Draining { .. } | NodeStep::Registering { .. });
    let out = next.nodes.values().filter(|s| moving(s)).count();
    let room = spec.max_unavailable.max(1).saturating_sub(out);
    let mut waiting: Vec<&NodeFacts> = nodes
        .iter()
        .filter(|n| !n.pools.is_empty() && !is_done(spec, n))
        // A failure toward another destination (before a rollback) is a record, not a bar.
        .filter(|n| {
            next.nodes.get(&n.name).is_none_or(
                |s| matches!(s, NodeStep::Failed { toward, .. } if *toward != spec.destination),
            )
        })
        .collect();
    waiting.sort_by(|a, b| a.name.cmp(&b.name));
    for node in waiting.into_iter().take(room) {
        actions.push(Action::Cordon {
            node: node.name.clone(),
            uid: node.uid.clone(),
        });
        actions.push(Action::Evict {
            node: node.name.clone(),
            uid: node.uid.clone(),
        });
        next.nodes.insert(
            node.name.clone(),
            NodeStep::Draining {
                uid: node.uid.clone(),
                since: now,
                toward: spec.destination.clone(),
                was_unschedulable: node.unschedulable,
            },
        );
    }
}

fn count(spec: &Spec, nodes: &[NodeFacts], progress: &Progress) -> Counts {
    let mut counts = Counts::default();
    for step in progress.nodes.values() {
        match step {
            NodeStep::Draining { .. } => counts.draining += 1,
            NodeStep::Registering { .. } => counts.registering += 1,
            NodeStep::Failed { toward, .. } if *toward == spec.destination => counts.failed += 1,
            NodeStep::Failed { .. } => {}
        }
    }
    for node in nodes {
        let step = progress.nodes.get(&node.name);
        let in_progress = step.is_some_and(|s| {
            matches!(s, NodeStep::Draining { .. } | NodeStep::Registering { .. })
                || matches!(s, NodeStep::Failed { toward, .. } if *toward == spec.destination)
        });
        if in_progress {
            continue;
        }
        if node.pools.is_empty() {
            counts.unallocated += 1;
        } else if is_done(spec, node) {
            counts.done += 1;
        } else {
            counts.waiting += 1;
        }
    }
    counts
}

#[cfg(test)]
mod tests;
